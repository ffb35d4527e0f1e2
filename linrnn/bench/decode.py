"""The ``decode`` suite: tokens per second of one-token steps from an fp32 state.

Setting (per op and shape ``B…-T1-H…-K…-V…``, or ``B…-T1-H…-HV…-K…-V…`` with grouped value
heads for the delta rule): a batch of B sequences advances one token per call. The state is
the fp32 final state of a 4-token prefill (the op's own format, so
``linrnn.step(..., inplace=True)`` may overwrite it); ``steps`` tokens of inputs (q, k, v in
the benchmark dtype, gates fp32 except the delta rule's β, ``[B, 1, H, ·]`` each, made before
timing) are fed one per call. One timed call is the whole loop of ``steps`` calls
(``do_bench`` median on CUDA, ``perf_counter`` median on CPU); ``step_ms`` is that time /
``steps`` and

    tokens/s = B / step time;   state bytes per step = 2·B·HV·K·V·4 (fp32 state read + written)

The floor is the fewest bytes a step must move (:func:`linrnn.bench.flops.min_bytes` with
T = 1 and the state read and written: the state plus q, k, v, o and the gates) at the GPU's
spec-sheet bandwidth (the FLOPs, ``5·B·H·K·V``, ``7·B·HV·K·V`` for the delta rule, are far
below the compute roof): at the suite's shapes this is within 2 % of the fp32
state read and written once.

linrnn runs ``linrnn.step(op, ...)``: on CUDA the Triton recurrent kernel
(``backend="triton"``), on CPU the PyTorch recurrence. Peers (CUDA, when installed): fla's
``fused_recurrent_*`` with T = 1, ``initial_state`` and ``output_final_state=True`` (a new
state tensor per call; the delta rule's with ``use_qk_l2norm_in_kernel=True``, and
``fused_recurrent_delta_rule``, which has no grouped value heads, on q and k repeated to HV
heads beforehand), and
mlstm_kernels' step kernels (``[B, NH, D]`` layout; the Triton one writes into a second set of
state buffers, alternating). Before timing, the first step's output is compared with the
PyTorch recurrence in fp32 from the same state (``err_vs_torch_fp32``, RMS-relative).

On CUDA the loop is also captured once in a CUDA graph and the replay timed (``graph_step_ms``,
:func:`graph_timing`): eager one-token steps are bound by the host's launch overhead, which a
decoder removes with ``linrnn.graphs.capture_decode``; every library is captured the same way.
"""

from __future__ import annotations

import time
import traceback

import torch

from linrnn.bench import flops, peers, registry, report
from linrnn.bench.worker import emit, error_detail, short_error

PREFILL_T = 4


# --- inputs ---------------------------------------------------------------------------------


def step_inputs(like: str, shape: dict, steps: int, dtype: str, seed: int, device):
    """``(per_step, fixed, state)``: ``steps`` lists of per-token tensors ``[B, 1, H, ·]``
    (positional args after nothing: q, k, v and the per-token gates, plus keyword tensors),
    the fixed tensors (retention's per-head decay, RWKV6's u) and the fp32 initial state."""
    from linrnn.selfcheck import run

    device = torch.device(device)
    args, kwargs = registry.make_inputs(like, dict(shape, T=steps), seed, device)
    args = registry.cast_inputs(like, args, dtype)
    per_token = lambda x: x.dim() >= 3  # noqa: E731  (q, k, v and gates are [B, T, H, …])
    per_step = []
    for t in range(steps):
        a = tuple(x[:, t : t + 1].contiguous() if per_token(x) else x for x in args)
        kw = {n: x[:, t : t + 1].contiguous() if per_token(x) else x for n, x in kwargs.items()}
        per_step.append((a, kw))
    p_args, p_kwargs = registry.make_inputs(like, dict(shape, T=PREFILL_T), seed + 1000, device)
    p_args = registry.cast_inputs(like, p_args, dtype)
    with torch.no_grad():
        _, state = run(
            registry.selfcheck_variant(like), p_args, p_kwargs, mode="recurrent",
            backend="torch", output_final_state=True,
        )  # fmt: skip
    return per_step, state


def clone_state(state):
    if isinstance(state, (tuple, list)):
        return tuple(s.clone() for s in state)
    return state.clone()


def reference_first(like: str, per_step, state):
    """The first step's output from ``state`` on the PyTorch path in fp32 (state untouched)."""
    import linrnn

    variant = registry.selfcheck_variant(like)
    a, kw = per_step[0]
    up = lambda x: x.float() if x.is_floating_point() else x  # noqa: E731
    with torch.no_grad():
        o, _ = linrnn.step(
            variant.op, *map(up, a), state=clone_state(state), backend="torch",
            **{n: up(x) for n, x in kw.items()}, **variant.options,
        )  # fmt: skip
    return o


def rel_err(a, b) -> float:
    a, b = a.double().reshape(-1), b.double().reshape(-1)
    ref = torch.linalg.vector_norm(b).item()
    diff = torch.linalg.vector_norm(a - b).item()
    return diff / ref if ref > 0 else diff


# --- builders: (step_fn(t) -> o [B, 1, H, V]) from the shared inputs and state ----------------


def build_linrnn(case: dict, per_step, state):
    import linrnn

    variant = registry.selfcheck_variant(case["op"])
    opts = dict(variant.options)
    if case.get("backend_forced"):
        opts["backend"] = case["backend_forced"]
    elif case["device"] == "cuda":
        # every family's Triton recurrent kernel (the row says "triton"), or "not implemented"
        # where this build lacks one (backend=None would fall back to PyTorch under that label)
        opts["backend"] = "triton"

    def step_fn(t):
        a, kw = per_step[t]
        return linrnn.step(variant.op, *a, state=state, inplace=True, **kw, **opts)[0]

    return step_fn


def build_fla(case: dict, per_step, state):
    name = case["op"].split(":")[1]
    holder = {"S": state}
    if name == "fused_recurrent_simple_gla":
        from fla.ops.simple_gla import fused_recurrent_simple_gla as fn

        call = lambda a, S: fn(a[0], a[1], a[2], g=a[3], initial_state=S,  # noqa: E731
                               output_final_state=True)  # fmt: skip
    elif name == "fused_recurrent_retention":
        from fla.ops.retention import fused_recurrent_retention as fn

        # fla makes retention's per-head decays itself (the same as linrnn's recipe)
        call = lambda a, S: fn(a[0], a[1], a[2], initial_state=S,  # noqa: E731
                               output_final_state=True)  # fmt: skip
    elif name == "fused_recurrent_linear_attn":
        from fla.ops.linear_attn import fused_recurrent_linear_attn as fn

        call = lambda a, S: fn(a[0], a[1], a[2], initial_state=S,  # noqa: E731
                               output_final_state=True, normalize=False)  # fmt: skip
    elif name == "fused_recurrent_gla":
        from fla.ops.gla import fused_recurrent_gla as fn

        call = lambda a, S: fn(a[0], a[1], a[2], gk=a[3], initial_state=S,  # noqa: E731
                               output_final_state=True)  # fmt: skip
    elif name == "fused_recurrent_rwkv6":
        from fla.ops.rwkv6 import fused_recurrent_rwkv6 as fn

        call = lambda a, S: fn(a[0], a[1], a[2], a[3], a[4], initial_state=S,  # noqa: E731
                               output_final_state=True)  # fmt: skip
    elif name == "fused_recurrent_gated_delta_rule":
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule as fn

        call = lambda a, S: fn(a[0], a[1], a[2], g=a[3], beta=a[4], initial_state=S,  # noqa: E731
                               output_final_state=True, use_qk_l2norm_in_kernel=True)  # fmt: skip
    elif name == "fused_recurrent_delta_rule":
        from fla.ops.delta_rule import fused_recurrent_delta_rule as fn

        # no grouped value heads: q, k repeated to HV heads with the inputs (not timed)
        groups = per_step[0][0][2].shape[2] // per_step[0][0][0].shape[2]
        rep = lambda x: x.repeat_interleave(groups, dim=2) if groups > 1 else x  # noqa: E731
        per_step = [((rep(a[0]), rep(a[1]), *a[2:]), kw) for a, kw in per_step]
        call = lambda a, S: fn(a[0], a[1], a[2], a[3], initial_state=S,  # noqa: E731
                               output_final_state=True, use_qk_l2norm_in_kernel=True)  # fmt: skip
    else:
        raise ValueError(f"unknown fla decode peer {name!r}")

    def step_fn(t):
        o, holder["S"] = call(per_step[t][0], holder["S"])
        return o

    return step_fn


def build_mlstm_kernels(case: dict, per_step, state):
    from mlstm_kernels.torch import get_mlstm_step_kernel

    kernel = case["op"].split(":")[1]
    fn = get_mlstm_step_kernel("triton" if kernel == "triton_step" else "native")
    C, n, m = state  # linrnn: C [B,H,K,V], n [B,H,K], m [B,H]
    heads = lambda x: x[:, 0].contiguous()  # noqa: E731  [B, 1, H, D] -> [B, NH, D]
    gate = lambda x: x[:, 0, :, None].contiguous()  # noqa: E731  [B, 1, H] -> [B, NH, 1]
    steps = [(heads(a[0]), heads(a[1]), heads(a[2]), gate(a[3]), gate(a[4])) for a, _ in per_step]
    bufs = [(C, n, m[..., None].contiguous())]
    if kernel == "triton_step":  # the kernel reads m in every tile: new state elsewhere
        bufs.append(tuple(torch.empty_like(x) for x in bufs[0]))
    holder = {"cur": 0, "S": bufs[0]}

    def step_fn(t):
        q, k, v, i, f = steps[t]
        if kernel == "triton_step":
            old, new = bufs[holder["cur"]], bufs[1 - holder["cur"]]
            h, _ = fn(q, k, v, i, f, *old, matC_new=new[0], vecN_new=new[1], scaM_new=new[2])
            holder["cur"] = 1 - holder["cur"]
        else:
            h, holder["S"] = fn(q, k, v, i, f, *holder["S"])
        return h[:, None]

    return step_fn


BUILDERS = {"linrnn": build_linrnn, "fla": build_fla, "mlstm_kernels": build_mlstm_kernels}


# --- the task -------------------------------------------------------------------------------


def graph_timing(loop, case: dict, device, steps: int) -> dict:
    """The same ``steps`` calls captured once in a CUDA graph and replayed: the step time
    without the host's launch overhead, which an eager loop of small one-token kernels is
    bound by (what a decoder gets from ``linrnn.graphs.capture_decode``). Every library's step
    is captured the same way; one that cannot be captured gets ``graph_status`` instead."""
    from linrnn.bench import timing

    try:
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):  # warm-up off the capture stream, as torch recommends
            loop()
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            loop()
        graph_ms = timing.median_ms(graph.replay, case, device)
    except Exception as exc:
        return {"graph_status": f"error: {short_error(exc)}"}
    return {"graph_status": "ok", "graph_loop_ms": graph_ms, "graph_step_ms": graph_ms / steps}


def decode_case(case: dict, item: dict) -> dict:
    """One op × shape of the decode suite (runs in the worker, or in-process on CPU)."""
    from linrnn.bench import timing

    row: dict = {"status": "ok"}
    where = {"stage": "inputs"}

    def stage(name: str) -> None:
        where["stage"] = name
        if not case.get("in_process"):
            emit({"event": "stage", "stage": name})

    device = torch.device(case["device"])
    try:
        shape = registry.parse_shape(item["shape"])
        if shape["T"] != 1:
            raise ValueError(f"decode shapes have T=1, got {item['shape']}")
        steps = case["steps"]
        like = peers.like_of(case["op"])
        stage("inputs")
        per_step, state = step_inputs(like, shape, steps, case["dtype"], case["seed"], device)
        ref = reference_first(like, per_step, state)
        step_fn = BUILDERS[peers.library_of(case["op"])](case, per_step, state)

        def loop():
            for t in range(steps):
                step_fn(t)

        with torch.no_grad():
            stage("first forward")
            timing.sync(device)
            t0 = time.perf_counter()
            o = step_fn(0)
            timing.sync(device)
            row["first_call_s"] = time.perf_counter() - t0
            row["err_vs_torch_fp32"] = rel_err(o, ref)
            stage("timing forward")
            row["loop_ms"] = timing.median_ms(loop, case, device)
            row["peak_fwd_mib"], row["extra_fwd_mib"] = timing.peak_mib(loop, device)
            if device.type == "cuda":
                stage("cuda graph")
                row.update(graph_timing(loop, case, device, steps))
        row["steps"] = steps
        row["step_ms"] = row["loop_ms"] / steps
    except NotImplementedError as exc:
        row["status"] = f"not implemented: {short_error(exc)}"
    except Exception as exc:
        if not case.get("in_process"):
            traceback.print_exc()
        row["status"] = f"error ({where['stage']}): {short_error(exc)}"
        row["error_detail"] = error_detail(exc)
    return row


# --- planning, rows and the table -----------------------------------------------------------


def plan(args, suite: registry.Suite, device: str, common: dict, chosen) -> tuple[list, list]:
    """Cases of the decode suite: every linrnn op (``linrnn.step``), then the decode peers."""
    steps = args.steps or 32
    common = dict(common, task="decode", steps=steps, fwdbwd=False, initial_state=True)
    cases, notes = [], []
    for name, op in registry.OPS.items():
        if not chosen(name) or not suite.runs_family(op.family):
            continue
        backend = args.backend or ("triton" if device == "cuda" else "torch")
        case = dict(common, op=name, mode="recurrent", backend=backend, chunk=None,
                    backend_forced=args.backend)  # fmt: skip
        shapes = args.shapes or suite.shapes_for(op.family, device)
        shapes = registry.takes_shapes(name, shapes, op.grouped, notes)
        if shapes:
            cases.append((case, [{"shape": s} for s in shapes]))
    if args.no_peers:
        return cases, notes
    for name, peer in peers.PEERS.items():
        if peer.kind != "decode" or not chosen(name):
            continue
        if peer.cuda_only and device != "cuda":
            continue
        if not (getattr(args, "plan", False) or peers.available(peer.library)):
            notes.append(f"peer {name} skipped: {peer.library} is not installed")
            continue
        family = registry.OPS[peer.like].family
        if not suite.runs_family(family):
            continue
        shapes = args.shapes or suite.shapes_for(family, device)
        shapes = registry.takes_shapes(name, shapes, peer.grouped != "no", notes)
        if shapes:
            case = dict(common, op=name, mode="recurrent", backend=None, chunk=None)
            cases.append((case, [{"shape": s} for s in shapes]))
    if device != "cuda":
        notes.append("decode peers (fla, mlstm_kernels) need CUDA")
    return cases, notes


def figures(
    shape: dict, elt: int, gate_elems: float, step_ms: float | None, spec, form: str = "scalar"
) -> dict:
    """Decode figures of one step: tokens/s, the state bytes ``2·B·HV·K·V·4`` and their GB/s,
    the fewest bytes (state + q, k, v, o, gates), the floor and × floor (HV = H without
    grouped value heads)."""
    B, H, K, V = (shape[d] for d in "BHKV")
    HV = shape.get("HV", H)
    state_bytes = 2 * B * HV * K * V * flops.STATE_BYTES
    least = flops.min_bytes(B, 1, H, K, V, elt, gate_elems, state_in=True, state_out=True, HV=HV)
    f = flops.forward_flops("recurrent", B, 1, H, K, V, None, HV=HV, form=form)
    out = {
        "state_bytes_step": state_bytes,
        "min_bytes": least,
        "fwd_bytes": least,
        "fwd_flops": f,
        "intensity": f / least,
        "tokens_per_s": B / (step_ms * 1e-3) if step_ms else None,
        "state_gbps": state_bytes / (step_ms * 1e6) if step_ms else None,
        "fwd_gbps": least / (step_ms * 1e6) if step_ms else None,
        "fwd_tflops": f / (step_ms * 1e9) if step_ms else None,
        "floor_ms": None,
        "x_floor": None,
        "floor_tokens_per_s": None,
    }
    if spec:
        out["floor_ms"] = flops.floor_ms(f, least, spec)
        out["floor_tokens_per_s"] = B / (out["floor_ms"] * 1e-3)
        out["x_floor"] = step_ms / out["floor_ms"] if step_ms else None
    return out


def full_row(case: dict, item: dict, row: dict, spec: dict | None) -> dict:
    op, library = case["op"], peers.library_of(case["op"])
    like = peers.like_of(op)
    shape = registry.parse_shape(item["shape"])
    full = {k: None for k in report.ROW_KEYS}
    full.update(
        op=op, library=library, family=registry.OPS[like].family, mode=case["mode"],
        backend=case["backend"], chunk=None, shape=item["shape"], dtype=case["dtype"],
        suite=case["suite"], steps=case["steps"], batch=shape["B"],
        note=peers.PEERS[op].note if library != "linrnn" else "linrnn.step(inplace=True)",
    )  # fmt: skip
    full.update(row)
    full["fwd_ms"] = full.get("step_ms")  # one forward = one step
    op_spec, elt = registry.OPS[like], flops.DTYPE_BYTES[case["dtype"]]
    gates = op_spec.gate_fp32_elems(shape["K"], shape["V"], elt)
    full.update(figures(shape, elt, gates, full["fwd_ms"], spec, op_spec.form))
    graph = figures(shape, elt, gates, full.get("graph_step_ms"), spec, op_spec.form)
    full["graph_tokens_per_s"], full["graph_x_floor"] = graph["tokens_per_s"], graph["x_floor"]
    return full


HEADER = ("op", "backend", "shape", "steps", "step ms", "tokens/s", "state MB", "state GB/s",
          "× floor", "graph ms", "graph tok/s", "graph × floor", "err", "status")  # fmt: skip
NUMERIC = (0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0)


def table(rows: list[dict]) -> str:
    def num(x, fmt):
        return "—" if x is None else format(x, fmt)

    body = [
        (
            r["op"],
            r.get("backend") or "",
            r["shape"],
            r.get("steps") or "",
            num(r.get("step_ms"), ".4f"),
            num(r.get("tokens_per_s"), ",.0f"),
            num(r["state_bytes_step"] / 1e6, ".4g"),
            num(r.get("state_gbps"), ".4g"),
            num(r.get("x_floor"), ".2f"),
            num(r.get("graph_step_ms"), ".4f"),
            num(r.get("graph_tokens_per_s"), ",.0f"),
            num(r.get("graph_x_floor"), ".2f"),
            num(r.get("err_vs_torch_fp32"), ".1e"),
            r["status"],
        )
        for r in rows
    ]
    return report.format_table(HEADER, body, NUMERIC)


SUMMARY = (
    "decode, {dtype}, {timing}; step ms = loop of {steps} one-token calls / {steps}; tokens/s "
    "= B / step; state MB = 2·B·HV·K·V·4 (fp32 state read + written per step); × floor = step "
    "/ (fewest bytes per step / bandwidth); graph: the same loop captured in one CUDA graph "
    "(no launch overhead); err = first step vs the PyTorch recurrence in fp32"
)
