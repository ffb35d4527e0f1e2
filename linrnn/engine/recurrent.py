"""Host side of the recurrent kernels (recurrent_kernels): ``mode="recurrent"`` for every family,
the decode step, and its backward.

* :func:`forward` launches the forward kernel: ``(o, S_T, n_T, m_T)`` and, with ``save=True``,
  the tensors the backward needs (a dict, :data:`SAVED`). It is the decode step's path: one
  launch, no autograd, the final state optionally written over the initial one.
* :func:`backward` takes that dict and the output cotangents and returns the gradients of the
  inputs by name (:data:`GRADS`).
* :func:`recurrent` is the differentiable call (:class:`RecurrentFunction` over the two).

Gate gradients. With the max state m held fixed, a log decay g_t enters through the cumulative
sum F_t, +F_t beside q and −F_t beside k, so ∂L/∂F_t = q_t·dq_t − k_t·dk_t (+ ⟨dS_T, S_T⟩ +
⟨dn_T, n_T⟩ at a sequence's last step) and ∂L/∂g_u = Σ_{t≥u} ∂L/∂F_t within the sequence; a
decay over V takes o_t·do_t − v_t·dv_t; a log input gate gets k_t·dk_t. The kernels store the
per-channel products; the reverse sums run on the host in fp64 with the chunk hosts' helpers
(:mod:`linrnn.engine.gate_grads`: :func:`~linrnn.engine.gate_grads.gate_grads` for scalar
gates, which also routes mLSTM-exp's max-state gradient through the running argmax, and
:func:`~linrnn.engine.gate_grads.reverse_sum` for per-channel decays).
"""

from __future__ import annotations

import functools

import torch

from linrnn._runtime import to_device
from linrnn.engine import recurrent_kernels as kern
from linrnn.engine.config import (
    BWD_STATE_ELEMS,
    BWD_TILE_MAX,
    STEP_TILE,
    fp32_contiguous,
    per_head,
    prepare_state,
)
from linrnn.engine.gate_grads import (
    GateFlags,
    final_grads,
    gate_grads,
    reverse_sum,
    rows,
    wants_gate_grads,
)
from linrnn.engine.host_math import cdiv, next_pow2
from linrnn.engine.launch import launch
from linrnn.engine.scalar_state_kernels import norm_bwd_kernel

# What forward(save=True) keeps for backward, and the inputs backward returns gradients for.
SAVED = ("q", "k", "v", "g", "gv", "gi", "u", "S0", "n0", "m0", "o", "S_T", "n_T", "den", "m_row")
GRADS = ("q", "k", "v", "g", "gv", "gi", "u", "S0", "n0", "m0")

_NORM = {None: 0, "sum": 1, "mlstm": 2}


def norm_code(normalizer: str | None, stabilize: bool) -> int:
    """The kernels' NORM: 0 none, 1 sum, 2 mLSTM (sigmoid gate), 3 mLSTM with the max state."""
    code = _NORM[normalizer]
    return 3 if code == 2 and stabilize else code


def value_tile(
    K: int, V: int, tile: dict | None = None, plain: bool = False
) -> tuple[int, int, int]:
    """(BK, BV, num_warps) of the forward kernel for head dims K, V under ``tile``
    (:data:`STEP_TILE`; that default table's answers are cached: a decode step asks once).
    ``plain``: the walk holds the state and scalar per-step terms only (the decay, Mamba2's
    step size and skip), not per-channel gates, an input gate, the bonus, n or m (the table's
    PLAIN_WARPS)."""
    if tile is None:
        return _step_tile(K, V, plain)
    return _value_tile(K, V, tile, plain)


@functools.lru_cache(maxsize=256)
def _step_tile(K: int, V: int, plain: bool) -> tuple[int, int, int]:
    return _value_tile(K, V, STEP_TILE, plain)


def _value_tile(K: int, V: int, t: dict, plain: bool = False) -> tuple[int, int, int]:
    BK = max(16, next_pow2(K))
    BV = max(16, min(t["BV_MAX"], t["STATE_ELEMS"] // BK, next_pow2(V)))
    if BK * BV >= t["STATE_ELEMS"]:
        return BK, BV, t["FULL_WARPS"]
    return BK, BV, t["PLAIN_WARPS"] if plain and "PLAIN_WARPS" in t else t["NUM_WARPS"]


def _split_decay(g):
    """(g, gk): a scalar log decay [B, T, H] goes to the kernels' g, a per-key one to gk."""
    if g is None or g.dim() == 3:
        return g, None
    return None, g


def forward(q, k, v, *, scale, g=None, gv=None, gi=None, u=None, stabilize=False,
            track_n=False, normalizer=None, eps=0.0, S0=None, n0=None, m0=None, offsets=None,
            out_state=None, save=False, skip=None, f=None, i=None, fold_m0=None, dt=None,
            dt_bias=None, A=None):  # fmt: skip
    """The recurrence forward. q, k ``[B, T, H / G, K]``, v ``[B, T, H, V]`` (fp16/bf16/fp32;
    G > 1 groups the q/k heads: value head h reads q/k head h // G, as Mamba2's B, C); g
    ``[B, T, H]`` or ``[B, T, H, K]``, gv ``[B, T, H, V]``, gi ``[B, T, H]``, u ``[H, K]`` (all
    fp32); S0/n0/m0 the initial state (N = B, or the number of packed sequences with
    ``offsets``, a list or tensor of N + 1 token offsets, B = 1). ``out_state=(S, n, m)``: write
    the final state into these fp32 tensors (they may be the initial state itself: an in-place
    step; None entries are allocated). ``save``: also keep what :func:`backward` needs.
    ``skip`` ([H] fp32; not with ``save``, the backward has no skip term): o_t += skip[h]·v_t
    in the kernel, after the normalizer (Mamba2's D·x in a decode step). Gates the kernel forms
    from their pre-activations (not with ``save``; one launch for a decode step): ``f``
    ``[B, T, H]`` (any float dtype) instead of g, the log decay log σ(f) (mLSTM's forget gate);
    ``i`` likewise instead of gi, the log input gate log σ(i) (mLSTM's sigmoid gate); ``dt``
    ``[B, T, H]`` with ``dt_bias`` (or None) and ``A`` ``[H]`` instead of g and gi, Mamba2's
    Δ = softplus(dt + dt_bias), decay exp(Δ·A) and input weight Δ. ``fold_m0`` ``[N, H]`` (not
    with ``stabilize``; mLSTM's sigmoid form): the initial state is S0·exp(fold_m0), folded
    into each sequence's first decay, and m_T is returned (0; fold_m0 for an empty sequence).

    Returns ``((o, S_T, n_T, m_T), saved)``: n_T None without ``track_n``, m_T None without
    ``stabilize``; ``saved`` a dict over :data:`SAVED` (None without ``save``)."""
    if save and any(x is not None for x in (skip, f, i, fold_m0, dt)):
        raise NotImplementedError("the recurrent backward has no skip term or gate activations")
    B, T, _, K = q.shape
    H, V = v.shape[2], v.shape[3]
    G = H // q.shape[2]
    N = B if offsets is None else len(offsets) - 1
    dev = q.device
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    # A per-head decay broadcast over B and T (retention) is read in place: token-row stride 0.
    if g is not None and not save and g.dim() == 3 and per_head(g):
        g, s_g = g.float(), 0  # (a cast to fp32 may densify it: every row still holds the same)
    else:
        g, s_g = fp32_contiguous(g), H
    gv, gi, u = fp32_contiguous(gv), fp32_contiguous(gi), fp32_contiguous(u)
    gs, gk = _split_decay(g)
    if f is not None:
        gs = f.contiguous()
    if i is not None:
        gi = i.contiguous()
    if dt is not None:
        dt, A = dt.contiguous(), A.contiguous()
    S_T, n_T, m_T = out_state if out_state is not None else (None, None, None)
    if S_T is None:
        S_T = torch.empty(N, H, K, V, device=dev, dtype=torch.float32)
    # a plain walk (the state, a scalar decay, Mamba2's step size and skip) fits more warps
    # per program; per-channel gates, an input gate, the bonus, n or m do not
    extra = (gk, gv, gi, u, i, fold_m0)
    plain = not (stabilize or track_n) and all(x is None for x in extra)
    BK, BV, num_warps = value_tile(K, V, plain=plain)
    # n and m are read by every V tile of a head: with several tiles one tile's final n/m must
    # not land on the initial n/m another tile has yet to read, so they go to fresh buffers and
    # are copied after; with one tile the kernel writes them in place.
    direct = cdiv(V, BV) == 1
    nt = mt = None
    if track_n:
        nt = n_T if direct and n_T is not None else torch.empty(N, H, K, device=dev)
    if stabilize or fold_m0 is not None:
        mt = m_T if direct and m_T is not None else torch.empty(N, H, device=dev)
    # (an fp32 contiguous S0 stays the same tensor, so S_T may alias it)
    h0, n0, m0 = prepare_state(S0, n0, m0, track_n, stabilize)
    if fold_m0 is not None:
        m0 = fp32_contiguous(fold_m0)
    den = m_row = None
    norm = norm_code(normalizer, stabilize)
    if save:
        den = torch.empty(B * H, T, device=dev) if norm else None
        m_row = torch.empty(B * H, T, device=dev) if stabilize else None
    cu_seqlens = None
    if offsets is not None:
        cu_seqlens = to_device(offsets, dev)
    o = torch.empty_like(v, dtype=q.dtype)
    launch(
        kern.recurrent_fwd_kernel, (cdiv(V, BV), N * H),
        q=q, k=k, v=v, o=o, g=gs, gk=gk, gv=gv, gi=gi, u=u, h0=h0, n0=n0, m0=m0,
        ht=S_T, nt=nt, mt=mt, den=den, m_row=m_row, cu_seqlens=cu_seqlens,
        scale=float(scale), eps=float(eps), T=T, H=H, G=G, K=K, V=V, BK=BK, BV=BV,
        HAS_G=gs is not None, HAS_GK=gk is not None, HAS_GV=gv is not None,
        HAS_GI=gi is not None, HAS_U=u is not None, HAS_H0=h0 is not None,
        STABILIZE=stabilize, TRACK_N=track_n, NORM=norm, STORE_DEN=den is not None,
        STORE_M=m_row is not None, IS_VARLEN=cu_seqlens is not None,
        skip=None if skip is None else skip.float().contiguous(), HAS_SKIP=skip is not None,
        s_g=s_g, dt=dt, dt_bias=dt_bias, A=A, G_LOGSIG=f is not None, HAS_DT=dt is not None,
        HAS_DT_BIAS=dt_bias is not None, GI_LOGSIG=i is not None,
        M0_FOLD=fold_m0 is not None, num_warps=num_warps,
    )  # fmt: skip
    if track_n and n_T is not None and n_T is not nt:
        nt = n_T.copy_(nt)
    if mt is not None and m_T is not None and m_T is not mt:
        mt = m_T.copy_(mt)
    outputs = (o, S_T, nt, mt)
    if not save:
        return outputs, None
    saved = dict(q=q, k=k, v=v, g=g, gv=gv, gi=gi, u=u, S0=h0, n0=n0, m0=m0, o=o, S_T=S_T,
                 n_T=nt, den=den, m_row=m_row)  # fmt: skip
    return outputs, saved


def _norm_rows(do, o, den, m_row, norm: int, stabilize: bool, eps: float):
    """Per-row factors of the normalizer's backward ([B·H, T] fp32): 1/denominator, ∂L/∂den
    and (max state) ∂L/∂m_t."""
    B, T, H, V = do.shape
    r_a = torch.empty(B * H, T, device=do.device)
    r_d = torch.empty(B * H, T, device=do.device)
    r_m = torch.empty(B * H, T, device=do.device) if stabilize else None
    BT = 64
    norm_bwd_kernel[(cdiv(T, BT), B * H)](
        do=do, o=o, den=den, m_row=m_row, ra=r_a, rd=r_d, dm_row=r_m, T=T, H=H, V=V, eps=eps,
        BT=BT, BV=min(128, max(16, next_pow2(V))), NORM=norm, HAS_MAX=r_m is not None,
    )  # fmt: skip
    return r_a, r_d, r_m


def backward(saved, do, dS_T=None, dn_T=None, dm_T=None, *, scale, eps=0.0, normalizer=None,
             stabilize=False, track_n=False, offsets=None, need_gate_grads=True):  # fmt: skip
    """Gradients of a :func:`forward` call (with ``save=True``) from the cotangents of its
    outputs (``do`` may be None when only the state is used; the state's may be None each).
    The switches are the forward's. Returns a dict over :data:`GRADS`: fp32 for the gates and
    the state, the input dtype for q, k, v; None where the input was None, and for the gates
    with ``need_gate_grads=False`` (no gate wants a gradient: the kernels store no q·dq, k·dk,
    v·dv for them and the gate sums do not run; the max state forms them anyway, as the chunk
    engine does). With grouped q/k
    heads the kernels write dq, dk per value head (fp32), summed here over each group."""
    s = saved
    q, k, v, o = s["q"], s["k"], s["v"], s["o"]
    g, gv, gi, u, S0, n0, m0 = (s[n] for n in ("g", "gv", "gi", "u", "S0", "n0", "m0"))
    if u is not None and gv is not None:
        raise NotImplementedError("the recurrent backward has no exclusive form with gv")
    B, T, HK, K = q.shape
    H, V = v.shape[2], v.shape[3]
    G = H // HK
    N = B if offsets is None else len(offsets) - 1
    NH = N * H
    dev = q.device
    f32 = dict(device=dev, dtype=torch.float32)
    norm = norm_code(normalizer, stabilize)
    flags = GateFlags(N=N, has_decay=g is not None, has_igate=gi is not None,
                      stab=stabilize and g is not None, track_n=track_n, norm=norm,
                      offsets=None if offsets is None else [int(x) for x in offsets])  # fmt: skip
    do = torch.zeros_like(o) if do is None else do.contiguous()
    r_a = r_d = r_m = None
    if norm:
        r_a, r_d, r_m = _norm_rows(do, o, s["den"], s["m_row"], norm, stabilize, eps)
    has_dht, dS_T, dn_T = final_grads(dS_T, dn_T if track_n else None, v, K, V, flags)
    gs, gk = _split_decay(g)
    cu_seqlens = None if offsets is None else to_device(offsets, dev)
    args = dict(
        q=q, k=k, v=v, do=do, g=gs, gk=gk, gv=gv, gi=gi, u=u, m0=m0, m_row=s["m_row"], r_a=r_a,
        r_d=r_d, cu_seqlens=cu_seqlens, scale=float(scale), T=T, H=H, G=G, K=K, V=V,
        HAS_G=gs is not None, HAS_GK=gk is not None, HAS_GV=gv is not None,
        HAS_GI=gi is not None, HAS_U=u is not None, HAS_H0=S0 is not None,
        STABILIZE=stabilize, TRACK_N=track_n, NORM=norm, IS_VARLEN=cu_seqlens is not None,
    )  # fmt: skip
    KP, VP = max(16, next_pow2(K)), max(16, next_pow2(V))
    BK = max(16, min(BWD_TILE_MAX, BWD_STATE_ELEMS // VP, KP))
    BV = max(16, min(BWD_TILE_MAX, BWD_STATE_ELEMS // KP, VP))
    has_gates = g is not None or gi is not None
    want = wants_gate_grads(need_gate_grads, stabilize)

    dq = torch.empty(B, T, H, K, **f32)
    qdq = torch.zeros(B, T, H, K, **f32) if g is not None and want else None
    kern.recurrent_bwd_kernel_dq[(cdiv(K, BK), NH)](
        **args, h0=S0, n0=n0, dq=dq, qdq=qdq, BK=BK, BV=VP, STORE_QDQ=qdq is not None
    )
    dk = torch.empty(B, T, H, K, **f32)
    kdk = torch.zeros(B, T, H, K, **f32) if has_gates and want else None
    du = torch.empty(NH, K, **f32) if u is not None else None
    dS0 = torch.empty(N, H, K, V, **f32)
    dn0 = torch.empty(N, H, K, **f32) if track_n else None
    kern.recurrent_bwd_kernel_dk[(cdiv(K, BK), NH)](
        **args, dht=dS_T, dnt=dn_T, dk=dk, kdk=kdk, du=du, dh0=dS0, dn0=dn0, BK=BK, BV=VP,
        HAS_DHT=has_dht, STORE_KDK=kdk is not None,
    )  # fmt: skip
    dv = torch.empty(B, T, H, V, **f32)
    vdv = torch.empty(B, T, H, V, **f32) if gv is not None and want else None
    kern.recurrent_bwd_kernel_dv[(cdiv(V, BV), NH)](
        **args, dht=dS_T, dnt=dn_T, dv=dv, vdv=vdv, BK=KP, BV=BV, HAS_DHT=has_dht,
        STORE_VDV=vdv is not None,
    )  # fmt: skip

    dm0 = None
    if S0 is not None and stabilize:
        dm0 = (dS0 * S0).sum((-2, -1)) + (dn0 * n0).sum(-1)
    dg = dgv = dgi = None
    if want:
        dg, dgv, dgi, dm0 = _gate_grads(s, do, qdq, kdk, vdv, r_m, dS_T, dn_T, dm_T, dm0, flags)
    if G > 1:
        dq, dk = dq.view(B, T, HK, G, K).sum(3), dk.view(B, T, HK, G, K).sum(3)
    return dict(
        q=dq.to(q.dtype), k=dk.to(k.dtype), v=dv.to(v.dtype), g=dg, gv=dgv, gi=dgi,
        u=du.view(N, H, K).sum(0) if u is not None else None,
        S0=dS0 if S0 is not None else None, n0=dn0 if S0 is not None else None, m0=dm0,
    )  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Gate gradients (token layout [B, T, H(, D)]; packed sequences: B = 1, sequences along T)


def _head_rows(x):
    """Σ over K of a per-channel product [B, T, H, K], as [B·H, T] fp64 rows."""
    return rows(x.sum(-1, dtype=torch.float64), torch.float64)


def _gate_grads(s, do, qdq, kdk, vdv, r_m, dS_T, dn_T, dm_T, dm0, flags: GateFlags):
    """(dg, dgv, dgi, dm0) from the kernels' per-channel products (module docstring)."""
    g, gv, gi, S_T, n_T = s["g"], s["gv"], s["gi"], s["S_T"], s["n_T"]
    dg = dgv = dgi = None
    if g is not None and g.dim() == 4:  # a decay per key channel (no max state)
        end = None  # ⟨dS_T, S_T⟩ + ⟨dn_T, n_T⟩ per key channel: the final state's own term
        if dS_T is not None:
            end = (dS_T * S_T).sum(-1)
            if flags.track_n:
                end = end + dn_T * n_T
        dg = reverse_sum(qdq.double() - kdk, end, flags.offsets)
        dgi = kdk.sum(-1) if gi is not None else None
    elif g is not None or gi is not None:  # scalar gates: the chunk hosts' helper, per head
        q_dq = _head_rows(qdq) if g is not None else None
        dg, dgi, dm0 = gate_grads(g, gi, do.shape[:3], q_dq, _head_rows(kdk), r_m, S_T, n_T,
                                  dS_T, dn_T, dm_T, s["m0"], dm0, flags)  # fmt: skip
    if gv is not None:
        end = None if dS_T is None else (dS_T * S_T).sum(-2)
        dgv = reverse_sum(s["o"].double() * do - vdv, end, flags.offsets)
    return dg, dgv, dgi, dm0


# ---------------------------------------------------------------------------------------------
# Autograd


class RecurrentFunction(torch.autograd.Function):
    """:func:`forward` and :func:`backward` as an autograd Function; ``opts`` the switches."""

    @staticmethod
    def forward(ctx, q, k, v, g, gv, gi, u, S0, n0, m0, opts: dict):
        outputs, saved = forward(q, k, v, g=g, gv=gv, gi=gi, u=u, S0=S0, n0=n0, m0=m0,
                                 save=True, **opts)  # fmt: skip
        ctx.opts = opts
        ctx.save_for_backward(*(saved[n] for n in SAVED))
        ctx.set_materialize_grads(False)
        return outputs

    @staticmethod
    def backward(ctx, do, dS_T, dn_T, dm_T):
        saved = dict(zip(SAVED, ctx.saved_tensors))
        need = any(ctx.needs_input_grad[3:6])  # g, gv, gi
        grads = backward(saved, do, dS_T, dn_T, dm_T, need_gate_grads=need, **ctx.opts)
        return (*(grads[n] for n in GRADS), None)


def recurrent(q, k, v, *, scale, g=None, gv=None, gi=None, u=None, stabilize=False,
              track_n=False, normalizer=None, eps=0.0, S0=None, n0=None, m0=None,
              offsets=None):  # fmt: skip
    """The differentiable recurrence: :func:`forward`'s arguments (no ``out_state``; gates
    fp32). Returns ``(o, S_T, n_T, m_T)``."""
    if u is not None and gv is not None:
        raise NotImplementedError("the recurrent backward has no exclusive form with gv")
    offsets = None if offsets is None else [int(x) for x in offsets]
    opts = dict(scale=float(scale), eps=float(eps), normalizer=normalizer, stabilize=stabilize,
                track_n=track_n, offsets=offsets)  # fmt: skip
    S0, n0, m0 = prepare_state(S0, n0, m0, track_n, stabilize)
    g, gv, gi, u = map(fp32_contiguous, (g, gv, gi, u))
    return RecurrentFunction.apply(q, k, v, g, gv, gi, u, S0, n0, m0, opts)
