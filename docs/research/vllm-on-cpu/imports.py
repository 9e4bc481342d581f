import importlib, sys
mods = ["vllm", "vllm.config", "vllm.v1.request", "vllm.v1.core.kv_cache_utils", "vllm.v1.kv_cache_interface",
        "vllm.v1.core.sched.scheduler", "vllm.v1.core.sched.async_scheduler",
        "vllm.distributed.kv_transfer.kv_connector.v1.base", "vllm.distributed.kv_transfer.kv_connector.factory",
        "vllm.v1.outputs", "vllm.v1.structured_output", "vllm.sampling_params"]
for m in mods:
    importlib.import_module(m)
    print("ok", m)
