"""The one chunk-size rule (linrnn.engine.config): the defaults, validation, the fused_chunk
limit, chunk_size="auto" (the user's cache, linrnn's measured table, the analytical model), and
that the ops resolve it without the benchmark harness."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import linrnn
from linrnn.engine import config

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    """Every test reads its own (empty) user cache, never ~/.cache/linrnn."""
    monkeypatch.setenv("LINRNN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(config, "_loaded", {})


@pytest.mark.parametrize(
    "K, V, triton, fused, vector, L",
    [
        (64, 64, False, False, False, 64),  # PyTorch path
        (256, 256, False, False, True, 64),
        (64, 64, True, False, False, 64),  # Triton, scalar gates: 128 from head dim 128
        (128, 64, True, False, False, 128),
        (64, 256, True, False, False, 128),
        (128, 128, True, False, True, 64),  # Triton, vector gates: 128 from head dim 256
        (256, 64, True, False, True, 128),
        (256, 256, True, True, False, 64),  # fused_chunk
    ],
)
def test_default_chunk_size(K, V, triton, fused, vector, L):
    got = config.resolve_chunk_size(None, K, V, triton=triton, fused=fused, vector=vector)
    assert got == L == config.default_chunk_size(K, V, triton=triton, fused=fused, vector=vector)


def test_ints_are_taken_and_bad_values_rejected():
    assert config.resolve_chunk_size(37, 64, 64, triton=True) == 37
    assert config.resolve_chunk_size(4096, 64, 64, triton=False) == 4096
    assert config.resolve_chunk_size(128, 256, 256, triton=True, fused=True) == 128
    with pytest.raises(ValueError, match=r"^mode='fused_chunk' .* must be ≤ 128, got 129 "):
        config.resolve_chunk_size(129, 64, 64, triton=True, fused=True)
    for bad, exc, msg in [(0, ValueError, "≥ 1, got 0"), (-3, ValueError, "≥ 1, got -3"),
                          (2.0, TypeError, "got 2.0"), ("64", TypeError, "got '64'"),
                          (True, TypeError, "got True")]:  # fmt: skip
        with pytest.raises(exc, match=msg):
            config.resolve_chunk_size(bad, 64, 64, triton=True)


def test_auto_in_fused_chunk_is_capped(monkeypatch):
    """ "auto" keeps one fused chunk within one register tile: ≤ 128, ≤ 64 above head dim 128;
    mode "chunk" takes the choice as it is."""
    monkeypatch.setattr(config, "auto_chunk_size", lambda *a, **k: 512)
    auto = lambda K, V, fused: config.resolve_chunk_size(  # noqa: E731
        "auto", K, V, triton=True, fused=fused, family="gla", dtype=torch.float32
    )
    assert auto(128, 128, False) == 512
    assert auto(128, 128, True) == 128
    assert auto(256, 128, True) == 64
    assert auto(128, 256, True) == 64


def _write_cache(directory: Path, key: str, figures: dict) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    entry = {"shape": "B2-T4096-H4-K128-V128", "measured": figures}
    data = {"format": config.CACHE_FORMAT, "entries": {key: entry}}
    (directory / config.CACHE_NAME).write_text(json.dumps(data))


def test_auto_takes_the_fastest_of_the_user_cache(tmp_path, monkeypatch):
    """The user's measurement wins, for its own op, head dims, dtype, device and version only;
    a family name means its default op ("mlstm" → "mlstm[exp]")."""
    figures = {"32": {"fwd_ms": 1.0, "fwdbwd_ms": 9.0}, "256": {"fwd_ms": 3.0, "fwdbwd_ms": 5.0},
               "512": {"fwd_ms": 2.0, "fwdbwd_ms": 7.0}}  # fmt: skip
    key = config.cache_key("mlstm[exp]", 128, 128, "bf16", "cpu", linrnn.__version__)
    _write_cache(tmp_path / "cache", key, figures)
    assert config.auto_chunk_size("mlstm", 128, 128, torch.bfloat16, "cpu") == 256
    assert config.auto_chunk_size("mlstm[exp]", 128, 128, "bf16", None) == 256
    analytical = config.analytical_chunk_size(128, 128, "cpu")[0]
    assert analytical not in (32, 256, 512)
    for other in [("mlstm", 128, 128, torch.float16), ("mlstm", 128, 64, torch.bfloat16),
                  ("gla", 128, 128, torch.bfloat16)]:  # fmt: skip
        assert config.auto_chunk_size(*other, "cpu") == config.analytical_chunk_size(
            other[1], other[2], "cpu")[0]  # fmt: skip
    # an entry of another linrnn version is not used
    config._loaded.clear()
    _write_cache(tmp_path / "cache", key.replace(linrnn.__version__, "0.0.0"), figures)
    assert config.auto_chunk_size("mlstm", 128, 128, torch.bfloat16, "cpu") == analytical


def test_auto_uses_linrnn_measurements_of_the_gpu_model(monkeypatch):
    monkeypatch.setattr(config, "device_name", lambda device: "NVIDIA H200")
    assert config.auto_chunk_size("mlstm", 256, 256, torch.bfloat16) == 128
    assert config.auto_chunk_size("rwkv6", 64, 64, torch.bfloat16) == 64
    # not measured there (dtype, head dims): the analytical model
    assert config.auto_chunk_size("mlstm", 256, 256, torch.float16) == 512
    monkeypatch.setattr(config, "device_name", lambda device: "NVIDIA A100-SXM4-80GB")
    assert config.auto_chunk_size("mlstm", 256, 256, torch.bfloat16) == 512  # (analytical)
    assert config.auto_chunk_size("mlstm", 64, 64, torch.bfloat16) == 256


def test_analytical_model():
    """L_opt = sqrt((2KV + 5 + 2·I·KV·4) / (2·½·(K + V + 3) + 1)), I the FLOP/byte ratio."""
    # CPU (nominal I = 10), K = V = 64: sqrt(335,877 / 132) = 50.44 → 64
    assert config.runtime_optimal_chunk(64, 64, 10.0) == pytest.approx(math.sqrt(335_877 / 132))
    assert config.analytical_chunk_size(64, 64, "cpu")[0] == 64
    # H200: I = 989e12 / 4.8e12 = 206.04; K = V = 256: L² = 108,156,250 / 516 → 457.8 → 512
    L, L_opt, intensity = config.analytical_chunk_size(256, 256, "NVIDIA H200")
    assert intensity == pytest.approx(206.0417, rel=1e-5)
    assert L_opt == pytest.approx(457.8, abs=0.1) and L == 512
    # A100: I = 312e12 / 2e12 = 156; K = V = 256: L² = 81,920,005 / 516 → 398.4 → 512
    assert config.analytical_chunk_size(256, 256, "NVIDIA A100")[1] == pytest.approx(398.4, abs=0.1)
    # A100, K = V = 64: L² = (8,197 + 2·156·4,096·4) / 132 = 38,787.6 → 196.9 → 256
    assert config.analytical_chunk_size(64, 64, "NVIDIA A100")[0] == 256
    # tiny head dims clip to the smallest candidate
    assert config.analytical_chunk_size(1, 1, None)[0] == 16


def test_ops_take_chunk_size_auto(monkeypatch):
    """chunk_size="auto" asks the rule for L (with the family, head dims, dtype and device),
    runs with it, and equals the reference; a bad string is a TypeError."""
    from linrnn.engine import torch_chunk

    asked, used = [], []
    monkeypatch.setattr(config, "auto_chunk_size", lambda *a, **k: asked.append(a) or 7)
    real_chunk = torch_chunk.chunk
    monkeypatch.setattr(torch_chunk, "chunk",
                        lambda *a, chunk_size, **k: used.append(chunk_size)
                        or real_chunk(*a, chunk_size=chunk_size, **k))  # fmt: skip
    q = torch.randn(1, 30, 2, 8, dtype=torch.float64)
    gk = torch.nn.functional.logsigmoid(torch.randn(1, 30, 2, 8, dtype=torch.float64))
    o, _ = linrnn.gla(q, q, q, gk, chunk_size="auto", backend="torch")
    ref, _ = linrnn.gla(q, q, q, gk, mode="reference")
    assert torch.allclose(o, ref, rtol=1e-10, atol=1e-12)
    assert used == [7]
    family, K, V, dtype, device = asked[0]
    assert (family, K, V, dtype, device.type) == ("gla", 8, 8, torch.float64, "cpu")
    with pytest.raises(TypeError, match="'auto'"):
        linrnn.gla(q, q, q, gk, chunk_size="fastest")


def test_core_never_imports_the_benchmark_harness():
    """The core packages neither import linrnn.bench in their source nor load it when an op
    resolves chunk_size="auto"."""
    for package in ("reference", "engine", "ops", "layers", "models"):
        for path in (ROOT / "linrnn" / package).rglob("*.py"):
            text = path.read_text()
            for bad in ("import linrnn.bench", "from linrnn.bench", "from linrnn import bench"):
                assert bad not in text, f"{path.relative_to(ROOT)} imports the harness"
    code = (
        "import sys, torch, linrnn\n"
        "q = torch.randn(1, 20, 1, 8)\n"
        "linrnn.simple_gla(q, q, q, torch.zeros(1, 20, 1), chunk_size='auto', backend='torch')\n"
        "print(sorted(m for m in sys.modules if m.startswith('linrnn.bench')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True)  # fmt: skip
    assert out.stdout.strip() == "[]"
