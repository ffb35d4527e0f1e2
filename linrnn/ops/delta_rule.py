"""The delta rule: DeltaNet and Gated DeltaNet (docs/DESIGN.md §1b).

Unlike the other families, the transition ``exp(g_t)(I − β_t k_t k_tᵀ)`` is not diagonal, so
these ops do not go through the generic recurrence of :mod:`linrnn.ops._generic`; they share
its dispatch (:func:`linrnn.ops._generic.route`), argument checks and conventions:

- PyTorch: ``"reference"`` and ``"recurrent"`` run the step-by-step loop
  :func:`linrnn.reference.delta_recurrent`, ``"parallel"`` the one-chunk closed form
  :func:`linrnn.reference.delta_parallel`, ``"chunk"`` the chunkwise engine
  :func:`linrnn.engine.torch_delta.chunk`; packed sequences run one by one.
- Triton: ``"chunk"`` (:mod:`linrnn.engine.delta`) and ``"recurrent"``
  (:mod:`linrnn.engine.delta_recurrent`), packed sequences native.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from linrnn import _runtime
from linrnn import _validation as check
from linrnn.engine import config, torch_delta
from linrnn.ops import _generic
from linrnn.ops._generic import compute_dtype, document
from linrnn.reference import delta_parallel, delta_recurrent

try:  # the Triton delta-rule hosts
    from linrnn.engine import delta as triton_chunk
except ImportError as exc:
    triton_chunk, _CHUNK_MISSING = None, exc
try:
    from linrnn.engine import delta_recurrent as triton_recurrent
except ImportError as exc:
    triton_recurrent, _RECURRENT_MISSING = None, exc
try:
    from linrnn.engine import l2norm as triton_l2norm
except ImportError:
    triton_l2norm = None

BETA_RANGE = (0.0, 2.0)
L2NORM_EPS = 1e-6

DELTA_DOC = """
    Args:
        q, k: ``[B, T, H, K]``; v: ``[B, T, HV, V]`` with HV a multiple of H (grouped value
            heads: value head j reads q/k head ``j // (HV / H)``); one float dtype
            (fp16/bf16/fp32/fp64).
        {gate}beta: ``[B, T, HV]`` write strength β, finite and in ``[0, 2]``; any float dtype,
            used in fp32. β ∈ (1, 2] gives the transition a negative eigenvalue
            ``1 − β|k|²`` for unit keys (fla's ``allow_neg_eigval``).
        use_qk_l2norm: normalize q and k inside the op, ``x·rsqrt(Σx² + 1e-6)`` along K
            (in fp32, cast back to the input dtype; differentiable).
        {common}

    State: ``S [N, HV, K, V]`` (fp32).

    Validated: shapes, dtypes, devices, HV a multiple of H, β finite and in [0, 2]{gcheck}
    (the value checks where ``linrnn.set_checks`` enables them: by default on CPU tensors).
    Not validated: the key norms. Each step's transition ``I − β k kᵀ`` has the eigenvalues 1
    (K − 1 times) and ``1 − β|k|²``, so the recurrence is non-expansive exactly when
    ``β|k|² ≤ 2`` — always so for unit-norm keys (``use_qk_l2norm=True``). Beyond that the
    state can grow exponentially, in every mode alike; the op raises no error and its
    results follow the math (growing, eventually inf/NaN), with the chunk modes' triangular
    solve amplifying rounding on top. ``mode="fused_chunk"`` has no delta-rule kernel
    (NotImplementedError)."""


def delta_rule(
    q,
    k,
    v,
    beta,
    *,
    scale=None,
    initial_state=None,
    output_final_state: bool = False,
    cu_seqlens=None,
    mode=None,
    backend=None,
    chunk_size=None,
    use_qk_l2norm: bool = False,
):
    """DeltaNet: linear attention with the delta rule (each write replaces the value stored
    under its key)::

        S_t = S_{t−1} + β_t k_t (v_t − S_{t−1}ᵀ k_t)ᵀ = (I − β_t k_t k_tᵀ) S_{t−1} + β_t k_t v_tᵀ
        o_t = scale·S_tᵀ q_t
    {delta}

    Example:
        >>> k = torch.nn.functional.normalize(torch.randn(2, 128, 4, 64), dim=-1)
        >>> beta = torch.rand(2, 128, 4).sigmoid()
        >>> o, S = linrnn.delta_rule(q, k, v, beta, output_final_state=True)
    """
    return _delta("delta_rule", q, k, v, None, beta, scale, initial_state, output_final_state,
                  cu_seqlens, mode, backend, chunk_size, use_qk_l2norm)  # fmt: skip


def gated_delta_rule(
    q,
    k,
    v,
    g,
    beta,
    *,
    scale=None,
    initial_state=None,
    output_final_state: bool = False,
    cu_seqlens=None,
    mode=None,
    backend=None,
    chunk_size=None,
    use_qk_l2norm: bool = False,
):
    """Gated DeltaNet: the delta rule with a data-dependent scalar decay per value head::

        S_t = exp(g_t) S_{t−1}
        S_t = S_t + β_t k_t (v_t − S_tᵀ k_t)ᵀ
            (= exp(g_t)(I − β_t k_t k_tᵀ) S_{t−1} + β_t k_t v_tᵀ)
        o_t = scale·S_tᵀ q_t
    {delta}

    Example:
        >>> g = torch.nn.functional.logsigmoid(torch.randn(2, 128, 8))
        >>> o, S = linrnn.gated_delta_rule(q, k, v, g, beta, use_qk_l2norm=True)
    """
    return _delta("gated_delta_rule", q, k, v, g, beta, scale, initial_state,
                  output_final_state, cu_seqlens, mode, backend, chunk_size,
                  use_qk_l2norm)  # fmt: skip


_GATE_DOC = """g: ``[B, T, HV]`` log decay, finite and ≤ 0 (e.g. ``logsigmoid(x)``, or
            Gated DeltaNet's ``−exp(A_log)·softplus(a + dt_bias)``); any float dtype, used in
            fp32. Strong decays (−30 per step) are exact: every exponent formed is ≤ 0.
        """
for _fn, _gate, _gcheck in (
    (delta_rule, "", ""),
    (gated_delta_rule, _GATE_DOC, ", g finite and ≤ 0"),
):
    _fn.__doc__ = _fn.__doc__.replace(
        "{delta}", DELTA_DOC.replace("{gate}", _gate).replace("{gcheck}", _gcheck)
    )
    document(_fn)


def l2norm(x: Tensor) -> Tensor:
    """``x·rsqrt(Σx² + 1e-6)`` along the last dimension, in fp32 (fp64 for fp64 inputs), cast
    back to x's dtype; autograd differentiates it. The Triton backend runs the same in
    :func:`linrnn.engine.l2norm.l2norm` (eager calls; traced calls keep this form)."""
    xc = x.to(compute_dtype(x))
    return (xc * torch.rsqrt((xc * xc).sum(-1, keepdim=True) + L2NORM_EPS)).to(x.dtype)


def _delta(family, q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens,
           mode, backend, chunk_size, use_qk_l2norm):  # fmt: skip
    check.choice("mode", mode, (None, *_generic.MODES))
    check.choice("backend", backend, _generic.BACKENDS)
    check.flag("output_final_state", output_final_state)
    check.flag("use_qk_l2norm", use_qk_l2norm)
    config.check_chunk_size(chunk_size)
    B, T, _, HV, K, V = check.qkv_grouped(q, k, v)
    offsets = None if cu_seqlens is None else check.cu_seqlens(cu_seqlens, B, T, q)
    N = B if offsets is None else len(offsets) - 1
    scale = check.scale(scale, K)
    if g is not None:
        g = check.gate("g", g, (B, T, HV), q, layout="[B, T, HV]", nonpositive=True)
    beta = check.interval("beta", beta, (B, T, HV), q, layout="[B, T, HV]",
                          low=BETA_RANGE[0], high=BETA_RANGE[1])  # fmt: skip
    S0 = None
    if initial_state is not None:
        S0 = check.state("initial_state", initial_state, (N, HV, K, V), q, "[N, HV, K, V]")
    if mode == "fused_chunk":
        raise NotImplementedError(
            f"{family}: mode='fused_chunk' has no delta-rule kernel; use 'chunk' (fast), "
            "'recurrent', 'parallel' or 'reference'"
        )
    grad = _generic._needs_grad(q, k, v, g, beta, S0)
    if backend is None and (triton_chunk is None or triton_recurrent is None):
        backend = "torch"  # no delta-rule kernels in this build: PyTorch serves every mode
    r = _generic.route(family, q, v, grad=grad, cu_seqlens=offsets, mode=mode, backend=backend,
                       chunk_size=chunk_size)  # fmt: skip
    # A decode step (the eager Triton recurrent kernel without gradients) normalizes q and k
    # in its kernel: one launch.
    l2norm_eps = None
    if use_qk_l2norm and _generic.kernel_gates(r, grad) and triton_recurrent is not None:
        l2norm_eps = L2NORM_EPS
    elif use_qk_l2norm:
        norm = l2norm
        if r.backend == "triton" and triton_l2norm is not None and not _runtime.tracing():
            norm = functools.partial(triton_l2norm.l2norm, eps=L2NORM_EPS)  # one pass each way
        q, k = norm(q), norm(k)
    if r.backend == "triton":
        o, S = _triton(family, r, q, k, v, beta, g, scale, S0, offsets, chunk_size, grad,
                       l2norm_eps)  # fmt: skip
    else:
        o, S = _torch(r, q, k, v, beta, g, scale, S0, offsets)
    return o, (S if output_final_state else None)


def _torch(r, q, k, v, beta, g, scale, S0, offsets):
    """The PyTorch paths, in fp32 (fp64 for fp64 inputs); packed sequences one by one."""
    if r.mode == "chunk":
        impl = functools.partial(torch_delta.chunk, chunk_size=r.chunk_size)
    else:
        impl = delta_parallel if r.mode == "parallel" else delta_recurrent
    cdt = compute_dtype(q)
    cast = lambda x: None if x is None else x.to(cdt)  # noqa: E731
    qc, kc, vc, bc, gc, S0 = map(cast, (q, k, v, beta, g, S0))
    if _runtime.tracing():
        qc, kc, vc, bc, gc = map(_generic._contiguous_grad, (qc, kc, vc, bc, gc))
    if offsets is None:
        o, S = impl(qc, kc, vc, bc, scale=scale, g=gc, S0=S0)
    else:
        o, S = _packed(impl, qc, kc, vc, bc, gc, scale, S0, offsets)
    return _generic._out(o, q.dtype), S


def _packed(impl, q, k, v, beta, g, scale, S0, offsets):
    """Packed variable-length batch (B == 1): each sequence from its own initial state, the
    outputs concatenated back along T (torch.split, as in :func:`_generic._packed`)."""
    HV, K, V = v.shape[2], q.shape[3], v.shape[3]
    n = len(offsets) - 1
    lengths = [offsets[i + 1] - offsets[i] for i in range(n)]
    split = lambda x: [None] * n if x is None else x.split(lengths, dim=1)  # noqa: E731
    qs, ks, vs, bs, gs = map(split, (q, k, v, beta, g))
    S0s = [None] * n if S0 is None else S0.split(1)
    outs, states = [], []
    for i in range(n):
        if lengths[i] == 0:  # an empty sequence: the state passes through unchanged
            outs.append(vs[i])
            states.append(S0s[i] if S0 is not None else q.new_zeros(1, HV, K, V))
            continue
        o, S = impl(qs[i], ks[i], vs[i], bs[i], scale=scale, g=gs[i], S0=S0s[i])
        outs.append(o)
        states.append(S)
    return torch.cat(outs, dim=1), torch.cat(states, dim=0)


def _triton(family, r, q, k, v, beta, g, scale, S0, offsets, chunk_size, grad, l2norm_eps):
    """The Triton hosts: inputs in their own dtype, β, g and the initial state in fp32;
    ``l2norm_eps``: the recurrent kernel normalizes q and k (a decode step)."""
    _generic._triton_dtype(family, q)
    f32 = lambda x: None if x is None else x.float()  # noqa: E731
    beta, g, S0 = f32(beta), f32(g), f32(S0)
    if _runtime.tracing() and _generic.custom_ops is not None:
        # torch.compile: the chunk kernels as opaque custom ops, one graph for every T (the
        # recurrent mode too: the same recurrence, and its host code cannot be traced)
        L = None if chunk_size is None or r.mode != "chunk" else r.chunk_size
        return _generic.custom_ops.delta_chunk(q, k, v, beta, g, scale=scale, S0=S0,
                                               offsets=offsets, chunk_size=L)  # fmt: skip
    if r.mode == "recurrent":
        host = _host(family, triton_recurrent, "linrnn.engine.delta_recurrent", "recurrent")
        out = None if grad or _runtime.tracing() else _out_state(q, v, offsets)
        return host.recurrent(q, k, v, beta, g, scale=scale, S0=S0, offsets=offsets,
                              out_state=out, l2norm_eps=l2norm_eps)  # fmt: skip
    host = _host(family, triton_chunk, "linrnn.engine.delta", "chunk")
    # None keeps the engine's own default chunk length; "auto" and ints as route resolved them.
    L = None if chunk_size is None else r.chunk_size
    return host.chunk(q, k, v, beta, g, scale=scale, S0=S0, offsets=offsets, chunk_size=L)


def _host(family, module, name, mode):
    if module is None:
        missing = _RECURRENT_MISSING if mode == "recurrent" else _CHUNK_MISSING
        raise NotImplementedError(
            f"{family}: the Triton kernel for mode={mode!r} is not available ({name} could not "
            f"be imported: {missing}); use backend='torch'"
        )
    return module


def _out_state(q, v, offsets):
    """The caller's state tensor of an in-place :func:`linrnn.step`, when it fits the kernel's
    output (contiguous fp32 ``[N, HV, K, V]``); None otherwise (the step then copies)."""
    parts = _generic.OUT_STATE.get()
    if not parts:
        return None
    N = q.shape[0] if offsets is None else len(offsets) - 1
    shape = (N, v.shape[2], q.shape[3], v.shape[3])
    p = parts[0]
    ok = (isinstance(p, Tensor) and tuple(p.shape) == shape and p.dtype == torch.float32
          and p.is_contiguous() and p.device == q.device)  # fmt: skip
    return p if ok else None
