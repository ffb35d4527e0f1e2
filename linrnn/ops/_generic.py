"""The one generic recurrence behind every family: mode/backend dispatch, packed sequences,
the normalizer, dtypes. Family front ends validate their arguments, map them onto

    g  (log decay: [B,T,H] scalar or [B,T,H,K] vector)   gv (log decay over V, [B,T,H,V])
    gi (log input gate, [B,T,H])                          u  (bonus [H,K] → exclusive form)
    stabilize (mLSTM max state)   track_n (carry n_t = α n + ι k)   normalizer (None/sum/mlstm)

and call :func:`run`. The normalizer state n is carried as one extra value column of ones, so
every implementation only ever sees the plain matrix recurrence.
"""

from __future__ import annotations

import contextvars
import functools
import os
from typing import NamedTuple

import torch
from torch import Tensor

from linrnn import _runtime
from linrnn import _validation as check
from linrnn.engine import config, torch_chunk
from linrnn.reference import parallel, recurrent

MODES = ("reference", "recurrent", "parallel", "chunk", "fused_chunk")
BACKENDS = (None, "torch", "triton")

try:  # the Triton engine; without Triton the PyTorch path serves every call
    from linrnn.engine import custom_ops, interpreter, scalar, vector
    from linrnn.engine import recurrent as triton_rec
except ImportError:
    scalar = vector = custom_ops = triton_rec = interpreter = None

# The modes with a Triton kernel (they take the inputs in their own dtype and fuse the
# normalizer, so run() hands them the family's switches instead of the generic recurrence).
TRITON_MODES = ("chunk", "fused_chunk", "recurrent") if scalar is not None else ()
TRITON_DTYPES = (torch.float16, torch.bfloat16, torch.float32)

# mode=None picks the recurrent kernel for sequences up to this long (decoding, short prompts).
RECURRENT_MAX_T = 64


class Route(NamedTuple):
    """Where one call goes: the mode, the backend ("torch" or "triton") and, in the chunk
    modes, the chunk length L (None otherwise). (A named tuple: a decode step makes one, and a
    frozen dataclass's construction costs a few µs of it.)"""

    mode: str
    backend: str
    chunk_size: int | None


def _vector(g, gv, u) -> bool:
    """Whether the gates are per-channel (GLA, RWKV6): the vector host serves them."""
    return (g is not None and g.dim() == 4) or gv is not None or u is not None


def _gpu(device: torch.device) -> bool:
    """Whether backend=None prefers the Triton kernels on ``device``."""
    return device.type == "cuda"


def route(family: str, q: Tensor, v: Tensor, *, g=None, gv=None, u=None, grad: bool = False,
          cu_seqlens=None, mode=None, backend=None, chunk_size=None,
          stabilize: bool = False) -> Route:  # fmt: skip
    """Decide mode, backend and chunk size of one call, once: mode=None by
    :func:`_default_mode` (``stabilize``: mLSTM's exponential input gate); backend=None the
    Triton kernel on a GPU where one serves the inputs (fp16/bf16/fp32), else PyTorch; the
    chunk size by :func:`linrnn.engine.config.resolve_chunk_size`. Raises for a combination
    nothing can run."""
    check.choice("mode", mode, (None, *MODES))
    check.choice("backend", backend, BACKENDS)
    device = q.device
    if mode is None:
        mode = _default_mode(family, q, v, backend=backend, cu_seqlens=cu_seqlens, grad=grad,
                             vector=_vector(g, gv, u), stabilize=stabilize,
                             chunk_size=chunk_size)  # fmt: skip
    if backend is None:
        serves = mode in TRITON_MODES and q.dtype in TRITON_DTYPES
        if mode != "recurrent" and u is not None and gv is not None:
            serves = False  # the one combination no family makes: no chunk kernel for it
        backend = "triton" if _gpu(device) and serves else "torch"
    if backend == "triton":
        if mode in ("reference", "parallel"):
            raise ValueError(f"mode={mode!r} is a PyTorch reference; use backend='torch' or None")
        if device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
            raise ValueError(
                "backend='triton' on CPU tensors needs the Triton interpreter: set "
                "TRITON_INTERPRET=1 before importing triton, or use backend='torch'"
            )
        if scalar is None:
            raise ImportError(
                f"{family}: backend='triton' needs the triton package (pip install "
                "'linrnn[triton]'); backend='torch' or None runs without it"
            )
        # (an eager call probes; a traced one cannot launch a kernel at trace time)
        if device.type == "cpu" and not _runtime.tracing():
            if (problem := interpreter.problem()) is not None:
                raise RuntimeError(f"{family}: {problem}")
        if mode not in TRITON_MODES:
            raise NotImplementedError(
                f"{family}: the Triton kernel for mode={mode!r} is not implemented yet; "
                "use backend='torch' (modes 'chunk', 'recurrent', 'parallel', 'reference')"
            )
    elif mode == "fused_chunk":
        raise NotImplementedError(
            f"{family}: mode={mode!r} exists only as a Triton kernel; with backend='torch' use "
            "'chunk' (fast), 'recurrent', 'parallel' or 'reference'"
        )
    elif mode == "recurrent" and _runtime.tracing() and q.shape[1] != 1:
        # Traced, the step loop would unroll T steps and recompile for every new length: the
        # chunk engine computes the same recurrence with one graph for all T (T = 1, a decode
        # step, keeps the loop of one step).
        mode, chunk_size = "chunk", None
    if mode not in ("chunk", "fused_chunk"):
        return Route(mode, backend, None)
    K, V = q.shape[-1], v.shape[-1]
    L = config.resolve_chunk_size(
        chunk_size, K, V, triton=backend == "triton", fused=mode == "fused_chunk",
        vector=_vector(g, gv, u),
        family=family, dtype=q.dtype, device=device,
        T=None if _runtime.tracing() else q.shape[1],
    )  # fmt: skip
    return Route(mode, backend, L)


def run(
    family: str,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    scale: float,
    g: Tensor | None = None,
    gv: Tensor | None = None,
    gi: Tensor | None = None,
    u: Tensor | None = None,
    stabilize: bool = False,
    track_n: bool = False,
    normalizer: str | None = None,
    eps: float = 0.0,
    S0: Tensor | None = None,
    n0: Tensor | None = None,
    m0: Tensor | None = None,
    cu_seqlens: list[int] | None = None,
    mode=None,
    backend=None,
    chunk_size=None,
    skip: Tensor | None = None,
    step_gates: dict | None = None,
) -> tuple[Tensor, tuple[Tensor, Tensor | None, Tensor | None]]:
    """Run the generic recurrence; returns ``(o, (S_T, n_T, m_T))`` with o in q's dtype and the
    states in fp32 (fp64 for fp64 inputs). ``n_T`` is None unless ``track_n``, ``m_T`` unless
    ``stabilize``. Inputs are assumed validated. ``skip`` ([H]): o_t += skip[h]·v_t (Mamba2's
    D·x), which only the eager Triton recurrent kernel without gradients adds; callers add it
    themselves elsewhere. ``step_gates``: gates that kernel forms from their pre-activations
    (:func:`linrnn.engine.recurrent.forward`'s ``f``, ``i`` and ``fold_m0``, or ``dt``,
    ``dt_bias`` and ``A``), for calls :func:`kernel_gates` admits."""
    grad = _needs_grad(q, k, v, g, gv, gi, u, S0, n0, m0)
    r = route(family, q, v, g=g, gv=gv, u=u, grad=grad, cu_seqlens=cu_seqlens, mode=mode,
              backend=backend, chunk_size=chunk_size, stabilize=stabilize)  # fmt: skip
    switches = dict(scale=scale, g=g, gv=gv, gi=gi, u=u, stabilize=stabilize, track_n=track_n,
                    normalizer=normalizer, eps=eps, S0=S0, n0=n0, m0=m0)  # fmt: skip
    if (skip is not None or step_gates) and not kernel_gates(r, grad):
        raise NotImplementedError(
            f"skip and step_gates: only the eager Triton recurrent kernel takes them, {r}"
        )
    if r.backend == "triton":
        if r.mode == "recurrent":
            return _run_triton_recurrent(family, q, k, v, grad=grad, cu_seqlens=cu_seqlens,
                                         skip=skip, **(step_gates or {}), **switches)  # fmt: skip
        return _run_triton_chunk(family, q, k, v, cu_seqlens=cu_seqlens, chunk_size=r.chunk_size,
                                 fused=r.mode == "fused_chunk", **switches)  # fmt: skip
    if r.mode == "chunk":
        impl = functools.partial(torch_chunk.chunk, chunk_size=r.chunk_size)
    else:
        impl = parallel if r.mode == "parallel" else recurrent
    cdt = compute_dtype(q)
    cast = lambda x: None if x is None else x.to(cdt)  # noqa: E731
    qc, kc, vc, g, gv, gi, u, S0, n0, m0 = map(cast, (q, k, v, g, gv, gi, u, S0, n0, m0))
    if _runtime.tracing():
        qc, kc, vc, g, gv, gi = map(_contiguous_grad, (qc, kc, vc, g, gv, gi))
    V = vc.shape[-1]
    if track_n:
        vc = torch.cat([vc, torch.ones_like(vc[..., :1])], dim=-1)
        if S0 is not None:
            n0 = torch.zeros_like(S0[..., 0]) if n0 is None else n0
            S0 = torch.cat([S0, n0[..., None]], dim=-1)
    gates = dict(g=g, gv=gv, gi=gi, u=u, stabilize=stabilize)

    if cu_seqlens is None:
        o, m_seq, S, m_T = impl(qc, kc, vc, scale=scale, S0=S0, m0=m0, **gates)
    else:
        o, m_seq, S, m_T = _packed(impl, qc, kc, vc, scale, gates, S0, m0, cu_seqlens)

    if normalizer is None:
        out = o[..., :V]
    else:
        if _runtime.tracing():  # num, den (and m) are saved for backward: dense copies
            o = _dense(o)
            m_seq = None if m_seq is None else _dense(m_seq)
        num, den = o[..., :V], o[..., V:]
        if normalizer == "sum":
            out = num / (den + eps)
        else:  # mlstm: max(|q·n|, exp(−m)), the floor is exp(−0) = 1 without the stabilizer
            if stabilize:  # (exp(−m) overflows for m < −88: no positive exponent formed)
                out = torch_chunk.max_state_normalize(num, den, m_seq[..., None], eps)
            else:
                out = num / (den.abs().clamp_min(1) + eps)
    n_T = S[..., V].contiguous() if track_n else None
    return _out(out, q.dtype), (S[..., :V].contiguous() if track_n else S, n_T, m_T)


def kernel_gates(r: Route, grad: bool) -> bool:
    """Whether a call routed to ``r`` runs the eager Triton recurrent kernel without gradients
    (a decode step), which forms gates from their pre-activations itself and adds a skip term
    (:func:`run`'s ``step_gates`` and ``skip``): the step is then one launch."""
    return r == ("recurrent", "triton", None) and not grad and not _runtime.tracing()


def _out(o: Tensor, dtype: torch.dtype) -> Tensor:
    """The PyTorch path's output in the input dtype, made dense while tracing (:func:`_dense`)."""
    o = o.to(dtype)
    return _dense(o) if _runtime.tracing() else o


def _dense(x: Tensor) -> Tensor:
    """A contiguous copy. The PyTorch engine's outputs are transposed views ([B, H, T, V] in
    memory); inductor may lay such a tensor out on its own when the backward saves it, and the
    backward graph then pins its strides to the first call's numbers (T specialized under
    ``mark_dynamic``: ConstraintViolationError). ``clone``, not ``contiguous()``: the latter
    asks whether the view is contiguous, a guard on T."""
    return x.clone(memory_format=torch.contiguous_format)


# Set by linrnn.step(inplace=True): the state tensors the Triton recurrent kernel writes the
# final state into (they may alias the initial state; the kernel reads each tile first).
OUT_STATE: contextvars.ContextVar = contextvars.ContextVar("linrnn_out_state", default=None)


def _default_mode(family: str, q: Tensor, v: Tensor, *, backend, cu_seqlens, grad: bool,
                  vector: bool, stabilize: bool, chunk_size) -> str:  # fmt: skip
    """``mode=None`` on the Triton path (CUDA with fp16/bf16/fp32 inputs, or backend="triton"):
    ``"recurrent"`` when no gradient is needed and every sequence has at most
    :data:`RECURRENT_MAX_T` steps (one launch, no chunk states: decoding, short prompts);
    ``"fused_chunk"`` at the default chunk size where :func:`linrnn.engine.config.default_fused`
    says it measured faster than ``"chunk"``; ``"chunk"`` otherwise, and always on the PyTorch
    path (a Python loop over steps never beats the chunked matmuls there)."""
    triton_ok = "recurrent" in TRITON_MODES and (
        backend == "triton" or (backend is None and _gpu(q.device) and q.dtype in TRITON_DTYPES)
    )
    if not triton_ok:
        return "chunk"
    if cu_seqlens is None:
        N, longest = q.shape[0], q.shape[1]
    else:
        N = len(cu_seqlens) - 1
        longest = max(cu_seqlens[i + 1] - cu_seqlens[i] for i in range(N))
    if not grad and longest <= RECURRENT_MAX_T:
        return "recurrent"
    op = f"mlstm[{'exp' if stabilize else 'sigmoid'}]" if family == "mlstm" else family
    K, V, walkers = q.shape[3], v.shape[3], N * v.shape[2]
    if chunk_size is None and not vector and config.default_fused(op, K, V, walkers, grad):
        return "fused_chunk"
    return "chunk"


def _needs_grad(*tensors) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def _triton_dtype(family: str, q: Tensor) -> None:
    if q.dtype not in TRITON_DTYPES:
        raise TypeError(
            f"{family}: the Triton kernels take float16, bfloat16 or float32 inputs, got "
            f"{q.dtype}; use backend='torch' for float64"
        )


def _run_triton_recurrent(family, q, k, v, *, grad, cu_seqlens, skip=None, f=None, i=None,
                          fold_m0=None, dt=None, dt_bias=None, A=None, **kw):  # fmt: skip
    """The Triton recurrent kernel: every family, packed sequences native; with gradients the
    autograd Function of :mod:`linrnn.engine.recurrent` (no in-place final state then)."""
    _triton_dtype(family, q)
    for name in ("g", "gv", "gi", "u"):
        if kw[name] is not None:
            kw[name] = kw[name].float()
    if _runtime.tracing():  # torch.compile: the custom ops (no in-place state: step() copies)
        o, S, n, m = custom_ops.recurrent(q, k, v, offsets=cu_seqlens, save=grad, **kw)
        return o, (S, n, m)
    if grad:  # the autograd Function
        o, S, n, m = triton_rec.recurrent(q, k, v, offsets=cu_seqlens, **kw)
        return o, (S, n, m)
    out = OUT_STATE.get()
    if out is not None:  # an in-place step: write where the caller's state lives
        N = q.shape[0] if cu_seqlens is None else len(cu_seqlens) - 1
        shape = (N, v.shape[2], q.shape[3], v.shape[3])
        parts = (*out, None, None)
        out = (_fits(parts[0], shape), _fits(parts[1], shape[:3]) if kw["track_n"] else None,
               _fits(parts[2], shape[:2]) if kw["stabilize"] or fold_m0 is not None
               else None)  # fmt: skip
    (o, S, n, m), _ = triton_rec.forward(q, k, v, offsets=cu_seqlens, out_state=out, skip=skip,
                                         f=f, i=i, fold_m0=fold_m0, dt=dt, dt_bias=dt_bias, A=A,
                                         **kw)  # fmt: skip
    return o, (S, n, m)


def _fits(part, shape: tuple) -> Tensor | None:
    """``part`` if the kernel can write a final state of ``shape`` into it, else None."""
    if part is not None and part.shape == shape and part.is_contiguous():
        return part
    return None


def _run_triton_chunk(family, q, k, v, *, g, gv, gi, u, cu_seqlens, **switches):
    """A Triton chunk-engine call: inputs stay in their dtype, gates go in as fp32; scalar
    gates to :mod:`linrnn.engine.scalar`, per-channel ones to the vector host; while
    torch.compile traces, the same kernels as opaque custom ops."""
    _triton_dtype(family, q)
    f32 = lambda x: None if x is None else x.float()  # noqa: E731
    g, gi, gv, u = f32(g), f32(gi), f32(gv), f32(u)
    offsets = None if cu_seqlens is None else [int(x) for x in cu_seqlens]
    if _runtime.tracing():
        o, S, n, m = custom_ops.chunk(q, k, v, g=g, gi=gi, gv=gv, u=u, offsets=offsets,
                                      **switches)  # fmt: skip
    elif _vector(g, gv, u):
        o, S, n, m = _vector_chunk(q, k, v, g=g, gi=gi, gv=gv, u=u, offsets=offsets, **switches)
    else:
        o, S, n, m = scalar.chunk(q, k, v, g=g, gi=gi, offsets=offsets, **switches)
    return o, (S, n, m)


def _vector_chunk(q, k, v, *, scale, g, gi, gv, u, stabilize, track_n, normalizer, eps, S0,
                  n0, m0, chunk_size, fused, offsets):  # fmt: skip
    if gi is not None or stabilize or track_n or normalizer is not None:
        raise NotImplementedError("vector gates with input gate / normalizer: no kernel")
    o, S_T = vector.chunk(
        q, k, v, scale=scale, g=g, gv=gv, u=u, S0=S0, chunk_size=chunk_size, fused=fused,
        offsets=offsets,
    )  # fmt: skip
    return o, S_T, None, None


def _packed(impl, q, k, v, scale, gates, S0, m0, offsets):
    """Packed variable-length batch (B == 1): each sequence runs on its own, from its own
    initial state, and the outputs are concatenated back along T."""
    H, K, V = q.shape[2], q.shape[3], v.shape[3]
    N = len(offsets) - 1
    lengths = [offsets[i + 1] - offsets[i] for i in range(N)]
    # torch.split, not x[:, s:e] per sequence: slicing in a loop makes autograd build a
    # full-size zero gradient per sequence in backward (O(N·T) work).
    split = lambda x: [None] * N if x is None else x.split(lengths, dim=1)  # noqa: E731
    parts = {name: split(x) for name, x in dict(q=q, k=k, v=v, **gates).items()
             if name in ("q", "k", "v", "g", "gv", "gi")}  # fmt: skip
    S0s = [None] * N if S0 is None else S0.split(1)
    m0s = [None] * N if m0 is None else m0.split(1)
    outs, m_seqs, states, m_Ts = [], [], [], []
    for i in range(N):
        if lengths[i] == 0:  # empty sequence: the state passes through unchanged
            outs.append(parts["v"][i])
            if gates["stabilize"]:
                m_seqs.append(q.new_zeros(1, 0, H))
                m_Ts.append(m0s[i] if m0 is not None else q.new_full((1, H), float("-inf")))
            states.append(S0s[i] if S0 is not None else q.new_zeros(1, H, K, V))
            continue
        seq = {name: p[i] for name, p in parts.items()}
        o, m_seq, S, m_T = impl(
            seq.pop("q"), seq.pop("k"), seq.pop("v"), scale=scale, S0=S0s[i], m0=m0s[i],
            u=gates["u"], stabilize=gates["stabilize"], **seq,
        )  # fmt: skip
        outs.append(o)
        states.append(S)
        if gates["stabilize"]:
            m_seqs.append(m_seq)
            m_Ts.append(m_T)
    o = torch.cat(outs, dim=1)
    S = torch.cat(states, dim=0)
    if gates["stabilize"]:
        return o, torch.cat(m_seqs, dim=1), S, torch.cat(m_Ts, dim=0)
    return o, None, S, None


class _ContiguousGrad(torch.autograd.Function):
    """Identity whose backward makes the gradient contiguous. The PyTorch engine's input
    gradients come back transposed ([B, H, T, ·] memory order); some ATen backward kernels
    (e.g. ``elu_backward`` in torch 2.13) keep that layout on real tensors but claim a
    contiguous one in their meta function, so a traced graph ``view``s them wrongly. Used only
    while tracing; costs one copy of each gradient (fused away by inductor)."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad.contiguous()


def _contiguous_grad(x):
    return x if x is None or not x.requires_grad else _ContiguousGrad.apply(x)


# The state parts' layouts, as the messages name them: "S" [N, H, K, V], "n" [N, H, K], "m" [N, H].
_STATE_LAYOUTS = {"S": "[N, H, K, V]", "n": "[N, H, K]", "m": "[N, H]"}


class Call:
    """One validated call: sizes ``B, T, H, K, V`` and ``N`` (the number of states: B, or the
    number of packed sequences), the offsets, the scale and the dispatch options."""

    def __init__(self, q, dims, offsets, scale, mode, backend, chunk_size):
        self.q = q
        self.B, self.T, self.H, self.K, self.V, self.N = dims
        self.offsets, self.scale = offsets, scale
        self.mode, self.backend, self.chunk_size = mode, backend, chunk_size

    def state(self, name: str, x, kind: str = "S") -> Tensor:
        """Check one part of an initial state: ``kind`` "S" [N, H, K, V], "n" [N, H, K] or
        "m" [N, H]."""
        shape = (self.N, self.H, self.K, self.V)[: 4 if kind == "S" else 3 if kind == "n" else 2]
        return check.state(name, x, shape, self.q, _STATE_LAYOUTS[kind])

    def route(self, family: str, v, grad: bool, stabilize: bool = False) -> Route:
        """:func:`route` of this call (values ``v``, ``grad`` its gradient need)."""
        return route(family, self.q, v, grad=grad, cu_seqlens=self.offsets, mode=self.mode,
                     backend=self.backend, chunk_size=self.chunk_size,
                     stabilize=stabilize)  # fmt: skip

    def kernel_gates(self, family: str, v, grad: bool) -> bool:
        """:func:`kernel_gates` of this call's route (values ``v``, ``grad`` its gradient need)."""
        if grad or _runtime.tracing():
            return False
        return kernel_gates(self.route(family, v, grad), grad)

    def run(self, family: str, q, k, v, **generic):
        """:func:`run` with this call's scale, offsets and dispatch options."""
        return run(
            family, q, k, v, scale=self.scale, cu_seqlens=self.offsets, mode=self.mode,
            backend=self.backend, chunk_size=self.chunk_size, **generic,
        )  # fmt: skip


def prepare(
    q, k, v, scale, cu_seqlens, mode, backend, chunk_size, output_final_state,
    names=("q", "k", "v"),
) -> Call:  # fmt: skip
    """Checks common to every op (in the order of its signature's shared arguments)."""
    check.choice("mode", mode, (None, *MODES))
    check.choice("backend", backend, BACKENDS)
    check.flag("output_final_state", output_final_state)
    config.check_chunk_size(chunk_size)
    B, T, H, K, V = check.qkv(q, k, v, names)
    offsets = None if cu_seqlens is None else check.cu_seqlens(cu_seqlens, B, T, q)
    N = B if offsets is None else len(offsets) - 1
    return Call(q, (B, T, H, K, V, N), offsets, check.scale(scale, K), mode, backend, chunk_size)


def compute_dtype(x: Tensor) -> torch.dtype:
    """fp64 for fp64 inputs (exact checks), else fp32: states and gate math never run in 16 bits."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


COMMON_ARGS = """\
scale: multiplier of the query, default ``K ** -0.5``.
        initial_state: state to start from (shapes above, N = B, or the number of sequences
            with ``cu_seqlens``), any float dtype; None starts from zero.
        output_final_state: also return the state after the last step (fp32; fp64 for fp64
            inputs). Passing it back as ``initial_state`` continues the sequence exactly.
        cu_seqlens: ``[N + 1]`` integer offsets of N sequences packed along T (B must be 1);
            each sequence starts from its own initial state and returns its own final state.
        mode: ``"chunk"`` (chunkwise-parallel, matmul-based), ``"recurrent"`` (one step at a
            time), ``"parallel"`` (quadratic log-space reference), ``"reference"`` (the
            step-by-step reference loop), ``"fused_chunk"`` (Triton only; no chunk states
            stored, the lowest memory). None (default): ``"recurrent"`` on the Triton path
            when no gradient is needed and every sequence has ≤ 64 steps, ``"fused_chunk"``
            at the default chunk size where it measured faster (linear attention, retention,
            mLSTM's sigmoid form at head dims ≤ 128, given enough sequences × heads: the table
            ``linrnn.engine.config.FUSED_DEFAULT``), else ``"chunk"``.
        chunk_size: chunk length L (any L ≥ 1; T need not be a multiple; an L past both 128
            and the next power of two ≥ T is cut to that: one chunk either way), or ``"auto"`` (the
            fastest L measured by ``linrnn bench --suite chunksize --save-cache`` for this
            family, head dims, dtype and GPU, else linrnn's measurement on this GPU model,
            else the analytical optimum of the TFLA paper's runtime model, App. G).
            Default 64 on the PyTorch path; on the Triton path 128 when K or V ≥ 128 (GLA,
            RWKV6: when K or V ≥ 256), else 64;
            ``fused_chunk`` takes L ≤ 128 (default 64).
        backend: ``"torch"``, ``"triton"`` (fp16/bf16/fp32 inputs) or None (Triton on CUDA
            tensors where a kernel exists, PyTorch otherwise).

    Returns:
        ``(o, final_state)``: o has v's shape ``[B, T, H, V]`` and q's dtype; final_state is
        None unless ``output_final_state``.

    Raises:
        TypeError / ValueError naming the offending argument for wrong types, shapes, devices,
        non-finite gates, bad ``cu_seqlens`` or unknown modes; NotImplementedError for a
        Triton mode that has no kernel yet."""


def document(fn):
    """Insert the arguments every op shares into ``fn``'s docstring (at ``{common}``)."""
    fn.__doc__ = fn.__doc__.replace("{common}", COMMON_ARGS)
    return fn
