"""Host of the Triton chunk engine for scalar gates (modes "chunk" and "fused_chunk"): the
kernel launches of one call and its backward, as plain functions over named tensors, and the
autograd Function over them.

    (o, S_T, n_T, m_T), saved = forward(q, k, v, g, gi, S0, n0, m0, cfg, skip=None)
    dq, dk, dv, dg, dgi, dS0, dn0, dm0 = backward(saved, cfg, do, dS_T, dn_T, dm_T)

``saved`` is a dict of the tensors the backward reads (:data:`SAVED`; None where the call does
not use one, see :func:`kept`). The gate gradients: in chunk mode one kernel
(:func:`chunk_gate_grads`, also the delta rule's), in fused_chunk the shared PyTorch sums of
:mod:`linrnn.engine.gate_grads`. The custom ops of :mod:`linrnn.engine.custom_ops` call the same
two functions.

``skip`` ([H] fp32, mode "chunk" only; eager calls): a per-head skip term added to the output,
o_t += skip[h]·v_t (Mamba2's D·x), inside the output kernel; its gradients (skip[h]·do into dv,
Σ do·v for skip) come from the dv kernel (:func:`backward_skip`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from linrnn.engine import fix_pass
from linrnn.engine import fused_kernels as fused
from linrnn.engine import group_kernels as group
from linrnn.engine import group_scores_kernels as gsk
from linrnn.engine import scalar_cumsum_kernels as ck
from linrnn.engine import scalar_gate_grad_kernels as ggk
from linrnn.engine import scalar_kernels as kern
from linrnn.engine import scalar_state_kernels as walk
from linrnn.engine.config import (
    GATE_GRAD_TILES,
    GROUP_SCORE_TILES,
    GROUP_TILES,
    ChunkConfig,
    chunk_state_dtype,
    per_head,
    prepare_state,
)
from linrnn.engine.gate_grads import (
    final_grads,
    final_term,
    gate_grads,
    max_tail,
    rows,
    tokens,
    wants_gate_grads,
)
from linrnn.engine.host_math import cdiv, next_pow2

# What forward() saves for backward(): the inputs (contiguous; initial states fp32), the outputs,
# the gate rows (b: chunk-local cumulative log decay, a: log input gate) and the kernels' tables
# (chunk states in the inputs' dtype: :func:`linrnn.engine.config.chunk_state_dtype`).
INPUTS = ("q", "k", "v", "g", "gi", "S0", "n0", "m0")
OUTPUTS = ("o", "S_T", "n_T")
PRODUCED = ("b", "a", "states", "ns", "mc", "den", "m_row")
SAVED = INPUTS + OUTPUTS + PRODUCED


def kept(cfg: ChunkConfig) -> dict[str, bool]:
    """Which of :data:`OUTPUTS` + :data:`PRODUCED` (and m_T) a call with ``cfg`` makes."""
    return dict(
        o=True, S_T=True, n_T=cfg.track_n, m_T=cfg.stab, b=cfg.has_decay, a=cfg.has_igate,
        states=not cfg.fused, ns=cfg.track_n and not cfg.fused, mc=cfg.stab,
        den=cfg.norm != 0, m_row=cfg.stab,
    )  # fmt: skip


def gate_rows(g, gi, cfg: ChunkConfig):
    """(b, a, rmax): the chunk-local cumulative log decay and the log input gate as [B·H, T]
    fp32 rows (None without that gate), and for the output kernel of a call with the max state
    (mode chunk) the running maximum of a − b within each chunk (else None)."""
    a = rows(gi) if cfg.has_igate else None
    if not cfg.has_decay:
        return None, a, None
    b, rmax = _chunk_cumsum(g, cfg.L, cfg, a if cfg.stab and not cfg.fused else None)
    return b, a, rmax


def head_decay(g, cfg: ChunkConfig):
    """The per-head log decay [H] (fp32) of a call whose decay is one value per head for every
    token (retention's, broadcast; :func:`linrnn.engine.config.per_head`), for the kernels'
    ``PER_HEAD`` form, which forms the chunk-local cumulative decays (s − c0 + 1)·g from it
    instead of loading their rows; None otherwise (and for the max state and input gates,
    which keep the rows)."""
    if g is None or cfg.stab or cfg.has_igate or not per_head(g):
        return None
    return g[0, 0].float().contiguous()


def forward(q, k, v, g, gi, S0, n0, m0, cfg: ChunkConfig, skip=None):
    """One chunk-engine forward: ``((o, S_T, n_T, m_T), saved)``. q, k, v ``[B, T, H, *]``
    (fp16/bf16/fp32), g, gi ``[B, T, H]`` fp32 or None, the initial state as
    :func:`prepare_state` makes it (or None); ``skip`` [H] fp32 or None (module docstring)."""
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    b, a, rmax = gate_rows(g, gi, cfg)
    lg = head_decay(g, cfg)
    if cfg.fused:
        if skip is not None:
            raise NotImplementedError("the skip term has no fused_chunk kernel")
        o, S_T, n_T, m_T, tables = _forward_fused(q, k, v, b, a, S0, n0, m0, cfg, lg)
    else:
        o, S_T, n_T, m_T, tables = _forward(q, k, v, b, a, S0, n0, m0, cfg, skip, rmax, lg)
    saved = dict(q=q, k=k, v=v, g=g, gi=gi, S0=S0, n0=n0, m0=m0, o=o, S_T=S_T, n_T=n_T, b=b, a=a)
    if skip is not None:
        saved["skip"] = skip
    has = kept(cfg)
    saved.update({name: tables.get(name) if has[name] else None for name in PRODUCED[2:]})
    return (o, S_T, n_T, m_T), saved


def backward(saved: dict, cfg: ChunkConfig, do, dS_T, dn_T, dm_T, need_gate_grads: bool = True):
    """The gradients ``(dq, dk, dv, dg, dgi, dS0, dn0, dm0)`` of one chunk-engine call from
    what :func:`forward` saved and the outputs' cotangents (any of dS_T, dn_T, dm_T may be
    None; None where an input was None). ``need_gate_grads=False``: the gates want no gradient
    (retention's fixed decay, frozen gates): dg and dgi are None, and the work that only they
    need is left out (gate_grads.wants_gate_grads; the group path, :func:`group_path`, still
    forms its parts, unread)."""
    return backward_skip(saved, cfg, do, dS_T, dn_T, dm_T, need_gate_grads)[:8]


def backward_skip(saved: dict, cfg: ChunkConfig, do, dS_T, dn_T, dm_T,
                  need_gate_grads: bool = True):  # fmt: skip
    """:func:`backward`'s gradients, then the skip term's (None without one)."""
    s = saved
    do = do.contiguous()
    want = wants_gate_grads(need_gate_grads, cfg.stab)
    if cfg.fused:
        grads = (*_backward_fused(s, do, dS_T, dn_T, cfg, want), None)
    else:
        grads = _backward(s, do, dS_T, dn_T, cfg, want)
    dq, dk, dv, dS0, dn0, q_dq, k_dk, R_M, dS_T, dn_T, bnd, dskip = grads
    S0, n0, m0, g, gi = s["S0"], s["n0"], s["m0"], s["g"], s["gi"]
    dm0 = None
    if S0 is not None and cfg.stab:
        dm0 = (dS0 * S0).sum((-2, -1)) + (dn0 * n0).sum(-1)
    dg = dgi = None
    shape = g.shape if g is not None else gi.shape if gi is not None else None
    shape = shape if want else None  # (None: no gate gradients)
    if cfg.fused and shape is not None:  # no chunk boundary values: whole-sequence sums
        dg, dgi, dm0 = gate_grads(g, gi, shape, q_dq, k_dk, R_M, s["S_T"], s["n_T"], dS_T, dn_T,
                                  dm_T, m0, dm0, cfg)  # fmt: skip
    elif shape is not None:
        tail = None
        if cfg.stab:
            end = final_term(dS_T, dn_T, s["S_T"], s["n_T"], cfg)
            tail = max_tail(dm_T, end, (cfg.N, shape[2]), do.device)
        dg, dgi, dm0 = chunk_gate_grads(s["b"], s["a"], s["mc"], q_dq, k_dk, R_M, bnd, tail, m0,
                                        dm0, cfg, shape)  # fmt: skip
    if S0 is None:
        dS0 = dn0 = None
    return dq, dk, dv, dg, dgi, dS0, dn0, dm0, dskip


def chunk_gate_grads(b, a, mc, q_dq, k_dk, R_M, bnd, tail, m0, dm0, c, shape):
    """Chunk mode's ∂L/∂g and ∂L/∂gi ([B, T, H] fp32, None for a gate the call lacks) and
    ∂L/∂m_0 (dm0 plus the part routed to it), in one kernel (scalar_gate_grad_kernels).

    Rows ``[B·H, T]`` fp32: b, a (the chunk-local cumulative log decay and the log input gate,
    as the forward kept them), q_dq, k_dk (None without the gate they serve), R_M (∂L/∂m_t, or
    None); bnd ``[B·H, NT]``: ⟨dC, C⟩ + ⟨dn, n⟩ of the state leaving each chunk, the reverse sum
    of q·dq − k·dk from the chunk's end on (final-state term included), so the long sum
    restarts at every chunk; mc, tail (:func:`max_tail`) and m0: the max state's, with
    ``c.stab``. ``c``: the call's ChunkConfig."""
    if not c.has_decay and not c.stab:
        return None, tokens(k_dk, shape) if c.has_igate else None, dm0
    if c.stab and not c.has_igate:
        raise ValueError("the max state needs an input gate")
    B, T, H = shape
    f32 = dict(device=k_dk.device, dtype=torch.float32)
    dg = torch.empty(B * H, T, **f32) if c.has_decay else None
    da = torch.empty(B * H, T, **f32) if c.stab else None
    route = torch.empty(c.N * H, **f32) if c.stab and m0 is not None else None
    size, num_warps = GATE_GRAD_TILES["scalar"]
    LP = max(16, next_pow2(c.L))
    NC = max(2, min(next_pow2(c.longest), size // LP))
    spans = 1 if c.stab else cdiv(c.longest, NC)
    ggk.gate_grad_kernel[(spans, c.walkers)](
        QD=q_dq, KD=k_dk, BND=bnd, G=b, GI=a, MC=mc, DM=R_M, TAIL=tail, DG=dg, DA=da, DM0=route,
        CO=c.CO, CHUNKS=c.CHUNKS, T=T, H=H, L=c.L, NT=c.NT, NSEQ=c.NSEQ, NC=NC, LP=LP,
        HAS_DECAY=c.has_decay, HAS_MAX=c.stab, HAS_DM=R_M is not None, HAS_TAIL=tail is not None,
        HAS_M0=route is not None, VARLEN=c.varlen, num_warps=num_warps,
    )  # fmt: skip
    if route is not None:
        dm0 = dm0 + route.view(c.N, H)
    if c.has_igate:
        da = tokens(da if da is not None else k_dk, shape)
    return (tokens(dg, shape) if dg is not None else None), da, dm0


def _chunk_cumsum(g: torch.Tensor, L: int, c: ChunkConfig, a=None):
    """Chunk-local cumulative sum of the log decays g ``[B, T, H]``: ``[B·H, T]`` fp32 rows,
    one kernel (scalar_cumsum_kernels). Packed sequences: each chunk of the table summed alone,
    as without packing (not as differences of one sum over the pack: a non-finite gate in one
    sequence would make every later sequence's sums NaN). With ``a`` (the log input gate rows)
    the same kernel also gives the running maximum of a − b within each chunk. Returns (b,
    running maximum or None)."""
    B, T, H = g.shape
    out = torch.empty(B * H, T, device=g.device, dtype=torch.float32)
    rmax = torch.empty_like(out) if a is not None else None
    if out.numel() == 0:
        return out, rmax
    BL = min(max(16, next_pow2(L)), 256)
    CH = max(1, min(1024 // BL, next_pow2(c.NT)))
    ck.chunk_cumsum_kernel[(cdiv(c.NT, CH), B * H)](
        G=g, OUT=out, CHUNKS=c.CHUNKS, T=T, H=H, L=L, NT=c.NT, s_b=g.stride(0), s_t=g.stride(1),
        s_h=g.stride(2), CH=CH, BL=BL, VARLEN=c.varlen, A=a, RMAX=rmax, HAS_RMAX=a is not None,
        num_warps=4,
    )  # fmt: skip
    return out, rmax


def _chunk_max(b, a, L, c: ChunkConfig | None = None):
    """Per chunk, max over its steps of (a_s − b_s): [B·H, NT] (mLSTM-exp's max state)."""
    BH, T = b.shape
    if c is not None and c.varlen:
        out = torch.full((BH, c.NT), -torch.inf, device=b.device)
        idx = c.tok_chunk.expand(BH, T)
        return out.scatter_reduce_(1, idx, a - b, "amax", include_self=True)
    NT = cdiv(T, L)
    z = F.pad(a - b, (0, NT * L - T), value=-torch.inf)
    return z.view(BH, NT, L).amax(-1).contiguous()


def _forward(q, k, v, b, a, S0, n0, m0, c: ChunkConfig, skip=None, rmax=None, lg=None):
    """The chunk states (states_fwd_kernel), then the outputs (out_fwd_kernel; ``rmax``: the
    running maxima :func:`gate_rows` gives with the max state)."""
    T, K = q.shape[1], q.shape[3]
    H, V = v.shape[2], v.shape[3]
    G = H // q.shape[2]
    BH, NT, L, N = c.rows, c.NT, c.L, c.N
    f32 = dict(device=q.device, dtype=torch.float32)
    states = torch.empty(BH, NT, K, V, device=q.device, dtype=chunk_state_dtype(q.dtype))
    ns = torch.empty(BH, NT, K, **f32) if c.track_n else None
    mc = torch.empty(BH, NT + c.NSEQ, **f32) if c.stab else None
    S_T = torch.empty(N, H, K, V, **f32)
    n_T = torch.empty(N, H, K, **f32) if c.track_n else None
    gates = dict(HAS_DECAY=b is not None, HAS_IGATE=a is not None, HAS_MAX=mc is not None,
                 DOT_PREC=c.prec, VARLEN=c.varlen)  # fmt: skip
    BS, BK, BV, launch = c.tiles("states_fwd", K, V)
    walk.states_fwd_kernel[(cdiv(K, BK), cdiv(V, BV), c.walkers)](
        k=k, v=v, g=b if lg is None else lg, gi=a, PER_HEAD=lg is not None,
        cmax=_chunk_max(b, a, L, c) if c.stab else None,
        h0=S0, n0=n0, m0=m0, h=states, hn=ns, mc=mc, ht=S_T, nt=n_T, co=c.CO, chunks=c.CHUNKS,
        T=T, H=H, G=G, K=K, V=V, L=L, NT=NT, NSEQ=c.NSEQ, BK=BK, BV=BV, BS=BS,
        HAS_N=ns is not None, HAS_H0=S0 is not None, ONE_TILE=one_tile(L, BS), **gates, **launch,
    )  # fmt: skip
    o = torch.empty_like(v, dtype=q.dtype)
    den = torch.empty(BH, T, **f32) if c.norm else None
    m_row = torch.empty(BH, T, **f32) if c.stab else None
    BQ, BD, BO, launch = c.tiles("out_fwd", K, V)
    NQ = cdiv(L, BQ)
    fix_pass.launch(
        kern.out_fwd_kernel, (NT * NQ, cdiv(V, BO), BH), q.device,
        q=q, k=k, v=v, h=states, hn=ns, mc=mc, g=b if lg is None else lg, gi=a,
        PER_HEAD=lg is not None, rmax=rmax, o=o, den=den, m_row=m_row,
        chunks=c.CHUNKS, T=T, H=H, G=G, K=K, V=V, L=L, NT=NT, NQ=NQ, NSEQ=c.NSEQ,
        scale=c.scale, eps=c.eps, BQ=BQ, BD=BD, BO=BO, NORM=c.norm, skip=skip,
        HAS_SKIP=skip is not None, ONE_TILE=one_tile(L, BQ), **gates, **launch,
    )  # fmt: skip
    m_T = c.m_final(mc) if c.stab else None
    tables = dict(states=states, ns=ns, mc=mc, den=den, m_row=m_row)
    return o, S_T, n_T, m_T, tables


def _forward_fused(q, k, v, b, a, S0, n0, m0, c: ChunkConfig, lg=None):
    """fused_chunk's forward (fused_fwd_kernel): the outputs and final state in one walk, with
    the O(T) tables the backward reads (mc, den, m_row). ``lg``: the per-head log decay
    (:func:`head_decay`), in place of b's rows."""
    T, K = q.shape[1], q.shape[3]
    H, V = v.shape[2], v.shape[3]
    G = H // q.shape[2]
    BH, NT, N = c.rows, c.NT, c.N
    f32 = dict(device=q.device, dtype=torch.float32)
    mc = torch.empty(BH, NT + c.NSEQ, **f32) if c.stab else None
    S_T = torch.empty(N, H, K, V, **f32)
    n_T = torch.empty(N, H, K, **f32) if c.track_n else None
    o = torch.empty_like(v, dtype=q.dtype)
    den = torch.empty(BH, T, **f32) if c.norm else None
    m_row = torch.empty(BH, T, **f32) if c.stab else None
    cmax = _chunk_max(b, a, c.L, c) if c.stab else None
    fused.fused_fwd_kernel[(cdiv(V, c.BVf), c.walkers)](
        q=q, k=k, v=v, o=o, h0=S0, ht=S_T, co=c.CO, chunks=c.CHUNKS, T=T, H=H, G=G, K=K, V=V,
        L=c.L, NT=NT, NSEQ=c.NSEQ, scale=c.scale, BT=c.BT, BK=c.KP, BV=c.BVf, HAS_H0=S0 is not None,
        DOT_PREC=c.prec, VARLEN=c.varlen, g=b if lg is None else lg, gi=a, cmax=cmax, n0=n0,
        m0=m0, nt=n_T, mc=mc, m_row=m_row, den=den, eps=c.eps, HAS_DECAY=b is not None,
        HAS_IGATE=a is not None, HAS_MAX=mc is not None, HAS_N=n_T is not None, NORM=c.norm,
        PER_HEAD=lg is not None, **c.fused_launch("fused_fwd"),
    )  # fmt: skip
    m_T = c.m_final(mc) if c.stab else None
    return o, S_T, n_T, m_T, dict(mc=mc, den=den, m_row=m_row)


def _backward_fused(s: dict, do, dS_T, dn_T, c: ChunkConfig, want: bool):
    """fused_chunk's backward: dq, dk (with dS0, dn0) and dv, one walk each. With grouped
    heads (G > 1) dq and dk are formed per value head in fp32 and summed per group. ``want``:
    also the gates' parts q·dq, k·dk (gate_grads.wants_gate_grads)."""
    q, k, v, b, a = s["q"], s["k"], s["v"], s["b"], s["a"]
    S0, n0, mc, m_row = s["S0"], s["n0"], s["mc"], s["m_row"]
    T, K = q.shape[1], q.shape[3]
    H, V = v.shape[2], v.shape[3]
    G = H // q.shape[2]
    BH, NT, L, N = c.rows, c.NT, c.L, c.N
    f32 = dict(device=q.device, dtype=torch.float32)
    R_A, R_D, R_M = _norm_rows(do, s["o"], s["den"], m_row, c)
    has_dst, dS_T, dn_T = final_grads(dS_T, dn_T, v, K, V, c)
    nK = cdiv(K, c.BKf)
    q_part = torch.empty(nK, BH, T, **f32) if c.has_decay and want else None
    k_part = torch.empty(nK, BH, T, **f32) if (c.has_decay or c.has_igate) and want else None
    sizes = dict(co=c.CO, chunks=c.CHUNKS, T=T, H=H, G=G, K=K, V=V, L=L, NT=NT, NSEQ=c.NSEQ,
                 scale=c.scale, BT=c.BT, DOT_PREC=c.prec, VARLEN=c.varlen)  # fmt: skip
    lg = head_decay(s["g"], c)
    gates = dict(g=b if lg is None else lg, gi=a, mc=mc, m_row=m_row, ra=R_A,
                 HAS_DECAY=b is not None, HAS_IGATE=a is not None, HAS_MAX=mc is not None,
                 HAS_NORM=R_A is not None, PER_HEAD=lg is not None)  # fmt: skip
    # The log-decay gradient is a whole-sequence sum here: keep the states' products exact.
    split = q_part is not None and q.dtype != torch.float32
    per_head = (*v.shape[:3], K)  # dq, dk per value head (fp32, for the group sums)
    dq = torch.empty(per_head, **f32) if G > 1 else torch.empty_like(q)
    fused.fused_dq_kernel[(nK, c.walkers)](
        q=q, k=k, v=v, do=do, dq=dq, h0=S0, qdq=q_part, BK=c.BKf, BV=c.VP, HAS_H0=S0 is not None,
        SPLIT=split, n0=n0, rd=R_D, HAS_N=c.track_n, STORE_QDQ=q_part is not None, **sizes,
        **gates, **c.fused_launch("fused_dq"),
    )  # fmt: skip
    dk = torch.empty(per_head, **f32) if G > 1 else torch.empty_like(k)
    dS0 = torch.empty(N, H, K, V, **f32)
    dn0 = torch.empty(N, H, K, **f32) if c.track_n else None
    fused.fused_dk_kernel[(nK, c.walkers)](
        q=q, k=k, v=v, do=do, dk=dk, dh0=dS0, dht=dS_T if has_dst else None, kdk=k_part,
        BK=c.BKf, BV=c.VP, HAS_DHT=has_dst, SPLIT=split, dn0=dn0,
        dnt=dn_T if has_dst else None, rd=R_D, HAS_N=dn0 is not None,
        STORE_KDK=k_part is not None, **sizes, **gates, **c.fused_launch("fused_dk"),
    )  # fmt: skip
    dv = torch.empty_like(v)
    fused.fused_dv_kernel[(cdiv(V, c.BVf), c.walkers)](
        q=q, k=k, do=do, dv=dv, dht=dS_T if has_dst else None, BK=c.KP, BV=c.BVf,
        HAS_DHT=has_dst, **sizes, **gates, **c.fused_launch("fused_dv"),
    )  # fmt: skip
    if G > 1:
        dq = dq.view(*q.shape[:3], G, K).sum(3).to(q.dtype)
        dk = dk.view(*k.shape[:3], G, K).sum(3).to(k.dtype)
    k_dk = k_part.sum(0) if k_part is not None else None
    q_dq = q_part.sum(0) if q_part is not None else None
    return dq, dk, dv, dS0, dn0, q_dq, k_dk, R_M, dS_T, dn_T, None


def _norm_rows(do, o, den, m_row, c: ChunkConfig):
    """Per-row factors of the normalizer's backward: 1/denominator, ∂L/∂den, ∂L/∂m_r (None
    where the call has no normalizer, ∂L/∂m_r also without the max state)."""
    if not c.norm:
        return None, None, None
    B, T, H, V = do.shape
    f32 = dict(device=do.device, dtype=torch.float32)
    R_A, R_D = torch.empty(B * H, T, **f32), torch.empty(B * H, T, **f32)
    R_M = torch.empty(B * H, T, **f32) if c.stab else None
    BT = 64
    walk.norm_bwd_kernel[(cdiv(T, BT), B * H)](
        do=do, o=o, den=den, m_row=m_row, ra=R_A, rd=R_D, dm_row=R_M, T=T, H=H, V=V, eps=c.eps,
        BT=BT, BV=min(128, max(16, next_pow2(V))), NORM=c.norm, HAS_MAX=R_M is not None,
    )  # fmt: skip
    return R_A, R_D, R_M


def _backward(s: dict, do, dS_T, dn_T, c: ChunkConfig, want: bool):
    """The state gradients (states_bwd_kernel), then dq, dk and dv (one kernel each). With
    grouped heads (G > 1) the dq and dk kernels sum a group's value heads themselves
    (:func:`heads_per_program`), large groups through one intra-chunk gradient matrix per
    group and chunk (:func:`group_path`). ``want``: also what the gate gradients read (q·dq,
    k·dk, the chunk-end terms bnd; gate_grads.wants_gate_grads)."""
    q, k, v, b, a = s["q"], s["k"], s["v"], s["b"], s["a"]
    states, ns, mc, m_row = s["states"], s["ns"], s["mc"], s["m_row"]
    T, K = q.shape[1], q.shape[3]
    H, V = v.shape[2], v.shape[3]
    G = H // q.shape[2]
    BH, NT, L, N = c.rows, c.NT, c.L, c.N
    f32 = dict(device=q.device, dtype=torch.float32)
    R_A, R_D, R_M = _norm_rows(do, s["o"], s["den"], m_row, c)
    has_dst, dS_T, dn_T = final_grads(dS_T, dn_T, v, K, V, c)
    dstates = torch.empty(BH, NT, K, V, device=q.device, dtype=chunk_state_dtype(q.dtype))
    dns = torch.empty(BH, NT, K, **f32) if c.track_n else None
    dS0 = torch.empty(N, H, K, V, **f32)
    dn0 = torch.empty(N, H, K, **f32) if c.track_n else None
    lg = head_decay(s["g"], c)
    gd = b if lg is None else lg  # the kernels' decay operand: the rows, or the head's value
    flags = dict(HAS_DECAY=b is not None, HAS_MAX=mc is not None, HAS_NORM=R_A is not None,
                 DOT_PREC=c.prec, VARLEN=c.varlen, PER_HEAD=lg is not None)  # fmt: skip
    sums = c.track_n or (c.has_decay and want)  # dn or the decay gradient's chunk-end sums
    BQ, BK, BV, launch = c.tiles("states_bwd_sums" if sums else "states_bwd", K, V)
    grid = (cdiv(K, BK), cdiv(V, BV), c.walkers)
    bnd = torch.zeros(BH, NT, grid[0] * grid[1], **f32) if c.has_decay and want else None
    walk.states_bwd_kernel[grid](
        q=q, do=do, g=gd, mc=mc, m_row=m_row, ra=R_A, rd=R_D, h=states, hn=ns, ht=s["S_T"],
        nt=s["n_T"], dht=dS_T if has_dst else None, dnt=dn_T if has_dst else None, dh=dstates,
        dhn=dns, dh0=dS0, dn0=dn0, bnd=bnd, co=c.CO, chunks=c.CHUNKS,
        T=T, H=H, G=G, K=K, V=V, L=L, NT=NT, NSEQ=c.NSEQ, scale=c.scale, BK=BK, BV=BV, BQ=BQ,
        HAS_N=ns is not None, HAS_DHT=has_dst, HAS_BND=bnd is not None,
        ONE_TILE=one_tile(L, BQ) and not sums, **flags, **launch,
    )  # fmt: skip

    flags.update(HAS_IGATE=a is not None)
    if group_path(G, c):
        dq, dk, q_dq, k_dk = _group_dq_dk(q, k, v, do, b, a, states, dstates, G, c)
    else:
        dq, dk, q_dq, k_dk = _dq_dk(q, k, v, do, gd, a, states, ns, dstates, dns, mc, m_row,
                                    R_A, R_D, G, flags, c, want)  # fmt: skip
    skip = s.get("skip")  # (absent where the custom ops rebuild the saved tensors)
    if _group_dv_heads(c, G, K, V) > 1:
        dv, dskip = _group_dv(q, k, v, b, a, do, dstates, c, skip)
    else:
        BS, BD, BO, launch = c.tiles("dv_bwd", K, V)
        nS, nV = cdiv(L, BS), cdiv(V, BO)
        dv = torch.empty_like(v)
        dskip = torch.zeros(BH, NT * nS * nV, **f32) if skip is not None else None
        kern.dv_bwd_kernel[(NT * nS, nV, BH)](
            k=k, q=q, do=do, dh=dstates, mc=mc, g=gd, gi=a, m_row=m_row, ra=R_A, dv=dv,
            chunks=c.CHUNKS, T=T, H=H, G=G, K=K, V=V, L=L, NT=NT, NS=nS, NSEQ=c.NSEQ,
            scale=c.scale, BS=BS, BD=BD, BO=BO, v=v if skip is not None else None, skip=skip,
            dskip=dskip, HAS_SKIP=skip is not None, ONE_TILE=one_tile(L, BS), **flags, **launch,
        )  # fmt: skip
    if dskip is not None:  # Σ over the batch rows and tiles of each head
        dskip = dskip.view(-1, H, dskip.shape[1]).double().sum((0, 2)).float()
    bnd = bnd.sum(-1) if bnd is not None else None
    return dq, dk, dv, dS0, dn0, q_dq, k_dk, R_M, dS_T, dn_T, bnd, dskip


def one_tile(L: int, BT: int) -> bool:
    """Whether a chunk of L steps is one time tile of BT: the kernels' single-tile path (the
    diagonal tile alone; dq and dk by one kernel, dqk_bwd_kernel)."""
    return L <= BT


def _dq_dk(q, k, v, do, b, a, states, ns, dstates, dns, mc, m_row, R_A, R_D, G, flags, c,
           want: bool):  # fmt: skip
    """dq, dk (a group's value heads summed in the kernels, :func:`heads_per_program`) and the
    identity products q·dq, k·dk per value head ``[B·H, T]`` (None without their gate, or
    without ``want``: gate_grads.wants_gate_grads). A chunk of one time tile takes one kernel
    for both (dqk_bwd_kernel: the weighted intra-chunk matrix formed once), where a program
    serves one value head."""
    T, K = q.shape[1], q.shape[3]
    H, V = v.shape[2], v.shape[3]
    BH, NT, L = c.rows, c.NT, c.L
    f32 = dict(device=q.device, dtype=torch.float32)
    wants_q, wants_k = c.has_decay and want, (c.has_decay or c.has_igate) and want
    BQ, BD, BO, launch = c.tiles("dq_bwd", V, K)
    nQ, nK = cdiv(L, BQ), cdiv(K, BO)
    HPP = heads_per_program(G, NT * nQ * nK * (BH // G))
    single = c.tiles("dqk_bwd", V, K)
    if one_tile(L, single[0]) and HPP == 1:
        BQ, BD, BO, launch = single
        nK = cdiv(K, BO)
        q_part = torch.empty(nK, BH, T, **f32) if wants_q else None
        k_part = torch.empty(nK, BH, T, **f32) if wants_k else None
        dq, dk = _group_grad(q, H), _group_grad(k, H)
        kern.dqk_bwd_kernel[(NT, nK, BH)](
            do=do, v=v, k=k, q=q, h=states, hn=ns, dh=dstates, dhn=dns, mc=mc, g=b, gi=a,
            m_row=m_row, ra=R_A, rd=R_D, dq=dq, dk=dk, qdq=q_part, kdk=k_part, chunks=c.CHUNKS,
            T=T, H=H, G=G, K=K, V=V, L=L, NT=NT, NSEQ=c.NSEQ, scale=c.scale, BQ=BQ, BD=BD, BO=BO,
            HAS_N=dns is not None, STORE_QDQ=wants_q, STORE_KDK=wants_k, **flags, **launch,
        )  # fmt: skip
    else:
        q_part = torch.empty(nK, BH, T, **f32) if wants_q else None
        dq = _group_grad(q, H // HPP)
        kern.dq_bwd_kernel[(NT * nQ, nK, BH // HPP)](
            do=do, v=v, k=k, q=q, h=states, hn=ns, mc=mc, g=b, gi=a, m_row=m_row, ra=R_A,
            rd=R_D, dq=dq, qdq=q_part, chunks=c.CHUNKS, T=T, H=H, G=G, K=K, V=V, L=L, NT=NT,
            NQ=nQ, NSEQ=c.NSEQ, scale=c.scale, BQ=BQ, BD=BD, BO=BO, HPP=HPP, STORE_QDQ=wants_q,
            **flags, **launch,
        )  # fmt: skip
        BS, BD, BO, launch = c.tiles("dk_bwd", V, K)
        nS, nK = cdiv(L, BS), cdiv(K, BO)
        k_part = torch.empty(nK, BH, T, **f32) if wants_k else None
        HPP = heads_per_program(G, NT * nS * nK * (BH // G))
        dk = _group_grad(k, H // HPP)
        kern.dk_bwd_kernel[(NT * nS, nK, BH // HPP)](
            v=v, do=do, q=q, k=k, dh=dstates, dhn=dns, mc=mc, g=b, gi=a, m_row=m_row, ra=R_A,
            rd=R_D, dk=dk, kdk=k_part, chunks=c.CHUNKS, T=T, H=H, G=G, K=K, V=V, L=L, NT=NT,
            NS=nS, NSEQ=c.NSEQ, scale=c.scale, BS=BS, BD=BD, BO=BO, HAS_N=dns is not None,
            HPP=HPP, STORE_KDK=wants_k, **flags, **launch,
        )  # fmt: skip
    dq, dk = _group_sum(dq, q), _group_sum(dk, k)
    k_dk = _tile_sum(k_part) if wants_k else None
    q_dq = _tile_sum(q_part) if wants_q else None
    return dq, dk, q_dq, k_dk


# Value heads that share a q/k head (Mamba2's B/C groups), without the max state and the
# normalizer (and its state): from GROUP_MIN_HEADS heads per q/k head on, dq and dk take
# group_kernels (the intra-chunk gradient matrix once per group and chunk), and from
# GROUP_DV_MIN_HEADS on, dv takes group_scores_kernels (the scores q·kᵀ once for several heads),
# instead of the intra-chunk products per value head. Measured on an H200 (docs/tuning.md,
# "Mamba2's large groups"): the group dv kernel wins from 2 heads per group on, the group dq/dk
# kernels from 4 (even at 2). The output has no group form: its per-head kernel was 10-14% faster
# than a group kernel at every group size from 8 to 64.
GROUP_MIN_HEADS = 4
GROUP_DV_MIN_HEADS = 2


def group_path(G: int, c: ChunkConfig) -> bool:
    """Whether a call's dq and dk go through group_kernels (:data:`GROUP_MIN_HEADS`)."""
    return G >= GROUP_MIN_HEADS and not (c.stab or c.norm or c.track_n)


def _group_dq_dk(q, k, v, do, b, a, states, dstates, G, c):
    """:func:`_dq_dk` of :func:`group_path` calls (group_kernels): the intra-chunk gradient
    matrix M once per group and chunk (in q's dtype), then dq and dk per q/k head. The scores
    q·k that the gate gradients' intra parts need are formed inside dscores_kernel."""
    B, T, HK, K = q.shape
    H, V = v.shape[2], v.shape[3]
    BH, NT, L = c.rows, c.NT, c.L
    f32 = dict(device=q.device, dtype=torch.float32)
    gates = c.has_decay or c.has_igate
    (ts, ds, ks, *_), (t, d, o, *_) = GROUP_TILES["dscores"], GROUP_TILES["dq_dk"]
    fit = lambda x, n: max(16, min(x, next_pow2(n)))  # noqa: E731
    BS, BDS, BQ, BD, BO = fit(ts, L), fit(ds, V), fit(t, L), fit(d, V), fit(o, K)
    NS, NQ, nK = cdiv(L, BS), cdiv(L, BQ), cdiv(K, BO)
    launch = {name: dict(num_warps=e[3], num_stages=e[4]) for name, e in GROUP_TILES.items()}
    flags = dict(HAS_DECAY=b is not None, DOT_PREC=c.prec, VARLEN=c.varlen)
    sizes = dict(chunks=c.CHUNKS, T=T, H=H, G=G, K=K, V=V, L=L, NT=NT)
    dm = torch.empty(B * HK, NT, L, L, device=q.device, dtype=q.dtype)
    # per-tile intra parts of q·dq (by key tile) and k·dk (by query tile); the first K tile of
    # the dq and dk kernels reads the slots of the tiles on and below the diagonal
    qdq_in = torch.empty(NS, BH, T, **f32) if c.has_decay else None
    kdk_in = torch.empty(NS, BH, T, **f32) if gates else None
    group.dscores_kernel[(NT * NS * NS, B * HK)](
        do=do, v=v, q=q, k=k, g=b, gi=a, dm=dm, qdq=qdq_in, kdk=kdk_in, NQ=NS, scale=c.scale,
        BQ=BS, BD=BDS, BK=fit(ks, K), ND=cdiv(V, BDS), HAS_IGATE=a is not None, **sizes,
        **flags, **launch["dscores"],
    )  # fmt: skip
    q_part = torch.empty(nK, BH, T, **f32) if c.has_decay else None
    k_part = torch.empty(nK, BH, T, **f32) if gates else None
    dq, dk = torch.empty_like(q), torch.empty_like(k)
    grid = (NT * NQ, nK, B * HK)
    tiles = dict(NQ=NQ, scale=c.scale, BQ=BQ, BD=BD, BO=BO, ND=cdiv(V, BD), BS=BS, NS=NS,
                 **sizes, **flags, **launch["dq_dk"])  # fmt: skip
    group.dqk_group_kernel[grid](
        x=do, a=q, b=k, st=states, g=b, gi=None, dm=dm, out=dq, part=q_part, part_in=qdq_in,
        DK=False, HAS_IGATE=False, **tiles,
    )  # fmt: skip
    group.dqk_group_kernel[grid](
        x=v, a=k, b=q, st=dstates, g=b, gi=a, dm=dm, out=dk, part=k_part, part_in=kdk_in,
        DK=True, HAS_IGATE=a is not None, **tiles,
    )  # fmt: skip
    q_dq = _tile_sum(q_part) if c.has_decay else None
    k_dk = _tile_sum(k_part) if gates else None
    return dq, dk, q_dq, k_dk


# The dq and dk kernels sum all value heads of a group in one program when that still gives at
# least this many programs (a few per SM); else each group's heads are split over the fewest
# programs that reach it, whose fp32 partial sums the host adds.
GROUP_MIN_PROGRAMS = 1024


# The per-head dq and dk kernels unroll their loop over a program's heads (tl.static_range): at
# most this many, since an unrolled loop over a 64-head group (Mamba2's G = 1 at width 4096) takes
# minutes to compile. Larger groups go through group_kernels (GROUP_MIN_HEADS) where they can.
UNROLLED_MAX_HEADS = 4


def heads_per_program(G: int, programs: int) -> int:
    """HPP, the value heads one dq/dk program sums: the largest divisor of the group size G,
    at most :data:`UNROLLED_MAX_HEADS`, whose grid (``programs`` per whole group, times
    G / HPP) has ≥ :data:`GROUP_MIN_PROGRAMS` programs; 1 where none has."""
    return _split_group(G, programs, UNROLLED_MAX_HEADS)


def _split_group(G: int, programs: int, most: int) -> int:
    """The largest divisor of G, at most ``most``, that keeps ≥ GROUP_MIN_PROGRAMS programs."""
    for parts in range(1, G + 1):
        if G % parts == 0 and G // parts <= most and programs * parts >= GROUP_MIN_PROGRAMS:
            return G // parts
    return 1


def group_tiles(c: ChunkConfig, name: str, K: int, V: int):
    """(time tile, depth tile, V tile, launch options) of group kernel ``name``."""
    t, d, o, nw, ns = GROUP_SCORE_TILES[name]
    fit = lambda x, n: max(16, min(x, next_pow2(n)))  # noqa: E731
    return fit(t, c.L), fit(d, K), fit(o, V), dict(num_warps=nw, num_stages=ns)


def _group_dv_heads(c: ChunkConfig, G: int, K: int, V: int) -> int:
    """HPP, the value heads one program of group_dv_kernel serves from one set of scores, where
    that path applies (mode "chunk", a group of ≥ :data:`GROUP_DV_MIN_HEADS` value heads, no max
    state, no normalizer, chunks of at most two time tiles); 0 where it does not, 1 where too
    few programs would share (the per-head kernel then)."""
    BT, _, BO, _ = group_tiles(c, "dv", K, V)
    if c.fused or c.stab or c.norm or G < GROUP_DV_MIN_HEADS or c.L > 2 * BT:
        return 0
    return score_heads_per_program(G, c.NT * cdiv(c.L, BT) * cdiv(V, BO) * (c.rows // G))


def score_heads_per_program(G: int, programs: int) -> int:
    """HPP of the group kernels (whose loops over heads are not unrolled): the rule of
    :func:`heads_per_program` with no bound on HPP."""
    return _split_group(G, programs, G)


def _group_dv(q, k, v, b, a, do, dstates, c: ChunkConfig, skip):
    """(dv, dskip) by group_dv_kernel; dskip as dv_bwd_kernel stores it (None without skip)."""
    T, K, H, V = q.shape[1], q.shape[3], v.shape[2], v.shape[3]
    G = H // q.shape[2]
    BS, BD, BO, launch = group_tiles(c, "dv", K, V)
    nS, nV = cdiv(c.L, BS), cdiv(V, BO)
    HPP = _group_dv_heads(c, G, K, V)
    dv = torch.empty_like(v)
    dskip = None
    if skip is not None:
        dskip = torch.zeros(c.rows, c.NT * nS * nV, device=v.device, dtype=torch.float32)
    gsk.group_dv_kernel[(c.NT * nS, nV, c.rows // HPP)](
        k=k, q=q, do=do, dh=dstates, g=b, gi=a, dv=dv, chunks=c.CHUNKS, T=T, H=H, G=G, K=K,
        V=V, L=c.L, NT=c.NT, NS=nS, scale=c.scale, BS=BS, BD=BD, BO=BO, ND=cdiv(K, BD), HPP=HPP,
        TWO=nS > 1,
        HAS_DECAY=b is not None, HAS_IGATE=a is not None, DOT_PREC=c.prec, VARLEN=c.varlen,
        v=v if skip is not None else None, skip=skip, dskip=dskip, HAS_SKIP=skip is not None,
        **launch,
    )  # fmt: skip
    return dv, dskip


def _group_grad(x, slots: int):
    """The dq/dk kernels' output: x's own shape and dtype when a program sums a whole group
    (``slots`` = x's heads), else fp32 ``[B, T, slots, K]`` partial sums."""
    if slots == x.shape[2]:
        return torch.empty_like(x)
    return torch.empty(*x.shape[:2], slots, x.shape[3], device=x.device, dtype=torch.float32)


def _group_sum(part, x):
    """x's gradient from :func:`_group_grad`'s tensor: its partial sums added per group."""
    if part.shape[2] == x.shape[2]:
        return part
    B, T, HK, K = x.shape
    return part.view(B, T, HK, -1, K).sum(3).to(x.dtype)


def _tile_sum(part):
    """[tiles, rows, T] per-tile partial sums → [rows, T] (no reduction for one tile)."""
    return part[0] if part.shape[0] == 1 else part.sum(0)


class ChunkFunction(torch.autograd.Function):
    """The autograd Function of :func:`forward` / :func:`backward_skip` (eager calls)."""

    @staticmethod
    def forward(ctx, q, k, v, g, gi, S0, n0, m0, skip, cfg: ChunkConfig):
        outputs, saved = forward(q, k, v, g, gi, S0, n0, m0, cfg, skip=skip)
        ctx.cfg, ctx.names = cfg, tuple(saved)
        ctx.save_for_backward(*saved.values())
        return outputs

    @staticmethod
    def backward(ctx, do, dS_T, dn_T, dm_T):
        saved = dict(zip(ctx.names, ctx.saved_tensors))
        need = ctx.needs_input_grad[3] or ctx.needs_input_grad[4]  # g, gi
        return (*backward_skip(saved, ctx.cfg, do, dS_T, dn_T, dm_T, need), None)


def config(q, k, v, *, scale, g, gi, stabilize, track_n, normalizer, eps, chunk_size, fused,
           offsets) -> ChunkConfig:  # fmt: skip
    """The :class:`ChunkConfig` of a scalar-gate call. q and k may have fewer heads than v
    (value head h reads q/k head h // G)."""
    return ChunkConfig(
        q, k, v, scale=scale, has_decay=g is not None, has_igate=gi is not None,
        stabilize=stabilize, track_n=track_n, normalizer=normalizer, eps=eps,
        chunk_size=chunk_size, fused=fused, offsets=offsets,
    )  # fmt: skip


def chunk(q, k, v, *, scale, g=None, gi=None, stabilize=False, track_n=False, normalizer=None,
          eps=0.0, S0=None, n0=None, m0=None, chunk_size=None, fused=False, offsets=None,
          skip=None):  # fmt: skip
    """Scalar-gate chunkwise forward (autograd-enabled). q, k ``[B, T, H / G, K]``, v
    ``[B, T, H, V]`` in one of fp16/bf16/fp32 (G > 1: Mamba2's B, C groups); g, gi
    ``[B, T, H]`` log decay and log input gate; S0/n0/m0 the initial state (n0 with
    ``track_n``, m0 with ``stabilize``; N = B, or the number of sequences). ``fused``: the
    non-materializing kernels (fused_kernels). ``offsets``: ``[N + 1]`` ints of packed
    sequences (B = 1), each its own chunks and state. ``skip``: ``[H]`` fp32, o_t += skip[h]·v_t
    (mode "chunk"). Returns ``(o, S_T, n_T, m_T)``."""
    cfg = config(q, k, v, scale=scale, g=g, gi=gi, stabilize=stabilize, track_n=track_n,
                 normalizer=normalizer, eps=eps, chunk_size=chunk_size, fused=fused,
                 offsets=offsets)  # fmt: skip
    S0, n0, m0 = prepare_state(S0, n0, m0, track_n, stabilize)
    return ChunkFunction.apply(q, k, v, g, gi, S0, n0, m0, skip, cfg)
