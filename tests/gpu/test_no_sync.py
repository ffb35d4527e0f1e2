"""A packed call queues its work without stalling the host: under
``torch.cuda.set_sync_debug_mode("error")`` (which raises at any synchronizing CUDA call) the
forward and backward of packed chunk calls and a packed recurrent call run through. Their
tables go to the device asynchronously (linrnn._runtime.to_device) and no device value is read
back. ``cu_seqlens`` is a list here: a CUDA tensor is read once by the checks, by design."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import linrnn

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

OFFSETS = [0, 100, 100, 333, 512]


def _inputs(op):
    x = lambda *s: torch.randn(*s, device="cuda")  # noqa: E731
    T, H, K = OFFSETS[-1], 2, 64
    q, k, v = x(1, T, H, K), x(1, T, H, K), x(1, T, H, K)
    g = F.logsigmoid(x(1, T, H) if op == "simple_gla" else x(1, T, H, K)) / 16
    return [t.requires_grad_() for t in (q, k, v, g)]


@pytest.mark.parametrize("op", ["simple_gla", "gla"])
def test_packed_chunk_call_makes_no_sync(op):
    fn = getattr(linrnn, op)
    inputs = _inputs(op)

    def call():
        o, S = fn(*inputs, cu_seqlens=OFFSETS, mode="chunk", output_final_state=True)
        (o.float().square().sum() + S.square().sum()).backward()

    call()  # compilation and the caches first
    torch.cuda.synchronize()
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        call()
    finally:
        torch.cuda.set_sync_debug_mode(previous)
    torch.cuda.synchronize()


def test_packed_recurrent_step_makes_no_sync():
    q, k, v, g = (t.detach() for t in _inputs("simple_gla"))
    S0 = torch.zeros(len(OFFSETS) - 1, 2, 64, 64, device="cuda")
    linrnn.simple_gla(q, k, v, g, cu_seqlens=OFFSETS, mode="recurrent", initial_state=S0)
    torch.cuda.synchronize()
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        linrnn.simple_gla(q, k, v, g, cu_seqlens=OFFSETS, mode="recurrent", initial_state=S0)
    finally:
        torch.cuda.set_sync_debug_mode(previous)
    torch.cuda.synchronize()
