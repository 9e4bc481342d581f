"""A PyTorch engine that prefills with Cake against caked: a small Llama-shaped model (RMSNorm, RoPE,
grouped-query attention, SwiGLU) with seeded random weights, chunked prefill into a KV cache, and the three ways
to fill that cache (compute-only, I/O-only, Cake) plus fixed splits. In every mode the KV cache and the first
token's logits are identical, bit for bit, to full compute. CPU with Debian's python3-torch, or CUDA with device
regions over CUDA IPC. `/usr/bin/python3 -m cake_torch_engine demo|bench --help`."""
from cake_torch_engine.model import ModelConfig, TorchLlama
from cake_torch_engine.engine import PrefillResult, TorchPrefillEngine, same_bits

__all__ = ["ModelConfig", "TorchLlama", "TorchPrefillEngine", "PrefillResult", "same_bits"]
