"""caked behind vLLM: a KV connector (vLLM's KVConnectorBase_V1) on the Python client.

Enable it with (docs/engines.md, "vLLM"):

    vllm serve MODEL --kv-transfer-config '{"kv_connector": "CakeConnector", "kv_connector_module_path": "cake.vllm",
        "kv_role": "kv_both", "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {"cake_socket": "/run/cake/caked.sock", "cake_chunk_tokens": 256}}'

Written against vllm-project/vllm's v1 connector interface: kv_connector/v1/base.py at
003df2961dd8830c317a61f9745ccd557da9fa06 (and the older 13f4ad0f55b08ca1d37d1459f50ce950feaeb547), the factory at
a4cd9d0d28bdb41db8dfe0acdafac2bf2f608630, the scheduler that calls it (v1/core/sched/scheduler.py at
00024d314514900f361ad072af6931e403b7f589), the worker's call order (v1/worker/kv_connector_model_runner_mixin.py at
23ec7c7fab7aa8edb1c14195c048113e210683fa) and the example connector (example_connector.py at
4c1654210cfd5f3d07459cc3a23eef6aaea20706 and 00231834dc62bb1127ec5c8f2e6762c87d2f477e). vLLM itself was not run.

The package is laid out as vLLM's own store connectors (kv_connector/v1/mooncake/store/):
- connector.py: CakeConnector, the facade vLLM calls, forwarding to one half per role;
- scheduler.py: the scheduler's half (lookups, what each step's metadata carries), the split's scheduler half
  (SplitScheduler) and vLLM's scheduler with the split (CakeScheduler, CakeAsyncScheduler);
- worker.py: the worker's half (the region, I/O-only loads, stores), the split's worker half (SplitWorker) and
  scatter_rows, the one copy from a region's chunks into vLLM's blocks that both use;
- data.py: the metadata the halves pass; config.py: namespaces and switches from vLLM's config and requests;
  layout.py: where the attention backend keeps K and V, learned and proven; log.py: the log and the regions.
The split's decisions are cake.split's, which imports neither vLLM nor torch. The modules cake.vllm_split,
cake.vllm_scheduler, cake.vllm_layout and cake.vllm_log re-export these for older configurations.

What it does:
- Scheduler side: get_num_new_matched_tokens sends the prompt's tokens to caked's Lookup on a thread of its own
  and answers None (ask again) until the answer is in; then the tokens cached beyond vLLM's own prefix hit, in whole
  chunks (a chunk is a multiple of vLLM's block size), leaving at least one token to compute. Loads are
  asynchronous by default (the request waits in WAITING_FOR_REMOTE_KVS while the worker loads).
- Worker side: an I/O-only Load of the chunks into a region of the daemon's (device memory over CUDA IPC when the
  KV cache is on a GPU, host shared memory otherwise), then one scatter of the chunks' tokens into vLLM's blocks, an
  indexed copy per layer for K and V, in the layout the attention backend writes (learned and proven at
  register_kv_caches). Chunks that fail to load become load errors on their blocks, which vLLM recomputes.
- Stores: when a request finishes, the scheduler holds its blocks (request_finished returns True) and the worker
  gathers the prompt's full chunks out of them into the region and Stores them, then reports the request as sent.
- Cake's split (compute the front while the back loads): with "cake_split": true in kv_connector_extra_config
  and vLLM's scheduler class cake.vllm.scheduler.CakeScheduler (CakeAsyncScheduler under async scheduling), an
  eligible request computes forward from vLLM's local hit while a cake-mode load fills a window of the worker's
  split region from the tail; the scheduler jumps the request over what every rank holds and the worker splices
  those rows into the blocks before the step's forward. Without the scheduler class, or for requests the split
  does not take, the connector loads the cached suffix I/O-only, which stock vLLM supports.
- A silent daemon never stalls vLLM: every call to it has a deadline (cake_timeout_s, 30 s), after which the
  lookup is a miss and the load's blocks are load errors vLLM recomputes; a load or store that finds the region in
  use waits for it at most cake_region_wait_s (1 s) and then does the same, so one call stuck on the daemon holds up
  no other.

Importing it needs neither vLLM nor torch (plain stand-ins for vLLM's bases; torch where a worker copies).
"""
from cake.vllm.config import namespace_for
from cake.vllm.connector import CakeConnector
from cake.vllm.data import (CakeConnectorMetadata, KVConnectorBase_V1, KVConnectorMetadata, KVConnectorRole, LoadSpec,
                            SplitMetadata, StoreSpec)

__all__ = ["CakeConnector", "CakeConnectorMetadata", "KVConnectorBase_V1", "KVConnectorMetadata", "KVConnectorRole",
           "LoadSpec", "SplitMetadata", "StoreSpec", "namespace_for"]
