"""linrnn bench and Mamba2, on CPU: the registry entry and its input recipe (groups as q/k
heads), the peers (mamba_ssm's kernel imported without its package __init__, fla's simple GLA on
mapped inputs: the mapping computes Mamba2), the grouped FLOP/byte counts by hand, the mamba2
suite's plan, a tiny run through the harness (PyTorch path), the targets of a report and the
runbook stage. With a GPU and the peer libraries, the peers agree with linrnn on the same
inputs."""

from __future__ import annotations

import importlib.util
import sys

import pytest
import torch
import torch.nn.functional as F
from test_bench_delta import fake, run_cli
from test_bench_runbook import stage

import linrnn
from linrnn.__main__ import main as linrnn_main
from linrnn.bench import compare, flops, peers, registry
from linrnn.selfcheck import MAMBA2_A_RANGE, MAMBA2_DT_RANGE, run

MAMBA2_PEERS = ("mamba_ssm:mamba_chunk_scan_combined", "fla:chunk_simple_gla[mamba2]")
NAMES = ("C", "B", "x", "dt", "A", "D", "dt_bias")  # the bench's argument order


def rel(a, b) -> float:
    a, b = a.detach().double(), b.detach().double()
    return (torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b)).item()


# --- registry, shapes and inputs ------------------------------------------------------------


def test_mamba2_op_peers_and_suite_registered():
    op = registry.OPS["mamba2"]
    assert registry.resolve_op("mamba2") is op and op.family == "mamba2"
    assert op.grad_names == ("dt", "A", "D", "dt_bias") and op.dtype_gates == ("dt",)
    assert op.grouped and op.triton and op.form == "scalar" and op.chunk_default is None
    assert op.kernel_modes() == ("chunk", "fused_chunk")
    assert registry.backend_for(op, "chunk", "cuda") == "triton"
    assert registry.backend_for(op, "chunk", "cpu") == "torch"
    assert registry.default_chunk("triton", "chunk", 128, 64, op) == 128  # the engine's rule
    assert registry.selfcheck_variant("mamba2").options == {"dt_softplus": True}
    ssm, fla = (peers.PEERS[n] for n in MAMBA2_PEERS)
    assert (ssm.library, ssm.like, ssm.chunk, ssm.grouped, ssm.kind) == (
        "mamba_ssm", "mamba2", 256, "native", "ops")  # fmt: skip
    assert (fla.library, fla.like, fla.chunk, fla.grouped) == ("fla", "mamba2", 64, "repeat")
    assert "not timed" in fla.note and "LINRNN_MAMBA_SSM_SRC" in ssm.note
    assert peers.BUILDERS["mamba_ssm"] is peers.build_mamba_ssm
    suite = registry.SUITES["mamba2"]
    assert suite.families == ("mamba2",) and suite.modes == ("chunk",) and suite.peers
    # the paper's 65,536 tokens at width H·P = 4096, G = 1; and H = 32, G = 8 at B8-T8192
    assert suite.shapes == ("B32-T2048-H1-HV64-K128-V64", "B8-T8192-H1-HV64-K128-V64",
                            "B4-T16384-H1-HV64-K128-V64", "B8-T8192-H8-HV32-K128-V64")  # fmt: skip
    for sid in suite.shapes[:3]:
        s = registry.parse_shape(sid)
        assert s["B"] * s["T"] == 65_536 and s["HV"] * s["V"] == 4096 and registry.grouped(s)
    assert registry.parse_shape(suite.shapes[3]) == {"B": 8, "T": 8192, "H": 8, "HV": 32,
                                                     "K": 128, "V": 64}  # fmt: skip
    for name in ("decode", "varlen", "paper", "heads", "headdim", "chunksize", "delta"):
        assert not registry.SUITES[name].runs_family("mamba2"), name
    assert registry.SUITES["quick"].runs_family("mamba2")


def test_mamba2_inputs_follow_the_mamba2_initialization():
    shape = registry.parse_shape("B2-T300-H2-HV6-K16-V8")  # G = 2 groups of 3 heads
    (C, B, x, dt, A, D, dt_bias), kwargs = registry.make_inputs("mamba2", shape, 3, "cpu")
    assert kwargs == {}
    assert C.shape == B.shape == (2, 300, 2, 16) and x.shape == (2, 300, 6, 8)
    assert dt.shape == (2, 300, 6) and A.shape == D.shape == dt_bias.shape == (6,)
    delta = F.softplus(dt + dt_bias)
    lo, hi = MAMBA2_DT_RANGE
    assert lo * 0.999 <= delta.min() and delta.max() <= hi * 1.001
    assert delta.log().std() > 0.5  # log-uniform over two decades, not one value
    bias_delta = F.softplus(dt_bias)  # the per-head initialization itself
    assert ((bias_delta >= lo * 0.999) & (bias_delta <= hi * 1.001)).all()
    assert ((-A >= MAMBA2_A_RANGE[0]) & (-A <= MAMBA2_A_RANGE[1])).all()
    args, _, needs_grad = registry.bench_inputs("mamba2", shape, "bf16", 3, "cpu")
    assert [a.dtype for a in args] == [torch.bfloat16] * 4 + [torch.float32] * 3
    assert all(needs_grad) and all(a.requires_grad for a in args)


def test_mamba2_through_the_harness_matches_the_reference():
    """What the harness times is Mamba2 (C = q, B = k with G groups, x = v, D and dt_bias):
    its output on the bench inputs equals the fp64 reference loop on the same tensors, and the
    backward reaches all seven inputs."""
    shape = registry.parse_shape("B1-T40-H2-HV4-K8-V8")
    case = dict(op="mamba2", dtype="fp32", seed=0, device="cpu", mode="chunk", backend="torch",
                chunk=16)  # fmt: skip
    leaves, fwd = registry.build_linrnn(case, shape)
    o = fwd()
    a = dict(zip(NAMES, (t.detach().double() for t in leaves)))
    ref, _ = linrnn.mamba2(a["x"], a["dt"], a["A"], a["B"], a["C"], D=a["D"],
                           dt_bias=a["dt_bias"], dt_softplus=True, mode="reference")  # fmt: skip
    assert o.shape == (1, 40, 4, 8)
    torch.testing.assert_close(o.double(), ref, rtol=1e-5, atol=1e-5)
    grads = torch.autograd.grad(o.sum(), leaves)
    assert len(leaves) == 7 and [g.shape for g in grads] == [t.shape for t in leaves]
    assert all(bool(torch.isfinite(g).all()) and g.abs().sum() > 0 for g in grads)


def test_fla_mapping_computes_mamba2_without_its_skip_term():
    """The fla peer's inputs (q = C, k = B repeated to the heads, v = x·Δ, g = Δ·A, scale 1)
    make simple GLA compute Mamba2's C_tᵀ h_t (here through linrnn.simple_gla)."""
    shape = registry.parse_shape("B2-T50-H2-HV4-K16-V8")
    args, _, _ = registry.bench_inputs("mamba2", shape, "fp32", 1, "cpu")
    q, k, v, g = peers.mamba2_as_simple_gla(args, shape)
    assert q.shape == k.shape == (2, 50, 4, 16) and v.shape == (2, 50, 4, 8)
    assert g.shape == (2, 50, 4) and g.dtype == torch.float32 and (g < 0).all()
    assert all(t.is_leaf and t.requires_grad for t in (q, k, v, g))
    torch.testing.assert_close(q[:, :, 1], args[0][:, :, 0].detach())  # head 1 reads group 0
    o, _ = linrnn.simple_gla(q, k, v, g, scale=1.0, mode="reference")
    a = dict(zip(NAMES, (t.detach().double() for t in args)))
    ref, _ = linrnn.mamba2(a["x"], a["dt"], a["A"], a["B"], a["C"], dt_bias=a["dt_bias"],
                           dt_softplus=True, mode="reference")  # fmt: skip
    assert rel(o, ref) < 1e-5
    # v = x·Δ in x's dtype: bf16 inputs give bf16 values, and the same recurrence to bf16
    args16, _, _ = registry.bench_inputs("mamba2", shape, "bf16", 1, "cpu")
    q, k, v, g = peers.mamba2_as_simple_gla(args16, shape)
    assert (q.dtype, k.dtype, v.dtype, g.dtype) == (torch.bfloat16,) * 3 + (torch.float32,)
    o16, _ = linrnn.simple_gla(q.float(), k.float(), v.float(), g, scale=1.0, mode="reference")
    a = dict(zip(NAMES, (t.detach().double() for t in args16)))
    ref16, _ = linrnn.mamba2(a["x"], a["dt"], a["A"], a["B"], a["C"], dt_bias=a["dt_bias"],
                             dt_softplus=True, mode="reference")  # fmt: skip
    assert rel(o16, ref16) < 1e-2


# --- mamba_ssm without its package __init__ -------------------------------------------------

SSD_STUB = "def mamba_chunk_scan_combined(*args, **kwargs):\n    return 'stub'\n"


def fake_mamba_ssm(root, init_text: str):
    """A mamba_ssm source tree under ``root``: an ``__init__`` with ``init_text`` and a stub
    ``ops/triton/ssd_combined.py``."""
    package = root / "mamba_ssm"
    (package / "ops" / "triton").mkdir(parents=True)
    (package / "__init__.py").write_text(init_text)
    for sub in ("ops", "ops/triton"):
        (package / sub / "__init__.py").write_text("")
    (package / "ops" / "triton" / "ssd_combined.py").write_text(SSD_STUB)
    return package


@pytest.fixture
def no_mamba_ssm_modules(monkeypatch):
    """The test's mamba_ssm modules leave sys.modules afterwards (and none are there before)."""
    for name in [n for n in sys.modules if n.split(".")[0] == "mamba_ssm"]:
        monkeypatch.delitem(sys.modules, name)
    yield
    for name in [n for n in sys.modules if n.split(".")[0] == "mamba_ssm"]:
        del sys.modules[name]


def test_mamba_ssm_from_a_source_folder_without_its_init(tmp_path, monkeypatch,
                                                         no_mamba_ssm_modules):  # fmt: skip
    package = fake_mamba_ssm(tmp_path, '__version__ = "2.3.2.post1"\n'
                                       "import selective_scan_cuda_missing\n")  # fmt: skip
    monkeypatch.delenv(peers.MAMBA_SSM_SRC, raising=False)
    installed = importlib.util.find_spec("mamba_ssm") is not None
    assert peers.available("mamba_ssm") == installed and peers.mamba_ssm_source() is None
    monkeypatch.setenv(peers.MAMBA_SSM_SRC, str(tmp_path / "elsewhere"))
    assert peers.mamba_ssm_source() is None  # no mamba_ssm/__init__.py there
    monkeypatch.setenv(peers.MAMBA_SSM_SRC, str(tmp_path))
    assert peers.available("mamba_ssm") and peers.mamba_ssm_source() == package
    assert peers.mamba_ssm_version() == "2.3.2.post1"  # read, not imported
    ssd = peers.mamba_ssm_ssd()
    assert ssd.mamba_chunk_scan_combined() == "stub"
    assert ssd.__file__ == str(package / "ops" / "triton" / "ssd_combined.py")
    assert not hasattr(sys.modules["mamba_ssm"], "__version__")  # its __init__ never ran
    assert peers.mamba_ssm_ssd() is ssd


def test_an_installed_mamba_ssm_whose_import_fails(tmp_path, monkeypatch, no_mamba_ssm_modules):
    """Without the variable, the installed package; when its ``__init__`` raises ImportError
    (no CUDA extension), the kernels from the same folder without it."""
    package = fake_mamba_ssm(tmp_path, "import selective_scan_cuda_missing\n")
    monkeypatch.delenv(peers.MAMBA_SSM_SRC, raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert peers.available("mamba_ssm")
    assert peers.mamba_ssm_ssd().mamba_chunk_scan_combined() == "stub"
    assert sys.modules["mamba_ssm"].__path__ == [str(package)]


# --- counts ---------------------------------------------------------------------------------


def test_grouped_scalar_flops_and_bytes_by_hand():
    # per chunk, L = 64, K = 128, V = 64, F_c = ½: F = 2048·(256 + 128 + 6) + 4096
    #   + 64·(4·8192 + 256 + 64 + 11) + 2·8192 + 5 = 798,720 + 4096 + 2,118,336 + 16,389
    F64 = 798_720 + 4096 + 2_118_336 + 16_389
    assert flops.chunk_flops_per_chunk(64, 128, 64) == F64
    gram = 64 * 64 * 0.5 * 2 * 128  # Q Kᵀ: 524,288, once per q/k head
    # B=2, T=128 (2 chunks), H=1 group, HV=4 heads
    total = 2 * 2 * (1 * gram + 4 * (F64 - gram))
    assert flops.chunkwise_flops(2, 128, 1, 128, 64, 64, HV=4) == total
    assert flops.forward_flops("chunk", 2, 128, 1, 128, 64, 64, HV=4) == total
    assert flops.chunkwise_flops(2, 128, 4, 128, 64, 64, HV=4) == flops.chunkwise_flops(
        2, 128, 4, 128, 64, 64)  # fmt: skip
    # recurrent and parallel per value head (parallel: Q Kᵀ per q/k head)
    assert flops.recurrent_flops(1, 1, 1, 4, 4, HV=2) == 2 * 92
    assert flops.parallel_flops(1, 4, 1, 2, 2, HV=2) == 8 * 4 + 2 * (8 * 10 + 16)
    assert flops.parallel_flops(1, 4, 1, 2, 2, HV=1) == flops.parallel_flops(1, 4, 1, 2, 2)
    # chunk bytes per value head: 3·2·64·192 + 4·0.5·64 + 2·4·8192 = 139,264 per chunk
    per = 3 * 2 * 64 * 192 + 4 * 0.5 * 64 + 2 * 4 * 8192
    assert flops.chunk_bytes_per_chunk(64, 128, 64, 2, 0.5) == per
    assert flops.algorithm_bytes("chunk", 2, 128, 1, 128, 64, 64, 2, 0.5, HV=4) == 2 * 4 * 2 * per


# --- plan and a tiny run --------------------------------------------------------------------


def test_mamba2_suite_plan(capsys):
    assert linrnn_main(["bench", "--suite", "mamba2", "--plan"]) == 0
    text = capsys.readouterr().out
    shapes = " ".join(registry.SUITES["mamba2"].shapes)
    assert "plan: suite mamba2 on cuda: 3 cases, 12 items" in text
    for line in (f"mamba2 chunk triton L=default: {shapes}",
                 f"mamba_ssm:mamba_chunk_scan_combined - - L=256: {shapes}",
                 f"fla:chunk_simple_gla[mamba2] - - L=64: {shapes}"):  # fmt: skip
        assert line in text, line
    assert "--ops linrnn, then --ops peers" in text
    assert linrnn_main(["bench", "--suite", "mamba2", "--plan", "--ops", "peers"]) == 0
    assert "2 cases, 8 items" in capsys.readouterr().out
    assert linrnn_main(["bench", "--suite", "mamba2", "--plan", "--ops", "mamba_ssm"]) == 0
    assert "1 cases, 4 items" in capsys.readouterr().out


def test_tiny_mamba2_suite_run_on_cpu(tmp_path, capsys):
    code, rep = run_cli(tmp_path, "--suite", "mamba2", "--repeats", "1")
    assert code == 0
    text = capsys.readouterr().out
    assert "Mamba2 targets:" in text and "first call" in text
    rows = rep["bench"]
    cpu_shapes = registry.SUITES["mamba2"].cpu_shapes
    assert [(r["op"], r["shape"]) for r in rows] == [("mamba2", s) for s in cpu_shapes]
    for r in rows:
        assert r["status"] == "ok", r
        assert r["backend"] == "torch" and r["mode"] == "chunk" and r["chunk"] == 64
        assert r["fwd_ms"] > 0 and r["fwdbwd_ms"] > 0 and r["first_call_s"] > 0
        s = registry.parse_shape(r["shape"])
        assert r["fwd_flops"] == flops.chunkwise_flops(1, 64, s["H"], 16, 8, 64, HV=4)
        # fp32 on CPU: dt (in the benchmark dtype) is one 4-byte value per token and head
        assert r["min_bytes"] == flops.min_bytes(1, 64, s["H"], 16, 8, 4, 1, HV=4)
    assert "### Mamba2 targets" in (tmp_path / "report.md").read_text()


def test_mamba2_targets():
    S1, S2 = "B1-T64-H1-HV4-K16-V8", "B1-T64-H2-HV4-K16-V8"
    rows = [
        fake("mamba2", S1, fwd_ms=1.0, fwdbwd_ms=4.0, first_call_s=12.0),
        fake(MAMBA2_PEERS[0], S1, fwd_ms=2.0, fwdbwd_ms=10.0),
        fake(MAMBA2_PEERS[1], S1, fwd_ms=1.5, fwdbwd_ms=5.0),
        dict(fake("mamba2", S2, fwd_ms=1.0, fwdbwd_ms=4.0, first_call_s=0.1),
             first_in_process=False),
        fake(MAMBA2_PEERS[0], S2, status="timeout (400 s) in first forward"),
    ]  # fmt: skip
    t = {(t["target"], t["shape"]): t for t in compare.mamba2_targets(rows)}
    ssm, fla = (name for name, _, _ in compare.MAMBA2_TARGETS[:2])
    assert t[(ssm, S1)]["value"] == 2.5 and t[(ssm, S1)]["verdict"] == "met"  # ≥ 2
    assert t[(fla, S1)]["value"] == 1.25 and t[(fla, S1)]["verdict"] == "missed"  # < 1.3
    assert t[("first call", f"{S1} (mamba2)")]["verdict"] == "met"
    assert ("first call", f"{S2} (mamba2)") not in t  # compiled by the item before it
    assert t[(ssm, S2)]["verdict"] == "—" and "timeout" in t[(ssm, S2)]["why"]
    assert t[(fla, S2)]["why"] == f"no {MAMBA2_PEERS[1]} row"
    assert compare.delta_targets(rows) == []
    ratios = {(e["peer"], e["shape"]): e for e in compare.peer_ratios(rows)}
    assert ratios[(MAMBA2_PEERS[0], S1)]["fwdbwd_speedup"] == 2.5
    text = compare.text(rows)
    assert "Mamba2 targets:" in text and "delta-rule targets" not in text


def test_runbook_mamba2_stage(tmp_path):
    calls, res = stage(tmp_path, "mamba2")
    assert res.returncode == 0, res.stderr
    bench = [c for c in calls if "linrnn.bench" in c]
    parts = [c[c.index("--ops") + 1] for c in bench if "--ops" in c]
    assert parts == ["linrnn", "peers"]  # each within the time left, then the plan of the rest
    assert "--plan" in bench[-1] and len(bench) == 3
    for call in bench:
        assert call[call.index("--suite") + 1] == "mamba2"
        assert call[call.index("--out") + 1].endswith("mamba2.json") and "--resume" in call


# --- the peers against linrnn (GPU) ---------------------------------------------------------

HAS_PEER = {"mamba_ssm": peers.available("mamba_ssm"),
            "fla": importlib.util.find_spec("fla") is not None}  # fmt: skip


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="mamba_ssm's and fla's kernels: GPU")
@pytest.mark.parametrize("sid", ["B2-T300-H1-HV4-K64-V32", "B1-T512-H2-HV4-K128-V64"])
@pytest.mark.parametrize("name", MAMBA2_PEERS)
def test_mamba2_peers_compute_the_linrnn_op(name, sid):
    """The peers get Mamba2's inputs with the same meaning: bf16 outputs within bf16 rounding
    of linrnn's PyTorch path in fp32 on the same inputs (fla's without the D·x term)."""
    peer = peers.PEERS[name]
    if not HAS_PEER[peer.library]:
        pytest.skip(f"{peer.library} is not importable (mamba_ssm: {peers.MAMBA_SSM_SRC})")
    shape = registry.parse_shape(sid)
    case = dict(op=name, dtype="bf16", seed=0, device="cuda")
    leaves, fwd = peers.BUILDERS[peer.library](case, shape)
    o = fwd()
    args, _, _ = registry.bench_inputs("mamba2", shape, "bf16", 0, "cuda")
    args = tuple(t.detach().float() for t in args)
    variant = registry.selfcheck_variant("mamba2")
    if peer.library == "fla":
        args = (*args[:5], torch.zeros_like(args[5]), args[6])  # D = 0: no skip term
    ref, _ = run(variant, args, {}, mode="chunk", backend="torch")
    assert o.shape == ref.shape == (shape["B"], shape["T"], shape["HV"], shape["V"])
    assert rel(o.float(), ref) < 2e-2
    grads = torch.autograd.grad(o.float().square().sum(), leaves)
    assert all(bool(torch.isfinite(g).all()) for g in grads)
