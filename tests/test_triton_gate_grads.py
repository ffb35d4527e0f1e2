"""scalar_gate_grad_kernels.gate_grad_kernel (through scalar.chunk_gate_grads): chunk mode's
scalar gate gradients against a step-by-step fp64 loop of the contract in the kernel file's
docstring — the chunk-restarted decay sums, and mLSTM-exp's routing of ∂L/∂m to the records
of the running max (found per chunk against the stored max state, ties to the later step),
the final state's term past the end and ∂L/∂m_0. Dense and packed (empty and one-step
sequences), tiles of one and of several chunks, ties made on purpose, with and without the
normalizer's ∂L/∂m_t. The outputs are NaN-poisoned allocations (conftest), so an element the
kernel skips fails."""

from __future__ import annotations

import itertools

import pytest
import torch
from test_triton_engine import DEVICE

from linrnn.engine import config as engine_config
from linrnn.engine.config import ChunkConfig
from linrnn.engine.gate_grads import tokens
from linrnn.engine.scalar import chunk_gate_grads

pytest.importorskip("triton")


def _sequences(B, T, offsets):
    """[(row, start, end)] of every sequence: each batch row, or the packed pieces of row 0."""
    if offsets is None:
        return [(b, 0, T) for b in range(B)]
    return [(0, s, e) for s, e in itertools.pairwise(offsets)]


def _expected(x, B, T, H, L, offsets, stab, with_m0):
    """The contract, one step at a time in fp64: per sequence and head, chunks of L from the
    sequence start, b the chunk-local cumulative sum of g, the max state entering each chunk
    from the forward's recursion (fp32, as the kernels keep it), then the reverse routing."""
    f64 = torch.float64
    b = torch.zeros(B * H, T)
    mc_slots = {}  # (row, chunk index) -> max state entering it
    dg = torch.full((B * H, T), float("nan"), dtype=f64)
    da = torch.full((B * H, T), float("nan"), dtype=f64)
    dm0 = torch.zeros(len(_sequences(B, T, offsets)) * H, dtype=f64)
    chunk_index = 0
    for n, (row, s, e) in enumerate(_sequences(B, T, offsets)):
        if offsets is None:
            chunk_index = 0
        chunks = [(c0, min(c0 + L, e)) for c0 in range(s, e, L)]
        for h in range(H):
            r = row * H + h
            st = n * H + h
            m = x["m0"][st].item() if with_m0 else float("-inf")
            rec = {}
            for j, (c0, c1) in enumerate(chunks):
                acc = torch.tensor(0.0)
                for t in range(c0, c1):  # fp32 cumsum, as the host's forward pass forms b
                    acc = acc + x["g"][r, t]
                    b[r, t] = acc
                mc_slots[(r, chunk_index + j + n * (offsets is not None))] = m
                run = m
                for t in range(c0, c1):
                    z = float(x["gi"][r, t] - b[r, t])
                    rec[t] = z >= run
                    run = max(run, z)
                m = float(b[r, c1 - 1]) + max(m, max(float(x["gi"][r, t] - b[r, t])
                                                      for t in range(c0, c1)))  # fmt: skip
                m = float(torch.tensor(m, dtype=torch.float32))
            mc_slots[(r, chunk_index + len(chunks) + n * (offsets is not None))] = m
            carry = float(x["tail"][st]) if stab else 0.0
            nxt_rec = False
            for j in reversed(range(len(chunks))):
                c0, c1 = chunks[j]
                local = float(x["bnd"][r, chunk_index + j])
                for t in reversed(range(c0, c1)):
                    local += float(x["qd"][r, t] - x["kd"][r, t])
                    B_t = float(x["dm"][r, t]) + (0.0 if nxt_rec else carry)
                    route = stab and rec[t]
                    dg[r, t] = local + (0.0 if route or not stab else B_t)
                    da[r, t] = float(x["kd"][r, t]) + (B_t if route else 0.0)
                    carry, nxt_rec = B_t, rec[t]
            dm0[st] = 0.0 if (stab and chunks and nxt_rec) else carry
        chunk_index += len(chunks)
    return b, mc_slots, dg, da, dm0


@pytest.mark.parametrize(
    "B, T, H, L, offsets, tile",
    [
        (2, 45, 3, 16, None, 1024),  # a partial last chunk, one tile
        (1, 200, 2, 16, None, 32),  # tiles of two chunks: the carry crosses tiles
        (1, 60, 2, 8, [0, 1, 10, 10, 35, 60], 32),  # packed: lengths 1, 9, 0, 25, 25
    ],
    ids=["T45-L16", "T200-tiles-of-2", "packed"],
)
@pytest.mark.parametrize(
    "stab, ties, norm",
    [(True, False, True), (True, True, True), (True, False, False), (False, False, False)],
    ids=["max-state", "max-state-ties", "max-state-no-dm", "decay-only"],
)
def test_gate_grads_match_the_step_loop(B, T, H, L, offsets, tile, stab, ties, norm,
                                        monkeypatch):  # fmt: skip
    monkeypatch.setitem(engine_config.GATE_GRAD_TILES, "scalar", (tile, 4))
    gen = torch.Generator().manual_seed(torch.initial_seed() % 2**31)
    rnd = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    N = B if offsets is None else len(offsets) - 1
    x = dict(g=-rnd(B * H, T).abs(), gi=2 * rnd(B * H, T), qd=rnd(B * H, T), kd=rnd(B * H, T),
             dm=rnd(B * H, T) if norm else torch.zeros(B * H, T), tail=rnd(N * H),
             m0=rnd(N * H))  # fmt: skip
    if ties:  # no decay and equal input gates: every step ties the running max (and m_0)
        x["g"].zero_()
        x["gi"].fill_(0.5)
        x["m0"].fill_(0.5)
    dq = torch.zeros(B, T, H, 4, device=DEVICE)  # the chunk tables go to its device
    cfg = ChunkConfig(dq, dq, dq, scale=1.0, has_decay=True, has_igate=True, stabilize=stab,
                      track_n=stab, normalizer="mlstm" if stab else None, eps=1e-6, chunk_size=L,
                      offsets=offsets)  # fmt: skip
    x["bnd"] = rnd(B * H, cfg.NT)
    b, slots, dg_want, da_want, dm0_want = _expected(x, B, T, H, L, offsets, stab, True)
    mc = torch.zeros(B * H, cfg.NT + cfg.NSEQ)
    for (r, i), value in slots.items():
        mc[r, i] = value
    dev = lambda t: t.float().to(DEVICE)  # noqa: E731
    dm0_in = torch.zeros(N, H, device=DEVICE)
    dg, da, dm0 = chunk_gate_grads(
        dev(b), dev(x["gi"]), dev(mc) if stab else None, dev(x["qd"]), dev(x["kd"]),
        dev(x["dm"]) if stab and norm else None, dev(x["bnd"]),
        dev(x["tail"]).view(N, H) if stab else None, dev(x["m0"]) if stab else None,
        dm0_in if stab else None, cfg, (B, T, H),
    )  # fmt: skip
    shape = (B, T, H)
    torch.testing.assert_close(dg.cpu().double(), tokens(dg_want, shape), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(da.cpu().double(), tokens(da_want, shape), rtol=1e-5, atol=1e-5)
    if stab:
        torch.testing.assert_close(dm0.cpu().double().view(-1), dm0_want, rtol=1e-5, atol=1e-5)
