"""Timing and peak memory of one benchmark case (runs in the worker, or in-process on CPU).

* Times: ``triton.testing.do_bench`` medians on CUDA (its warm-up excluded); on CPU the median
  of ``repeats`` ``time.perf_counter`` calls after one warm-up call.
* "fwd" is the forward under ``torch.no_grad()``; "fwd+bwd" is the forward with autograd plus
  ``torch.autograd.grad(o, leaves, do)``.
* Peak memory (CUDA): ``max_memory_allocated`` after ``reset_peak_memory_stats`` during one
  separate call; also the peak minus what was allocated before the call (inputs and ``do``).
* First call: the first forward plus the first backward (compilation and autotuning
  included when the worker has a fresh Triton cache).
"""

from __future__ import annotations

import statistics
import time
import traceback
from functools import partial

import torch

from linrnn.bench import peers, registry
from linrnn.bench.worker import emit, error_detail, short_error


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(fn, device) -> float:
    """Seconds of one call, synchronized."""
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t0


def median_ms(fn, case: dict, device) -> float:
    """Median time of ``fn`` in ms: ``triton.testing.do_bench`` on CUDA (its warm-up
    excluded), else ``time.perf_counter`` over ``cpu_repeats`` calls after one warm-up."""
    if device.type == "cuda":
        import triton.testing

        return float(
            triton.testing.do_bench(
                fn, warmup=case["warmup_ms"], rep=case["rep_ms"], return_mode="median"
            )
        )
    fn()
    return 1e3 * statistics.median(timed(fn, device) for _ in range(case["cpu_repeats"]))


def peak_mib(fn, device) -> tuple[float | None, float | None]:
    """``(peak, peak − allocated before the call)`` in MiB for one call of ``fn`` (CUDA)."""
    if device.type != "cuda":
        return None, None
    sync(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    fn()
    sync(device)
    peak = torch.cuda.max_memory_allocated(device)
    return peak / 2**20, (peak - before) / 2**20


def bench_case(case: dict, item: dict, build=None) -> dict:
    """Figures for one op × mode × chunk size × shape. ``build(case, shape)`` returns
    ``(leaves, fwd)`` (default: the builder of the op's library in :data:`peers.BUILDERS`;
    the varlen suite passes its own). A stage that raises ends the row (a
    backward that raises still leaves the forward to time); the figures measured before it
    are kept, and the exception becomes the status (``NotImplementedError``: "not
    implemented", also in the backward, which is not a failure)."""
    row: dict = {"status": "ok"}
    where = {"stage": "inputs"}

    def stage(name: str) -> None:
        where["stage"] = name
        if not case.get("in_process"):
            emit({"event": "stage", "stage": name})

    try:
        bench_stages(case, registry.parse_shape(item["shape"]), row, stage, build)
    except NotImplementedError as exc:
        row["status"] = f"not implemented: {short_error(exc)}"
    except Exception as exc:
        if not case.get("in_process"):
            traceback.print_exc()
        row["status"] = f"error ({where['stage']}): {short_error(exc)}"
        row["error_detail"] = error_detail(exc)
    return row


def bench_stages(case: dict, shape: dict, row: dict, stage, build=None) -> None:
    device = torch.device(case["device"])
    stage("inputs")
    build = build or peers.BUILDERS[peers.library_of(case["op"])]
    leaves, fwd = build(case, shape)
    sync(device)
    if device.type == "cuda":
        row["inputs_mib"] = torch.cuda.memory_allocated(device) / 2**20
    with_bwd = case.get("fwdbwd", True)

    stage("first forward")  # with autograd, as in training; its graph feeds the first backward
    sync(device)
    t0 = time.perf_counter()
    with torch.set_grad_enabled(with_bwd):
        o = fwd()
    sync(device)
    row["first_fwd_s"] = time.perf_counter() - t0
    if not with_bwd:
        row["first_call_s"] = row["first_fwd_s"]
    do = torch.randn_like(o.detach())

    def fwd_bwd():
        torch.autograd.grad(fwd(), leaves, do)

    def fwd_nograd():
        with torch.no_grad():
            fwd()

    if with_bwd:
        stage("first backward")
        try:
            row["first_bwd_s"] = timed(partial(torch.autograd.grad, o, leaves, do), device)
            row["first_call_s"] = row["first_fwd_s"] + row["first_bwd_s"]
        except NotImplementedError as exc:  # a backward still to come: the forward is timed
            row["status"] = f"not implemented (backward): {short_error(exc)}"
        except Exception as exc:  # e.g. fla's simple-GLA backward on Triton < 3.7.1
            if not case.get("in_process"):
                traceback.print_exc()
            row["status"] = f"error (first backward): {short_error(exc)}"
            row["error_detail"] = error_detail(exc)
    del o  # the first call's graph

    stage("timing forward")
    row["fwd_ms"] = median_ms(fwd_nograd, case, device)
    row["peak_fwd_mib"], row["extra_fwd_mib"] = peak_mib(fwd_nograd, device)
    if with_bwd and row["status"] == "ok":
        stage("timing forward+backward")
        row["fwdbwd_ms"] = median_ms(fwd_bwd, case, device)
        row["peak_fwdbwd_mib"], row["extra_fwdbwd_mib"] = peak_mib(fwd_bwd, device)
