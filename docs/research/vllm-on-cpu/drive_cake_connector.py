"""vLLM 0.34.0's real Scheduler with OUR connector, cake.vllm.CakeConnector, loaded by module path, against a real
caked (build/bin/caked via cake.testing.SpawnedDaemon). Prestores 3 chunks of B's prompt, then checks the scheduler
side: lookup (None until answered), external match, async load (WAITING_FOR_REMOTE_KVS), metadata with the load.
    CAKE_CAKED=/work/main/build/bin/caked PYTHONPATH=cakepkg python drive_cake_connector.py
"""
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from cake.testing import SpawnedDaemon  # noqa: E402
import drive_scheduler as ds  # noqa: E402
from cake.vllm import namespace_for  # noqa: E402

with SpawnedDaemon(["--dram-capacity-mib", "64"]) as d:
    cfg = ds.make_vllm_config(False, connector="CakeConnector", module="cake.vllm",
                              extra={"cake_socket": d.socket_path, "cake_chunk_tokens": 32,
                                     "cake_lookup_wait_s": 0.05})
    sched = ds.make_scheduler(cfg)
    print("connector:", type(sched.connector).__module__, type(sched.connector).__name__)
    ds.init_none_hash(ds.sha256)  # EngineCore does this; a bare Scheduler needs it before Requests hash blocks
    b = ds.make_request("B", 128, seed=2)
    ns = namespace_for(cfg, tp_rank=0)
    print("namespace:", ns)
    with d.client() as c:  # prestore chunks 0..2 of B's prompt from a host region
        region = c.register_region(3 * ns.chunk_bytes, kind="host")
        c.store(ns, tokens=[int(t) for t in b.prompt_token_ids[:96]], first_chunk=0, chunk_count=3, region=region)
        print("lookup B:", c.lookup(ns, tokens=[int(t) for t in b.prompt_token_ids[:96]]).cached_chunks, "chunks")
    sched.add_request(b)
    for step in range(4):
        out = sched.schedule()
        meta = out.kv_connector_metadata
        print(f"step {step}: scheduled={dict(out.num_scheduled_tokens)} B.status={b.status.name} "
              f"B.computed={b.num_computed_tokens} has_sync_kv_loads={out.has_sync_kv_loads} "
              f"loads={[(l.request_id, l.start, l.end, l.is_async, l.block_ids) for l in meta.loads]}")
        if out.num_scheduled_tokens:
            break
        if step == 1:  # the worker reports the load done (as get_finished would): B is promoted and computes the rest
            from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
            sched.update_from_output(out, ModelRunnerOutput(req_ids=[], kv_connector_output=KVConnectorOutput(
                finished_recving={"B"})))
        time.sleep(0.1)
    from vllm.v1.request import RequestStatus
    sched.finish_requests(["B"], RequestStatus.FINISHED_ABORTED)
    sched.connector.shutdown()
