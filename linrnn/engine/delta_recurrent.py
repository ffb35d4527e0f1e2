"""Host side of the delta rule's recurrent kernels (delta_recurrent_kernels): the recurrent mode
of DeltaNet and Gated DeltaNet (decoding, short sequences, a training fallback) and its backward.

* :func:`forward` launches the forward kernel: ``(o, S_T)`` and, with ``save=True``, the tensors
  the backward needs (a dict, :data:`SAVED`). It is the decode step's path: one launch, no
  autograd, the final state optionally written over the initial one (``out_state``).
* :func:`backward` takes that dict and the output cotangents and returns the gradients of the
  inputs by name (:data:`GRADS`).
* :func:`recurrent` is the differentiable call (:class:`DeltaRecurrentFunction` over the two).

The backward without the states (docs/DESIGN.md §1b). The step S_{t-1} ↦ S_t =
exp(g_t)(I − β_t k_t k_tᵀ) S_{t-1} + β_t k_t v_tᵀ is not diagonal, so the reverse walk cannot
recover S_{t-1} from S_t cheaply, and inverting the step is not an option (I − β k kᵀ is singular
at β|k|² = 1, and ill-conditioned near it). Instead of checkpoints of the state:

1. the forward (with ``save``) also stores e_t = v_t − S_a,tᵀ k_t (one fp32 tensor the size of v);
2. a reverse walk carries dS alone — the step is linear in S with a transition that does not
   depend on S — and yields dv, dS_0 and the parts of dk, dβ that read e (β dS e, kᵀ dS e);
3. a forward walk recomputes S from S_0 (the forward's own arithmetic) for the parts that need S
   and a cotangent together: dq = scale S_t do_t, dk ∋ −S_a,t de_t.

Tradeoff: memory, one fp32 [B, T, HV, V] tensor kept from the forward; during the backward, fp32
dv and partials of dq and dk per V tile ([NV, B, T, HV, K] each) and, with a decay, the state's
cotangent at every ANCHOR_EVERY-th step ([B·T/ANCHOR_EVERY, HV, K, V]); time, the backward is
two walks over time, about twice the forward, and no step is recomputed more than once.
Checkpoints of the state every C steps would keep T/C states of K·V instead of e, but need the C
states of a segment back in reverse order, i.e. written to and read from memory in the backward
(K·V per step).

dq, dk, dβ and the decay term c_t reduce over V: each V tile writes its partial and they are
summed here; grouped value heads (HV = G·H) sum dq, dk over each group. ∂L/∂g (the identity in
:mod:`linrnn.engine.delta_recurrent_kernels`, :func:`decay_grad`) is a reverse sum of c_t in
fp64 that restarts from the exact value every ANCHOR_EVERY steps: where strong decays make
∂L/∂g_t ≈ 0, each step of the identity cancels to about ε·|⟨S_t, dS_t⟩|, and the restarts keep
that from accumulating over the sequence (fp32, g uniform in [−30, 0], β ≤ 2: RMS-relative
errors of a few 1e-6 to 1e-5 at any length, where one sum over T = 1024 steps reached 1e-4).
Every other gradient is as exact as the forward.
"""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F

from linrnn._runtime import to_device
from linrnn.engine import delta_recurrent_kernels as kern
from linrnn.engine.config import DELTA_RECURRENT_BWD_TILE, DELTA_STEP_TILE, fp32_contiguous
from linrnn.engine.gate_grads import Seqs, rev_cumsum, rows, tokens
from linrnn.engine.host_math import cdiv
from linrnn.engine.launch import launch
from linrnn.engine.recurrent import value_tile

# What forward(save=True) keeps for backward, and the inputs backward returns gradients for.
SAVED = ("q", "k", "v", "beta", "g", "S0", "e", "S_T")
GRADS = ("q", "k", "v", "beta", "g", "S0")

MAX_K = 256  # the kernels hold the whole key dimension of the state in registers
# The kernels' tile tables (:func:`linrnn.engine.recurrent.value_tile`): the state tile is the
# whole K by up to BV_MAX value columns, BK·BV ≤ STATE_ELEMS; the forward's and the backward's.
TILE, BWD_TILE = DELTA_STEP_TILE, DELTA_RECURRENT_BWD_TILE
# The decay gradient's reverse sum restarts from an exact value every this many steps.
ANCHOR_EVERY = 64
DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _cu_seqlens(offsets, device):
    return None if offsets is None else to_device(offsets, device)


def check_inputs(q, k, v, beta, g, S0, offsets, out_state=None) -> int:
    """Raise ValueError/TypeError naming the values for inputs the kernels cannot take; return
    N, the number of sequences (B, or the packed sequences of ``offsets``)."""
    if q.dim() != 4 or k.shape != q.shape:
        raise ValueError(f"q and k must be [B, T, H, K] of one shape, got {tuple(q.shape)} and "
                         f"{tuple(k.shape)}")  # fmt: skip
    B, T, H, K = q.shape
    if v.dim() != 4 or v.shape[:2] != (B, T) or v.shape[2] % H != 0:
        raise ValueError(f"v must be [B, T, HV, V] = [{B}, {T}, a multiple of H={H}, V], got "
                         f"{tuple(v.shape)}")  # fmt: skip
    HV, V = v.shape[2], v.shape[3]
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.dtype not in DTYPES:
            raise TypeError(f"{name} must be float16, bfloat16 or float32, got {x.dtype}")
    if K > MAX_K:
        raise ValueError(f"the recurrent delta rule holds the key dimension whole: K ≤ {MAX_K}, "
                         f"got K={K}")  # fmt: skip
    for name, x in (("beta", beta), ("g", g)):
        if x is not None and tuple(x.shape) != (B, T, HV):
            raise ValueError(f"{name} must be [B, T, HV] = {[B, T, HV]}, got {tuple(x.shape)}")
    if beta is None:
        raise ValueError("beta is required ([B, T, HV])")
    N = B
    if offsets is not None:
        off = [int(x) for x in offsets]
        if B != 1:
            raise ValueError(f"packed sequences (offsets) need B = 1, got B={B}")
        rising = all(a <= b for a, b in itertools.pairwise(off))
        if len(off) < 2 or off[0] != 0 or off[-1] != T or not rising:
            raise ValueError(f"offsets must rise from 0 to T={T}, got {off}")
        N = len(off) - 1
    for name, x in (("S0", S0), ("out_state", out_state)):
        if x is not None and tuple(x.shape) != (N, HV, K, V):
            raise ValueError(f"{name} must be [N, HV, K, V] = {[N, HV, K, V]}, got "
                             f"{tuple(x.shape)}")  # fmt: skip
    if out_state is not None and (out_state.dtype != torch.float32 or
                                  not out_state.is_contiguous()):  # fmt: skip
        raise ValueError(f"out_state must be a contiguous float32 tensor, got {out_state.dtype}"
                         f" (contiguous: {out_state.is_contiguous()})")  # fmt: skip
    return N


def forward(q, k, v, beta, g, *, scale, S0=None, offsets=None, out_state=None, save=False,
            l2norm_eps=None):  # fmt: skip
    """The recurrence forward. q, k ``[B, T, H, K]``, v ``[B, T, HV, V]`` (fp16/bf16/fp32);
    beta, g ``[B, T, HV]`` (g None: DeltaNet); S0 ``[N, HV, K, V]`` or None (N = B, or the
    packed sequences of ``offsets``, the N + 1 token offsets, B = 1). ``out_state``: a
    contiguous fp32 ``[N, HV, K, V]`` tensor to write the final state into (it may be S0
    itself: an in-place step). ``save``: also keep what :func:`backward` needs. ``l2norm_eps``
    (not with ``save``): q and k are normalized in the kernel, x·rsqrt(Σx² + l2norm_eps) along
    K rounded to their dtype, as the op's ``use_qk_l2norm`` (a decode step in one launch).

    Returns ``((o, S_T), saved)``: o ``[B, T, HV, V]`` in q's dtype, S_T fp32, ``saved`` a dict
    over :data:`SAVED` (None without ``save``)."""
    if save and l2norm_eps is not None:
        raise NotImplementedError("the recurrent backward takes q and k normalized")
    N = check_inputs(q, k, v, beta, g, S0, offsets, out_state)
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    beta, g, S0 = fp32_contiguous(beta), fp32_contiguous(g), fp32_contiguous(S0)
    S_T = out_state
    if S_T is None:
        S_T = torch.empty(N, HV, K, V, device=q.device, dtype=torch.float32)
    o = torch.empty_like(v, dtype=q.dtype)
    e = torch.empty(B, T, HV, V, device=q.device, dtype=torch.float32) if save else None
    BK, BV, num_warps = value_tile(K, V, TILE)
    launch(
        kern.delta_recurrent_fwd_kernel, (cdiv(V, BV), N * HV),
        q=q, k=k, v=v, beta=beta, g=g, o=o, h0=S0, ht=S_T, e=e,
        cu_seqlens=_cu_seqlens(offsets, q.device), scale=float(scale), T=T, H=H, HV=HV, K=K,
        V=V, BK=BK, BV=BV, HAS_G=g is not None, HAS_H0=S0 is not None, STORE_E=e is not None,
        IS_VARLEN=offsets is not None, QK_L2NORM=l2norm_eps is not None,
        l2norm_eps=0.0 if l2norm_eps is None else float(l2norm_eps), num_warps=num_warps,
    )  # fmt: skip
    if not save:
        return (o, S_T), None
    return (o, S_T), dict(q=q, k=k, v=v, beta=beta, g=g, S0=S0, e=e, S_T=S_T)


def backward(saved, do, dS_T=None, *, scale, offsets=None):
    """Gradients of a :func:`forward` call (with ``save=True``) from the cotangents of o and
    S_T (either may be None). Returns a dict over :data:`GRADS`: q, k, v in their input dtypes,
    beta, g and S0 fp32; None where the input was None."""
    s = saved
    q, k, v, beta, g, S0 = (s[n] for n in ("q", "k", "v", "beta", "g", "S0"))
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    N = B if offsets is None else len(offsets) - 1
    f32 = dict(device=q.device, dtype=torch.float32)
    do = torch.zeros_like(v, dtype=q.dtype) if do is None else do.contiguous()
    dht = None if dS_T is None else dS_T.float().contiguous()
    BK, BV, num_warps = value_tile(K, V, BWD_TILE)
    NV = cdiv(V, BV)
    common = dict(
        q=q, k=k, v=v, beta=beta, g=g, do=do, cu_seqlens=_cu_seqlens(offsets, q.device),
        scale=float(scale), T=T, NTOK=B * T, H=H, HV=HV, K=K, V=V, BK=BK, BV=BV,
        HAS_G=g is not None, HAS_H0=S0 is not None, IS_VARLEN=offsets is not None,
        num_warps=num_warps,
    )  # fmt: skip
    dv = torch.empty(B, T, HV, V, **f32)
    dk_part = torch.empty(NV, B, T, HV, K, **f32)
    db_part = torch.empty(NV, B, T, HV, **f32)
    dgt_part = torch.empty(NV, B, T, HV, **f32) if g is not None else None
    dS0 = torch.empty(N, HV, K, V, **f32) if S0 is not None else None
    # the decay gradient's exact restarts (module docstring): one slot per segment start > 0
    slots, first = anchor_slots(B, T, offsets) if g is not None else ([], [])
    dck = ck_offsets = dga_part = None
    if slots:
        dck = torch.empty(len(slots), HV, K, V, **f32)
        dga_part = torch.empty(NV, len(slots), HV, **f32)
        ck_offsets = to_device(first, q.device)
    common.update(SEG=ANCHOR_EVERY, HAS_ANCHORS=bool(slots))
    kern.delta_recurrent_bwd_dh_kernel[(NV, N * HV)](
        **common, e=s["e"], dht=dht, dv=dv, dk_part=dk_part, db_part=db_part,
        dgt_part=dgt_part, dh0=dS0, dck=dck, ck_offsets=ck_offsets, HAS_DHT=dht is not None,
    )  # fmt: skip
    dq_part = torch.empty(NV, B, T, HV, K, **f32)
    kern.delta_recurrent_bwd_s_kernel[(NV, N * HV)](
        **common, h0=S0, dv=dv, dq_part=dq_part, dk_part=dk_part, dgt_part=dgt_part,
        dck=dck, ck_offsets=ck_offsets, dga_part=dga_part, NSLOT=len(slots),
    )  # fmt: skip

    def per_qk_head(part):  # Σ over V tiles and over each group of value heads
        return part.sum(0).view(B, T, H, HV // H, K).sum(3)

    dg = None
    if g is not None:
        ends = [None if x is None else (x * y).sum((-2, -1)) for x, y in
                ((dht, s["S_T"]), (dS0, S0))]  # fmt: skip
        anchors = None if dga_part is None else dga_part.sum(0)
        dg = decay_grad(dgt_part.sum(0), *ends, anchors, slots, offsets)
    return dict(
        q=per_qk_head(dq_part).to(q.dtype), k=per_qk_head(dk_part).to(k.dtype),
        v=dv.to(v.dtype), beta=db_part.sum(0), g=dg, S0=dS0,
    )  # fmt: skip


# ---------------------------------------------------------------------------------------------
# The decay gradient


def anchor_slots(B: int, T: int, offsets) -> tuple[list[tuple[int, int]], list[int]]:
    """The (sequence, segment) of every segment start t = segment·ANCHOR_EVERY > 0, in slot
    order (sequence by sequence, segments rising), and each sequence's first slot."""
    lens = [T] * B if offsets is None else [b - a for a, b in itertools.pairwise(offsets)]
    slots, first = [], []
    for n, L in enumerate(lens):
        first.append(len(slots))
        slots += [(n, seg) for seg in range(1, cdiv(L, ANCHOR_EVERY))]
    return slots, first


def decay_grad(c, end, start, anchors, slots, offsets):
    """∂L/∂g [B, T, HV] fp32 from the per-step terms c [B, T, HV] (the kernels' ``dgt`` summed
    over V tiles): within each segment of ANCHOR_EVERY steps of a sequence, the reverse sum of
    c in fp64 plus the next segment's exact first value (the final state's ⟨S_T, dS_T⟩ ``end``
    [N, HV] at the sequence's last step instead), and at every segment start the exact value
    itself: ``start`` ⟨S_0, dS_0⟩ [N, HV] at t = 0 (0 without an initial state), ``anchors``
    [slots, HV] at the later ones (``slots`` from :func:`anchor_slots`)."""
    B, T, HV = c.shape
    C = ANCHOR_EVERY
    sq = Seqs(offsets, B, T, HV, c.device)
    y = sq.spread(rows(c, torch.float64))  # [N·HV, Lmax]
    if end is not None:
        sq.add_at_last(y, end.reshape(-1).double())
    R, Lmax = y.shape
    NS = cdiv(Lmax, C)
    z = rev_cumsum(F.pad(y, (0, NS * C - Lmax)).view(R, NS, C))
    first = y.new_zeros(sq.N, HV, NS + 1)  # the exact value at each segment start
    if start is not None:
        first[:, :, 0] = start.double()
    if slots:
        n, seg = (to_device(x, c.device) for x in zip(*slots))
        first[n, :, seg] = anchors.double()
    first = first.view(R, NS + 1)
    z = z + first[:, 1:, None]
    z[:, :, 0] = first[:, :NS]
    return tokens(sq.gather(z.view(R, NS * C)[:, :Lmax]).float(), (B, T, HV))


# ---------------------------------------------------------------------------------------------
# Autograd


class DeltaRecurrentFunction(torch.autograd.Function):
    """:func:`forward` and :func:`backward` as an autograd Function; ``opts`` the switches."""

    @staticmethod
    def forward(ctx, q, k, v, beta, g, S0, opts: dict):
        outputs, saved = forward(q, k, v, beta, g, S0=S0, save=True, **opts)
        ctx.opts = opts
        ctx.save_for_backward(*(saved[n] for n in SAVED))
        ctx.set_materialize_grads(False)
        return outputs

    @staticmethod
    def backward(ctx, do, dS_T):
        saved = dict(zip(SAVED, ctx.saved_tensors))
        grads = backward(saved, do, dS_T, **ctx.opts)
        return (*(grads[n] for n in GRADS), None)


def recurrent(q, k, v, beta, g, *, scale, S0, offsets, out_state=None, l2norm_eps=None):
    """The delta rule's recurrent mode, differentiable w.r.t. q, k, v, beta, g and S0 when any
    of them requires grad (and grad mode is on). Shapes and dtypes as in :func:`forward`;
    beta, g and S0 are taken as fp32. Returns ``(o, S_T)``.

    ``out_state`` (decoding: the final state written into this contiguous fp32 tensor, which
    may alias S0) is for calls without gradients; with gradients it raises ValueError, since
    the backward reads S0 and an in-place final state would overwrite it. ``l2norm_eps``: q
    and k normalized in the kernel (:func:`forward`), also for calls without gradients only."""
    offsets = None if offsets is None else [int(x) for x in offsets]
    tensors = (q, k, v, beta, g, S0)
    grad = torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in tensors)
    opts = dict(scale=float(scale), offsets=offsets)
    if not grad:  # (forward() checks the inputs; a decode step checks them once)
        return forward(q, k, v, beta, g, S0=S0, out_state=out_state, l2norm_eps=l2norm_eps,
                       **opts)[0]  # fmt: skip
    check_inputs(q, k, v, beta, g, S0, offsets, out_state)
    if out_state is not None or l2norm_eps is not None:
        raise ValueError("out_state (an in-place final state) and l2norm_eps are for calls "
                         "without gradients; an input requires grad")  # fmt: skip
    beta, g, S0 = beta.float(), None if g is None else g.float(), None if S0 is None else S0.float()
    return DeltaRecurrentFunction.apply(q, k, v, beta, g, S0, opts)
