"""Where a call runs — eager, traced by ``torch.compile``, or captured into a CUDA graph — and
what it may therefore do on the host.

Two kinds of host work read tensor *values* and so stall on a device→host copy (a "sync"):

* **data checks** of the inputs (log decays finite and ≤ 0, gates finite, mLSTM's initial max
  state): :func:`data_checks` decides, from :func:`set_checks`;
* **path choices** of the PyTorch chunk engine (whether a chunk's decay is mild enough for the
  factorized matmul path): :func:`host_reads_ok`.

Neither may happen while ``torch.compile`` traces (a value read is a graph break, an error under
``fullgraph=True``) or while a CUDA graph is captured (a sync there is illegal). Shape, dtype
and device checks read no values; they always run.

The other way round, a blocking host→device copy also stalls: PyTorch waits for the stream
to drain after it, so every kernel queued before it must finish first. Small tables built on
the host (packed sequences' offsets and chunk rows) go through :func:`to_device` instead.
"""

from __future__ import annotations

import contextlib

import torch

_CHECKS: bool | None = None  # None: "auto" (see set_checks)


def set_checks(enabled: bool | None) -> bool | None:
    """Turn the input *data* checks on (True), off (False) or back to the default (None).

    Default ("auto"): on for CPU tensors, where reading a gate's min and max costs one pass
    and no sync; off for tensors on an accelerator, where each check would stall the host on
    the device (about one sync per gate tensor per call). ``True`` checks everywhere in eager
    mode — the way to debug NaNs on a GPU. Whatever the setting, nothing is checked while
    ``torch.compile`` traces or a CUDA graph is captured. Shape, dtype and device checks are
    never affected. Returns the previous setting.

    The trade-off: with checks off, a positive log decay or a NaN gate is not reported; the
    result is then wrong or NaN instead of a ``ValueError``.
    """
    global _CHECKS
    if enabled is not None and not isinstance(enabled, bool):
        raise TypeError(f"set_checks takes True, False or None, got {type(enabled).__name__}")
    previous, _CHECKS = _CHECKS, enabled
    return previous


def get_checks() -> bool | None:
    """The current :func:`set_checks` setting (None: auto)."""
    return _CHECKS


@contextlib.contextmanager
def checks(enabled: bool | None):
    """``with linrnn.checks(False): ...``: :func:`set_checks` for a block (not thread-local)."""
    previous = set_checks(enabled)
    try:
        yield
    finally:
        set_checks(previous)


def tracing() -> bool:
    """True while ``torch.compile`` (dynamo, AOT autograd, export) traces the code."""
    return torch.compiler.is_compiling()


def capturing() -> bool:
    """True while the current CUDA stream is being captured into a CUDA graph."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def host_reads_ok() -> bool:
    """Whether code may read tensor values on the host now (eager and not capturing)."""
    if tracing():
        return False
    return not capturing()


def data_checks(x: torch.Tensor) -> bool:
    """Whether to run the value checks on ``x`` (see :func:`set_checks`)."""
    if _CHECKS is False or (_CHECKS is None and x.device.type != "cpu"):
        return False  # (asked first: whether a stream captures is a CUDA call per gate)
    return host_reads_ok()


def to_device(values, device, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    """``values`` (a list of numbers or a CPU tensor) as a ``dtype`` tensor on ``device``
    without stalling the host: on CUDA through pinned memory and an asynchronous copy on the
    current stream (PyTorch's pinned-memory cache keeps the buffer until the copy has run), so
    the host keeps queueing work while earlier kernels run. While a CUDA graph is captured the
    copy stays a plain one: a graph would replay the copy from a buffer reused since."""
    x = values.to(dtype) if isinstance(values, torch.Tensor) else torch.tensor(values, dtype=dtype)
    device = torch.device(device)
    if device.type != "cuda" or capturing():
        return x.to(device)
    return x.pin_memory().to(device, non_blocking=True)
