"""Registers, spills and shared memory of the vector-gate engine's Triton kernels for a GPU
target, on a machine without a GPU.

Step 1 (a subprocess under TRITON_INTERPRET=1, the installed Triton): one forward+backward
of an op runs on CPU at the given shape, and every kernel launch is recorded: the kernel, its
argument types, its constexprs and num_warps / num_stages. fp16 stands in for bf16 (numpy has
no bf16): the inputs are fp16 with the fast forms enabled for them, and the recorded pointer
types are rewritten to bf16. Step 2 (no interpreter): each distinct launch is compiled for the
target (default sm_90) by the Triton on this process's path, with the pointers and the integer
arguments divisible by 16 marked so and arguments of 1 folded in, as the CUDA launcher
specializes them, and ``cuobjdump -res-usage`` reports its registers (REG), spill stack
(STACK) and shared memory.

The numbers depend on the Triton version: the GPU machine's (3.6 in session 10) can be put
first on the path, e.g. ``pip install --no-deps --target /tmp/t36 triton==3.6.0`` and
``PYTHONPATH=/tmp/t36``. In session 10 that matched ncu on the H200 within 5 registers
(apply_kernel 123 / 128 against 128 / 132); the CPU machine's Triton 3.9 gave 248 for the same
kernel.

    python3 benchmarks/kernel_regs.py --op gla --K 256 --V 256 --chunk 64
    PYTHONPATH=/tmp/t36 python3 benchmarks/kernel_regs.py --op rwkv6 --K 64 --V 64 --json out.json

At commit 3ee396b with Triton 3.6 (GLA, K = V = 256, L = 64): apply_kernel's INTER launches
(dq's and dk's inter parts, the fast chunks' whole dq / dk) 255 and 250 registers, the states
kernels 255 with 8 bytes of spill, the others 104–155.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OPS = ("gla", "gla_gv", "rwkv6")
TORCH_TO_TRITON = {"float32": "fp32", "float16": "bf16", "bfloat16": "bf16", "int32": "i32",
                   "int64": "i64", "float64": "fp64"}  # fmt: skip


def record(op: str, T: int, H: int, K: int, V: int, chunk: int) -> list[dict]:
    """Step 1, in this process (TRITON_INTERPRET=1 set before triton is imported)."""
    import torch
    import torch.nn.functional as F
    from triton.runtime import interpreter

    import linrnn
    from linrnn.engine import triton_chunk_vec as tcv

    tcv.FAST_DTYPES = (torch.float16,)  # the bf16 path, recorded in fp16
    tcv.DIAG_LOOP = True  # the GPU's default (the interpreter keeps the block form)
    seen: dict = {}
    original = interpreter.InterpretedFunction.run

    def run(self, *args, grid, warmup, **kwargs):
        fn = self.fn
        params = inspect.signature(fn).parameters
        names = list(params)
        bound = dict(zip(names, args))
        bound.update({k: v for k, v in kwargs.items() if k in names})
        opts = {k: kwargs[k] for k in ("num_warps", "num_stages", "maxnreg") if k in kwargs}
        fixed = set(self.kwargs.get("do_not_specialize") or ())
        sig, const = {}, {}
        for n in names:
            v = bound.get(n, params[n].default)
            if "constexpr" in str(params[n].annotation):
                const[n] = v
            elif isinstance(v, torch.Tensor):
                sig[n] = "*" + TORCH_TO_TRITON[str(v.dtype).split(".")[1]]
            elif isinstance(v, bool):
                sig[n] = "i1"
            elif isinstance(v, int) and v == 1 and n not in fixed:
                const[n] = 1  # the launcher specializes 1 as a constant
            elif isinstance(v, int):
                sig[n] = "i32" if -(2**31) <= v < 2**31 else "i64"
                if v % 16 == 0 and n not in fixed:
                    const.setdefault("__div16__", []).append(n)
            else:
                sig[n] = "fp32"
        key = json.dumps([fn.__module__, fn.__name__, sig, const, opts], sort_keys=True,
                         default=str)  # fmt: skip
        seen.setdefault(key, dict(module=fn.__module__, name=fn.__name__, sig=sig, const=const,
                                  opts=opts))  # fmt: skip
        return original(self, *args, grid=grid, warmup=warmup, **kwargs)

    interpreter.InterpretedFunction.run = run
    torch.manual_seed(0)
    B = 1
    dt = torch.float16
    q, k = (torch.randn(B, T, H, K, dtype=dt, requires_grad=True) for _ in range(2))
    v = torch.randn(B, T, H, V, dtype=dt, requires_grad=True)
    g = (F.logsigmoid(torch.randn(B, T, H, K)) / 16).requires_grad_()
    kw = dict(backend="triton", mode="chunk", chunk_size=chunk)
    if op == "rwkv6":
        o = linrnn.rwkv6(q, k, v, g, torch.randn(H, K) * 0.1, **kw)[0]
    elif op == "gla_gv":
        gv = (F.logsigmoid(torch.randn(B, T, H, V)) / 16).requires_grad_()
        o = linrnn.gla(q, k, v, g, gv=gv, **kw)[0]
    else:
        o = linrnn.gla(q, k, v, g, **kw)[0]
    o.float().sum().backward()
    return list(seen.values())


def compile_one(entry: dict, arch: int) -> dict:
    """Step 2: one recorded launch compiled for CUDA ``arch``; REG, STACK, shared bytes."""
    import importlib

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = getattr(importlib.import_module(entry["module"]), entry["name"])
    const = dict(entry["const"])
    div = set(const.pop("__div16__", []))
    names = fn.arg_names
    sig = {n: ("constexpr" if n in const else entry["sig"][n]) for n in names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names)
             if n not in const and (sig[n].startswith("*") or n in div)}  # fmt: skip
    src = ASTSource(fn=fn, signature=sig, constexprs=const, attrs=attrs)
    k = triton.compile(src, target=GPUTarget("cuda", arch, 32), options=entry["opts"])
    with tempfile.NamedTemporaryFile("wb", suffix=".cubin", delete=False) as f:
        f.write(k.asm["cubin"])
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    out = subprocess.run([str(tool), "-res-usage", f.name], capture_output=True, text=True)
    os.unlink(f.name)
    txt = out.stdout + out.stderr
    grab = lambda tag: int(m.group(1)) if (m := re.search(tag + r":(\d+)", txt)) else None  # noqa: E731
    return dict(reg=grab("REG"), stack=grab("STACK"), shared=k.metadata.shared)


def label(entry: dict) -> str:
    c = entry["const"]
    flags = [f"{n}={c[n]}" for n in ("IS_DQ", "IS_DK", "REV", "INTER", "GATED", "VEC_V")
             if n in c and c[n] not in (None, False, 0, 0.0)]  # fmt: skip
    tiles = [f"{n}={c[n]}" for n in ("BQ", "BS", "BC", "BT", "BD", "BO", "BK", "BV") if n in c]
    o = entry["opts"]
    return (f"{entry['name']}[{' '.join(flags)}] {' '.join(tiles)} "
            f"w{o.get('num_warps', 4)} s{o.get('num_stages', '-')}")  # fmt: skip


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--op", choices=OPS, default="gla")
    p.add_argument("--T", type=int, default=64, help="steps (one chunk is enough)")
    p.add_argument(
        "--H",
        type=int,
        default=2,
        help="heads (not 1: the launcher would fold an argument of 1 into the kernel)",
    )
    p.add_argument("--K", type=int, default=256)
    p.add_argument("--V", type=int, default=256)
    p.add_argument("--chunk", type=int, default=64)
    p.add_argument("--arch", type=int, default=90, help="CUDA compute capability (90)")
    p.add_argument("--json", type=Path, help="write the table as JSON")
    p.add_argument("--record-only", type=Path, help=argparse.SUPPRESS)  # step 1's output
    a = p.parse_args(argv)
    if a.record_only:
        a.record_only.write_text(json.dumps(record(a.op, a.T, a.H, a.K, a.V, a.chunk), default=str))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "launches.json"
        # the installed Triton records (the host's tile choices do not depend on its version)
        env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT))
        cmd = [sys.executable, __file__, "--op", a.op, "--T", str(a.T), "--H", str(a.H), "--K",
               str(a.K), "--V", str(a.V), "--chunk", str(a.chunk), "--record-only",
               str(path)]  # fmt: skip
        subprocess.run(cmd, env=env, check=True)
        entries = json.loads(path.read_text())
    os.environ.pop("TRITON_INTERPRET", None)
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    import triton

    rows = []
    print(f"Triton {triton.__version__}, sm_{a.arch}, {a.op} K={a.K} V={a.V} L={a.chunk}")
    for e in entries:
        try:
            r = compile_one(e, a.arch)
        except Exception as exc:  # a kernel that does not compile for the target
            r = dict(error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}")
        rows.append(dict(kernel=label(e), **r))
        print(f"  {label(e):90s} " + (f"REG {r['reg']:3d}  STACK {r['stack']:5d}  shared "
              f"{r['shared']:6d}" if "error" not in r else r["error"]), flush=True)  # fmt: skip
    if a.json:
        rep = dict(triton=triton.__version__, arch=a.arch, op=a.op, K=a.K, V=a.V, chunk=a.chunk,
                   rows=rows)  # fmt: skip
        a.json.write_text(json.dumps(rep, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
