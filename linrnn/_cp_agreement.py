"""What the ranks of :func:`linrnn.distributed.context_parallel` must agree on, beyond the
hashed options: a bitwise fingerprint of each rank's initial state for the meta exchange, and,
on the error path only, the differing values themselves (options, ``cu_seqlens``, initial
states) fetched from every rank."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor


def state_parts(state) -> list[Tensor]:
    """The tensors of an initial state (a tensor, a tuple of them, or None)."""
    if state is None:
        return []
    return [x for x in (state if isinstance(state, (tuple, list)) else [state]) if x is not None]


_INT_OF = {8: torch.int64, 4: torch.int32, 2: torch.int16}


def fingerprint(tensors: list[Tensor]) -> int:
    """A hash of the tensors' exact bits, position-weighted (wrapping int64 arithmetic, so it
    is the same on every device and summation order), for the meta exchange: the ranks must
    pass bitwise the same initial state. Reads one number back (a sync on a GPU) per call
    with an initial state."""
    if not tensors:
        return 0
    total = None
    for j, x in enumerate(tensors):
        bits = x.detach().contiguous().view(-1).view(_INT_OF[x.element_size()]).to(torch.int64)
        weight = torch.arange(bits.numel(), device=bits.device, dtype=torch.int64)
        weight = weight * 0x9E3779B97F4A7C1 + (2 * j + 1)
        part = (bits * weight).sum()
        total = part if total is None else total * 1000003 + part
    return int(total) % (2**62)


def _gather(obj, group) -> list:
    out = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, obj, group=group)
    return out


def _options_detail(call, group) -> str:
    """Which options differ, with every rank's value (all ranks call this together)."""
    per_rank = [dict(o) for o in _gather(call.opts, group)]
    keys = sorted({k for o in per_rank for k in o})
    differ = [k for k in keys if len({o.get(k) for o in per_rank}) > 1]
    return "; ".join(
        f"{k}: " + ", ".join(f"rank {r}: {o.get(k, '(not given)')}" for r, o in enumerate(per_rank))
        for k in differ
    )


def _cu_detail(call, group) -> str:
    per_rank = _gather(call.offsets, group)
    return ", ".join(f"rank {r}: {c}" for r, c in enumerate(per_rank))


def _state_detail(call, group) -> str:
    """The first value where a rank's initial state differs from rank 0's."""
    per_rank = _gather([x.detach().cpu() for x in call.given_state], group)
    ref = per_rank[0]
    for r, parts in enumerate(per_rank[1:], start=1):
        for j, (a, b) in enumerate(zip(ref, parts)):
            diff = a.view(-1).view(_INT_OF[a.element_size()]) != b.view(-1).view(
                _INT_OF[b.element_size()]
            )
            if bool(diff.any()):
                flat = int(diff.nonzero()[0])
                idx = list(torch.unravel_index(torch.tensor(flat), a.shape))
                idx = tuple(int(i) for i in idx)
                return (
                    f"part {j} of initial_state differs at index {list(idx)}: rank 0: "
                    f"{a[idx].item()!r}, rank {r}: {b[idx].item()!r} ({int(diff.sum())} of "
                    f"{a.numel()} values differ); every rank must pass the same initial state"
                )
    return "the initial states differ"


DETAILS = {
    "options": _options_detail,
    "cu_seqlens": _cu_detail,
    "initial_state values": _state_detail,
}
