"""linrnn.bench.plots on small synthetic reports: which rows each plot draws, and that every
plot function writes its PNG."""

from __future__ import annotations

import importlib.util
import json

import pytest

from linrnn.bench import flops, plots, registry

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None, reason="no matplotlib"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),  # matplotlib's mathtext
]


def row(op, T, fwdbwd, *, mode="chunk", chunk=64, H=16, K=256, suite="paper", status="ok"):
    lib = op.split(":")[0] if ":" in op else "linrnn"
    return dict(op=op, library=lib, mode=mode if lib == "linrnn" else None, chunk=chunk,
                shape=registry.shape_id(8, T, H, K, K), suite=suite, status=status,
                fwd_ms=fwdbwd / 3, fwdbwd_ms=fwdbwd, peak_fwdbwd_mib=1024.0 + T / 8,
                fwd_tflops=100.0, intensity=50.0)  # fmt: skip


@pytest.fixture
def report(tmp_path):
    """GLA and its fla peers at three lengths; two chunk sizes and fused_chunk for linrnn."""
    rows = []
    for T in (2048, 8192, 16384):
        rows += [row("gla", T, 19.0, chunk=128), row("gla", T, 20.0, chunk=64),
                 row("gla", T, 25.0, mode="fused_chunk"), row("fla:chunk_gla", T, 28.0),
                 row("fla:fused_recurrent_gla[seq]", T, 200.0 * T / 8192, chunk=None),
                 row("mlstm[exp]", T, 14.0, chunk=128)]  # fmt: skip
    rows.append(row("fla:chunk_gla", 4096, 9.0, status="timeout (300 s)"))
    path = tmp_path / "paper.json"
    path.write_text(json.dumps({"bench": rows, "gpu_spec": flops.gpu_spec("NVIDIA H200")}))
    return json.loads(path.read_text())


def test_length_lines_take_chunk_mode_smallest_chunk_and_peers(report):
    lines = plots.length_lines(report["bench"], "fwdbwd_ms")
    assert set(lines) == {"gla", "mlstm"}
    gla = lines["gla"]["H16-K256-V256"]
    assert set(gla) == {"linrnn gla", "fla:chunk_gla", "fla:fused_recurrent_gla[seq]"}
    assert sorted(gla["linrnn gla"]) == [(2048, 20.0), (8192, 20.0), (16384, 20.0)]  # L = 64
    assert "fla:chunk_gla" in gla and len(gla["fla:chunk_gla"]) == 3  # the timeout left out


def test_bar_rows_pick_the_best_chunk_and_put_linrnn_first(report):
    bars = plots.bar_rows(report["bench"])
    assert set(bars) == {"gla"}  # mlstm has no peer here
    shape, rs = bars["gla"]
    assert shape == "B8-T8192-H16-K256-V256"  # nearest 8192 among equals
    assert [r["op"] for r in rs] == ["gla", "fla:chunk_gla", "fla:fused_recurrent_gla[seq]"]
    assert rs[0]["chunk"] == 128 and rs[0]["fwdbwd_ms"] == 19.0
    assert plots.bar_rows(report["bench"], "B8-T2048-H16-K256-V256")["gla"][0].endswith(
        "T2048-H16-K256-V256"
    )


def test_every_plot_writes_a_png(report, tmp_path):
    made = plots.make_plots(report, tmp_path / "plots")
    names = {p.name for p in made}  # memory-vs-chunk: gla at L = 64 and 128
    assert names == {"runtime-vs-T-gla.png", "runtime-vs-T-mlstm.png", "bars-gla.png",
                     "memory-vs-chunk.png", "roofline.png"}  # fmt: skip
    one_chunk = [r for r in report["bench"] if r["chunk"] != 64]
    assert plots.memory_vs_chunk(one_chunk, tmp_path) == []
    for path in made:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000


def test_one_length_draws_no_runtime_line(report):
    one_t = [r for r in report["bench"] if "T8192" in r["shape"]]
    assert plots.length_lines(one_t, "fwdbwd_ms") == {}


@pytest.mark.parametrize("x, label", [(2048, "2K"), (16384, "16K"), (2**20, "1M"), (300, "300")])
def test_token_ticks(x, label):
    assert plots._tokens(x) == label
