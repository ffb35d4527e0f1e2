"""Valid inputs for every public op, shared by the bad-input tests (test_validation_*.py):
each builder makes fresh, seeded random inputs; each test breaks one thing."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

import linrnn

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


def _replace(state, i, x):
    state = list(state)
    state[i] = x
    return tuple(state)
