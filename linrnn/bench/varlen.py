"""The ``varlen`` suite: packed documents (``cu_seqlens``) against the same documents padded.

Per op and shape ``B1-T…-H…-K…-V…`` (T = the total token count): ``docs`` documents of seeded
random lengths (:func:`doc_lengths`: weights uniform in [0.2, 1.8), scaled to sum to T, each
≥ 1) are timed forward and forward+backward (:mod:`linrnn.bench.timing`) in two layouts:

* ``packed``: one ``[1, T, H, ·]`` batch with ``cu_seqlens`` (a Python list of offsets, so no
  host read of a device tensor per call); the op resets the state at every boundary.
* ``padded``: the natural baseline, the op on ``[docs, max_len, H, ·]``: each document in its
  own row, right-padded with zeros (q, k, v and the per-token gates: log decay 0, mLSTM
  pre-activations 0); the output is multiplied by the 0/1 mask of valid tokens inside the
  timed call, so padding contributes no gradient. Right padding leaves every valid output
  exact (the recurrence is causal); the baseline does the work of ``docs·max_len`` tokens.

Rows carry ``tokens`` (T, the useful tokens), ``layout_tokens`` (what the layout computes),
the document lengths and ``tokens_per_s_fwdbwd`` = T / fwd+bwd time. FLOPs are the chunkwise
count per document (packed: Σ over documents; padded: ``docs`` rows of ``max_len``). Ops: the
linrnn ops with a Triton chunk kernel (native ``cu_seqlens`` in the chunk kernels; the delta
rule's too) and fla's ``chunk_simple_gla`` with ``cu_seqlens`` as a peer.

Cost: :func:`plan` makes one case per op, the linrnn ops first and the peer last, each case
one worker process (fresh Triton cache) running its two items, packed then padded; every
case compiles its kernels per layout, and fla's chunk kernels take minutes to compile (the
varlen and the padded forms are separate specializations). The whole suite may not fit one
time-limited call: run it in parts that add to one JSON (``--ops linrnn`` then ``--ops
peers``, each with ``--resume --time-budget``; ``scripts/gpu_runbook.sh varlen``). The report
is rewritten after every case, and a case cut at the budget keeps its finished items.
"""

from __future__ import annotations

import torch

from linrnn.bench import flops, peers, registry, report

LAYOUTS = ("packed", "padded")


def doc_lengths(total: int, docs: int, seed: int) -> list[int]:
    """``docs`` lengths ≥ 1 summing to ``total``, from a CPU generator seeded with ``seed``."""
    if not 1 <= docs <= total:
        raise ValueError(f"need 1 ≤ docs ≤ total tokens, got docs={docs}, total={total}")
    gen = torch.Generator().manual_seed(seed)
    w = 0.2 + 1.6 * torch.rand(docs, generator=gen, dtype=torch.float64)
    lens = [max(1, int(x)) for x in (w / w.sum() * total).tolist()]
    i = 0
    while sum(lens) != total:  # fix the rounding on the longest (or any > 1) documents
        j = max(range(docs), key=lambda d: lens[d]) if sum(lens) > total else i % docs
        lens[j] += 1 if sum(lens) < total else -1
        i += 1
    return lens


def offsets(lens: list[int]) -> list[int]:
    out = [0]
    for n in lens:
        out.append(out[-1] + n)
    return out


def pad(x: torch.Tensor, lens: list[int]) -> torch.Tensor:
    """``[1, T, ...]`` packed -> ``[docs, max_len, ...]`` right-padded with zeros."""
    out = x.new_zeros(len(lens), max(lens), *x.shape[2:])
    for d, (a, n) in enumerate(zip(offsets(lens), lens)):
        out[d, :n] = x[0, a : a + n]
    return out


def layout_inputs(case: dict, shape: dict, lens: list[int]):
    """``(args, kwargs, needs_grad, mask)`` of the case's layout: the benchmark inputs of the
    packed batch, padded when the layout is "padded" (mask ``[docs, max_len, 1, 1]``)."""
    like = peers.like_of(case["op"])
    args, kwargs, needs_grad = registry.bench_inputs(
        like, shape, case["dtype"], case["seed"], case["device"]
    )
    if case["layout"] == "packed":
        return args, kwargs, needs_grad, None
    T = shape["T"]
    per_token = lambda x: x.dim() >= 3 and x.shape[:2] == (1, T)  # noqa: E731
    re = lambda x, n: pad(x.detach(), lens).requires_grad_(n) if per_token(x) else x  # noqa: E731
    args = tuple(re(x, n) for x, n in zip(args, needs_grad))
    kwargs = {k: re(x, x.requires_grad) for k, x in kwargs.items()}
    valid = torch.arange(max(lens))[None, :] < torch.tensor(lens)[:, None]
    mask = valid[:, :, None, None].to(device=args[0].device, dtype=args[0].dtype)
    return args, kwargs, needs_grad, mask


def build_linrnn(case: dict, shape: dict):
    from linrnn.selfcheck import run

    lens = case["lens"]
    args, kwargs, needs_grad, mask = layout_inputs(case, shape, lens)
    variant = registry.selfcheck_variant(case["op"])
    opts = dict(mode=case["mode"], backend=case["backend"], chunk_size=case["chunk"])
    if mask is None:
        opts["cu_seqlens"] = offsets(lens)
    leaves = [x for x, n in zip(args, needs_grad) if n]

    def fwd():
        o = run(variant, args, kwargs, **opts)[0]
        return o if mask is None else o * mask

    return leaves, fwd


def build_fla(case: dict, shape: dict):
    from fla.ops.simple_gla import chunk_simple_gla

    lens = case["lens"]
    (q, k, v, g), _, _, mask = layout_inputs(case, shape, lens)
    if mask is None:
        cpu = torch.tensor(offsets(lens), dtype=torch.long)
        cu = dict(cu_seqlens=cpu.to(q.device), cu_seqlens_cpu=cpu)
        return [q, k, v, g], lambda: chunk_simple_gla(q, k, v, g=g, **cu)[0]
    return [q, k, v, g], lambda: chunk_simple_gla(q, k, v, g=g)[0] * mask


BUILDERS = {"linrnn": build_linrnn, "fla": build_fla}


def varlen_case(case: dict, item: dict) -> dict:
    """One op × layout of the varlen suite (the timing of :mod:`linrnn.bench.timing`)."""
    from linrnn.bench import timing

    shape = registry.parse_shape(item["shape"])
    lens = doc_lengths(shape["T"], case["docs"], case["seed"])
    sub = dict(case, layout=item["layout"], lens=lens)
    return timing.bench_case(sub, item, build=BUILDERS[peers.library_of(case["op"])])


# --- planning, rows and the table -----------------------------------------------------------


def plan(args, suite: registry.Suite, device: str, common: dict, chosen) -> tuple[list, list]:
    """Cases: every linrnn op with Triton kernels (chunk mode) and the varlen peers, each with
    the items (shape × layout)."""
    docs = args.docs or suite.docs
    common = dict(common, task="varlen", docs=docs, fwdbwd=True, initial_state=False)
    cases, notes = [], []

    def items(shapes):
        for s in shapes:
            if registry.parse_shape(s)["B"] != 1:
                raise ValueError(f"varlen shapes are packed batches (B1-T<total>-…), got {s}")
        return [{"shape": s, "layout": lay} for s in shapes for lay in LAYOUTS]

    for name, op in registry.OPS.items():
        if "chunk" not in op.kernel_modes() or not chosen(name) or not suite.runs_family(op.family):
            continue
        backend = registry.backend_for(op, "chunk", device, args.backend)
        if backend is None:
            continue
        chunk = (args.chunk_sizes or (None,))[0]
        case = dict(common, op=name, mode="chunk", backend=backend, chunk=chunk)
        cases.append((case, items(args.shapes or suite.shapes_for(op.family, device))))
    if not args.no_peers:
        for name, peer in peers.PEERS.items():
            if peer.kind != "varlen" or not chosen(name):
                continue
            if peer.cuda_only and device != "cuda":
                continue
            if not (getattr(args, "plan", False) or peers.available(peer.library)):
                notes.append(f"peer {name} skipped: {peer.library} is not installed")
                continue
            case = dict(common, op=name, mode=None, backend=None, chunk=peer.chunk)
            shapes = args.shapes or suite.shapes_for(registry.OPS[peer.like].family, device)
            cases.append((case, items(shapes)))
    notes.append(
        "varlen: the linrnn ops with a Triton chunk kernel; padded = right-padded [docs, "
        "max_len] batch, zeros in padding (the delta rule: β = 0 there), output masked"
    )
    return cases, notes


def layout_flops(shape: dict, lens: list[int], layout: str, L: int, form: str = "scalar") -> float:
    """Forward FLOPs of the layout: chunkwise per document (packed) or per padded row (the
    op's FLOP model, ``form``)."""
    H, K, V = shape["H"], shape["K"], shape["V"]
    HV = shape.get("HV", H)
    count = lambda B, T: flops.forward_flops("chunk", B, T, H, K, V, L, HV=HV, form=form)  # noqa: E731
    if layout == "packed":
        return sum(count(1, n) for n in lens)
    return count(len(lens), max(lens))


def full_row(case: dict, item: dict, row: dict, spec: dict | None) -> dict:
    op, library = case["op"], peers.library_of(case["op"])
    like = peers.like_of(op)
    shape = registry.parse_shape(item["shape"])
    lens = doc_lengths(shape["T"], case["docs"], case["seed"])
    layout = item["layout"]
    op_spec = registry.OPS[like]
    chunk = case["chunk"] or registry.default_chunk(case["backend"], "chunk", shape["K"],
                                                   shape["V"], op_spec)  # fmt: skip
    full = {k: None for k in report.ROW_KEYS}
    T, H, K, V = (shape[d] for d in "THKV")
    HV = shape.get("HV", H)
    layout_tokens = T if layout == "packed" else len(lens) * max(lens)
    full.update(
        op=op, library=library, family=registry.OPS[like].family, mode=case["mode"],
        backend=case["backend"], chunk=chunk, chunk_requested=case["chunk"],
        shape=item["shape"], dtype=case["dtype"], suite=case["suite"], layout=layout,
        docs=len(lens), doc_lengths=lens, max_len=max(lens), tokens=T,
        layout_tokens=layout_tokens,
        note=peers.PEERS[op].note if library != "linrnn" else "",
    )  # fmt: skip
    full.update(row)
    elt = flops.DTYPE_BYTES[case["dtype"]]
    gates = op_spec.gate_fp32_elems(K, V, elt)
    f = layout_flops(shape, lens, layout, chunk, op_spec.form)
    least = flops.min_bytes(1, T, H, K, V, elt, gates, HV=HV)
    least_fb = flops.min_bytes_fwdbwd(1, T, H, K, V, elt, gates, HV=HV)
    fwd_ms, fb_ms = full.get("fwd_ms"), full.get("fwdbwd_ms")
    full.update(
        fwd_flops=f, fwdbwd_flops=flops.fwdbwd_flops(f), min_bytes=least,
        min_bytes_fwdbwd=least_fb,
        fwd_tflops=f / (fwd_ms * 1e9) if fwd_ms else None,
        fwdbwd_tflops=3 * f / (fb_ms * 1e9) if fb_ms else None,
        tokens_per_s_fwd=T / (fwd_ms * 1e-3) if fwd_ms else None,
        tokens_per_s_fwdbwd=T / (fb_ms * 1e-3) if fb_ms else None,
    )  # fmt: skip
    if spec:  # the floor of the useful work (packed tokens)
        useful = layout_flops(shape, lens, "packed", chunk, op_spec.form)
        full["floor_ms"] = flops.floor_ms(useful, least, spec)
        full["floor_fwdbwd_ms"] = flops.floor_ms(3 * useful, least_fb, spec)
        full["x_floor"] = fwd_ms / full["floor_ms"] if fwd_ms else None
        full["x_floor_fwdbwd"] = fb_ms / full["floor_fwdbwd_ms"] if fb_ms else None
    return full


HEADER = ("op", "layout", "shape", "docs", "max len", "fwd ms", "fwd+bwd ms", "tokens/s f+b",
          "padded/packed", "peak MiB", "status")  # fmt: skip
NUMERIC = (0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 0)


def table(rows: list[dict]) -> str:
    def num(x, fmt):
        return "—" if x is None else format(x, fmt)

    packed = {(r["op"], r["shape"]): r for r in rows if r.get("layout") == "packed"}
    body = []
    for r in rows:
        ratio = None
        base = packed.get((r["op"], r["shape"]))
        if r.get("layout") == "padded" and base and base.get("fwdbwd_ms") and r.get("fwdbwd_ms"):
            ratio = r["fwdbwd_ms"] / base["fwdbwd_ms"]
        peak = r.get("peak_fwdbwd_mib") or r.get("peak_fwd_mib")
        body.append((
            r["op"], r.get("layout") or "", r["shape"], r.get("docs") or "", r.get("max_len") or "",
            report.ms(r.get("fwd_ms")), report.ms(r.get("fwdbwd_ms")),
            num(r.get("tokens_per_s_fwdbwd"), ",.0f"), num(ratio, ".2f"), num(peak, ".0f"),
            r["status"],
        ))  # fmt: skip
    return report.format_table(HEADER, body, NUMERIC)


SUMMARY = (
    "varlen, {dtype}, {timing}; packed = [1, T] with cu_seqlens; padded = [docs, max_len], "
    "zeros in padding, output masked; tokens/s f+b = T / fwd+bwd; padded/packed = fwd+bwd "
    "time ratio (same op)"
)
