"""linrnn.bench on CPU: the registry, the FLOP/byte formulas against hand-computed values, the
JSON report, plots, the command line's exit codes, worker isolation and the chunk-size
autotune cache with its analytical fallback."""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys

import pytest
import torch

from linrnn.__main__ import main as linrnn_main
from linrnn.bench import autotune, cli, flops, peers, registry, report, worker

# --- registry -------------------------------------------------------------------------------


def test_registry_covers_every_family_and_suite():
    families = {op.family for op in registry.OPS.values()}
    engine = {"linear_attn", "retention", "simple_gla", "gla", "rwkv6", "mlstm"}
    assert families == engine | {"delta_rule", "gated_delta_rule", "mamba2"}
    assert set(registry.ENGINE_FAMILIES) == engine
    assert set(registry.SUITES) == {"quick", "paper", "heads", "headdim", "chunksize", "delta",
                                    "decode", "varlen", "mamba2", "train"}  # fmt: skip
    assert set(registry.SUITES["quick"].modes) == set(registry.ALL_MODES)
    assert registry.SUITES["quick"].families is None  # every family
    for name in ("paper", "heads", "headdim", "chunksize"):  # the engine's sweeps
        assert registry.SUITES[name].families == registry.ENGINE_FAMILIES
    for name, peer in peers.PEERS.items():
        assert peer.like in registry.OPS, name

    paper = registry.SUITES["paper"]
    for family in engine:
        for sid in paper.shapes_for(family, "cuda"):
            s = registry.parse_shape(sid)
            assert s["B"] * s["T"] == 65_536 and s["H"] * s["K"] == 4096 and s["K"] == s["V"]
    assert {registry.parse_shape(s)["K"] for s in paper.shapes_for("mlstm", "cuda")} == {128, 256}
    assert {registry.parse_shape(s)["H"] for s in paper.shapes_for("rwkv6", "cuda")} == {64}

    dims = [registry.parse_shape(s) for s in registry.SUITES["headdim"].shapes]
    assert [d["K"] for d in dims] == [64, 128, 256, 512]
    assert all(d["B"] == 4 and d["T"] == 8192 and d["H"] * d["K"] == 4096 for d in dims)
    heads = [registry.parse_shape(s) for s in registry.SUITES["heads"].shapes]
    assert [(d["H"], d["K"], d["V"]) for d in heads] == [(16, 256, 256), (16, 128, 256),
                                                        (32, 128, 128), (64, 64, 64)]  # fmt: skip
    assert all(d["B"] == 8 and d["T"] == 8192 for d in heads)
    assert registry.SUITES["chunksize"].chunk_sizes == (64, 128, 256, 512, 1024, 2048, 4096)
    decode = registry.SUITES["decode"]
    assert decode.modes == ("recurrent",) and decode.kind == "decode"
    assert all(registry.parse_shape(s)["T"] == 1 for s in decode.shapes)


def test_backend_and_default_chunk_rules():
    gla, mlstm = registry.OPS["gla"], registry.OPS["mlstm[exp]"]
    assert registry.backend_for(mlstm, "chunk", "cuda") == "triton"
    assert registry.backend_for(mlstm, "recurrent", "cuda") == "torch"
    assert registry.backend_for(gla, "chunk", "cuda") == "triton"
    assert registry.backend_for(gla, "fused_chunk", "cuda") == "triton"
    assert registry.backend_for(mlstm, "fused_chunk", "cpu") is None
    assert registry.default_chunk("triton", "chunk", 256, 256) == 128
    assert registry.default_chunk("triton", "chunk", 64, 64) == 64
    assert registry.default_chunk("torch", "chunk", 256, 256) == 64
    assert registry.default_chunk("torch", "recurrent", 64, 64) is None
    with pytest.raises(ValueError, match="B8-T8192"):
        registry.parse_shape("B8-T0-H1-K1-V1")
    with pytest.raises(ValueError, match="unknown op 'nope'"):
        registry.resolve_op("nope")
    assert registry.resolve_op("mlstm").name == "mlstm[exp]"


# --- formulas -------------------------------------------------------------------------------


def test_chunk_flops_by_hand():
    # App. G per head and chunk, L = 64, K = V = 256, F_c = ½:
    #   L²·F_c·(2K + 2V + 6) = 4096 · 0.5 · 1030          =  2,109,440
    #   L²                                                 =      4,096
    #   L·(4KV + 2K + V + 11) = 64 · (262144+512+256+11)   = 16,827,072
    #   2KV + 5                                            =    131,077
    #   sum                                                = 19,071,685
    assert flops.chunk_flops_per_chunk(64, 256, 256) == 19_071_685
    # B=8, T=8192, H=16: 8·16·(8192/64) chunks = 16,384 → 312,470,487,040 ≈ 0.31 TFLOP
    # (docs/DESIGN.md §4 quotes ≈ 0.31 TFLOP for this shape).
    assert flops.chunkwise_flops(8, 8192, 16, 256, 256, 64) == 16_384 * 19_071_685
    # leading terms only: B·T·H·[L(K+V) + 4KV] = 1,048,576 · (32,768 + 262,144)
    assert flops.chunkwise_flops_leading(8, 8192, 16, 256, 256, 64) == 1_048_576 * 294_912
    # T = 100 with L = 64: one full chunk and one of 36 steps
    assert flops.chunkwise_flops(1, 100, 1, 2, 2, 64) == flops.chunk_flops_per_chunk(
        64, 2, 2
    ) + flops.chunk_flops_per_chunk(36, 2, 2)
    # L = 1 per step: 1·½·(4+4+6) + 1 + (16 + 4 + 2 + 11) + 8 + 5 = 7 + 1 + 33 + 13 = 54
    assert flops.chunk_flops_per_chunk(1, 2, 2) == 54
    # recurrent, K = V = 4: 5·16 + 2·4 + 4 = 92 per step and head
    assert flops.recurrent_flops(1, 1, 1, 4, 4) == 92
    # causal attention, T = 4, K = V = 2: T²·½·(2K + 2V) = 16 · 0.5 · 8 = 64
    assert flops.attention_flops(1, 4, 1, 2, 2) == 64
    # parallel, T = 4, K = V = 2: 16·½·14 + 16 = 128
    assert flops.parallel_flops(1, 4, 1, 2, 2) == 128
    assert flops.fwdbwd_flops(10.0) == 30.0


def test_bytes_by_hand():
    # docs/DESIGN.md §4: q, k, v read and o written in bf16 at B=8, T=8192, H=16, K=V=256:
    # 1,048,576 tokens·heads · 2 bytes · (2·256 + 2·256) = 2,147,483,648 ≈ 2.15 GB
    assert flops.min_bytes(8, 8192, 16, 256, 256, elt=2) == 2_147_483_648
    # plus mLSTM's two fp32 gates: + 1,048,576 · 8
    assert flops.min_bytes(8, 8192, 16, 256, 256, 2, gate_elems=2) == 2_147_483_648 + 8_388_608
    # decode, K = V = 4, one step: 2·(8 + 8) inputs/outputs + state read and written 2·4·16
    assert flops.min_bytes(1, 1, 1, 4, 4, 2, 0, state_in=True, state_out=True) == 32 + 128
    # App. G per chunk with bf16 and two gates: 6L(K+V) + 8L + 2·4·KV at L=64, K=V=256:
    #   6·64·512 = 196,608; 8·64 = 512; 8·65,536 = 524,288 → 721,408
    assert flops.chunk_bytes_per_chunk(64, 256, 256, elt=2, gate_elems=2) == 721_408
    assert flops.algorithm_bytes("chunk", 1, 128, 1, 256, 256, 64, 2, 2) == 2 * 721_408
    # recurrent: the state (fp32) read and written every step, T=3, K=V=4: 3·2·4·16 = 384
    base = flops.min_bytes(1, 3, 1, 4, 4)
    assert flops.algorithm_bytes("recurrent", 1, 3, 1, 4, 4, None) == base + 384
    # forward + backward minimum, K=V=4, elt 2, no gates: 32 + (2·16 + 2·12) = 88
    assert flops.min_bytes_fwdbwd(1, 1, 1, 4, 4) == 88


def test_floor_roofline_and_runtime_optimal_chunk():
    h100 = flops.gpu_spec("NVIDIA H100 80GB HBM3")
    assert h100["matched"] == "H100" and h100["bandwidth_Bps"] == 3.35e12
    assert flops.gpu_spec("NVIDIA H100 PCIe")["matched"] == "H100 PCIe"
    assert flops.gpu_spec("NVIDIA H200")["bandwidth_Bps"] == 4.8e12
    assert flops.gpu_spec("cpu") is None
    # 2.15 GB at 3.35 TB/s = 0.641 ms > 0.312 TFLOP at 989 TFLOP/s = 0.316 ms
    assert flops.floor_ms(0.312e12, 2_147_483_648, h100) == pytest.approx(
        1e3 * 2_147_483_648 / 3.35e12
    )
    assert flops.roofline(1.0, h100) == 3.35e12 and flops.roofline(1e6, h100) == 989e12
    # App. G: L² = (2KV + 5 + 2·I·KV·4) / (2·½·(K + V + 3) + 1); K = V = 64, I = 10:
    #   (8192 + 5 + 327,680) / 132 = 335,877 / 132 = 2544.52 → L = 50.44
    assert flops.runtime_optimal_chunk(64, 64, 10.0) == pytest.approx(math.sqrt(335_877 / 132))
    # I = 0 is the FLOP-optimal L (eq. 113): 8197 / 132 → 7.88
    assert flops.runtime_optimal_chunk(64, 64, 0.0) == pytest.approx(7.880, abs=1e-3)


def test_case_figures_rates_and_floor():
    shape = registry.parse_shape("B8-T8192-H16-K256-V256")
    h200 = flops.gpu_spec("NVIDIA H200")
    fig = flops.case_figures("chunk", shape, 64, 2, 0, fwd_ms=2.0, fwdbwd_ms=6.0, spec=h200)
    assert fig["fwd_flops"] == 16_384 * 19_071_685
    assert fig["fwd_tflops"] == pytest.approx(fig["fwd_flops"] / 2e-3 / 1e12)
    assert fig["fwdbwd_tflops"] == pytest.approx(3 * fig["fwd_flops"] / 6e-3 / 1e12)
    assert fig["fwd_gbps"] == pytest.approx(fig["fwd_bytes"] / 2e-3 / 1e9)
    # floor: max(2.147e9 B / 4.8e12 B/s = 0.447 ms, 0.3125e12 / 989e12 = 0.316 ms) = 0.447 ms
    assert fig["floor_ms"] == pytest.approx(1e3 * 2_147_483_648 / 4.8e12)
    assert fig["x_floor"] == pytest.approx(2.0 / fig["floor_ms"])
    assert flops.case_figures("chunk", shape, 64, 2, 0, 2.0, None, None)["x_floor"] is None


# --- command line and report ----------------------------------------------------------------


def run_cli(tmp_path, *argv):
    out = tmp_path / "report.json"
    code = linrnn_main(["bench", "--quiet", "--out", str(out), *argv])
    return code, (json.loads(out.read_text()) if out.exists() else None)


def test_cli_quick_run_writes_the_report(tmp_path, capsys):
    code, rep = run_cli(tmp_path, "--ops", "simple_gla", "rwkv6", "torch", "--repeats", "1")
    assert code == 0
    text = capsys.readouterr().out
    if not torch.cuda.is_available():
        assert "no CUDA device: running the quick suite on the torch path" in text
    assert "TFLOP/s" in text and "× floor" in text
    assert rep["benchmark"] == "linrnn bench" and rep["complete"] is True
    assert rep["schema"] == report.SCHEMA_VERSION and rep["suite"] == "quick"
    assert set(rep["machine"]) >= {"gpu", "driver", "torch", "triton", "git_commit", "date"}
    assert rep["failures"] == {"linrnn_bench": 0}
    rows = rep["bench"]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    modes = {
        m for m in registry.ALL_MODES if registry.backend_for(registry.OPS["simple_gla"], m, device)
    }
    assert {r["mode"] for r in rows if r["op"] == "simple_gla"} == modes
    assert {r["op"] for r in rows} == {"simple_gla", "rwkv6", "torch:sdpa_causal"}
    for r in rows:
        assert set(r) >= set(report.ROW_KEYS), set(report.ROW_KEYS) - set(r)
        assert r["status"] == "ok", r
        assert r["fwd_ms"] > 0 and r["fwdbwd_ms"] > 0 and r["first_call_s"] > 0
        assert r["fwd_flops"] > 0 and r["fwd_tflops"] > 0 and r["fwd_gbps"] > 0
    chunk = next(r for r in rows if r["op"] == "simple_gla" and r["mode"] == "chunk")
    assert chunk["chunk"] == 64 and chunk["chunk_requested"] is None


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--suite", "nope"], "invalid choice: 'nope'"),
        (["--ops", "nope"], "unknown --ops ['nope']"),
        (["--shapes", "B1-T2"], "is not of the form"),
        (["--chunk-sizes", "0"], "--chunk-sizes must be ≥ 1"),
    ],
)
def test_cli_rejects_bad_arguments(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        linrnn_main(["bench", *argv])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cli_cuda_without_gpu_exits_2(capsys):
    assert linrnn_main(["bench", "--device", "cuda"]) == 2
    assert "no CUDA device" in capsys.readouterr().err


def test_python_m_linrnn_bench_lists_suites():
    proc = subprocess.run([sys.executable, "-m", "linrnn.bench", "--list"], capture_output=True,
                          text=True, timeout=60, cwd=worker.ROOT)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "chunksize" in proc.stdout and "fla:chunk_gla" in proc.stdout


def test_worker_isolation_turns_crashes_into_statuses():
    items = [{"do": "ok"}, {"do": "abort"}, {"do": "ok"}]
    rows = worker.run_items({"task": "selftest", "device": "cpu"}, items, 60, worker.worker_env(),
                            False)  # fmt: skip
    assert [r["status"] for r in rows][::2] == ["ok", "ok"]
    assert rows[1]["status"].startswith("aborted: signal 6 (SIGABRT) in first forward")
    assert rows[1]["first_call_s_at_least"] >= 0


def test_plain_table_and_progress(capsys):
    row = {k: None for k in report.ROW_KEYS}
    row.update(op="gla", mode="chunk", backend="torch", chunk=64, shape="B1-T8-H1-K2-V2",
               status="ok", fwd_ms=1.5, fwd_tflops=0.25, first_call_s=0.1)  # fmt: skip
    text = report.bench_table([row], use_rich=False)
    assert text.splitlines()[0].split()[:2] == ["op", "mode"] and "1.500" in text
    bar = report.Progress(2, enabled=True)
    bar.step("a")
    bar.step("b")
    bar.close()
    assert "[2/2] b" in capsys.readouterr().err or importlib.util.find_spec("tqdm")


# --- plots ----------------------------------------------------------------------------------


@pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None, reason="matplotlib missing")
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # matplotlib's mathtext on pyparsing
def test_plots_from_tiny_runs(tmp_path):
    code, rep = run_cli(tmp_path, "--suite", "chunksize", "--device", "cpu", "--ops",
                        "simple_gla", "--shapes", "B1-T64-H1-K8-V8", "B1-T128-H1-K8-V8",
                        "--chunk-sizes", "16", "32", "--repeats", "1", "--plots")  # fmt: skip
    assert code == 0
    made = {p.name for p in (tmp_path / "report").iterdir()}
    assert made == {"runtime-vs-T-simple_gla.png", "memory-vs-chunk.png", "roofline.png"}
    from linrnn.bench import plots

    spec = flops.gpu_spec("NVIDIA H200")  # draws the roofline line too
    paths = plots.make_plots({"bench": rep["bench"], "gpu_spec": spec}, tmp_path / "again")
    assert all(p.stat().st_size > 1000 for p in paths) and len(paths) == 3


# --- autotune -------------------------------------------------------------------------------


def fake_rows(op="mlstm[exp]", shape="B2-T4096-H4-K128-V128"):
    # fwd+bwd ms and peak MiB per L: 128 is fastest, 512 uses least memory
    figures = {64: (9.0, 900.0), 128: (5.0, 700.0), 256: (6.0, 500.0), 512: (7.0, 400.0)}
    return [
        dict(op=op, library="linrnn", mode="chunk", status="ok", shape=shape, dtype="bf16",
             chunk=L, fwd_ms=t / 3, fwdbwd_ms=t, peak_fwd_mib=m / 2, peak_fwdbwd_mib=m)
        for L, (t, m) in figures.items()
    ]  # fmt: skip


def test_autotune_cache_round_trip(tmp_path):
    gpu = "NVIDIA H200"
    keys = autotune.save_measurements(fake_rows(), gpu, tmp_path, commit="abc")
    assert keys == [autotune.cache_key("mlstm[exp]", 128, 128, "bf16", gpu)]
    saved = json.loads((tmp_path / autotune.CACHE_NAME).read_text())
    assert saved["format"] == 1 and saved["entries"][keys[0]]["git_commit"] == "abc"
    opts = dict(cache_dir=tmp_path, gpu=gpu)
    choose = autotune.choose_chunk_size
    assert choose("mlstm", 128, 128, torch.bfloat16, **opts) == 128  # family name → mlstm[exp]
    assert choose("mlstm[exp]", 128, 128, "bf16", memory_budget=600 * 2**20, **opts) == 256
    # a call with twice the tokens·heads doubles every peak (256: 1000, 512: 800 MiB), so a
    # budget of 900 MiB fits only 512
    budget = dict(memory_budget=900 * 2**20, shape=(4, 4096, 4))
    assert choose("mlstm[exp]", 128, 128, "bf16", **budget, **opts) == 512
    tight = autotune.chunk_size_choice("mlstm[exp]", 128, 128, "bf16", None, 2**20, **opts)
    assert (
        tight.chunk_size == 512 and tight.source == "measured" and "smallest peak" in tight.reason
    )
    assert choose("mlstm[exp]", 128, 128, "bf16", objective="fwd", **opts) == 128
    # another dtype, device or op is another key: analytical fallback
    other = autotune.chunk_size_choice("mlstm[exp]", 128, 128, "fp16", **opts)
    assert other.source == "analytical"
    with pytest.raises(ValueError, match="unknown op"):
        choose("nope", 64, 64, "bf16", **opts)
    with pytest.raises(ValueError, match="memory_budget"):
        choose("gla", 64, 64, "bf16", memory_budget=0, **opts)


def test_autotune_analytical_fallback(tmp_path):
    opts = dict(cache_dir=tmp_path)
    # H200: I_acc = 989e12 / 4.8e12 = 206.04; K = V = 256:
    #   L² = (131,072 + 5 + 2·206.04·65,536·4) / (2·½·515 + 1) = 108,156,250 / 516 = 209,605
    #   L_opt = 457.8 → nearest power of two (log2 8.84) = 512
    # (fp16: bf16 at this GPU and head dim has a shipped measurement, which would win)
    choice = autotune.chunk_size_choice("simple_gla", 256, 256, "fp16", gpu="NVIDIA H200", **opts)
    assert choice.source == "analytical" and choice.chunk_size == 512
    assert "L_opt=458" in choice.reason
    # CPU: nominal I_acc = 10, K = V = 64 → L_opt = 50.4 (see above) → 64
    assert autotune.choose_chunk_size("gla", 64, 64, torch.float32, "cpu", **opts) == 64
    # with a budget and a shape: the smallest L ≥ 64 whose analytical peak fits
    B, T, H = 1, 8192, 8
    need = lambda L: flops.chunk_memory_bytes(B, T, H, 64, 64, L, 4, 64)  # noqa: E731
    budget = (need(256) + need(128)) / 2  # 128 does not fit, 256 does
    L = autotune.choose_chunk_size("gla", 64, 64, "fp32", "cpu", budget, shape=(B, T, H), **opts)
    assert L == 256


def test_save_cache_from_the_command_line(tmp_path):
    cache = tmp_path / "cache"
    argv = ["--suite", "chunksize", "--device", "cpu", "--ops", "simple_gla", "--shapes",
            "B1-T128-H1-K8-V8", "--chunk-sizes", "16", "32", "64", "--repeats", "1",
            "--save-cache", "--cache-dir", str(cache)]  # fmt: skip
    code, rep = run_cli(tmp_path, *argv)
    assert code == 0 and [r["chunk"] for r in rep["bench"]] == [16, 32, 64]
    choice = autotune.chunk_size_choice("simple_gla", 8, 8, "fp32", "cpu", cache_dir=cache)
    assert choice.source == "measured" and choice.chunk_size in (16, 32, 64)
    fastest = min(rep["bench"], key=lambda r: r["fwdbwd_ms"])["chunk"]
    assert choice.chunk_size == fastest


def test_cli_module_has_a_worker_entry():
    assert set(cli.tasks()) == {"bench", "decode", "varlen", "train", "info", "selftest"}


def _heads_row(op, shape, mode="chunk", status="ok", chunk_requested=None, **figures):
    library = "linrnn" if op in registry.OPS else peers.PEERS[op].library
    return dict(op=op, library=library, family=registry.OPS[peers.like_of(op)].family,
                mode=mode if library == "linrnn" else None, chunk_requested=chunk_requested,
                shape=shape, dtype="bf16", status=status, suite="heads",
                **figures)  # fmt: skip


def test_engine_targets_take_each_side_fastest_row():
    from linrnn.bench import compare

    big, small = "B1-T64-H2-K256-V256", "B1-T64-H2-K64-V64"
    rows = [
        _heads_row("linear_attn", small, fwd_ms=1.0, fwdbwd_ms=5.0),
        _heads_row("linear_attn", small, "fused_chunk", fwd_ms=1.5, fwdbwd_ms=3.0),
        _heads_row("linear_attn", small, fwd_ms=0.1, fwdbwd_ms=0.2, chunk_requested=256),
        _heads_row("fla:chunk_linear_attn", small, fwd_ms=0.9, fwdbwd_ms=4.5),
        _heads_row("simple_gla", small, fwd_ms=2.0, fwdbwd_ms=6.0),
        _heads_row("fla:chunk_simple_gla", small, fwd_ms=2.2,
                   status="error (first backward): RuntimeError: no"),
        _heads_row("mlstm[sigmoid]", big, fwd_ms=2.0, fwdbwd_ms=8.0, x_floor=4.0),
        _heads_row("mlstm[exp]", big, fwd_ms=2.2, fwdbwd_ms=8.4, x_floor=4.4),
        _heads_row("mlstm_kernels:triton_xl_chunk", big, fwd_ms=3.3, fwdbwd_ms=9.0),
        _heads_row("mlstm_kernels:triton_limit_chunk", big, fwd_ms=2.9, fwdbwd_ms=12.0),
        _heads_row("mlstm[sigmoid]", small, "fused_chunk", status="timeout (150 s)"),
        dict(_heads_row("retention", small, fwd_ms=1.0, fwdbwd_ms=1.0), suite="paper"),
    ]  # fmt: skip
    t = {(t["target"], t["shape"]): t for t in compare.engine_targets(rows)}
    # the fused mode is the faster fwd+bwd, chunk the faster forward; an explicit chunk size
    # is not linrnn's default and takes no part
    la = t[("linear_attn fwd+bwd speed-up", small)]
    assert (la["value"], la["verdict"], la["why"]) == (1.5, "met", "fused_chunk against "
                                                       "fla:chunk_linear_attn")  # fmt: skip
    la = t[("linear_attn fwd speed-up", small)]
    assert la["value"] == pytest.approx(0.9) and la["verdict"] == "missed"
    assert la["why"] == "chunk against fla:chunk_linear_attn"
    # a peer without a backward: no fwd+bwd value, and why; its forward still counts
    sg = t[("simple_gla fwd+bwd speed-up", small)]
    assert sg["value"] is None and sg["verdict"] == "—" and "first backward" in sg["why"]
    assert t[("simple_gla fwd speed-up", small)]["value"] == pytest.approx(1.1)
    # the best peer of several: fwd+bwd from one, the forward from another
    ex = t[("mlstm[exp] fwd+bwd speed-up", big)]
    assert ex["value"] == pytest.approx(9.0 / 8.4)
    assert ex["why"] == "chunk against mlstm_kernels:triton_xl_chunk"
    assert t[("mlstm[exp] fwd speed-up", big)]["why"].endswith("triton_limit_chunk")
    assert t[("mlstm[exp] fwd x floor", big)]["value"] == 4.4  # K = V = 256 only
    assert ("linear_attn fwd x floor", small) not in t
    ratio = t[("mlstm exp / sigmoid", big)]
    assert ratio["value"] == pytest.approx(8.4 / 8.0) and ratio["verdict"] == "met"
    # no peer rows, a row that did not finish, or another suite: no target line
    assert not any(k[0].startswith(("mlstm[sigmoid] fwd", "retention")) and k[1] == small
                   for k in t)  # fmt: skip
    md = report.markdown({"suite": "heads", "bench": rows, "runs": [{"command": "x"}]})
    assert "### engine targets" in md
    assert f"| linear_attn fwd+bwd speed-up | {small} | 1.50 | >= 1.25 | met |" in md
