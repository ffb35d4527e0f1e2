"""Bad-input tests: positive controls, q/k/v and gates.

Each test breaks one thing in valid inputs (validation_cases.py) and asserts the exception
type and that the message names the argument and the value or shape received."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from validation_cases import (
    DECAY_GATES,
    GATES,
    OP_IDS,
    OPS,
    STATE_OPS,
    B,
    H,
    K,
    T,
    V,
    build,
    build_state,
    call,
    shp,
)

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
