"""Subprocess isolation: run benchmark items in a worker process with a timeout per item.

The parent starts a worker (``python -m linrnn.bench --worker CASE_JSON`` by default, or any
``command`` that ends up in :func:`serve`) with a *case* (the settings shared by its items)
and a list of *items*. The worker emits one JSON event line per ``start``, ``stage`` and
``row`` on stdout, prefixed with :data:`MARK`; every other output is ignored. An exception
fails its item only. A crash (e.g. Triton's compiler aborting the process), or an item or
stage that exceeds the timeout (the worker's process group is killed), becomes that item's
status, with the stage it was in and how long it had run, and the remaining items run in a new
worker. A first call that never finished is kept as ``first_call_s_at_least``. A CUDA worker
whose context an item left unusable (a sticky error such as an illegal memory access, recorded
as that item's status) exits after its row, and the remaining items run in a new worker too.

A run may also have a time budget (``stop_at``, a :func:`time.monotonic` deadline): the worker
is killed when it passes, and the item in progress and the ones after it get no row at all
(None), so that a later run can take them up (``linrnn bench --resume``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

import linrnn

ROOT = Path(linrnn.__file__).resolve().parents[1]  # the folder holding the linrnn package
MARK = "@@linrnn_bench@@ "  # prefix of the worker's event lines on stdout
DEFAULT_COMMAND = (sys.executable, "-m", "linrnn.bench", "--worker")


def emit(event: dict) -> None:
    """One event line for the parent (the only stdout lines it reads)."""
    print(MARK + json.dumps(event), flush=True)


def short_error(exc: BaseException) -> str:
    """The first line of ``Type: message`` (the row's status)."""
    lines = f"{type(exc).__name__}: {exc}".strip().splitlines()
    return lines[0][:300] if lines else type(exc).__name__


def error_detail(exc: BaseException) -> str:
    """The whole exception text (kept in the JSON), at most 2000 characters."""
    return "".join(traceback.format_exception_only(type(exc), exc)).strip()[-2000:]


# --- worker side ----------------------------------------------------------------------------


def selftest_case(case: dict, item: dict) -> dict:
    """Failure modes on demand, for the tests of the subprocess handling (item ``do``: ok,
    raise, abort, sleep)."""
    emit({"event": "stage", "stage": "first forward"})
    if item["do"] == "raise":
        raise RuntimeError("raised on purpose")
    if item["do"] == "abort":
        os.kill(os.getpid(), signal.SIGABRT)  # as Triton's compiler does
    if item["do"] == "sleep":
        time.sleep(3600)
    return {"status": "ok"}


def serve(case_json: str, tasks: dict) -> int:
    """Worker entry: run every item of one case with ``tasks[case["task"]](case, item)``,
    emitting ``start``, ``stage`` and ``row`` events."""
    case = json.loads(case_json)
    if case.get("threads"):
        import torch

        torch.set_num_threads(case["threads"])
    if case.get("fresh_triton_cache"):  # compile from scratch: first calls include it
        base = os.environ.get("TRITON_CACHE_DIR") or tempfile.gettempdir()
        os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="triton_cache_", dir=base)
    task = tasks[case["task"]]
    for index, item in enumerate(case["items"]):
        emit({"event": "start", "item": item})
        try:
            row = task(case, item)
        except Exception as exc:  # the item's status; the worker goes on to the next one
            traceback.print_exc()
            row = {"status": f"error: {short_error(exc)}", "error_detail": error_detail(exc)}
        row["first_in_process"] = index == 0
        emit({"event": "row", "item": item, "row": row})
        if case.get("device") == "cuda" and not cuda_usable():
            # e.g. an illegal memory access: every later CUDA call in this process would fail
            # too, so the process ends here and the parent runs the remaining items in a new one
            print("the CUDA context is unusable after this item: exiting", file=sys.stderr)
            return BROKEN_CONTEXT
    return 0


BROKEN_CONTEXT = 75  # a worker's exit status after an item left its CUDA context unusable


def cuda_usable() -> bool:
    """Synchronize and free the cache; False when CUDA raises (a sticky error such as an
    illegal memory access poisons the process's context for good)."""
    import torch

    try:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    except Exception:  # torch raises RuntimeError or torch.AcceleratorError
        traceback.print_exc()
        return False
    return True


# --- parent side ----------------------------------------------------------------------------


@dataclasses.dataclass
class Launch:
    """What one worker process reported before it ended."""

    rows: list  # (item, row) pairs
    current: dict | None = None  # the item in progress when the process ended
    stage: str | None = None
    stage_elapsed_s: float | None = None
    item_elapsed_s: float | None = None
    failure: str | None = None  # status for ``current`` (None: clean exit)
    stderr_tail: str = ""
    cut: bool = False  # killed at the run's time budget (``stop_at``), not for the item


def _read_lines(stream, sink: queue.Queue) -> None:
    for line in stream:
        sink.put(line)
    sink.put(None)


def exit_status(rc: int, stderr_tail: str) -> str:
    """The status of a worker that exited with ``rc`` (a negative rc is a signal)."""
    if rc < 0:
        try:
            name = signal.Signals(-rc).name
        except ValueError:
            name = "?"
        return f"aborted: signal {-rc} ({name})"
    last = next((ln for ln in reversed(stderr_tail.splitlines()) if ln.strip()), "")
    return f"error: exit {rc}: {last.strip()[:200]}"


def launch(
    case: dict,
    timeout: float,
    env: dict,
    verbose: bool,
    command=DEFAULT_COMMAND,
    stop_at: float | None = None,
) -> Launch:
    """Run the worker on ``case`` until it exits, crashes or spends ``timeout`` seconds on one
    item (or on starting up); the process group is killed on timeout, and at ``stop_at`` (a
    :func:`time.monotonic` time; ``cut`` is set then)."""
    budget_end = math.inf if stop_at is None else stop_at
    cmd = [*command, json.dumps(case)]
    result = Launch(rows=[])
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            env=env,
            cwd=ROOT,
            start_new_session=True,
        )
        lines: queue.Queue = queue.Queue()
        reader = threading.Thread(target=_read_lines, args=(proc.stdout, lines), daemon=True)
        reader.start()
        now = time.monotonic()
        deadline, item_t0, stage_t0 = now + timeout, now, now
        timed_out = False
        while True:
            try:
                line = lines.get(timeout=max(0.0, min(deadline, budget_end) - time.monotonic()))
            except queue.Empty:
                timed_out = True
                result.cut = deadline > budget_end
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)  # the worker's own process group
                break
            if line is None:
                break
            if not line.startswith(MARK):
                if verbose:
                    print(f"    | {line.rstrip()}", file=sys.stderr)
                continue
            event = json.loads(line[len(MARK) :])
            now = time.monotonic()
            if event["event"] == "start":
                result.current, result.stage = event["item"], "startup"
                deadline, item_t0, stage_t0 = now + timeout, now, now
            elif event["event"] == "stage":
                result.stage, stage_t0 = event["stage"], now
            elif event["event"] == "row":
                result.rows.append((event["item"], event["row"]))
                result.current = result.stage = None
                deadline = now + timeout
        rc = proc.wait()
        reader.join(timeout=5)
        end = time.monotonic()
        err.seek(0)
        result.stderr_tail = err.read()[-4000:]
    if verbose and result.stderr_tail.strip():
        print(result.stderr_tail, file=sys.stderr)
    if result.cut:
        result.failure = "cut at the run's time budget"
    elif timed_out:
        result.failure = f"timeout ({timeout:g} s)"
    elif rc != 0:
        result.failure = exit_status(rc, result.stderr_tail)
    if result.failure:
        result.stage_elapsed_s = end - stage_t0
        result.item_elapsed_s = end - item_t0
    return result


def item_key(item: dict) -> str:
    return json.dumps(item, sort_keys=True)


def failure_row(launch_result: Launch) -> dict:
    """The row of the item a worker died on: where, after how long, and its last words."""
    where = f" in {launch_result.stage}" if launch_result.stage else " at startup"
    status = f"{launch_result.failure}{where} after {launch_result.stage_elapsed_s:.1f} s"
    row = {"status": status, "died_after_s": launch_result.item_elapsed_s}
    row["stderr_tail"] = launch_result.stderr_tail[-1500:]  # e.g. the compiler's last words
    if launch_result.stage in ("first forward", "first backward"):
        row["first_call_s_at_least"] = launch_result.item_elapsed_s  # compile never finished
    return row


def run_items(
    case: dict,
    items: list,
    timeout: float,
    env: dict,
    verbose: bool,
    command=DEFAULT_COMMAND,
    stop_at: float | None = None,
) -> list:
    """Rows for every item of ``case``; after a crash, the item in progress gets the crash as
    its status and the remaining items run in a new process. With ``stop_at`` (a
    :func:`time.monotonic` time), the items not finished by then are None."""
    rows: dict = {}
    pending = list(items)
    while pending:
        if stop_at is not None and time.monotonic() >= stop_at:
            return [rows.get(item_key(item)) for item in items]
        res = launch(dict(case, items=pending), timeout, env, verbose, command, stop_at)
        rows.update((item_key(item), row) for item, row in res.rows)
        if res.cut:
            return [rows.get(item_key(item)) for item in items]
        if res.failure is None:
            break
        if res.current is None and not res.rows:  # died before any item: so would the rest
            for item in pending:
                rows.setdefault(item_key(item), failure_row(res))
            break
        if res.current is not None:
            rows[item_key(res.current)] = failure_row(res)
        # else it ended between items after finishing some (e.g. a broken CUDA context)
        pending = [it for it in pending if item_key(it) not in rows]
    missing = {"status": "error: the worker returned no result"}
    return [rows.get(item_key(item), missing) for item in items]


def run_in_process(case: dict, items: list, tasks: dict, stop_at: float | None = None) -> list:
    """The same rows without a subprocess (CPU runs: no crash to contain, no import cost);
    an exception fails its item only. Items not started by ``stop_at`` are None (an item in
    progress is not cut)."""
    task = tasks[case["task"]]
    rows = []
    for index, item in enumerate(items):
        if stop_at is not None and time.monotonic() >= stop_at:
            rows.append(None)
            continue
        try:
            row = task(case, item)
        except Exception as exc:
            row = {"status": f"error: {short_error(exc)}", "error_detail": error_detail(exc)}
        row["first_in_process"] = index == 0
        rows.append(row)
    return rows


def worker_env(cache_dir: str | None = None) -> dict:
    """The environment of a worker: linrnn's folder first on PYTHONPATH, and a Triton cache."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    if cache_dir:
        env["TRITON_CACHE_DIR"] = cache_dir
    return env
