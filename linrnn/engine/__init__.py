"""Chunkwise engines. ``torch_chunk`` is the pure-PyTorch path (CPU users, and the fallback
everywhere); the Triton kernels join here as later issues land them."""
