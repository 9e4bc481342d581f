"""Kept for older imports: how the connector learns and proves the attention backend's KV layout now lives in
cake.vllm.layout."""
from cake.vllm.layout import Geometry, LayoutError, PagedLayer, learn_layers, writer_of

__all__ = ["Geometry", "LayoutError", "PagedLayer", "learn_layers", "writer_of"]
