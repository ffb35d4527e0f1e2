"""The causal LM: loss and gradients, cached generation ≡ the full forward, padded prompts,
seeded sampling, safetensors round trip."""

from __future__ import annotations

import json

import pytest
import torch

from linrnn.models import MIXERS, CausalLM, LMConfig

MIXER_CONFIGS = {name: {} for name in MIXERS}
MIXER_CONFIGS["mlstm_sig"] = {"mixer": "mlstm", "mixer_kwargs": {"input_gate": "sigmoid"}}
MIXER_CONFIGS["rwkv6_block"] = {  # RWKV6's whole block: LayerNorms, ln0, channel mixing
    "mixer": "rwkv6", "mlp": "rwkv", "norm": "layer", "embed_norm": True,
}  # fmt: skip
MIXER_CONFIGS["linear_attn_performer"] = {
    "mixer": "linear_attn",
    "mixer_kwargs": {"feature_map": "performer"},
}


def tiny(name: str, dtype=torch.float64, **kw) -> CausalLM:
    cfg = {"mixer": name, **MIXER_CONFIGS[name], "d_model": 16, "num_layers": 2}
    cfg.update(num_heads=2, vocab_size=50, **kw)
    return CausalLM(LMConfig(**cfg)).to(dtype)


@pytest.mark.parametrize("name", MIXER_CONFIGS)
def test_loss_and_gradients(name):
    model = tiny(name, torch.float32)
    ids = torch.randint(0, 50, (2, 12))
    out = model(ids[:, :-1], targets=ids[:, 1:])
    assert out.logits.shape == (2, 11, 50)
    assert 3.0 < out.loss.item() < 5.0  # ≈ log(50) = 3.9 at initialization
    out.loss.backward()
    for pname, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), pname


@pytest.mark.parametrize("name", MIXER_CONFIGS)
def test_greedy_generation_is_deterministic_and_matches_the_full_forward(name):
    """Greedy tokens from the cache are the argmax of one forward over the generated text."""
    model = tiny(name)
    prompt = torch.randint(0, 50, (2, 7))
    a = model.generate(prompt, 9)
    b = model.generate(prompt, 9)
    assert a.shape == (2, 16) and torch.equal(a, b) and torch.equal(a[:, :7], prompt)
    with torch.no_grad():
        logits = model(a).logits
    assert torch.equal(logits[:, 6:-1].argmax(-1), a[:, 7:])


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("name", ["gla", "rwkv6", "rwkv6_block", "mlstm", "softmax"])
def test_padded_prompts_generate_like_unpadded(name, side):
    model = tiny(name)
    lengths, T = [8, 5, 2], 8
    rows = [torch.randint(0, 50, (n,)) for n in lengths]
    ids = torch.full((3, T), 49)
    mask = torch.zeros(3, T, dtype=torch.long)
    for b, row in enumerate(rows):
        sl = slice(T - len(row), T) if side == "left" else slice(0, len(row))
        ids[b, sl], mask[b, sl] = row, 1
    out = model.generate(ids, 6, attention_mask=mask)
    for b, row in enumerate(rows):
        alone = model.generate(row[None], 6)
        assert torch.equal(out[b, T:], alone[0, len(row) :]), f"row {b}"


def test_sampling_is_seeded_and_top_k_1_is_greedy():
    model = tiny("gla")
    prompt = torch.randint(0, 50, (2, 5))
    kw = {"temperature": 1.5, "top_k": 20}
    s1 = model.generate(prompt, 12, seed=1, **kw)
    assert torch.equal(s1, model.generate(prompt, 12, seed=1, **kw))
    assert not torch.equal(s1, model.generate(prompt, 12, seed=2, **kw))
    greedy = model.generate(prompt, 12)
    assert torch.equal(model.generate(prompt, 12, temperature=1.0, top_k=1, seed=3), greedy)
    with pytest.raises(ValueError, match="temperature"):
        model.generate(prompt, 2, temperature=-1.0)


def test_eos_token_repeats():
    model = tiny("simple_gla")
    prompt = torch.randint(0, 50, (1, 4))
    first = model.generate(prompt, 1)[0, -1].item()
    out = model.generate(prompt, 5, eos_token_id=first)
    assert out[0, 4:].tolist() == [first] * 5


@pytest.mark.parametrize(
    "name,tied", [("gla", True), ("mlstm", False), ("linear_attn_performer", True)]
)
def test_save_load_round_trip(tmp_path, name, tied):
    model = tiny(name, torch.float32, tie_embeddings=tied, logit_softcap=30.0)
    ids = torch.randint(0, 50, (2, 9))
    with torch.no_grad():
        for p in model.parameters():  # move away from the initialization
            p.add_(0.01 * torch.randn_like(p))
    path = model.save_pretrained(tmp_path / "ckpt")
    assert (path / "model.safetensors").is_file()
    config = json.loads((path / "config.json").read_text())
    assert config["mixer"] == MIXER_CONFIGS[name].get("mixer", name)
    assert config["tie_embeddings"] is tied
    loaded = CausalLM.from_pretrained(path)
    assert loaded.config == model.config
    assert (loaded.lm_head.weight is loaded.embed.weight) is tied
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)


def test_logit_softcap_and_ignored_targets():
    model = tiny("retention", logit_softcap=0.5)
    ids = torch.randint(0, 50, (2, 6))
    out = model(ids)
    assert out.logits.abs().max() <= 0.5
    targets = ids.clone()
    targets[:, 3:] = -100
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[:, 3:] = 0
    a = model(ids, targets=targets).loss
    b = model(ids, targets=ids, attention_mask=torch.ones(2, 6)).loss
    c = model(ids[:, :3], targets=ids[:, :3]).loss
    assert torch.isclose(a, c) and not torch.isclose(a, b)
    assert torch.isclose(model(ids, targets=ids, attention_mask=mask).loss, c)


def test_bad_config_raises():
    with pytest.raises(ValueError, match="mixer"):
        LMConfig(mixer="lstm")
    with pytest.raises(ValueError, match="unknown"):
        LMConfig.from_dict({"mixer": "gla", "width": 3})
    assert LMConfig(d_model=128).mlp_hidden == 352  # 8/3·128 rounded up to a multiple of 32


def test_rwkv_block_decodes_with_a_static_cache():
    """The channel mix's token shift has its own cache entry, so the static cache of
    linrnn.graphs (same keys on every step) decodes RWKV6's whole block like generate()."""
    import linrnn.graphs
    from linrnn.layers import Cache

    model = tiny("rwkv6_block")
    prompt = torch.randint(0, 50, (2, 5))
    ref = model.generate(prompt, 6)
    cache = Cache()
    with torch.no_grad():
        first = model(prompt, cache=cache).logits[:, -1].argmax(-1)
    assert ("mlp", 0) in cache and set(cache[("mlp", 0)]) == {"shift"}
    dec = linrnn.graphs.capture_decode(model, cache, graph=False)
    out = dec.generate(first, 6)  # first token first, like generate()'s continuation
    assert torch.equal(torch.cat([prompt, out], dim=1), ref)


def test_generate_rejects_bad_arguments():
    model = tiny("gla")
    prompt = torch.randint(0, 50, (2, 4))
    cases = [
        ({"max_new_tokens": -1}, "max_new_tokens must be ≥ 0, got -1"),
        ({"top_k": 0}, "top_k must be ≥ 1, got 0"),
        ({"temperature": float("nan")}, "temperature must be finite and ≥ 0, got nan"),
        ({"do_sample": True, "temperature": 0.0}, "needs temperature > 0"),
        ({"do_sample": True, "top_p": 1.5}, r"top_p must be in \(0, 1\], got 1.5"),
    ]
    for kwargs, message in cases:
        kwargs = {"max_new_tokens": 2, **kwargs}
        with pytest.raises(ValueError, match=message):
            model.generate(prompt, **kwargs)
    with pytest.raises(ValueError, match="the prompt is empty"):
        model.generate(prompt[:, :0], 2)
    with pytest.raises(ValueError, match=r"prompt rows \[1\] are all padding"):
        model.generate(prompt, 2, attention_mask=torch.tensor([[1, 1, 1, 1], [0, 0, 0, 0]]))
    assert torch.equal(model.generate(prompt, 0), prompt)


def test_top_p_keeps_the_nucleus():
    from linrnn.models.generation import sample_next

    logits = torch.tensor([[4.0, 3.0, 0.0, -1.0]]).log_softmax(-1)  # p ≈ .72, .26, .01, .00
    gen = torch.Generator().manual_seed(0)
    picks = {sample_next(logits, 1.0, None, 0.7, gen).item() for _ in range(50)}
    assert picks == {0}  # the most likely token alone already holds 0.7
    picks = {sample_next(logits, 1.0, None, 0.9, gen).item() for _ in range(200)}
    assert picks == {0, 1}


def test_labels_are_shifted_and_targets_aligned():
    model = tiny("simple_gla", torch.float32)
    ids = torch.randint(0, 50, (2, 7))
    with torch.no_grad():
        by_labels = model(ids, labels=ids)
        by_targets = model(ids[:, :-1], targets=ids[:, 1:])
        ref = torch.nn.functional.cross_entropy(
            by_labels.logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten()
        )
    assert torch.allclose(by_labels.loss, ref) and torch.allclose(by_targets.loss, ref, atol=1e-6)
    with pytest.raises(ValueError, match="not both"):
        model(ids, labels=ids, targets=ids)


@pytest.mark.parametrize("name", ["gla", "rwkv6_block"])
def test_fp32_checkpoint_loads_in_bf16(tmp_path, name):
    model = tiny(name, torch.float32)
    model.save_pretrained(tmp_path)
    loaded = CausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16)
    assert {p.dtype for p in loaded.parameters()} == {torch.bfloat16}
    for (k, a), b in zip(model.state_dict().items(), loaded.state_dict().values()):
        assert torch.equal(a.to(torch.bfloat16), b), k
