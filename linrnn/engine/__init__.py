"""The engine behind the ops: where a call goes and which file does what.

A call flows one way (docs/DESIGN.md §8)::

    linrnn.ops.<family> -> ops._generic.route (mode, backend, chunk size, decided once)
        -> torch_chunk | torch_delta       the pure-PyTorch chunkwise paths (CPU, fp64)
        -> scalar | vector | recurrent     Triton hosts: forward(...) -> (outputs, saved),
           | delta | delta_recurrent       backward(saved, ...) -> gradients
        -> *_kernels                       the Triton kernels they launch

Host side (plain Python and PyTorch):

* ``config``      the call config (ChunkConfig), packed-sequence tables, every tile table and
                  the one chunk-size rule (default, ints, ``"auto"``); no Triton needed.
* ``scalar``      chunk and fused_chunk modes for scalar gates: linear attention, retention,
                  simple GLA, mLSTM (sigmoid and exp input gate).
* ``vector``      chunk and fused_chunk modes for per-channel gates: GLA (gk, gv), RWKV6 (w, u).
* ``recurrent``   the recurrent mode of every family (decoding, short sequences), with backward.
* ``delta``       chunk mode of the delta rule (DeltaNet, Gated DeltaNet): the WY/UT solve per
                  chunk, the state walk that forms the new values, then the scalar engine's
                  intra-chunk kernels on them (docs/DESIGN.md §10).
* ``delta_recurrent``  the delta rule's recurrent mode (decoding, short sequences), with backward.
* ``torch_delta``  the delta rule's chunk form in PyTorch.
* ``gate_grads``  the gate-gradient helpers the hosts share, and the PyTorch sums and
                  max-state routing of the hosts without chunk states.
* ``mamba2_gates``  Mamba2's gates g = Δ·A, gi = log Δ from dt (and their gradients) in one
                  Triton kernel each way, for the Triton chunk path.
* ``custom_ops``  torch.library ops over the hosts' forward/backward, for torch.compile.
* ``host_math``   integer helpers for grids and tiles.
* ``launch``      the decode kernels' launches: the compiled kernel kept per specialization and
                  its launcher called directly.
* ``replay``      one call's device work (ATen operations, launches) logged once and performed
                  again without its host logic: ``linrnn.step``'s repeated steps.

Kernels (Triton):

* ``triton_common``        @triton.jit helpers every kernel file shares.
* ``scalar_kernels``       scalar gates: output, dq, dk, dv;
  ``scalar_state_kernels`` their chunk-state walks fwd/bwd and the normalizer's backward rows;
  ``group_kernels``        their dq and dk for large head groups (Mamba2): the intra-chunk
                           gradient matrix once per group and chunk.
  ``group_scores_kernels``  the output and dv for large q/k groups (Mamba2): a chunk's scores
                           q·kᵀ formed once for several value heads of a group.
* ``vector_kernels``       per-channel gates: chunk states fwd/bwd, output, dq, dk, dv (sub-chunk
                           forms), on the helpers of ``vector_common``;
  ``vector_scores_kernels``  the stored intra-chunk scores and the fast chunks (gk-only calls),
  ``vector_cumsum_kernels``  the chunk-local gate cumsums (and pre-gated q, k),
  ``vector_gate_grad_kernels``  the per-channel log-decay gradient.
* ``scalar_gate_grad_kernels``  chunk mode's scalar gate gradients and mLSTM-exp's max-state
                           routing, one pass.
* ``fused_kernels``        mode "fused_chunk": the non-materializing kernels, both gate kinds.
* ``recurrent_kernels``    the recurrent forward and backward kernels.
* ``delta_kernels``, ``delta_bwd_kernels``  the delta rule's solve, W/U and state walks.
* ``delta_recurrent_kernels``  the delta rule's recurrent forward and backward kernels.
"""
