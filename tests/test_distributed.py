"""Context parallelism (linrnn.distributed) on CPU with gloo: 2 and 4 processes.

One spawn per world size runs every case inside. Each rank builds the same fp64 inputs (one
seed), runs the single-process op on the whole sequence, then ``context_parallel`` on its
segment, and compares its output slice, the final state and every gradient: its own slice
of the time-split inputs, and the sum over ranks of the gradients of replicated inputs
(log_decay, u, initial state). Cases: every family variant (the delta rule with grouped value
heads, Gated DeltaNet with q/k normalized in the op), unequal segments, B = 2 with an initial
state; packed documents crossing rank boundaries (one spanning three ranks, an empty
one, ones starting exactly at a rank boundary), with and without an initial state; the local
state pass split into several blocks. Failures are collected per rank and raised at the end;
a hang fails after ``TIMEOUT`` seconds.
"""

from __future__ import annotations

import datetime
import socket
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from helpers import FAMILIES, Family, flat_state, rel_err

import linrnn
from linrnn import distributed as cp

TIMEOUT = 120  # seconds for a whole spawn; a gloo collective itself times out after 60 s
TOL = 1e-9
REPLICATED = ("log_decay", "u")
H, K, V, CHUNK = 2, 4, 3, 5

# Segment lengths per world size and the packed-document layouts over the whole sequence.
LENGTHS = {2: [7, 12], 4: [5, 9, 3, 8]}
DOCS = {
    # [0,4) in rank 0; [4,10) crosses; an empty document; [10,16), [16,19) in rank 1
    2: [[0, 4, 10, 10, 16, 19], [0, 3, 7, 19]],  # second: boundaries exactly at rank starts
    # [2,16) spans ranks 0-2; empty at 16; [16,20) crosses ranks 2-3
    4: [[0, 2, 16, 16, 20, 25], [0, 5, 14, 25]],
}


class _DeltaFamily(Family):
    """A delta-rule op with grouped value heads: HV = 2·H (state ``[N, 2H, K, V]``)."""

    def make_state(self, N, H, K, V, dtype=torch.float64):
        return torch.randn(N, 2 * H, K, V, dtype=dtype)


def _build_delta(B, T, H, K, V, extreme, gated=False, normalize=True):
    k = torch.randn(B, T, H, K, dtype=torch.float64)
    d = {
        "q": torch.randn(B, T, H, K, dtype=torch.float64),
        "k": F.normalize(k, dim=-1) if normalize else k,
        "v": torch.randn(B, T, 2 * H, V, dtype=torch.float64),
    }
    if gated:
        d["g"] = F.logsigmoid(torch.randn(B, T, 2 * H, dtype=torch.float64) + 1)
    d["beta"] = torch.rand(B, T, 2 * H, dtype=torch.float64) * 2
    return d


DELTA_FAMILIES = [
    _DeltaFamily("delta_rule", linrnn.delta_rule, ("q", "k", "v", "beta"), _build_delta,
                 positional=4),
    _DeltaFamily("gated_delta_rule_l2", linrnn.gated_delta_rule, ("q", "k", "v", "g", "beta"),
                 lambda *a: _build_delta(*a, gated=True, normalize=False),
                 kwargs={"use_qk_l2norm": True}, positional=5),
]  # fmt: skip


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(fn, world: int, seed: int):
    """Run ``fn(rank, world, port, seed)`` in ``world`` processes; fail on an error or a
    hang. The seed is passed on (a child process does not run the test fixtures)."""
    ctx = mp.start_processes(
        fn, args=(world, _free_port(), seed), nprocs=world, join=False, start_method="spawn"
    )
    deadline = time.monotonic() + TIMEOUT
    while not ctx.join(timeout=1):  # raises ProcessRaisedException if a rank failed
        if time.monotonic() > deadline:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
            pytest.fail(f"context-parallel workers (world {world}) hung for {TIMEOUT} s")


def _loss(o, states, do, dstates, weight=1.0):
    loss = (o * do).sum()
    for s, ds in zip(states, dstates):
        loss = loss + weight * (s * ds).sum()
    return loss


def _case(fam, rank, world, B, cu, with_state, seed, errors):
    """One comparison of context_parallel against the single-process op."""
    lengths = LENGTHS[world]
    T = sum(lengths)
    start = sum(lengths[:rank])
    sl = slice(start, start + lengths[rank])
    torch.manual_seed(seed)
    inputs = fam.build(B, T, H, K, V, False)
    N = B if cu is None else len(cu) - 1
    h0 = fam.make_state(N, H, K, V) if with_state else None
    opts = dict(output_final_state=True, cu_seqlens=cu, mode="chunk", backend="torch")
    opts["chunk_size"] = CHUNK

    def leaves(tensors):
        out = {n: t.detach().clone().requires_grad_() for n, t in tensors.items()}
        init = None
        if h0 is not None:
            parts = [s.detach().clone().requires_grad_() for s in flat_state(h0)]
            init = tuple(parts) if isinstance(h0, tuple) else parts[0]
            out.update({f"h0[{j}]": s for j, s in enumerate(parts)})
        return out, init

    # Single process, whole sequence.
    ref_in, ref_init = leaves(inputs)
    o_ref, st_ref = fam.call(ref_in, initial_state=ref_init, **opts)
    st_ref = flat_state(st_ref)
    gen = torch.Generator().manual_seed(seed + 1)
    do = torch.randn(o_ref.shape, generator=gen, dtype=torch.float64)
    dst = [torch.randn(s.shape, generator=gen, dtype=torch.float64) for s in st_ref]
    _loss(o_ref, st_ref, do, dst).backward()

    # This rank's segment; the final-state term of the loss is shared unequally by the ranks.
    local = {n: (t if n in REPLICATED else t[:, sl]) for n, t in inputs.items()}
    cp_in, cp_init = leaves(local)
    args = [cp_in[n] for n in fam.tensors[: fam.positional]]
    named = {n: cp_in[n] for n in fam.tensors[fam.positional :] if n in cp_in}
    op = fam.fn if seed % 2 else fam.fn.__name__  # the function or its name
    o, st = cp.context_parallel(op, *args, **named, **fam.kwargs, initial_state=cp_init, **opts)
    st = flat_state(st)
    weight = 2.0 * (rank + 1) / (world * (world + 1))
    _loss(o, st, do[:, sl], dst, weight).backward()

    tag = f"{fam.name} world={world} rank={rank} B={B} cu={cu} h0={with_state}"

    def compare(name, got, ref):
        if got is None or ref is None or got.shape != ref.shape:
            errors.append(f"{tag}: {name} missing or misshapen")
            return
        inf = ~torch.isfinite(ref)
        if not torch.equal(inf, ~torch.isfinite(got)) or torch.isnan(got).any():
            errors.append(f"{tag}: {name} non-finite values differ")
            return
        if not torch.equal(got[inf], ref[inf]):
            errors.append(f"{tag}: {name} infinities differ")
            return
        err = rel_err(got[~inf], ref[~inf])
        if not err <= TOL:
            errors.append(f"{tag}: {name} rms-rel error {err:.2e} > {TOL}")

    compare("o", o.detach(), o_ref.detach()[:, sl])
    if len(st) != len(st_ref):
        errors.append(f"{tag}: final state has {len(st)} parts, expected {len(st_ref)}")
    for j, (a, b) in enumerate(zip(st, st_ref)):
        compare(f"final_state[{j}]", a.detach(), b.detach())
    for n, leaf in cp_in.items():
        grad = leaf.grad if leaf.grad is not None else torch.zeros_like(leaf)
        if n in REPLICATED or n.startswith("h0"):
            grad = grad.clone()
            dist.all_reduce(grad)  # replicated: the ranks' shares sum to the gradient
            compare(f"d{n}", grad, ref_in[n].grad)
        else:
            compare(f"d{n}", grad, ref_in[n].grad[:, sl])


def _expect_error(errors, rank, what, exc, match, fn):
    try:
        fn()
    except exc as e:
        if match not in str(e):
            errors.append(f"rank {rank}: {what}: message {str(e)!r} lacks {match!r}")
    else:
        errors.append(f"rank {rank}: {what}: no {exc.__name__}")


def _bad_inputs(rank, world, errors):
    """Errors raise on every rank (no rank is left waiting in a collective)."""
    T = LENGTHS[world][rank]
    q = torch.randn(1, T, H, K, dtype=torch.float64)
    v = torch.randn(1, T, H, V, dtype=torch.float64)
    g = -torch.rand(1, T, H, dtype=torch.float64)
    q2, v2 = q.expand(2, -1, -1, -1), v.expand(2, -1, -1, -1)
    cu = [0, 3, sum(LENGTHS[world])]
    _expect_error(
        errors, rank, "B != 1 with cu_seqlens", ValueError, "batch size must be 1",
        lambda: cp.context_parallel("simple_gla", q2, q2, v2, g.expand(2, -1, -1), cu_seqlens=cu),
    )  # fmt: skip
    qh = torch.randn(1, T, H + rank, K, dtype=torch.float64)  # H differs between ranks
    vh = torch.randn(1, T, H + rank, V, dtype=torch.float64)
    _expect_error(
        errors, rank, "heads differ", ValueError, "disagree on H",
        lambda: cp.context_parallel(linrnn.linear_attn, qh, qh, vh),
    )  # fmt: skip
    bad_g = g.abs() if rank == world - 1 else g  # a positive log decay on the last rank only
    match = "must be ≤ 0" if rank == world - 1 else f"rank(s) [{world - 1}] is invalid"
    _expect_error(
        errors, rank, "positive gate on one rank", ValueError, match,
        lambda: cp.context_parallel("simple_gla", q, q, v, bad_g),
    )  # fmt: skip
    _expect_error(
        errors, rank, "unknown op", ValueError, "op must be one of",
        lambda: cp.context_parallel("attention", q, q, v),
    )  # fmt: skip
    beta = torch.rand(1, T, H, dtype=torch.float64) + (2 if rank == 0 else 0)  # β > 2: rank 0
    match = "beta must lie in [0, 2]" if rank == 0 else "rank(s) [0] is invalid"
    _expect_error(
        errors, rank, "beta above 2 on one rank", ValueError, match,
        lambda: cp.context_parallel("delta_rule", q, q, v, beta),
    )  # fmt: skip
    vg = torch.randn(1, T, H * (rank + 1), V, dtype=torch.float64)  # HV differs between ranks
    bg = torch.rand(1, T, H * (rank + 1), dtype=torch.float64)
    _expect_error(
        errors, rank, "value heads differ", ValueError, "disagree on value heads HV",
        lambda: cp.context_parallel(linrnn.gated_delta_rule, q, q, vg, -bg, bg),
    )  # fmt: skip
    cu_bad = [0, 4, sum(LENGTHS[world]) + 1]  # does not end at the total length
    _expect_error(
        errors, rank, "cu_seqlens past the end", ValueError, "must start at 0 and end at T",
        lambda: cp.context_parallel("simple_gla", q, q, v, g, cu_seqlens=cu_bad),
    )  # fmt: skip


def _worker(rank, world, port, test_seed):
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
        timeout=datetime.timedelta(seconds=60),
    )  # fmt: skip
    try:
        torch.set_num_threads(1)
        cp.BLOCK = 4  # several blocks per piece in the local state pass
        errors: list[str] = []
        seed = test_seed % 2**30
        for fam in [*FAMILIES.values(), *DELTA_FAMILIES]:
            _case(fam, rank, world, 2, None, True, seed, errors)
            _case(fam, rank, world, 1, DOCS[world][0], True, seed + 1, errors)
            _case(fam, rank, world, 1, DOCS[world][1], False, seed + 2, errors)
        if world == 2:
            _bad_inputs(rank, world, errors)
        if errors:
            raise AssertionError(f"seed {test_seed}:\n" + "\n".join(errors))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 4])
def test_context_parallel_matches_one_process(world):
    # The test's own seed (conftest derives it from the run's seed and the test id).
    _spawn(_worker, world, torch.initial_seed())


def _mismatch_worker(rank, world, port, test_seed):
    """Replicated arguments that differ between ranks: an error on every rank that shows the
    differing values (initial states are compared bitwise)."""
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
        timeout=datetime.timedelta(seconds=60),
    )  # fmt: skip
    try:
        torch.set_num_threads(1)
        errors: list[str] = []
        T = LENGTHS[world][rank]
        q = torch.randn(1, T, H, K, dtype=torch.float64)
        v = torch.randn(1, T, H, V, dtype=torch.float64)
        g = -torch.rand(1, T, H, dtype=torch.float64)
        S0 = torch.arange(H * K * V, dtype=torch.float64).view(1, H, K, V) / 7
        S0_r = S0.clone()
        S0_r[0, 1, 3, 2] += rank  # rank 1 differs in one value
        _expect_error(
            errors, rank, "initial states differ", ValueError,
            "initial_state differs at index [0, 1, 3, 2]: rank 0: "
            f"{S0[0, 1, 3, 2].item()!r}, rank 1: {S0[0, 1, 3, 2].item() + 1!r} (1 of",
            lambda: cp.context_parallel("simple_gla", q, q, v, g, initial_state=S0_r,
                                        output_final_state=True),
        )  # fmt: skip
        C0 = (
            S0_r,
            torch.zeros(1, H, K, dtype=torch.float64),
            torch.zeros(1, H, dtype=torch.float64),
        )
        _expect_error(
            errors, rank, "mlstm initial states differ", ValueError,
            "disagree on initial_state values",
            lambda: cp.context_parallel("mlstm", q, q, v, g, g, initial_state=C0),
        )  # fmt: skip
        _expect_error(
            errors, rank, "scale differs", ValueError,
            "disagree on options (scale: rank 0: 0.5, rank 1: 0.25)",
            lambda: cp.context_parallel("simple_gla", q, q, v, g, scale=0.5 / (rank + 1)),
        )  # fmt: skip
        total = sum(LENGTHS[world])
        cu = [0, 3 + rank, total]
        _expect_error(
            errors, rank, "cu_seqlens differ", ValueError,
            f"disagree on cu_seqlens (rank 0: [0, 3, {total}], rank 1: [0, 4, {total}])",
            lambda: cp.context_parallel("simple_gla", q, q, v, g, cu_seqlens=cu),
        )  # fmt: skip
        # the same state on every rank still runs
        _, S = cp.context_parallel("simple_gla", q, q, v, g, initial_state=S0,
                                   output_final_state=True)  # fmt: skip
        if not torch.isfinite(S).all():
            errors.append(f"rank {rank}: equal initial states: non-finite final state")
        if errors:
            raise AssertionError(f"seed {test_seed}:\n" + "\n".join(errors))
    finally:
        dist.destroy_process_group()


def test_context_parallel_replicated_arguments_must_match():
    _spawn(_mismatch_worker, 2, torch.initial_seed())
