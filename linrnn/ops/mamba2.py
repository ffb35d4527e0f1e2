"""Mamba2's SSD (state space duality) layer recurrence on the scalar-gate engine
(docs/DESIGN.md §11).

The mapping onto the generic recurrence of :mod:`linrnn.ops._generic` (q = C, k = B, v = x,
scale 1)::

    g_t  = Δ_t·A                     the log decay, [B, T, H]
    gi_t = log Δ_t = log softplus(dt_t + dt_bias)     the log input gate (dt_softplus=True)

so Δ never scales a [B, T, H, N] or [B, T, H, P] tensor: the engine applies ``exp(gi)`` to the
keys inside its kernels, as it does for mLSTM's sigmoid input gate. B and C keep their G groups
on the Triton paths (chunk, fused_chunk, recurrent and the step API: the kernels read group
h // (H / G) for head h and sum dB, dC over each group's heads); the PyTorch paths take them
per head, one copy each. Without ``dt_softplus`` Δ
may be zero, where log Δ has no finite value: the values are scaled instead, v = Δ·x (one
tensor of x's size). On the Triton chunk path (eager, dt_softplus) g and gi come from one
kernel (:mod:`linrnn.engine.mamba2_gates`, its gradients from another), and the engine's
output kernel adds ``D·x`` and its dv kernel forms that term's gradients (the skip term of
:func:`linrnn.engine.scalar.chunk`); an eager recurrent call without gradients (a decode step)
is one launch of the recurrent kernel, which forms Δ, the decay and D·x from dt, dt_bias, A and
D itself; elsewhere both are formed here. Every op mode serves it (the
engine's scalar-gate path), and autograd carries the gradients of Δ, A and dt_bias through
the small [B, T, H] tensors formed here.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from linrnn import _runtime
from linrnn import _validation as check
from linrnn.engine import config
from linrnn.ops import _generic
from linrnn.ops._generic import COMMON_ARGS, compute_dtype

# Below this argument softplus(z) = e^z (1 − e^z/2 + …), so log softplus(z) = z − e^z/2 to
# within e^{2z}/5 (< 1e-13 here): the form that never forms log(0) when e^z underflows.
_LOG_SOFTPLUS_CUT = -15.0
# Above this softplus(z) = z + e^{−z} rounds to z in fp64 too (e^{−40} < 2^{−53}·40); torch's
# default of 20 drops e^{−20} ≈ 2e-9 there, a 1e-10 relative error of Δ in fp64.
_SOFTPLUS_LINEAR_ABOVE = 40.0


def softplus(z: Tensor) -> Tensor:
    """``log(1 + e^z)``, exact to the last bit of fp64 (``e^z`` stays finite below the
    threshold in fp32 as well)."""
    return F.softplus(z, threshold=_SOFTPLUS_LINEAR_ABOVE)


def log_softplus(z: Tensor) -> Tensor:
    """``log(softplus(z))``, finite for every finite z (≈ z for very negative z, where
    softplus underflows), with a finite gradient ``σ(z)/softplus(z)`` everywhere."""
    lo = z.clamp_max(_LOG_SOFTPLUS_CUT)
    hi = z.clamp_min(_LOG_SOFTPLUS_CUT)
    return torch.where(z < _LOG_SOFTPLUS_CUT, lo - 0.5 * torch.exp(lo), torch.log(softplus(hi)))


def mamba2(
    x,
    dt,
    A,
    B,
    C,
    *,
    D=None,
    dt_bias=None,
    dt_softplus: bool = False,
    initial_state=None,
    output_final_state: bool = False,
    cu_seqlens=None,
    mode=None,
    backend=None,
    chunk_size=None,
):
    """Mamba2's SSD recurrence (argument names as mamba_ssm's ``mamba_chunk_scan_combined``)::

        Δ_t = softplus(dt_t + dt_bias)  (dt_softplus)   or   dt_t + dt_bias
        h_t = exp(Δ_t·A) h_{t−1} + Δ_t B_t x_tᵀ          h [N, P] per head
        y_t = C_tᵀ h_t + D·x_t

    Args:
        x: ``[B, T, H, P]`` the inputs (values); fp16/bf16/fp32/fp64.
        dt: ``[B, T, H]`` step sizes (before ``dt_bias`` and the softplus), finite; any float
            dtype, used in fp32 (fp64 for fp64 x).
        A: ``[H]`` finite and ≤ 0 (Mamba2: ``−exp(A_log)``); used in fp32 (fp64 for fp64 x).
        B, C: ``[B, T, G, N]`` in x's dtype, H a multiple of G: head h reads group
            ``h // (H / G)`` (B are the keys, C the queries).
        D: skip connection ``[H]``, or ``[H, P]`` per channel (mamba_ssm's ``D_has_hdim``),
            or None.
        dt_bias: ``[H]`` added to dt, or None.
        dt_softplus: Δ = softplus(dt + dt_bias); else Δ = dt + dt_bias, which must be ≥ 0.
        {common}

    The scale is 1 (``C_tᵀ h_t``). State: ``h [N_seq, H, N, P]`` (fp32; fp64 for fp64 x).

    Example:
        >>> x, dt = torch.randn(2, 128, 8, 64), torch.randn(2, 128, 8)
        >>> A = -torch.rand(8) * 16
        >>> B, C = torch.randn(2, 128, 1, 128), torch.randn(2, 128, 1, 128)
        >>> y, h = linrnn.mamba2(x, dt, A, B, C, dt_softplus=True, output_final_state=True)
    """
    check.choice("mode", mode, (None, *_generic.MODES))
    check.choice("backend", backend, _generic.BACKENDS)
    check.flag("output_final_state", output_final_state)
    config.check_chunk_size(chunk_size)
    Bsz, T, H = check_shapes(x, B, C)
    dt, A, D, dt_bias = check_gates(x, dt, A, D, dt_bias, dt_softplus, (Bsz, T, H))
    offsets = None if cu_seqlens is None else check.cu_seqlens(cu_seqlens, Bsz, T, x)
    nseq = Bsz if offsets is None else len(offsets) - 1
    S0 = None
    if initial_state is not None:
        S0 = check.state("initial_state", initial_state, (nseq, H, B.shape[3], x.shape[3]), x,
                         "[N_seq, H, N, P]")  # fmt: skip

    # The Triton kernels read each group's B and C for its heads; the PyTorch paths take them
    # per head.
    grad = _generic._needs_grad(x, dt, A, B, C, D, dt_bias, S0)
    r = _generic.route("mamba2", C, x, grad=grad, cu_seqlens=offsets, mode=mode,
                       backend=backend, chunk_size=chunk_size)  # fmt: skip
    if r.backend != "triton":
        B, C = per_head(B, H), per_head(C, H)
    # Eager Triton calls with dt_softplus form the gates in one kernel each way
    # (engine.mamba2_gates); the chunk engine's output kernel adds D·x. The recurrent kernel
    # without gradients forms the gates from dt itself and adds D·x (a decode step: one
    # launch). Traced calls take the generic path (PyTorch gate ops). (A per-channel D is added
    # after the kernels: their skip term is one scalar per head.)
    fused = r.backend == "triton" and dt_softplus and not _runtime.tracing()
    skip = D if fused and D is not None and D.dim() == 1 else None
    step_gates = None
    if fused and r.mode == "chunk":
        o, S = _triton_chunk(x, dt, A, B, C, skip, dt_bias, S0, offsets, r.chunk_size)
    else:
        if fused and _generic.kernel_gates(r, grad):
            g = gi = None
            v, step_gates = x, dict(dt=dt, dt_bias=dt_bias, A=A)
        elif fused:
            from linrnn.engine import mamba2_gates

            (g, gi), v = mamba2_gates.gates(dt, A, dt_bias), x
        else:
            v, g, gi = gates(x, dt, A, dt_bias, dt_softplus)
        if step_gates is None:
            skip = None
        o, (S, _, _) = _generic.run(
            "mamba2", C, B, v, scale=1.0, g=g, gi=gi, S0=S0, cu_seqlens=offsets, mode=r.mode,
            backend=r.backend, chunk_size=chunk_size, skip=skip, step_gates=step_gates,
        )  # fmt: skip
    if D is not None and skip is None:
        o = _add_skip(o, D, x)
    return o, (S if output_final_state else None)


def _add_skip(o, D, x):
    """o + D·x in fp32 (fp64 for fp64 x), rounded once to x's dtype; D ``[H]`` or ``[H, P]``."""
    cdt = compute_dtype(x)
    Dc = D.to(cdt)
    return (o.to(cdt) + (Dc[:, None] if D.dim() == 1 else Dc) * x.to(cdt)).to(x.dtype)


def _triton_chunk(x, dt, A, B, C, D, dt_bias, S0, offsets, chunk_size):
    """The Triton chunk engine with Mamba2's gates formed by one kernel each way
    (:mod:`linrnn.engine.mamba2_gates`) and D·x added inside its output kernel (and its
    gradients in the dv kernel): no [B, T, H, P] tensor beyond y and dx. Eager calls with
    dt_softplus (v = x); torch.compile traces the engine's custom ops, which add no skip term,
    and the gates and D·x are formed on the host there."""
    from linrnn.engine import mamba2_gates

    _generic._triton_dtype("mamba2", C)
    g, gi = mamba2_gates.gates(dt, A, dt_bias)
    o, S, _, _ = _generic.scalar.chunk(
        C, B, x, scale=1.0, g=g, gi=gi, S0=S0, chunk_size=chunk_size,
        offsets=None if offsets is None else [int(i) for i in offsets],
        skip=None if D is None else D.float(),
    )  # fmt: skip
    return o, S


# The arguments every op shares, but for the scale (Mamba2 has none: C_tᵀ h_t).
mamba2.__doc__ = mamba2.__doc__.replace("{common}", COMMON_ARGS.split("\n", 1)[1].lstrip())


def gates(x, dt, A, dt_bias, dt_softplus: bool):
    """The generic recurrence's values and gates of validated inputs: ``(v, g, gi)`` with the
    log decay ``g = Δ·A`` and the log input gate ``gi = log Δ`` ``[B, T, H]`` (fp32; fp64 for
    fp64 inputs) and ``v = x``; without ``dt_softplus`` ``gi`` is None and ``v = Δ·x``."""
    cdt = compute_dtype(x)
    z = dt.to(cdt) if dt_bias is None else dt.to(cdt) + dt_bias.to(cdt)
    if dt_softplus:
        delta, gi, v = softplus(z), log_softplus(z), x
    else:
        delta, gi = _nonnegative_delta(z), None
        v = (x.to(cdt) * delta[..., None]).to(x.dtype)
    return v, delta * A.to(cdt), gi


def check_gates(x, dt, A, D, dt_bias, dt_softplus, shape):
    """Validate dt ``[B, T, H]``, A (≤ 0), D (``[H]`` or ``[H, P]``) and dt_bias ``[H]``,
    dt_softplus; returns them."""
    Bsz, T, H = shape
    check.flag("dt_softplus", dt_softplus)
    dt = check.gate("dt", dt, (Bsz, T, H), x, layout="[B, T, H]")
    A = _nonpositive("A", check.gate("A", A, (H,), x, layout="[H]"))
    if D is not None:
        D = check.tensor("D", D)
        if D.dim() == 2:  # per channel (mamba_ssm's D_has_hdim)
            D = check.gate("D", D, (H, x.shape[3]), x, layout="[H, P]")
        else:
            D = check.gate("D", D, (H,), x, layout="[H] (or [H, P])")
    if dt_bias is not None:
        dt_bias = check.gate("dt_bias", dt_bias, (H,), x, layout="[H]")
    return dt, A, D, dt_bias


def check_shapes(x, B, C):
    """Check x ``[B, T, H, P]`` and B, C ``[B, T, G, N]`` (one dtype and device, H a multiple
    of G); returns ``B, T, H``."""
    x, B, C = check.tensor("x", x, 4), check.tensor("B", B, 4), check.tensor("C", C, 4)
    if not (x.dtype == B.dtype == C.dtype):
        raise TypeError(f"x, B, C must share one dtype, got {x.dtype}, {B.dtype}, {C.dtype}")
    check.same_device(x, "x", B=B, C=C)
    if C.shape != B.shape:
        raise ValueError(
            f"C must have the shape of B [B, T, G, N] = {tuple(B.shape)}, got {tuple(C.shape)}"
        )
    if B.shape[:2] != x.shape[:2]:
        raise ValueError(
            f"B and C must be [B, T, G, N] with B, T = {tuple(x.shape[:2])} as in x, got "
            f"{tuple(B.shape)}"
        )
    Bsz, T, H, P = x.shape
    G, N = B.shape[2], B.shape[3]
    if min(Bsz, T, H, P, G, N) < 1:
        raise ValueError(
            f"x, B, C must have every dimension ≥ 1, got x {tuple(x.shape)}, B {tuple(B.shape)}"
        )
    if H % G:
        raise ValueError(
            f"x's head count H={H} must be a multiple of the group count G={G} of B and C "
            f"(head h reads group h // (H / G)), got x {tuple(x.shape)}, B {tuple(B.shape)}"
        )
    return Bsz, T, H


def per_head(x: Tensor, H: int) -> Tensor:
    """``[B, T, G, N]`` → ``[B, T, H, N]``, group g serving heads ``g·H/G … (g+1)·H/G − 1``."""
    Bsz, T, G, N = x.shape
    if G == H:
        return x
    return x[:, :, :, None].expand(Bsz, T, G, H // G, N).reshape(Bsz, T, H, N)


def _nonpositive(name: str, x: Tensor) -> Tensor:
    if _runtime.data_checks(x) and bool((x > 0).any()):
        raise ValueError(
            f"{name} must be ≤ 0 (exp(Δ·{name}) is a decay), but its maximum is "
            f"{x.max().item():.6g}"
        )
    return x


def _nonnegative_delta(z: Tensor) -> Tensor:
    if _runtime.data_checks(z) and z.numel() and bool((z < 0).any()):
        raise ValueError(
            "with dt_softplus=False, Δ = dt + dt_bias is the step size and must be ≥ 0, but its "
            f"minimum is {z.min().item():.6g} (pass dt_softplus=True for Mamba2's softplus)"
        )
    return z
