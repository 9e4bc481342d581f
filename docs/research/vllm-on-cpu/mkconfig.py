import time; t=time.time()
from vllm.config import ModelConfig, SchedulerConfig, CacheConfig, KVTransferConfig, VllmConfig, DeviceConfig
mc = ModelConfig(model="/tmp/vllm-research/tiny-llama", skip_tokenizer_init=True, dtype="float32", seed=0, max_model_len=4096)
print("ModelConfig ok", mc.get_head_size(), time.time()-t)
sc = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=4096, enable_chunked_prefill=True, is_encoder_decoder=False)
cc = CacheConfig(block_size=16, enable_prefix_caching=True)
kv = KVTransferConfig(kv_connector="ExampleConnector", kv_role="kv_both", kv_connector_extra_config={"shared_storage_path": "/tmp/vllm-research/kvstore"})
vc = VllmConfig(model_config=mc, scheduler_config=sc, cache_config=cc, kv_transfer_config=kv, device_config=DeviceConfig("cpu"))
print("VllmConfig ok async=", vc.scheduler_config.async_scheduling, time.time()-t)
