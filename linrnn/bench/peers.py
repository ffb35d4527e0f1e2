"""Peer ops timed beside linrnn: fla (fla-core), mlstm_kernels, mamba_ssm and torch SDPA.

Each peer names the linrnn op whose inputs, shapes and FLOP/byte counts it shares (``like``).
A peer runs only when its library imports (:func:`available`); fla, mlstm_kernels and
mamba_ssm need CUDA. Builders return ``(leaves, fwd)`` like
:func:`linrnn.bench.registry.build_linrnn`.

mamba_ssm's package ``__init__`` imports its CUDA extension (selective scan), which a wheel
built without it lacks; its Triton SSD kernels do not need it. :func:`mamba_ssm_ssd` imports
``mamba_ssm.ops.triton.ssd_combined`` under a bare ``mamba_ssm`` package (its ``__init__`` not
run) from the folder ``$LINRNN_MAMBA_SSM_SRC`` (an unpacked sdist: the folder holding
``mamba_ssm/``), or from an installed mamba_ssm whose own import fails. It needs einops and
packaging.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import importlib.util
import os
import sys
import types
from pathlib import Path

from linrnn.bench import registry

_FLA_STEP = "T=1 per call, initial_state [B,H,K,V] fp32, output_final_state=True"


@dataclasses.dataclass(frozen=True)
class Peer:
    """A peer op: its library, the linrnn op it matches, its chunk size, and a note.
    ``grouped`` says how it takes grouped value heads (shapes with HV > H): "native", "repeat"
    (q and k repeated to HV heads before the timed calls: the peer has no grouped form, and
    the copy is not timed) or "no" (such shapes are skipped). ``backward`` False: the peer
    has no backward (its rows time the forward only)."""

    library: str
    like: str  # linrnn op whose inputs and counts it shares
    chunk: int | None
    note: str = ""
    cuda_only: bool = True
    kind: str = "ops"  # the suites it joins: "ops" (op × mode sweeps), "decode" or "varlen"
    grouped: str = "no"
    backward: bool = True


_QK_L2 = "use_qk_l2norm_in_kernel=True"
_REPEAT = "no grouped value heads: q, k repeated to HV heads before the call (not timed)"


PEERS = {
    "mlstm_kernels:triton_xl_chunk_siging": Peer(
        "mlstm_kernels", "mlstm[sigmoid]", 128, "normalize=False; [B,H,T,D]"
    ),
    "mlstm_kernels:triton_xl_chunk_siging[normalize]": Peer(
        "mlstm_kernels", "mlstm[sigmoid,normalize]", 128, "normalize=True (default); [B,H,T,D]"
    ),
    "mlstm_kernels:triton_xl_chunk": Peer("mlstm_kernels", "mlstm[exp]", 128, "[B,H,T,D]"),
    "mlstm_kernels:triton_limit_chunk": Peer("mlstm_kernels", "mlstm[exp]", 64, "[B,H,T,D]"),
    "fla:chunk_simple_gla": Peer("fla", "simple_gla", 64),
    "fla:chunk_retention": Peer("fla", "retention", 64),
    "fla:chunk_linear_attn": Peer("fla", "linear_attn", 64, "normalize=False"),
    "fla:chunk_linear_attn[normalize]": Peer("fla", "linear_attn[normalize]", 64),
    "fla:chunk_gla": Peer("fla", "gla", 64, "g = log decay [B,T,H,K]"),
    "fla:chunk_rwkv6": Peer("fla", "rwkv6", 64, "w = log decay; scale=1.0"),
    # fla's recurrent kernels over whole sequences (the chunk engine against a plain recurrence)
    "fla:fused_recurrent_gla[seq]": Peer("fla", "gla", None, "whole sequence; gk"),
    "fla:fused_recurrent_rwkv6[seq]": Peer("fla", "rwkv6", None, "whole sequence; scale=1.0"),
    # the delta rule (fla-core 0.6.0: [B, T, H, ·] inputs, no head_first; beta in the input
    # dtype, g fp32; chunk size 64)
    "fla:chunk_delta_rule": Peer("fla", "delta_rule", 64, f"{_QK_L2}; {_REPEAT}", grouped="repeat"),
    "fla:chunk_gated_delta_rule": Peer(
        "fla", "gated_delta_rule", 64, f"{_QK_L2}; grouped value heads native", grouped="native"
    ),
    "fla:fused_recurrent_gated_delta_rule[seq]": Peer(
        "fla",
        "gated_delta_rule",
        None,
        f"whole sequence; {_QK_L2}; forward only (fla has no backward for it)",
        grouped="native",
        backward=False,
    ),
    # Mamba2 (docs/DESIGN.md §11): mamba_ssm's Triton SSD kernels on the same tensors, and
    # fla's simple GLA on inputs mapped to it
    "mamba_ssm:mamba_chunk_scan_combined": Peer(
        "mamba_ssm",
        "mamba2",
        256,
        "mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size=256, D=D, dt_bias=dt_bias, "
        "dt_softplus=True) as mamba_ssm's Mamba2 module calls it (its chunk size); groups "
        "native; mamba_ssm.ops.triton.ssd_combined imported without mamba_ssm/__init__.py (its "
        "CUDA extension) from $LINRNN_MAMBA_SSM_SRC",
        grouped="native",
    ),
    "fla:chunk_simple_gla[mamba2]": Peer(
        "fla",
        "mamba2",
        64,
        "q = C and k = B repeated to the H heads, v = x·Δ, g = Δ·A with Δ = softplus(dt + "
        "dt_bias), scale=1.0: the mapping made before the call (not timed; its gradients "
        "end at the mapped tensors); no D·x term",
        grouped="repeat",
    ),
    "torch:sdpa_causal": Peer(
        "torch", "linear_attn", None, "softmax baseline; [B,H,T,D]", cuda_only=False
    ),
    # decode suite (linrnn.bench.decode): one token per call from an fp32 state
    "fla:fused_recurrent_linear_attn": Peer(
        "fla", "linear_attn", None, _FLA_STEP + "; normalize=False", kind="decode"
    ),
    "fla:fused_recurrent_retention": Peer("fla", "retention", None, _FLA_STEP, kind="decode"),
    "fla:fused_recurrent_simple_gla": Peer("fla", "simple_gla", None, _FLA_STEP, kind="decode"),
    "fla:fused_recurrent_gla": Peer("fla", "gla", None, _FLA_STEP + "; gk", kind="decode"),
    "fla:fused_recurrent_rwkv6": Peer("fla", "rwkv6", None, _FLA_STEP + "; u [H,K]", kind="decode"),
    "fla:fused_recurrent_delta_rule": Peer(
        "fla",
        "delta_rule",
        None,
        f"{_FLA_STEP}; {_QK_L2}; {_REPEAT}",
        kind="decode",
        grouped="repeat",
    ),
    "fla:fused_recurrent_gated_delta_rule": Peer(
        "fla",
        "gated_delta_rule",
        None,
        f"{_FLA_STEP}; {_QK_L2}; grouped value heads native",
        kind="decode",
        grouped="native",
    ),
    "mlstm_kernels:triton_step": Peer(
        "mlstm_kernels",
        "mlstm[exp]",
        None,
        "get_mlstm_step_kernel('triton') = mlstm_recurrent_step__triton; [B,NH,D], i/f/m "
        "[B,NH,1]; new state into a second buffer set (ping-pong); its source says 'This kernel "
        "fails in the tests'",
        kind="decode",
    ),
    "mlstm_kernels:native_step": Peer(
        "mlstm_kernels",
        "mlstm[exp]",
        None,
        "get_mlstm_step_kernel('native') = mlstm_recurrent_step__native (PyTorch eager)",
        kind="decode",
    ),
    # varlen suite (linrnn.bench.varlen): packed documents
    "fla:chunk_simple_gla[varlen]": Peer(
        "fla", "simple_gla", 64, "cu_seqlens (int64 on the GPU) + cu_seqlens_cpu", kind="varlen"
    ),
}
DISTRIBUTIONS = {"fla": "fla-core", "mlstm_kernels": "mlstm-kernels", "mamba_ssm": "mamba-ssm",
                 "torch": "torch"}  # fmt: skip
MAMBA_SSM_SRC = "LINRNN_MAMBA_SSM_SRC"  # env: a folder holding mamba_ssm/ (an unpacked sdist)
MAMBA_SSM_SSD = "mamba_ssm.ops.triton.ssd_combined"


def library_of(op: str) -> str:
    """ "linrnn" for a registry op, else the peer's library."""
    return "linrnn" if op in registry.OPS else PEERS[op].library


def like_of(op: str) -> str:
    """The linrnn op whose inputs and counts ``op`` uses (itself for a linrnn op)."""
    return op if op in registry.OPS else PEERS[op].like


def available(library: str) -> bool:
    """Whether the peer library can be imported here (without importing it); mamba_ssm also
    from ``$LINRNN_MAMBA_SSM_SRC``."""
    if library == "mamba_ssm" and mamba_ssm_source() is not None:
        return True
    return importlib.util.find_spec(library) is not None


def mamba_ssm_source() -> Path | None:
    """The ``mamba_ssm`` package folder in ``$LINRNN_MAMBA_SSM_SRC`` (None when the variable
    is unset or the folder has no ``mamba_ssm/__init__.py``)."""
    root = os.environ.get(MAMBA_SSM_SRC)
    if not root:
        return None
    package = Path(root).resolve() / "mamba_ssm"
    return package if (package / "__init__.py").is_file() else None


def mamba_ssm_version() -> str | None:
    """mamba_ssm's version: ``__version__`` of the source in ``$LINRNN_MAMBA_SSM_SRC`` (read,
    not imported; the source :func:`mamba_ssm_ssd` takes first), else the installed
    distribution's."""
    package = mamba_ssm_source()
    if package is not None:
        for line in (package / "__init__.py").read_text().splitlines():
            if line.startswith("__version__"):
                return line.split("=", 1)[1].strip().strip("\"'")
    try:
        return importlib.metadata.version(DISTRIBUTIONS["mamba_ssm"])
    except importlib.metadata.PackageNotFoundError:
        return None


def mamba_ssm_ssd():
    """``mamba_ssm.ops.triton.ssd_combined`` (the Triton SSD kernels): from the folder in
    ``$LINRNN_MAMBA_SSM_SRC`` under a bare ``mamba_ssm`` package whose ``__init__`` (it imports
    the CUDA extension) is not run; without the variable the installed mamba_ssm, the same way
    when its own import fails (``ImportError``: e.g. no CUDA extension)."""
    if MAMBA_SSM_SSD in sys.modules:
        return sys.modules[MAMBA_SSM_SSD]
    package = mamba_ssm_source()
    if package is None:
        try:
            return importlib.import_module(MAMBA_SSM_SSD)
        except ImportError:
            spec = importlib.util.find_spec("mamba_ssm")
            if spec is None or not spec.submodule_search_locations:
                raise
            package = Path(next(iter(spec.submodule_search_locations)))
    for name in [n for n in sys.modules if n == "mamba_ssm" or n.startswith("mamba_ssm.")]:
        del sys.modules[name]  # what a failed import of the package left
    bare = types.ModuleType("mamba_ssm", "mamba_ssm without its __init__ (no CUDA extension)")
    bare.__path__ = [str(package)]
    sys.modules["mamba_ssm"] = bare
    return importlib.import_module(MAMBA_SSM_SSD)


def head_first(x):
    """[B, T, H, ...] -> [B, H, T, ...], contiguous, as a new leaf (done before timing)."""
    return x.detach().transpose(1, 2).contiguous().requires_grad_(x.requires_grad)


def takes_shape(peer: Peer, shape: dict) -> bool:
    """Whether ``peer`` runs at ``shape`` (grouped value heads need a grouped form)."""
    return not registry.grouped(shape) or peer.grouped != "no"


def repeat_heads(x, groups: int):
    """[B, T, H, K] -> [B, T, H·groups, K] (head j of the result is head j // groups), as a new
    leaf (done before timing): q and k for a peer without grouped value heads."""
    if groups == 1:
        return x
    rep = x.detach().repeat_interleave(groups, dim=2)
    return rep.requires_grad_(x.requires_grad)


def _inputs(case: dict, shape: dict):
    like = PEERS[case["op"]].like
    dtype = case.get("dtype", "bf16")
    return registry.bench_inputs(like, shape, dtype, case["seed"], case["device"])


def build_mlstm_kernels(case: dict, shape: dict):
    (q, k, v, i, f), _, _ = _inputs(case, shape)
    kernel = case["op"].split(":")[1].split("[")[0]
    if kernel == "triton_xl_chunk_siging":
        from mlstm_kernels.torch.chunkwise.triton_xl_chunk_siging import (
            mlstm_siging_chunkwise__xl_chunk as fn,
        )

        extra = {"normalize": case["op"].endswith("[normalize]")}
    elif kernel == "triton_xl_chunk":
        from mlstm_kernels.torch.chunkwise.triton_xl_chunk import mlstm_chunkwise__xl_chunk as fn

        extra = {}
    else:
        from mlstm_kernels.torch.chunkwise.triton_limit_chunk import (
            mlstm_chunkwise__limit_chunk as fn,
        )

        extra = {}
    leaves = [head_first(x) for x in (q, k, v, i, f)]
    chunk = PEERS[case["op"]].chunk
    return leaves, lambda: fn(*leaves, chunk_size=chunk, return_last_states=False, **extra)


def build_fla(case: dict, shape: dict):
    args, _, needs_grad = _inputs(case, shape)
    leaves = [x for x, n in zip(args, needs_grad) if n]
    op = case["op"].split(":")[1]
    if op == "chunk_simple_gla[mamba2]":
        from fla.ops.simple_gla import chunk_simple_gla

        q, k, v, g = mamba2_as_simple_gla(args, shape)
        return [q, k, v, g], lambda: chunk_simple_gla(q, k, v, g=g, scale=1.0)[0]
    if "delta_rule" in op:
        return build_fla_delta(op, args, shape)
    if op == "chunk_simple_gla":
        from fla.ops.simple_gla import chunk_simple_gla

        q, k, v, g = args
        return leaves, lambda: chunk_simple_gla(q, k, v, g=g)[0]
    if op == "chunk_retention":
        from fla.ops.retention import chunk_retention

        q, k, v, _ = args  # fla makes the same per-head decays itself
        return leaves, lambda: chunk_retention(q, k, v)[0]
    if op == "chunk_gla":
        from fla.ops.gla import chunk_gla

        q, k, v, g = args
        return leaves, lambda: chunk_gla(q, k, v, g)[0]
    if op == "chunk_rwkv6":
        from fla.ops.rwkv6 import chunk_rwkv6

        r, k, v, w, u = args
        return leaves, lambda: chunk_rwkv6(r, k, v, w, u, scale=1.0)[0]
    if op == "fused_recurrent_gla[seq]":
        from fla.ops.gla import fused_recurrent_gla

        q, k, v, g = args
        return leaves, lambda: fused_recurrent_gla(q, k, v, gk=g)[0]
    if op == "fused_recurrent_rwkv6[seq]":
        from fla.ops.rwkv6 import fused_recurrent_rwkv6

        r, k, v, w, u = args
        return leaves, lambda: fused_recurrent_rwkv6(r, k, v, w, u, scale=1.0)[0]
    from fla.ops.linear_attn import chunk_linear_attn

    q, k, v = args
    normalize = op.endswith("[normalize]")
    return leaves, lambda: chunk_linear_attn(q, k, v, normalize=normalize)[0]


def build_fla_delta(op: str, args: tuple, shape: dict):
    """fla's delta-rule ops on the linrnn op's inputs (``[B, T, H, ·]``; q, k normalized in
    the kernel). ``chunk_delta_rule`` has no grouped value heads: q and k repeated to HV."""
    if op == "chunk_delta_rule":
        from fla.ops.delta_rule import chunk_delta_rule

        q, k, v, beta = args
        q, k = (repeat_heads(x, shape["HV"] // shape["H"]) for x in (q, k))
        fn = lambda: chunk_delta_rule(q, k, v, beta, use_qk_l2norm_in_kernel=True)  # noqa: E731
        return [q, k, v, beta], lambda: fn()[0]
    q, k, v, g, beta = args
    if op == "chunk_gated_delta_rule":
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fn
    elif op == "fused_recurrent_gated_delta_rule[seq]":
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule as fn
    else:
        raise ValueError(f"unknown fla delta-rule peer {op!r}")
    call = lambda: fn(q, k, v, g=g, beta=beta, use_qk_l2norm_in_kernel=True)  # noqa: E731
    return [q, k, v, g, beta], lambda: call()[0]


def mamba2_as_simple_gla(args: tuple, shape: dict) -> tuple:
    """Simple-GLA inputs that compute Mamba2 without its D·x term (docs/DESIGN.md §11), as
    new leaves (made before timing): ``q = C``, ``k = B`` repeated to the value heads, ``v =
    x·Δ`` in x's dtype and the log decay ``g = Δ·A`` (fp32) with ``Δ = softplus(dt +
    dt_bias)``; with scale 1, ``o_t = Σ_{s≤t} e^{g_{s+1}+…+g_t} (q_t·k_s) v_s`` is Mamba2's
    ``C_tᵀ h_t``. ``args`` are :func:`linrnn.bench.registry.bench_inputs`' Mamba2 inputs (C, B,
    x, dt, A, D, dt_bias)."""
    import torch
    import torch.nn.functional as F

    C, B, x, dt, A, _, dt_bias = args
    groups = shape["HV"] // shape["H"]
    with torch.no_grad():
        delta = F.softplus(dt.float() + dt_bias.float())
        v = (x.float() * delta[..., None]).to(x.dtype)
        g = delta * A.float()
    q, k = (repeat_heads(t, groups) for t in (C, B))
    return q, k, v.requires_grad_(), g.requires_grad_()


def build_mamba_ssm(case: dict, shape: dict):
    """mamba_ssm's ``mamba_chunk_scan_combined`` on the linrnn op's tensors (the Mamba2
    module's call: dt_softplus with dt_bias, D per head; groups native)."""
    (C, B, x, dt, A, D, dt_bias), _, _ = _inputs(case, shape)
    fn = mamba_ssm_ssd().mamba_chunk_scan_combined
    chunk = PEERS[case["op"]].chunk
    call = lambda: fn(x, dt, A, B, C, chunk, D=D, dt_bias=dt_bias, dt_softplus=True)  # noqa: E731
    return [x, dt, A, B, C, D, dt_bias], call


def build_sdpa(case: dict, shape: dict):
    import torch.nn.functional as F

    (q, k, v), _, _ = _inputs(case, shape)
    q, k, v = map(head_first, (q, k, v))
    return [q, k, v], lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)


BUILDERS = {
    "linrnn": registry.build_linrnn,
    "mlstm_kernels": build_mlstm_kernels,
    "fla": build_fla,
    "mamba_ssm": build_mamba_ssm,
    "torch": build_sdpa,
}
