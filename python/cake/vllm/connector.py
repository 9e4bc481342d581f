"""CakeConnector: vLLM's KVConnectorBase_V1 on caked, a facade over the scheduler's half (cake.vllm.scheduler) and
the worker's half (cake.vllm.worker), as vLLM's own store connectors are laid out. One instance per process and
role; the halves talk through CakeConnectorMetadata (cake.vllm.data), which vLLM carries from one to the other each
step.
"""
from __future__ import annotations

import logging
import os
from typing import Optional

from cake.client import Client
from cake.errors import CakeError
from cake.vllm.config import extra_config
from cake.vllm.data import CakeConnectorMetadata, KVConnectorBase_V1, KVConnectorRole
from cake.vllm.log import once
from cake.vllm.scheduler import SplitScheduler, _SchedulerSide
from cake.vllm.worker import _WorkerSide


def connect(vllm_config, who: str) -> Client:
    """The connector's client. A daemon that does not answer now costs the cache, not vLLM's start: the client
    then connects on its first call that finds the daemon (every call until then is a miss or a failed transfer,
    which vLLM computes), and the worker registers its regions then (cake.vllm.log.RegionSlot)."""
    extra = extra_config(vllm_config)
    timeout_s = float(extra.get("cake_timeout_s", 30.0))
    kwargs = dict(client_id=f"vllm-{who}-{os.getpid()}", timeout_s=timeout_s, load_timeout_s=timeout_s)
    socket = extra.get("cake_socket") or None
    try:
        return Client(socket, connect_timeout_s=min(5.0, timeout_s), **kwargs)
    except CakeError as error:
        if getattr(error.code, "name", None) != "UNAVAILABLE" or socket is None:
            raise  # no socket named and none found, or a refusal: a configuration to fix, said at start
        once(logging.WARNING, "connect", "caked does not answer on %s: vLLM starts without its cache, which comes "
             "on once caked answers (%s)", socket, error)
        return Client(socket, connect_timeout_s=None, **kwargs)


class CakeConnector(KVConnectorBase_V1):
    """vLLM's KVConnectorBase_V1 on caked. One instance per process and role; the scheduler's and the workers'
    halves talk through CakeConnectorMetadata, which vLLM carries from one to the other each step."""

    def __init__(self, vllm_config, role, kv_cache_config=None, client: Optional[Client] = None):
        if KVConnectorBase_V1 is not object:
            super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        self._metadata = None
        self._role = role
        self._client = client or connect(vllm_config, "scheduler" if role == KVConnectorRole.SCHEDULER else "worker")
        if role == KVConnectorRole.SCHEDULER:
            self._scheduler, self._worker = _SchedulerSide(vllm_config, self._client), None
            self._scheduler.block_ids_of = self._block_ids_of
        else:
            self._scheduler, self._worker = None, _WorkerSide(vllm_config, self._client)

    def _block_ids_of(self, request_id: str):
        manager = getattr(self, "_kv_cache_manager", None)  # vLLM binds it (bind_kv_cache_manager)
        if manager is None:
            raise RuntimeError("Cake's split needs vLLM's KV cache manager (bind_kv_cache_manager, vLLM 0.34 and "
                               "later)")
        return manager.get_block_ids(request_id)

    @property
    def requires_kv_delivery(self) -> bool:
        return False  # a cache: a request never waits on it to be delivered elsewhere

    # --- scheduler side -------------------------------------------------------------------------------------
    def get_num_new_matched_tokens(self, request, num_computed_tokens: int) -> tuple:
        return self._scheduler.get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int) -> None:
        self._scheduler.update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output) -> CakeConnectorMetadata:
        return self._scheduler.build_connector_meta(scheduler_output)

    def update_connector_output(self, connector_output) -> None:
        self._scheduler.on_worker_meta(getattr(connector_output, "kv_connector_worker_meta", None))

    @property
    def cake_split(self) -> Optional[SplitScheduler]:
        """The split's book (cake.vllm.scheduler.SplitScheduler) for CakeSchedulerMixin; None when split mode is
        off or on a worker."""
        return None if self._scheduler is None else self._scheduler.split

    def request_finished(self, request, block_ids: list) -> tuple:
        return self._scheduler.request_finished(request, block_ids)

    # --- worker side ----------------------------------------------------------------------------------------
    def bind_connector_metadata(self, connector_metadata) -> None:
        self._metadata = connector_metadata

    def clear_connector_metadata(self) -> None:
        self._metadata = None

    def register_kv_caches(self, kv_caches: dict) -> None:
        self._worker.register_kv_caches(kv_caches)

    def start_load_kv(self, forward_context, **kwargs) -> None:
        self._worker.start_load_kv(self._metadata)

    def wait_for_layer_load(self, layer_name: str) -> None:
        pass  # synchronous loads are whole before the forward; asynchronous ones before the request is scheduled

    def save_kv_layer(self, layer_name: str, kv_layer, attn_metadata, **kwargs) -> None:
        pass  # stores happen when the request finishes, from its held blocks

    def wait_for_save(self) -> None:
        pass

    def get_finished(self, finished_req_ids) -> tuple:
        return self._worker.get_finished(finished_req_ids)

    def get_block_ids_with_load_errors(self) -> set:
        return self._worker.get_block_ids_with_load_errors()

    def build_connector_worker_meta(self):
        return self._worker.build_connector_worker_meta()

    def shutdown(self) -> None:
        if self._worker is not None:
            self._worker.shutdown()
        if self._scheduler is not None:
            self._scheduler.shutdown()
        self._client.close()
