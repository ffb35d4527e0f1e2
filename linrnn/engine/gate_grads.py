"""Gate gradients from the per-tile partial sums the kernels return, shared by the scalar,
vector and recurrent hosts: [B·H, T] reductions in PyTorch for the hosts without chunk states
(chunk mode runs one kernel instead, :func:`linrnn.engine.scalar.chunk_gate_grads`), and the
helpers both use.

With the max state m held fixed, every log decay g_t enters through the global cumulative sum
F_t, with +F_t beside q_t and −F_t beside k_t, so

    ∂L/∂F_t = q_t·dq_t − k_t·dk_t  (+ ⟨dS_T, S_T⟩ + ⟨dn_T, n_T⟩ at the last step),
    ∂L/∂g_u = Σ_{t≥u} ∂L/∂F_t,       ∂L/∂a_s = k_s·dk_s  (a: log input gate).

In chunk mode the reverse sum restarts at every chunk end from the exact value
⟨dC, C⟩ + ⟨dn, n⟩ of the state there (the materialized states and their gradients give it), so
rounding errors in the largely cancelling terms do not pile up over the sequence, and each
sum is short enough for fp32. Without those values (fused_chunk, recurrent) the sums run
over whole sequences, in fp64. mLSTM-exp adds the gradient through m itself:
m_t = F_t + max(m_0, max_{s≤t}(a_s − F_s)) reaches the output only through eps (and the final
state through its stabilized scale), and routes to F_t and to the argmax (:func:`route_argmax`).

:func:`gate_grads` takes a config ``c`` that needs only has_decay, has_igate, stab, track_n,
norm, varlen, N and offsets (when packed): a :class:`~linrnn.engine.config.ChunkConfig`, or
:class:`GateFlags` for a host without chunks (the recurrent one). Per-channel decays take
:func:`reverse_sum`.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from linrnn._runtime import to_device


@dataclass(frozen=True)
class GateFlags:
    """The switches :func:`gate_grads` and :func:`final_grads` read, for a call without a
    :class:`~linrnn.engine.config.ChunkConfig` (no chunk restarts: ``bnd`` None). ``N``: the
    number of sequences (B, or len(offsets) − 1 when packed); ``norm``: the normalizer's
    code (0 none)."""

    N: int
    has_decay: bool
    has_igate: bool
    stab: bool
    track_n: bool
    norm: int
    offsets: list[int] | None = None

    @property
    def varlen(self) -> bool:
        return self.offsets is not None


def rows(x: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """[B, T, H(, D)] → [B·H(·D), T] contiguous, fp32 (or ``dtype``)."""
    return x.movedim(1, -1).reshape(-1, x.shape[1]).to(dtype).contiguous()


def tokens(y: torch.Tensor, shape) -> torch.Tensor:
    """The inverse of :func:`rows`: [B·H(·D), T] → [B, T, H(, D)] (a view)."""
    B, T, *rest = shape
    return y.reshape(B, *rest, T).movedim(-1, 1)


def rev_cumsum(y: torch.Tensor) -> torch.Tensor:
    """Σ_{s≥t} y_s along the last dimension, in fp64."""
    return y.double().flip(-1).cumsum(-1).flip(-1)


def wants_gate_grads(need_gate_grads: bool, stab: bool) -> bool:
    """Whether a backward forms the gate gradients: when a gate asks for its gradient
    (autograd's ``needs_input_grad``), and always with the max state (``stab``: its routing
    also reaches the initial m). Without them the hosts leave out what only they read (the
    kernels' q·dq, k·dk, v·dv, the chunk-end ⟨dC, C⟩, the gate sums; docs/DESIGN.md §6.5)."""
    return need_gate_grads or stab


def final_grads(dS_T, dn_T, q, K, V, c):
    """The final state's cotangents as fp32 (zeros where only one of them is given)."""
    f32 = dict(device=q.device, dtype=torch.float32)
    B, H = c.N, q.shape[2]
    has_dst = dS_T is not None or dn_T is not None
    if has_dst:
        dS_T = torch.zeros(B, H, K, V, **f32) if dS_T is None else dS_T.float().contiguous()
        if c.track_n:
            dn_T = torch.zeros(B, H, K, **f32) if dn_T is None else dn_T.float().contiguous()
    return has_dst, dS_T, dn_T


class Seqs:
    """Per-sequence view of [B·H, T] row tensors (:func:`rows`): [N·H, Lmax] with zero padding,
    one row per (sequence, head). Without packing (``offsets`` None) it is the identity; packed
    sequences (B = 1, ``offsets`` the N + 1 token offsets) are spread out by (sequence,
    position). H counts the rows of one sequence: heads, or heads × channels."""

    def __init__(self, offsets, B, T, H, device):
        self.H, self.T = H, T
        self.varlen = offsets is not None
        if self.varlen:  # sizes from the host's offsets: no device value is read back
            offsets = offsets.tolist() if isinstance(offsets, torch.Tensor) else list(offsets)
            off = to_device(offsets, device)
            self.N = len(offsets) - 1
            lens = off[1:] - off[:-1]
            self.seq = torch.repeat_interleave(torch.arange(self.N, device=device), lens,
                                               output_size=offsets[-1] - offsets[0])  # fmt: skip
            self.pos = torch.arange(T, device=device) - off[:-1][self.seq]
            longest = max((b - a for a, b in itertools.pairwise(offsets)), default=0)
            self.Lmax = max(longest, 1)
            self.last = (lens - 1).clamp_min(0)
            self.nonempty = lens > 0
        else:
            self.N, self.Lmax = B, T
            self.last = torch.full((B,), T - 1, device=device)
            self.nonempty = torch.ones(B, dtype=torch.bool, device=device)

    @classmethod
    def of(cls, c, B, T, H, device):
        """The view for the call config ``c`` (module docstring)."""
        return cls(c.offsets if c.varlen else None, B, T, H, device)

    def spread(self, x, fill=0.0):
        if not self.varlen:
            return x
        y = x.new_full((self.N, self.H, self.Lmax), fill)
        y[self.seq, :, self.pos] = x.transpose(0, 1)
        return y.view(self.N * self.H, self.Lmax)

    def gather(self, y):
        if not self.varlen:
            return y
        return y.view(self.N, self.H, self.Lmax)[self.seq, :, self.pos].transpose(0, 1)

    def add_at_last(self, y, vals):
        """y[(n, h), last step of n] += vals[n·H + h], for non-empty sequences."""
        vals = vals.view(self.N, self.H) * self.nonempty[:, None]
        n = torch.arange(self.N, device=y.device)
        y.view(self.N, self.H, self.Lmax)[n, :, self.last] += vals


def route_argmax(dm: torch.Tensor, idx: torch.Tensor, width: int) -> torch.Tensor:
    """dz[p] = Σ_{t: idx_t = p} dm_t ([rows, width] fp32), deterministically: idx (a running
    argmax) never decreases along a row, so each p collects one contiguous run of t, and its
    sum is E[p] − E[p−1] with E[p] = Σ_{t: idx_t ≤ p} dm_t, an fp64 prefix sum found by a
    sorted search (a CUDA scatter_add would add in a varying order)."""
    rows = dm.shape[0]
    S = F.pad(dm.double().cumsum(1), (1, 0))  # S[:, t] = Σ_{t' < t} dm_t'
    p = torch.arange(width, device=dm.device, dtype=idx.dtype).expand(rows, width)
    E = S.gather(1, torch.searchsorted(idx.contiguous(), p.contiguous(), right=True))
    return torch.diff(E, dim=1, prepend=E.new_zeros(rows, 1)).float()


def final_term(dS_T, dn_T, S_T, n_T, c):
    """⟨dS_T, S_T⟩ + ⟨dn_T, n_T⟩ ([N, H]): the final state's own dependence on its scale, or
    None without the final state's cotangents."""
    if dS_T is None:
        return None
    end = (dS_T * S_T).sum((-2, -1))
    return end + (dn_T * n_T).sum(-1) if c.track_n else end


def max_tail(dm_T, end, shape, device) -> torch.Tensor:
    """∂L/∂m past the last step ([N, H] fp32): the final max state's cotangent less the final
    state's term (its stabilized scale moves with m)."""
    tail = torch.zeros(shape, device=device)
    if dm_T is not None:
        tail = tail + dm_T.float().reshape(shape)
    return tail if end is None else tail - end


def gate_grads(g, gi, b_shape, q_dq, k_dk, R_M, S_T, n_T, dS_T, dn_T, dm_T, m0, dm0, c):
    """∂L/∂g, ∂L/∂gi ([B, T, H]) and ∂L/∂m_0 with its routed part (see the module docstring),
    for a host without chunk boundary values: whole-sequence sums in fp64. Everything runs per
    sequence ([N·H, Lmax]), so packed sequences stay independent."""
    B, T, H = b_shape
    sq = Seqs.of(c, B, T, H, q_dq.device if q_dq is not None else k_dk.device)
    NH = sq.N * H
    dF = sq.spread(q_dq.double() - k_dk) if c.has_decay else None
    da = None
    if c.has_igate:  # (added to in place by the max state's routing)
        da = sq.spread(k_dk.clone() if c.stab else k_dk)
    end = final_term(dS_T, dn_T, S_T, n_T, c)  # [N, H]
    if end is not None and dF is not None:
        sq.add_at_last(dF, end.reshape(NH))
    if c.stab:
        dm = sq.spread(R_M.clone()) if c.norm else torch.zeros(dF.shape, device=dF.device)
        tail = max_tail(dm_T, end, (sq.N, H), dF.device).view(NH)
        sq.add_at_last(dm, tail)
        Fg = sq.spread(rows(g).double()).cumsum(-1)
        start = m0.double().reshape(NH, 1) if m0 is not None else Fg.new_full((NH, 1), -torch.inf)
        a_seq = sq.spread(rows(gi).double(), fill=-torch.inf)
        z = torch.cat([start, a_seq - Fg], dim=1)
        idx = z.cummax(dim=1).indices[:, 1:]  # the argmax behind each m_t (0 = m_0)
        dz = route_argmax(dm, idx, sq.Lmax + 1)
        dF += dm - dz[:, 1:]
        da += dz[:, 1:]
        if m0 is not None:
            # An empty sequence's final m is its initial m: its tail goes straight to m_0.
            empty = (~sq.nonempty)[:, None].float()
            dm0 = dm0 + dz[:, 0].view(sq.N, H) + tail.view(sq.N, H) * empty
    dg = None
    if dF is not None:  # a reverse sum over whole sequences (up to 10⁵ terms that largely
        # cancel): fp64
        dg = tokens(sq.gather(rev_cumsum(dF)).float(), b_shape)
    if da is not None:
        da = tokens(sq.gather(da).float(), b_shape)
    return dg, da, dm0


def reverse_sum(dF, end, offsets):
    """∂L/∂g of a log decay over token layout ([B, T, H] or per channel [B, T, H, D]) from
    ∂L/∂F (dF, same shape; F the decay's cumulative sum): Σ_{s≥t} dF_s within each sequence
    in fp64, with the final state's own term ``end`` ([N, H(, D)] or None) added at each
    non-empty sequence's last step. ``offsets``: the packed sequences' token offsets (B = 1),
    or None. Returns fp32."""
    B, T = dF.shape[:2]
    sq = Seqs(offsets, B, T, math.prod(dF.shape[2:]), dF.device)
    y = sq.spread(rows(dF, torch.float64))
    if end is not None:
        sq.add_at_last(y, end.reshape(-1).double())
    return tokens(sq.gather(rev_cumsum(y)).float(), dF.shape)
