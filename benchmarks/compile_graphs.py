"""GPU check for issue 9: torch.compile and CUDA-graph decoding of the small LM.

For each mixer (default: gla, simple_gla, mlstm, retention):

1. training step (forward + backward + AdamW) of ``linrnn.models.CausalLM``: eager vs
   ``torch.compile(model)`` (inductor), median step time, first-call compile time, and the
   number of compilations over two further sequence lengths (T marked dynamic: should stay 1);
2. decoding: tokens/s of the one-token step at batch 1 and 64, eager (``model(ids, cache=...)``
   per token) vs :func:`linrnn.graphs.capture_decode` (the step captured into a CUDA graph), and
   whether both produce the same greedy tokens.

Writes JSON with the GPU name, torch/triton versions and the git commit::

    python benchmarks/compile_graphs.py --out benchmarks/results/compile-graphs-h100.json

``--quick`` runs a tiny configuration (CPU works: no graph, ``aot_eager``) to check the script.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch._dynamo
import torch._dynamo.testing

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import linrnn  # noqa: E402
from linrnn.bench.report import git_commit  # noqa: E402
from linrnn.layers import Cache  # noqa: E402
from linrnn.models import CausalLM, LMConfig  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn, device, iters: int) -> list[float]:
    times = []
    for _ in range(iters):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return times


def _model(args, mixer, device, dtype):
    torch.manual_seed(0)
    config = LMConfig(
        vocab_size=args.vocab, d_model=args.d_model, num_layers=args.layers,
        num_heads=args.heads, mixer=mixer,
    )  # fmt: skip
    return CausalLM(config, device=device, dtype=dtype)


def bench_training(args, mixer, device, dtype) -> dict:
    out = {}
    for label in ("eager", "compiled"):
        model = _model(args, mixer, device, dtype)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        counter = None
        fwd = model
        if label == "compiled":
            torch._dynamo.reset()
            counter = torch._dynamo.testing.CompileCounterWithBackend(args.compile_backend)
            fwd = torch.compile(model, backend=counter)

        def step(T=args.T, fwd=fwd, opt=opt, counter=counter):
            ids = torch.randint(0, args.vocab, (args.batch, T), device=device)
            if counter is not None:
                torch._dynamo.mark_dynamic(ids, 1)
            loss = fwd(ids, targets=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        first = _timed(step, device, 1)[0]
        _timed(step, device, args.warmup)
        times = _timed(step, device, args.iters)
        row = {"first_call_s": first, "median_step_ms": 1e3 * statistics.median(times)}
        if counter is not None:
            for T in (args.T // 2 + 3, args.T + 17):  # two more lengths: no recompilation
                step(T)
            row["compilations"] = counter.frame_count
        out[label] = row
    out["speedup"] = out["eager"]["median_step_ms"] / out["compiled"]["median_step_ms"]
    return out


def bench_decode(args, mixer, device, dtype, batch: int) -> dict:
    model = _model(args, mixer, device, dtype).eval()
    prompt = torch.randint(0, args.vocab, (batch, args.prompt), device=device)
    steps = args.decode_steps
    rows = {}
    tokens = {}
    for label in ("eager", "graph"):
        cache = Cache()
        with torch.no_grad():
            first = model(prompt, cache=cache).logits[:, -1].argmax(-1)
        if label == "eager":
            state = {"cache": cache}

            def run(first=first, state=state):
                c = Cache()
                c.layers = {i: dict(e) for i, e in state["cache"].layers.items()}
                toks = [first]
                with torch.no_grad():
                    for _ in range(steps - 1):
                        toks.append(model(toks[-1][:, None], cache=c).logits[:, -1].argmax(-1))
                return torch.stack(toks, 1)

            setup_s = 0.0
        else:
            t0 = time.perf_counter()
            dec = linrnn.graphs.capture_decode(model, cache, graph=device.type == "cuda")
            _sync(device)
            setup_s = time.perf_counter() - t0
            start = Cache()
            start.layers = {i: {k: linrnn.graphs._clone(x) for k, x in e.items()}
                            for i, e in dec.cache.layers.items()}  # fmt: skip

            def run(first=first, dec=dec, start=start):
                dec.load(start)
                return dec.generate(first, steps)

        tokens[label] = run()  # warm-up, and the tokens to compare
        t = statistics.median(_timed(run, device, args.decode_reps))
        rows[label] = {
            "tokens_per_s": batch * (steps - 1) / t,
            "ms_per_token": 1e3 * t / (steps - 1),
            "setup_s": setup_s,
        }
    rows["speedup"] = rows["graph"]["tokens_per_s"] / rows["eager"]["tokens_per_s"]
    rows["same_tokens"] = bool(torch.equal(tokens["eager"], tokens["graph"]))
    return rows


def machine(device, commit=None) -> dict:
    sha, dirty = git_commit()
    if commit:  # the GPU machine's copy of .git may be stale
        sha, dirty = commit, None
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    return {
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "device": str(device),
        "torch": torch.__version__,
        "triton": triton_version,
        "cuda": torch.version.cuda,
        "git_commit": sha,
        "git_dirty": dirty,
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--mixers", nargs="+", default=["gla", "simple_gla", "mlstm", "retention"])
    p.add_argument("--d-model", type=int, default=512)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--batch", type=int, default=8, help="training batch")
    p.add_argument("-T", type=int, default=1024, help="training sequence length")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--decode-batches", type=int, nargs="+", default=[1, 64])
    p.add_argument("--prompt", type=int, default=32)
    p.add_argument("--decode-steps", type=int, default=128)
    p.add_argument("--decode-reps", type=int, default=5)
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    p.add_argument("--compile-backend", default="inductor")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--quick", action="store_true", help="tiny sizes, to check the script")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--commit", help="git commit to record (the GPU copy may lack .git)")
    args = p.parse_args(argv)
    if args.quick:
        args.d_model, args.layers, args.heads, args.vocab = 32, 1, 2, 64
        args.batch, args.T, args.iters, args.warmup = 2, 24, 2, 1
        args.prompt, args.decode_steps, args.decode_reps = 4, 4, 1
        args.decode_batches = [1, 3]
        if args.device == "cpu":
            args.compile_backend, args.dtype = "aot_eager", "fp32"
    return args


def main(argv=None) -> int:
    args = parse(argv)
    device, dtype = torch.device(args.device), DTYPES[args.dtype]
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    report = {"machine": machine(device, args.commit), "config": config, "results": {}}
    for mixer in args.mixers:
        res = {"training": bench_training(args, mixer, device, dtype)}
        for b in args.decode_batches:
            res[f"decode_b{b}"] = bench_decode(args, mixer, device, dtype, b)
        report["results"][mixer] = res
        print(mixer, json.dumps(res, indent=1), flush=True)
    text = json.dumps(report, indent=2) + "\n"
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
