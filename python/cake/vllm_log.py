"""Kept for older imports: the vLLM integration's log and its workers' regions now live in cake.vllm.log."""
from cake.vllm.log import RegionSlot, forget, forget_all, log, once, region_unknown

__all__ = ["RegionSlot", "forget", "forget_all", "log", "once", "region_unknown"]
