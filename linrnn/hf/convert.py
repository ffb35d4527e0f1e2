"""Checkpoints of fla's models (flash-linear-attention's ``GLAForCausalLM``,
``RetNetForCausalLM``, ``RWKV6ForCausalLM``) as linrnn models.

    python -m linrnn.hf.convert FLA_DIR OUT_DIR              # a linrnn.hf checkpoint
    python -m linrnn.hf.convert FLA_DIR OUT_DIR --format linrnn   # CausalLM.save_pretrained's

``FLA_DIR`` holds fla's ``config.json`` and weights (``model.safetensors``, sharded safetensors
with an index, or ``pytorch_model.bin``). fla itself is not needed. In Python:
:func:`lm_config_from_fla` (fla's config → :class:`~linrnn.models.LMConfig`),
:func:`convert_state_dict` (fla's state dict → :class:`~linrnn.models.CausalLM`'s) and
:func:`convert_checkpoint`.

The models are the same computation (logits equal up to rounding): fla's blocks are pre-norm
``x + attn(norm(x))``, ``x + mlp(norm(x))`` with a final norm and an untied or tied head, which
is :class:`~linrnn.models.CausalLM`. The state-dict mapping, fla → linrnn, with ``{i}`` a layer
and fla's ``model.`` prefix dropped (linrnn.hf adds ``model.`` to linrnn's names):

GLA (``GLAForCausalLM``; mixer ``"gla"``)::

    embeddings.weight                        → embed.weight
    layers.{i}.attn_norm.weight              → blocks.{i}.mixer_norm.weight
    layers.{i}.attn.{q,k,v,g,o}_proj.weight  → blocks.{i}.mixer.{q,k,v,g,o}_proj.weight
    layers.{i}.attn.gk_proj.{0,1}.*          → blocks.{i}.mixer.gk_proj.{0,1}.*
    layers.{i}.attn.g_norm_swish_gate.weight → blocks.{i}.mixer.norm.weight     tiled over heads
        (layers.{i}.attn.g_norm.weight when fla's fuse_norm is off)
    layers.{i}.mlp_norm.weight               → blocks.{i}.mlp_norm.weight
    layers.{i}.mlp.gate_proj.weight  ┐
    layers.{i}.mlp.up_proj.weight    ┘       → blocks.{i}.mlp.gate_up.weight    concatenated
    layers.{i}.mlp.down_proj.weight          → blocks.{i}.mlp.down.weight
    norm.weight                              → norm.weight
    lm_head.weight                           → lm_head.weight (the embedding when tied)

RetNet (``RetNetForCausalLM``; mixer ``"retention"`` with ``rotary=True``): as GLA without
``gk_proj``. fla rotates q and k (RoPE on the halves of each head, base 10000), which linrnn's
retention does with ``rotary=True``; the decays γ_h = 1 − 2^(−5−h) are the same.

RWKV6 (``RWKV6ForCausalLM``; mixer ``"rwkv6"``, ``mlp="rwkv"``, ``norm="layer"``,
``embed_norm=True``). fla orders the five token-shift targets r, w, k, v, g and linrnn
w, k, v, r, g: "perm" reorders fla's groups into linrnn's::

    layers.0.pre_norm.{weight,bias}           → embed_norm.{weight,bias}
    layers.{i}.attn_norm.{weight,bias}        → blocks.{i}.mixer_norm.{weight,bias}
    layers.{i}.attn.x_proj.0.mu               → blocks.{i}.mixer.mu_x
    layers.{i}.attn.x_proj.0.linear.weight    → blocks.{i}.mixer.mix_a     transposed, perm
    layers.{i}.attn.x_proj.2.weight           → blocks.{i}.mixer.mix_b     [D,5,r]→[5,r,D], perm
    layers.{i}.attn.x_bias                    → blocks.{i}.mixer.mu        perm
    layers.{i}.attn.{r,k,v,g}_proj.linear.weight → blocks.{i}.mixer.{r,k,v,g}_proj.weight
    layers.{i}.attn.w_proj.linear.lora.0.weight  → blocks.{i}.mixer.decay_a   transposed
    layers.{i}.attn.w_proj.linear.lora.2.weight  → blocks.{i}.mixer.decay_b   transposed
    layers.{i}.attn.w_proj.linear.lora.2.bias    → blocks.{i}.mixer.decay
    layers.{i}.attn.bonus                     → blocks.{i}.mixer.bonus
    layers.{i}.attn.g_norm.{weight,bias}      → blocks.{i}.mixer.norm.{weight,bias}
    layers.{i}.attn.o_proj.weight             → blocks.{i}.mixer.o_proj.weight
    layers.{i}.ffn_norm.{weight,bias}         → blocks.{i}.mlp_norm.{weight,bias}
    layers.{i}.ffn.key.mu, receptance.mu      → blocks.{i}.mlp.mu_k, mu_r
    layers.{i}.ffn.key.linear.weight          → blocks.{i}.mlp.key.weight
    layers.{i}.ffn.receptance.linear.weight   → blocks.{i}.mlp.receptance.weight
    layers.{i}.ffn.value.weight               → blocks.{i}.mlp.value.weight
    norm.{weight,bias}, lm_head.weight        → norm.{weight,bias}, lm_head.weight

fla options without a linrnn counterpart are refused with a ValueError naming them: grouped
key/value heads (``num_kv_heads``), feature maps, short convolutions, GLA's ``clamp_min``, no
output gate, gate activations other than swish, hybrid attention layers (``attn``) and
attention residuals (``attnres_block_size``). Norms without affine weights (or RWKV norms
without bias) load as ones (zeros). fla's GLA and RetNet normalize each head with one weight
shared by the heads; linrnn keeps one per channel, filled by tiling.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

import torch
from torch import Tensor

from linrnn.models import CausalLM, LMConfig

FAMILIES = {"gla": "gla", "retnet": "retention", "rwkv6": "rwkv6"}
RWKV_PERM = [1, 2, 3, 0, 4]  # linrnn's w, k, v, r, g from fla's r, w, k, v, g


def _check(cfg: dict, family: str) -> None:
    """Refuse fla options that linrnn's layers do not have."""
    bad = {}
    if cfg.get("attn") is not None:
        bad["attn"] = cfg["attn"]
    if cfg.get("attnres_block_size") is not None:
        bad["attnres_block_size"] = cfg["attnres_block_size"]
    if family in ("gla", "retnet"):
        kv = cfg.get("num_kv_heads")
        if kv is not None and kv != cfg.get("num_heads", 4):
            bad["num_kv_heads"] = kv
        for key, ok in (("feature_map", None), ("use_short_conv", False), ("clamp_min", None)):
            if cfg.get(key, ok) != ok:
                bad[key] = cfg[key]
        if not cfg.get("use_output_gate", True):
            bad["use_output_gate"] = False
        if cfg.get("hidden_act", "swish") != "swish":
            bad["hidden_act"] = cfg["hidden_act"]
    elif cfg.get("hidden_act", "sqrelu") != "sqrelu":
        bad["hidden_act"] = cfg["hidden_act"]
    if bad:
        raise ValueError(f"fla {family} options that linrnn cannot express: {bad}")


def lm_config_from_fla(cfg: dict) -> LMConfig:
    """The :class:`~linrnn.models.LMConfig` of an fla config (``config.json`` as a dict; its
    ``model_type`` is ``"gla"``, ``"retnet"`` or ``"rwkv6"``), with fla's defaults for the
    keys it leaves out."""
    family = cfg.get("model_type")
    if family not in FAMILIES:
        raise ValueError(f"fla model_type must be one of {sorted(FAMILIES)}, got {family!r}")
    _check(cfg, family)
    D = cfg.get("hidden_size", 2048)
    eps = cfg.get("norm_eps", 1e-5 if family == "rwkv6" else 1e-6)
    common = {
        "vocab_size": cfg.get("vocab_size", 32000), "d_model": D,
        "num_layers": cfg.get("num_hidden_layers", 24), "num_heads": cfg.get("num_heads", 4),
        "tie_embeddings": bool(cfg.get("tie_word_embeddings", False)), "norm_eps": eps,
        "mixer": FAMILIES[family],
    }  # fmt: skip
    if family == "rwkv6":
        hidden = cfg.get("intermediate_size")
        if hidden is None:
            hidden = 32 * math.ceil(int(D * (cfg.get("hidden_ratio") or 3.5)) / 32)
        mixer_kwargs = {
            "expand_k": cfg.get("expand_k", 0.5), "expand_v": cfg.get("expand_v", 1.0),
            "mix_low_rank_dim": cfg.get("proj_low_rank_dim", 32),
            "decay_low_rank_dim": cfg.get("gate_low_rank_dim", 64), "norm_eps": eps,
        }  # fmt: skip
        return LMConfig(**common, mixer_kwargs=mixer_kwargs, mlp="rwkv", mlp_hidden=hidden,
                        norm="layer", embed_norm=bool(cfg.get("norm_first", True)))  # fmt: skip
    hidden = cfg.get("intermediate_size")
    if hidden is None:  # fla's GatedMLP: 2/3 · ratio · D rounded up to a multiple of 256
        ratio = cfg.get("hidden_ratio") or 4
        hidden = 256 * math.ceil(int(D * ratio * 2 / 3) / 256)
    defaults = (0.5, 1.0) if family == "gla" else (1.0, 2.0)
    mixer_kwargs = {
        "expand_k": cfg.get("expand_k", defaults[0]), "expand_v": cfg.get("expand_v", defaults[1]),
        "norm_eps": eps,
    }  # fmt: skip
    if family == "retnet":
        mixer_kwargs["rotary"] = True
    return LMConfig(**common, mixer_kwargs=mixer_kwargs, mlp_hidden=hidden)


def convert_state_dict(cfg: dict, state: dict[str, Tensor]) -> dict[str, Tensor]:
    """fla's state dict (keys with or without ``model.``) → :class:`~linrnn.models.CausalLM`'s.
    Every fla tensor must be used and every linrnn one produced (else a KeyError names them)."""
    lm = lm_config_from_fla(cfg)
    family = cfg["model_type"]
    src = {re.sub(r"^model\.", "", k): v for k, v in state.items()}
    used: set[str] = set()

    def take(key: str, default=None) -> Tensor:
        if key not in src:
            if default is not None:
                return default
            raise KeyError(f"fla checkpoint has no {key!r}")
        used.add(key)
        return src[key]

    D, H = lm.d_model, lm.num_heads
    out: dict[str, Tensor] = {"embed.weight": take("embeddings.weight")}
    ones, zeros = torch.ones(D), torch.zeros(D)
    layer_norm = family == "rwkv6"
    out["norm.weight"] = take("norm.weight", ones)
    if layer_norm:
        out["norm.bias"] = take("norm.bias", zeros)
    if lm.embed_norm:
        out["embed_norm.weight"] = take("layers.0.pre_norm.weight", ones)
        out["embed_norm.bias"] = take("layers.0.pre_norm.bias", zeros)
    for i in range(lm.num_layers):
        f, t = f"layers.{i}.", f"blocks.{i}."
        fla_mlp_norm = "ffn_norm" if layer_norm else "mlp_norm"
        for fla_norm, norm in (("attn_norm", "mixer_norm"), (fla_mlp_norm, "mlp_norm")):
            out[t + norm + ".weight"] = take(f + fla_norm + ".weight", ones)
            if layer_norm:
                out[t + norm + ".bias"] = take(f + fla_norm + ".bias", zeros)
        if family == "rwkv6":
            out.update(_rwkv6_layer(take, f, t, lm))
            continue
        a, m = f + "attn.", t + "mixer."
        for p in ("q", "k", "v", "g", "o"):
            out[f"{m}{p}_proj.weight"] = take(f"{a}{p}_proj.weight")
        if family == "gla":
            for p in ("gk_proj.0.weight", "gk_proj.1.weight", "gk_proj.1.bias"):
                out[m + p] = take(a + p)
        head_v = int(D * lm.mixer_kwargs["expand_v"]) // H
        w = src.get(a + "g_norm_swish_gate.weight", src.get(a + "g_norm.weight"))
        for key in (a + "g_norm_swish_gate.weight", a + "g_norm.weight"):
            if key in src:
                used.add(key)
        out[m + "norm.weight"] = (torch.ones(head_v) if w is None else w).repeat(H)
        out[t + "mlp.gate_up.weight"] = torch.cat(
            [take(f + "mlp.gate_proj.weight"), take(f + "mlp.up_proj.weight")], dim=0
        )
        out[t + "mlp.down.weight"] = take(f + "mlp.down_proj.weight")
    if lm.tie_embeddings:
        src.pop("lm_head.weight", None)
        out["lm_head.weight"] = out["embed.weight"]
    else:
        out["lm_head.weight"] = take("lm_head.weight")
    # Buffers and derived tensors fla may store (rotary frequencies) carry no weights.
    left = sorted(k for k in set(src) - used if not k.endswith("inv_freq"))
    if left:
        raise KeyError(f"fla tensors that the conversion does not use: {left}")
    return out


def _rwkv6_layer(take, f: str, t: str, lm: LMConfig) -> dict[str, Tensor]:
    a, m = f + "attn.", t + "mixer."
    r = lm.mixer_kwargs["mix_low_rank_dim"]
    D, value_dim = lm.d_model, int(lm.d_model * lm.mixer_kwargs["expand_v"])
    perm = torch.tensor(RWKV_PERM)
    mix_a = take(a + "x_proj.0.linear.weight").t()  # [D, 5r], fla's group order
    mix_b = take(a + "x_proj.2.weight").view(D, 5, r).permute(1, 2, 0)  # [5, r, D]
    out = {
        m + "mu_x": take(a + "x_proj.0.mu"),
        m + "mix_a": mix_a.unflatten(1, (5, r))[:, perm].flatten(1).contiguous(),
        m + "mix_b": mix_b[perm].contiguous(),
        m + "mu": take(a + "x_bias")[perm].contiguous(),
        m + "decay_a": take(a + "w_proj.linear.lora.0.weight").t().contiguous(),
        m + "decay_b": take(a + "w_proj.linear.lora.2.weight").t().contiguous(),
        m + "decay": take(a + "w_proj.linear.lora.2.bias"),
        m + "bonus": take(a + "bonus"),
        m + "norm.weight": take(a + "g_norm.weight", torch.ones(value_dim)),
        m + "norm.bias": take(a + "g_norm.bias", torch.zeros(value_dim)),
        m + "o_proj.weight": take(a + "o_proj.weight"),
    }
    for p in ("r", "k", "v", "g"):
        out[f"{m}{p}_proj.weight"] = take(f"{a}{p}_proj.linear.weight")
    n = f + "ffn."
    out.update({
        t + "mlp.mu_k": take(n + "key.mu"),
        t + "mlp.mu_r": take(n + "receptance.mu"),
        t + "mlp.key.weight": take(n + "key.linear.weight"),
        t + "mlp.receptance.weight": take(n + "receptance.linear.weight"),
        t + "mlp.value.weight": take(n + "value.weight"),
    })  # fmt: skip
    return out


def load_fla_state_dict(directory) -> dict[str, Tensor]:
    """The weights of an fla checkpoint folder (safetensors, sharded or not, or a .bin)."""
    path = Path(directory)
    if (path / "model.safetensors").is_file():
        from safetensors.torch import load_file

        return load_file(str(path / "model.safetensors"))
    if (path / "model.safetensors.index.json").is_file():
        from safetensors.torch import load_file

        index = json.loads((path / "model.safetensors.index.json").read_text())
        state = {}
        for shard in sorted(set(index["weight_map"].values())):
            state.update(load_file(str(path / shard)))
        return state
    if (path / "pytorch_model.bin").is_file():
        return torch.load(path / "pytorch_model.bin", map_location="cpu", weights_only=True)
    raise FileNotFoundError(
        f"{path} holds no model.safetensors, model.safetensors.index.json or pytorch_model.bin"
    )


def convert_model(cfg: dict, state: dict[str, Tensor], dtype=None) -> CausalLM:
    """A :class:`~linrnn.models.CausalLM` with fla's weights (in ``dtype``, default fla's)."""
    lm = lm_config_from_fla(cfg)
    weights = convert_state_dict(cfg, state)
    dtype = dtype or weights["embed.weight"].dtype
    model = CausalLM(lm, dtype=dtype)
    model.load_state_dict({k: v.to(dtype) for k, v in weights.items()}, strict=True)
    return model


def convert_checkpoint(src, dst, fmt: str = "hf", dtype=None) -> Path:
    """Convert the fla checkpoint folder ``src`` into ``dst``: a linrnn.hf checkpoint
    (``fmt="hf"``, for ``AutoModelForCausalLM.from_pretrained``) or a linrnn one (``"linrnn"``,
    for ``CausalLM.from_pretrained``)."""
    if fmt not in ("hf", "linrnn"):
        raise ValueError(f"fmt must be 'hf' or 'linrnn', got {fmt!r}")
    cfg = json.loads((Path(src) / "config.json").read_text())
    model = convert_model(cfg, load_fla_state_dict(src), dtype)
    if fmt == "linrnn":
        return model.save_pretrained(dst)
    from linrnn.hf import LinrnnConfig, LinrnnForCausalLM

    hf = LinrnnForCausalLM(LinrnnConfig.from_lm_config(model.config))
    hf.model = model
    hf.save_pretrained(dst)
    return Path(dst)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m linrnn.hf.convert",
        description="Convert an fla checkpoint (GLA, RetNet, RWKV6) into a linrnn one.",
    )
    p.add_argument("src", help="fla checkpoint folder (config.json and weights)")
    p.add_argument("dst", help="output folder")
    p.add_argument("--format", default="hf", choices=["hf", "linrnn"],
                   help="hf: linrnn.hf (AutoModelForCausalLM); linrnn: CausalLM")  # fmt: skip
    p.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                   help="weights' dtype (default: the checkpoint's)")  # fmt: skip
    args = p.parse_args(argv)
    dtype = None if args.dtype is None else getattr(torch, args.dtype)
    out = convert_checkpoint(args.src, args.dst, args.format, dtype)
    print(f"converted {args.src} → {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
