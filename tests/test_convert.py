"""fla → linrnn conversion (linrnn.hf.convert) without fla: synthetic state dicts with fla's
parameter names and shapes (those of flash-linear-attention 0.6's GLAForCausalLM,
RetNetForCausalLM and RWKV6ForCausalLM) convert into CausalLM's, and the converted model's
logits equal an independent fp64 reimplementation of fla's forward written against fla's names
(step-by-step recurrences, as fla's layers define them). The check against fla's own kernels
runs on a GPU: scripts/check_fla_conversion.py."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

from linrnn.hf.convert import convert_model, convert_state_dict, lm_config_from_fla, main

D, H, V, L = 16, 2, 30, 2


def fla_state(cfg: dict) -> dict[str, torch.Tensor]:
    """Random weights under fla's names and shapes (fp64)."""
    fam = cfg["model_type"]
    lm = lm_config_from_fla(cfg)
    K, Vd = int(D * lm.mixer_kwargs["expand_k"]), int(D * lm.mixer_kwargs["expand_v"])
    I = lm.mlp_hidden
    shapes = {"model.embeddings.weight": (V, D), "model.norm.weight": (D,)}
    if not cfg.get("tie_word_embeddings"):
        shapes["lm_head.weight"] = (V, D)
    for i in range(L):
        p = f"model.layers.{i}."
        if fam == "rwkv6":
            r, g = cfg["proj_low_rank_dim"], cfg["gate_low_rank_dim"]
            shapes.update({
                p + "attn_norm.weight": (D,), p + "attn_norm.bias": (D,),
                p + "attn.x_bias": (5, D), p + "attn.bonus": (H, K // H),
                p + "attn.x_proj.0.mu": (D,), p + "attn.x_proj.0.linear.weight": (5 * r, D),
                p + "attn.x_proj.2.weight": (D, 5 * r),
                p + "attn.r_proj.linear.weight": (K, D), p + "attn.k_proj.linear.weight": (K, D),
                p + "attn.v_proj.linear.weight": (Vd, D), p + "attn.g_proj.linear.weight": (Vd, D),
                p + "attn.w_proj.linear.lora.0.weight": (g, D),
                p + "attn.w_proj.linear.lora.2.weight": (K, g),
                p + "attn.w_proj.linear.lora.2.bias": (K,),
                p + "attn.g_norm.weight": (Vd,), p + "attn.g_norm.bias": (Vd,),
                p + "attn.o_proj.weight": (D, Vd),
                p + "ffn_norm.weight": (D,), p + "ffn_norm.bias": (D,),
                p + "ffn.key.mu": (D,), p + "ffn.key.linear.weight": (I, D),
                p + "ffn.value.weight": (D, I), p + "ffn.receptance.mu": (D,),
                p + "ffn.receptance.linear.weight": (D, D),
            })  # fmt: skip
            if i == 0:
                shapes.update({p + "pre_norm.weight": (D,), p + "pre_norm.bias": (D,)})
            continue
        shapes.update({
            p + "attn_norm.weight": (D,), p + "attn.q_proj.weight": (K, D),
            p + "attn.k_proj.weight": (K, D), p + "attn.v_proj.weight": (Vd, D),
            p + "attn.g_proj.weight": (Vd, D), p + "attn.o_proj.weight": (D, Vd),
            p + "attn.g_norm_swish_gate.weight": (Vd // H,), p + "mlp_norm.weight": (D,),
            p + "mlp.gate_proj.weight": (I, D), p + "mlp.up_proj.weight": (I, D),
            p + "mlp.down_proj.weight": (D, I),
        })  # fmt: skip
        if fam == "gla":
            shapes.update({p + "attn.gk_proj.0.weight": (16, D),
                           p + "attn.gk_proj.1.weight": (K, 16),
                           p + "attn.gk_proj.1.bias": (K,)})  # fmt: skip
    if fam == "rwkv6":
        shapes["model.norm.bias"] = (D,)
    gen = torch.Generator().manual_seed(0)
    state = {}
    for k, shape in shapes.items():
        scale = 1 / math.sqrt(shape[-1]) if len(shape) == 2 else 0.3
        base = 1.0 if k.endswith("norm.weight") or k.endswith("swish_gate.weight") else 0.0
        state[k] = base + scale * torch.randn(shape, generator=gen, dtype=torch.float64)
    return state


# ---- fla's forward, step by step, on fla's parameter names (fp64) -----------------------


def rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def layer_norm(x, w, b, eps):
    x = x - x.mean(-1, keepdim=True)
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w + b


def rope(x, pos):  # [T, H, d], GPT-NeoX halves, base 10000
    half = x.shape[-1] // 2
    inv = 10000.0 ** (-torch.arange(half, dtype=torch.float64) / half)
    ang = pos[:, None, None] * inv
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * ang.cos() - x2 * ang.sin(), x1 * ang.sin() + x2 * ang.cos()], -1)


def fla_forward(cfg: dict, s: dict, ids: torch.Tensor) -> torch.Tensor:
    fam, eps = cfg["model_type"], cfg["norm_eps"]
    s = {k.removeprefix("model."): v for k, v in s.items()}
    x = s["embeddings.weight"][ids]  # [T, D]
    T = x.shape[0]
    for i in range(L):
        p = f"layers.{i}."
        if fam == "rwkv6":
            if i == 0:
                x = layer_norm(x, s[p + "pre_norm.weight"], s[p + "pre_norm.bias"], eps)
            h = layer_norm(x, s[p + "attn_norm.weight"], s[p + "attn_norm.bias"], eps)
            x = x + rwkv6_attn(cfg, s, p + "attn.", h)
            h = layer_norm(x, s[p + "ffn_norm.weight"], s[p + "ffn_norm.bias"], eps)
            delta = F.pad(h, (0, 0, 1, -1)) - h
            k = torch.relu((h + delta * s[p + "ffn.key.mu"]) @ s[p + "ffn.key.linear.weight"].T)
            r = (h + delta * s[p + "ffn.receptance.mu"]) @ s[p + "ffn.receptance.linear.weight"].T
            x = x + torch.sigmoid(r) * (k.square() @ s[p + "ffn.value.weight"].T)
            continue
        h = rms(x, s[p + "attn_norm.weight"], eps)
        a = p + "attn."
        q, k = h @ s[a + "q_proj.weight"].T, h @ s[a + "k_proj.weight"].T
        v = h @ s[a + "v_proj.weight"].T
        q, k, v = (t.view(T, H, -1) for t in (q, k, v))
        if fam == "gla":
            gk = (
                F.logsigmoid(
                    (h @ s[a + "gk_proj.0.weight"].T) @ s[a + "gk_proj.1.weight"].T
                    + s[a + "gk_proj.1.bias"]
                ).view(T, H, -1)
                / 16
            )
        else:
            pos = torch.arange(T, dtype=torch.float64)
            q, k = rope(q, pos), rope(k, pos)
            gamma = 1 - 2.0 ** (-5.0 - torch.arange(H, dtype=torch.float64))
            gk = gamma.log()[None, :, None].expand(T, H, k.shape[-1])
        S = torch.zeros(H, k.shape[-1], v.shape[-1], dtype=torch.float64)
        o = []
        for t in range(T):
            S = gk[t].exp()[..., None] * S + k[t][..., None] * v[t][:, None]
            o.append(torch.einsum("hk,hkv->hv", q[t] * k.shape[-1] ** -0.5, S))
        o = rms(torch.stack(o), s[a + "g_norm_swish_gate.weight"], eps).flatten(1)
        o = o * F.silu(h @ s[a + "g_proj.weight"].T)
        x = x + o @ s[a + "o_proj.weight"].T
        h = rms(x, s[p + "mlp_norm.weight"], eps)
        g, u = h @ s[p + "mlp.gate_proj.weight"].T, h @ s[p + "mlp.up_proj.weight"].T
        x = x + (F.silu(g) * u) @ s[p + "mlp.down_proj.weight"].T
    x = (
        rms(x, s["norm.weight"], eps)
        if fam != "rwkv6"
        else layer_norm(x, s["norm.weight"], s["norm.bias"], eps)
    )
    head = s.get("lm_head.weight", s["embeddings.weight"])
    return x @ head.T


def rwkv6_attn(cfg, s, a, x):
    T, r = x.shape[0], cfg["proj_low_rank_dim"]
    delta = F.pad(x, (0, 0, 1, -1)) - x
    lora = torch.tanh((x + delta * s[a + "x_proj.0.mu"]) @ s[a + "x_proj.0.linear.weight"].T)
    lora = lora.view(T, 5, r)
    m = torch.einsum("tnr,hnr->tnh", lora, s[a + "x_proj.2.weight"].view(-1, 5, r))
    mr, mw, mk, mv, mg = (m + s[a + "x_bias"]).unbind(1)  # fla's order: r, w, k, v, g
    rr = (x + delta * mr) @ s[a + "r_proj.linear.weight"].T
    kk = (x + delta * mk) @ s[a + "k_proj.linear.weight"].T
    vv = (x + delta * mv) @ s[a + "v_proj.linear.weight"].T
    gg = (x + delta * mg) @ s[a + "g_proj.linear.weight"].T
    xw = x + delta * mw
    w = (
        torch.tanh(xw @ s[a + "w_proj.linear.lora.0.weight"].T)
        @ s[a + "w_proj.linear.lora.2.weight"].T
        + s[a + "w_proj.linear.lora.2.bias"]
    )
    w = -torch.exp(w)
    rr, kk, w = (t.view(T, H, -1) for t in (rr, kk, w))
    vv = vv.view(T, H, -1)
    u = s[a + "bonus"]
    S = torch.zeros(H, kk.shape[-1], vv.shape[-1], dtype=torch.float64)
    o = []
    for t in range(T):
        kv = kk[t][..., None] * vv[t][:, None]
        o.append(torch.einsum("hk,hkv->hv", rr[t], S + u[..., None] * kv))
        S = w[t].exp()[..., None] * S + kv
    o = torch.stack(o)  # [T, H, Dv], then GroupNorm over each head
    o = o - o.mean(-1, keepdim=True)
    o = (o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + cfg["norm_eps"])).flatten(1)
    o = o * s[a + "g_norm.weight"] + s[a + "g_norm.bias"]
    return (o * F.silu(gg)) @ s[a + "o_proj.weight"].T


CONFIGS = {
    "gla": {"model_type": "gla", "hidden_size": D, "num_hidden_layers": L, "num_heads": H,
            "vocab_size": V, "norm_eps": 1e-6, "intermediate_size": 48},
    "retnet": {"model_type": "retnet", "hidden_size": D, "num_hidden_layers": L, "num_heads": H,
               "vocab_size": V, "norm_eps": 1e-6, "tie_word_embeddings": True},
    "rwkv6": {"model_type": "rwkv6", "hidden_size": D, "num_hidden_layers": L, "num_heads": H,
              "vocab_size": V, "norm_eps": 1e-5, "proj_low_rank_dim": 4,
              "gate_low_rank_dim": 8},
}  # fmt: skip


@pytest.mark.parametrize("family", CONFIGS)
def test_converted_model_computes_flas_forward(family):
    cfg = CONFIGS[family]
    state = fla_state(cfg)
    model = convert_model(cfg, state)
    ids = torch.randint(0, V, (12,))
    with torch.no_grad():
        got = model(ids[None]).logits[0]
    ref = fla_forward(cfg, state, ids)
    assert got.dtype == torch.float64
    assert torch.allclose(got, ref, rtol=1e-10, atol=1e-10), (got - ref).abs().max()


def test_mlp_width_defaults_follow_fla():
    assert lm_config_from_fla({"model_type": "gla", "hidden_size": 64}).mlp_hidden == 256
    assert lm_config_from_fla({"model_type": "retnet", "hidden_size": 64}).mlp_hidden == 256
    assert lm_config_from_fla({"model_type": "rwkv6", "hidden_size": 64}).mlp_hidden == 224
    assert lm_config_from_fla({"model_type": "gla", "hidden_size": 2048}).mlp_hidden == 5632


def test_unsupported_options_and_stray_tensors_are_named():
    with pytest.raises(ValueError, match="num_kv_heads"):
        lm_config_from_fla({**CONFIGS["gla"], "num_kv_heads": 1})
    with pytest.raises(ValueError, match="use_short_conv"):
        lm_config_from_fla({**CONFIGS["retnet"], "use_short_conv": True})
    with pytest.raises(ValueError, match="model_type"):
        lm_config_from_fla({"model_type": "mamba"})
    state = fla_state(CONFIGS["gla"])
    state["model.layers.0.attn.extra.weight"] = torch.zeros(1)
    with pytest.raises(KeyError, match=r"attn\.extra\.weight"):
        convert_state_dict(CONFIGS["gla"], state)
    del state["model.layers.0.attn.extra.weight"], state["model.layers.1.attn.q_proj.weight"]
    with pytest.raises(KeyError, match=r"layers\.1\.attn\.q_proj\.weight"):
        convert_state_dict(CONFIGS["gla"], state)


@pytest.mark.parametrize("fmt", ["linrnn", "hf"])
def test_command_line_converts_a_checkpoint_folder(tmp_path, fmt):
    st = pytest.importorskip("safetensors.torch")
    cfg = CONFIGS["rwkv6"]
    state = {k: v.float() for k, v in fla_state(cfg).items()}
    src = tmp_path / "fla"
    src.mkdir()
    (src / "config.json").write_text(json.dumps(cfg))
    st.save_file(state, str(src / "model.safetensors"))
    assert main([str(src), str(tmp_path / "out"), "--format", fmt]) == 0
    ids = torch.randint(0, V, (1, 9))
    if fmt == "linrnn":
        from linrnn.models import CausalLM

        loaded = CausalLM.from_pretrained(tmp_path / "out")
    else:
        transformers = pytest.importorskip("transformers")
        import linrnn.hf  # noqa: F401

        loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    with torch.no_grad():
        got = loaded(ids).logits
    assert torch.equal(got, convert_model(cfg, state)(ids).logits)
