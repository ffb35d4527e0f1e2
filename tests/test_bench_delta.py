"""linrnn bench and the delta rule, on CPU: the registry entries and fla's delta-rule peers,
shape ids with grouped value heads, the delta-rule FLOP/byte counts by hand, the delta suite's
plan, a tiny run through the harness (PyTorch path), the decode suite with grouped value heads,
the peer ratios and targets of a report, and a worker that ends after an item broke its CUDA
context. With fla-core importable, fla's delta-rule peers agree with linrnn on the same inputs
(its fused recurrent kernels in Triton's interpreter; every peer on a GPU)."""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest
import torch

from linrnn.__main__ import main as linrnn_main
from linrnn.bench import cli, compare, decode, flops, peers, plots, registry, report, worker
from linrnn.selfcheck import run

DELTA_OPS = ("delta_rule", "gated_delta_rule")
DELTA_PEERS = ("fla:chunk_delta_rule", "fla:chunk_gated_delta_rule",
               "fla:fused_recurrent_gated_delta_rule[seq]")  # fmt: skip


def run_cli(tmp_path, *argv):
    out = tmp_path / "report.json"
    code = linrnn_main(["bench", "--quiet", "--device", "cpu", "--out", str(out), *argv])
    return code, (json.loads(out.read_text()) if out.exists() else None)


# --- registry and shapes --------------------------------------------------------------------


def test_delta_ops_and_peers_registered():
    for name in DELTA_OPS:
        op = registry.OPS[name]
        assert op.family == name and registry.resolve_op(name) is op
        assert op.kernel_modes() == ("chunk", "recurrent") and not op.triton  # not fused_chunk
        assert op.grouped and op.chunk_default == 64 and op.form == "delta"
        assert op.dtype_gates == ("beta",)
        assert registry.selfcheck_variant(name).options == {"use_qk_l2norm": True}
        assert registry.backend_for(op, "chunk", "cuda") == "triton"
        assert registry.backend_for(op, "recurrent", "cuda") == "triton"
        assert registry.backend_for(op, "fused_chunk", "cuda") is None
        assert registry.backend_for(op, "parallel", "cuda") == "torch"
        assert registry.backend_for(op, "chunk", "cpu") == "torch"
        # fla's chunk length, not the scalar engine's 128 at head dim 128, on both backends
        assert registry.default_chunk("triton", "chunk", 128, 128, op) == 64
        assert registry.default_chunk("torch", "chunk", 256, 256, op) == 64
    assert registry.OPS["delta_rule"].grad_names == ("beta",)
    assert registry.OPS["gated_delta_rule"].grad_names == ("g", "beta")
    assert registry.default_chunk("triton", "chunk", 128, 128, registry.OPS["gla"]) == 128
    like = {n: (p.like, p.kind, p.grouped, p.backward) for n, p in peers.PEERS.items()}
    assert like["fla:chunk_delta_rule"] == ("delta_rule", "ops", "repeat", True)
    assert like["fla:chunk_gated_delta_rule"] == ("gated_delta_rule", "ops", "native", True)
    assert like["fla:fused_recurrent_gated_delta_rule[seq]"] == (
        "gated_delta_rule", "ops", "native", False)  # fmt: skip
    assert like["fla:fused_recurrent_delta_rule"] == ("delta_rule", "decode", "repeat", True)
    assert like["fla:fused_recurrent_gated_delta_rule"][:3] == (
        "gated_delta_rule", "decode", "native")  # fmt: skip
    assert all(p.grouped == "no" for n, p in peers.PEERS.items()
               if "delta" not in n and p.like != "mamba2")  # fmt: skip


def test_shape_ids_old_and_new_form():
    old = registry.parse_shape("B8-T8192-H16-K256-V256")
    assert old == {"B": 8, "T": 8192, "H": 16, "HV": 16, "K": 256, "V": 256}
    assert not registry.grouped(old)
    new = registry.parse_shape("B8-T8192-H16-HV32-K128-V128")
    assert new == {"B": 8, "T": 8192, "H": 16, "HV": 32, "K": 128, "V": 128}
    assert registry.grouped(new)
    assert registry.parse_shape("B1-T5-H4-HV4-K8-V8")["HV"] == 4  # explicit HV = H
    assert registry.shape_id(8, 8192, 16, 128, 128, HV=32) == "B8-T8192-H16-HV32-K128-V128"
    assert registry.shape_id(8, 8192, 16, 128, 128, HV=16) == "B8-T8192-H16-K128-V128"
    assert registry.shape_id(8, 8192, 16, 128, 128) == "B8-T8192-H16-K128-V128"
    for sid in registry.DELTA_SHAPES:
        s = registry.parse_shape(sid)
        assert registry.shape_id(s["B"], s["T"], s["H"], s["K"], s["V"], s["HV"]) == sid
    # the plots' line per head configuration keeps the value heads apart
    assert plots.heads_of("B8-T8192-H16-HV32-K128-V128") == "H16-HV32-K128-V128"
    assert plots.heads_of("B4-T16384-H16-K128-V128") == "H16-K128-V128"


@pytest.mark.parametrize(
    "sid, message",
    [("B8-T8192-H16-HV24-K128-V128", "HV=24 value heads is no multiple of H=16"),
     ("B8-T8192-H16-HV0-K128-V128", "not of the form"),
     ("B8-T8192-HV32-H16-K128-V128", "not of the form"),
     ("B8-T8192-H16-HV-K128-V128", "not of the form"),
     ("B8-T8192-H16-K128", "not of the form")],
)  # fmt: skip
def test_shape_id_errors(sid, message):
    with pytest.raises(ValueError, match=message):
        registry.parse_shape(sid)


def test_inputs_with_grouped_value_heads():
    shape = registry.parse_shape("B2-T5-H2-HV4-K8-V6")
    (q, k, v, g, beta), kwargs = registry.make_inputs("gated_delta_rule", shape, 0, "cpu")
    assert kwargs == {}
    assert q.shape == k.shape == (2, 5, 2, 8) and v.shape == (2, 5, 4, 6)
    assert g.shape == beta.shape == (2, 5, 4) and g.dtype == beta.dtype == torch.float32
    assert (g <= 0).all() and ((beta > 0) & (beta < 1)).all()
    args, _, needs_grad = registry.bench_inputs("gated_delta_rule", shape, "bf16", 0, "cpu")
    assert [x.dtype for x in args] == [torch.bfloat16] * 3 + [torch.float32, torch.bfloat16]
    assert all(needs_grad) and all(x.requires_grad for x in args)
    (_, _, _, beta16), _, _ = registry.bench_inputs("delta_rule", shape, "bf16", 0, "cpu")
    assert beta16.dtype == torch.bfloat16
    with pytest.raises(ValueError, match="takes no grouped value heads"):
        registry.make_inputs("simple_gla", shape, 0, "cpu")


# --- counts ---------------------------------------------------------------------------------


def test_delta_flops_and_bytes_by_hand():
    # per chunk and value head, L = 64, K = V = 128, F_c = ½:
    #   L²·F_c·(2K + 2V + 4) = 2048 · 516                  = 1,056,768
    #   L³/3 = 262,144 / 3                                 =    87,381.33…
    #   L·(6KV + 2K + 2V + 2) = 64 · 98,818                = 6,324,352
    #   KV                                                 =    16,384
    per_value_head = 1_056_768 + 262_144 / 3 + 6_324_352 + 16_384
    assert flops.delta_chunk_flops_per_chunk(64, 128, 128) == pytest.approx(per_value_head)
    # the Gram matrices per q/k head: L²·F_c·4K = 2048 · 512 = 1,048,576
    assert flops.delta_gram_flops_per_chunk(64, 128) == 1_048_576
    # B=8, T=8192 (128 chunks), H=16, HV=32
    total = 8 * 128 * (16 * 1_048_576 + 32 * per_value_head)
    assert flops.delta_chunkwise_flops(8, 8192, 16, 128, 128, 64, HV=32) == pytest.approx(total)
    assert flops.forward_flops("chunk", 8, 8192, 16, 128, 128, 64, HV=32, form="delta") == (
        flops.delta_chunkwise_flops(8, 8192, 16, 128, 128, 64, HV=32)
    )
    # T = 100, L = 64: a chunk of 64 and one of 36 steps
    assert flops.delta_chunkwise_flops(1, 100, 1, 4, 4, 64) == pytest.approx(
        sum(flops.delta_gram_flops_per_chunk(n, 4) + flops.delta_chunk_flops_per_chunk(n, 4, 4)
            for n in (64, 36))
    )  # fmt: skip
    # recurrent, K = V = 4, HV = 2: 2·(7·16 + 2·4 + 3·4) = 264 per step
    assert flops.delta_recurrent_flops(1, 1, 1, 4, 4, HV=2) == 264
    # floor with grouped value heads, bf16, g fp32 + β bf16 = 1.5 fp32 values per value head:
    #   B·T·[2·(2·16·128 + 2·32·128) + 4·32·1.5] = 65,536 · 24,768
    assert flops.min_bytes(8, 8192, 16, 128, 128, 2, 1.5, HV=32) == 65_536 * 24_768
    assert flops.min_bytes(8, 8192, 16, 128, 128, 2, 1.5, HV=16) == flops.min_bytes(
        8, 8192, 16, 128, 128, 2, 1.5)  # fmt: skip
    # decode: + the fp32 state read and written, 2·B·HV·K·V·4
    assert flops.min_bytes(1, 1, 1, 4, 4, 2, 0, True, True, HV=2) == 2 * (8 + 16) + 2 * 2 * 64
    # delta chunk bytes, L = 64, K = V = 128, bf16, 1.5 gates:
    #   2·64·512 + 8·4096 + 2·2·64·256 + 2·2·64·128 + 8·16,384 + 4·1.5·64
    #   = 65,536 + 32,768 + 65,536 + 32,768 + 131,072 + 384 = 328,064
    assert flops.delta_chunk_bytes_per_chunk(64, 128, 128, 2, 1.5) == 328_064
    assert flops.algorithm_bytes("chunk", 1, 128, 1, 128, 128, 64, 2, 1.5, HV=2,
                                 form="delta") == 2 * 2 * 328_064  # fmt: skip
    # fwd+bwd floor with HV: + B·T·[elt·(2HK + 2HV·V) + elt·(2HK + HV·V) + 8·HV·g]
    assert flops.min_bytes_fwdbwd(1, 1, 1, 4, 4, 2, 0, HV=2) == 2 * (8 + 16) + 2 * (
        8 + 16) + 2 * (8 + 8)  # fmt: skip
    fig = flops.case_figures("chunk", registry.parse_shape("B8-T8192-H16-HV32-K128-V128"), 64,
                             2, 1.5, 2.0, 6.0, flops.gpu_spec("H100"), form="delta")  # fmt: skip
    assert fig["fwd_flops"] == pytest.approx(total) and fig["min_bytes"] == 65_536 * 24_768
    assert fig["floor_ms"] == pytest.approx(1e3 * max(65_536 * 24_768 / 3.35e12, total / 989e12))
    with pytest.raises(ValueError, match="no delta-rule count"):
        flops.forward_flops("fused_chunk", 1, 8, 1, 4, 4, 4, form="delta")


# --- plan -----------------------------------------------------------------------------------


def test_delta_suite_plan(capsys):
    assert linrnn_main(["bench", "--suite", "delta", "--plan"]) == 0
    text = capsys.readouterr().out
    assert "plan: suite delta on cuda: 5 cases, 20 items" in text
    shapes = " ".join(registry.DELTA_SHAPES)
    assert shapes == ("B8-T8192-H16-K128-V128 B8-T8192-H16-HV32-K128-V128 "
                      "B32-T2048-H16-K128-V128 B4-T16384-H16-K128-V128")  # fmt: skip
    for line in (f"delta_rule chunk triton L=default: {shapes}",
                 f"gated_delta_rule chunk triton L=default: {shapes}",
                 f"fla:chunk_delta_rule - - L=64: {shapes}",
                 f"fla:chunk_gated_delta_rule - - L=64: {shapes}",
                 f"fla:fused_recurrent_gated_delta_rule[seq] - - L=default (forward only): "
                 f"{shapes}"):  # fmt: skip
        assert line in text, line
    assert "--ops linrnn, then --ops peers" in text  # the suite's note: how to split it
    assert linrnn_main(["bench", "--suite", "delta", "--plan", "--ops", "peers"]) == 0
    assert "3 cases, 12 items" in capsys.readouterr().out
    assert linrnn_main(["bench", "--suite", "delta", "--plan", "--ops", "linrnn"]) == 0
    assert "2 cases, 8 items" in capsys.readouterr().out


def test_plans_of_the_other_suites_with_the_delta_rule(capsys):
    # decode: the delta ops at a third shape with grouped value heads, beside fla's steps
    assert linrnn_main(["bench", "--suite", "decode", "--plan", "--ops", "delta_rule",
                        "gated_delta_rule", "fla:fused_recurrent_delta_rule",
                        "fla:fused_recurrent_gated_delta_rule"]) == 0  # fmt: skip
    text = capsys.readouterr().out
    assert "4 cases, 12 items" in text and "B64-T1-H16-HV32-K128-V128" in text
    # an ops sweep at a grouped shape: only the ops and peers that take grouped value heads
    assert linrnn_main(["bench", "--plan", "--modes", "chunk", "--shapes",
                        "B1-T64-H2-HV4-K16-V16"]) == 0  # fmt: skip
    text = capsys.readouterr().out
    ran = [line.split()[0] for line in text.splitlines()[1:] if not line.strip().startswith(
        "note")]  # fmt: skip
    mamba2 = ["mamba_ssm:mamba_chunk_scan_combined", "fla:chunk_simple_gla[mamba2]"]
    assert ran == ["delta_rule", "gated_delta_rule", "mamba2", *DELTA_PEERS, *mamba2]
    assert "simple_gla: no grouped value heads, skipped B1-T64-H2-HV4-K16-V16" in text
    # the engine's sweeps run as before, without the delta rule
    assert linrnn_main(["bench", "--suite", "paper", "--plan", "--ops", "delta_rule"]) == 0
    assert "0 cases, 0 items" in capsys.readouterr().out
    assert linrnn_main(["bench", "--suite", "varlen", "--plan", "--ops", "gated_delta_rule"]) == 0
    assert "gated_delta_rule chunk triton L=default: B1-T65536" in capsys.readouterr().out


# --- runs on CPU ----------------------------------------------------------------------------


def test_tiny_delta_suite_run_on_cpu(tmp_path, capsys):
    code, rep = run_cli(tmp_path, "--suite", "delta", "--repeats", "1")
    assert code == 0
    text = capsys.readouterr().out
    assert "delta-rule targets:" in text and "gate cost" in text
    rows = rep["bench"]
    assert [(r["op"], r["shape"]) for r in rows] == [
        (op, s) for op in DELTA_OPS for s in ("B1-T64-H2-K16-V16", "B1-T64-H2-HV4-K16-V16")
    ]
    for r in rows:
        assert r["status"] == "ok", r
        assert r["backend"] == "torch" and r["mode"] == "chunk" and r["chunk"] == 64
        assert r["fwd_ms"] > 0 and r["fwdbwd_ms"] > 0 and r["first_call_s"] > 0
        s = registry.parse_shape(r["shape"])
        assert r["fwd_flops"] == flops.delta_chunkwise_flops(1, 64, 2, 16, 16, 64, HV=s["HV"])
        gates = 1 if r["op"] == "delta_rule" else 2  # β (fp32 here: 4 bytes), and g
        assert r["min_bytes"] == flops.min_bytes(1, 64, 2, 16, 16, 4, gates, HV=s["HV"])
    md = (tmp_path / "report.md").read_text()
    assert "### delta-rule targets" in md and "### delta_rule" in md


def test_delta_ops_through_the_harness_match_the_reference():
    """What the harness times is the op: its output on the bench inputs equals the fp64
    step-by-step reference (q, k normalized in the op, grouped value heads)."""
    shape = registry.parse_shape("B1-T40-H2-HV4-K8-V8")
    for name in DELTA_OPS:
        case = dict(op=name, dtype="fp32", seed=0, device="cpu", mode="chunk", backend="torch",
                    chunk=16)  # fmt: skip
        leaves, fwd = registry.build_linrnn(case, shape)
        o = fwd()
        args, kwargs = registry.make_inputs(name, shape, 0, "cpu")
        ref, _ = run(registry.selfcheck_variant(name), tuple(x.double() for x in args), kwargs,
                     mode="reference")  # fmt: skip
        assert o.shape == (1, 40, 4, 8)
        torch.testing.assert_close(o.double(), ref, rtol=1e-5, atol=1e-5)
        grads = torch.autograd.grad(o.sum(), leaves)
        assert [g.shape for g in grads] == [x.shape for x in leaves] and len(leaves) == 3 + (
            1 if name == "delta_rule" else 2)  # fmt: skip


def test_decode_suite_with_grouped_value_heads_on_cpu(tmp_path):
    code, rep = run_cli(tmp_path, "--suite", "decode", "--ops", *DELTA_OPS, "--shapes",
                        "B2-T1-H2-K8-V8", "B2-T1-H2-HV4-K8-V8", "--steps", "3",
                        "--repeats", "1")  # fmt: skip
    assert code == 0
    rows = rep["bench"]
    assert [(r["op"], r["shape"]) for r in rows] == [
        (op, s) for op in DELTA_OPS for s in ("B2-T1-H2-K8-V8", "B2-T1-H2-HV4-K8-V8")
    ]
    for r in rows:
        assert r["status"] == "ok", r
        HV = registry.parse_shape(r["shape"])["HV"]
        assert r["state_bytes_step"] == 2 * 2 * HV * 8 * 8 * 4
        assert r["fwd_flops"] == flops.delta_recurrent_flops(2, 1, 2, 8, 8, HV)
        assert r["err_vs_torch_fp32"] < 1e-6


# --- ratios and targets ---------------------------------------------------------------------


def fake(op, shape="B1-T64-H2-K16-V16", status="ok", **figures):
    library = "linrnn" if op in registry.OPS else peers.PEERS[op].library
    mode = "chunk" if library == "linrnn" else None
    family = registry.OPS[peers.like_of(op)].family
    return dict(op=op, library=library, family=family, mode=mode, chunk_requested=None,
                chunk=64, shape=shape, dtype="bf16", status=status, first_in_process=True,
                **figures)  # fmt: skip


def test_peer_ratios_and_delta_targets():
    S1 = "B1-T64-H2-K16-V16"
    rows = [
        fake("delta_rule", fwd_ms=1.0, fwdbwd_ms=4.0, peak_fwdbwd_mib=100, first_call_s=20),
        fake("gated_delta_rule", fwd_ms=1.5, fwdbwd_ms=5.0, peak_fwdbwd_mib=90,
             first_call_s=40),
        fake("fla:chunk_delta_rule", fwd_ms=2.0, fwdbwd_ms=6.0, peak_fwdbwd_mib=80,
             first_call_s=41),
        fake("fla:chunk_gated_delta_rule", status="error (first backward): RuntimeError: no",
             fwd_ms=2.4, first_fwd_s=43.0),
        fake("fla:fused_recurrent_gated_delta_rule[seq]", status="aborted: signal 6"),
    ]  # fmt: skip
    ratios = {e["peer"]: e for e in compare.peer_ratios(rows)}
    assert set(ratios) == set(DELTA_PEERS)
    delta = ratios["fla:chunk_delta_rule"]
    assert delta["op"] == "delta_rule"
    assert delta["fwd_speedup"] == 2.0 and delta["fwdbwd_speedup"] == 1.5
    assert delta["peak_ratio"] == pytest.approx(100 / 80)
    assert (delta["first_call"], delta["peer_first_call"]) == ("20.0", "41.0")
    gated = ratios["fla:chunk_gated_delta_rule"]
    assert gated["fwd_speedup"] == pytest.approx(2.4 / 1.5) and gated["fwdbwd_speedup"] is None
    assert gated["peer_first_call"] == "43.0f"  # its backward failed: the forward's first call
    targets = {(t["target"], t["shape"]): t for t in compare.delta_targets(rows)}
    assert targets[("delta fwd+bwd speed-up", S1)]["verdict"] == "met"  # 1.5 ≥ 1.3
    assert targets[("delta peak memory", S1)]["verdict"] == "missed"  # 1.25 > 1
    assert targets[("gated fwd speed-up", S1)]["value"] == pytest.approx(1.6)
    assert targets[("gate cost", S1)]["value"] == 1.25
    assert targets[("gate cost", S1)]["verdict"] == "missed"
    assert targets[("first call", "B1-T64-H2-K16-V16 (delta_rule)")]["verdict"] == "met"
    assert targets[("first call", "B1-T64-H2-K16-V16 (gated_delta_rule)")]["verdict"] == "missed"
    # a peer that did not finish: no value, and why
    rows[2] = fake(
        "fla:chunk_delta_rule",
        status="timeout (300 s) in first forward",
        first_call_s_at_least=12.0,
    )
    t = {(t["target"], t["shape"]): t for t in compare.delta_targets(rows)}
    assert t[("delta fwd+bwd speed-up", S1)]["verdict"] == "—"
    assert "timeout" in t[("delta fwd+bwd speed-up", S1)]["why"]
    t = {(t["target"], t["shape"]): t for t in compare.delta_targets(rows[:2])}
    assert t[("delta fwd+bwd speed-up", S1)]["why"] == "no fla:chunk_delta_rule row"
    # decode rows: the CUDA graph's step against the memory floor
    step = fake("gated_delta_rule", shape="B2-T1-H2-K8-V8", step_ms=0.1, graph_x_floor=1.1)
    (t,) = compare.delta_targets([dict(step, mode="recurrent")])
    assert (t["target"], t["value"], t["verdict"]) == ("decode", 1.1, "met")
    # both tables in the report's Markdown
    md = report.markdown({"suite": "delta", "bench": rows, "runs": [{"command": "x"}]})
    assert "### linrnn against its peers" in md and "### delta-rule targets" in md
    assert f"| delta_rule | fla:chunk_delta_rule | {S1} | — | — | — | 20.0 | >12.0 | timeout" in md
    assert f"| gated_delta_rule | fla:chunk_gated_delta_rule | {S1} | 1.60 | — |" in md


# --- the worker -----------------------------------------------------------------------------

FAKE_WORKER = """
import json, sys
MARK = "@@linrnn_bench@@ "
case = json.loads(sys.argv[-1])
for item in case["items"]:
    print(MARK + json.dumps({"event": "start", "item": item}), flush=True)
    row = {"status": "ok", "items_in_process": len(case["items"])}
    print(MARK + json.dumps({"event": "row", "item": item, "row": row}), flush=True)
    if item["do"] == "break":
        sys.exit(75)
"""


def test_a_worker_that_ends_between_items_leaves_the_rest_to_a_new_one():
    """A worker ending after a finished row (an item broke its CUDA context) is no failure of
    the items after it: they run in a new worker."""
    items = [{"do": "ok"}, {"do": "break"}, {"do": "ok", "n": 2}, {"do": "ok", "n": 3}]
    rows = worker.run_items({"task": "x"}, items, 30, worker.worker_env(), False,
                            command=(sys.executable, "-c", FAKE_WORKER))  # fmt: skip
    assert [r["status"] for r in rows] == ["ok"] * 4
    assert [r["items_in_process"] for r in rows] == [4, 4, 2, 2]


def test_serve_exits_after_an_item_breaks_the_cuda_context(monkeypatch, capsys):
    monkeypatch.setattr(worker, "cuda_usable", lambda: False)
    case = {"task": "selftest", "device": "cuda", "items": [{"do": "ok"}, {"do": "ok"}]}
    assert worker.serve(json.dumps(case), cli.tasks()) == worker.BROKEN_CONTEXT
    events = [json.loads(line[len(worker.MARK):]) for line in capsys.readouterr().out.splitlines()
              if line.startswith(worker.MARK)]  # fmt: skip
    assert [e["event"] for e in events if e["event"] != "stage"] == ["start", "row"]


# --- fla's delta-rule peers against linrnn --------------------------------------------------

# fla's chunk kernels do not run in Triton's interpreter, nor its autotuned kernels (no driver
# to time the candidates): without a GPU, its two fused recurrent gated kernels only.
FLA_PEERS_HERE = (
    [*DELTA_PEERS, "fla:fused_recurrent_delta_rule", "fla:fused_recurrent_gated_delta_rule"]
    if torch.cuda.is_available()
    else ["fla:fused_recurrent_gated_delta_rule[seq]", "fla:fused_recurrent_gated_delta_rule"]
)  # fmt: skip


NEEDS_FLA = "needs fla-core (Triton kernels: a GPU or Triton's interpreter)"


@pytest.mark.skipif(importlib.util.find_spec("fla") is None, reason=NEEDS_FLA)
@pytest.mark.parametrize("sid", ["B1-T32-H2-K16-V16", "B1-T32-H2-HV4-K16-V16"])
@pytest.mark.parametrize("name", FLA_PEERS_HERE)
def test_fla_peers_compute_the_linrnn_op(name, sid):
    """The peer gets the linrnn op's inputs with the same meaning (g and β, q and k normalized
    in the kernel, grouped value heads native or by repeating q and k): bf16 outputs within
    bf16 rounding of linrnn's PyTorch recurrence in fp32 on the same inputs."""
    pytest.importorskip("fla.ops.gated_delta_rule")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    shape = registry.parse_shape(sid)
    like = peers.like_of(name)
    if peers.PEERS[name].kind == "decode":
        row = decode.decode_case(
            dict(op=name, dtype="bf16", seed=0, device=device, steps=2, warmup_ms=1, rep_ms=1,
                 cpu_repeats=1, in_process=True, backend=None),
            {"shape": sid.replace("T32", "T1")},
        )  # fmt: skip
        assert row["status"] == "ok", row
        assert row["err_vs_torch_fp32"] < 2e-2
        return
    case = dict(op=name, dtype="bf16", seed=0, device=device)
    _, fwd = peers.build_fla(case, shape)
    o = fwd()
    args, kwargs, _ = registry.bench_inputs(like, shape, "bf16", 0, device)
    args = tuple(x.detach().float() for x in args)
    ref, _ = run(registry.selfcheck_variant(like), args, kwargs, mode="recurrent",
                 backend="torch")  # fmt: skip
    assert o.shape == ref.shape == (1, 32, shape["HV"], 16)
    err = ((o.float() - ref).norm() / ref.norm()).item()
    assert err < 2e-2, err


class _NoBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return 2 * x

    @staticmethod
    def backward(ctx, grad):
        raise NotImplementedError("backward kernels to come")


def test_a_backward_not_implemented_yet_leaves_the_forward_timed():
    """A NotImplementedError in the first backward (a kernel still to come) is "not
    implemented", no failure, and the forward is still timed."""
    from linrnn.bench import timing

    def build(case, shape):
        x = torch.randn(4, 8, requires_grad=True)
        return [x], lambda: _NoBackward.apply(x)

    case = dict(device="cpu", cpu_repeats=1, in_process=True, fwdbwd=True)
    row = timing.bench_case(case, {"shape": "B1-T4-H1-K8-V8"}, build=build)
    assert row["status"] == (
        "not implemented (backward): NotImplementedError: backward kernels to come"
    )
    assert report.ok_status(row["status"]) and row["fwd_ms"] > 0 and "fwdbwd_ms" not in row
