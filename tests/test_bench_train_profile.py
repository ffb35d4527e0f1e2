"""benchmarks/train_profile.py on the CPU: a row per mixer whose kinds add up to the profiled
total, and the rules that sort kernel names into kinds."""

from __future__ import annotations

import json

import pytest
from helpers import benchmark_script


def test_rows_add_up(tmp_path):
    tp = benchmark_script("train_profile")
    out = tmp_path / "p.json"
    assert tp.main(["--mixers", "softmax", "simple_gla", "--seq-len", "32", "--steps", "1",
                    "--timed-steps", "2", "--out", str(out)]) == 0  # fmt: skip
    rows = json.loads(out.read_text())["rows"]
    assert [r["mixer"] for r in rows] == ["softmax", "simple_gla"]
    for r in rows:
        assert r["step_ms"] > 0 and r["kernels_ms"] > 0 and r["parameters"] > 0
        assert 0 < r["queue_ms"] <= r["step_ms"]  # queued before the loss is read
        assert r["steps"] == 1 and r["timed_steps"] == 2
        assert set(r["kinds"]) == set(tp.KINDS)
        assert abs(sum(r["kinds"].values()) - r["kernels_ms"]) < 1e-2
        assert set(r["launches"]) == set(tp.KINDS) and sum(r["launches"].values()) >= 1
        assert r["shape"] == "B8-T32"  # the suite's 256 CPU tokens per step
    assert rows[0]["kinds"]["mixer"] > 0  # SDPA's operators
    assert all(r["graph_ms"] is None for r in rows)
    # --cuda-graph: the replayed step's time (on a CPU the graphed step runs eagerly)
    assert tp.main(["--mixers", "gla", "--seq-len", "32", "--steps", "1", "--timed-steps", "2",
                    "--cuda-graph", "--out", str(out)]) == 0  # fmt: skip
    (row,) = json.loads(out.read_text())["rows"]
    assert row["graph_ms"] > 0


def test_kinds_by_name():
    pytest.importorskip("triton")
    tp = benchmark_script("train_profile")
    engine = tp.engine_kernels()
    assert engine["norm_gate_fwd_kernel"] == "glue" and engine["short_conv_fwd_kernel"] == "glue"
    assert engine["swiglu_bwd_kernel"] == "glue"
    assert engine["states_fwd_kernel"] == "mixer" and engine["wy_fwd_kernel"] == "mixer"
    cases = {
        "states_bwd_kernel": "mixer",
        "lerp_shift_bwd_kernel": "glue",
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64": "gemm",
        "nvjet_hsh_128x256_64x4_2x1_v_bz_coopA_NTN": "gemm",
        "void at::native::multi_tensor_apply_kernel<TensorListMetadata<4>, FusedAdam>": "optimizer",
        "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128>>": "mixer",
        "void at::native::vectorized_elementwise_kernel<4, CUDAFunctor_add<float>>": "torch",
        "Memcpy DtoD (Device -> Device)": "torch",
    }  # fmt: skip
    for name, kind in cases.items():
        assert tp.kind_of(name, engine) == kind, name
