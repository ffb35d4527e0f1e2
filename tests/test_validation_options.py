"""Bad-input tests: mode, backend, chunk_size, options, devices.

Each test breaks one thing in valid inputs (validation_cases.py) and asserts the exception
type and that the message names the argument and the value or shape received."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from validation_cases import (
    GATES,
    OP_IDS,
    OPS,
    STATE_OPS,
    STATE_PARTS,
    B,
    H,
    T,
    V,
    _replace,
    build,
    build_state,
    call,
    state_name,
)

import linrnn
from linrnn.ops import _generic

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
            2.5,
            TypeError,
            r"^chunk_size must be a positive int, 'auto' or None, got 2\.5$",
            id="float",
        ),
        pytest.param(
            "64",
            TypeError,
            r"^chunk_size must be a positive int, 'auto' or None, got '64'$",
            id="str",
        ),
        pytest.param(
            True,
            TypeError,
            r"^chunk_size must be a positive int, 'auto' or None, got True$",
            id="bool",
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


@pytest.mark.skipif(_generic.interpreter is None, reason="needs triton")
def test_triton_on_cpu_names_a_broken_interpreter(monkeypatch):
    """Where the interpreter cannot run the kernels' loops over loaded bounds (Triton ≤ 3.6
    with NumPy ≥ 2.4), a CPU call with backend='triton' says so, with the versions, before any
    kernel runs; here the interpreter works (the probe's own result)."""
    if torch.cuda.is_available():
        pytest.skip("with a GPU, the tests import triton for it, not for the interpreter")
    assert _generic.interpreter.problem() is None
    monkeypatch.setattr(_generic.interpreter, "problem", lambda: "the interpreter is broken here")
    with pytest.raises(RuntimeError, match=r"^simple_gla: the interpreter is broken here$"):
        call("simple_gla", {**build("simple_gla"), "backend": "triton"})


@pytest.mark.skipif(_generic.interpreter is None, reason="needs triton")
def test_interpreter_probe_names_versions_when_the_loop_fails(monkeypatch):
    """The probe's own sentence when its kernel fails in the interpreter (here a loop bound that
    is a two-element block, which no interpreter takes as an int): the error, the versions and
    the ways out."""
    import numpy
    import triton
    import triton.language as tl

    if torch.cuda.is_available():
        pytest.skip("with a GPU, the tests import triton for it, not for the interpreter")

    @triton.jit
    def block_bound(n, out):
        count = 0
        for _ in range(tl.load(n + tl.arange(0, 2))):
            count += 1
        tl.store(out, count)

    probe = _generic.interpreter
    monkeypatch.setattr(probe, "_loaded_bound_kernel", block_bound)
    probe.problem.cache_clear()
    try:
        text = probe.problem()
    finally:
        probe.problem.cache_clear()
    assert text is not None and text.startswith(
        f"the Triton interpreter (triton {triton.__version__}, numpy {numpy.__version__}) "
        "cannot run linrnn's kernels ("
    ), text
    assert text.endswith("Install numpy<2.4 or a newer Triton, or use backend='torch'"), text
