"""Chunkwise and recurrent engines. ``torch_chunk`` is the pure-PyTorch path (CPU users, and the
fallback everywhere); ``triton_kernels`` + ``triton_chunk`` the Triton chunk engine (per-channel
decays: ``vector_kernels`` and the other ``vector_*`` modules + ``triton_chunk_vec``),
``triton_fused`` its non-materializing
variant, ``triton_recurrent`` the recurrent (decoding) kernel for every family and
``triton_recurrent_bwd`` its backward."""
