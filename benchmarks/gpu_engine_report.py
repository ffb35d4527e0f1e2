"""Tables and target ratios of benchmarks/gpu_engine.py's report (its printing half: the
script runs the cases, this module turns its rows into text)."""

from __future__ import annotations

from linrnn.bench.report import format_table, ms

# The targets: (label, linrnn ops, peer ops; the fastest peer that ran is used)
TARGETS = (
    (
        "mLSTM-sig",
        ("mlstm[sigmoid,normalize]",),
        ("mlstm_kernels:triton_xl_chunk_siging[normalize]",),
    ),
    ("mLSTM-sig, no normalizer", ("mlstm[sigmoid]",), ("mlstm_kernels:triton_xl_chunk_siging",)),
    (
        "mLSTM-exp",
        ("mlstm[exp]",),
        ("mlstm_kernels:triton_xl_chunk", "mlstm_kernels:triton_limit_chunk"),
    ),
    ("simple GLA", ("simple_gla",), ("fla:chunk_simple_gla",)),
    ("linear attention", ("linear_attn",), ("fla:chunk_linear_attn",)),
)


def correctness_table(rows: list[dict]) -> str:
    header = (
        "op",
        "mode",
        "L",
        "dtype",
        "shape",
        "out err",
        "state err",
        "grad err (worst)",
        "tol",
        "result",
    )
    e = lambda x: "—" if x is None else f"{x:.2e}"  # noqa: E731
    body = [
        (
            r["op"],
            r["mode"],
            r["chunk"] or "def",
            r["dtype"],
            r["shape"],
            e(r.get("out_err")),
            e(r.get("state_err")),
            f"{e(r.get('grad_err'))} ({r.get('worst_grad') or '—'})" if "grad_err" in r else "—",
            f"{r['tol']:g}",
            r["status"],
        )
        for r in rows
    ]
    return format_table(header, body, (0, 0, 1, 0, 0, 1, 1, 1, 1, 0))


def bench_table(rows: list[dict]) -> str:
    header = (
        "op",
        "mode",
        "L",
        "shape",
        "fwd ms",
        "fwd+bwd ms",
        "peak MiB",
        "over inputs",
        "first s",
        "× floor",
        "status",
    )

    def first(r):
        if r.get("first_call_s") is not None:
            return f"{r['first_call_s']:.1f}" + ("" if r.get("first_in_process") else "*")
        if r.get("first_call_s_at_least") is not None:
            return f">{r['first_call_s_at_least']:.1f}"
        return "—"

    mib = lambda x: "—" if x is None else f"{x:.0f}"  # noqa: E731
    body = [
        (
            r["op"],
            r["mode"] if r["library"] == "linrnn" else "",
            r["chunk"] or "",
            r["shape"],
            ms(r.get("fwd_ms")),
            ms(r.get("fwdbwd_ms")),
            mib(r.get("peak_fwdbwd_mib")),
            mib(r.get("extra_fwdbwd_mib")),
            first(r),
            f"{r['x_floor']:.1f}" if r.get("x_floor") else "—",
            r["status"],
        )
        for r in rows
    ]
    return format_table(header, body, (0, 0, 1, 0, 1, 1, 1, 1, 1, 1, 0))


def best_row(rows, ops, shape, key):
    cands = [r for r in rows if r["op"] in ops and r["shape"] == shape and r.get(key)]
    return min(cands, key=lambda r: r[key]) if cands else None


def target_ratios(rows: list[dict], shape: str) -> list[dict]:
    """The issue's comparisons at ``shape``: linrnn's best chunk size and mode vs the fastest
    peer that ran, fwd+bwd (and fwd), with peak memory."""
    out = []
    for label, ours, peers in TARGETS:
        entry = {"target": label, "shape": shape}
        for key, tag in (("fwdbwd_ms", "fwdbwd"), ("fwd_ms", "fwd")):
            a, b = best_row(rows, ours, shape, key), best_row(rows, peers, shape, key)
            if a:
                entry[f"linrnn_{tag}"] = {
                    "op": a["op"],
                    "mode": a["mode"],
                    "chunk": a["chunk"],
                    "ms": a[key],
                    "peak_mib": a.get(f"peak_{tag}_mib"),
                }
            if b:
                entry[f"peer_{tag}"] = {
                    "op": b["op"],
                    "ms": b[key],
                    "peak_mib": b.get(f"peak_{tag}_mib"),
                }
            if a and b:
                entry[f"{tag}_time_ratio"] = a[key] / b[key]
                pa, pb = a.get(f"peak_{tag}_mib"), b.get(f"peak_{tag}_mib")
                entry[f"{tag}_peak_ratio"] = pa / pb if pa and pb else None
        why = [
            f"{r['op']}: {r['status']}"
            for r in rows
            if r["op"] in (*ours, *peers) and r["shape"] == shape and r["status"] != "ok"
        ]
        entry["not_ok"] = why
        out.append(entry)
    return out


def ratio_lines(ratios: list[dict]) -> list[str]:
    lines = []
    for e in ratios:
        head = f"{e['target']} @ {e['shape']}, fwd+bwd: "
        a, b = e.get("linrnn_fwdbwd"), e.get("peer_fwdbwd")
        if a and b:
            r = e["fwdbwd_time_ratio"]
            text = (
                f"linrnn {a['op']} {a['mode']} L={a['chunk']} {ms(a['ms'])} ms vs "
                f"{b['op']} {ms(b['ms'])} ms → time ratio {r:.2f} "
                + (f"(linrnn {1 / r:.2f}× faster)" if r < 1 else f"(linrnn {r:.2f}× slower)")
            )
            if e.get("fwdbwd_peak_ratio"):
                text += (
                    f"; peak {a['peak_mib']:.0f} vs {b['peak_mib']:.0f} MiB "
                    f"(ratio {e['fwdbwd_peak_ratio']:.2f})"
                )
        else:
            missing = [n for n, x in (("linrnn", a), ("peer", b)) if not x]
            text = f"n/a (no fwd+bwd figure for {' and '.join(missing)})"
        if "fwd_time_ratio" in e:
            text += f" | fwd ratio {e['fwd_time_ratio']:.2f}"
        lines.append(head + text)
        lines += [f"    not ok: {w}" for w in e["not_ok"]]
    return lines
