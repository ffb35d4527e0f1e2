"""Bad-input tests for every public op.

Each op has a builder that makes valid, freshly seeded random inputs; every test breaks one
thing and checks the exception type *and* that the message names the argument and the value
or shape received. Positive controls at the top prove the builders are valid, so a test that
"raises" cannot pass because the inputs were already broken elsewhere.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import linrnn
from linrnn.ops import _generic

B, T, H, K, V = 2, 5, 3, 4, 6  # K ≠ V so that swapped dimensions are caught


def shp(*dims: int) -> str:
    """Regex for a shape printed as a tuple, e.g. ``\\(2, 5, 3, 4\\)``."""
    return re.escape(str(tuple(dims)))


# --------------------------------------------------------------------------------------------
# Builders: valid inputs for each op, as keyword arguments.
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Op:
    fn: Callable
    gates: Callable  # (gen, B, T, H, K, V) -> dict of gate tensors
    names: tuple[str, str, str] = ("q", "k", "v")
    state: str = "S"  # "S": S; "Sn": (S, n); "Cnm": (C, n, m)
    extra: dict = field(default_factory=dict)
    positive_qk: bool = False  # normalized linear attention needs positive features

    @property
    def family(self) -> str:
        return self.fn.__name__


def _retention_gates(gen, B, T, H, K, V):
    return {"log_decay": torch.log1p(-(2.0 ** (-5.0 - torch.arange(H, dtype=torch.float32))))}


def _simple_gla_gates(gen, B, T, H, K, V):
    return {"g": F.logsigmoid(torch.randn(B, T, H, generator=gen))}


def _gla_gates(gen, B, T, H, K, V):
    return {"gk": F.logsigmoid(torch.randn(B, T, H, K, generator=gen)) / 4}


def _gla_gv_gates(gen, B, T, H, K, V):
    gates = _gla_gates(gen, B, T, H, K, V)
    gates["gv"] = F.logsigmoid(torch.randn(B, T, H, V, generator=gen)) / 4
    return gates


def _rwkv6_gates(gen, B, T, H, K, V):
    return {
        "w": -torch.exp(torch.randn(B, T, H, K, generator=gen)),
        "u": torch.randn(H, K, generator=gen).abs(),  # positive on purpose: u is no log decay
    }


def _mlstm_gates(gen, B, T, H, K, V):
    return {
        "i": torch.randn(B, T, H, generator=gen) + 1,  # positive pre-activations are fine
        "f": torch.randn(B, T, H, generator=gen) + 3,
    }


OPS = {
    "linear_attn": Op(linrnn.linear_attn, lambda *a: {}),
    "linear_attn-normalize": Op(
        linrnn.linear_attn,
        lambda *a: {},
        state="Sn",
        extra={"normalize": True},
        positive_qk=True,
    ),
    "retention": Op(linrnn.retention, _retention_gates),
    "simple_gla": Op(linrnn.simple_gla, _simple_gla_gates),
    "gla": Op(linrnn.gla, _gla_gates),
    "gla-gv": Op(linrnn.gla, _gla_gv_gates),
    "rwkv6": Op(linrnn.rwkv6, _rwkv6_gates, names=("r", "k", "v"), extra={"scale": 1.0}),
    "mlstm-exp": Op(linrnn.mlstm, _mlstm_gates, state="Cnm"),
    "mlstm-sigmoid": Op(linrnn.mlstm, _mlstm_gates, state="Cnm", extra={"input_gate": "sigmoid"}),
}
OP_IDS = list(OPS)
STATE_OPS = {s: [n for n, op in OPS.items() if op.state == s] for s in ("S", "Sn", "Cnm")}


def build(op_id: str, B=B, T=T, H=H, K=K, V=V, seed=0) -> dict:
    """Valid keyword arguments for ``OPS[op_id].fn`` (fresh tensors on every call)."""
    op = OPS[op_id]
    gen = torch.Generator().manual_seed(seed)
    nq, nk, nv = op.names
    q = torch.randn(B, T, H, K, generator=gen)
    k = torch.randn(B, T, H, K, generator=gen)
    if op.positive_qk:
        q, k = F.elu(q) + 1, F.elu(k) + 1
    v = torch.randn(B, T, H, V, generator=gen)
    return {nq: q, nk: k, nv: v, **op.gates(gen, B, T, H, K, V), **op.extra}


def build_state(op_id: str, N: int, H=H, K=K, V=V, seed=1):
    """A valid initial state for ``N`` sequences."""
    gen = torch.Generator().manual_seed(seed)
    S = torch.randn(N, H, K, V, generator=gen)
    n = torch.rand(N, H, K, generator=gen) + 0.5
    kind = OPS[op_id].state
    if kind == "S":
        return S
    if kind == "Sn":
        return (S, n)
    return (S, n, torch.randn(N, H, generator=gen))


def call(op_id: str, kwargs: dict):
    return OPS[op_id].fn(**kwargs)


# --------------------------------------------------------------------------------------------
# Positive controls
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["chunk", "recurrent", "parallel", "reference", None])
@pytest.mark.parametrize("op_id", OP_IDS)
def test_valid_inputs_run(op_id, mode):
    kw = build(op_id)
    kw["initial_state"] = build_state(op_id, B)
    o, state = call(op_id, {**kw, "mode": mode, "output_final_state": True})
    assert o.shape == (B, T, H, V) and o.dtype == torch.float32
    assert torch.isfinite(o).all()
    S = state if OPS[op_id].state == "S" else state[0]
    assert S.shape == (B, H, K, V)


@pytest.mark.parametrize(
    "cu",
    [
        pytest.param([0, 2, 5], id="list"),
        pytest.param((0, 1, 1, 5), id="tuple-with-empty-seq"),
        pytest.param([np.int64(0), np.int64(3), np.int64(5)], id="list-numpy-ints"),
        pytest.param(torch.tensor([0, 2, 5], dtype=torch.int32), id="int32"),
        pytest.param([0, 5], id="one-seq"),
    ],
)
@pytest.mark.parametrize("op_id", OP_IDS)
def test_valid_cu_seqlens_run(op_id, cu):
    N = len(cu) - 1
    kw = build(op_id, B=1)
    kw["initial_state"] = build_state(op_id, N)
    o, state = call(op_id, {**kw, "cu_seqlens": cu, "mode": "chunk", "output_final_state": True})
    assert o.shape == (1, T, H, V) and torch.isfinite(o).all()
    S = state if OPS[op_id].state == "S" else state[0]
    assert S.shape == (N, H, K, V)


@pytest.mark.parametrize("op_id", STATE_OPS["Cnm"])
def test_mlstm_minus_inf_m_means_no_state(op_id):
    kw = build(op_id)
    C, n, m = build_state(op_id, B)
    m[0, 1] = float("-inf")
    o, _ = call(op_id, {**kw, "initial_state": (C, n, m), "mode": "chunk"})
    assert torch.isfinite(o).all()


# --------------------------------------------------------------------------------------------
# q, k, v
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "pos, bad, type_name",
    [
        pytest.param(0, lambda x: x.tolist(), "list", id="arg0-list"),
        pytest.param(1, lambda x: x.numpy(), "ndarray", id="k-numpy"),
        pytest.param(2, lambda x: 1.0, "float", id="v-float"),
        pytest.param(0, lambda x: None, "NoneType", id="arg0-None"),
    ],
)
@pytest.mark.parametrize("op_id", OP_IDS)
def test_qkv_not_a_tensor(op_id, pos, bad, type_name):
    kw = build(op_id)
    name = OPS[op_id].names[pos]
    kw[name] = bad(kw[name])
    with pytest.raises(TypeError, match=rf"^{name} must be a torch\.Tensor, got {type_name}$"):
        call(op_id, kw)


@pytest.mark.parametrize(
    "pos, dtype",
    [
        pytest.param(0, torch.int64, id="arg0-int64"),
        pytest.param(1, torch.int32, id="k-int32"),
        pytest.param(2, torch.bool, id="v-bool"),
        pytest.param(0, torch.complex64, id="arg0-complex64"),
    ],
)
@pytest.mark.parametrize("op_id", OP_IDS)
def test_qkv_non_float_dtype(op_id, pos, dtype):
    kw = build(op_id)
    name = OPS[op_id].names[pos]
    kw[name] = kw[name].to(dtype)
    with pytest.raises(TypeError, match=rf"^{name} must be float16, .* got dtype {dtype}$"):
        call(op_id, kw)


@pytest.mark.parametrize(
    "pos, shape",
    [
        pytest.param(0, (B, T, H * K), id="arg0-3d"),
        pytest.param(1, (B, T, H, K, 1), id="k-5d"),
        pytest.param(2, (T, H, V), id="v-3d"),
        pytest.param(0, (B, T, H, 1, K), id="arg0-5d"),
    ],
)
@pytest.mark.parametrize("op_id", OP_IDS)
def test_qkv_wrong_rank(op_id, pos, shape):
    kw = build(op_id)
    name = OPS[op_id].names[pos]
    kw[name] = torch.randn(shape)
    with pytest.raises(
        ValueError, match=rf"^{name} must have 4 dimensions, got shape {shp(*shape)}"
    ):
        call(op_id, kw)


@pytest.mark.parametrize("op_id", OP_IDS)
def test_qkv_all_3d(op_id):
    """The common mistake: [B, T, D] inputs without a head axis."""
    kw = build(op_id)
    nq, nk, nv = OPS[op_id].names
    kw[nq], kw[nk], kw[nv] = torch.randn(B, T, K), torch.randn(B, T, K), torch.randn(B, T, V)
    with pytest.raises(
        ValueError, match=rf"^{nq} must have 4 dimensions, got shape {shp(B, T, K)}"
    ):
        call(op_id, kw)


@pytest.mark.parametrize(
    "shape",
    [
        pytest.param((B, T, H, K + 1), id="K"),
        pytest.param((B, T + 1, H, K), id="T"),
        pytest.param((B, T, H, V), id="K-is-V"),
        pytest.param((1, T, H, K), id="B"),
        pytest.param((B, T, 1, K), id="H"),
    ],
)
@pytest.mark.parametrize("op_id", OP_IDS)
def test_k_shape_differs_from_q(op_id, shape):
    kw = build(op_id)
    nq, nk, _ = OPS[op_id].names
    kw[nk] = torch.randn(shape)
    with pytest.raises(
        ValueError,
        match=rf"^{nk} must have the shape of {nq} \[B, T, H, K\] = {shp(B, T, H, K)}, "
        rf"got {shp(*shape)}$",
    ):
        call(op_id, kw)


@pytest.mark.parametrize(
    "shape",
    [
        pytest.param((B + 1, T, H, V), id="B"),
        pytest.param((B, T - 1, H, V), id="T"),
        pytest.param((B, T, H + 1, V), id="H"),
    ],
)
@pytest.mark.parametrize("op_id", OP_IDS)
def test_v_batch_time_heads_differ(op_id, shape):
    kw = build(op_id)
    nq, _, nv = OPS[op_id].names
    kw[nv] = torch.randn(shape)
    with pytest.raises(
        ValueError,
        match=rf"^{nv} must be \[B, T, H, V\] with B, T, H = {shp(B, T, H)} as in {nq}, "
        rf"got {shp(*shape)}$",
    ):
        call(op_id, kw)


@pytest.mark.parametrize(
    "pos, dtype",
    [
        pytest.param(1, torch.float64, id="k-fp64"),
        pytest.param(2, torch.float16, id="v-fp16"),
        pytest.param(0, torch.bfloat16, id="arg0-bf16"),
    ],
)
@pytest.mark.parametrize("op_id", OP_IDS)
def test_qkv_mixed_dtypes(op_id, pos, dtype):
    kw = build(op_id)
    names = OPS[op_id].names
    kw[names[pos]] = kw[names[pos]].to(dtype)
    dtypes = [dtype if i == pos else torch.float32 for i in range(3)]
    with pytest.raises(
        TypeError,
        match=rf"^{', '.join(names)} must share one dtype, got {re.escape(str(dtypes)[1:-1])}$",
    ):
        call(op_id, kw)


@pytest.mark.parametrize("dim", ["B", "T", "H", "K", "V"])
@pytest.mark.parametrize("op_id", OP_IDS)
def test_zero_sized_dimension(op_id, dim):
    sizes = {"B": B, "T": T, "H": H, "K": K, "V": V, dim: 0}
    kw = build(op_id, **sizes)
    nq, nk, nv = OPS[op_id].names
    with pytest.raises(
        ValueError, match=rf"^{nq}, {nk}, {nv} must have every dimension ≥ 1, got .*\b{dim}=0\b"
    ):
        call(op_id, kw)


# --------------------------------------------------------------------------------------------
# Gates
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Gate:
    op_id: str
    name: str
    layout: str
    shape: tuple[int, ...]
    log_decay: bool  # must be ≤ 0

    @property
    def id(self) -> str:
        return f"{self.op_id}-{self.name}"


GATES = [
    Gate("retention", "log_decay", "[H]", (H,), True),
    Gate("simple_gla", "g", "[B, T, H]", (B, T, H), True),
    Gate("gla", "gk", "[B, T, H, K]", (B, T, H, K), True),
    Gate("gla-gv", "gk", "[B, T, H, K]", (B, T, H, K), True),
    Gate("gla-gv", "gv", "[B, T, H, V]", (B, T, H, V), True),
    Gate("rwkv6", "w", "[B, T, H, K]", (B, T, H, K), True),
    Gate("rwkv6", "u", "[H, K]", (H, K), False),
    Gate("mlstm-exp", "i", "[B, T, H]", (B, T, H), False),
    Gate("mlstm-exp", "f", "[B, T, H]", (B, T, H), False),
    Gate("mlstm-sigmoid", "i", "[B, T, H]", (B, T, H), False),
    Gate("mlstm-sigmoid", "f", "[B, T, H]", (B, T, H), False),
]
DECAY_GATES = [g for g in GATES if g.log_decay]

# Wrong shapes, as functions of the right one: a missing/extra axis, one size off, and the
# realistic mix-ups (K for V, per-head vs per-step, [H, K] vs [K, H]).
BAD_GATE_SHAPES = {
    "log_decay": [(H + 1,), (1, H), (B, T, H)],
    "g": [(B, T, H, 1), (B, T), (B, T + 1, H), (H,)],
    "gk": [(B, T, H, V), (B, T, H), (B, T, 1, K)],
    "gv": [(B, T, H, K), (B, T, H)],
    "w": [(B, T, H, V), (B, T, H), (H, K)],
    "u": [(K, H), (1, H, K), (H,), (B, T, H, K)],
    "i": [(B, T, H, 1), (B, T), (T, H)],
    "f": [(B, T, H, 1), (B, H, T)],
}
GATE_SHAPE_CASES = [
    pytest.param(g, bad, id=f"{g.id}-{'x'.join(map(str, bad))}")
    for g in GATES
    for bad in BAD_GATE_SHAPES[g.name]
]


def test_gate_table_covers_every_gate():
    """GATES lists every gate of every op (so adding one without a test fails here)."""
    assert {(g.op_id, g.name) for g in GATES} == {
        (op_id, name)
        for op_id in OP_IDS
        for name in build(op_id)
        if name not in (*OPS[op_id].names, *OPS[op_id].extra)
    }


@pytest.mark.parametrize("gate, bad", GATE_SHAPE_CASES)
def test_gate_wrong_shape(gate, bad):
    kw = build(gate.op_id)
    kw[gate.name] = torch.zeros(bad) - 0.1
    with pytest.raises(
        ValueError,
        match=rf"^{gate.name} must have shape {re.escape(gate.layout)} = {shp(*gate.shape)}, "
        rf"got {shp(*bad)}$",
    ):
        call(gate.op_id, kw)


@pytest.mark.parametrize("gate", GATES, ids=lambda g: g.id)
def test_gate_not_a_tensor(gate):
    kw = build(gate.op_id)
    kw[gate.name] = kw[gate.name].tolist()
    with pytest.raises(TypeError, match=rf"^{gate.name} must be a torch\.Tensor, got list$"):
        call(gate.op_id, kw)


@pytest.mark.parametrize("gate", GATES, ids=lambda g: g.id)
def test_gate_integer_dtype(gate):
    kw = build(gate.op_id)
    kw[gate.name] = kw[gate.name].long()
    with pytest.raises(
        TypeError, match=rf"^{gate.name} must be float16, .*got dtype torch\.int64$"
    ):
        call(gate.op_id, kw)


@pytest.mark.parametrize("gate", GATES, ids=lambda g: g.id)
def test_gate_in_another_dtype_is_accepted(gate):
    """Gates may have their own float dtype (they are used in fp32)."""
    kw = build(gate.op_id)
    kw[gate.name] = kw[gate.name].double()
    o, _ = call(gate.op_id, kw)
    assert o.dtype == torch.float32 and torch.isfinite(o).all()


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")], ids=str)
@pytest.mark.parametrize("gate", GATES, ids=lambda g: g.id)
def test_gate_non_finite(gate, value):
    kw = build(gate.op_id)
    x = kw[gate.name]
    idx = tuple(s - 1 for s in x.shape)  # the last element
    x[idx] = value
    with pytest.raises(
        ValueError,
        match=rf"^{gate.name} must be finite; 1 of {x.numel()} values are not "
        rf"\(first at index {re.escape(str(list(idx)))}: {value}\)$",
    ):
        call(gate.op_id, kw)


@pytest.mark.parametrize("value", [0.75, 1e-3, 30.0], ids=str)
@pytest.mark.parametrize("gate", DECAY_GATES, ids=lambda g: g.id)
def test_positive_log_decay(gate, value):
    kw = build(gate.op_id)
    kw[gate.name].view(-1)[0] = value
    with pytest.raises(
        ValueError,
        match=rf"^{gate.name} is a log decay and must be ≤ 0 \(decay ≤ 1\), but its maximum is "
        rf"{re.escape(f'{value:.6g}')}$",
    ):
        call(gate.op_id, kw)


@pytest.mark.parametrize("gate", DECAY_GATES, ids=lambda g: g.id)
def test_zero_log_decay_is_accepted(gate):
    """The boundary: log decay 0 (no decay) is valid."""
    kw = build(gate.op_id)
    kw[gate.name].zero_()
    o, _ = call(gate.op_id, kw)
    assert torch.isfinite(o).all()


# --------------------------------------------------------------------------------------------
# initial_state
# --------------------------------------------------------------------------------------------

# How the messages name each part of the state, per state kind.
STATE_PARTS = {
    "S": ["initial_state"],
    "Sn": ["initial_state (S)", "initial_state[1] (n)"],
    "Cnm": ["initial_state[0] (C)", "initial_state[1] (n)", "initial_state[2] (m)"],
}


def state_name(op_id: str, part: int = 0) -> str:
    """Regex for the name the messages give to part ``part`` of ``op_id``'s state."""
    if OPS[op_id].family == "linear_attn" and part == 0:
        return re.escape("initial_state (S)")  # both forms of linear_attn call S so
    return re.escape(STATE_PARTS[OPS[op_id].state][part])


S_SHAPE = shp(B, H, K, V)
N_SHAPE = shp(B, H, K)
M_SHAPE = shp(B, H)


def _replace(state, i, x):
    state = list(state)
    state[i] = x
    return tuple(state)


# (op ids, label, state maker: (op_id) -> bad state, exception, regex)
STATE_CASES = [
    # one tensor S [N, H, K, V]
    *[
        pytest.param(op_id, make, exc, rf"^{state_name(op_id)} " + regex, id=f"{op_id}-{label}")
        for op_id in STATE_OPS["S"]
        for label, make, exc, regex in [
            (
                "S-K-V-swapped",
                lambda o: torch.zeros(B, H, V, K),
                ValueError,
                rf"must have shape \[N, H, K, V\] = {S_SHAPE}, got {shp(B, H, V, K)}$",
            ),
            (
                "S-3d",
                lambda o: torch.zeros(H, K, V),
                ValueError,
                rf"must have shape \[N, H, K, V\] = {S_SHAPE}, got {shp(H, K, V)}$",
            ),
            (
                "S-wrong-N",
                lambda o: torch.zeros(B + 1, H, K, V),
                ValueError,
                rf"must have shape \[N, H, K, V\] = {S_SHAPE}, got {shp(B + 1, H, K, V)}$",
            ),
            (
                "tuple",
                lambda o: (torch.zeros(B, H, K, V),),
                TypeError,
                r"must be a torch\.Tensor, got tuple$",
            ),
            (
                "int-dtype",
                lambda o: torch.zeros(B, H, K, V, dtype=torch.long),
                TypeError,
                r"must be float16, .*got dtype torch\.int64$",
            ),
        ]
        if not (op_id == "linear_attn" and label == "tuple")  # its own message, below
    ],
    # linear_attn normalize=False: a tuple is refused with its own message
    pytest.param(
        "linear_attn",
        lambda o: (torch.zeros(B, H, K, V), torch.zeros(B, H, K)),
        TypeError,
        r"^initial_state must be the tensor S \[N, H, K, V\] when normalize=False, got a tuple$",
        id="linear_attn-S-n-tuple",
    ),
    # (S, n) for linear_attn normalize=True
    *[
        pytest.param(op_id, make, exc, regex, id=f"{op_id}-{label}")
        for op_id in STATE_OPS["Sn"]
        for label, make, exc, regex in [
            (
                "tensor",
                lambda o: torch.zeros(B, H, K, V),
                TypeError,
                r"^initial_state must be a tuple \(S, n\), got Tensor$",
            ),
            (
                "tuple-of-3",
                lambda o: build_state("mlstm-exp", B),
                TypeError,
                r"^initial_state must be a tuple \(S, n\), got tuple of length 3$",
            ),
            (
                "S-wrong-shape",
                lambda o: _replace(build_state(o, B), 0, torch.zeros(B, H, V, K)),
                ValueError,
                rf"^initial_state \(S\) must have shape \[N, H, K, V\] = {S_SHAPE}, "
                rf"got {shp(B, H, V, K)}$",
            ),
            (
                "n-wrong-shape",
                lambda o: _replace(build_state(o, B), 1, torch.zeros(B, H, V)),
                ValueError,
                rf"^initial_state\[1\] \(n\) must have shape \[N, H, K\] = {N_SHAPE}, "
                rf"got {shp(B, H, V)}$",
            ),
            (
                "n-not-a-tensor",
                lambda o: _replace(build_state(o, B), 1, None),
                TypeError,
                r"^initial_state\[1\] \(n\) must be a torch\.Tensor, got NoneType$",
            ),
        ]
    ],
    # (C, n, m) for mlstm
    *[
        pytest.param(op_id, make, exc, regex, id=f"{op_id}-{label}")
        for op_id in STATE_OPS["Cnm"]
        for label, make, exc, regex in [
            (
                "tensor",
                lambda o: torch.zeros(B, H, K, V),
                TypeError,
                r"^initial_state must be a tuple \(C, n, m\), got Tensor$",
            ),
            (
                "tuple-of-2",
                lambda o: build_state(o, B)[:2],
                TypeError,
                r"^initial_state must be a tuple \(C, n, m\), got tuple of length 2$",
            ),
            (
                "C-wrong-shape",
                lambda o: _replace(build_state(o, B), 0, torch.zeros(B, H, V, K)),
                ValueError,
                rf"^initial_state\[0\] \(C\) must have shape \[N, H, K, V\] = {S_SHAPE}, "
                rf"got {shp(B, H, V, K)}$",
            ),
            (
                "n-wrong-shape",
                lambda o: _replace(build_state(o, B), 1, torch.zeros(B, H, K, 1)),
                ValueError,
                rf"^initial_state\[1\] \(n\) must have shape \[N, H, K\] = {N_SHAPE}, "
                rf"got {shp(B, H, K, 1)}$",
            ),
            (
                "m-wrong-shape",
                lambda o: _replace(build_state(o, B), 2, torch.zeros(B, H, 1)),
                ValueError,
                rf"^initial_state\[2\] \(m\) must have shape \[N, H\] = {M_SHAPE}, "
                rf"got {shp(B, H, 1)}$",
            ),
            (
                "m-int-dtype",
                lambda o: _replace(build_state(o, B), 2, torch.zeros(B, H, dtype=torch.int32)),
                TypeError,
                r"^initial_state\[2\] \(m\) must be float16, .*got dtype torch\.int32$",
            ),
        ]
    ],
]


@pytest.mark.parametrize("op_id, make, exc, regex", STATE_CASES)
def test_initial_state_bad(op_id, make, exc, regex):
    kw = build(op_id)
    kw["initial_state"] = make(op_id)
    with pytest.raises(exc, match=regex):
        call(op_id, kw)


@pytest.mark.parametrize("value", [float("nan"), float("inf")], ids=str)
@pytest.mark.parametrize("op_id", STATE_OPS["Cnm"])
def test_mlstm_initial_m_nan_or_plus_inf(op_id, value):
    kw = build(op_id)
    C, n, m = build_state(op_id, B)
    m[1, 2] = value
    kw["initial_state"] = (C, n, m)
    with pytest.raises(ValueError, match=r"^initial_state\[2\] \(m\) must be finite or −∞"):
        call(op_id, kw)


@pytest.mark.parametrize("value", [float("nan"), float("inf")], ids=str)
def test_mlstm_initial_m_message_reports_value(value):
    kw = build("mlstm-exp")
    C, n, m = build_state("mlstm-exp", B)
    m[1, 2] = value
    kw["initial_state"] = (C, n, m)
    with pytest.raises(ValueError, match=rf"initial_state\[2\] \(m\).*\[1, 2\].*\b{value}\b"):
        call("mlstm-exp", kw)


# --------------------------------------------------------------------------------------------
# cu_seqlens (packed batches: B == 1)
# --------------------------------------------------------------------------------------------

CU_CASES = [
    pytest.param(
        torch.tensor([0.0, 2.0, 5.0]),
        TypeError,
        r"^cu_seqlens must hold integers \(int32/int64\), got dtype torch\.float32$",
        id="float-tensor",
    ),
    pytest.param(
        torch.tensor([False, True]),
        TypeError,
        r"^cu_seqlens must hold integers .*got dtype torch\.bool$",
        id="bool-tensor",
    ),
    pytest.param(
        torch.tensor([[0, 2, 5]]),
        ValueError,
        rf"^cu_seqlens must be 1-D, got shape {shp(1, 3)}$",
        id="2d-tensor",
    ),
    pytest.param(
        [0.0, 2.0, 5.0],
        TypeError,
        r"^cu_seqlens must be a 1-D integer tensor or a list of ints, got a list holding "
        r"float 0\.0: \[0\.0, 2\.0, 5\.0\]$",
        id="float-list",
    ),
    pytest.param(
        [0, True, 5],
        TypeError,
        r"^cu_seqlens must be .* list of ints, got a list holding bool True",
        id="bool-in-list",
    ),
    pytest.param(
        [[0, 2, 5]],
        TypeError,
        r"^cu_seqlens must be .* list of ints, got a list holding list \[0, 2, 5\]",
        id="nested-list",
    ),
    pytest.param(
        np.array([0, 2, 5]),
        TypeError,
        r"^cu_seqlens must be a 1-D integer tensor or a list of ints, got ndarray$",
        id="numpy-array",
    ),
    pytest.param(
        [1, 3, 5],
        ValueError,
        rf"^cu_seqlens must start at 0 and end at T={T}, got first=1, last=5$",
        id="start-1",
    ),
    pytest.param(
        torch.tensor([0, 3, 4]),
        ValueError,
        rf"^cu_seqlens must start at 0 and end at T={T}, got first=0, last=4$",
        id="end-short",
    ),
    pytest.param(
        [0, 3, 6],
        ValueError,
        rf"^cu_seqlens must start at 0 and end at T={T}, got first=0, last=6$",
        id="end-long",
    ),
    pytest.param(
        [0, 4, 2, 5],
        ValueError,
        r"^cu_seqlens must be non-decreasing, got 4 then 2 at positions 1, 2$",
        id="decreasing",
    ),
    pytest.param(
        [0],
        ValueError,
        r"^cu_seqlens needs at least 2 entries \(0 and T\), got \[0\]$",
        id="one-entry",
    ),
    pytest.param(
        torch.tensor([], dtype=torch.int64),
        ValueError,
        r"^cu_seqlens needs at least 2 entries \(0 and T\), got \[\]$",
        id="empty-tensor",
    ),
    pytest.param(
        torch.tensor([0, 2, 5], device="meta"),
        ValueError,
        r"^cu_seqlens is on device meta and holds no values",
        id="meta-tensor",
    ),
]


@pytest.mark.parametrize("cu, exc, regex", CU_CASES)
@pytest.mark.parametrize("op_id", OP_IDS)
def test_cu_seqlens_bad(op_id, cu, exc, regex):
    kw = build(op_id, B=1)
    with pytest.raises(exc, match=regex):
        call(op_id, {**kw, "cu_seqlens": cu})


@pytest.mark.parametrize("op_id", OP_IDS)
def test_cu_seqlens_with_batch_not_1(op_id):
    kw = build(op_id)  # B = 2
    with pytest.raises(ValueError, match=rf"batch size must be 1, got B={B}$"):
        call(op_id, {**kw, "cu_seqlens": [0, 2, 5]})


@pytest.mark.parametrize("n_states", [1, 3], ids=lambda n: f"N{n}")
@pytest.mark.parametrize("op_id", OP_IDS)
def test_cu_seqlens_initial_state_batch_must_be_number_of_sequences(op_id, n_states):
    kw = build(op_id, B=1)
    kw["initial_state"] = build_state(op_id, n_states)
    # S and, where the state has one, n are both sized for n_states; either may be reported
    S_msg = (
        rf"{state_name(op_id)} must have shape \[N, H, K, V\] = {shp(2, H, K, V)}, "
        rf"got {shp(n_states, H, K, V)}"
    )
    n_msg = (
        rf"{state_name(op_id, 1)} must have shape \[N, H, K\] = {shp(2, H, K)}, "
        rf"got {shp(n_states, H, K)}"
        if OPS[op_id].state != "S"
        else S_msg
    )
    with pytest.raises(ValueError, match=rf"^({S_msg}|{n_msg})$"):
        call(op_id, {**kw, "cu_seqlens": [0, 2, 5]})


# --------------------------------------------------------------------------------------------
# mode, backend, chunk_size
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["fast", "fused_recurrent"])
@pytest.mark.parametrize("op_id", OP_IDS)
def test_unknown_mode(op_id, mode):
    with pytest.raises(
        ValueError,
        match=r"^mode must be one of \[None, 'reference', 'recurrent', 'parallel', 'chunk', "
        rf"'fused_chunk'\], got {re.escape(repr(mode))}$",
    ):
        call(op_id, {**build(op_id), "mode": mode})


@pytest.mark.parametrize("backend", ["cuda", "Torch"])
@pytest.mark.parametrize("op_id", OP_IDS)
def test_unknown_backend(op_id, backend):
    with pytest.raises(
        ValueError,
        match=rf"^backend must be one of \[None, 'torch', 'triton'\], got '{backend}'$",
    ):
        call(op_id, {**build(op_id), "backend": backend})


@pytest.mark.parametrize("mode", ["reference", "parallel"])
@pytest.mark.parametrize("op_id", OP_IDS)
def test_triton_backend_with_reference_mode(op_id, mode, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # so the CPU check is not what fires
    with pytest.raises(
        ValueError, match=rf"^mode='{mode}' is a PyTorch reference; use backend='torch' or None$"
    ):
        call(op_id, {**build(op_id), "mode": mode, "backend": "triton"})


@pytest.mark.parametrize("mode", [None, "chunk", "recurrent", "fused_chunk"])
@pytest.mark.parametrize("op_id", OP_IDS)
def test_triton_backend_on_cpu_needs_interpreter(op_id, mode, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(
        ValueError,
        match=r"^backend='triton' on CPU tensors needs the Triton interpreter: set "
        r"TRITON_INTERPRET=1",
    ):
        call(op_id, {**build(op_id), "mode": mode, "backend": "triton"})


@pytest.mark.parametrize("mode", [None, "chunk", "recurrent", "fused_chunk"])
@pytest.mark.parametrize("op_id", OP_IDS)
def test_triton_backend_without_kernel(op_id, mode, monkeypatch):
    if (mode or "chunk") in _generic._TRITON:
        pytest.skip(f"a Triton kernel is registered for mode={mode!r}")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(
        NotImplementedError,
        match=rf"^{OPS[op_id].family}: the Triton kernel for mode='{mode or 'chunk'}' is not "
        r"implemented yet; use backend='torch'",
    ):
        call(op_id, {**build(op_id), "mode": mode, "backend": "triton"})


@pytest.mark.parametrize("backend", ["torch", None])
@pytest.mark.parametrize("op_id", OP_IDS)
def test_fused_chunk_without_triton(op_id, backend):
    with pytest.raises(
        NotImplementedError,
        match=rf"^{OPS[op_id].family}: mode='fused_chunk' exists only as a Triton kernel; with "
        r"backend='torch' use 'chunk'",
    ):
        call(op_id, {**build(op_id), "mode": "fused_chunk", "backend": backend})


@pytest.mark.parametrize(
    "chunk_size, exc, regex",
    [
        pytest.param(0, ValueError, r"^chunk_size must be ≥ 1, got 0$", id="0"),
        pytest.param(-16, ValueError, r"^chunk_size must be ≥ 1, got -16$", id="neg"),
        pytest.param(
            2.5, TypeError, r"^chunk_size must be a positive int or None, got 2\.5$", id="float"
        ),
        pytest.param(
            "64", TypeError, r"^chunk_size must be a positive int or None, got '64'$", id="str"
        ),
        pytest.param(
            True, TypeError, r"^chunk_size must be a positive int or None, got True$", id="bool"
        ),
    ],
)
@pytest.mark.parametrize("op_id", OP_IDS)
def test_bad_chunk_size(op_id, chunk_size, exc, regex):
    with pytest.raises(exc, match=regex):
        call(op_id, {**build(op_id), "mode": "chunk", "chunk_size": chunk_size})


@pytest.mark.parametrize("chunk_size", [1, 3, 64], ids=lambda c: f"L{c}")
@pytest.mark.parametrize("op_id", OP_IDS)
def test_valid_chunk_sizes(op_id, chunk_size):
    """Any L ≥ 1 works, including L not dividing T and L > T."""
    o, _ = call(op_id, {**build(op_id), "mode": "chunk", "chunk_size": chunk_size})
    assert o.shape == (B, T, H, V) and torch.isfinite(o).all()


# --------------------------------------------------------------------------------------------
# scale, eps, op-specific options
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "scale, type_name",
    [
        pytest.param("0.5", "str", id="str"),
        pytest.param(torch.tensor(0.5), "Tensor", id="tensor"),
        pytest.param(True, "bool", id="bool"),
        pytest.param([0.5], "list", id="list"),
    ],
)
@pytest.mark.parametrize("op_id", OP_IDS)
def test_scale_not_a_number(op_id, scale, type_name):
    with pytest.raises(TypeError, match=rf"^scale must be a float or None, got {type_name}$"):
        call(op_id, {**build(op_id), "scale": scale})


@pytest.mark.parametrize("scale", [float("inf"), float("-inf"), float("nan")], ids=str)
@pytest.mark.parametrize("op_id", OP_IDS)
def test_scale_not_finite(op_id, scale):
    with pytest.raises(ValueError, match=rf"^scale must be finite, got {scale}$"):
        call(op_id, {**build(op_id), "scale": scale})


@pytest.mark.parametrize(
    "scale", [1, 0.25, np.float32(0.5), np.float64(2.0), 0.0, -1.0], ids=lambda s: repr(s)
)
@pytest.mark.parametrize("op_id", ["linear_attn", "rwkv6", "mlstm-exp"])
def test_scale_valid_numbers(op_id, scale):
    """ints and numpy scalars are numbers too (a numpy float is what ``np.sqrt(K)`` gives)."""
    o, _ = call(op_id, {**build(op_id), "scale": scale})
    assert torch.isfinite(o).all()


EPS_OPS = ["linear_attn", "linear_attn-normalize", "mlstm-exp", "mlstm-sigmoid"]


@pytest.mark.parametrize("eps", [-1e-6, -1.0, float("inf"), float("nan")], ids=str)
@pytest.mark.parametrize("op_id", EPS_OPS)
def test_eps_invalid_value(op_id, eps):
    with pytest.raises(ValueError, match=rf"^eps must be finite and ≥ 0, got {eps}$"):
        call(op_id, {**build(op_id), "eps": eps})


@pytest.mark.parametrize("eps, type_name", [("1e-6", "str"), (None, "NoneType")], ids=str)
@pytest.mark.parametrize("op_id", EPS_OPS)
def test_eps_not_a_number(op_id, eps, type_name):
    with pytest.raises(TypeError, match=rf"^eps must be a float, got {type_name}$"):
        call(op_id, {**build(op_id), "eps": eps})


@pytest.mark.parametrize("input_gate", ["relu", "Exp", "sigmoid_", None])
def test_mlstm_unknown_input_gate(input_gate):
    with pytest.raises(
        ValueError,
        match=r"^input_gate must be one of \['exp', 'sigmoid'\], got "
        + re.escape(repr(input_gate))
        + "$",
    ):
        linrnn.mlstm(**build("mlstm-exp"), input_gate=input_gate)


def test_mlstm_exp_gate_requires_normalize():
    with pytest.raises(
        ValueError, match=r"^input_gate='exp' always normalizes .*got normalize=False$"
    ):
        linrnn.mlstm(**build("mlstm-exp"), input_gate="exp", normalize=False)


@pytest.mark.parametrize("op_id", STATE_OPS["Cnm"])
def test_mlstm_normalize_not_a_bool(op_id):
    with pytest.raises(TypeError, match=r"^normalize must be a bool or None, got str$"):
        call(op_id, {**build(op_id), "normalize": "yes"})


@pytest.mark.parametrize(
    "value, type_name",
    [pytest.param("no", "str", id="str"), pytest.param(torch.ones(2), "Tensor", id="tensor")],
)
def test_linear_attn_normalize_not_a_bool(value, type_name):
    with pytest.raises(TypeError, match=rf"normalize must be a bool.*got {type_name}"):
        linrnn.linear_attn(**build("linear_attn"), normalize=value)


@pytest.mark.parametrize(
    "op_id, value, type_name",
    [pytest.param(op_id, "no", "str", id=f"{op_id}-str") for op_id in OP_IDS]
    + [pytest.param("retention", torch.ones(2), "Tensor", id="retention-tensor")],
)
def test_output_final_state_not_a_bool(op_id, value, type_name):
    with pytest.raises(TypeError, match=rf"output_final_state must be a bool, got {type_name}"):
        call(op_id, {**build(op_id), "output_final_state": value})


# --------------------------------------------------------------------------------------------
# Devices (no GPU here: "meta" stands in for a second device)
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("pos", [1, 2], ids=["k", "v"])
@pytest.mark.parametrize("op_id", OP_IDS)
def test_qkv_device_mix(op_id, pos):
    kw = build(op_id)
    names = OPS[op_id].names
    kw[names[pos]] = kw[names[pos]].to("meta")
    with pytest.raises(
        ValueError,
        match=rf"^{names[pos]} is on device meta but {names[0]} is on cpu; all inputs must be "
        r"on one device$",
    ):
        call(op_id, kw)


@pytest.mark.parametrize("op_id", OP_IDS)
def test_query_on_other_device(op_id):
    kw = build(op_id)
    names = OPS[op_id].names
    kw[names[0]] = kw[names[0]].to("meta")
    with pytest.raises(
        ValueError, match=rf"^{names[1]} is on device cpu but {names[0]} is on meta; "
    ):
        call(op_id, kw)


@pytest.mark.parametrize("gate", GATES, ids=lambda g: g.id)
def test_gate_device_mix(gate):
    kw = build(gate.op_id)
    kw[gate.name] = kw[gate.name].to("meta")
    with pytest.raises(
        ValueError,
        match=rf"^{gate.name} is on device meta but the other inputs are on cpu; all inputs "
        r"must be on one device$",
    ):
        call(gate.op_id, kw)


STATE_DEVICE_CASES = [
    pytest.param(op_id, part, id=f"{op_id}-{OPS[op_id].state[part]}")
    for op_id in OP_IDS
    for part in range(len(STATE_PARTS[OPS[op_id].state]))
]


@pytest.mark.parametrize("op_id, part", STATE_DEVICE_CASES)
def test_initial_state_device_mix(op_id, part):
    state = build_state(op_id, B)
    if isinstance(state, torch.Tensor):
        state = state.to("meta")
    else:
        state = _replace(state, part, state[part].to("meta"))
    name = state_name(op_id, part)
    with pytest.raises(
        ValueError, match=rf"^{name} is on device meta but the other inputs are on cpu; "
    ):
        call(op_id, {**build(op_id), "initial_state": state})
