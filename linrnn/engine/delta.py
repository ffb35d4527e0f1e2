"""Host of the Triton chunk path of the delta rule (DeltaNet, Gated DeltaNet; docs/DESIGN.md
§1b): the forward as a pipeline of named steps, each one launch, and the autograd Function.

    b       = chunk-local cumsum of g                              (scalar._chunk_cumsum)
    A, w, u = solve_wu(k, v, beta, b, cfg)   (I + N)⁻¹ per chunk    [B·HV, T, L] fp32
                                             W, U of the WY form    v's dtype
    vn, states, S_T = walk(k, w, u, b, S0, cfg)   new values and the chunk states
    o       = output(q, k, vn, b, states, cfg)    the scalar engine's output kernel, vn as v

    (o, S_T), saved = forward(q, k, v, beta, g, S0, cfg)
    dq, dk, dv, dbeta, dg, dS0 = backward(saved, cfg, do, dS_T)

Value heads may outnumber q/k heads (HV = G·H, value head j reads q/k head j // G): every row
table (b, A, states) has B·HV rows, and the kernels read q and k through head j // G.
"""

from __future__ import annotations

import torch

from linrnn.engine import delta_bwd_kernels as bk
from linrnn.engine import delta_kernels as dk
from linrnn.engine import fix_pass
from linrnn.engine import scalar_kernels as sk
from linrnn.engine.config import (
    DELTA_BWD_TILES,
    DELTA_MAX_K,
    DELTA_TILES,
    ChunkConfig,
    delta_chunk_size,
    fp32_contiguous,
)
from linrnn.engine.host_math import cdiv, next_pow2
from linrnn.engine.scalar import _chunk_cumsum, chunk_gate_grads

# What forward() saves for backward() (None where the call has no such tensor): the inputs
# (contiguous; beta, g, S0 fp32), b, A, vn, the chunk states and the final state (the backward
# needs neither W nor U).
SAVED = ("q", "k", "v", "beta", "g", "S0", "b", "A", "vn", "states", "S_T")

DTYPES = (torch.float16, torch.bfloat16, torch.float32)


class DeltaConfig(ChunkConfig):
    """The :class:`ChunkConfig` of one delta-rule call, over the value heads: ``rows`` = B·HV,
    ``walkers`` = N·HV, plus ``H`` (q/k heads), ``HV``, ``G`` = HV // H and ``BL`` (a chunk's
    rows as one tile, a power of two ≥ 16). L follows :func:`config.delta_chunk_size`."""

    def __init__(self, q, v, *, scale, has_decay, chunk_size, offsets):
        B, T, H, K = q.shape
        HV, V = v.shape[2], v.shape[3]
        L = delta_chunk_size(chunk_size, K, V, dtype=q.dtype, device=q.device)
        # The engine's config takes B, T, the head count, K, device and dtype from its q: q's
        # first head repeated HV times (a view, no copy) gives it the value heads' rows.
        qv = q[:, :, :1].expand(B, T, HV, K)
        super().__init__(
            qv, qv, v, scale=scale, has_decay=has_decay, has_igate=False, stabilize=False,
            track_n=False, normalizer=None, eps=0.0, chunk_size=L, offsets=offsets,
        )  # fmt: skip
        self.H, self.HV, self.G = H, HV, HV // H
        self.BL = max(16, next_pow2(self.L))


def config(q, k, v, *, scale, g=None, chunk_size=None, offsets=None) -> DeltaConfig:
    """The :class:`DeltaConfig` of a call (shapes as :func:`chunk` takes them)."""
    return DeltaConfig(q, v, scale=scale, has_decay=g is not None, chunk_size=chunk_size,
                       offsets=offsets)  # fmt: skip


def solve_wu(k, v, beta, b, cfg: DeltaConfig):
    """``(A, w, u)`` of every chunk in one launch of wy_fwd_kernel: A = (I + N)⁻¹, N_rs =
    β_r exp(b_r − b_s) (k_r·k_s) (s < r), ``[B·HV, T, L]`` fp32, row t holding row r of its
    chunk's A over chunk-local columns, zeros above the diagonal (the backward reads it);
    W = A diag(β exp(b)) K ``[B, T, HV, K]`` and U = A diag(β) V ``[B, T, HV, V]`` in v's
    dtype. k ``[B, T, H, K]``, beta ``[B, T, HV]`` fp32, b ``[B·HV, T]`` fp32 or None. A chunk
    is NB ∈ {1, 2, 4} block rows of BS = max(16, BL / 4) rows."""
    T, K = k.shape[1], k.shape[3]
    V = v.shape[3]
    A = torch.empty(cfg.rows, T, cfg.L, device=k.device, dtype=torch.float32)
    w = torch.empty(*v.shape[:3], K, device=v.device, dtype=v.dtype)
    u = torch.empty_like(v)
    BS = max(16, cfg.BL // 4)
    BK, BD, nw, ns = DELTA_TILES["wy_long" if BS > 16 else "wy_gated" if b is not None else "wy"]
    dk.wy_fwd_kernel[(cfg.NT, cfg.rows)](
        k=k, v=v, beta=beta, b=b, A=A, w=w, u=u, chunks=cfg.CHUNKS, T=T, H=cfg.HV, G=cfg.G,
        K=K, V=V, L=cfg.L, NT=cfg.NT, BS=BS, NB=cfg.BL // BS, BK=_tile(K, BK),
        BD=_tile(max(K, V), BD), HAS_DECAY=b is not None, DOT_PREC=cfg.prec,
        VARLEN=cfg.varlen, num_warps=nw, num_stages=ns,
    )  # fmt: skip
    return A, w, u


def walk(k, w, u, b, S0, cfg: DeltaConfig):
    """The chunks in order: ``(vn, states, S_T)`` — vn = U − W S0 per chunk ``[B, T, HV, V]``
    in u's dtype, the state entering each chunk ``[B·HV, NT, K, V]`` in k's dtype and the final
    state ``[N, HV, K, V]`` fp32, from the initial state S0 (fp32 contiguous, or None).

    The walk carries the state in fp32; the stored copies are rounded to k's dtype because
    their readers (the output, dq and WY kernels) round them to that dtype for their products
    anyway: this halves the largest tensor of the pass at 16-bit inputs and changes no result
    but the log-decay gradient's ⟨dS', S'⟩ term, which then reads the rounded state."""
    T, K = k.shape[1], k.shape[3]
    HV, V = u.shape[2], u.shape[3]
    f32 = dict(device=u.device, dtype=torch.float32)
    vn = torch.empty_like(u)
    states = torch.empty(cfg.rows, cfg.NT, K, V, device=u.device, dtype=k.dtype)
    S_T = torch.empty(cfg.N, HV, K, V, **f32)
    BK, elems, nw, ns = DELTA_TILES["walk"]
    BK = max(16, min(BK, next_pow2(K)))
    NKB = cdiv(K, BK)
    BV = max(16, min(64, elems // (NKB * BK), next_pow2(V)))
    ns = ns if k.element_size() == 2 else 1  # fp32 tiles in several stages overflow shared memory
    dk.walk_fwd_kernel[(cdiv(V, BV), cfg.walkers)](
        k=k, w=w, u=u, b=b, h0=S0, h=states, vn=vn, ht=S_T, co=cfg.CO, chunks=cfg.CHUNKS, T=T,
        H=HV, G=cfg.G, K=K, V=V, L=cfg.L, NT=cfg.NT, BT=cfg.BL, BK=BK, BV=BV, NKB=NKB,
        HAS_DECAY=b is not None, HAS_H0=S0 is not None, DOT_PREC=cfg.prec, VARLEN=cfg.varlen,
        num_warps=nw, num_stages=ns,
    )  # fmt: skip
    return vn, states, S_T


def output(q, k, vn, b, states, cfg: DeltaConfig) -> torch.Tensor:
    """o = scale·[exp(b_r) q_r S0 + Σ_{s≤r} exp(b_r − b_s) (q_r·k_s) vn_s] ``[B, T, HV, V]`` in
    q's dtype: the scalar engine's output kernel with vn as v."""
    T, K = q.shape[1], q.shape[3]
    HV, V = vn.shape[2], vn.shape[3]
    o = torch.empty(*vn.shape, device=vn.device, dtype=q.dtype)
    BQ, BD, BO, launch = cfg.tiles("out_fwd", K, V)
    NQ = cdiv(cfg.L, BQ)
    fix_pass.launch(
        sk.out_fwd_kernel, (cfg.NT * NQ, cdiv(V, BO), cfg.rows), vn.device,
        q=q, k=k, v=vn, h=states, hn=None, mc=None, g=b, gi=None, o=o, den=None, m_row=None,
        chunks=cfg.CHUNKS, T=T, H=HV, G=cfg.G, K=K, V=V, L=cfg.L, NT=cfg.NT, NQ=NQ, NSEQ=cfg.NSEQ,
        scale=cfg.scale, eps=0.0, BQ=BQ, BD=BD, BO=BO, HAS_DECAY=b is not None, HAS_IGATE=False,
        HAS_MAX=False, NORM=0, DOT_PREC=cfg.prec, VARLEN=cfg.varlen, **launch,
    )  # fmt: skip
    return o


def forward(q, k, v, beta, g, S0, cfg: DeltaConfig):
    """One chunk forward: ``((o, S_T), saved)``. q, k ``[B, T, H, K]``, v ``[B, T, HV, V]``
    (one of fp16/bf16/fp32), beta ``[B, T, HV]``, g ``[B, T, HV]`` log decay or None (DeltaNet),
    S0 ``[N, HV, K, V]`` fp32 contiguous or None. ``saved``: the tensors of :data:`SAVED`."""
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    beta, g = fp32_contiguous(beta), fp32_contiguous(g)
    b = _chunk_cumsum(g, cfg.L, cfg)[0] if g is not None else None
    A, w, u = solve_wu(k, v, beta, b, cfg)
    vn, states, S_T = walk(k, w, u, b, S0, cfg)
    del w, u
    o = output(q, k, vn, b, states, cfg)
    saved = dict(q=q, k=k, v=v, beta=beta, g=g, S0=S0, b=b, A=A, vn=vn, states=states, S_T=S_T)
    return (o, S_T), saved


def backward(saved: dict, cfg: DeltaConfig, do, dS_T):
    """The gradients ``(dq, dk, dv, dbeta, dg, dS0)`` of one chunk call from what
    :func:`forward` saved, the cotangent of o and that of the final state (dS_T may be None);
    dg is None without g, dS0 None without S0. The steps (delta_bwd_kernels for the math)::

        dy            = dv_local(q, k, do, b)          scale·Mᵀ dO, the state-free part of dvn
        dstates, dS0  = walk_bwd(...)                  dvn = dy + Kt dS'; dy := Aᵀ dvn
        dq, dk        = the engine's dq, dk kernels    vn as v (dk: the direct part)
        dv, dbeta, db = wy_bwd(...)                    dk += the WY part
        dg            = chunk-local reverse sum of q·dq − k·dk + db, ⟨dS', S'⟩ at chunk ends

    dq and dk are computed per value head and summed over each group of G."""
    s = saved
    q, k, v, beta, b, A = s["q"], s["k"], s["v"], s["beta"], s["b"], s["A"]
    vn, states = s["vn"], s["states"]
    B, T, _H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    do = do.contiguous()
    sizes = dict(T=T, H=HV, G=cfg.G, K=K, V=V, L=cfg.L, NT=cfg.NT)
    flags = dict(HAS_DECAY=b is not None, DOT_PREC=cfg.prec, VARLEN=cfg.varlen)

    dy = _dv_local(q, k, do, b, cfg, sizes, flags)
    dstates, dS0, bnd = _walk_bwd(q, k, beta, b, A, do, dy, states, s["S_T"], dS_T, cfg, sizes,
                                  flags)  # fmt: skip
    dq, q_dq = _dq(q, k, vn, do, b, states, cfg, sizes, flags)
    dk, k_dk = _dk_direct(q, k, vn, do, b, dstates, cfg, sizes, flags)
    dv, dbeta, db = _wy_bwd(k, v, vn, beta, b, states, dy, dk, cfg, sizes, flags)
    dg = None
    if b is not None:
        dg = chunk_gate_grads(None, None, None, q_dq + db, k_dk, None, bnd, None, None, None,
                              cfg, (B, T, HV))[0]  # fmt: skip
    dq, dk = _group_sum(dq, cfg.G, q.dtype), _group_sum(dk, cfg.G, k.dtype)
    return dq, dk, dv, dbeta, dg, (dS0 if s["S0"] is not None else None)


def _tile(n: int, cap: int) -> int:
    """The power of two ≥ n (at least 16, at most cap)."""
    return max(16, min(cap, next_pow2(n)))


def _group_sum(x, G: int, dtype):
    """Gradients per value head ``[B, T, HV, D]`` → per q/k head ``[B, T, HV / G, D]`` in
    ``dtype``."""
    if G > 1:
        B, T, HV, D = x.shape
        x = x.view(B, T, HV // G, G, D).sum(3)
    return x.to(dtype)


def _dv_local(q, k, do, b, cfg: DeltaConfig, sizes, flags):
    """dy = scale·Mᵀ dO ``[B, T, HV, V]`` in do's dtype (dv_local_kernel)."""
    K, V, L = sizes["K"], sizes["V"], sizes["L"]
    BO, nw = DELTA_BWD_TILES["dv_local"]
    BS, BD, BV = _tile(L, 64), _tile(K, 64), _tile(V, BO)
    NS = cdiv(L, BS)
    dy = torch.empty(*do.shape, device=do.device, dtype=do.dtype)
    bk.dv_local_kernel[(cfg.NT * NS, cdiv(V, BV), cfg.rows)](
        q=q, k=k, do=do, g=b, dy=dy, chunks=cfg.CHUNKS, **sizes, NS=NS, scale=cfg.scale, BS=BS,
        BD=BD, BV=BV, **flags, num_warps=nw, num_stages=2,
    )  # fmt: skip
    return dy


def _walk_bwd(q, k, beta, b, A, do, dy, states, S_T, dS_T, cfg: DeltaConfig, sizes, flags):
    """The reverse walk (walk_bwd_kernel): ``(dstates, dS0, bnd)`` — the gradient of the state
    leaving each chunk ``[B·HV, NT, K, V]`` in q's dtype (its one reader, the engine's dk
    kernel, rounds it to that dtype for its product anyway), of the initial state
    ``[N, HV, K, V]`` fp32, and ⟨dS', S'⟩ at each chunk end ``[B·HV, NT]`` (None without a
    decay); dy becomes Aᵀ dvn."""
    K, V = sizes["K"], sizes["V"]
    f32 = dict(device=do.device, dtype=torch.float32)
    BO, elems, nw, ns = DELTA_BWD_TILES["walk"]
    BK = _tile(K, 64)
    NB = cdiv(K, BK)
    BV = _tile(V, max(16, min(BO, elems // (NB * BK), elems // 2 // cfg.BL)))
    nV = cdiv(V, BV)
    dstates = torch.empty(cfg.rows, cfg.NT, K, V, device=q.device, dtype=q.dtype)
    dS0 = torch.empty(cfg.N, cfg.HV, K, V, **f32)
    bnd = torch.empty(cfg.rows, cfg.NT, nV, **f32) if flags["HAS_DECAY"] else None
    bk.walk_bwd_kernel[(nV, cfg.walkers)](
        q=q, k=k, beta=beta, g=b, A=A, do=do, dy=dy, h=states, ht=S_T,
        dht=fp32_contiguous(dS_T), dh=dstates, dh0=dS0, bnd=bnd, co=cfg.CO, chunks=cfg.CHUNKS,
        **sizes, scale=cfg.scale, BT=cfg.BL, BK=BK, BV=BV, NB=NB, HAS_DHT=dS_T is not None,
        **flags, num_warps=nw, num_stages=ns,
    )  # fmt: skip
    return dstates, dS0, (bnd.sum(-1) if bnd is not None else None)


def _engine_flags(flags):
    """The scalar engine's switches for the delta rule: no input gate, max state, normalizer."""
    return dict(flags, HAS_IGATE=False, HAS_MAX=False, HAS_NORM=False)


def _dq(q, k, vn, do, b, states, cfg: DeltaConfig, sizes, flags):
    """``(dq, q·dq)``: dq per value head ``[B, T, HV, K]`` from the engine's dq kernel with vn
    as v (fp32 for the group sum; q's dtype when G = 1), and q·dq ``[B·HV, T]`` (None without
    a decay)."""
    T, K = sizes["T"], sizes["K"]
    f32 = dict(device=q.device, dtype=torch.float32)
    BQ, BD, BO, launch = cfg.tiles("dq_bwd", sizes["V"], K)
    nQ, nK = cdiv(cfg.L, BQ), cdiv(K, BO)
    q_part = torch.empty(nK, cfg.rows, T, **f32) if flags["HAS_DECAY"] else None
    dq = torch.empty(*do.shape[:3], K, **f32) if cfg.G > 1 else torch.empty_like(q)
    sk.dq_bwd_kernel[(cfg.NT * nQ, nK, cfg.rows)](
        do=do, v=vn, k=k, q=q, h=states, hn=None, mc=None, g=b, gi=None, m_row=None, ra=None,
        rd=None, dq=dq, qdq=q_part, chunks=cfg.CHUNKS, **sizes, NQ=nQ, NSEQ=cfg.NSEQ,
        scale=cfg.scale, BQ=BQ, BD=BD, BO=BO, STORE_QDQ=q_part is not None,
        **_engine_flags(flags), **launch,
    )  # fmt: skip
    return dq, (q_part.sum(0) if q_part is not None else None)


def _dk_direct(q, k, vn, do, b, dstates, cfg: DeltaConfig, sizes, flags):
    """``(dk, k·dk)``: the direct part of dk (vn held fixed) per value head ``[B, T, HV, K]``
    from the engine's dk kernel with vn as v (fp32 for the group sum; k's dtype when G = 1),
    and k·dk ``[B·HV, T]`` (None without a decay)."""
    T, K = sizes["T"], sizes["K"]
    f32 = dict(device=q.device, dtype=torch.float32)
    BS, BD, BO, launch = cfg.tiles("dk_bwd", sizes["V"], K)
    nS, nK = cdiv(cfg.L, BS), cdiv(K, BO)
    k_part = torch.empty(nK, cfg.rows, T, **f32) if flags["HAS_DECAY"] else None
    dk = torch.empty(*do.shape[:3], K, **f32) if cfg.G > 1 else torch.empty_like(k)
    sk.dk_bwd_kernel[(cfg.NT * nS, nK, cfg.rows)](
        v=vn, do=do, q=q, k=k, dh=dstates, dhn=None, mc=None, g=b, gi=None, m_row=None,
        ra=None, rd=None, dk=dk, kdk=k_part, chunks=cfg.CHUNKS, **sizes, NS=nS, NSEQ=cfg.NSEQ,
        scale=cfg.scale, BS=BS, BD=BD, BO=BO, HAS_N=False, STORE_KDK=k_part is not None,
        **_engine_flags(flags), **launch,
    )  # fmt: skip
    return dk, (k_part.sum(0) if k_part is not None else None)


def _wy_bwd(k, v, vn, beta, b, states, dy, dk, cfg: DeltaConfig, sizes, flags):
    """``(dv, dbeta, db)`` of the WY form (wy_bwd_kernel), adding its part of dk into dk:
    dv in v's dtype, dbeta ``[B, T, HV]`` fp32, db ``[B·HV, T]`` fp32 (None without a
    decay)."""
    B, T, HV = beta.shape
    f32 = dict(device=v.device, dtype=torch.float32)
    BO, nw = DELTA_BWD_TILES["wy" if cfg.BL <= 64 else "wy_long"]
    dv = torch.empty_like(v)
    dbeta = torch.empty(B, T, HV, **f32)
    db = torch.empty(cfg.rows, T, **f32) if flags["HAS_DECAY"] else None
    bk.wy_bwd_kernel[(cfg.NT, cfg.rows)](
        k=k, v=v, vn=vn, beta=beta, g=b, h=states, dy=dy, dv=dv, dk=dk, dbeta=dbeta, db=db,
        chunks=cfg.CHUNKS, **sizes, BT=cfg.BL, BK=_tile(sizes["K"], BO),
        BV=_tile(sizes["V"], BO), **flags, num_warps=nw, num_stages=1,
    )  # fmt: skip
    return dv, dbeta, db


class ChunkFunction(torch.autograd.Function):
    """The autograd Function of :func:`forward` / :func:`backward` (eager calls)."""

    @staticmethod
    def forward(ctx, q, k, v, beta, g, S0, cfg: DeltaConfig):
        outputs, saved = forward(q, k, v, beta, g, S0, cfg)
        ctx.cfg, ctx.names = cfg, tuple(saved)
        ctx.save_for_backward(*saved.values())
        return outputs

    @staticmethod
    def backward(ctx, do, dS_T):
        saved = dict(zip(ctx.names, ctx.saved_tensors))
        return (*backward(saved, ctx.cfg, do, dS_T), None)


def check(q, k, v, beta, g, S0, offsets) -> None:
    """Raise for inputs the kernels cannot run, naming the values."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.dim() != 4:
            raise ValueError(f"{name} must be [B, T, heads, dim], got shape {tuple(x.shape)}")
        if x.dtype not in DTYPES:
            raise TypeError(f"{name} must be fp16, bf16 or fp32, got {x.dtype}")
    if k.shape != q.shape:
        raise ValueError(f"k must have q's shape {tuple(q.shape)}, got {tuple(k.shape)}")
    if not q.dtype == k.dtype == v.dtype:
        raise TypeError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    if v.shape[:2] != (B, T) or HV % H:
        raise ValueError(
            f"v must be [B, T, HV, V] with B, T = {B}, {T} and HV a multiple of H = {H}, got "
            f"{tuple(v.shape)}"
        )
    if K > DELTA_MAX_K:
        raise ValueError(f"the chunk path holds K ≤ {DELTA_MAX_K} in one state walk, got K = {K}")
    for name, x in (("beta", beta), ("g", g)):
        if x is not None and tuple(x.shape) != (B, T, HV):
            raise ValueError(f"{name} must be [B, T, HV] = {(B, T, HV)}, got {tuple(x.shape)}")
    if offsets is not None and B != 1:
        raise ValueError(f"packed sequences (offsets) need B = 1, got B = {B}")
    N = B if offsets is None else len(offsets) - 1
    if S0 is not None and tuple(S0.shape) != (N, HV, K, V):
        raise ValueError(f"S0 must be [N, HV, K, V] = {(N, HV, K, V)}, got {tuple(S0.shape)}")


def chunk(q, k, v, beta, g=None, *, scale, S0=None, offsets=None, chunk_size=None):
    """The delta rule by chunks (autograd-enabled): ``(o [B, T, HV, V] in q's dtype, S_T
    [N, HV, K, V] fp32)``. q, k ``[B, T, H, K]``, v ``[B, T, HV, V]`` in one of fp16/bf16/fp32
    (HV a multiple of H); beta ``[B, T, HV]``; g ``[B, T, HV]`` log decay ≤ 0 or None
    (DeltaNet); S0 ``[N, HV, K, V]`` or None; ``offsets``: ``[N + 1]`` ints of packed
    sequences (B = 1), each its own chunks and state; ``chunk_size``: see
    :func:`config.delta_chunk_size`."""
    check(q, k, v, beta, g, S0, offsets)
    cfg = config(q, k, v, scale=scale, g=g, chunk_size=chunk_size, offsets=offsets)
    return ChunkFunction.apply(q, k, v, beta, g, fp32_contiguous(S0), cfg)
