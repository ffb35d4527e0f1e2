"""Host side of the Triton chunk engine for scalar gates (per-channel decays: triton_chunk_vec,
which reuses Config and the helpers here): tile choice, launches, the autograd
Function and the gate gradients (which are cheap [B·H, T] reductions done in PyTorch).

Gate gradients. With the max state m held fixed, every log decay g_t enters through the global
cumulative sum F_t, with +F_t beside q_t and −F_t beside k_t, so

    ∂L/∂F_t = q_t·dq_t − k_t·dk_t  (+ ⟨dS_T, S_T⟩ + ⟨dn_T, n_T⟩ at the last step),
    ∂L/∂g_u = Σ_{t≥u} ∂L/∂F_t,       ∂L/∂a_s = k_s·dk_s  (a: log input gate).

The kernels return the per-tile partial sums of q·dq and k·dk. In chunk mode the reverse sum
restarts at every chunk end from the exact value ⟨dC, C⟩ + ⟨dn, n⟩ of the state there (the
materialized states and their gradients give it), so rounding errors in the largely cancelling
terms do not pile up over the sequence. mLSTM-exp adds the gradient
through m itself: m_t = F_t + max(m_0, max_{s≤t}(a_s − F_s)) reaches the output only through
eps (and the final state through its stabilized scale), and routes to F_t and to the argmax.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from linrnn.engine import triton_fused as fused
from linrnn.engine import triton_kernels as kern
from linrnn.engine.host_math import cdiv, next_pow2

FUSED_MAX_CHUNK = 128


def default_chunk_size(K: int, V: int, fused: bool, vector: bool = False) -> int:
    """L when the caller gives none. chunk: 128 for head dims ≥ 128 (the H200 optimum at
    K = V = 256, where fewer chunk states save more memory traffic than the longer intra-chunk
    products cost), else 64; per-channel decays (``vector``: GLA, RWKV6) 128 for head dims ≥
    256, else 64 (H200, session 11, one run each at ed3f959, benchmarks/results/s11/call8-
    and call9-ed3f959/: GLA fwd+bwd at B8-T8192-H16-K256 18.8 ms at L = 128 against 19.4 at
    64, with 17 % less peak memory, 13,172 against 15,876 MiB; at H32-K128 16.0 against 15.0).
    fused_chunk: 64 (one chunk is one register tile)."""
    if fused:
        return 64
    if vector:
        return 128 if max(K, V) >= 256 else 64
    return 128 if max(K, V) >= 128 else 64


# Per kernel: (time tile, depth tile, output tile, num_warps, num_stages), each clipped to the
# problem. Depth/output are K/V for the forward kernels, V/K for dq and dk. Tuned on the GPU
# machine with benchmarks/engine_sweep.py (which overrides entries to search).
TILES = {
    "states_fwd": (64, 64, 256, 4, 2),
    "rows_fwd": (64, 32, 256, 4, 3),
    "states_bwd": (64, 32, 256, 4, 2),
    "rows_dq": (64, 64, 128, 4, 2),
    "cols_dk": (64, 64, 256, 8, 3),
    "cols_dv": (64, 32, 256, 8, 3),
    "fused": (0, 0, 0, 4, 1),
}


class Config:
    """Compile-time switches and tile sizes of one call."""

    def __init__(self, q, k, v, *, scale, has_decay, has_igate, stabilize, track_n,
                 normalizer, eps, chunk_size, fused=False, offsets=None):  # fmt: skip
        B, T, H, K, V = q.shape[0], q.shape[1], q.shape[2], q.shape[3], v.shape[3]
        self.fused = fused
        self.scale, self.eps = float(scale), float(eps)
        self.has_decay, self.has_igate = has_decay, has_igate
        self.stab, self.track_n = stabilize, track_n
        self.norm = {
            None: kern.NORM_NONE,
            "sum": kern.NORM_SUM,
            "mlstm": kern.NORM_MAXM if stabilize else kern.NORM_MAX1,
        }[normalizer]
        self.L = int(chunk_size or default_chunk_size(K, V, fused))
        self.NT = cdiv(T, self.L)
        self.varlen = offsets is not None
        self.N, self.NSEQ = B, 1  # states (sequences) and sequences per row of B·H
        ints = dict(device=q.device, dtype=torch.int32)
        self.CO = self.CHUNKS = torch.zeros(3, **ints)
        if self.varlen:
            self._pack(list(offsets), T, q.device)
        self.rows = B * H  # rows of the gates and chunk states (B = 1 when packed)
        self.walkers = self.N * H  # programs of the walking kernels: one per state
        if fused:  # one chunk = one tile; one dimension whole, the other tiled to fit
            nw, ns = TILES["fused"][3:]
            self.launch = dict(num_warps=nw, num_stages=ns)
            if self.L > FUSED_MAX_CHUNK:
                raise ValueError(
                    f"mode='fused_chunk' holds one chunk in one tile: chunk_size must be ≤ "
                    f"{FUSED_MAX_CHUNK}, got {self.L} (mode='chunk' takes any chunk size)"
                )
            self.BT = max(16, next_pow2(self.L))
            self.KP = max(16, next_pow2(K))
            self.VP = max(16, next_pow2(V))
            self.BVf = max(16, min(64, 8192 // self.KP, self.VP))
            self.BKf = max(16, min(64, 8192 // self.VP, self.KP))
        self.prec = "ieee" if q.dtype == torch.float32 else "tf32"
        self.dtype = q.dtype

    def _pack(self, offsets, T, device):
        """Packed sequences: chunk table rows (start, end, sequence), each sequence's first
        chunk CO[n], the per-token chunk start and chunk index. Vectorized: at T = 65,536 a
        Python loop over tokens cost ~10 ms of host time per call (forward and backward
        each), more than the kernels of a scalar-gate forward."""
        L, N = self.L, len(offsets) - 1
        bounds = torch.tensor(offsets, dtype=torch.long)
        bos, eos = bounds[:-1], bounds[1:]
        counts = (eos - bos + L - 1).div(L, rounding_mode="floor").clamp_(min=0)  # chunks
        co = F.pad(counts.cumsum(0), (1, 0))
        NT = int(co[-1])
        seq = torch.repeat_interleave(torch.arange(N), counts)  # each chunk's sequence
        c0 = bos[seq] + (torch.arange(NT) - co[seq]) * L
        rows = torch.stack([c0, torch.minimum(c0 + L, eos[seq]), seq], 1)
        ints = dict(device=device, dtype=torch.int32)
        self.N, self.NSEQ, self.NT = N, N, max(NT, 1)
        self.offsets = offsets
        self.CO = co.to(**ints)
        self.CHUNKS = (rows if NT else torch.zeros(1, 3, dtype=torch.long)).reshape(-1).to(**ints)
        # Per token (on the device, from the sequence bounds): its sequence, chunk and start
        ends, t = eos.to(device), torch.arange(T, device=device)
        tok_seq = torch.searchsorted(ends, t, right=True)
        pos = t - bos.to(device)[tok_seq]
        self.tok_chunk = co.to(device)[tok_seq] + pos.div(L, rounding_mode="floor")
        self.tok_start = t - pos.remainder(L)
        self.final_slot = (co[1:] + torch.arange(N)).to(device)

    def tiles(self, name: str, D: int, O: int):
        """(time tile, depth tile, output tile, launch options) of kernel ``name``."""
        t, d, o, nw, ns = TILES[name]
        fit = lambda x, n: max(16, min(x, next_pow2(n)))  # noqa: E731
        return fit(t, self.L), fit(d, D), fit(o, O), dict(num_warps=nw, num_stages=ns)

    def flags(self):
        return dict(
            HAS_DECAY=self.has_decay, HAS_IGATE=self.has_igate, STAB=self.stab,
            TRACK_N=self.track_n, DOT_PREC=self.prec, VARLEN=self.varlen,
        )  # fmt: skip

    def m_final(self, mc):
        """The final max state [N, H] from the chunk-boundary table MC [rows, NT + NSEQ]."""
        if self.varlen:
            return mc[:, self.final_slot].transpose(0, 1).contiguous()
        return mc[:, self.NT].reshape(self.N, -1).clone()


def _rows(g: torch.Tensor) -> torch.Tensor:
    """[B, T, H] → [B·H, T] fp32 contiguous."""
    B, T, H = g.shape
    return g.permute(0, 2, 1).reshape(B * H, T).float().contiguous()


def _chunk_cumsum(g: torch.Tensor, L: int, c: Config | None = None) -> torch.Tensor:
    """Chunk-local cumulative sum of the log decays, [B·H, T] fp32."""
    x = _rows(g)
    if c is not None and c.varlen:  # chunk starts from the table; differences of fp64 sums
        cs = F.pad(x.double().cumsum(-1), (1, 0))
        return (cs[:, 1:] - cs[:, c.tok_start]).float().contiguous()
    BH, T = x.shape
    NT = cdiv(T, L)
    x = F.pad(x, (0, NT * L - T)).view(BH, NT, L).cumsum(-1)
    return x.view(BH, NT * L)[:, :T].contiguous()


def _chunk_max(b, a, L, c: Config | None = None):
    """Per chunk, max over its steps of (a_s − b_s): [B·H, NT] (mLSTM-exp's max state)."""
    BH, T = b.shape
    if c is not None and c.varlen:
        out = torch.full((BH, c.NT), -torch.inf, device=b.device)
        idx = c.tok_chunk.expand(BH, T)
        return out.scatter_reduce_(1, idx, a - b, "amax", include_self=True)
    NT = cdiv(T, L)
    z = F.pad(a - b, (0, NT * L - T), value=-torch.inf)
    return z.view(BH, NT, L).amax(-1).contiguous()


def _forward(q, k, v, b, a, S0, n0, m0, c: Config):
    T, H, K = q.shape[1:]
    V = v.shape[3]
    BH, NT, L, N = c.rows, c.NT, c.L, c.N
    f32 = dict(device=q.device, dtype=torch.float32)
    dummy = torch.empty(1, **f32)
    states = torch.empty(BH, NT, K, V, **f32)
    ns = torch.empty(BH, NT, K, **f32) if c.track_n else dummy
    mc = torch.empty(BH, NT + c.NSEQ, **f32) if c.stab else dummy
    S_T = torch.empty(N, H, K, V, **f32)
    n_T = torch.empty(N, H, K, **f32) if c.track_n else dummy
    has_s0 = S0 is not None
    BS, BK, BV, launch = c.tiles("states_fwd", K, V)
    kern.states_fwd_kernel[(cdiv(K, BK), cdiv(V, BV), c.walkers)](
        k, v, states, ns, mc,
        S0 if has_s0 else dummy, n0 if (has_s0 and c.track_n) else dummy,
        m0 if (has_s0 and c.stab) else dummy, S_T, n_T, b, a,
        _chunk_max(b, a, L, c) if c.stab else dummy, c.CO, c.CHUNKS,
        T, H, K, V, L, NT, c.NSEQ, BK=BK, BV=BV, BS=BS, HAS_S0=has_s0, **c.flags(), **launch,
    )  # fmt: skip
    o = torch.empty_like(v, dtype=q.dtype)
    den = torch.empty(BH, T, **f32) if c.norm else dummy
    m_row = torch.empty(BH, T, **f32) if c.stab else dummy
    BQ, BD, BO, launch = c.tiles("rows_fwd", K, V)
    NQ = cdiv(L, BQ)
    kern.rows_kernel[(NT * NQ, cdiv(V, BO), BH)](
        q, k, v, o, states, ns, mc, b, a, m_row, den, dummy, dummy, dummy, dummy, c.CHUNKS,
        T, H, K, V, L, NT, NQ, c.NSEQ, V, 1, c.scale, c.eps,
        BQ=BQ, BS=BQ, BD=BD, BO=BO, IS_DQ=False, NORM=c.norm, **c.flags(), **launch,
    )  # fmt: skip
    m_T = c.m_final(mc) if c.stab else None
    return o, S_T, (n_T if c.track_n else None), m_T, (states, ns, mc, den, m_row)


def _forward_fused(q, k, v, b, a, S0, n0, m0, c: Config):
    T, H, K = q.shape[1:]
    V = v.shape[3]
    BH, NT, N = c.rows, c.NT, c.N
    f32 = dict(device=q.device, dtype=torch.float32)
    dummy = torch.empty(1, **f32)
    mc = torch.empty(BH, NT + c.NSEQ, **f32) if c.stab else dummy
    S_T = torch.empty(N, H, K, V, **f32)
    n_T = torch.empty(N, H, K, **f32) if c.track_n else dummy
    o = torch.empty_like(v, dtype=q.dtype)
    den = torch.empty(BH, T, **f32) if c.norm else dummy
    m_row = torch.empty(BH, T, **f32) if c.stab else dummy
    has_s0 = S0 is not None
    fused.fused_fwd_kernel[(cdiv(V, c.BVf), c.walkers)](
        q, k, v, o, S0 if has_s0 else dummy, n0 if (has_s0 and c.track_n) else dummy,
        m0 if (has_s0 and c.stab) else dummy, S_T, n_T, mc, b, a,
        _chunk_max(b, a, c.L, c) if c.stab else dummy, m_row, den, c.CO, c.CHUNKS,
        *[dummy] * 4, T, H, K, V, c.L, NT, c.NSEQ, c.scale, c.eps,
        BT=c.BT, BK=c.KP, BV=c.BVf, NORM=c.norm,
        HAS_S0=has_s0, **c.flags(), **c.launch,
    )  # fmt: skip
    m_T = c.m_final(mc) if c.stab else None
    return o, S_T, (n_T if c.track_n else None), m_T, (mc, den, m_row)


def _backward_fused(q, k, v, b, a, o, saved, do, dS_T, dn_T, S0, n0, c: Config):
    mc, den, m_row = saved
    T, H, K = q.shape[1:]
    V = v.shape[3]
    BH, NT, L, N = c.rows, c.NT, c.L, c.N
    f32 = dict(device=q.device, dtype=torch.float32)
    dummy = torch.empty(1, **f32)
    R_A, R_D, R_M = _norm_rows(do, o, den, m_row, c)
    has_dst, dS_T, dn_T = _final_grads(dS_T, dn_T, q, K, V, c)
    has_s0 = S0 is not None
    nK = cdiv(K, c.BKf)
    gates = c.has_decay or c.has_igate
    q_part = torch.empty(nK, BH, T, **f32) if c.has_decay else dummy
    k_part = torch.empty(nK, BH, T, **f32) if gates else dummy
    common = dict(HAS_DECAY=c.has_decay, HAS_IGATE=c.has_igate, STAB=c.stab, NORM=c.norm,
                  DOT_PREC=c.prec, VARLEN=c.varlen, **c.launch)  # fmt: skip
    # The log-decay gradient is a whole-sequence sum here: keep the states' products exact.
    split = c.has_decay and q.dtype != torch.float32
    dq = torch.empty_like(q)
    fused.fused_dq_kernel[(nK, c.walkers)](
        q, k, v, do, dq, S0 if has_s0 else dummy, n0 if (has_s0 and c.track_n) else dummy,
        mc, b, a, m_row, R_A, R_D, q_part, c.CO, c.CHUNKS, *[dummy] * 5,
        T, H, K, V, L, NT, c.NSEQ, c.scale,
        BT=c.BT, BK=c.BKf, BV=c.VP, TRACK_N=c.track_n, HAS_S0=has_s0, SPLIT=split, **common,
    )  # fmt: skip
    dk = torch.empty_like(k)
    dS0 = torch.empty(N, H, K, V, **f32)
    dn0 = torch.empty(N, H, K, **f32) if c.track_n else dummy
    fused.fused_dk_kernel[(nK, c.walkers)](
        q, k, v, do, dk, dS0, dn0, dS_T if has_dst else dummy,
        dn_T if (has_dst and c.track_n) else dummy, mc, b, a, m_row, R_A, R_D, k_part,
        c.CO, c.CHUNKS, *[dummy] * 5, T, H, K, V, L, NT, c.NSEQ, c.scale,
        BT=c.BT, BK=c.BKf, BV=c.VP, TRACK_N=c.track_n, HAS_DST=has_dst, SPLIT=split, **common,
    )  # fmt: skip
    dv = torch.empty_like(v)
    fused.fused_dv_kernel[(cdiv(V, c.BVf), c.walkers)](
        q, k, do, dv, dS_T if has_dst else dummy, mc, b, a, m_row, R_A, c.CO, c.CHUNKS,
        *[dummy] * 9, T, H, K, V, L, NT, c.NSEQ, c.scale,
        BT=c.BT, BK=c.KP, BV=c.BVf, HAS_DST=has_dst, **common,
    )  # fmt: skip
    k_dk = k_part.sum(0) if gates else None
    q_dq = q_part.sum(0) if c.has_decay else None
    return dq, dk, dv, dS0, (dn0 if c.track_n else None), q_dq, k_dk, R_M, dS_T, dn_T, None


def _norm_rows(do, o, den, m_row, c: Config):
    """Per-row factors of the normalizer's backward: 1/denominator, ∂L/∂den, ∂L/∂m_r."""
    dummy = torch.empty(1, device=do.device)
    if not c.norm:
        return dummy, dummy, dummy
    B, T, H, V = do.shape
    f32 = dict(device=do.device, dtype=torch.float32)
    R_A, R_D = torch.empty(B * H, T, **f32), torch.empty(B * H, T, **f32)
    R_M = torch.empty(B * H, T, **f32) if c.stab else dummy
    BT = 64
    kern.norm_bwd_kernel[(cdiv(T, BT), B * H)](
        do, o, den, m_row, R_A, R_D, R_M, T, H, V, c.eps,
        BT=BT, BV=min(128, max(16, next_pow2(V))), NORM=c.norm, STAB=c.stab,
    )  # fmt: skip
    return R_A, R_D, R_M


def _final_grads(dS_T, dn_T, q, K, V, c: Config):
    """The final state's cotangents as fp32 (zeros where only one of them is given)."""
    f32 = dict(device=q.device, dtype=torch.float32)
    B, H = c.N, q.shape[2]
    has_dst = dS_T is not None or dn_T is not None
    if has_dst:
        dS_T = torch.zeros(B, H, K, V, **f32) if dS_T is None else dS_T.float().contiguous()
        if c.track_n:
            dn_T = torch.zeros(B, H, K, **f32) if dn_T is None else dn_T.float().contiguous()
    return has_dst, dS_T, dn_T


def _backward(q, k, v, b, a, o, saved, do, dS_T, dn_T, S_T, n_T, c: Config):
    states, ns, mc, den, m_row = saved
    T, H, K = q.shape[1:]
    V = v.shape[3]
    BH, NT, L, N = c.rows, c.NT, c.L, c.N
    f32 = dict(device=q.device, dtype=torch.float32)
    dummy = torch.empty(1, **f32)
    R_A, R_D, R_M = _norm_rows(do, o, den, m_row, c)
    has_dst, dS_T, dn_T = _final_grads(dS_T, dn_T, q, K, V, c)
    dstates = torch.empty(BH, NT, K, V, **f32)
    dns = torch.empty(BH, NT, K, **f32) if c.track_n else dummy
    dS0 = torch.empty(N, H, K, V, **f32)
    dn0 = torch.empty(N, H, K, **f32) if c.track_n else dummy
    BQ, BK, BV, launch = c.tiles("states_bwd", K, V)
    grid = (cdiv(K, BK), cdiv(V, BV), c.walkers)
    bnd = torch.zeros(BH, NT, grid[0] * grid[1], **f32) if c.has_decay else dummy
    kern.states_bwd_kernel[grid](
        q, do, dstates, dns, dS0, dn0,
        dS_T if has_dst else dummy, dn_T if (has_dst and c.track_n) else dummy,
        mc, b, m_row, R_A, R_D, c.CO, c.CHUNKS, states, ns, S_T,
        n_T if c.track_n else dummy, bnd, T, H, K, V, L, NT, c.NSEQ, c.scale,
        BK=BK, BV=BV, BQ=BQ, HAS_DECAY=c.has_decay, STAB=c.stab, TRACK_N=c.track_n,
        NORM=c.norm, HAS_DST=has_dst, DOT_PREC=c.prec, VARLEN=c.varlen, **launch,
    )  # fmt: skip

    gates = c.has_decay or c.has_igate
    common = dict(NORM=c.norm, **c.flags())
    BQ, BD, BO, launch = c.tiles("rows_dq", V, K)
    nQ, nK = cdiv(L, BQ), cdiv(K, BO)
    q_part = torch.empty(nK, BH, T, **f32) if c.has_decay else dummy
    dq = torch.empty_like(q)
    kern.rows_kernel[(NT * nQ, nK, BH)](
        do, v, k, dq, states, ns, mc, b, a, m_row, dummy, R_A, R_D, q, q_part, c.CHUNKS,
        T, H, V, K, L, NT, nQ, c.NSEQ, 1, V, c.scale, c.eps,
        BQ=BQ, BS=BQ, BD=BD, BO=BO, IS_DQ=True, **common, **launch,
    )  # fmt: skip
    BS, BD, BO, launch = c.tiles("cols_dk", V, K)
    nS, nK = cdiv(L, BS), cdiv(K, BO)
    k_part = torch.empty(nK, BH, T, **f32) if gates else dummy
    dk = torch.empty_like(k)
    kern.cols_kernel[(NT * nS, nK, BH)](
        v, do, q, dk, dstates, dns, mc, b, a, m_row, R_A, R_D, k, k_part, c.CHUNKS,
        T, H, V, K, L, NT, nS, c.NSEQ, 1, V, c.scale,
        BQ=BS, BS=BS, BD=BD, BO=BO, IS_DK=True, **common, **launch,
    )  # fmt: skip
    BS, BD, BO, launch = c.tiles("cols_dv", K, V)
    nS = cdiv(L, BS)
    dv = torch.empty_like(v)
    kern.cols_kernel[(NT * nS, cdiv(V, BO), BH)](
        k, q, do, dv, dstates, dns, mc, b, a, m_row, R_A, R_D, dummy, dummy, c.CHUNKS,
        T, H, K, V, L, NT, nS, c.NSEQ, V, 1, c.scale,
        BQ=BS, BS=BS, BD=BD, BO=BO, IS_DK=False, **common, **launch,
    )  # fmt: skip
    k_dk = k_part.sum(0) if gates else None
    q_dq = q_part.sum(0) if c.has_decay else None
    bnd = bnd.sum(-1) if c.has_decay else None
    return dq, dk, dv, dS0, (dn0 if c.track_n else None), q_dq, k_dk, R_M, dS_T, dn_T, bnd


class _Seqs:
    """Per-sequence view of [B·H, T] row tensors: [N·H, Lmax] with zero padding (the identity
    without packing; packed sequences are spread out by (sequence, position))."""

    def __init__(self, c: Config, B, T, H, device):
        self.c, self.H, self.T = c, H, T
        self.N = c.N
        if c.varlen:
            off = torch.tensor(c.offsets, device=device)
            lens = off[1:] - off[:-1]
            self.seq = torch.repeat_interleave(torch.arange(self.N, device=device), lens)
            self.pos = torch.arange(T, device=device) - off[:-1][self.seq]
            self.Lmax = max(int(lens.max()) if self.N else 0, 1)
            self.last = (lens - 1).clamp_min(0)
            self.nonempty = lens > 0
        else:
            self.Lmax = T
            self.last = torch.full((B,), T - 1, device=device)
            self.nonempty = torch.ones(B, dtype=torch.bool, device=device)

    def spread(self, x, fill=0.0):
        if not self.c.varlen:
            return x
        y = x.new_full((self.N, self.H, self.Lmax), fill)
        y[self.seq, :, self.pos] = x.transpose(0, 1)
        return y.view(self.N * self.H, self.Lmax)

    def gather(self, y):
        if not self.c.varlen:
            return y
        return y.view(self.N, self.H, self.Lmax)[self.seq, :, self.pos].transpose(0, 1)

    def add_at_last(self, y, vals):
        """y[(n, h), last step of n] += vals[n·H + h], for non-empty sequences."""
        vals = vals.view(self.N, self.H) * self.nonempty[:, None]
        y.view(self.N, self.H, self.Lmax)[torch.arange(self.N), :, self.last] += vals


def _chunk_local(dF, bnd, c: Config):
    """The reverse sum of dF ([rows, T], token layout) restarted at every chunk's end, plus
    that chunk's exact boundary value bnd ([rows, NT]): fp64."""
    T = dF.shape[1]
    G = F.pad(dF.double().flip(-1).cumsum(-1).flip(-1), (0, 1))  # G[:, T] = 0
    if c.varlen:
        chunk = c.tok_chunk
        end = c.CHUNKS.view(-1, 3)[:, 1].long()[chunk]
    else:
        chunk = torch.arange(T, device=dF.device) // c.L
        end = ((chunk + 1) * c.L).clamp_max(T)
    return G[:, :T] - G[:, end] + bnd.double()[:, chunk]


def _route(dm: torch.Tensor, idx: torch.Tensor, width: int) -> torch.Tensor:
    """dz[p] = Σ_{t: idx_t = p} dm_t ([rows, width] fp32), deterministically: idx (a running
    argmax) never decreases along a row, so each p collects one contiguous run of t, and its
    sum is E[p] − E[p−1] with E[p] = Σ_{t: idx_t ≤ p} dm_t, an fp64 prefix sum found by a
    sorted search (a CUDA scatter_add would add in a varying order)."""
    rows = dm.shape[0]
    S = F.pad(dm.double().cumsum(1), (1, 0))  # S[:, t] = Σ_{t' < t} dm_t'
    p = torch.arange(width, device=dm.device, dtype=idx.dtype).expand(rows, width)
    E = S.gather(1, torch.searchsorted(idx.contiguous(), p.contiguous(), right=True))
    return torch.diff(E, dim=1, prepend=E.new_zeros(rows, 1)).float()


def _gate_grads(g, gi, b_shape, q_dq, k_dk, R_M, S_T, n_T, m_T, dS_T, dn_T, dm_T, m0, dm0,
                c: Config, bnd=None):  # fmt: skip
    """∂L/∂g, ∂L/∂gi ([B, T, H]) and the routed part of ∂L/∂m_0 (see the module docstring).
    Everything runs per sequence ([N·H, Lmax]), so packed sequences stay independent. Shared
    with triton_recurrent_bwd: ``c`` needs only has_decay, has_igate, stab, track_n, norm,
    varlen, N and (packed) offsets.

    ``bnd`` ([rows, NT], chunk mode): ⟨dC, C⟩ + ⟨dn, n⟩ of the state leaving each chunk, which
    equals the reverse sum of q·dq − k·dk from the chunk's end on (final-state term included).
    With it the long sum restarts at every chunk: its terms largely cancel, so over a whole
    sequence their rounding errors (bf16 inputs to the kernels' products) would pile up."""
    B, T, H = b_shape
    sq = _Seqs(c, B, T, H, q_dq.device if q_dq is not None else k_dk.device)
    NH = sq.N * H
    local = None
    if c.has_decay and bnd is not None:
        local = _chunk_local(q_dq.double() - k_dk, bnd, c)
        dF = sq.spread(torch.zeros_like(local))  # only the max state's routing is left for dF
    else:
        dF = sq.spread(q_dq.double() - k_dk) if c.has_decay else None
    da = sq.spread(k_dk.clone()) if c.has_igate else None
    end = None  # ⟨dS_T, S_T⟩ + ⟨dn_T, n_T⟩: the final state's own dependence on its scale
    if dS_T is not None:
        end = (dS_T * S_T).sum((-2, -1)).view(NH)
        if c.track_n:
            end = end + (dn_T * n_T).sum(-1).view(NH)
        if dF is not None and local is None:
            sq.add_at_last(dF, end)
    if c.stab:
        dm = sq.spread(R_M.clone()) if c.norm else torch.zeros(dF.shape, device=dF.device)
        tail = torch.zeros(NH, device=dF.device)
        if dm_T is not None:
            tail = tail + dm_T.float().reshape(NH)
        if end is not None:
            tail = tail - end
        sq.add_at_last(dm, tail)
        Fg = sq.spread(_rows(g).double()).cumsum(-1)
        start = m0.double().reshape(NH, 1) if m0 is not None else Fg.new_full((NH, 1), -torch.inf)
        a_seq = sq.spread(_rows(gi).double(), fill=-torch.inf)
        z = torch.cat([start, a_seq - Fg], dim=1)
        idx = z.cummax(dim=1).indices[:, 1:]  # the argmax behind each m_t (0 = m_0)
        dz = _route(dm, idx, sq.Lmax + 1)
        dF += dm - dz[:, 1:]
        da += dz[:, 1:]
        if m0 is not None:
            # An empty sequence's final m is its initial m: its tail goes straight to m_0.
            empty = (~sq.nonempty)[:, None].float()
            dm0 = dm0 + dz[:, 0].view(sq.N, H) + tail.view(sq.N, H) * empty
    dg = None
    if dF is not None:
        if local is not None and not c.stab:  # dF stayed zero: nothing to add
            rev = local
        else:  # a reverse sum over whole sequences (up to 10⁵ terms that largely cancel): fp64
            rev = sq.gather(dF.double().flip(-1).cumsum(-1).flip(-1))
            rev = rev if local is None else rev + local
        dg = rev.float().reshape(B, H, T).transpose(1, 2)
    if da is not None:
        da = sq.gather(da).reshape(B, H, T).transpose(1, 2)
    return dg, da, dm0


class _ChunkFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, g, gi, S0, n0, m0, c: Config):
        L = c.L
        dummy = torch.empty(1, device=q.device)
        b = _chunk_cumsum(g, L, c) if c.has_decay else dummy
        a = _rows(gi) if c.has_igate else dummy
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        if S0 is not None:
            S0 = S0.float().contiguous()
            n0 = n0.float().contiguous() if c.track_n else None
            m0 = m0.float().contiguous() if c.stab else None
        fwd = _forward_fused if c.fused else _forward
        o, S_T, n_T, m_T, saved = fwd(q, k, v, b, a, S0, n0, m0, c)
        ctx.c = c
        ctx.save_for_backward(q, k, v, g, gi, b, a, o, S0, n0, m0, S_T, n_T, *saved)
        return o, S_T, n_T, m_T

    @staticmethod
    def backward(ctx, do, dS_T, dn_T, dm_T):
        c = ctx.c
        q, k, v, g, gi, b, a, o, S0, n0, m0, S_T, n_T, *saved = ctx.saved_tensors
        if c.fused:
            grads = _backward_fused(q, k, v, b, a, o, saved, do.contiguous(), dS_T, dn_T, S0,
                                    n0, c)  # fmt: skip
        else:
            grads = _backward(q, k, v, b, a, o, saved, do.contiguous(), dS_T, dn_T, S_T, n_T,
                              c)  # fmt: skip
        dq, dk, dv, dS0, dn0, q_dq, k_dk, R_M, dS_T, dn_T, bnd = grads
        dm0 = None
        if S0 is not None and c.stab:
            dm0 = (dS0 * S0).sum((-2, -1)) + (dn0 * n0).sum(-1)
        dg = dgi = None
        if c.has_decay or c.has_igate:
            dg, dgi, dm0 = _gate_grads(
                g, gi, g.shape if g is not None else gi.shape, q_dq, k_dk, R_M, S_T, n_T,
                None, dS_T, dn_T, dm_T, m0, dm0, c, bnd=bnd,
            )  # fmt: skip
        if S0 is None:
            dS0 = dn0 = None
        return dq, dk, dv, dg, dgi, dS0, dn0, dm0, None


def chunk(q, k, v, *, scale, g=None, gi=None, stabilize=False, track_n=False, normalizer=None,
          eps=0.0, S0=None, n0=None, m0=None, chunk_size=None, fused=False,
          offsets=None, gv=None, u=None):  # fmt: skip
    """Scalar-gate chunkwise forward (autograd-enabled). q, k, v ``[B, T, H, *]`` in one of
    fp16/bf16/fp32; g, gi ``[B, T, H]`` log decay and log input gate; S0/n0/m0 the initial
    state (n0 with ``track_n``, m0 with ``stabilize``; N = B, or the number of sequences).
    ``fused``: the non-materializing kernels (triton_fused). ``offsets``: ``[N + 1]`` ints of
    packed sequences (B = 1), each its own chunks and state. Returns ``(o, S_T, n_T, m_T)``.
    Per-channel decays (g ``[B, T, H, K]``, gv, u) go to :mod:`triton_chunk_vec`."""
    if (g is not None and g.dim() == 4) or gv is not None or u is not None:
        from linrnn.engine import triton_chunk_vec

        if gi is not None or stabilize or track_n or normalizer is not None:
            raise NotImplementedError("vector gates with input gate / normalizer: no kernel")
        o, S_T = triton_chunk_vec.chunk(
            q, k, v, scale=scale, g=g, gv=gv, u=u, S0=S0, chunk_size=chunk_size, fused=fused,
            offsets=offsets,
        )  # fmt: skip
        return o, S_T, None, None
    c = Config(
        q, k, v, scale=scale, has_decay=g is not None, has_igate=gi is not None,
        stabilize=stabilize, track_n=track_n, normalizer=normalizer, eps=eps,
        chunk_size=chunk_size, fused=fused, offsets=offsets,
    )  # fmt: skip
    if S0 is not None:
        B, H, K = S0.shape[:3]
        if track_n and n0 is None:
            n0 = S0.new_zeros(B, H, K)
        if stabilize and m0 is None:
            m0 = S0.new_zeros(B, H)
    return _ChunkFn.apply(q, k, v, g, gi, S0, n0, m0, c)
