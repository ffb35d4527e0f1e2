"""Context parallelism of ``linrnn.mamba2`` (linrnn.distributed) on CPU with gloo, 2 and 4
processes, as tests/test_distributed.py does for the other families: every rank builds the same
fp64 inputs, runs the single-process op on the whole sequence, then ``context_parallel`` on its
segment, and compares its output slice, the final state and every gradient (its own slice of
x, dt, B, C; the sum over the ranks of the replicated A, D, dt_bias and initial state). Cases:
groups G < H, B = 2 with an initial state, packed documents crossing rank boundaries with and
without one, Δ without the softplus; the local state pass in several blocks."""

from __future__ import annotations

import datetime

import pytest
import torch
import torch.distributed as dist
from helpers import rel_err
from test_distributed import DOCS, LENGTHS, _spawn

import linrnn
from linrnn import distributed as cp

TOL = 1e-9
H, G, N, P, CHUNK = 4, 2, 4, 3, 5
SPLIT = ("x", "dt", "B", "C")


def _inputs(Bsz, T, softplus):
    d = {
        "x": torch.randn(Bsz, T, H, P, dtype=torch.float64),
        "dt": torch.randn(Bsz, T, H, dtype=torch.float64) if softplus
        else torch.rand(Bsz, T, H, dtype=torch.float64),
        "A": -torch.rand(H, dtype=torch.float64) * 4,
        "B": torch.randn(Bsz, T, G, N, dtype=torch.float64),
        "C": torch.randn(Bsz, T, G, N, dtype=torch.float64),
        "D": torch.randn(H, dtype=torch.float64),
        "dt_bias": torch.rand(H, dtype=torch.float64) * 0.5,
    }  # fmt: skip
    return d


def _case(rank, world, Bsz, cu, with_state, softplus, seed, errors):
    lengths = LENGTHS[world]
    T = sum(lengths)
    start = sum(lengths[:rank])
    sl = slice(start, start + lengths[rank])
    torch.manual_seed(seed)
    inputs = _inputs(Bsz, T, softplus)
    nseq = Bsz if cu is None else len(cu) - 1
    h0 = torch.randn(nseq, H, N, P, dtype=torch.float64) if with_state else None
    opts = dict(dt_softplus=softplus, output_final_state=True, cu_seqlens=cu, mode="chunk",
                backend="torch", chunk_size=CHUNK)  # fmt: skip

    def leaves(tensors):
        out = {n: t.detach().clone().requires_grad_() for n, t in tensors.items()}
        init = None if h0 is None else h0.detach().clone().requires_grad_()
        return out, init

    def call(fn, i, init, *extra):
        return fn(*extra, i["x"], i["dt"], i["A"], i["B"], i["C"], D=i["D"],
                  dt_bias=i["dt_bias"], initial_state=init, **opts)  # fmt: skip

    ref_in, ref_init = leaves(inputs)
    y_ref, h_ref = call(linrnn.mamba2, ref_in, ref_init)
    gen = torch.Generator().manual_seed(seed + 1)
    dy = torch.randn(y_ref.shape, generator=gen, dtype=torch.float64)
    dh = torch.randn(h_ref.shape, generator=gen, dtype=torch.float64)
    ((y_ref * dy).sum() + (h_ref * dh).sum()).backward()

    local = {n: (t[:, sl] if n in SPLIT else t) for n, t in inputs.items()}
    cp_in, cp_init = leaves(local)
    op = linrnn.mamba2 if seed % 2 else "mamba2"
    y, h = call(cp.context_parallel, cp_in, cp_init, op)
    weight = 2.0 * (rank + 1) / (world * (world + 1))  # the final-state term, shared unequally
    ((y * dy[:, sl]).sum() + weight * (h * dh).sum()).backward()

    tag = f"mamba2 world={world} rank={rank} B={Bsz} cu={cu} h0={with_state} sp={softplus}"

    def compare(name, got, ref):
        if got is None or ref is None or got.shape != ref.shape:
            errors.append(f"{tag}: {name} missing or misshapen")
        elif torch.isnan(got).any() or not rel_err(got, ref) <= TOL:
            errors.append(f"{tag}: {name} rms-rel error {rel_err(got, ref):.2e} > {TOL}")

    compare("y", y.detach(), y_ref.detach()[:, sl])
    compare("final_state", h.detach(), h_ref.detach())
    for n, leaf in cp_in.items():
        grad = leaf.grad.clone()
        if n in SPLIT:
            compare(f"d{n}", grad, ref_in[n].grad[:, sl])
        else:
            dist.all_reduce(grad)  # replicated: the ranks' shares sum to the gradient
            compare(f"d{n}", grad, ref_in[n].grad)
    if h0 is not None:
        grad = cp_init.grad.clone()
        dist.all_reduce(grad)
        compare("dinitial_state", grad, ref_init.grad)


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
        _case(rank, world, 2, None, True, True, seed, errors)
        _case(rank, world, 1, DOCS[world][0], True, True, seed + 1, errors)
        _case(rank, world, 1, DOCS[world][1], False, True, seed + 2, errors)
        _case(rank, world, 2, None, True, False, seed + 3, errors)
        if world == 2:  # an invalid A on one rank raises on every rank
            T = LENGTHS[world][rank]
            i = _inputs(1, T, True)
            A = i["A"].abs() if rank == 1 else i["A"]
            try:
                cp.context_parallel("mamba2", i["x"], i["dt"], A, i["B"], i["C"], dt_softplus=True)
                errors.append(f"rank {rank}: a positive A raised nothing")
            except ValueError as e:
                want = "A must be ≤ 0" if rank == 1 else "rank(s) [1] is invalid"
                if want not in str(e):
                    errors.append(f"rank {rank}: message {str(e)!r} lacks {want!r}")
        if errors:
            raise AssertionError(f"seed {test_seed}:\n" + "\n".join(errors))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 4])
def test_context_parallel_matches_one_process(world):
    _spawn(_worker, world, torch.initial_seed())
