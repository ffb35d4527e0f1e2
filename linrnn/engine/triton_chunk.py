"""Host side of the Triton chunk engine for scalar gates: tile choice, launches, the autograd
Function and the gate gradients (which are cheap [B·H, T] reductions done in PyTorch).

Gate gradients. With the max state m held fixed, every log decay g_t enters through the global
cumulative sum F_t, with +F_t beside q_t and −F_t beside k_t, so

    ∂L/∂F_t = q_t·dq_t − k_t·dk_t  (+ ⟨dS_T, S_T⟩ + ⟨dn_T, n_T⟩ at the last step),
    ∂L/∂g_u = Σ_{t≥u} ∂L/∂F_t,       ∂L/∂a_s = k_s·dk_s  (a: log input gate).

The kernels return the per-tile partial sums of q·dq and k·dk. mLSTM-exp adds the gradient
through m itself: m_t = F_t + max(m_0, max_{s≤t}(a_s − F_s)) reaches the output only through
eps (and the final state through its stabilized scale), and routes to F_t and to the argmax.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton

from linrnn.engine import triton_kernels as kern

DEFAULT_CHUNK_SIZE = 64

# Tile sizes and launch options, tuned on the GPU machine (benchmarks/engine_sweep.py may
# override them to search).
TILES = dict(BQ=64, BK=64, BV=128, num_warps=4, num_stages=2)


class Config:
    """Compile-time switches and tile sizes of one call."""

    def __init__(self, q, k, v, *, scale, has_decay, has_igate, stabilize, track_n,
                 normalizer, eps, chunk_size):  # fmt: skip
        T, K, V = q.shape[1], q.shape[3], v.shape[3]
        self.scale, self.eps = float(scale), float(eps)
        self.has_decay, self.has_igate = has_decay, has_igate
        self.stab, self.track_n = stabilize, track_n
        self.norm = {
            None: kern.NORM_NONE,
            "sum": kern.NORM_SUM,
            "mlstm": kern.NORM_MAXM if stabilize else kern.NORM_MAX1,
        }[normalizer]
        self.L = int(chunk_size or DEFAULT_CHUNK_SIZE)
        self.NT = triton.cdiv(T, self.L)
        tile = max(16, min(TILES["BQ"], triton.next_power_of_2(self.L)))
        self.BQ = self.BS = tile
        self.BK = max(16, min(TILES["BK"], triton.next_power_of_2(K)))
        self.BV = max(16, min(TILES["BV"], triton.next_power_of_2(V)))
        self.launch = dict(num_warps=TILES["num_warps"], num_stages=TILES["num_stages"])
        self.prec = "ieee" if q.dtype == torch.float32 else "tf32"

    def flags(self):
        return dict(
            HAS_DECAY=self.has_decay, HAS_IGATE=self.has_igate, STAB=self.stab,
            TRACK_N=self.track_n, DOT_PREC=self.prec,
        )  # fmt: skip


def _rows(g: torch.Tensor) -> torch.Tensor:
    """[B, T, H] → [B·H, T] fp32 contiguous."""
    B, T, H = g.shape
    return g.permute(0, 2, 1).reshape(B * H, T).float().contiguous()


def _chunk_cumsum(g: torch.Tensor, L: int) -> torch.Tensor:
    """Chunk-local cumulative sum of the log decays, [B·H, T] fp32."""
    x = _rows(g)
    BH, T = x.shape
    NT = triton.cdiv(T, L)
    x = F.pad(x, (0, NT * L - T)).view(BH, NT, L).cumsum(-1)
    return x.view(BH, NT * L)[:, :T].contiguous()


def _chunk_max(b, a, L):
    """Per chunk, max over its steps of (a_s − b_s): [B·H, NT] (mLSTM-exp's max state)."""
    BH, T = b.shape
    NT = triton.cdiv(T, L)
    z = F.pad(a - b, (0, NT * L - T), value=-torch.inf)
    return z.view(BH, NT, L).amax(-1).contiguous()


def _forward(q, k, v, b, a, S0, n0, m0, c: Config):
    B, T, H, K = q.shape
    V = v.shape[3]
    BH, NT, L = B * H, c.NT, c.L
    f32 = dict(device=q.device, dtype=torch.float32)
    dummy = torch.empty(1, **f32)
    states = torch.empty(BH, NT, K, V, **f32)
    ns = torch.empty(BH, NT, K, **f32) if c.track_n else dummy
    mc = torch.empty(BH, NT + 1, **f32) if c.stab else dummy
    S_T = torch.empty(B, H, K, V, **f32)
    n_T = torch.empty(B, H, K, **f32) if c.track_n else dummy
    has_s0 = S0 is not None
    kern.states_fwd_kernel[(triton.cdiv(K, c.BK), triton.cdiv(V, c.BV), BH)](
        k, v, states, ns, mc,
        S0 if has_s0 else dummy, n0 if (has_s0 and c.track_n) else dummy,
        m0 if (has_s0 and c.stab) else dummy, S_T, n_T, b, a,
        _chunk_max(b, a, L) if c.stab else dummy,
        T, H, K, V, L, NT, BK=c.BK, BV=c.BV, BS=c.BS, HAS_S0=has_s0, **c.flags(), **c.launch,
    )  # fmt: skip
    o = torch.empty_like(v, dtype=q.dtype)
    den = torch.empty(BH, T, **f32) if c.norm else dummy
    m_row = torch.empty(BH, T, **f32) if c.stab else dummy
    NQ = triton.cdiv(L, c.BQ)
    kern.rows_kernel[(NT * NQ, triton.cdiv(V, c.BV), BH)](
        q, k, v, o, states, ns, mc, b, a, m_row, den, dummy, dummy, dummy, dummy,
        T, H, K, V, L, NT, NQ, V, 1, c.scale, c.eps,
        BQ=c.BQ, BS=c.BS, BD=c.BK, BO=c.BV, IS_DQ=False, NORM=c.norm, **c.flags(), **c.launch,
    )  # fmt: skip
    m_T = mc[:, NT].reshape(B, H).clone() if c.stab else None
    return o, S_T, (n_T if c.track_n else None), m_T, (states, ns, mc, den, m_row)


def _backward(q, k, v, b, a, o, saved, do, dS_T, dn_T, c: Config):
    states, ns, mc, den, m_row = saved
    B, T, H, K = q.shape
    V = v.shape[3]
    BH, NT, L = B * H, c.NT, c.L
    f32 = dict(device=q.device, dtype=torch.float32)
    dummy = torch.empty(1, **f32)
    R_A = R_D = R_M = dummy
    if c.norm:
        R_A, R_D = torch.empty(BH, T, **f32), torch.empty(BH, T, **f32)
        R_M = torch.empty(BH, T, **f32) if c.stab else dummy
        BT = 64
        kern.norm_bwd_kernel[(triton.cdiv(T, BT), BH)](
            do, o, den, m_row, R_A, R_D, R_M, T, H, V, c.eps,
            BT=BT, BV=c.BV, NORM=c.norm, STAB=c.stab,
        )  # fmt: skip
    has_dst = dS_T is not None or dn_T is not None
    if has_dst:
        dS_T = torch.zeros(B, H, K, V, **f32) if dS_T is None else dS_T.float().contiguous()
        if c.track_n:
            dn_T = torch.zeros(B, H, K, **f32) if dn_T is None else dn_T.float().contiguous()
    dstates = torch.empty(BH, NT, K, V, **f32)
    dns = torch.empty(BH, NT, K, **f32) if c.track_n else dummy
    dS0 = torch.empty(B, H, K, V, **f32)
    dn0 = torch.empty(B, H, K, **f32) if c.track_n else dummy
    kern.states_bwd_kernel[(triton.cdiv(K, c.BK), triton.cdiv(V, c.BV), BH)](
        q, do, dstates, dns, dS0, dn0,
        dS_T if has_dst else dummy, dn_T if (has_dst and c.track_n) else dummy,
        mc, b, m_row, R_A, R_D, T, H, K, V, L, NT, c.scale,
        BK=c.BK, BV=c.BV, BQ=c.BQ, HAS_DECAY=c.has_decay, STAB=c.stab, TRACK_N=c.track_n,
        NORM=c.norm, HAS_DST=has_dst, DOT_PREC=c.prec, **c.launch,
    )  # fmt: skip

    nK, nV = triton.cdiv(K, c.BK), triton.cdiv(V, c.BV)
    gates = c.has_decay or c.has_igate
    q_part = torch.empty(nK, BH, T, **f32) if c.has_decay else dummy
    k_part = torch.empty(nK, BH, T, **f32) if gates else dummy
    NQ, NS = triton.cdiv(L, c.BQ), triton.cdiv(L, c.BS)
    common = dict(BQ=c.BQ, BS=c.BS, NORM=c.norm, **c.flags(), **c.launch)
    dq = torch.empty_like(q)
    kern.rows_kernel[(NT * NQ, nK, BH)](
        do, v, k, dq, states, ns, mc, b, a, m_row, dummy, R_A, R_D, q, q_part,
        T, H, V, K, L, NT, NQ, 1, V, c.scale, c.eps, BD=c.BV, BO=c.BK, IS_DQ=True, **common,
    )  # fmt: skip
    dk = torch.empty_like(k)
    kern.cols_kernel[(NT * NS, nK, BH)](
        v, do, q, dk, dstates, dns, mc, b, a, m_row, R_A, R_D, k, k_part,
        T, H, V, K, L, NT, NS, 1, V, c.scale, BD=c.BV, BO=c.BK, IS_DK=True, **common,
    )  # fmt: skip
    dv = torch.empty_like(v)
    kern.cols_kernel[(NT * NS, nV, BH)](
        k, q, do, dv, dstates, dns, mc, b, a, m_row, R_A, R_D, dummy, dummy,
        T, H, K, V, L, NT, NS, V, 1, c.scale, BD=c.BK, BO=c.BV, IS_DK=False, **common,
    )  # fmt: skip
    k_dk = k_part.sum(0) if gates else None
    q_dq = q_part.sum(0) if c.has_decay else None
    return dq, dk, dv, dS0, (dn0 if c.track_n else None), q_dq, k_dk, R_M, dS_T, dn_T


def _gate_grads(g, gi, b_shape, q_dq, k_dk, R_M, S_T, n_T, m_T, dS_T, dn_T, dm_T, m0, dm0,
                c: Config):  # fmt: skip
    """∂L/∂g, ∂L/∂gi ([B, T, H]) and the routed part of ∂L/∂m_0 (see the module docstring)."""
    B, T, H = b_shape
    BH = B * H
    dF = q_dq - k_dk if c.has_decay else None
    da = k_dk.clone() if c.has_igate else None
    end = None  # ⟨dS_T, S_T⟩ + ⟨dn_T, n_T⟩: the final state's own dependence on its scale
    if dS_T is not None:
        end = (dS_T * S_T).sum((-2, -1)).view(BH)
        if c.track_n:
            end = end + (dn_T * n_T).sum(-1).view(BH)
        if dF is not None:
            dF[:, -1] += end
    if c.stab:
        dm = R_M.clone() if c.norm else torch.zeros_like(dF)
        tail = torch.zeros(BH, device=dF.device)
        if dm_T is not None:
            tail = tail + dm_T.float().reshape(BH)
        if end is not None:
            tail = tail - end
        dm[:, -1] += tail
        Fg = _rows(g).double().cumsum(-1)
        start = m0.double().reshape(BH, 1) if m0 is not None else Fg.new_full((BH, 1), -torch.inf)
        z = torch.cat([start, _rows(gi).double() - Fg], dim=1)
        idx = z.cummax(dim=1).indices[:, 1:]  # the argmax behind each m_t (0 = m_0)
        dz = torch.zeros(BH, T + 1, device=dF.device).scatter_add_(1, idx, dm)
        dF += dm - dz[:, 1:]
        da += dz[:, 1:]
        if m0 is not None:
            dm0 = dm0 + dz[:, 0].view(B, H)
    dg = None
    if dF is not None:
        dg = dF.flip(-1).cumsum(-1).flip(-1).view(B, H, T).transpose(1, 2)
    if da is not None:
        da = da.view(B, H, T).transpose(1, 2)
    return dg, da, dm0


class _ChunkFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, g, gi, S0, n0, m0, c: Config):
        L = c.L
        dummy = torch.empty(1, device=q.device)
        b = _chunk_cumsum(g, L) if c.has_decay else dummy
        a = _rows(gi) if c.has_igate else dummy
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        if S0 is not None:
            S0 = S0.float().contiguous()
            n0 = n0.float().contiguous() if c.track_n else None
            m0 = m0.float().contiguous() if c.stab else None
        o, S_T, n_T, m_T, saved = _forward(q, k, v, b, a, S0, n0, m0, c)
        ctx.c = c
        ctx.save_for_backward(q, k, v, g, gi, b, a, o, S0, n0, m0, S_T, n_T, *saved)
        return o, S_T, n_T, m_T

    @staticmethod
    def backward(ctx, do, dS_T, dn_T, dm_T):
        c = ctx.c
        q, k, v, g, gi, b, a, o, S0, n0, m0, S_T, n_T, *saved = ctx.saved_tensors
        dq, dk, dv, dS0, dn0, q_dq, k_dk, R_M, dS_T, dn_T = _backward(
            q, k, v, b, a, o, saved, do.contiguous(), dS_T, dn_T, c
        )
        dm0 = None
        if S0 is not None and c.stab:
            dm0 = (dS0 * S0).sum((-2, -1)) + (dn0 * n0).sum(-1)
        dg = dgi = None
        if c.has_decay or c.has_igate:
            dg, dgi, dm0 = _gate_grads(
                g, gi, g.shape if g is not None else gi.shape, q_dq, k_dk, R_M, S_T, n_T,
                None, dS_T, dn_T, dm_T, m0, dm0, c,
            )  # fmt: skip
        if S0 is None:
            dS0 = dn0 = None
        return dq, dk, dv, dg, dgi, dS0, dn0, dm0, None


def chunk(q, k, v, *, scale, g=None, gi=None, stabilize=False, track_n=False, normalizer=None,
          eps=0.0, S0=None, n0=None, m0=None, chunk_size=None):  # fmt: skip
    """Scalar-gate chunkwise forward (autograd-enabled). q, k, v ``[B, T, H, *]`` in one of
    fp16/bf16/fp32; g, gi ``[B, T, H]`` log decay and log input gate; S0/n0/m0 the initial
    state (n0 with ``track_n``, m0 with ``stabilize``). Returns ``(o, S_T, n_T, m_T)``."""
    c = Config(
        q, k, v, scale=scale, has_decay=g is not None, has_igate=gi is not None,
        stabilize=stabilize, track_n=track_n, normalizer=normalizer, eps=eps,
        chunk_size=chunk_size,
    )  # fmt: skip
    if S0 is not None:
        B, H, K = S0.shape[:3]
        if track_n and n0 is None:
            n0 = S0.new_zeros(B, H, K)
        if stabilize and m0 is None:
            m0 = S0.new_zeros(B, H)
    return _ChunkFn.apply(q, k, v, g, gi, S0, n0, m0, c)
