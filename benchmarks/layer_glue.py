"""The layers' glue on Triton against its PyTorch form, side by side in one process: the output
norm and gate (:func:`linrnn.layers.common.norm_gate`) and the short convolution
(:class:`linrnn.layers.conv.ShortConvolution`), forward and forward+backward, and the memory
the forward keeps for the backward, per kind at the training suite's shape (65,536 tokens,
width 512: 4 heads of 128) and at a wide one (16 heads of 128).

    python3 benchmarks/layer_glue.py                        # every kind, both widths
    python3 benchmarks/layer_glue.py --tokens 4096 --out glue.json

Kinds: ``rms+silu`` (GLA, simple GLA, retention, DeltaNet), ``layer+silu`` (RWKV6),
``layer+sigmoid`` (mLSTM), ``gate-first`` (Mamba2's gated RMSNorm), ``block rms`` (the
models' block norm, no gate, one row per token), ``conv`` (DeltaNet's q, k, v convolutions:
4 taps, SiLU, one per channel of the width), ``conv+bias`` (Mamba2's, over x, B and C: the
width plus 256 channels, with a bias), ``token mix`` (RWKV6's five data-dependent
interpolations of x and the previous token), ``swiglu`` (the models' SwiGLU activation
silu(g)·u from the packed projection [g | u], hidden width 8/3 of the width rounded up to a
multiple of 32, as the models'). Inputs bf16 (the op's output and the gate
projection), fp32 weights, as under autocast. Times are medians of
``triton.testing.do_bench`` on a GPU (``time.perf_counter`` means without one: the PyTorch
form only, a check of the command, not a timing). "saved MiB": the bytes autograd holds
between the forward and the backward (saved-tensor hooks), inputs included.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

from linrnn.layers.common import norm_gate
from linrnn.layers.conv import ShortConvolution
from linrnn.layers.rwkv6 import RWKV6TimeMix
from linrnn.models.feedforward import swiglu

KINDS = {  # name: (layer, act, gate_first, bias, heads?) of a norm, or "conv" and its bias
    "rms+silu": (False, "silu", False, False, True),
    "layer+silu": (True, "silu", False, True, True),
    "layer+sigmoid": (True, "sigmoid", False, True, True),
    "gate-first": (False, "silu", True, False, True),
    "block rms": (False, None, False, False, False),
    "conv": ("conv", False),
    "conv+bias": ("conv", True),
    "token mix": ("token mix",),
    "swiglu": ("swiglu",),
}
WIDTHS = ((4, 128), (16, 128))  # (heads, head dim)


def _saved_bytes(fn) -> int:
    """Bytes of the distinct tensors autograd saves while ``fn`` runs."""
    seen: dict[int, int] = {}

    def pack(t):
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(seen.values())


def _timer(device: str):
    if device == "cuda":
        import triton.testing

        return lambda fn: triton.testing.do_bench(fn, warmup=25, rep=100)

    def timed(fn, n=3):
        fn()
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        return statistics.mean(times)

    return timed


def case(kind: str, tokens: int, heads: int, dim: int, device: str):
    """(leaves, forward(backend)) of one kind at ``tokens`` × ``heads`` × ``dim``."""
    if kind == "token mix":
        layer = RWKV6TimeMix(heads * dim, heads, device=device)
        x = torch.randn(1, tokens, heads * dim, device=device).requires_grad_()

        def mixes(backend):
            layer.backend = backend
            with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
                return torch.stack(layer.interpolations(x, None, None))

        return [x, layer.mu_x, layer.mu, layer.mix_a, layer.mix_b], mixes
    if kind == "swiglu":
        hidden = 32 * -(-8 * heads * dim // 96)
        gu = torch.randn(tokens, 2 * hidden, device=device, dtype=torch.bfloat16)
        gu.requires_grad_()
        return [gu], lambda backend: swiglu(gu, backend)
    if KINDS[kind][0] == "conv":
        bias = KINDS[kind][1]
        width = heads * dim + (256 if bias else 0)
        conv = ShortConvolution(width, 4, "silu", bias, device=device)
        x = torch.randn(1, tokens, width, device=device, dtype=torch.bfloat16).requires_grad_()

        def run(backend):
            return conv(x, output_final_state=False, backend=backend)[0]

        return [x, *conv.parameters()], run
    layer, act, first, has_bias, per_head = KINDS[kind]
    S, D = (heads, dim) if per_head else (1, heads * dim)
    bf16 = dict(device=device, dtype=torch.bfloat16)
    x = torch.randn(tokens, S, D, **bf16).requires_grad_()
    z = torch.randn(tokens, S, D, **bf16).requires_grad_() if act else None
    w = (1 + 0.1 * torch.randn(S * D, device=device)).requires_grad_()
    b = (0.1 * torch.randn(S * D, device=device)).requires_grad_() if has_bias else None
    leaves = [t for t in (x, z, w, b) if t is not None]

    def forward(backend):
        return norm_gate(x, w, b, z, layer=layer, act=act, gate_first=first, eps=1e-5,
                         backend=backend)  # fmt: skip

    return leaves, forward


def measure(kind, tokens, heads, dim, device, backends) -> list[dict]:
    leaves, forward = case(kind, tokens, heads, dim, device)
    scale = {"token mix": 5, "swiglu": 0.5}.get(kind, 1)  # output elements per input element
    dy = torch.randn(int(leaves[0].numel() * scale), device=device, dtype=torch.bfloat16)
    timed = _timer(device)
    rows = []
    for backend in backends:

        def both(backend=backend):
            for t in leaves:
                t.grad = None
            y = forward(backend)
            y.backward(dy.view(y.shape).to(y.dtype))

        def fwd(backend=backend):
            with torch.no_grad():
                forward(backend)

        rows.append(dict(kind=kind, tokens=tokens, heads=heads, dim=dim, backend=backend,
                         fwd_ms=timed(fwd), ms=timed(both),
                         saved_mib=_saved_bytes(lambda b=backend: forward(b)) / 2**20))  # fmt: skip
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=65536)
    p.add_argument("--kinds", nargs="+", default=list(KINDS), choices=list(KINDS))
    p.add_argument("--out", help="write the rows as JSON here")
    args = p.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    backends = ("torch", "triton") if device == "cuda" else ("torch",)
    rows = []
    print(f"layer glue, {args.tokens} tokens, bf16 ({device}); ms forward+backward / forward, "
          "MiB saved for the backward")  # fmt: skip
    for heads, dim in WIDTHS:
        for kind in args.kinds:
            got = measure(kind, args.tokens, heads, dim, device, backends)
            rows += got
            cells = "  ".join(f"{r['backend']} {r['ms']:.3f} / {r['fwd_ms']:.3f} "
                              f"({r['saved_mib']:.0f} MiB)" for r in got)  # fmt: skip
            ratio = f"  torch/triton {got[0]['ms'] / got[1]['ms']:.2f}x" if len(got) > 1 else ""
            print(f"  H{heads}x{dim} {kind:14s} {cells}{ratio}")
    if args.out:
        meta = dict(device=torch.cuda.get_device_name() if device == "cuda" else "cpu",
                    torch=torch.__version__, argv=sys.argv[1:])  # fmt: skip
        with open(args.out, "w") as f:
            json.dump(dict(meta=meta, rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
