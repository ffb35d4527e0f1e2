"""The host work of a training step, counted without a GPU: the PyTorch operators and the
Triton launches of one forward+backward of the ``train`` suite's model per mixer
(:mod:`linrnn.bench.training`), on CPU tensors under bf16 autocast with the Triton path run by
Triton's interpreter (the operators inside an interpreted launch are not counted).

    python3 benchmarks/step_ops.py                          # every mixer, B1-T128
    python3 benchmarks/step_ops.py --mixers gla mlstm_sig --out ops.json

On the GPU machine a step whose kernels are short enough waits for the host (the training
profile's host share, ``benchmarks/train_profile.py``), and the host's work grows with these
counts: every operator goes through the dispatcher and autograd, and every one but a view
(``view``, ``t``, ``detach``, …: counted apart) launches a kernel. The model is the suite's GPU
model (width 512, 6 blocks) at a short length, so the counts are those of a step at any T;
the optimizer step is left out (fused on CUDA, per parameter on a CPU).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")  # the Triton path on CPU tensors

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# Operators that only make a new view of a tensor (no kernel on a GPU)
VIEWS = frozenset({
    "view", "_unsafe_view", "t", "transpose", "permute", "detach", "alias", "expand",
    "unsqueeze", "squeeze", "select", "slice", "split", "split_with_sizes", "unbind",
    "as_strided", "unflatten", "_reshape_alias", "view_as_real", "view_as_complex",
})  # fmt: skip


class _Counter(TorchDispatchMode):
    """Counts the operators dispatched outside Triton's interpreted launches."""

    def __init__(self, inside: list[int]) -> None:
        super().__init__()
        self.inside = inside
        self.ops: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.inside[0]:
            self.ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def _launch_counter():
    """``(launches, inside)``: Triton's interpreter patched to count each launch by kernel and
    to mark the operators it runs inside one (its own tensor copies)."""
    from triton.runtime import interpreter

    grid_call = interpreter.GridExecutor.__call__
    launches: collections.Counter = collections.Counter()
    inside = [0]

    def call(self, *args, **kwargs):
        launches[getattr(self.fn, "__name__", str(self.fn))] += 1
        inside[0] += 1
        try:
            return grid_call(self, *args, **kwargs)
        finally:
            inside[0] -= 1

    interpreter.GridExecutor.__call__ = call
    return launches, inside


def count_mixer(name: str, T: int, B: int, launches, inside) -> dict:
    """One row: the operators (views apart) and Triton launches of one forward+backward."""
    from linrnn.bench import training
    from linrnn.train import get_batch

    mixer, kwargs = training.VARIANTS[name]
    case = dict(
        data=str(training._default_data()), mixer=mixer, mixer_kwargs=kwargs,
        **training.GPU_MODEL, lr=1e-3, warmup=2, eval_batches=1, seed=0, device="cpu",
        dtype="fp32", backend=None if mixer == "softmax" else "triton", chunk=None,
    )  # fmt: skip
    _cfg, dev, _amp, _ac, model, _opt, _scaler, data, _ = training.build_run(case, B, T, 10)
    x, y = get_batch(data, B, T, torch.Generator().manual_seed(0), dev)

    def step():
        model.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(x, targets=y).loss
        loss.backward()

    step()  # first call: compilation-free here, but caches (tiles, tables) fill
    launches.clear()
    counter = _Counter(inside)
    with counter:
        step()
    views = sum(n for op, n in counter.ops.items() if op in VIEWS)
    total = sum(counter.ops.values())
    return dict(
        mixer=name, shape=f"B{B}-T{T}", ops=total, views=views, kernel_ops=total - views,
        triton_launches=sum(launches.values()), top=counter.ops.most_common(12),
    )  # fmt: skip


def main(argv=None) -> int:
    from linrnn.bench import training

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mixers", nargs="+", default=list(training.VARIANTS),
                    choices=list(training.VARIANTS))  # fmt: skip
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--out", default=None, help="write the rows as JSON")
    a = ap.parse_args(argv)
    launches, inside = _launch_counter()
    rows = [count_mixer(m, a.seq_len, a.batch, launches, inside) for m in a.mixers]
    print(f"{'mixer':<16} {'ops':>6} {'views':>6} {'kernels':>8} {'triton':>7}")
    for r in rows:
        print(f"{r['mixer']:<16} {r['ops']:6d} {r['views']:6d} {r['kernel_ops']:8d} "
              f"{r['triton_launches']:7d}")  # fmt: skip
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
