"""A minimal KV connector loaded by module path (kv_connector_module_path="demo_connector"), with the shape the
Cake split needs: scheduler-side admission answers, metadata carrying loads/splices/progress, and worker metadata
(aggregated over ranks) fed back through update_connector_output. Scheduler side only is exercised here."""
import logging
from dataclasses import dataclass, field

from vllm.distributed.kv_transfer.kv_connector.v1.base import (KVConnectorBase_V1, KVConnectorMetadata,
                                                               KVConnectorRole, KVConnectorWorkerMetadata)

log = logging.getLogger("demo_connector")
CALLS = []  # (method, details) in call order, for the driver to print


@dataclass
class DemoMeta(KVConnectorMetadata):
    loads: list = field(default_factory=list)      # (req_id, start, end, block_ids)
    splices: list = field(default_factory=list)    # (req_id, start, end, block_ids)
    progress: dict = field(default_factory=dict)   # req_id -> front after this step


@dataclass
class DemoWorkerMeta(KVConnectorWorkerMetadata):
    resident_low: dict = field(default_factory=dict)  # req_id -> lowest resident chunk on this rank

    def aggregate(self, other):
        merged = dict(self.resident_low)
        for k, v in other.resident_low.items():
            merged[k] = max(merged.get(k, v), v)
        return DemoWorkerMeta(merged)


class DemoConnector(KVConnectorBase_V1):
    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        extra = vllm_config.kv_transfer_config.kv_connector_extra_config
        self.external = int(extra.get("external_tokens", 32))   # tokens "cached" beyond vLLM's local hit
        self.load_async = bool(extra.get("load_async", False))
        self.block_size = vllm_config.cache_config.block_size
        self._pending_loads, self._pending_splices = [], []
        self.worker_meta_seen = []
        self.split_book = {}  # for the scheduler mixin: req_id -> target H to jump to (set by the driver)

    # ---- scheduler side ----
    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        n = len(request.prompt_token_ids)
        ext = min(self.external, max(0, (n - 1) // self.block_size * self.block_size - num_computed_tokens))
        if request.request_id.endswith("split"):
            ext = 0  # the split request computes its front; the mixin jumps it later
        CALLS.append(("get_num_new_matched_tokens", request.request_id, num_computed_tokens, ext, self.load_async))
        return ext, (self.load_async and ext > 0)

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        ids = blocks.get_block_ids()[0] if blocks is not None else []
        CALLS.append(("update_state_after_alloc", request.request_id, num_external_tokens, list(ids)))
        if num_external_tokens > 0:
            self._pending_loads.append((request.request_id, num_external_tokens, list(ids)))

    def build_connector_meta(self, scheduler_output):
        # splices: resolve [F, H)'s blocks now, after schedule() allocated them; only for scheduled requests
        splices = []
        for req_id, f, h in self._pending_splices:
            if req_id in scheduler_output.num_scheduled_tokens:
                blocks = self._kv_cache_manager.get_block_ids(req_id)[0]
                splices.append((req_id, f, h, list(blocks[f // self.block_size:(h + self.block_size - 1) // self.block_size])))
        meta = DemoMeta(loads=self._pending_loads, splices=splices,
                        progress={r: n for r, n in scheduler_output.num_scheduled_tokens.items()})
        self._pending_loads, self._pending_splices = [], []
        CALLS.append(("build_connector_meta", len(meta.loads), len(meta.splices)))
        return meta

    def update_connector_output(self, connector_output):
        if connector_output.kv_connector_worker_meta is not None:
            self.worker_meta_seen.append(connector_output.kv_connector_worker_meta)
        CALLS.append(("update_connector_output", connector_output.finished_recving,
                      connector_output.kv_connector_worker_meta))

    def request_finished(self, request, block_ids):
        CALLS.append(("request_finished", request.request_id, request.num_computed_tokens, list(block_ids)))
        return False, None

    @property
    def requires_kv_delivery(self):
        return False

    # ---- worker side (not driven here; no model runner) ----
    def start_load_kv(self, forward_context, **kwargs):
        pass

    def wait_for_layer_load(self, layer_name):
        pass

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        pass

    def wait_for_save(self):
        pass

    def build_connector_worker_meta(self):
        return None
