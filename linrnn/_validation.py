"""Input checks shared by the public ops. Every failure is a ValueError or TypeError whose
message names the argument, the value received and what was expected.

Checks of types, shapes, dtypes and devices read no tensor values and always run. Checks of
*values* (gates finite, log decays ≤ 0, mLSTM's initial max state) need the values on the host;
they run when :func:`linrnn._runtime.data_checks` says so (by default on CPU tensors, never while
``torch.compile`` traces or a CUDA graph is captured; see ``linrnn.set_checks``)."""

from __future__ import annotations

import builtins
import math
import numbers
from collections.abc import Sequence

import torch
from torch import Tensor

from linrnn import _runtime

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def tensor(name: str, x, ndim: int | None = None) -> Tensor:
    """``x`` must be a floating-point tensor (of rank ``ndim`` if given)."""
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(
            f"{name} must be float16, bfloat16, float32 or float64, got dtype {x.dtype}"
        )
    if ndim is not None and x.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(x.shape)}")
    return x


def same_device(ref: Tensor, ref_name: str | None = None, **named: Tensor | None) -> None:
    """Every tensor in ``named`` must be on ``ref``'s device. ``ref_name`` names ``ref`` in the
    message (q, or r for RWKV6); gate and state checks do not know it and leave it out."""
    where = f"{ref_name} is" if ref_name else "the other inputs are"
    for name, x in named.items():
        if x is not None and x.device != ref.device:
            raise ValueError(
                f"{name} is on device {x.device} but {where} on {ref.device}; "
                "all inputs must be on one device"
            )


def qkv(q, k, v, names: Sequence[str] = ("q", "k", "v")) -> tuple[int, int, int, int, int]:
    """Check the ``[B, T, H, K]`` / ``[B, T, H, V]`` trio; returns ``B, T, H, K, V``."""
    nq, nk, nv = names
    q, k, v = tensor(nq, q, 4), tensor(nk, k, 4), tensor(nv, v, 4)
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(
            f"{nq}, {nk}, {nv} must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}"
        )
    if k.device != q.device or v.device != q.device:
        same_device(q, nq, **{nk: k, nv: v})
    shape = q.shape
    if k.shape != shape:
        raise ValueError(
            f"{nk} must have the shape of {nq} [B, T, H, K] = {tuple(shape)}, got {tuple(k.shape)}"
        )
    B, T, H, K = shape
    _, _, _, V = v_shape = v.shape
    if v_shape[0] != B or v_shape[1] != T or v_shape[2] != H:
        raise ValueError(
            f"{nv} must be [B, T, H, V] with B, T, H = {tuple(shape[:3])} as in {nq}, "
            f"got {tuple(v_shape)}"
        )
    if min(B, T, H, K, V) < 1:
        raise ValueError(
            f"{nq}, {nk}, {nv} must have every dimension ≥ 1, got B={B}, T={T}, H={H}, K={K}, "
            f"V={V} ({nq} {tuple(q.shape)}, {nv} {tuple(v.shape)})"
        )
    return B, T, H, K, V


def gate(
    name: str,
    x,
    shape: tuple[int, ...],
    ref: Tensor,
    *,
    layout: str,
    nonpositive: bool = False,
) -> Tensor:
    """A gate tensor: exact ``shape``, on ``ref``'s device, finite, and ≤ 0 for log decays (the
    value checks only where :func:`linrnn._runtime.data_checks` allows them)."""
    x = tensor(name, x)
    if tuple(x.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {layout} = {tuple(shape)}, got {tuple(x.shape)}")
    if x.device != ref.device:
        same_device(ref, **{name: x})
    if x.numel() == 0 or not _runtime.data_checks(x):
        return x
    lo, hi = (t.item() for t in torch.aminmax(x.detach()))  # one pass; NaN reaches both
    if not (math.isfinite(lo) and math.isfinite(hi)):
        finite = torch.isfinite(x)
        bad = (~finite).nonzero()[0].tolist()
        raise ValueError(
            f"{name} must be finite; {int((~finite).sum())} of {x.numel()} values are not "
            f"(first at index {bad}: {x[tuple(bad)].item()})"
        )
    if nonpositive and hi > 0:
        raise ValueError(
            f"{name} is a log decay and must be ≤ 0 (decay ≤ 1), but its maximum is {hi:.6g}"
        )
    return x


def state(name: str, x, shape: tuple[int, ...], ref: Tensor, layout: str) -> Tensor:
    x = tensor(name, x)
    if tuple(x.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {layout} = {tuple(shape)}, got {tuple(x.shape)}")
    if x.device != ref.device:
        same_device(ref, **{name: x})
    return x


def state_tuple(name: str, x, n: int, what: str) -> tuple:
    if not isinstance(x, (tuple, list)) or len(x) != n:
        got = type(x).__name__ + (f" of length {len(x)}" if isinstance(x, (tuple, list)) else "")
        raise TypeError(f"{name} must be a tuple {what}, got {got}")
    return tuple(x)


def cu_seqlens(cu, B: int, T: int, ref: Tensor) -> list[int]:
    """Offsets of a packed batch: 1-D integers, starting at 0, non-decreasing, ending at T,
    with B == 1. Returns them as a Python list (one host read)."""
    if isinstance(cu, Tensor):
        if cu.dtype.is_floating_point or cu.dtype.is_complex or cu.dtype == torch.bool:
            raise TypeError(f"cu_seqlens must hold integers (int32/int64), got dtype {cu.dtype}")
        if cu.dim() != 1:
            raise ValueError(f"cu_seqlens must be 1-D, got shape {tuple(cu.shape)}")
        if cu.device.type == "meta":
            raise ValueError(
                "cu_seqlens is on device meta and holds no values; pass the offsets on the CPU "
                f"or on {ref.device}"
            )
        offsets = cu.tolist()
    elif isinstance(cu, (list, tuple)):
        bad = [c for c in cu if isinstance(c, bool) or not isinstance(c, numbers.Integral)]
        if bad:
            raise TypeError(
                f"cu_seqlens must be a 1-D integer tensor or a list of ints, got a "
                f"{type(cu).__name__} holding {type(bad[0]).__name__} {bad[0]!r}: {list(cu)}"
            )
        offsets = [int(c) for c in cu]
    else:
        raise TypeError(
            f"cu_seqlens must be a 1-D integer tensor or a list of ints, got {type(cu).__name__}"
        )
    if B != 1:
        raise ValueError(
            f"with cu_seqlens the sequences are packed along T and the batch size must be 1, "
            f"got B={B}"
        )
    if len(offsets) < 2:
        raise ValueError(f"cu_seqlens needs at least 2 entries (0 and T), got {offsets}")
    if offsets[0] != 0 or offsets[-1] != T:
        raise ValueError(
            f"cu_seqlens must start at 0 and end at T={T}, got first={offsets[0]}, "
            f"last={offsets[-1]}"
        )
    for i in range(len(offsets) - 1):
        if offsets[i + 1] < offsets[i]:
            raise ValueError(
                f"cu_seqlens must be non-decreasing, got {offsets[i]} then {offsets[i + 1]} "
                f"at positions {i}, {i + 1}"
            )
    return offsets


def _real(name: str, value, what: str) -> None:
    """``value`` must be a real Python number (numpy scalars pass; bools and tensors do not)."""
    if type(value) is float or type(value) is int:  # the common case, without the ABC check
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be {what}, got {type_name(value)}")


def scale(value, K):
    """The query multiplier: ``K ** -0.5`` for None, else a finite real, returned as a float.

    While ``torch.compile`` traces, a Python float argument may be a symbol (``dynamic=True``,
    or the recompile after a new value): ``math.isfinite`` or ``float()`` on it would fail or
    pin the graph to the value, and so would ``torch._check`` (inductor's scalar pass
    specializes a float used outside tensor math). So, like the tensor value checks, the
    finiteness check runs in eager mode only; traced, the value passes through as it is."""
    if value is None:
        return K**-0.5
    _real("scale", value, "a float or None")
    if _runtime.tracing():
        return value
    if not math.isfinite(value):
        raise ValueError(f"scale must be finite, got {value}")
    return float(value)


def eps(value):
    """A denominator's ε: a finite real ≥ 0 (checked in eager mode only, as :func:`scale`)."""
    _real("eps", value, "a float")
    if _runtime.tracing():
        return value
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"eps must be finite and ≥ 0, got {value}")
    return float(value)


def type_name(value) -> str:
    """The name of ``value``'s type for a message: ``str``, ``Tensor``; qualified by its module
    where the bare name would read as a builtin it is not (``numpy.bool``)."""
    t = type(value)
    if t.__module__ != "builtins" and hasattr(builtins, t.__name__):
        return f"{t.__module__}.{t.__qualname__}"
    return t.__name__


def _numpy_bool(value) -> bool:
    return type(value).__module__ == "numpy" and type(value).__name__ in ("bool", "bool_")


def flag(name: str, value, *, optional: bool = False) -> bool | None:
    """A boolean switch (``output_final_state``, ``normalize``): a bool or a numpy bool (as
    numpy floats are numbers for ``scale``), returned as a Python bool; ``optional`` also takes
    None. A truthy string or a tensor is refused rather than read as True (a multi-element
    tensor would raise a RuntimeError)."""
    if isinstance(value, bool) or (optional and value is None):
        return value
    if _numpy_bool(value):
        return bool(value)
    what = "a bool or None" if optional else "a bool"
    raise TypeError(f"{name} must be {what}, got {type_name(value)}")


def choice(name: str, value, choices: Sequence) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {list(choices)}, got {value!r}")


def qkv_grouped(q, k, v) -> tuple[int, int, int, int, int, int]:
    """Check q, k ``[B, T, H, K]`` and v ``[B, T, HV, V]`` with grouped value heads (HV a
    multiple of H: value head j reads q/k head ``j // (HV / H)``); returns
    ``B, T, H, HV, K, V``."""
    q, k, v = tensor("q", q, 4), tensor("k", k, 4), tensor("v", v, 4)
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    same_device(q, "q", k=k, v=v)
    if k.shape != q.shape:
        raise ValueError(
            f"k must have the shape of q [B, T, H, K] = {tuple(q.shape)}, got {tuple(k.shape)}"
        )
    if v.shape[:2] != q.shape[:2]:
        raise ValueError(
            f"v must be [B, T, HV, V] with B, T = {tuple(q.shape[:2])} as in q, "
            f"got {tuple(v.shape)}"
        )
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    if min(B, T, H, K, HV, V) < 1:
        raise ValueError(
            f"q, k, v must have every dimension ≥ 1, got B={B}, T={T}, H={H}, K={K}, HV={HV}, "
            f"V={V} (q {tuple(q.shape)}, v {tuple(v.shape)})"
        )
    if HV % H:
        raise ValueError(
            f"v's head count HV={HV} must be a multiple of q/k's head count H={H} (grouped "
            f"value heads), got q {tuple(q.shape)}, v {tuple(v.shape)}"
        )
    return B, T, H, HV, K, V


def interval(
    name: str,
    x,
    shape: tuple[int, ...],
    ref: Tensor,
    *,
    layout: str,
    low: float,
    high: float,
) -> Tensor:
    """A per-step coefficient such as the delta rule's β: :func:`gate`'s checks (shape, device,
    finite) and every value in ``[low, high]`` (the value checks only where
    :func:`linrnn._runtime.data_checks` allows them)."""
    x = gate(name, x, shape, ref, layout=layout)
    if x.numel() == 0 or not _runtime.data_checks(x):
        return x
    lo, hi = (t.item() for t in torch.aminmax(x.detach()))
    if lo < low or hi > high:
        bad = ((x < low) | (x > high)).nonzero()[0].tolist()
        raise ValueError(
            f"{name} must lie in [{low:g}, {high:g}], got values in [{lo:.6g}, {hi:.6g}] "
            f"(first outside at index {bad}: {x[tuple(bad)].item():.6g})"
        )
    return x
