"""Host of the Triton chunk engine for per-channel decays (modes "chunk" and "fused_chunk"):
GLA (gk over K, optional gv over V) and RWKV6 (w over K, exclusive form with the bonus u). The
kernel launches of one call and its backward, as plain functions over named tensors, and the
autograd Function over them (docs/DESIGN.md §3, §6.4, §6.5).

    (o, S_T), saved = forward(q, k, v, gk, gv, u, S0, cfg)
    dq, dk, dv, dgk, dgv, du, dS0 = backward(saved, cfg, do, dS_T)

``saved`` is a dict of the tensors the backward reads (:data:`SAVED`; None where the call does
not use one, see :func:`kept`). Chunk mode's kernels are vector_kernels (states, output, dq, dk,
dv), vector_scores_kernels (stored scores, gk alone), vector_cumsum_kernels (the gates' chunk-local
sums) and vector_gate_grad_kernels (the decay gradient); fused_chunk runs fused_kernels, whose
``VEC`` path serves per-channel gates. The custom ops of :mod:`linrnn.engine.custom_ops` call
the same two functions.

Gates. gk and gv enter as chunk-local cumulative sums ``[B, T, H, D]`` fp32 (G^K, inclusive);
RWKV6's query side reads the state before its own step, so its row gate is the exclusive sum
G^X_t = G^K_{t−1} (0 at a chunk's first step). Every kernel exponent is a difference that the
causal order keeps ≤ 0, except in the fast forms (DIAG_SPAN, CHUNK_SPAN: bf16 inputs), whose
exponents lie within ±30 by the span that selects them.

Gate gradients, per channel. With F_t[k] the global cumulative log decay,

    ∂L/∂F_t[k] = (q ⊙ dq − k ⊙ dk)_t[k]                (+ Σ_v dS_T ⊙ S_T at the last step),
    ∂L/∂gk_u   = Σ_{t≥u} ∂L/∂F_t,

and symmetrically over V with (o ⊙ do − v ⊙ dv). The sum restarts at every chunk end from the
exact value W_c = Σ_v dS_c+1 ⊙ S_c+1 (the state leaving the chunk and its gradient; summed
over K for gv), which states_bwd computes from the fp32 materialized states (chunk mode); the
non-materializing mode sums the chunk totals in fp64 instead. RWKV6's exclusive read shifts the
query term by one step: ∂L/∂w_u = (that sum)_u − (q ⊙ dq)_u + B_u with B_u = scale·u ⊙ q_u ⊙
k_u (do_u·v_u) the bonus part of q ⊙ dq, and ∂L/∂u = scale·Σ_t q_t ⊙ k_t (do_t·v_t).
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from linrnn.engine import fix_pass
from linrnn.engine import fused_kernels as fused
from linrnn.engine import vector_cumsum_kernels as cs
from linrnn.engine import vector_gate_grad_kernels as gg
from linrnn.engine import vector_kernels as vk
from linrnn.engine import vector_scores_kernels as sc
from linrnn.engine.config import GATED_BO, SCORE_TILES, VEC_TILES, ChunkConfig
from linrnn.engine.gate_grads import final_grads
from linrnn.engine.host_math import cdiv, next_pow2

# The diagonal sub-chunk's gated products walk its BC key rows, each a [BC, tile] product (a loop,
# unrolled in calls with gv). Under the Triton interpreter (CPU) that walk is ~8x slower, so
# there they take the block form, one [BC, BC, tile] fp32 product per depth/output tile (the
# kernels' BLOCK_DIAG). The tests run the walk on the CPU too (tests/test_triton_vector.py).
INTERPRETER = os.environ.get("TRITON_INTERPRET") == "1"


# The diagonal sub-chunk's fast form (vector_common, module doc): a depth or output tile whose
# gates span less than DIAG_SPAN over the sub-chunk's 16 rows (the widest channel's range of
# cumulative log decays) takes one tensor-core product around the middle of that range, each
# factor within exp(±DIAG_SPAN/2); a wider tile (strong decays) the fp32 log-space form.
# 60: factors ≤ e^30 ≈ 1e13 keep every product finite in bf16 and fp32 while a decay of 3.75
# per step (e^-3.75 ≈ 0.02) still takes the fast form.
DIAG_SPAN = 60.0
# Fast chunks (vector_scores_kernels): in gk-only calls in chunk mode, a chunk whose gates span less
# than CHUNK_SPAN over all its rows (60 is a decay of ≈ 0.94 per step over 64 steps) is formed
# without sub-chunks: its scores as one product (fast_scores_kernel), its dq and dk finished by
# apply_kernel's FAST around the chunk's middle, factors within e^±30 and fp32 operands. The
# other chunks take the sub-chunk forms.
CHUNK_SPAN = 60.0


def _fast_forms(dtype: torch.dtype) -> bool:
    """Whether a call takes the fast forms (DIAG_SPAN, CHUNK_SPAN): bf16 inputs only. Their
    products take tf32 operands, finer than bf16's own rounding. fp16 and fp32 inputs keep the
    fp32 log-space forms: with tf32 products their decay gradients (q ⊙ dq − k ⊙ dk, rounded
    differently, no longer cancelling) lose precision, and fp32 products lose the speed."""
    return dtype == torch.bfloat16


def _diag(c: ChunkConfig) -> dict:
    """The kernels' diagonal constexprs: BLOCK_DIAG (the interpreter's fallback) and DIAG_SPAN
    (0 where the call takes no fast forms)."""
    return dict(BLOCK_DIAG=INTERPRETER, DIAG_SPAN=DIAG_SPAN if _fast_forms(c.dtype) else 0.0)


def _pre_gate(has_gv: bool, fused: bool, V: int) -> bool:
    """Whether the cumulative-sum pass also stores q ⊙ e^{G^X} and k ⊙ e^{G^K_L − G^K}
    (vector_cumsum_kernels' GATE_QK) for the state and apply kernels to take as they are: gk-only
    calls in chunk mode whose V spans more than one output tile of the apply kernels (with one tile
    the pass's extra traffic outweighs the exponentials it saves)."""
    one_tile = V <= _fit(SCORE_TILES["apply"][3], V)
    return not has_gv and not fused and not one_tile


def _fast_chunks(has_gv: bool, fused: bool, dtype: torch.dtype) -> bool:
    """Whether a call has fast chunks (the gates' spans are recorded for them)."""
    return _fast_forms(dtype) and not has_gv and not fused


# What forward() saves for backward(): the inputs the kernels read (contiguous; u and S0 fp32),
# the final state, and what the call produced: the gates' chunk-local cumulative sums (Gk =
# G^K, Gx = G^X of the exclusive form, Gv over V), the chunks' gate spans, the pre-gated q and k,
# the chunk states, and per mode and gate kind the stored scores A (chunk, gk alone), the fp32
# output o32 (chunk, gv) or its intra- and inter-chunk parts o_in, o_x (fused_chunk, gv).
INPUTS = ("q", "k", "v", "u", "S0")
OUTPUTS = ("S_T",)
PRODUCED = ("Gk", "Gx", "Gv", "spans", "QG", "KG", "states", "A", "o32", "o_in", "o_x")
SAVED = INPUTS + OUTPUTS + PRODUCED


def kept(*, fused: bool, exclusive: bool, has_gv: bool, dtype: torch.dtype,
         V: int) -> dict[str, bool]:  # fmt: skip
    """Which of :data:`PRODUCED` a call makes (from its flags alone: the custom ops' fake
    implementations use it too)."""
    chunk, pre = not fused, _pre_gate(has_gv, fused, V)
    return dict(
        Gk=True, Gx=exclusive, Gv=has_gv, spans=_fast_chunks(has_gv, fused, dtype), QG=pre,
        KG=pre, states=chunk, A=chunk and not has_gv, o32=chunk and has_gv,
        o_in=fused and has_gv, o_x=fused and has_gv,
    )  # fmt: skip


def forward(q, k, v, gk, gv, u, S0, cfg: ChunkConfig):
    """One forward: ``((o, S_T), saved)``. q, k ``[B, T, H, K]``, v ``[B, T, H, V]``
    (fp16/bf16/fp32); gk ``[B, T, H, K]`` log decay over K, gv ``[B, T, H, V]`` over V or None,
    u ``[H, K]`` RWKV6's bonus (``cfg.excl``) or None, S0 ``[N, H, K, V]`` or None."""
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    has_gv = gv is not None
    has = kept(fused=cfg.fused, exclusive=cfg.excl, has_gv=has_gv, dtype=cfg.dtype,
               V=v.shape[3])  # fmt: skip
    gate = (q, k, torch.empty_like(q), torch.empty_like(k)) if has["QG"] else None
    Gk, Gx, spans = _cumsums(gk, cfg, exclusive=cfg.excl, span=has["spans"], gate=gate)
    Gv = _cumsums(gv, cfg, exclusive=False)[0] if has_gv else None
    QG, KG = gate[2:] if gate is not None else (None, None)
    u = u.float().contiguous() if u is not None else None
    S0 = S0.float().contiguous() if S0 is not None else None
    if cfg.fused:
        o, S_T, made = _forward_fused(q, k, v, Gk, Gx, Gv, u, S0, cfg)
    else:
        o, S_T, made = _forward_chunk(q, k, v, Gk, Gx, Gv, u, S0, cfg, spans, QG, KG)
    made.update(Gk=Gk, Gx=Gx, Gv=Gv, spans=spans, QG=QG, KG=KG)
    saved = dict(q=q, k=k, v=v, u=u, S0=S0, S_T=S_T)
    saved.update({name: made.get(name) if has[name] else None for name in PRODUCED})
    return (o, S_T), saved


def backward(saved: dict, cfg: ChunkConfig, do, dS_T, slow=None):
    """The gradients ``(dq, dk, dv, dgk, dgv, du, dS0)`` of one call from what :func:`forward`
    saved and the outputs' cotangents (dS_T may be None; None where an input was None).
    ``slow``: :func:`slow_chunks` of ``saved``, to leave out the sub-chunk launches of a call
    whose chunks are all fast (None: they run)."""
    s, c = saved, cfg
    q, k, v, u, S_T = s["q"], s["k"], s["v"], s["u"], s["S_T"]
    do = do.contiguous()
    if c.fused:
        g = _backward_fused(s, c, do, dS_T)
    else:
        g = _backward_chunk(s, c, do, dS_T, slow)
    end_k = end_v = None
    if c.fused:  # tails from the chunks' inter-chunk totals
        if dS_T is not None:
            end_k = (dS_T.float() * S_T).sum(-1)
            end_v = (dS_T.float() * S_T).sum(-2)
        dgk = _revsum(g["qdq"] - g["kdk"], None, end_k, c, g["tot_k"])
        du = None
        if c.excl:  # the query-side term is exclusive: q ⊙ dq less its bonus part u ⊙ W
            w, du = _bonus(q, k, v, do, c.scale)
            dgk = dgk.sub_(g["qdq"]).addcmul_(w, u)
    else:  # one pass from the exact chunk-end tails (W_k: [B·H, NT, K])
        dgk, du = _decay_grad(q, k, v, do, u, g["qdq"], g["kdk"], g["W_k"], g["dov"], c)
    dgv = None
    if s["Gv"] is not None:
        # fused: the kernel's o ⊙ do − v ⊙ dv (rounding-matched); chunk: from the fp32 output
        odo_vdv = g["vdv"] if c.fused else s["o32"] * do.float() - g["vdv"]
        dgv = _revsum(odo_vdv, g.get("W_v"), end_v, c, g.get("tot_v"))
    dS0 = g["dS0"] if s["S0"] is not None else None
    return g["dq"], g["dk"], g["dv"], dgk, dgv, du, dS0


def slow_chunks(saved: dict):
    """The host's flag of whether a call has chunks that are not fast (:class:`_SlowChunks`), for
    :func:`backward`; None where the call has no fast chunks or a CUDA graph is captured."""
    return _SlowChunks.make(saved["spans"])


class VectorChunkFunction(torch.autograd.Function):
    """The autograd Function of :func:`forward` / :func:`backward` (eager calls)."""

    @staticmethod
    def forward(ctx, q, k, v, gk, gv, u, S0, cfg: ChunkConfig):
        outputs, saved = forward(q, k, v, gk, gv, u, S0, cfg)
        ctx.cfg, ctx.names = cfg, tuple(saved)
        ctx.slow = slow_chunks(saved) if any(ctx.needs_input_grad) else None
        ctx.save_for_backward(*saved.values())
        return outputs

    @staticmethod
    def backward(ctx, do, dS_T):
        saved = dict(zip(ctx.names, ctx.saved_tensors))
        return (*backward(saved, ctx.cfg, do, dS_T, ctx.slow), None)


def config(q, k, v, *, scale, exclusive, chunk_size, fused, offsets) -> ChunkConfig:
    """The :class:`ChunkConfig` of a vector-gate call (``exclusive``: RWKV6's form, with u)."""
    c = ChunkConfig(
        q, k, v, scale=scale, has_decay=False, has_igate=False, stabilize=False, track_n=False,
        normalizer=None, eps=0.0, chunk_size=chunk_size, fused=fused, offsets=offsets,
        vector=True,
    )  # fmt: skip
    c.excl = exclusive
    return c


def chunk(q, k, v, *, scale, g, gv=None, u=None, S0=None, chunk_size=None, fused=False,
          offsets=None):  # fmt: skip
    """Vector-gate chunkwise forward (autograd-enabled). q, k ``[B, T, H, K]``, v ``[B, T, H,
    V]`` fp16/bf16/fp32; g ``[B, T, H, K]`` log decay over K, gv ``[B, T, H, V]`` over V, u
    ``[H, K]`` the bonus (exclusive form; not with gv); S0 ``[N, H, K, V]``. ``fused``: the
    non-materializing kernels. ``offsets``: packed sequences. Returns ``(o, S_T)``."""
    if u is not None and gv is not None:
        raise NotImplementedError("the Triton chunk engine has no exclusive form with gv")
    c = config(q, k, v, scale=scale, exclusive=u is not None, chunk_size=chunk_size,
               fused=fused, offsets=offsets)  # fmt: skip
    return VectorChunkFunction.apply(q, k, v, g, gv, u, S0, c)


class _SlowChunks:
    """Whether a call has chunks that are not fast, for the host. The sub-chunk programs of dq and
    dk (vector_kernels.dq_bwd_kernel, dk_bwd_kernel) exit at once in fast chunks, so when every
    chunk is fast their launches are all overhead (262,144 programs at GLA B8-T8192-H16-K256). The
    forward reduces the spans on the device and copies the answer to pinned host memory behind an
    event; the backward waits for that event, which lies before everything the forward and the
    backward queued since (the GPU keeps working meanwhile, so nothing idles), and leaves the two
    launches out if no chunk is slow. While a CUDA graph is captured there is no flag (the launches
    stay). The criterion is the kernels' own: a chunk is fast iff span < CHUNK_SPAN, so a NaN span
    counts as slow (a non-finite gate gives +inf, vector_cumsum_kernels)."""

    def __init__(self, spans):
        any_slow = (~(spans < CHUNK_SPAN)).any()
        self.event = None
        if spans.device.type == "cuda":
            self.host = torch.empty((), dtype=torch.bool, pin_memory=True)
            self.host.copy_(any_slow, non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record()
        else:
            self.host = any_slow

    @staticmethod
    def make(spans):
        """For the spans of a call with fast chunks; None while a CUDA graph is captured."""
        if spans is None or (spans.is_cuda and torch.cuda.is_current_stream_capturing()):
            return None
        return _SlowChunks(spans)

    def none(self) -> bool:
        """Whether every chunk is fast (False while a CUDA graph is captured)."""
        if self.event is not None:
            if torch.cuda.is_current_stream_capturing():
                return False
            self.event.synchronize()
        return not bool(self.host)


def _fit(x: int, n: int) -> int:
    return max(16, min(x, next_pow2(max(n, 1))))


def _cumsums(g, c: ChunkConfig, exclusive: bool, span: bool = False, gate=None):
    """Chunk-local inclusive (and, ``exclusive``, exclusive) cumulative sums of a [B, T, H, D]
    log decay, fp32, in one Triton pass (vector_cumsum_kernels; packed sequences: chunks from
    the table). The exclusive sum holds exactly the inclusive one's values, shifted by one step.
    Returns (inc, exc, spans), exc = inc when not ``exclusive``; spans ([NT, B·H] fp32, the
    chunks' gate spans) with ``span``, else None. ``gate`` = (q, k, QG, KG)
    (:func:`_gate_buffers`): the pass also fills QG and KG (its GATE_QK)."""
    T, H, D = g.shape[1:]
    g = g.contiguous()
    inc = torch.empty(g.shape, device=g.device, dtype=torch.float32)
    exc = torch.empty_like(inc) if exclusive else inc
    spans = torch.zeros(c.NT, c.rows, device=g.device, dtype=torch.float32) if span else None
    BT, BD = _fit(64, c.L), _fit(64, D)
    q, k, qg, kg = gate if gate is not None else (None,) * 4
    cs.chunk_cumsum_kernel[(c.NT, cdiv(D, BD), c.rows)](
        G=g, INC=inc, EXC=exc if exclusive else None, SPAN=spans, CHUNKS=c.CHUNKS, Q=q, K_=k,
        QG=qg, KG=kg, T=T, H=H, D=D, L=c.L, BT=BT, BD=BD, VARLEN=c.varlen, EXCL=exclusive,
        HAS_SPAN=span, GATE_QK=gate is not None, num_warps=4,
    )  # fmt: skip
    return inc, exc, spans


def _padded(x, c: ChunkConfig):
    """[B, T, H, D] → [B, NT, L, H, D] (each chunk's tokens, zero padded) and the inverse."""
    B, T, H, D = x.shape
    L, NT = c.L, c.NT
    if c.varlen:
        idx = c.tok_chunk * L + (torch.arange(T, device=x.device) - c.tok_start)
        y = x.new_zeros(NT * L, H, D).index_copy_(0, idx, x[0])
        back = lambda z: z.reshape(NT * L, H, D).index_select(0, idx)[None]  # noqa: E731
        return y.view(1, NT, L, H, D), back
    y = F.pad(x, (0, 0, 0, 0, 0, NT * L - T)).view(B, NT, L, H, D)
    return y, lambda z: z.reshape(B, NT * L, H, D)[:, :T]


def _revsum(x, W, end, c: ChunkConfig, totals=None):
    """Σ_{t≥u} x_t within u's sequence ([B, T, H, D], fp32 result): a reverse sum restarted at
    every chunk end from W ([B, NT, H, D], the exact tail after each chunk), or — W None — from
    the later chunks' totals summed in fp64 plus ``end`` ([N, H, D]) after each sequence. The
    totals are ``totals`` where given (fused_chunk: each chunk's inter-chunk terms alone, whose
    intra-chunk pairs would cancel anyway), else the chunks' sums of x."""
    y, back = _padded(x.float(), c)
    local = y.flip(2).cumsum(2).flip(2)  # [B, NT, L, H, D]
    if W is None:
        tot = (local[:, :, 0] if totals is None else totals).double()  # each chunk's total
        NT = c.NT
        if c.varlen:
            rc = F.pad(tot.flip(1).cumsum(1).flip(1), (0, 0, 0, 0, 0, 1))  # [1, NT + 1, H, D]
            rows = c.CHUNKS.view(-1, 3).long()
            seq = rows[:, 2]
            co = torch.as_tensor(c.CO, device=x.device).long()
            W = rc[:, :NT] - tot - rc[:, co[1:][seq]]
            if end is not None:
                W = W + end.double()[seq][None]
            W = W * (rows[:, 1] > rows[:, 0]).double()[None, :, None, None]
        else:
            W = tot.flip(1).cumsum(1).flip(1) - tot
            if end is not None:
                W = W + end.double()[:, None]
    return back(local + W.float()[:, :, None])


def _dov(do, v):
    """do_t·v_t per token ([B, T, H] fp32): RWKV6's bonus weight."""
    return (do.float() * v.float()).sum(-1)


def _bonus(q, k, v, do, scale):
    """RWKV6 in fused_chunk: W = scale·q ⊙ k (do·v) per token ([B, T, H, K] fp32; the bonus
    part of q ⊙ dq is u ⊙ W) and du = Σ_{B,T} W. In place on one fp32 buffer: at 65,536
    tokens × H·K = 4096 each full-size temporary is 1 GB. (Chunk mode: vector_gate_grad_kernels.)"""
    w = q.to(torch.float32, copy=True)  # a fresh buffer: q.float() may be q itself
    w = w.mul_(k).mul_(_dov(do, v).mul_(scale)[..., None])
    return w, w.sum((0, 1))


def _decay_grad(q, k, v, do, u, qdq, kdk, W, dov, c: ChunkConfig):
    """Chunk mode's gk gradient and RWKV6's du in one pass (vector_gate_grad_kernels): q ⊙ dq − k ⊙
    dk reverse-summed in each chunk from the exact tail W ([B·H, NT, K]), with the bonus terms for
    the exclusive form. ``dov``: do·v per token when the backward stored it, else formed here.
    Returns (dg [B, T, H, K] fp32, du [H, K] fp32 or None)."""
    T, H, K = q.shape[1:]
    f32 = dict(device=q.device, dtype=torch.float32)
    dg = torch.empty(q.shape, **f32)
    du_rows = torch.empty(c.rows, c.NT, K, **f32) if c.excl else None
    if c.excl and dov is None:
        dov = _dov(do, v)
    BT, BD = _fit(64, c.L), _fit(64, K)
    gg.decay_grad_kernel[(c.NT, cdiv(K, BD), c.rows)](
        QD=qdq, KD=kdk, W=W, Q=q, K=k, DOV=dov if c.excl else None, U=u if c.excl else None,
        DG=dg, DU=du_rows, CHUNKS=c.CHUNKS, T=T, H=H, D=K, L=c.L, NT=c.NT, scale=c.scale, BT=BT,
        BD=BD, VARLEN=c.varlen, EXCL=c.excl, num_warps=4,
    )  # fmt: skip
    du = du_rows.view(-1, H, c.NT, K).sum((0, 2)) if c.excl else None
    return dg, du


def _forward_chunk(q, k, v, Gk, Gx, Gv, u, S0, c: ChunkConfig, spans, QG, KG):
    """Chunk mode's forward: (o, S_T, {states, and A or o32}). ``spans``: the fast chunks'
    gate spans (or None); QG, KG: the pre-gated q and k (or None)."""
    T, H, K = q.shape[1:]
    V = v.shape[3]
    f32 = dict(device=q.device, dtype=torch.float32)
    has_gv = Gv is not None
    states = torch.empty(c.rows, c.NT, K, V, **f32)
    S_T = torch.empty(c.N, H, K, V, **f32)
    BS, BK, BV, nw, ns = VEC_TILES["states_gv" if has_gv else "states"]
    BS, BK, BV = _fit(BS, c.L), _fit(BK, K), _fit(BV, V)
    vk.states_fwd_kernel[(cdiv(K, BK), cdiv(V, BV), c.walkers)](
        k=k if KG is None else KG, v=v, gk=Gk, gv=Gv, h0=S0, h=states, ht=S_T,
        co=c.CO, chunks=c.CHUNKS, T=T, H=H, K=K, V=V, L=c.L, NT=c.NT, NSEQ=c.NSEQ, BK=BK, BV=BV,
        BS=BS, USE_GV=has_gv, HAS_H0=S0 is not None, PRE_GATED=KG is not None,
        DOT_PREC=c.prec, VARLEN=c.varlen, ONE_TILE=c.L <= BS, num_warps=nw, num_stages=ns,
    )  # fmt: skip
    o = torch.empty_like(v, dtype=q.dtype)
    if not has_gv:  # gk alone: the scores stored, applied with wide row tiles
        A = _scores(q, k, Gx, Gk, u, c, spans=spans)
        pre = QG is not None
        _apply(A, v, QG if pre else q, states, Gx, o, c, rev=False, pre_gated=pre)
        return o, S_T, dict(states=states, A=A)
    BC, BS, BD, _, nw, ns = VEC_TILES["rows"]
    BS, BD, BO = _fit(BS, c.L), _fit(BD, K), _fit(GATED_BO, V)
    NQ = cdiv(c.L, BC)
    o32 = torch.empty(v.shape, **f32)  # for gv's gradient
    vk.out_fwd_kernel[(c.NT * NQ, cdiv(V, BO), c.rows)](
        q=q, k=k, v=v, h=states, gkx=Gx, gk=Gk, gv=Gv, o=o, o32=o32, chunks=c.CHUNKS, T=T, H=H,
        K=K, V=V, L=c.L, NT=c.NT, NQ=NQ, scale=c.scale, BQ=BC, BS=BS, BD=BD, BO=BO, **_diag(c),
        DOT_PREC=c.prec, VARLEN=c.varlen, num_warps=nw, num_stages=ns,
    )  # fmt: skip
    return o, S_T, dict(states=states, o32=o32)


def _scores(q, k, Gx, Gk, u, c: ChunkConfig, gated: bool = True, spans=None):
    """The intra-chunk scores A ([B, T, H, L], q's dtype; vector_scores_kernels), or
    (``gated`` False; q, k = do, v) the backward's ungated do vᵀ in fp32, diagonal included.
    ``spans`` (the chunks' gate spans): the fast chunks' scores by fast_scores_kernel."""
    B, T, H, K = q.shape
    L = c.L
    dtype = q.dtype if gated else torch.float32
    A = torch.empty(B, T, H, L, device=q.device, dtype=dtype)
    BC, BS, BD, nw, ns = SCORE_TILES["scores" if gated else "dscores"]
    BS, BD = _fit(BS, L), _fit(BD, K)
    if not gated:  # one sub-chunk per chunk: no more rows than the chunk has
        BC = _fit(BC, L)
    NQ = cdiv(L, BC)
    fast = gated and spans is not None
    excl = c.excl and gated  # (the ungated P's mask holds the diagonal either way)
    sc.scores_kernel[(c.NT * NQ, c.rows)](
        X=q, Y=k, GX=Gx if gated else None, GK=Gk if gated else None, U=u if excl else None,
        A=A, SPAN=spans if fast else None, CHUNKS=c.CHUNKS, T=T, H=H, D=K, L=L, NT=c.NT, NQ=NQ,
        BQ=BC, BS=BS, BD=BD, VARLEN=c.varlen, EXCL=excl, **_diag(c), DOT_PREC=c.prec,
        GATED=gated, SKIP=CHUNK_SPAN if fast else 0.0, num_warps=nw, num_stages=ns,
    )  # fmt: skip
    if fast:
        BQ, BS, BD, nw, ns = SCORE_TILES["fast"]
        BQ, BS, BD = _fit(BQ, L), _fit(BS, L), _fit(BD, K)
        NQ = cdiv(L, BQ)
        sc.fast_scores_kernel[(c.NT * NQ, c.rows)](
            X=q, Y=k, GX=Gx, GK=Gk, U=u if c.excl else None, A=A, SPAN=spans, CHUNKS=c.CHUNKS,
            T=T, H=H, D=K, L=L, NT=c.NT, NQ=NQ, BQ=BQ, BS=BS, BD=BD, VARLEN=c.varlen,
            EXCL=c.excl, DOT_PREC=c.prec, LIM=CHUNK_SPAN, num_warps=nw, num_stages=ns,
        )  # fmt: skip
    return A


def _diagonal(P, c: ChunkConfig):
    """P[b, t, h, t − (t's chunk start)]: the diagonal of stored scores ([B, T, H] fp32)."""
    B, T, H, _ = P.shape
    t = torch.arange(T, device=P.device)
    col = t - c.tok_start if c.varlen else t % c.L
    return P.gather(3, col.view(1, T, 1, 1).expand(B, T, H, 1)).squeeze(3).float()


def _apply(A, z, x, st, g, out, c: ChunkConfig, rev: bool, inter: bool = False, fast=None,
           pre_gated: bool = False):  # fmt: skip
    """out = scale·(A z + (x ⊙ e^g) S), or (``rev``, dv) scale·Aᵀ z + (x ⊙ e^{g_L − g}) dS
    (vector_scores_kernels.apply_kernel). ``inter`` (A, z None): dq's inter-chunk part (x = do,
    S the states entering the chunks, g = G^X) or, ``rev``, dk's (x = v, S the state gradients
    leaving them, g = G^K), gated over the output, fp32, unscaled ("inter" tiles); with
    ``fast`` = (P, z, other gate, u, dq or dk, q or k, spans) the fast chunks' whole dq / dk
    too (apply_kernel's FAST). ``pre_gated``: x is q ⊙ e^g (``rev``: k ⊙ e^{g_L − g}) already
    (vector_cumsum_kernels' GATE_QK)."""
    T, H, D = x.shape[1:]
    O = out.shape[3]
    if inter:
        BQ, BD, BO, nw, ns = SCORE_TILES["inter"]
        BS, s_sd, s_so = 16, 1, D  # S = Cᵀ / dCᵀ
    else:
        BQ, BS, BD, BO, nw, ns = SCORE_TILES["apply"]
        s_sd, s_so = O, 1
    go = u = fout = fd = spans = None
    if fast is not None:
        A, z, go, u, fout, fd, spans = fast
        BS = 64  # the fast chunks' key (dk: query) tile
    BQ, BS, BD, BO = _fit(BQ, c.L), _fit(BS, c.L), _fit(BD, D), _fit(BO, O)
    NQ = cdiv(c.L, BQ)
    excl = c.excl and fast is not None
    args = dict(
        A=A, Z=z, X=x, ST=st, G=g, OUT=out, CHUNKS=c.CHUNKS, GO=go, U=u if excl else None,
        FOUT=fout, FD=fd, SPAN=spans, T=T, H=H, D=D, O=O, L=c.L, NT=c.NT, NQ=NQ, scale=c.scale,
        s_sd=s_sd, s_so=s_so, BQ=BQ, BS=BS, BD=BD, BO=BO, REV=rev, VARLEN=c.varlen,
        DOT_PREC=c.prec, INTER=inter, FAST=CHUNK_SPAN if fast is not None else 0.0, EXCL=excl,
        PRE_GATED=pre_gated, num_warps=nw, num_stages=ns,
    )  # fmt: skip
    grid = (c.NT * NQ, cdiv(O, BO), c.rows)
    if rev or inter:  # no diagonal product of values after the rows
        sc.apply_kernel[grid](**args)
    else:
        fix_pass.launch(sc.apply_kernel, grid, out.device, **args)


def _backward_chunk(s: dict, c: ChunkConfig, do, dS_T, slow) -> dict:
    """Chunk mode's backward from the saved tensors ``s``: dq, dk, dv, dS0 and the gate
    gradients' parts (qdq = q ⊙ dq, kdk = k ⊙ dk, vdv = v ⊙ dv fp32; the exact chunk-end tails
    W_k, W_v; do·v per token for RWKV6's bonus, dov), by name."""
    q, k, v, u, S_T, states = s["q"], s["k"], s["v"], s["u"], s["S_T"], s["states"]
    Gk, Gv, spans, QG, KG = s["Gk"], s["Gv"], s["spans"], s["QG"], s["KG"]
    Gx = s["Gx"] if c.excl else Gk
    T, H, K = q.shape[1:]
    V = v.shape[3]
    L = c.L
    f32 = dict(device=q.device, dtype=torch.float32)
    has_gv = Gv is not None
    has_dst, dS_T, _ = final_grads(dS_T, None, q, K, V, c)
    # Every reader of the state gradients takes them into products in the inputs' dtype
    # (cast on load), so they are stored in it: the same operands, half the bytes for bf16.
    dstates = torch.empty(c.rows, c.NT, K, V, device=q.device, dtype=q.dtype)
    dS0 = torch.empty(c.N, H, K, V, **f32)
    BS, BK, BV, nw, ns = VEC_TILES["states_gv" if has_gv else "states"]
    BS, BK, BV = _fit(BS, L), _fit(BK, K), _fit(BV, V)
    grid = (cdiv(K, BK), cdiv(V, BV), c.walkers)
    bndk = torch.zeros(c.rows, c.NT, grid[1], K, **f32)
    bndv = torch.zeros(c.rows, c.NT, grid[0], V, **f32) if has_gv else None
    vk.states_bwd_kernel[grid](
        q=q if QG is None else QG, do=do, gkx=Gx, gk=Gk, gv=Gv, h=states, ht=S_T,
        dht=dS_T if has_dst else None, dh=dstates, dh0=dS0, bnd_k=bndk, bnd_v=bndv, co=c.CO,
        chunks=c.CHUNKS, T=T, H=H, K=K, V=V, L=L, NT=c.NT, NSEQ=c.NSEQ, scale=c.scale, BK=BK,
        BV=BV, BS=BS, USE_GV=has_gv, HAS_DHT=has_dst, PRE_GATED=QG is not None,
        DOT_PREC=c.prec, VARLEN=c.varlen, num_warps=nw, num_stages=ns,
    )  # fmt: skip
    # gk alone, the forward's scores stored: do vᵀ stored once too, loaded by dq and dk, and
    # their inter-chunk parts formed first with wide row tiles (into qdq and kdk)
    dP = _scores(do, v, Gx, Gk, None, c, gated=False) if not has_gv else None
    fast = spans is not None  # the fast chunks' dq and dk in apply_kernel
    # every chunk fast (_SlowChunks): the sub-chunk programs would all exit
    sub_chunks = not (fast and slow is not None and slow.none())
    u_ = u if c.excl else None
    sub = dict(
        gv=Gv, gkx=Gx, gk=Gk, u=u_, spans=spans if fast else None, chunks=c.CHUNKS, T=T, H=H,
        K=K, V=V, L=L, NT=c.NT, scale=c.scale, USE_GV=has_gv, EXCL=c.excl,
        SKIP=CHUNK_SPAN if fast else 0.0, **_diag(c), DOT_PREC=c.prec, VARLEN=c.varlen,
    )  # fmt: skip
    dq = torch.empty_like(q)
    qdq = torch.empty(q.shape, **f32)
    if not has_gv:
        _apply(None, None, do, states, Gx, qdq, c, rev=False, inter=True,
               fast=(dP, k, Gk, u_, dq, q, spans) if fast else None)  # fmt: skip
    BC, BS, BD, _, nw, ns = VEC_TILES["rows"]
    BS, BD, BO = _fit(BS, L), _fit(BD, V), _fit(GATED_BO, K)
    NQ = cdiv(L, BC)
    if sub_chunks:
        vk.dq_bwd_kernel[(c.NT * NQ, cdiv(K, BO), c.rows)](
            do=do, v=v if has_gv else None, dp=dP, k=k, q=q, h=states if has_gv else None, dq=dq,
            qdq=qdq, NQ=NQ, BQ=BC, BS=BS, BD=BD, BO=BO, **sub, num_warps=nw, num_stages=ns,
        )  # fmt: skip
    dk = torch.empty_like(k)
    kdk = torch.empty(k.shape, **f32)
    if not has_gv:
        _apply(None, None, v, dstates, Gk, kdk, c, rev=True, inter=True,
               fast=(dP, q, Gx, u_, dk, k, spans) if fast else None)  # fmt: skip
    BC, BQ, BD, _, nw, ns = VEC_TILES["cols"]
    BQ, BD, BO = _fit(BQ, L), _fit(BD, V), _fit(GATED_BO, K)
    NS = cdiv(L, BC)
    if sub_chunks:
        vk.dk_bwd_kernel[(c.NT * NS, cdiv(K, BO), c.rows)](
            v=v, do=do if has_gv else None, dp=dP, q=q, k=k, dh=dstates if has_gv else None,
            dk=dk, kdk=kdk, NS=NS, BS=BC, BQ=BQ, BD=BD, BO=BO, **sub, num_warps=nw,
            num_stages=ns,
        )  # fmt: skip
    dv = torch.empty_like(v)
    vdv = None
    if not has_gv:  # the forward's stored scores: dv = scale·Aᵀ do + …
        pre = KG is not None
        _apply(s["A"], do, KG if pre else k, dstates, Gk, dv, c, rev=True, pre_gated=pre)
    else:
        BD, BO = _fit(BD, K), _fit(GATED_BO, V)
        vdv = torch.empty(v.shape, **f32)
        vk.dv_bwd_kernel[(c.NT * NS, cdiv(V, BO), c.rows)](
            k=k, q=q, do=do, v=v, dh=dstates, gkx=Gx, gk=Gk, gv=Gv, dv=dv, vdv=vdv,
            chunks=c.CHUNKS, T=T, H=H, K=K, V=V, L=L, NT=c.NT, NS=NS, scale=c.scale, BS=BC,
            BQ=BQ, BD=BD, BO=BO, **_diag(c), DOT_PREC=c.prec, VARLEN=c.varlen, num_warps=nw,
            num_stages=ns,
        )  # fmt: skip
    return dict(
        dq=dq, dk=dk, dv=dv, dS0=dS0, qdq=qdq, kdk=kdk, vdv=vdv,
        W_k=bndk.sum(2),  # [B·H, NT, K]: the rows vector_gate_grad_kernels reads
        W_v=bndv.sum(2).view(-1, H, c.NT, V).transpose(1, 2) if has_gv else None,  # as _revsum
        dov=_diagonal(dP, c) if dP is not None else None,  # do_t·v_t, for RWKV6's bonus
    )  # fmt: skip


def _fused_common(c: ChunkConfig, has_gv: bool):
    """The constexprs and launch options fused_kernels' kernels share in a vector-gate call."""
    BC, _, BD, _, nw, ns = VEC_TILES["fused"]
    return dict(
        co=c.CO, chunks=c.CHUNKS, L=c.L, NT=c.NT, NSEQ=c.NSEQ, scale=c.scale, BT=c.BT,
        DOT_PREC=c.prec, VARLEN=c.varlen, VEC=True, VEC_V=has_gv, EXCL=c.excl, **_diag(c), BC=BC,
        BD=BD, num_warps=nw, num_stages=ns,
    )  # fmt: skip


def _forward_fused(q, k, v, Gk, Gx, Gv, u, S0, c: ChunkConfig):
    """fused_chunk's forward: (o, S_T, {o_in, o_x} with gv)."""
    T, H, K = q.shape[1:]
    V = v.shape[3]
    f32 = dict(device=q.device, dtype=torch.float32)
    has_gv = Gv is not None
    S_T = torch.empty(c.N, H, K, V, **f32)
    o = torch.empty_like(v, dtype=q.dtype)
    # For gv's gradient: the output's intra- and inter-chunk parts (fp32), see fused_dv_kernel
    o_in = torch.empty(v.shape, **f32) if has_gv else None
    o_x = torch.empty(v.shape, **f32) if has_gv else None
    fused.fused_fwd_kernel[(cdiv(V, c.BVf), c.walkers)](
        q=q, k=k, v=v, o=o, h0=S0, ht=S_T, T=T, H=H, K=K, V=V, BK=c.KP, BV=c.BVf,
        HAS_H0=S0 is not None, gk=Gk, gkx=Gx, gv=Gv, u=u if c.excl else None, o_in=o_in, o_x=o_x,
        SPLIT=has_gv and q.dtype != torch.float32,  # gv's gradient: see _backward_fused
        **_fused_common(c, has_gv),
    )  # fmt: skip
    return o, S_T, (dict(o_in=o_in, o_x=o_x) if has_gv else {})


def _backward_fused(s: dict, c: ChunkConfig, do, dS_T) -> dict:
    """fused_chunk's backward from the saved tensors ``s``: dq, dk, dv, dS0 and the gate
    gradients' parts (qdq, kdk; vdv = o ⊙ do − v ⊙ dv with gv) with each chunk's inter-chunk
    totals (tot_k of q ⊙ dq − k ⊙ dk, tot_v), by name."""
    q, k, v, S0 = s["q"], s["k"], s["v"], s["S0"]
    Gk, Gv = s["Gk"], s["Gv"]
    Gx = s["Gx"] if c.excl else Gk
    T, H, K = q.shape[1:]
    V = v.shape[3]
    f32 = dict(device=q.device, dtype=torch.float32)
    has_gv = Gv is not None
    has_dst, dS_T, _ = final_grads(dS_T, None, q, K, V, c)
    dht = dS_T if has_dst else None
    gates = dict(gk=Gk, gkx=Gx, gv=Gv, u=s["u"] if c.excl else None, T=T, H=H, K=K, V=V,
                 **_fused_common(c, has_gv))  # fmt: skip
    # 16-bit products with the fp32 state as hi + lo: the gate gradients are whole-sequence
    # sums of o·do − v·dv (gv) and q·dq − k·dk (gk) whose cross-chunk terms cancel only if
    # both sides see the state at (nearly) fp32 precision, so the forward's and dv's
    # inter-chunk products are split too when gv is there.
    split = q.dtype != torch.float32
    nK = cdiv(K, c.BKf)
    dq = torch.empty_like(q)
    qdq = torch.empty(q.shape, **f32)
    # Per chunk, the inter-chunk parts of q⊙dq, k⊙dk (and o⊙do − v⊙dv): the tails the gate
    # gradients' reverse sums restart from (fused_kernels._store_total)
    B, NT = q.shape[0], c.NT
    q_tot = torch.empty(B, NT, H, K, **f32)
    k_tot = torch.empty(B, NT, H, K, **f32)
    v_tot = torch.empty(B, NT, H, V, **f32) if has_gv else None
    fused.fused_dq_kernel[(nK, c.walkers)](
        q=q, k=k, v=v, do=do, dq=dq, h0=S0, qdq=qdq, tot=q_tot, BK=c.BKf, BV=c.VP,
        HAS_H0=S0 is not None, SPLIT=split, **gates,
    )  # fmt: skip
    dk = torch.empty_like(k)
    kdk = torch.empty(k.shape, **f32)
    dS0 = torch.empty(c.N, H, K, V, **f32)
    fused.fused_dk_kernel[(nK, c.walkers)](
        q=q, k=k, v=v, do=do, dk=dk, dh0=dS0, dht=dht, kdk=kdk, tot=k_tot, BK=c.BKf, BV=c.VP,
        HAS_DHT=has_dst, SPLIT=split, **gates,
    )  # fmt: skip
    dv = torch.empty_like(v)
    # With gv: o ⊙ do − v ⊙ dv per step (fp32), ready for the reverse sum
    vdv = torch.empty(v.shape, **f32) if has_gv else None
    fused.fused_dv_kernel[(cdiv(V, c.BVf), c.walkers)](
        q=q, k=k, do=do, dv=dv, dht=dht, v=v if has_gv else None, vdv=vdv, o_in=s["o_in"],
        o_x=s["o_x"], tot=v_tot, BK=c.KP, BV=c.BVf, HAS_DHT=has_dst, SPLIT=split and has_gv,
        **gates,
    )  # fmt: skip
    return dict(
        dq=dq, dk=dk, dv=dv, dS0=dS0, qdq=qdq, kdk=kdk, vdv=vdv,
        tot_k=q_tot - k_tot, tot_v=v_tot,
    )  # fmt: skip
