"""fla → linrnn conversion against fla's own forward: for GLA, RetNet and RWKV6, build fla's
``*ForCausalLM`` from its config (fla's defaults, a small width) with random weights, convert the
state dict (linrnn.hf.convert), and print the logit errors of linrnn against fla at each dtype,
next to the error of linrnn's own bf16 forward against its fp32 forward (the rounding yardstick).

Needs fla (flash-linear-attention with fla-core) and, for fla's kernels, a CUDA GPU:

    pip install fla_core-0.6.0-py3-none-any.whl flash_linear_attention-0.6.0-py3-none-any.whl
    python scripts/check_fla_conversion.py                 # bf16 and fp32, T = 48 and 200

``--cpu`` runs fla's kernels through Triton's interpreter instead (fp32 only, one kernel
configuration, T ≤ 64 where fla uses its recurrent kernels; slow). Exit status 1 when a family's
error is not within the bf16 tolerance (RMS-relative 2e-2, and at most 3x linrnn's own bf16
rounding error) or the fp32 one (1e-4).
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

FAMILIES = {
    # fla's own configs with their defaults except the size
    "gla": {"hidden_size": 512, "num_heads": 4},
    "retnet": {"hidden_size": 512, "num_heads": 8},
    "rwkv6": {"hidden_size": 512, "num_heads": 4},
}
TOL = {"bfloat16": 2e-2, "float32": 1e-4}


def _single_config_autotune() -> None:
    """Triton's interpreter cannot benchmark: keep the first configuration of each autotuner."""
    import triton
    import triton.runtime.autotuner as at

    init = at.Autotuner.__init__

    def first_only(self, fn, arg_names, configs, *args, **kwargs):
        kwargs.pop("prune_configs_by", None)
        init(self, fn, arg_names, configs[:1], *args, **kwargs)

    at.Autotuner.__init__ = first_only
    triton.autotune = at.autotune


def rel(a, b) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm()).item()


def check(family: str, lengths, dtypes, device, vocab: int, layers: int) -> bool:
    import torch
    from fla.models import (
        GLAConfig,
        GLAForCausalLM,
        RetNetConfig,
        RetNetForCausalLM,
        RWKV6Config,
        RWKV6ForCausalLM,
    )  # fmt: skip
    from transformers import AutoModelForCausalLM

    import linrnn.hf  # noqa: F401  (registers linrnn with the Auto classes)
    from linrnn.hf.convert import convert_checkpoint, convert_model

    classes = {
        "gla": (GLAConfig, GLAForCausalLM),
        "retnet": (RetNetConfig, RetNetForCausalLM),
        "rwkv6": (RWKV6Config, RWKV6ForCausalLM),
    }
    config_cls, model_cls = classes[family]
    cfg = config_cls(vocab_size=vocab, num_hidden_layers=layers, **FAMILIES[family])
    torch.manual_seed(0)
    fla = model_cls(cfg).float().eval()
    with torch.no_grad():  # random weights: move every tensor off its initialization
        for p in fla.parameters():
            p.add_(torch.randn_like(p) * (0.02 + 0.1 * p.detach().std().nan_to_num()))
    state = {k: v.detach().clone() for k, v in fla.state_dict().items()}
    ok = True
    # The folder route (save_pretrained → python -m linrnn.hf.convert → from_pretrained) gives
    # the in-memory conversion exactly.
    with tempfile.TemporaryDirectory() as tmp:
        fla.save_pretrained(Path(tmp) / "fla")
        convert_checkpoint(Path(tmp) / "fla", Path(tmp) / "linrnn")
        loaded = AutoModelForCausalLM.from_pretrained(Path(tmp) / "linrnn").model
        direct = convert_model(cfg.to_dict(), state, torch.float32)
        same = all(
            torch.equal(a, b)
            for a, b in zip(loaded.state_dict().values(), direct.state_dict().values())
        )
        print(f"{family}: checkpoint folder conversion equals the in-memory one: {same}")
        ok &= same
    ref32 = convert_model(cfg.to_dict(), state, torch.float32).to(device).eval()
    for dtype_name in dtypes:
        dtype = getattr(torch, dtype_name)
        fla_d = copy.deepcopy(fla).to(device=device, dtype=dtype)
        lin_d = convert_model(cfg.to_dict(), state, dtype).to(device).eval()
        for T in lengths:
            gen = torch.Generator().manual_seed(T)
            ids = torch.randint(0, vocab, (2, T), generator=gen).to(device)
            with torch.no_grad():
                a = fla_d(input_ids=ids).logits.float()
                b = lin_d(ids).logits.float()
                r = ref32(ids).logits.float()
            err, own = rel(b, a), rel(b, r)
            fla_vs_ref = rel(a, r)
            agree = (a.argmax(-1) == b.argmax(-1)).float().mean().item()
            good = err <= TOL[dtype_name] and (dtype_name == "float32" or err <= 3 * max(own, 1e-3))
            ok &= good
            print(
                f"{family:7s} {dtype_name:9s} T={T:4d}  linrnn vs fla: rel {err:.2e} max "
                f"{(b - a).abs().max().item():.3e}  top-1 agree {agree:.3f} | fla vs linrnn fp32 "
                f"{fla_vs_ref:.2e} | linrnn {dtype_name} vs fp32 {own:.2e}  "
                f"{'ok' if good else 'FAIL'}"
            )
    return ok


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--families", nargs="+", default=list(FAMILIES), choices=list(FAMILIES))
    p.add_argument("--lengths", nargs="+", type=int, default=None)
    p.add_argument("--dtypes", nargs="+", default=None, choices=list(TOL))
    p.add_argument("--vocab", type=int, default=1024)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--cpu", action="store_true", help="fla's kernels in Triton's interpreter")
    args = p.parse_args()
    # fla's kernels leave the precision of fp32 dot products to Triton's default, TF32 on
    # this GPU generation (about 1e-3 relative at T = 200): the fp32 comparison is made in
    # IEEE fp32, as linrnn's kernels compute it. bf16 products are unaffected.
    os.environ.setdefault("TRITON_F32_DEFAULT", "ieee")
    if args.cpu:
        os.environ["TRITON_INTERPRET"] = "1"
        _single_config_autotune()
        device, lengths, dtypes = "cpu", args.lengths or [16], args.dtypes or ["float32"]
    else:
        import torch

        if not torch.cuda.is_available():
            print("needs a CUDA GPU for fla's kernels (or --cpu)", file=sys.stderr)
            return 2
        device, lengths = "cuda", args.lengths or [48, 200]
        dtypes = args.dtypes or ["bfloat16", "float32"]
    ok = True
    for family in args.families:
        ok &= check(family, lengths, dtypes, device, args.vocab, args.layers)
    print("all within tolerance" if ok else "SOME CHECKS FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
