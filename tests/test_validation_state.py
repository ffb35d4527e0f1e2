"""Bad-input tests: initial states and packed sequences.

Each test breaks one thing in valid inputs (validation_cases.py) and asserts the exception
type and that the message names the argument and the value or shape received."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from validation_cases import (
    OP_IDS,
    OPS,
    STATE_OPS,
    B,
    H,
    K,
    T,
    V,
    _replace,
    build,
    build_state,
    call,
    shp,
    state_name,
)

# --------------------------------------------------------------------------------------------
# initial_state
# --------------------------------------------------------------------------------------------

# How the messages name each part of the state, per state kind.
S_SHAPE = shp(B, H, K, V)
N_SHAPE = shp(B, H, K)
M_SHAPE = shp(B, H)


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
