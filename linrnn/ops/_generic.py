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
import numbers
import os
from collections.abc import Callable

import torch
from torch import Tensor

from linrnn import _runtime
from linrnn import _validation as check
from linrnn.engine import torch_chunk
from linrnn.reference import parallel, recurrent

MODES = ("reference", "recurrent", "parallel", "chunk", "fused_chunk")
BACKENDS = (None, "torch", "triton")
DEFAULT_CHUNK_SIZE = 64

# Triton implementations, by mode. Their signature is the engine's (see triton_chunk.chunk):
# they take the inputs in their own dtype and fuse the normalizer, so run() hands them the
# family's switches instead of the generic matrix recurrence.
_TRITON: dict[str, Callable] = {}
try:
    from linrnn.engine import triton_chunk, triton_ops, triton_recurrent, triton_recurrent_bwd
except ImportError:  # no Triton: the PyTorch path serves every call
    triton_chunk = triton_ops = triton_recurrent = triton_recurrent_bwd = None
else:
    _TRITON["chunk"] = triton_chunk.chunk
    _TRITON["fused_chunk"] = functools.partial(triton_chunk.chunk, fused=True)
    _TRITON["recurrent"] = triton_recurrent.recurrent


def _chunk_size(value) -> int:
    if value is None:
        return DEFAULT_CHUNK_SIZE
    if value == "auto":  # resolved per call in run(); validation only here
        return DEFAULT_CHUNK_SIZE
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"chunk_size must be a positive int, 'auto' or None, got {value!r}")
    if value < 1:
        raise ValueError(f"chunk_size must be ≥ 1, got {value}")
    return int(value)


def select(family: str, mode, backend, device: torch.device, chunk_size) -> Callable:
    """Resolve ``(mode, backend)`` to an implementation of the generic recurrence."""
    check.choice("mode", mode, (None, *MODES))
    check.choice("backend", backend, BACKENDS)
    mode = mode or "chunk"
    if backend is None:
        backend = "triton" if device.type == "cuda" and mode in _TRITON else "torch"
    if backend == "triton":
        if mode in ("reference", "parallel"):
            raise ValueError(f"mode={mode!r} is a PyTorch reference; use backend='torch' or None")
        if device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
            raise ValueError(
                "backend='triton' on CPU tensors needs the Triton interpreter: set "
                "TRITON_INTERPRET=1 before importing triton, or use backend='torch'"
            )
        if mode not in _TRITON:
            raise NotImplementedError(
                f"{family}: the Triton kernel for mode={mode!r} is not implemented yet; "
                "use backend='torch' (modes 'chunk', 'recurrent', 'parallel', 'reference')"
            )
        return _TRITON[mode]
    if mode in ("reference", "recurrent"):
        return recurrent
    if mode == "parallel":
        return parallel
    if mode == "chunk":
        L = _chunk_size(chunk_size)

        def _chunk(*args, **kwargs):
            return torch_chunk.chunk(*args, chunk_size=L, **kwargs)

        return _chunk
    raise NotImplementedError(
        f"{family}: mode={mode!r} exists only as a Triton kernel; with backend='torch' use "
        "'chunk' (fast), 'recurrent', 'parallel' or 'reference'"
    )


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
) -> tuple[Tensor, tuple[Tensor, Tensor | None, Tensor | None]]:
    """Run the generic recurrence; returns ``(o, (S_T, n_T, m_T))`` with o in q's dtype and the
    states in fp32 (fp64 for fp64 inputs). ``n_T`` is None unless ``track_n``, ``m_T`` unless
    ``stabilize``. Inputs are assumed validated."""
    if mode is None:
        mode = _default_mode(q, backend, cu_seqlens, (q, k, v, g, gv, gi, u, S0, n0, m0))
    if isinstance(chunk_size, str):  # "auto" (validated in prepare)
        chunk_size = _auto_chunk_size(family, q, v, mode)
    impl = select(family, mode, backend, q.device, chunk_size)
    if backend is None and impl in _TRITON.values() and not _triton_takes(impl, q, g, gv, u):
        impl = select(family, mode, "torch", q.device, chunk_size)  # e.g. fp64 on CUDA
    if impl is recurrent and mode == "recurrent" and _runtime.tracing() and q.shape[1] != 1:
        # Traced, the step loop would unroll T steps and recompile for every new length: the
        # chunk engine computes the same recurrence with one graph for all T (T = 1, a decode
        # step, keeps the loop of one step).
        impl = select(family, "chunk", "torch", q.device, None)
    if impl is _TRITON.get("recurrent"):
        grad = _needs_grad(q, k, v, g, gv, gi, u, S0, n0, m0)
        return _run_triton_recurrent(
            triton_recurrent_bwd.recurrent if grad else impl, family, q, k, v, scale=scale,
            g=g, gv=gv, gi=gi, u=u, stabilize=stabilize, track_n=track_n,
            normalizer=normalizer, eps=eps, S0=S0, n0=n0, m0=m0, cu_seqlens=cu_seqlens,
        )  # fmt: skip
    elif impl in _TRITON.values():
        return _run_triton(
            impl, family, q, k, v, scale=scale, g=g, gv=gv, gi=gi, u=u, stabilize=stabilize,
            track_n=track_n, normalizer=normalizer, eps=eps, S0=S0, n0=n0, m0=m0,
            cu_seqlens=cu_seqlens, chunk_size=chunk_size,
        )  # fmt: skip
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
        num, den = o[..., :V], o[..., V:]
        if normalizer == "sum":
            out = num / (den + eps)
        else:  # mlstm: max(|q·n|, exp(−m)), the floor is exp(−0) = 1 without the stabilizer
            mag = den.abs()
            if stabilize:
                mag = torch.maximum(mag, torch.exp(-m_seq)[..., None])
            else:
                mag = mag.clamp_min(1)
            out = num / (mag + eps)
    n_T = S[..., V].contiguous() if track_n else None
    return out.to(q.dtype), (S[..., :V].contiguous() if track_n else S, n_T, m_T)


# Set by linrnn.step(inplace=True): the state tensors the Triton recurrent kernel writes the
# final state into (they may alias the initial state; the kernel reads each tile first).
OUT_STATE: contextvars.ContextVar = contextvars.ContextVar("linrnn_out_state", default=None)


# mode=None picks the recurrent kernel for sequences up to this long (decoding, short prompts).
RECURRENT_MAX_T = 64


def _default_mode(q: Tensor, backend, cu_seqlens, tensors) -> str:
    """``mode=None``: ``"recurrent"`` when the Triton recurrent kernel can serve the call (CUDA
    or backend="triton", no gradient needed) and every sequence has at most
    :data:`RECURRENT_MAX_T` steps — one launch, no chunk states, the fastest for decoding and
    short prompts; ``"chunk"`` otherwise (on the PyTorch path a Python loop over steps never
    beats the chunked matmuls)."""
    triton_ok = "recurrent" in _TRITON and (
        backend == "triton" or (backend is None and q.device.type == "cuda")
    )
    if not triton_ok or _needs_grad(*tensors):
        return "chunk"
    if cu_seqlens is None:
        longest = q.shape[1]
    else:
        longest = max(cu_seqlens[i + 1] - cu_seqlens[i] for i in range(len(cu_seqlens) - 1))
    return "recurrent" if longest <= RECURRENT_MAX_T else "chunk"


def _auto_chunk_size(family: str, q: Tensor, v: Tensor, mode) -> int:
    """``chunk_size="auto"``: linrnn.bench.autotune's choice for this family, head dims, dtype
    and device — measured timings cached by ``linrnn bench --suite chunksize --save-cache``,
    else seed 003 App. G's runtime-optimal estimate; fused_chunk keeps L ≤ 128 (≤ 64 for head
    dims above 128)."""
    from linrnn.bench.autotune import choose_chunk_size

    B, T, H, K = q.shape
    L = choose_chunk_size(family, K, v.shape[-1], q.dtype, q.device, shape=(B, T, H))
    if mode != "fused_chunk":
        return L
    # One fused chunk is one register tile: at K = V = 256 on an H200, L = 128 ran 3–8× slower
    # than L = 64 (spills; benchmarks/results/2026-11-21-h200-s3-notes.md §3).
    return min(L, 64 if max(K, v.shape[-1]) > 128 else 128)


# Whether backend=None serves per-channel decays (gla, rwkv6) in mode="chunk" with the Triton
# kernels (else the PyTorch path). On since their chunk mode passed the GPU correctness check
# (H200, Triton 3.6: gla, gla[gv], rwkv6 × bf16/fp16/fp32, every gradient; session 4).
TRITON_VECTOR_CHUNK_BY_DEFAULT = True


def _triton_takes(impl, q, g, gv, u) -> bool:
    """Whether the Triton implementation ``impl`` serves these inputs by default (backend=None
    picks the PyTorch path where it does not: fp64; per-channel decays in mode="chunk", see
    :data:`TRITON_VECTOR_CHUNK_BY_DEFAULT`)."""
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        return False
    if impl is _TRITON.get("recurrent"):
        return True
    vector = (g is not None and g.dim() == 4) or gv is not None
    if vector and impl is _TRITON.get("chunk") and not TRITON_VECTOR_CHUNK_BY_DEFAULT:
        return False  # (fused_chunk exists only in Triton: it keeps the kernel)
    return not (u is not None and gv is not None)  # the one combination no family makes


def _needs_grad(*tensors) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def _run_triton_recurrent(fn, family, q, k, v, *, cu_seqlens, **kw):
    """The Triton recurrent kernel: every family, packed sequences native; with gradients the
    autograd Function of triton_recurrent_bwd (no in-place final state then)."""
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise TypeError(
            f"{family}: the Triton kernels take float16, bfloat16 or float32 inputs, got "
            f"{q.dtype}; use backend='torch' for float64"
        )
    f32 = lambda x: None if x is None else x.float()  # noqa: E731
    for name in ("g", "gv", "gi", "u"):
        kw[name] = f32(kw[name])
    if _runtime.tracing():  # torch.compile: the custom ops (no in-place state: step() copies)
        o, S, n, m = triton_ops.traced(fn)(q, k, v, offsets=cu_seqlens, **kw)
        return o, (S, n, m)
    if fn is not triton_recurrent.recurrent:  # with gradients: the autograd Function
        o, S, n, m = fn(q, k, v, offsets=cu_seqlens, **kw)
        return o, (S, n, m)
    out = OUT_STATE.get()
    if out is not None:  # an in-place step: write where the caller's state lives
        B, H, K, V = q.shape[0], q.shape[2], q.shape[3], v.shape[3]
        N = B if cu_seqlens is None else len(cu_seqlens) - 1
        shapes = [(N, H, K, V), (N, H, K), (N, H)]
        want = [True, kw["track_n"], kw["stabilize"]]
        parts = list(out) + [None] * 3
        out = [p if (w and p is not None and tuple(p.shape) == s and p.is_contiguous())
               else None for p, s, w in zip(parts, shapes, want)]  # fmt: skip
    o, S, n, m = fn(q, k, v, offsets=cu_seqlens, out_state=out, **kw)
    return o, (S, n, m)


def _run_triton(fn, family, q, k, v, *, g, gv, gi, u, S0, n0, m0, cu_seqlens, **switches):
    """A Triton engine call: inputs stay in their dtype, gates go in as fp32."""
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise TypeError(
            f"{family}: the Triton kernels take float16, bfloat16 or float32 inputs, got "
            f"{q.dtype}; use backend='torch' for float64"
        )
    f32 = lambda x: None if x is None else x.float()  # noqa: E731
    g, gi, gv, u = f32(g), f32(gi), f32(gv), f32(u)
    offsets = None if cu_seqlens is None else [int(x) for x in cu_seqlens]
    vec = {n: x for n, x in (("gv", gv), ("u", u)) if x is not None}
    if _runtime.tracing():  # torch.compile: the same kernels as opaque custom ops
        fn = triton_ops.traced(fn)
    o, S, n, m = fn(q, k, v, g=g, gi=gi, S0=S0, n0=n0, m0=m0, offsets=offsets, **vec,
                    **switches)  # fmt: skip
    return o, (S, n, m)


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


_STATE_DIMS = {"S": ("N", "H", "K", "V"), "n": ("N", "H", "K"), "m": ("N", "H")}


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
        dims = _STATE_DIMS[kind]
        shape = tuple(getattr(self, d) for d in dims)
        return check.state(name, x, shape, self.q, "[" + ", ".join(dims) + "]")

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
    _chunk_size(chunk_size)
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
            when no gradient is needed and every sequence has ≤ 64 steps, else ``"chunk"``.
        chunk_size: chunk length L (any L ≥ 1; T need not be a multiple), or ``"auto"`` (the
            fastest L measured by ``linrnn bench --suite chunksize --save-cache`` for this
            family, head dims, dtype and GPU, else the analytical optimum of TFLA App. G).
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
