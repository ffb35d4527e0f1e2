"""FLOP and byte counts, GPU specs, the roofline floor and the runtime-optimal chunk size.

Every count is an explicit formula with its derivation in the docstring. Notation (TFLA paper,
App. F, Table 7): B batch, T sequence length, H heads, K = d_qk, V = d_hv, L chunk size,
F_c = ½ the causal factor (the fraction of a chunk's L × L score matrix that is computed),
``elt`` the bytes of one q/k/v/o element (2 for bf16), ``bytes_C`` the bytes of one state
element (4: states are fp32). A multiply–accumulate counts as 2 FLOPs.

The main count is App. G's forward of the chunkwise mLSTM-sig (TFLA), per head and chunk::

    FLOPs(L) = L²·F_c·(2K + 2V + 6) + L² + L·(4KV + 2K + V + 11) + 2KV + 5
    Bytes(L) = 6·L·(K + V) + 8·L + 2·bytes_C·K·V                (bf16 inputs, 2 fp32 gates)

It serves every family of the engine: the families differ only in gate and normalizer terms of
order L² and L·(K + V), which App. F (Table 17) puts at < 2 % of the total at head dim 64 and
~0.2 % at 512.

The delta rule (``form="delta"``; docs/DESIGN.md §1b) has its own counts
(:func:`delta_chunk_flops_per_chunk`, :func:`delta_chunk_bytes_per_chunk`): each chunk also
builds and inverts ``I + N`` (the WY/UT form) and applies it to K and V, and the state walk
forms the new values ``U − W·S``. Shapes may have grouped value heads: q and k have H heads, v,
the gates, the state and o have HV (a multiple of H; HV = H when not given).
"""

from __future__ import annotations

import math

# The runtime model's constants and the spec sheets live with the chunk-size rule that uses them.
from linrnn.engine.config import (
    F_CAUSAL,
    GPU_SPECS,
    NOMINAL_CPU_INTENSITY,  # noqa: F401 (re-exported)
    STATE_BYTES,
    runtime_optimal_chunk,  # noqa: F401 (re-exported)
)

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "fp64": 8}


def gpu_spec(name: str | None) -> dict | None:
    """The spec-sheet entry whose key is in ``name`` (case-insensitive), or None."""
    for key, bw, peak in GPU_SPECS:
        if name and key.lower() in name.lower():
            return {
                "matched": key,
                "bandwidth_Bps": bw,
                "bf16_dense_flops": peak,
                "source": "NVIDIA datasheet (spec sheet, not measured)",
            }
    return None


# --- forward FLOPs --------------------------------------------------------------------------


def chunk_flops_per_chunk(L: int, K: int, V: int, f_causal: float = F_CAUSAL) -> float:
    """Forward FLOPs of one chunk of length ``L`` for one head (TFLA paper, App. G, eq. 118)::

        L²·F_c·(2K + 2V + 6) + L² + L·(4KV + 2K + V + 11) + 2KV + 5

    ``L²·F_c·2K`` is Q Kᵀ, ``L²·F_c·2V`` the gated scores times V, ``L·2KV`` the inter-chunk
    ``Q̄ C_{k−1}`` and ``L·2KV`` the state update ``(ā ⊙ K)ᵀ V``; the rest are gates and
    pointwise terms."""
    return (
        L * L * f_causal * (2 * K + 2 * V + 6)
        + L * L
        + L * (4 * K * V + 2 * K + V + 11)
        + 2 * K * V
        + 5
    )


def chunkwise_flops(B: int, T: int, H: int, K: int, V: int, L: int, HV: int | None = None) -> float:
    """Forward FLOPs of the chunkwise form: ``B·H·Σ_chunks chunk_flops_per_chunk``.

    With ``n = T // L`` full chunks and a last chunk of ``r = T mod L`` steps this is
    ``B·H·(n·F(L) + F(r))``, which equals App. G's ``B·H·(T/L)·F(L)`` when L divides T.
    With ``HV`` value heads sharing H q/k heads (grouped; Mamba2's groups) the score matrix
    ``Q Kᵀ`` (``L²·F_c·2K``, q and k only) counts once per q/k head and the rest of F per value
    head: ``B·Σ_chunks [H·L²·F_c·2K + HV·(F(L) − L²·F_c·2K)]``."""
    HV = H if HV is None else HV
    L = max(1, min(L, T))
    n, r = divmod(T, L)

    def per(steps: int) -> float:
        if not steps:
            return 0.0
        gram = steps * steps * F_CAUSAL * 2 * K
        return H * gram + HV * (chunk_flops_per_chunk(steps, K, V) - gram)

    return B * (n * per(L) + per(r))


def chunkwise_flops_leading(B: int, T: int, H: int, K: int, V: int, L: int) -> float:
    """The matmul terms only (docs/DESIGN.md §4): ``B·T·H·[2L(K + V)·½ + 4·K·V]`` — App. G's count
    without its gate and pointwise terms, per token (``T/L`` chunks of ``L²·F_c·(2K+2V) +
    4LKV``)."""
    return B * T * H * (2 * L * (K + V) * F_CAUSAL + 4 * K * V)


def parallel_flops(B: int, T: int, H: int, K: int, V: int, HV: int | None = None) -> float:
    """Forward FLOPs of the quadratic (parallel) form: App. G's count with one chunk of length T
    and no state: ``B·H·[T²·F_c·(2K + 2V + 6) + T²]`` (grouped: ``Q Kᵀ`` per q/k head, the rest
    per value head, as :func:`chunkwise_flops`)."""
    HV = H if HV is None else HV
    gram = T * T * F_CAUSAL * 2 * K
    return B * (H * gram + HV * (T * T * F_CAUSAL * (2 * V + 6) + T * T))


def recurrent_flops(B: int, T: int, H: int, K: int, V: int, HV: int | None = None) -> float:
    """Forward FLOPs of the step-by-step form, ``B·T·H·(5KV + 2K + V)`` (derived here): per step
    the decay ``diag(α) S`` (KV), the update ``+ ι k vᵀ`` (2KV: a multiply and an add per state
    element) and the readout ``qᵀ S`` (2KV), plus scaling q (K), ι·k (K) and the output (V).
    Grouped: per value head (HV for H)."""
    return B * T * (H if HV is None else HV) * (5 * K * V + 2 * K + V)


def attention_flops(B: int, T: int, H: int, K: int, V: int) -> float:
    """Causal softmax attention (SDPA): ``B·H·T²·F_c·(2K + 2V)`` = Q Kᵀ and P V on the causal
    half (softmax itself not counted)."""
    return B * H * T * T * F_CAUSAL * (2 * K + 2 * V)


def forward_flops(
    kind: str,
    B: int,
    T: int,
    H: int,
    K: int,
    V: int,
    L: int | None,
    HV: int | None = None,
    form: str = "scalar",
) -> float:
    """Forward FLOPs of ``kind``: "chunk" and "fused_chunk" (chunkwise at L), "parallel",
    "recurrent" and "reference" (the step loop), "attention" (softmax, SDPA). ``form="delta"``:
    the delta rule's counts (parallel = one chunk of T steps). ``HV`` value heads (grouped:
    the delta rule's, Mamba2's heads over its groups): per value head but for the terms of q
    and k alone."""
    if form == "delta":
        if kind == "chunk":
            return delta_chunkwise_flops(B, T, H, K, V, L or 64, HV)
        if kind == "parallel":
            return delta_chunkwise_flops(B, T, H, K, V, T, HV)
        if kind in ("recurrent", "reference"):
            return delta_recurrent_flops(B, T, H, K, V, HV)
        raise ValueError(f"no delta-rule count for kind {kind!r}")
    if form != "scalar":
        raise ValueError(f"unknown form {form!r}")
    if kind in ("chunk", "fused_chunk"):
        return chunkwise_flops(B, T, H, K, V, L or 64, HV)
    if kind == "parallel":
        return parallel_flops(B, T, H, K, V, HV)
    if kind in ("recurrent", "reference"):
        return recurrent_flops(B, T, H, K, V, HV)
    if kind == "attention":
        return attention_flops(B, T, H, K, V)
    raise ValueError(f"unknown kind {kind!r}")


def fwdbwd_flops(forward: float) -> float:
    """Forward + backward FLOPs ``= 3 × forward``: every forward matmul ``C = A B`` has two
    gradient matmuls of its size (``dA = dC Bᵀ``, ``dB = Aᵀ dC``; App. C.3 maps dQ, dK, dV to
    matmuls of the forward's shapes), so the backward is 2 × the forward. Recomputation inside
    the backward kernels is not counted (as in App. F)."""
    return 3.0 * forward


# --- the delta rule -------------------------------------------------------------------------


def delta_chunk_flops_per_chunk(L: int, K: int, V: int, f_causal: float = F_CAUSAL) -> float:
    """Forward FLOPs of one chunk of length ``L`` for one value head of the (gated) delta
    rule's chunk form (docs/DESIGN.md §1b), derived here in App. G's manner::

        L²·F_c·(2K + 2V + 4) + L³/3 + L·(6KV + 2K + 2V + 2) + KV      (+ the Gram terms)

    Per value head: the WY/UT form ``W = A·diag(β e^b)·K`` (``L²·F_c·2K``) and
    ``U = A·diag(β)·V`` (``L²·F_c·2V``), with ``A = (I + N)⁻¹`` by forward substitution on
    the unit lower-triangular ``L × L`` matrix (``L³/6`` multiply–adds: ``L³/3``); the walk's
    new values ``U − W·S`` (``2LKV``) and state update ``e^{b_L}·S + (K ⊙ e^{b_L − b})ᵀ·vn``
    (``2LKV + KV``); the output ``e^b ⊙ (Q·S)`` (``2LKV``) and the decayed scores times the new
    values (``L²·F_c·2V``); the β and decay factors of N and of the scores (``L²·F_c·4``), the
    scalings of K and V rows and the subtraction (``L·(2K + 2V)``), the gate's cumsum and
    exponent (``2L``). The two Gram matrices ``K Kᵀ`` (of N) and ``Q Kᵀ`` (of the scores),
    ``L²·F_c·4K``, depend on q and k only: they are counted once per q/k head, by
    :func:`delta_chunkwise_flops`, not here. Without decay (DeltaNet) the same count (its
    decay terms, ``O(L²)``, are < 1 % at K = V = 128)."""
    return (
        L * L * f_causal * (2 * K + 2 * V + 4)
        + L**3 / 3
        + L * (6 * K * V + 2 * K + 2 * V + 2)
        + K * V
    )


def delta_gram_flops_per_chunk(L: int, K: int, f_causal: float = F_CAUSAL) -> float:
    """The two Gram matrices of one chunk and q/k head, ``K Kᵀ`` and ``Q Kᵀ`` on the causal
    half: ``L²·F_c·4K``."""
    return L * L * f_causal * 4 * K


def delta_chunkwise_flops(
    B: int, T: int, H: int, K: int, V: int, L: int, HV: int | None = None
) -> float:
    """Forward FLOPs of the delta rule's chunk form: ``B·Σ_chunks [H·gram(L) + HV·F(L)]``
    (:func:`delta_gram_flops_per_chunk` per q/k head, :func:`delta_chunk_flops_per_chunk` per
    value head; a last chunk of ``T mod L`` steps)."""
    HV = H if HV is None else HV
    L = max(1, min(L, T))
    n, r = divmod(T, L)

    def per(steps: int) -> float:
        if not steps:
            return 0.0
        return H * delta_gram_flops_per_chunk(steps, K) + HV * delta_chunk_flops_per_chunk(
            steps, K, V
        )

    return B * (n * per(L) + per(r))


def delta_recurrent_flops(B: int, T: int, H: int, K: int, V: int, HV: int | None = None) -> float:
    """Forward FLOPs of the delta rule step by step, ``B·T·HV·(7KV + 2K + 3V)`` (derived here):
    per step and value head the decay ``e^g·S`` (KV), the prediction ``Sᵀk`` (2KV), the update
    ``S + k·(β·(v − Sᵀk))ᵀ`` (2KV), the readout ``Sᵀq`` (2KV), plus normalizing q and k (2K·2
    per q/k head, counted per value head: 2K) and ``v − Sᵀk``, its β scaling and the output
    scale (3V)."""
    HV = H if HV is None else HV
    return B * T * HV * (7 * K * V + 2 * K + 3 * V)


def delta_chunk_bytes_per_chunk(
    L: int, K: int, V: int, elt: int = 2, gate_elems: float = 2, state_bytes: int = STATE_BYTES
) -> float:
    """HBM bytes of one chunk and value head in the delta rule's chunk forward, with its
    intermediates materialized as the four-kernel pipeline of linrnn (and fla) does::

        elt·L·(2K + 2V)     q, k, v read, o written (once each)
      + 2·4·L²              A = (I + N)⁻¹ (fp32) written by the solve, read by W/U
      + 2·elt·L·(K + V)     W and U written, read by the walk
      + 2·elt·L·V           the new values written by the walk, read by the output
      + 2·bytes_C·K·V       the state entering the chunk written, read by the output
      + 4·g·L               the gates read once

    Re-reads of k (solve, W/U, walk and output each read it) are not counted."""
    return (
        elt * L * (2 * K + 2 * V)
        + 8 * L * L
        + 2 * elt * L * (K + V)
        + 2 * elt * L * V
        + 2 * state_bytes * K * V
        + 4 * gate_elems * L
    )


# --- bytes ----------------------------------------------------------------------------------


def min_bytes(
    B: int,
    T: int,
    H: int,
    K: int,
    V: int,
    elt: int = 2,
    gate_elems: float = 0,
    state_in: bool = False,
    state_out: bool = False,
    state_elems: int | None = None,
    HV: int | None = None,
) -> float:
    """The fewest bytes one forward must move (the floor; docs/DESIGN.md §4)::

        B·T·H·[elt·(2K + 2V) + 4·g] + (state_in + state_out)·B·H·bytes_C·s

    q, k, v read and o written in the input dtype, ``g = gate_elems`` fp32 gate values per
    token and head read (1 for simple GLA, 2 for mLSTM, K for GLA/RWKV6, 0 for retention's
    per-head constant; a gate in the input dtype counts elt/4), and the initial state read /
    final state written when the call takes / returns one (``s = state_elems``, default K·V;
    decoding must do both every step). With ``HV`` value heads (grouped): q, k have H heads,
    v, o, the gates and the state HV: ``B·T·[elt·(2·H·K + 2·HV·V) + 4·HV·g] + … B·HV·…``."""
    s = K * V if state_elems is None else state_elems
    n_state = int(state_in) + int(state_out)
    HV = H if HV is None else HV
    tokens = B * T * (elt * (2 * H * K + 2 * HV * V) + 4 * HV * gate_elems)
    return tokens + n_state * B * HV * STATE_BYTES * s


def min_bytes_fwdbwd(
    B: int,
    T: int,
    H: int,
    K: int,
    V: int,
    elt: int = 2,
    gate_elems: float = 0,
    HV: int | None = None,
) -> float:
    """Fewest bytes of forward + backward: the forward's :func:`min_bytes`, then the backward
    reads q, k, v, the gates and dO and writes dq, dk, dv and the gate gradients::

        min_bytes + B·T·H·[elt·(2K + 2V) + elt·(2K + V) + 8·g]

    (grouped: ``B·T·[elt·(2HK + 2HV·V) + elt·(2HK + HV·V) + 8·HV·g]``)."""
    HV = H if HV is None else HV
    fwd = min_bytes(B, T, H, K, V, elt, gate_elems, HV=HV)
    back = elt * (2 * H * K + 2 * HV * V) + elt * (2 * H * K + HV * V) + 8 * HV * gate_elems
    return fwd + B * T * back


def chunk_bytes_per_chunk(
    L: int, K: int, V: int, elt: int = 2, gate_elems: int = 2, state_bytes: int = STATE_BYTES
) -> float:
    """HBM bytes of one chunk and head in the two-kernel TFLA forward (App. G, eq. 118,
    generalized from bf16 and mLSTM's two gates)::

        3·elt·L·(K + V) + 4·g·L + 2·bytes_C·K·V

    The recurrent kernel reads k, v (``elt·L·(K+V)``) and writes the state ``C_k``; the
    parallel kernel reads q, k, v, writes o (``2·elt·L·(K+V)``) and reads ``C_{k−1}``; the
    gates are read once (``4·g·L``). With elt = 2, g = 2: ``6L(K + V) + 8L + 2·bytes_C·KV``."""
    return 3 * elt * L * (K + V) + 4 * gate_elems * L + 2 * state_bytes * K * V


def algorithm_bytes(
    kind: str,
    B: int,
    T: int,
    H: int,
    K: int,
    V: int,
    L: int | None,
    elt: int = 2,
    gate_elems: float = 0,
    state_in: bool = False,
    state_out: bool = False,
    HV: int | None = None,
    form: str = "scalar",
) -> float:
    """HBM bytes the algorithm moves in one forward (the x-axis of the roofline and the
    "achieved GB/s"):

    * "chunk": ``B·HV·Σ_chunks chunk_bytes_per_chunk`` (states materialized in HBM; each
      value head's kernels read its q/k head's chunk); the delta rule: ``B·HV·Σ_chunks
      delta_chunk_bytes_per_chunk``;
    * "fused_chunk", "attention": :func:`min_bytes` (the state or scores stay on chip);
    * "recurrent"/"reference": the state read and written every step (App. F, Table 13, the
      decoding setting): ``min_bytes + B·T·H·2·bytes_C·K·V``;
    * "parallel": ``min_bytes`` plus the fp32 T × T score and decay matrices written and read
      once each, ``B·H·4·T²·4``.

    With grouped value heads the per-head terms of v, o, the gates and the state count HV."""
    HV = H if HV is None else HV
    base = min_bytes(B, T, H, K, V, elt, gate_elems, state_in, state_out, HV=HV)
    if kind == "chunk":
        L = max(1, min(L or 64, T))
        n, r = divmod(T, L)
        if form == "delta":
            per = lambda n_steps: delta_chunk_bytes_per_chunk(  # noqa: E731
                n_steps, K, V, elt, gate_elems)  # fmt: skip
        else:
            per = lambda n_steps: chunk_bytes_per_chunk(n_steps, K, V, elt, gate_elems)  # noqa: E731
        state_io = base - min_bytes(B, T, H, K, V, elt, gate_elems, HV=HV)
        return B * HV * (n * per(L) + (per(r) if r else 0)) + state_io
    if kind in ("fused_chunk", "attention"):
        return base
    if kind in ("recurrent", "reference"):
        return base + B * T * HV * 2 * STATE_BYTES * K * V
    if kind == "parallel":
        return base + B * HV * 4 * T * T * 4
    raise ValueError(f"unknown kind {kind!r}")


def chunk_memory_bytes(
    B: int, T: int, H: int, K: int, V: int, L: int, elt: int = 2, gate_elems: int = 0
) -> float:
    """Analytical peak memory of one chunkwise forward + backward (used by the chunk-size
    choice when nothing is measured)::

        B·T·H·[elt·(2·(2K + 2V)) + 8·g] + 2·B·H·⌈T/L⌉·bytes_C·K·V

    inputs, output, dO and the input gradients, plus the materialized chunk states and their
    gradients (the term that shrinks as L grows). Intra-chunk tiles are not counted."""
    tokens = B * T * H * (elt * 2 * (2 * K + 2 * V) + 8 * gate_elems)
    return tokens + 2 * B * H * math.ceil(T / L) * STATE_BYTES * K * V


# --- floor, roofline and chunk size ---------------------------------------------------------


def floor_ms(flops: float, n_bytes: float, spec: dict) -> float:
    """The roofline floor ``max(bytes / bandwidth, FLOPs / peak)`` in ms."""
    return 1e3 * max(n_bytes / spec["bandwidth_Bps"], flops / spec["bf16_dense_flops"])


def roofline(intensity: float, spec: dict) -> float:
    """Attainable FLOP/s at arithmetic intensity ``I`` (FLOP/byte): ``min(β·I, α)``
    (App. G, roofline model)."""
    return min(spec["bandwidth_Bps"] * intensity, spec["bf16_dense_flops"])


def case_figures(
    kind: str,
    shape: dict,
    L: int | None,
    elt: int,
    gate_elems: float,
    fwd_ms: float | None,
    fwdbwd_ms: float | None,
    spec: dict | None,
    state_in: bool = False,
    state_out: bool = False,
    form: str = "scalar",
) -> dict:
    """The counts and rates of one measured case: forward and forward + backward FLOPs, the
    algorithm's bytes and the minimum bytes, arithmetic intensity, achieved TFLOP/s and GB/s,
    and with a spec the floor and "× floor" (measured time / floor; forward and fwd+bwd).
    ``shape`` may carry HV (grouped value heads); ``form`` picks the FLOP/byte model."""
    B, T, H, K, V = (shape[d] for d in "BTHKV")
    HV = shape.get("HV", H)
    f = forward_flops(kind, B, T, H, K, V, L, HV=HV, form=form)
    alg = algorithm_bytes(kind, B, T, H, K, V, L, elt, gate_elems, state_in, state_out, HV=HV,
                          form=form)  # fmt: skip
    least = min_bytes(B, T, H, K, V, elt, gate_elems, state_in, state_out, HV=HV)
    out = {
        "fwd_flops": f,
        "fwdbwd_flops": fwdbwd_flops(f),
        "fwd_bytes": alg,
        "min_bytes": least,
        "min_bytes_fwdbwd": min_bytes_fwdbwd(B, T, H, K, V, elt, gate_elems, HV=HV),
        "intensity": f / alg,
        "fwd_tflops": f / (fwd_ms * 1e9) if fwd_ms else None,
        "fwdbwd_tflops": fwdbwd_flops(f) / (fwdbwd_ms * 1e9) if fwdbwd_ms else None,
        "fwd_gbps": alg / (fwd_ms * 1e6) if fwd_ms else None,
        "floor_ms": None,
        "x_floor": None,
        "x_floor_fwdbwd": None,
    }
    if spec:
        out["floor_ms"] = floor_ms(f, least, spec)
        out["floor_fwdbwd_ms"] = floor_ms(fwdbwd_flops(f), out["min_bytes_fwdbwd"], spec)
        out["x_floor"] = fwd_ms / out["floor_ms"] if fwd_ms else None
        out["x_floor_fwdbwd"] = fwdbwd_ms / out["floor_fwdbwd_ms"] if fwdbwd_ms else None
    return out
