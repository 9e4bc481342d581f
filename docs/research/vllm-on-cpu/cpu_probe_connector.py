import sys
from demo_connector import DemoConnector


class ProbeConnector(DemoConnector):
    def register_kv_caches(self, kv_caches):
        for name, t in list(kv_caches.items())[:1]:
            print(f"PROBE register_kv_caches {len(kv_caches)} layers; {name}: shape={tuple(t.shape)} "
                  f"stride={t.stride()} dtype={t.dtype} contiguous={t.is_contiguous()}", file=sys.stderr, flush=True)

    def start_load_kv(self, forward_context, **kwargs):
        m = self._get_connector_metadata()
        if m.loads or m.splices:
            print(f"PROBE start_load_kv loads={m.loads} splices={m.splices}", file=sys.stderr, flush=True)

    def build_connector_meta(self, scheduler_output):
        meta = super().build_connector_meta(scheduler_output)
        if scheduler_output.num_scheduled_tokens:
            cached = scheduler_output.scheduled_cached_reqs
            print(f"PROBE step scheduled={dict(scheduler_output.num_scheduled_tokens)} "
                  f"new={[(n.req_id, n.num_computed_tokens) for n in scheduler_output.scheduled_new_reqs]} "
                  f"cached_pre={dict(zip(cached.req_ids, cached.num_computed_tokens))} "
                  f"has_sync_kv_loads={scheduler_output.has_sync_kv_loads} splices={meta.splices}",
                  file=sys.stderr, flush=True)
        return meta
