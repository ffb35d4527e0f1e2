"""linrnn bench's decode and varlen suites on CPU (tiny shapes, the PyTorch path): the JSON
rows, tokens/s and byte counts by hand, the document lengths, and that the padded baseline
computes the same valid outputs as the packed call."""

from __future__ import annotations

import json

import pytest
import torch

from linrnn.__main__ import main as linrnn_main
from linrnn.bench import decode, flops, peers, registry, report, varlen


def run_cli(tmp_path, *argv):
    out = tmp_path / "report.json"
    code = linrnn_main(["bench", "--quiet", "--device", "cpu", "--out", str(out), *argv])
    return code, (json.loads(out.read_text()) if out.exists() else None)


def test_suites_and_peers_registered():
    dec, var = registry.SUITES["decode"], registry.SUITES["varlen"]
    assert dec.kind == "decode" and var.kind == "varlen" and var.docs == 8
    gpu = [registry.parse_shape(s) for s in dec.shapes]
    assert {(s["B"], s["T"], s["H"], s["K"]) for s in gpu} == {(64, 1, 16, 256), (64, 1, 64, 64)}
    (packed,) = [registry.parse_shape(s) for s in var.shapes]
    assert packed["B"] == 1 and packed["T"] == 65_536 and packed["H"] == 16 and packed["K"] == 256
    kinds = {name: p.kind for name, p in peers.PEERS.items()}
    assert kinds["fla:fused_recurrent_rwkv6"] == "decode"
    assert kinds["mlstm_kernels:triton_step"] == "decode"
    assert kinds["fla:chunk_simple_gla[varlen]"] == "varlen"
    assert kinds["fla:chunk_gla"] == "ops"


def test_decode_suite_rows_and_tokens_per_second(tmp_path, capsys):
    code, rep = run_cli(tmp_path, "--suite", "decode", "--steps", "3", "--repeats", "1")
    assert code == 0
    text = capsys.readouterr().out
    assert "tokens/s" in text and "state MB" in text
    rows = rep["bench"]
    assert rep["suite"] == "decode" and rep["complete"] is True
    # no CUDA: no fla/mlstm_kernels peers; Mamba2 has a suite of its own
    assert {r["op"] for r in rows} == set(registry.OPS) - {"mamba2"}
    for r in rows:
        assert set(r) >= set(report.ROW_KEYS), set(report.ROW_KEYS) - set(r)
        assert r["status"] == "ok", r
        assert r["backend"] == "torch" and r["steps"] == 3 and r["fwdbwd_ms"] is None
        assert r["step_ms"] == pytest.approx(r["loop_ms"] / 3) and r["fwd_ms"] == r["step_ms"]
        # tokens/s = B / step time; B2-T1-H2-K8-V8: state 2·2·2·8·8·4 = 2048 bytes per step
        assert r["tokens_per_s"] == pytest.approx(2 / (r["step_ms"] * 1e-3))
        assert r["state_bytes_step"] == 2048
        assert r["state_gbps"] == pytest.approx(2048 / (r["step_ms"] * 1e6))
        assert r["err_vs_torch_fp32"] < 1e-6  # the same path, fp32
        assert r["first_call_s"] > 0 and r["x_floor"] is None
    mlstm = next(r for r in rows if r["op"] == "mlstm[exp]")
    assert mlstm["min_bytes"] == flops.min_bytes(2, 1, 2, 8, 8, 4, 2, True, True)


def test_decode_figures_with_a_gpu_spec():
    shape = registry.parse_shape("B64-T1-H16-K256-V256")
    spec = flops.gpu_spec("NVIDIA H100 80GB HBM3")
    fig = decode.figures(shape, 2, 1, step_ms=0.5, spec=spec)
    # 2·64·16·256·256·4 = 536,870,912 bytes of state per step
    assert fig["state_bytes_step"] == 536_870_912
    assert fig["tokens_per_s"] == pytest.approx(64 / 0.5e-3)  # 128,000
    # floor: (state + q, k, v, o in bf16 + one fp32 gate) / 3.35 TB/s
    least = 536_870_912 + 64 * 16 * (2 * (2 * 256 + 2 * 256) + 4)
    assert fig["min_bytes"] == least
    assert fig["floor_ms"] == pytest.approx(1e3 * least / 3.35e12)
    assert fig["x_floor"] == pytest.approx(0.5 / fig["floor_ms"])


def test_doc_lengths_are_seeded_and_sum_to_total():
    lens = varlen.doc_lengths(65_536, 8, seed=0)
    assert len(lens) == 8 and sum(lens) == 65_536 and min(lens) >= 1
    assert lens == varlen.doc_lengths(65_536, 8, seed=0) != varlen.doc_lengths(65_536, 8, 1)
    assert max(lens) < 2 * 65_536 / 8  # weights in [0.2, 1.8): at most 9× the lightest
    assert varlen.doc_lengths(3, 3, 5) == [1, 1, 1]
    assert varlen.offsets([2, 3]) == [0, 2, 5]
    with pytest.raises(ValueError, match="docs"):
        varlen.doc_lengths(2, 3, 0)


@pytest.mark.parametrize(
    "op, sid",
    [("simple_gla", "B1-T40-H2-K8-V8"), ("mlstm[exp]", "B1-T40-H2-K8-V8"),
     ("retention", "B1-T40-H2-K8-V8"), ("delta_rule", "B1-T40-H2-K8-V8"),
     ("gated_delta_rule", "B1-T40-H2-HV4-K8-V8")],
)  # fmt: skip
def test_padded_baseline_matches_packed_on_valid_tokens(op, sid):
    """Right padding (zeros; the delta rule's β = 0 there) leaves every valid output exact."""
    shape = registry.parse_shape(sid)
    lens = varlen.doc_lengths(40, 4, seed=3)
    case = dict(op=op, dtype="fp32", seed=0, device="cpu", mode="chunk", backend="torch",
                chunk=8, lens=lens)  # fmt: skip
    _, packed = varlen.build_linrnn(dict(case, layout="packed"), shape)
    _, padded = varlen.build_linrnn(dict(case, layout="padded"), shape)
    with torch.no_grad():
        o_packed, o_padded = packed(), padded()
    assert o_padded.shape[:2] == (4, max(lens))
    for d, (a, n) in enumerate(zip(varlen.offsets(lens), lens)):
        torch.testing.assert_close(o_padded[d, :n], o_packed[0, a : a + n], rtol=1e-5, atol=1e-5)
        assert o_padded[d, n:].abs().max().item() == 0 if n < max(lens) else True


def test_varlen_suite_rows(tmp_path, capsys):
    code, rep = run_cli(tmp_path, "--suite", "varlen", "--ops", "simple_gla", "mlstm[exp]",
                        "--shapes", "B1-T48-H2-K8-V8", "--docs", "3", "--repeats", "1")  # fmt: skip
    assert code == 0
    assert "padded/packed" in capsys.readouterr().out
    rows = rep["bench"]
    assert [(r["op"], r["layout"]) for r in rows] == [
        ("simple_gla", "packed"), ("simple_gla", "padded"),
        ("mlstm[exp]", "packed"), ("mlstm[exp]", "padded"),
    ]  # fmt: skip
    lens = varlen.doc_lengths(48, 3, 0)
    for r in rows:
        assert r["status"] == "ok", r
        assert r["doc_lengths"] == lens and r["tokens"] == 48 and r["docs"] == 3
        assert r["fwd_ms"] > 0 and r["fwdbwd_ms"] > 0
        assert r["tokens_per_s_fwdbwd"] == pytest.approx(48 / (r["fwdbwd_ms"] * 1e-3))
    packed, padded = rows[0], rows[1]
    assert packed["layout_tokens"] == 48 and padded["layout_tokens"] == 3 * max(lens)
    L = packed["chunk"]
    assert packed["fwd_flops"] == sum(flops.chunkwise_flops(1, n, 2, 8, 8, L) for n in lens)
    assert padded["fwd_flops"] == flops.chunkwise_flops(3, max(lens), 2, 8, 8, L)


def test_varlen_rejects_batched_shapes(capsys):
    with pytest.raises(SystemExit) as exc:
        linrnn_main(["bench", "--suite", "varlen", "--device", "cpu", "--shapes",
                     "B2-T48-H2-K8-V8"])  # fmt: skip
    assert exc.value.code == 2 and "packed batches" in capsys.readouterr().err
