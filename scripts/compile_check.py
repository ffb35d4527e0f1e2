"""Compile every Triton kernel specialization the public ops reach, for a GPU target, on a
machine without a GPU.

The interpreter (TRITON_INTERPRET=1) runs the kernels as NumPy and never meets the compiler, so
code it accepts can still fail to compile: a jit helper returning a None it was given, a
loop-carried variable whose type changes (``_`` reused for a scalar and a block), a construct
one Triton version takes and another refuses. This script finds those without a GPU:

1. capture: under the interpreter, run every family in modes chunk, fused_chunk and recurrent
   (forward and backward; bf16, fp16, fp32; with and without packed sequences, initial states,
   gv, the bonus u, the normalizers) and record each kernel launch's argument kinds;
2. compile: in a fresh process without the interpreter, compile each distinct specialization
   with ``triton.compile`` for the target (default sm_90, Hopper) and report the failures.

    python3 scripts/compile_check.py                   # this Triton, sm_90
    python3 scripts/compile_check.py --only dq_bwd_kernel   # one kernel's specializations

Another Triton version (e.g. the GPU machine's, installed with ``pip install --target DIR``):
record with this one's interpreter, compile with the other (interpreters differ between
versions; the compiler is what must accept the kernels)::

    python3 scripts/compile_check.py --phase capture --records launches.pkl
    PYTHONPATH=DIR python3 scripts/compile_check.py --phase compile --records launches.pkl

Exit status 1 when any specialization fails to compile. Compiling takes minutes (several
hundred specializations).

What a specialization costs on the target, without a GPU: ``--resources`` runs the ptxas Triton
assembles that target with on each compiled kernel and prints its registers, spill bytes, shared
memory and the PTX's barrier and shared-memory instruction counts. Each compile gets the
divisibility hints a GPU launch gives (tensors 16-byte aligned, ints that are multiples of 16),
so the loads vectorize as they do there. The captured shapes are
small; ``--set`` gives the recorded arguments other values (the GPU's tiles) and ``--match``
picks records::

    python3 scripts/compile_check.py --phase compile --records launches.pkl --resources \
        --only out_fwd_kernel --match q=torch.bfloat16,HAS_DECAY=False,VARLEN=False,NORM=0 \
        --set K=256,V=256,BQ=64,BD=32,BO=256,num_warps=4,num_stages=3

``--ptx DIR`` writes each compiled kernel's PTX and TTGIR (Triton's GPU IR: its layouts and
layout conversions) to DIR (``<kernel>-<n>.ptx``, ``.ttgir``, n counting the
compiled specializations in record order): run from two trees with the same records and picks,
the files compare a kernel's code between them (``.loc`` lines and the debug sections differ
with the source's line numbers alone).
"""

from __future__ import annotations

import argparse
import ast
import collections
import importlib
import inspect
import os
import pickle
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED_LIMIT = {90: 232448}  # bytes of shared memory one block may use (Hopper: 227 KiB)
# The launch options a record may carry besides the kernel's arguments (maxnreg: --set maxnreg=N).
LAUNCH_OPTIONS = ("num_warps", "num_stages", "maxnreg")
POINTER_TYPES = {"torch.float16": "*fp16", "torch.bfloat16": "*bf16", "torch.float32": "*fp32",
                 "torch.int8": "*i8", "torch.int32": "*i32", "torch.int64": "*i64"}  # fmt: skip


def _describe(value):
    import torch

    return ("tensor", str(value.dtype)) if isinstance(value, torch.Tensor) else ("value", value)


def _calls(linrnn, torch, F):
    """The public calls whose launches are recorded: (op, args, kwargs)."""
    B, T, H, K, V = 1, 40, 2, 32, 32
    for dt in (torch.bfloat16, torch.float16, torch.float32):
        for mode in ("chunk", "fused_chunk", "recurrent"):
            for cu in (None, torch.tensor([0, 17, 40])):
                q, k, v = (torch.randn(B, T, H, D, dtype=dt).requires_grad_() for D in (K, K, V))
                N = B if cu is None else len(cu) - 1
                S0 = torch.randn(N, H, K, V).requires_grad_()

                def decay(*shape):
                    return F.logsigmoid(torch.randn(*shape)).requires_grad_()

                def pre(*shape):
                    return torch.randn(*shape).requires_grad_()

                kw = dict(mode=mode, backend="triton", chunk_size=16, cu_seqlens=cu,
                          output_final_state=True)  # fmt: skip
                sig_gate = dict(input_gate="sigmoid", normalize=True)
                yield from (
                    (linrnn.linear_attn, (q, k, v), kw),
                    (linrnn.linear_attn, (q, k, v), dict(kw, normalize=True)),
                    (linrnn.retention, (q, k, v, decay(H)), dict(kw, initial_state=S0)),
                    (linrnn.simple_gla, (q, k, v, decay(B, T, H)), dict(kw, initial_state=S0)),
                    (linrnn.gla, (q, k, v, decay(B, T, H, K)), dict(kw, initial_state=S0)),
                    (linrnn.gla, (q, k, v, decay(B, T, H, K)), dict(kw, gv=decay(B, T, H, V))),
                    (linrnn.rwkv6, (q, k, v, decay(B, T, H, K), pre(H, K)), kw),
                    (linrnn.mlstm, (q, k, v, pre(B, T, H), pre(B, T, H)), kw),
                    (linrnn.mlstm, (q, k, v, pre(B, T, H), pre(B, T, H)), dict(kw, **sig_gate)),
                )
                # Mamba2 with B and C shared by two heads each (groups), Δ through softplus
                HM = 2 * H
                x = torch.randn(B, T, HM, V, dtype=dt).requires_grad_()
                yield (linrnn.mamba2, (x, pre(B, T, HM), -torch.rand(HM).requires_grad_(),
                                       k, q), dict(kw, D=pre(HM), dt_bias=pre(HM),
                                                   dt_softplus=True))  # fmt: skip
                if mode == "chunk":
                    yield from _mamba2_large_groups(linrnn, torch, x, pre, k, q, kw)
                if mode == "recurrent":  # a decode step: no gradient, D·x in the kernel
                    yield (linrnn.mamba2, tuple(a.detach() for a in (x, pre(B, T, HM),
                           -torch.rand(HM), k, q)), dict(kw, D=pre(HM).detach(),
                                                         dt_bias=pre(HM).detach(),
                                                         dt_softplus=True))  # fmt: skip
                if mode == "fused_chunk":  # the delta rule has no fused_chunk kernel
                    continue
                HV = 2 * H  # grouped value heads
                vg = torch.randn(B, T, HV, V, dtype=dt).requires_grad_()
                beta = torch.rand(B, T, HV).requires_grad_()
                dkw = dict(kw, initial_state=torch.randn(N, HV, K, V).requires_grad_(),
                           use_qk_l2norm=True)  # fmt: skip
                yield (linrnn.delta_rule, (q, k, vg, beta), dkw)
                yield (linrnn.gated_delta_rule, (q, k, vg, decay(B, T, HV), beta), dkw)
        yield from _delta_head_dims(linrnn, torch, F, dt)
        yield from _norm_gates(torch, dt)
        yield from _short_convs(torch, dt)
        yield from _token_mixes(torch, dt)
        yield from _swiglus(torch, dt)


def _norm_gates(torch, dt):
    """The layers' fused norm and output gate: RMSNorm and LayerNorm, each gate form, a head
    width and a block norm's width (the 8-warp tile)."""
    from linrnn.layers.common import norm_gate

    def op(*args, **kw):
        return norm_gate(*args, **kw), None

    for S, D in ((4, 64), (1, 2048)):
        x, z = (torch.randn(3, 5, S, D, dtype=dt).requires_grad_() for _ in "xz")
        w, b = (torch.randn(S * D).requires_grad_() for _ in "wb")
        for layer, act, first in ((False, None, False), (False, "silu", False),
                                  (True, "sigmoid", False), (False, "silu", True)):  # fmt: skip
            gate = z if act else None
            yield (op, (x, w, b if layer else None, gate),
                   dict(layer=layer, act=act, gate_first=first, backend="triton"))  # fmt: skip


def _short_convs(torch, dt):
    """The layers' short convolution: with and without SiLU and bias, dense and packed, 4 taps
    and the most (16: the backward's narrowest token tile)."""
    from linrnn.layers.conv import ShortConvolution

    for act, bias, cu, taps in (("silu", False, None, 4), (None, True, [0, 7, 20], 4),
                                ("silu", True, None, 16)):  # fmt: skip
        conv = ShortConvolution(48, taps, act, bias)

        def op(x, conv=conv, cu=cu):
            return conv(x, cu_seqlens=cu, backend="triton")

        yield (op, (torch.randn(1, 20, 48, dtype=dt).requires_grad_(),), {})


def _swiglus(torch, dt):
    """The models' SwiGLU activation from its packed projection (a width that is not a
    multiple of the channel tile)."""
    from linrnn.engine.swiglu import swiglu

    def op(gu):
        return swiglu(gu), None

    yield (op, (torch.randn(1, 20, 2 * 200, dtype=dt).requires_grad_(),), {})


def _token_mixes(torch, dt):
    """RWKV6's token shift and interpolations: the shift-mix and the five mixes, dense and
    packed."""
    from linrnn.engine.token_mix import lerp_shift
    from linrnn.layers.common import sequence_ids

    def op(*args):
        return lerp_shift(*args), None

    for cu in (None, [0, 7, 20]):
        x = torch.randn(1, 20, 48, dtype=dt).requires_grad_()
        sid = sequence_ids(cu, "cpu")
        yield (op, (x, sid, torch.rand(1, 48).requires_grad_()), {})
        yield (op, (x, sid, torch.rand(5, 48).requires_grad_(),
                    torch.randn(1, 20, 5, 48, dtype=dt).requires_grad_()), {})  # fmt: skip


def _mamba2_large_groups(linrnn, torch, x, pre, Bm, Cm, kw):
    """Mamba2 with all its heads in one B/C group, on the dv kernel that shares a group's
    scores (group_scores_kernels) and the dq/dk kernels of group_kernels, at chunks of one and
    of two time tiles, with and without D. Those take several heads per program only where the
    grid is large, and groups of at least GROUP_DV_MIN_HEADS and GROUP_MIN_HEADS heads; both
    forced here for these calls."""
    from linrnn.engine import scalar

    HM = x.shape[2]
    real = scalar.score_heads_per_program, scalar.GROUP_MIN_HEADS, scalar.GROUP_DV_MIN_HEADS
    scalar.score_heads_per_program = lambda G, programs: G
    scalar.GROUP_MIN_HEADS = scalar.GROUP_DV_MIN_HEADS = min(real[1], real[2], HM)
    try:
        for L, D in ((16, pre(HM)), (128, pre(HM)), (128, None)):
            args = (x, pre(*x.shape[:3]), -torch.rand(HM).requires_grad_(), Bm[:, :, :1],
                    Cm[:, :, :1])  # fmt: skip
            yield (linrnn.mamba2, args, dict(kw, chunk_size=L, D=D, dt_bias=pre(HM),
                                             dt_softplus=True))  # fmt: skip
    finally:
        scalar.score_heads_per_program, scalar.GROUP_MIN_HEADS, scalar.GROUP_DV_MIN_HEADS = real


def _delta_head_dims(linrnn, torch, F, dt):
    """The delta rule at the head dims and chunk sizes whose tiles are largest (shared memory
    grows with K, V and L): K = V ∈ {128, 256}, L ∈ {64, 128}, both modes."""
    B, T, H = 1, 20, 1
    for D in (128, 256):
        for mode, L in (("chunk", None), ("chunk", 128), ("recurrent", None)):
            q, k, v = (torch.randn(B, T, H, D, dtype=dt).requires_grad_() for _ in "qkv")
            beta = torch.rand(B, T, H).requires_grad_()
            g = F.logsigmoid(torch.randn(B, T, H)).requires_grad_()
            kw = dict(mode=mode, backend="triton", chunk_size=L, use_qk_l2norm=True,
                      initial_state=torch.randn(B, H, D, D).requires_grad_(),
                      output_final_state=True)  # fmt: skip
            yield (linrnn.gated_delta_rule, (q, k, v, g, beta), kw)


def capture(path: str, limit: int | None) -> None:
    os.environ["TRITON_INTERPRET"] = "1"
    import torch
    import torch.nn.functional as F
    import triton.runtime.interpreter as interpreter

    import linrnn

    records = []
    real = interpreter.InterpretedFunction.__getitem__

    def getitem(self, grid):
        launch = real(self, grid)
        names = list(inspect.signature(self.fn).parameters)

        def run(*args, **kwargs):
            given = dict(zip(names, args), **kwargs)
            records.append((self.fn.__module__, self.fn.__name__,
                            {k: _describe(x) for k, x in given.items()}))  # fmt: skip
            return launch(*args, **kwargs)

        return run

    interpreter.InterpretedFunction.__getitem__ = getitem
    torch.manual_seed(0)
    for i, (op, args, kwargs) in enumerate(_calls(linrnn, torch, F)):
        if limit is not None and i >= limit:
            break
        o, state = op(*args, **kwargs)
        parts = state if isinstance(state, tuple) else (state,)
        loss = o.float().sum() + sum(p.float().sum() for p in parts if p is not None)
        if loss.requires_grad:  # (not the decode steps)
            loss.backward()
    with open(path, "wb") as f:
        pickle.dump(records, f)


def _signature(fn, given):
    """triton.compile's signature and constants for one recorded launch."""
    signature, constants = {}, {}
    for p in fn.params:
        kind, value = given.get(p.name, ("value", fn.signature.parameters[p.name].default))
        if p.is_constexpr or (kind == "value" and value is None):
            signature[p.name] = "constexpr"
            constants[(p.num,)] = value
        elif kind == "tensor":
            signature[p.name] = POINTER_TYPES[value]
        elif isinstance(value, bool):
            signature[p.name] = "i1"
        elif isinstance(value, float):
            signature[p.name] = "fp32"
        else:
            signature[p.name] = "i64" if abs(int(value)) >= 2**31 else "i32"
    return signature, constants


def _attrs(fn, given) -> dict:
    """The divisibility hints a launch on the GPU gives triton.compile: 16 for every tensor
    (assumed 16-byte aligned, as PyTorch allocates) and for every specialized int argument
    that is a multiple of 16. Without them the compiler cannot vectorize a tile's loads
    (one element per thread and load, an address register per element)."""
    skip = {fn.arg_names[i] if isinstance(i, int) else i for i in fn.do_not_specialize}
    attrs = {}
    for p in fn.params:
        kind, value = given.get(p.name, ("value", None))
        if p.is_constexpr or value is None or isinstance(value, (bool, float)):
            continue
        if kind == "tensor" or (p.name not in skip and int(value) % 16 == 0):
            attrs[(p.num,)] = [["tt.divisibility", 16]]
    return attrs


def _assignments(text: str) -> dict:
    """``"A=1,B=x"`` -> {"A": 1, "B": "x"} (Python literals where they parse, else strings)."""
    out = {}
    for item in filter(None, text.split(",")):
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"expected NAME=VALUE, got {item!r}")
        try:
            out[key.strip()] = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError):
            out[key.strip()] = value.strip()
    return out


def _matches(given: dict, match: dict) -> bool:
    """Whether a record has every ``match`` value (a tensor matches its dtype's name)."""
    return all(k in given and str(given[k][1]) == str(v) for k, v in match.items())


def resources(kernel, arch: int) -> str:
    """ptxas's registers and spills, the shared memory and the PTX's barrier and shared-memory
    instruction counts of one compiled kernel."""
    from triton.backends.nvidia.compiler import get_ptxas

    ptxas = get_ptxas(arch).path  # the one Triton itself assembles this target with
    ptx = kernel.asm["ptx"]
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "kernel.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        cmd = [ptxas, f"-arch=sm_{arch}{'a' if arch >= 90 else ''}", "-v", src, "-o",
               os.path.join(d, "kernel.o")]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True)
    info = done.stdout + done.stderr
    found = {}
    for key, pattern in (("registers", r"Used (\d+) registers"),
                         ("spill stores", r"(\d+) bytes spill stores"),
                         ("spill loads", r"(\d+) bytes spill loads")):  # fmt: skip
        m = re.search(pattern, info)
        found[key] = int(m.group(1)) if m else "?"
    counts = ", ".join(f"{w} {ptx.count(w)}" for w in ("bar.sync", "st.shared", "ld.shared"))
    return (
        f"{found['registers']} registers, spill stores {found['spill stores']} B, spill "
        f"loads {found['spill loads']} B, shared {kernel.metadata.shared} B; PTX {counts}"
    )


def compile_all(path: str, arch: int, only: set[str], match: dict | None = None,
                overrides: dict | None = None, report: bool = False,
                ptx_dir: str | None = None) -> int:  # fmt: skip
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    with open(path, "rb") as f:
        records = pickle.load(f)
    target = GPUTarget("cuda", arch, 32)
    seen, failures, compiled = set(), collections.Counter(), 0
    for module, name, given in records:
        if only and name not in only:
            continue
        if match and not _matches(given, match):
            continue
        if overrides:
            given = {**given, **{k: ("value", v) for k, v in overrides.items()}}
        fn = getattr(importlib.import_module(module), name)
        params = {p.name: p for p in fn.params}
        # runtime ints and floats do not specialize (beyond the i32/i64 split): leave them out
        key_items = {k: v for k, v in given.items() if k in LAUNCH_OPTIONS or (
            k in params and (params[k].is_constexpr or v[0] == "tensor" or v[1] is None
                             or isinstance(v[1], bool)))}  # fmt: skip
        key = (module, name, tuple(sorted((k, str(v)) for k, v in key_items.items())))
        if key in seen:
            continue
        seen.add(key)
        signature, constants = _signature(fn, given)
        options = {k: given[k][1] for k in LAUNCH_OPTIONS if k in given}
        try:
            source = ASTSource(fn, signature, constants, _attrs(fn, given))
            kernel = triton.compile(source, target=target, options=options)
            compiled += 1
        except Exception as e:  # every compiler failure is a finding
            lines = [ln for ln in str(e).splitlines() if "Error" in ln] or [type(e).__name__]
            failures[(name, lines[-1].strip()[:200])] += 1
            continue
        if report:
            tiles = {k: v[1] for k, v in given.items()
                     if (k.startswith("B") and k.isupper()) or k.startswith("num_")}  # fmt: skip
            print(f"{name} {tiles}: {resources(kernel, arch)}", flush=True)
        if ptx_dir:
            os.makedirs(ptx_dir, exist_ok=True)
            for ir in ("ptx", "ttgir"):  # the TTGIR shows the layout conversions
                with open(os.path.join(ptx_dir, f"{name}-{compiled}.{ir}"), "w") as f:
                    f.write(kernel.asm[ir])
        # The launch would fail with OutOfResources: a finding too (the limit is the GPU's)
        shared, limit = kernel.metadata.shared, SHARED_LIMIT.get(arch)
        if limit is not None and shared > limit:
            tiles = {k: v[1] for k, v in given.items() if k.startswith("B") and k.isupper()}
            failures[(name, f"shared memory {shared} > {limit} at {tiles}")] += 1
    print(f"Triton {triton.__version__}, sm_{arch}: {compiled} specializations compiled, "
          f"{sum(failures.values())} failed")  # fmt: skip
    for (name, message), count in failures.most_common():
        print(f"  {count:4d} × {name}: {message}")
    return 1 if failures else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", type=int, default=90, help="CUDA compute capability (90: Hopper)")
    ap.add_argument("--only", default="", help="comma-separated kernel names to compile")
    ap.add_argument("--limit", type=int, default=None, help="record only the first N calls")
    ap.add_argument("--phase", choices=("all", "capture", "compile"), default="all")
    ap.add_argument("--records", default=None, help="the capture file (default: a temp file)")
    ap.add_argument("--match", default="", help="only records with these values: NAME=VALUE,...")
    ap.add_argument("--set", default="", help="compile with these values: NAME=VALUE,...")
    ap.add_argument("--resources", action="store_true",
                    help="registers, spills, shared memory of each kernel (ptxas)")  # fmt: skip
    ap.add_argument("--ptx", default=None, metavar="DIR", help="write each kernel's PTX here")
    a = ap.parse_args(argv)
    picks = dict(match=_assignments(a.match), overrides=_assignments(a.set), report=a.resources,
                 ptx_dir=a.ptx)  # fmt: skip
    path = a.records or os.path.join(tempfile.mkdtemp(), "launches.pkl")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [os.environ.get(
        "PYTHONPATH"), ROOT])))  # fmt: skip
    if a.phase == "capture":
        capture(path, a.limit)
        return 0
    if a.phase == "compile":
        return compile_all(path, a.arch, set(filter(None, a.only.split(","))), **picks)
    # Two processes: the interpreter must be chosen before triton is imported, and compiling
    # needs it off.
    base = [sys.executable, os.path.abspath(__file__), "--records", path]
    limit = [] if a.limit is None else ["--limit", str(a.limit)]
    subprocess.run([*base, "--phase", "capture", *limit], check=True, env=env)
    env.pop("TRITON_INTERPRET", None)
    picked = ["--match", a.match, "--set", a.set] + (["--resources"] if a.resources else [])
    picked += ["--ptx", a.ptx] if a.ptx else []
    done = subprocess.run([*base, "--phase", "compile", "--arch", str(a.arch), "--only", a.only,
                           *picked], env=env)  # fmt: skip
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
