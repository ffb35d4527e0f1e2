"""Sequence (context) parallelism for every family over ``torch.distributed`` (docs/DESIGN.md §5).

The ranks of a process group hold consecutive time segments of one batch of sequences: rank r
holds tokens ``[s_r, s_r + T_r)`` of every input that runs along T (q, k, v and the per-step
gates), segments of any lengths ``T_r ≥ 1``. :func:`context_parallel` returns on each rank
exactly what one device returns for the whole sequence: the outputs of its own segment, and
the final state (the same on every rank).

How (LASP-2 style), per call:

1. every rank summarizes its segment by the state it reaches from a zero state and its total
   log decay (a blocked ``O(T·K·V)`` matmul pass, no outputs; the mLSTM-exp state keeps its
   max stabilizer m);
2. ONE all-gather of those (decay, state) summaries — a flat buffer, so one message per call,
   and its backward is one reduce-scatter (all-reduce on gloo, which has no reduce-scatter);
3. each rank folds the summaries of the ranks before it onto the initial state (the combine
   below) to get the state entering its segment, and runs the family's own op on its segment
   from that state: outputs, normalizers, bonus terms and stabilizers are the op's own.

The combine of a state with the summary ``(F, S_loc)`` of the segment after it, for a log
decay total ``F`` (per head, or per key channel ``F_k`` and value channel ``F_v`` for GLA)::

    S' = exp(F_k)[:, None] · S · exp(F_v)[None, :] + S_loc          (n likewise, with F_k)
    mLSTM-exp: m' = max(F + m, m_loc),
               S' = exp(F + m − m') S + exp(m_loc − m') S_loc        (n likewise)

with ``exp(−∞ − (−∞))`` never formed (an empty state, m = −∞, contributes exactly 0).

The delta rule (DeltaNet, Gated DeltaNet) has non-diagonal transitions: a segment maps the
state entering it by ``S ↦ M S + B`` with a K×K matrix M, and its outputs likewise affinely.
Steps 1 and 3 then merge into one local run of the op with K extra value columns that yields
M, B and both parts of the outputs; the exchange is the same single all-gather, of (M, B), and
the combine is ``S' = M S + B`` (see :class:`_DeltaCall`).

A tiny all-gather of shapes and options precedes the state exchange, so that an input error on
any rank (a bad shape, a positive log decay, a mismatch between ranks) raises a ValueError or
TypeError on *every* rank instead of leaving the others waiting in a collective.
"""

from __future__ import annotations

import inspect
import numbers
import zlib
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor

from linrnn import _validation as check
from linrnn._cp_agreement import DETAILS, fingerprint, state_parts
from linrnn.ops._generic import compute_dtype
from linrnn.ops.delta_rule import BETA_RANGE
from linrnn.ops.families import OPS, resolve
from linrnn.ops.mamba2 import check_gates, check_shapes, gates, per_head

__all__ = ["context_parallel"]

DELTA = ("delta_rule", "gated_delta_rule")
_FAMILY_ID = {name: i for i, name in enumerate(OPS)}
_DTYPE_ID = {torch.float16: 0, torch.bfloat16: 1, torch.float32: 2, torch.float64: 3}

# Tokens per block of the local state pass: bounds its temporaries (fp32 copies of one block
# of k, v and the gate cumsums), and keeps every gate cumsum short.
BLOCK = 8192

# Old names of the single-tensor collectives (torch < 2.12 has only these).
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def context_parallel(op, *args, group=None, **kwargs):
    """Run a linrnn op over a sequence split in time across the ranks of ``group``.

    ``context_parallel(op, *args, **kwargs)`` takes the arguments of ``op`` exactly as a
    single-device call would, except that every input running along T holds only this rank's
    segment; every rank of ``group`` must call it (collectively), with the same options.

    Args:
        op: the op to run: a name (``"linear_attn"``, ``"retention"``, ``"simple_gla"``,
            ``"gla"``, ``"rwkv6"``, ``"mlstm"``, ``"delta_rule"``, ``"gated_delta_rule"``,
            ``"mamba2"``) or the function itself (``linrnn.gla``).
        *args, **kwargs: the op's arguments.

            - Split along T (this rank's tokens ``[s_r, s_r + T_r)``, ``T_r ≥ 1``, any
              lengths): q/r, k, v and the per-step gates — ``g`` (simple_gla), ``gk``, ``gv``
              (gla), ``w`` (rwkv6), ``i``, ``f`` (mlstm), ``g``, ``beta`` (the delta rule);
              for mamba2 ``x``, ``dt``, ``B``, ``C``.
            - The same on every rank (replicated): ``log_decay`` (retention), ``u`` (rwkv6),
              ``A``, ``D``, ``dt_bias`` (mamba2),
              ``initial_state`` (``[N, …]`` as for one device), ``cu_seqlens``, and every
              option (``scale``, ``normalize``, ``input_gate``, ``eps``, ``use_qk_l2norm``,
              ``mode``, ``backend``, ``chunk_size``, ``output_final_state``).
            - ``cu_seqlens``: the *global* offsets of the N packed documents in the whole
              concatenated sequence (B = 1), exactly as for one device. Documents may cross
              rank boundaries (and may start exactly at one): a document boundary resets the
              state, so the state entering a rank depends on earlier ranks only back to the
              start of the document it continues, and a rank whose segment contains a
              boundary passes on only the state of its last document.
        group: the process group (default: the world group). Its ranks, in rank order, hold
            the segments in time order.

    Returns:
        ``(o, final_state)`` as the op returns them: ``o [B, T_r, H, V]`` is this rank's
        output; ``final_state`` (when ``output_final_state``) is the state after the last
        token of every sequence — ``[N, …]`` in the op's format and dtype, the same on every
        rank (each document's state, wherever in the group the document ends).

    Gradients: autograd gives each rank the gradient of the *sum of all ranks' losses* with
    respect to its own segment's inputs (q, k, v, gates). Replicated tensors (``log_decay``,
    ``u``, ``initial_state``) receive this rank's share; their sum over the group is the
    gradient — the all-reduce that data-parallel training already does for parameters. Every
    rank must backpropagate through its output (or final state): the backward has one
    collective, which all ranks must join.

    Cost: one extra pass over k and v (``O(T·K·V)``, no outputs) and one all-gather of one
    state per rank (per document when ``output_final_state`` is set with ``cu_seqlens``).
    The delta rule's transitions are not diagonal: its segments are summarized by an affine
    map (a K×K matrix and a state), from one local run with K extra value columns that also
    gives the outputs; see :class:`_DeltaCall` for the trade-off against passing states from
    rank to rank.

    Raises:
        ValueError / TypeError on every rank when any rank's input is invalid (shapes, gates,
        ``cu_seqlens``; ``B ≠ 1`` with ``cu_seqlens``), or when the ranks disagree on the
        family, options, dtype, B, H, K, V, ``cu_seqlens``, or the presence of an initial
        state.

    Example (2 ranks, each with half of one sequence)::

        >>> T_r = q.shape[1] // world; sl = slice(rank * T_r, (rank + 1) * T_r)
        >>> o, S = linrnn.distributed.context_parallel(
        ...     "gla", q[:, sl], k[:, sl], v[:, sl], gk[:, sl], output_final_state=True)
    """
    group = group if group is not None else dist.group.WORLD
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    error, call = None, None
    try:
        name = _op_name(op)
        kind = _DeltaCall if name in DELTA else _Mamba2Call if name == "mamba2" else _Call
        call = kind(name, args, kwargs)
    except (TypeError, ValueError) as e:  # raised after the exchange, on every rank
        error = e
    meta = call.meta() if call is not None else [-1] * _Call.META_LEN
    device = call.device if call is not None else _default_device(group)
    gathered = torch.empty(world * len(meta), dtype=torch.int64, device=device)
    _all_gather_single(gathered, torch.tensor(meta, dtype=torch.int64, device=device), group)
    metas = gathered.view(world, len(meta)).tolist()
    if error is not None:
        try:
            raise error
        finally:  # no frame ↔ traceback cycle keeping the process group alive past its end
            del error
    bad = [r for r, m in enumerate(metas) if m[0] != 1]
    if bad:
        raise ValueError(
            f"context_parallel: the input of rank(s) {bad} is invalid (see the error raised "
            f"there); this rank's ({rank}) input is fine"
        )
    for i, what in enumerate(_Call.META_NAMES):
        if i >= 2 and len({m[i] for m in metas}) > 1:
            if what in DETAILS:  # hashed in the exchange: fetch the values themselves
                values = DETAILS[what](call, group)
            else:
                values = ", ".join(f"rank {r}: {m[i]}" for r, m in enumerate(metas))
            raise ValueError(f"context_parallel: the ranks disagree on {what} ({values})")
    return call.run([m[1] for m in metas], rank, group)


def _default_device(group) -> torch.device:
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


@dataclass
class _Rec:
    """The generic recurrence of one family (see linrnn.ops._generic): what the state pass
    needs."""

    k: Tensor
    v: Tensor
    g: Tensor | None  # log decay [B, T, H] or [B, T, H, K]
    gv: Tensor | None  # log decay over V [B, T, H, V]
    gi: Tensor | None  # log input gate [B, T, H]
    stabilize: bool  # mLSTM-exp max state m
    track_n: bool  # normalizer state n


class _Call:
    """One rank's validated call: its arguments, family recurrence and initial state in the
    generic form ``(S, n, m)`` (n, m None when the family has none)."""

    META_NAMES = (
        "validity", "segment length", "family", "options", "dtype", "B", "H", "K", "V",
        "number of sequences N", "cu_seqlens", "initial_state (given or not)", "value heads HV",
        "initial_state values",
    )  # fmt: skip
    META_LEN = len(META_NAMES)

    def __init__(self, name, args, kwargs):
        self.name = name
        self.fn = OPS[self.name]
        try:
            bound = inspect.signature(self.fn).bind(*args, **kwargs)
        except TypeError as e:
            raise TypeError(f"context_parallel({self.name!r}, …): {e}") from None
        bound.apply_defaults()
        self.a = a = dict(bound.arguments)
        self.q, (self.B, self.T, self.H, self.K, self.V) = self._operands(a)
        self.device = self.q.device
        self.cdt = compute_dtype(self.q)
        self.output_final_state = check.flag("output_final_state", a["output_final_state"])
        self.offsets = None
        if a["cu_seqlens"] is not None:
            self.offsets = _offsets(a["cu_seqlens"])
            if self.B != 1:
                raise ValueError(
                    "with cu_seqlens the sequences are packed along T and the batch size must "
                    f"be 1, got B={self.B}"
                )
        self.N = self.B if self.offsets is None else len(self.offsets) - 1
        self.rec = self._recurrence()
        opts = sorted(
            (key, repr(x)) for key, x in a.items()
            if not isinstance(x, (Tensor, tuple, list)) and key != "cu_seqlens"
        )  # fmt: skip
        opts.append(("gv", repr(self.rec.gv is not None)))
        self.opts = opts
        self.options = zlib.crc32(repr(opts).encode())
        self.init = None if a["initial_state"] is None else self._initial_state()
        self.given_state = state_parts(a["initial_state"])

    def _operands(self, a):
        """The query (the reference tensor of the checks) and ``(B, T, H, K, V)``."""
        qn = "r" if self.name == "rwkv6" else "q"
        return a[qn], check.qkv(a[qn], a["k"], a["v"], (qn, "k", "v"))

    def meta(self) -> list[int]:
        cu = 0 if self.offsets is None else hash(tuple(self.offsets)) % (2**62) + 1
        return [
            1, self.T, _FAMILY_ID[self.name], self.options, _DTYPE_ID[self.q.dtype], self.B,
            self.H, self.K, self.V, self.N, cu, int(self.init is not None), self.H,
            fingerprint(self.given_state),
        ]  # fmt: skip

    def _gate(self, name, shape, layout, nonpositive=True):
        return check.gate(name, self.a[name], shape, self.q, layout=layout, nonpositive=nonpositive)

    def _recurrence(self) -> _Rec:
        a, (B, T, H, K, V) = self.a, (self.B, self.T, self.H, self.K, self.V)
        g = gv = gi = None
        stabilize = track_n = False
        if self.name == "linear_attn":
            track_n = check.flag("normalize", a["normalize"])
        elif self.name == "retention":
            g = self._gate("log_decay", (H,), "[H]").view(1, 1, H).expand(B, T, H)
        elif self.name == "simple_gla":
            g = self._gate("g", (B, T, H), "[B, T, H]")
        elif self.name == "gla":
            g = self._gate("gk", (B, T, H, K), "[B, T, H, K]")
            if a["gv"] is not None:
                gv = self._gate("gv", (B, T, H, V), "[B, T, H, V]")
        elif self.name == "rwkv6":
            g = self._gate("w", (B, T, H, K), "[B, T, H, K]")
            self._gate("u", (H, K), "[H, K]", nonpositive=False)
        else:  # mlstm
            check.choice("input_gate", a["input_gate"], ("exp", "sigmoid"))
            stabilize, track_n = a["input_gate"] == "exp", True
            i = self._gate("i", (B, T, H), "[B, T, H]", nonpositive=False)
            f = self._gate("f", (B, T, H), "[B, T, H]", nonpositive=False)
            g = F.logsigmoid(f.to(self.cdt))
            gi = i.to(self.cdt) if stabilize else F.logsigmoid(i.to(self.cdt))
        return _Rec(a["k"], a["v"], g, gv, gi, stabilize, track_n)

    def _initial_state(self):
        """The op's ``initial_state`` as ``(S, n, m)`` in the compute dtype; the sigmoid
        mLSTM's m is folded into C and n (its true state is unscaled)."""
        x, N, H, K, V = self.a["initial_state"], self.N, self.H, self.K, self.V
        sS, sn, sm = (N, H, K, V), (N, H, K), (N, H)
        lay = {sS: "[N, H, K, V]", sn: "[N, H, K]", sm: "[N, H]"}
        st = lambda name, t, shape: check.state(name, t, shape, self.q, lay[shape])  # noqa: E731
        if self.name == "mlstm":
            C, n, m = check.state_tuple("initial_state", x, 3, "(C, n, m)")
            C = st("initial_state[0] (C)", C, sS).to(self.cdt)
            n = st("initial_state[1] (n)", n, sn).to(self.cdt)
            m = st("initial_state[2] (m)", m, sm).to(self.cdt)
            if bool((torch.isnan(m) | (m == float("inf"))).any()):
                raise ValueError("initial_state[2] (m) must be finite or −∞ (no state)")
            if self.rec.stabilize:
                return C, n, m
            e = m.exp()
            return C * e[..., None, None], n * e[..., None], None
        if self.rec.track_n:  # linear_attn, normalize
            S, n = check.state_tuple("initial_state", x, 2, "(S, n)")
            return (
                st("initial_state (S)", S, sS).to(self.cdt),
                st("initial_state[1] (n)", n, sn).to(self.cdt),
                None,
            )
        if isinstance(x, (tuple, list)):
            raise TypeError(f"initial_state must be the tensor S [N, H, K, V], got a {type(x)}")
        return st("initial_state", x, sS).to(self.cdt), None, None

    # ---------------------------------------------------------------- state format

    def _empty(self, rows: int):
        """The zero state of ``rows`` sequences (m = −∞: no state yet)."""
        z = torch.zeros(rows, self.H, self.K, self.V, dtype=self.cdt, device=self.device)
        n = z[..., 0] if self.rec.track_n else None
        m = torch.full_like(z[..., 0, 0], float("-inf")) if self.rec.stabilize else None
        return z, n, m

    def _to_op(self, state):
        """Generic ``(S, n, m)`` → the op's state format."""
        S, n, m = state
        if self.name == "mlstm":
            return S, n, (m if m is not None else torch.zeros_like(S[..., 0, 0]))
        return (S, n) if self.rec.track_n else S

    def _init_rows(self, doc):
        if self.init is None:
            return None
        rows = slice(None) if doc is None else slice(doc, doc + 1)
        return tuple(None if x is None else x[rows] for x in self.init)

    # ---------------------------------------------------------------- the call

    def run(self, lengths: list[int], rank: int, group):
        world = len(lengths)
        starts = [sum(lengths[:r]) for r in range(world)]
        total = starts[-1] + lengths[-1]
        if self.offsets is not None:
            check.cu_seqlens(self.offsets, self.B, total, self.q)
        pieces = [_pieces(self.offsets, starts[r], lengths[r]) for r in range(world)]
        # What each rank ships: the summary of its last piece (the state it passes on), or of
        # every piece when every document's final state is wanted.
        ship = [(p if self.output_final_state else p[-1:]) for p in pieces]
        slots = max(len(s) for s in ship)
        rows = self.B if self.offsets is None else 1

        # 1. local summaries (from a zero state), 2. one all-gather.
        mine = [self._summary(lo, hi) for _, lo, hi in ship[rank]]
        layout = _Layout(rows, self.H, self.K, self.V, self.rec)
        flat = layout.pack(mine, slots, self.cdt, self.device)
        gathered = _GatherStates.apply(flat, group)  # [world, 1 + slots · size]
        # Element 0 of every rank's buffer is a zero that this rank adds to the state it starts
        # from, so its output always depends on the gathered buffer and its backward always
        # joins the collective's backward (even when its first document starts here).
        anchor = gathered[:, 0].sum()
        summaries = [layout.unpack(gathered[r], len(ship[r])) for r in range(world)]

        def slot_of(r, j):  # the shipped summary of document j's piece on rank r
            idx = [p for p, piece in enumerate(ship[r]) if piece[0] == j]
            return summaries[r][idx[0]]

        def fold(doc, ranks):
            state = self._init_rows(doc)
            for r in ranks:
                state = _advance(state, slot_of(r, doc), self.rec.stabilize)
            return state

        def doc_start(doc):
            return 0 if doc is None else self.offsets[doc]

        # 3. the state entering this rank's first piece, then the op on the segment.
        first = pieces[rank][0][0]
        before = [r for r in range(rank) if starts[r] + lengths[r] > doc_start(first)]
        states = [fold(first, before)]
        states += [self._init_rows(j) for j, _, _ in pieces[rank][1:]]
        states = [self._empty(rows) if s is None else s for s in states]
        S0 = tuple(
            None if parts[0] is None else torch.cat(parts)
            for parts in zip(*[tuple(s) for s in states])
        )
        S0 = (S0[0] + anchor.to(S0[0].dtype), *S0[1:])
        local = None
        if self.offsets is not None:
            local = [0] + [hi for _, _, hi in pieces[rank]]
        args = dict(self.a, initial_state=self._to_op(S0), output_final_state=False)
        args["cu_seqlens"] = local
        o, _ = self.fn(**args)
        if not self.output_final_state:
            return o, None

        # Final states: every document folded over the ranks that hold a piece of it.
        if self.offsets is None:
            final = fold(None, range(world))
            final = final if final is not None else self._empty(rows)
        else:
            per_doc = []
            for j in range(self.N):
                ranks = [r for r in range(world) if any(p[0] == j for p in pieces[r])]
                s = fold(j, ranks)
                per_doc.append(s if s is not None else self._empty(1))
            final = tuple(None if parts[0] is None else torch.cat(parts) for parts in zip(*per_doc))
        return o, self._to_op(final)

    def _summary(self, lo: int, hi: int):
        """``(F, F_v, S, n, m)`` of tokens ``[lo, hi)`` of this segment, from a zero state, in
        blocks of :data:`BLOCK` tokens folded with :func:`_advance`."""
        rec, acc = self.rec, None
        for b in range(lo, hi, BLOCK):
            t = slice(b, min(b + BLOCK, hi))
            k, v, g, gv, gi = (
                None if x is None else x[:, t] for x in (rec.k, rec.v, rec.g, rec.gv, rec.gi)
            )
            blk = _block_summary(k, v, g, gv, gi, rec.stabilize, rec.track_n, self.cdt)
            if acc is None:
                acc = blk
            else:
                add = lambda x, y: None if x is None else x + y  # noqa: E731
                state = _advance(acc[2:], blk, rec.stabilize)
                acc = (add(acc[0], blk[0]), add(acc[1], blk[1]), *state)
        return acc


class _Mamba2Call(_Call):
    """Mamba2's SSD as the generic recurrence it runs on (:mod:`linrnn.ops.mamba2`): keys B
    (per head), values x (Δ·x without ``dt_softplus``), log decay Δ·A, log input gate log Δ;
    D·x is the op's own, outside the state."""

    def _operands(self, a):
        shape = check_shapes(a["x"], a["B"], a["C"])
        return a["x"], (*shape, a["B"].shape[3], a["x"].shape[3])

    def _recurrence(self) -> _Rec:
        a = self.a
        x, H = a["x"], self.H
        dt, A, _, dt_bias = check_gates(x, a["dt"], a["A"], a["D"], a["dt_bias"],
                                        a["dt_softplus"], (self.B, self.T, H))  # fmt: skip
        v, g, gi = gates(x, dt, A, dt_bias, a["dt_softplus"])
        return _Rec(per_head(a["B"], H), v, g, None, gi, False, False)


class _DeltaCall:
    """One rank's validated delta-rule call (DeltaNet, Gated DeltaNet): the same collective
    protocol as :class:`_Call`, with the delta rule's affine segment summaries.

    A segment maps the state entering it affinely, ``S ↦ M S + B`` (M ``[K, K]``: the product
    of the transitions ``exp(g)(I − β k kᵀ)``; B ``[K, V]``: the state reached from zero), and
    its outputs likewise, ``o_t = o⁰_t + S_inᵀ p_t``. All of it comes from ONE local run of the
    op with V + K value columns, ``[v | 0]``, from the initial state ``[0 | I]``: its final
    state is ``[B | M]``, its outputs ``[o⁰ | p]``. After one all-gather of the (M, B) of every
    rank, each rank folds the summaries before it onto the initial state to get ``S_in`` and
    finishes its outputs with one ``[T, K] × [K, V]`` product.

    Why not pass states from rank to rank: that needs no K×K matrices (a run with V columns and
    K·V numbers per message), but rank r waits for ranks 0 … r − 1 to finish, so the forward
    takes ``world`` times one segment's time; the affine summaries let every rank run at once,
    at the price of K extra value columns in the local run and K·(K + V) numbers per head in
    the all-gather. Outputs are combined in fp32 (fp64 for fp64 inputs) from the op's ``o⁰``
    and ``p``, which the op returns in the input dtype."""

    def __init__(self, name, args, kwargs):
        self.name = name
        self.fn = OPS[name]
        try:
            bound = inspect.signature(self.fn).bind(*args, **kwargs)
        except TypeError as e:
            raise TypeError(f"context_parallel({name!r}, …): {e}") from None
        bound.apply_defaults()
        self.a = a = dict(bound.arguments)
        self.q = q = a["q"]
        self.B, self.T, self.H, self.HV, self.K, self.V = check.qkv_grouped(q, a["k"], a["v"])
        self.device, self.cdt = q.device, compute_dtype(q)
        self.output_final_state = check.flag("output_final_state", a["output_final_state"])
        check.flag("use_qk_l2norm", a["use_qk_l2norm"])
        self.offsets = None
        if a["cu_seqlens"] is not None:
            self.offsets = _offsets(a["cu_seqlens"])
            if self.B != 1:
                raise ValueError(
                    "with cu_seqlens the sequences are packed along T and the batch size must "
                    f"be 1, got B={self.B}"
                )
        self.N = self.B if self.offsets is None else len(self.offsets) - 1
        per_step = (self.B, self.T, self.HV)
        if name == "gated_delta_rule":
            check.gate("g", a["g"], per_step, q, layout="[B, T, HV]", nonpositive=True)
        check.interval("beta", a["beta"], per_step, q, layout="[B, T, HV]", low=BETA_RANGE[0],
                       high=BETA_RANGE[1])  # fmt: skip
        opts = sorted(
            (key, repr(x)) for key, x in a.items()
            if not isinstance(x, (Tensor, tuple, list)) and key != "cu_seqlens"
        )  # fmt: skip
        self.opts = opts
        self.options = zlib.crc32(repr(opts).encode())
        self.given_state = state_parts(a["initial_state"])
        self.init = None
        if a["initial_state"] is not None:
            shape = (self.N, self.HV, self.K, self.V)
            x = check.state("initial_state", a["initial_state"], shape, q, "[N, HV, K, V]")
            self.init = x.to(self.cdt)

    def meta(self) -> list[int]:
        cu = 0 if self.offsets is None else hash(tuple(self.offsets)) % (2**62) + 1
        return [
            1, self.T, _FAMILY_ID[self.name], self.options, _DTYPE_ID[self.q.dtype], self.B,
            self.H, self.K, self.V, self.N, cu, int(self.init is not None), self.HV,
            fingerprint(self.given_state),
        ]  # fmt: skip

    def _local(self, pieces):
        """The op on this segment with values ``[v | 0]`` from ``[0 | I]`` (every piece):
        outputs ``[o⁰ | p]`` and final states ``[B | M]``, one row block per piece."""
        a, (K, V, HV) = self.a, (self.K, self.V, self.HV)
        v = a["v"]
        v_aug = torch.cat([v, v.new_zeros(*v.shape[:3], K)], dim=-1)
        count = self.B if self.offsets is None else len(pieces)
        eye = torch.eye(K, dtype=self.cdt, device=self.device).expand(count, HV, K, K)
        zero = torch.zeros(count, HV, K, V, dtype=self.cdt, device=self.device)
        local = None if self.offsets is None else [0] + [hi for _, _, hi in pieces]
        args = dict(a, v=v_aug, initial_state=torch.cat([zero, eye], dim=-1),
                    output_final_state=True, cu_seqlens=local)  # fmt: skip
        return self.fn(**args)

    def _init_rows(self, doc):
        if self.init is None:
            return None
        return self.init if doc is None else self.init[doc : doc + 1]

    def run(self, lengths: list[int], rank: int, group):
        world, V = len(lengths), self.V
        starts = [sum(lengths[:r]) for r in range(world)]
        if self.offsets is not None:
            check.cu_seqlens(self.offsets, self.B, starts[-1] + lengths[-1], self.q)
        pieces = [_pieces(self.offsets, starts[r], lengths[r]) for r in range(world)]
        ship = [(p if self.output_final_state else p[-1:]) for p in pieces]
        slots = max(len(x) for x in ship)
        rows = self.B if self.offsets is None else 1

        # 1. the local run, 2. one all-gather of the shipped (M, B).
        o_aug, S_aug = self._local(pieces[rank])
        S_aug = S_aug.to(self.cdt)
        blocks = S_aug.split(rows)  # one row block per local piece
        own = [(x[..., V:], x[..., :V]) for x in blocks]
        mine = [own[pieces[rank].index(p)] for p in ship[rank]]
        size = rows * self.HV * self.K * (self.K + V)
        flat = [torch.zeros(1, dtype=self.cdt, device=self.device)]  # the anchor (see _Call)
        flat += [torch.cat([M.reshape(-1), B.reshape(-1)]) for M, B in mine]
        if slots > len(mine):
            flat.append(torch.zeros((slots - len(mine)) * size, dtype=self.cdt,
                                    device=self.device))  # fmt: skip
        gathered = _GatherStates.apply(torch.cat(flat), group)
        anchor = gathered[:, 0].sum()
        nM = rows * self.HV * self.K * self.K
        shape_M, shape_B = (rows, self.HV, self.K, self.K), (rows, self.HV, self.K, V)

        def summary(r, doc):  # the shipped (M, B) of document doc's piece on rank r
            i = next(j for j, piece in enumerate(ship[r]) if piece[0] == doc)
            buf = gathered[r, 1 + i * size : 1 + (i + 1) * size]
            return buf[:nM].view(shape_M), buf[nM:].view(shape_B)

        def fold(doc, ranks):
            state = self._init_rows(doc)
            for r in ranks:
                M, B = summary(r, doc)
                state = B if state is None else M @ state + B
            return state

        def zeros():
            return torch.zeros(shape_B, dtype=self.cdt, device=self.device)

        # 3. the state entering each local piece, and the outputs o = o⁰ + S_inᵀ p.
        first = pieces[rank][0][0]
        doc_start = 0 if first is None else self.offsets[first]
        before = [r for r in range(rank) if starts[r] + lengths[r] > doc_start]
        entering = [fold(first, before)] + [self._init_rows(j) for j, _, _ in pieces[rank][1:]]
        outs = []
        for (_, lo, hi), S_in in zip(pieces[rank], entering):
            o = o_aug[:, lo:hi, :, :V].to(self.cdt)
            if S_in is not None:
                o = o + torch.einsum("bthk,bhkv->bthv", o_aug[:, lo:hi, :, V:].to(self.cdt), S_in)
            outs.append(o)
        o = (torch.cat(outs, dim=1) + anchor).to(self.q.dtype)
        if not self.output_final_state:
            return o, None

        # Final states: every document folded over the ranks that hold a piece of it.
        if self.offsets is None:
            return o, fold(None, range(world))
        final = []
        for j in range(self.N):
            ranks = [r for r in range(world) if any(p[0] == j for p in pieces[r])]
            S = fold(j, ranks)
            final.append(zeros() if S is None else S)
        return o, torch.cat(final)


def _op_name(op) -> str:
    return resolve(op)[0]


def _offsets(cu) -> list[int]:
    if isinstance(cu, Tensor):
        if cu.dtype.is_floating_point or cu.dtype.is_complex or cu.dtype == torch.bool:
            raise TypeError(f"cu_seqlens must hold integers (int32/int64), got dtype {cu.dtype}")
        if cu.dim() != 1:
            raise ValueError(f"cu_seqlens must be 1-D, got shape {tuple(cu.shape)}")
        return [int(c) for c in cu.tolist()]
    if isinstance(cu, (list, tuple)) and all(
        isinstance(c, numbers.Integral) and not isinstance(c, bool) for c in cu
    ):
        return [int(c) for c in cu]
    raise TypeError(f"cu_seqlens must be a 1-D integer tensor or a list of ints, got {cu!r}")


def _pieces(offsets, start: int, length: int) -> list[tuple[int | None, int, int]]:
    """The non-empty pieces ``(document, lo, hi)`` of the segment ``[start, start + length)``
    in segment coordinates; the document is None without ``cu_seqlens`` (all B rows)."""
    if offsets is None:
        return [(None, 0, length)]
    end, out = start + length, []
    for j in range(len(offsets) - 1):
        lo, hi = max(offsets[j], start), min(offsets[j + 1], end)
        if lo < hi:
            out.append((j, lo - start, hi - start))
    return out


def _block_summary(k, v, g, gv, gi, stabilize, track_n, cdt):
    """State of one block from a zero state: ``S = Σ_s (k_s ⊙ a_s)(v_s ⊙ b_s)ᵀ`` with
    ``a_s = exp(R_s + gi_s − m)`` and ``b_s = exp(R^v_s)``, R_s the log decay after step s
    (a suffix sum, so every exponent is ≤ 0); also the block's total log decays F, F_v."""

    def after(x):  # Σ_{τ > s} x_τ along T, and the total
        rc = x.flip(1).cumsum(1).flip(1)
        return torch.cat([rc[:, 1:], torch.zeros_like(rc[:, :1])], 1), rc[:, 0]

    kc, vc = k.to(cdt), v.to(cdt)
    Fk = Fv = m = None
    lw = None
    if g is not None:
        lw, Fk = after(g.to(cdt))
    if gi is not None:
        lw = gi.to(cdt) if lw is None else lw + gi.to(cdt)
    if stabilize:
        m = lw.amax(1)  # [B, H]
        lw = lw - m[:, None]
    if lw is not None:
        w = lw.exp()
        kc = kc * (w[..., None] if w.dim() == 3 else w)
    if gv is not None:
        lwv, Fv = after(gv.to(cdt))
        vc = vc * lwv.exp()
    S = torch.einsum("bthk,bthv->bhkv", kc, vc)
    n = kc.sum(1) if track_n else None
    return Fk, Fv, S, n, m


def _advance(state, summary, stabilize: bool):
    """The state after a segment: ``state`` (``(S, n, m)`` or None = zero) decayed by the
    segment's total log decay, plus the segment's own state."""
    Fk, Fv, S2, n2, m2 = summary
    if state is None:
        return S2, n2, m2
    S1, n1, m1 = state
    if stabilize:  # scalar F [N, H]; the combined max state, never exp(−∞ − (−∞))
        a_log = Fk + m1
        m = torch.maximum(a_log, m2)
        ms = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        a, b = (a_log - ms).exp(), (m2 - ms).exp()
        return (
            a[..., None, None] * S1 + b[..., None, None] * S2,
            a[..., None] * n1 + b[..., None] * n2,
            m,
        )
    S, n = S1, n1
    if Fk is not None:
        dk = Fk.exp()
        dk = dk[..., None] if dk.dim() == 2 else dk  # [N, H, 1] or [N, H, K]
        S = S * dk[..., None]
        n = None if n is None else n * dk
    if Fv is not None:
        S = S * Fv.exp()[..., None, :]
    return S + S2, (None if n is None else n + n2), None


class _Layout:
    """Packing of per-piece summaries ``(F, F_v, S, n, m)`` into one flat buffer."""

    def __init__(self, rows, H, K, V, rec: _Rec):
        vector = rec.g is not None and rec.g.dim() == 4
        self.shapes = [
            None if rec.g is None else ((rows, H, K) if vector else (rows, H)),
            None if rec.gv is None else (rows, H, V),
            (rows, H, K, V),
            (rows, H, K) if rec.track_n else None,
            (rows, H) if rec.stabilize else None,
        ]
        self.sizes = [0 if s is None else torch.Size(s).numel() for s in self.shapes]
        self.size = sum(self.sizes)

    def pack(self, summaries, slots, dtype, device) -> Tensor:
        parts = [torch.zeros(1, dtype=dtype, device=device)]  # the anchor
        for summ in summaries:
            parts += [x.reshape(-1).to(dtype) for x in summ if x is not None]
        pad = (slots - len(summaries)) * self.size
        if pad:
            parts.append(torch.zeros(pad, dtype=dtype, device=device))
        return torch.cat(parts)

    def unpack(self, buf: Tensor, count: int) -> list[tuple]:
        out, pos = [], 1
        for _ in range(count):
            summ = []
            for shape, size in zip(self.shapes, self.sizes):
                summ.append(None if shape is None else buf[pos : pos + size].view(shape))
                pos += size
            out.append(tuple(summ))
        return out


class _GatherStates(torch.autograd.Function):
    """All-gather of one flat buffer per rank into ``[world, size]``; the backward sums the
    gradients of every rank's copy back to its owner (reduce-scatter; on backends without it,
    such as gloo, an all-reduce and a slice)."""

    @staticmethod
    def forward(ctx, x: Tensor, group) -> Tensor:
        ctx.group = group
        world = dist.get_world_size(group)
        out = x.new_empty(world * x.numel())  # flat: gloo accepts no [world, size] buffer
        _all_gather_single(out, x.contiguous(), group)
        return out.view(world, x.numel())

    @staticmethod
    def backward(ctx, grad: Tensor):
        grad = grad.contiguous().clone()
        if dist.get_backend(ctx.group) == "nccl":
            gx = grad.new_empty(grad.shape[1:])
            _reduce_scatter_single(gx, grad.view(-1), group=ctx.group)
        else:
            dist.all_reduce(grad, group=ctx.group)
            gx = grad[dist.get_rank(ctx.group)]
        return gx, None
