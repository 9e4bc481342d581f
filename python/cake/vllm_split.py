"""Kept for older configurations and imports: Cake's split in vLLM now lives in the cake.vllm package (the scheduler
half in cake.vllm.scheduler, the worker half in cake.vllm.worker, the metadata in cake.vllm.data)."""
from cake.vllm.data import SplitMetadata
from cake.vllm.scheduler import SplitScheduler, forced_split_at
from cake.vllm.worker import SplitWorker, WindowPool

__all__ = ["SplitMetadata", "SplitScheduler", "SplitWorker", "WindowPool", "forced_split_at"]
