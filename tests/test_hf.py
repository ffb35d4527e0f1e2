"""The transformers model (linrnn.hf), for every mixer: AutoModelForCausalLM.from_config →
save_pretrained → from_pretrained gives equal logits; labels= gives the shifted loss; cached
greedy generate() equals greedy decoding by full forwards, one token per step; sampling
(top-k, top-p) is reproducible under a seed; left-padded batches equal the unpadded rows;
packed documents (cu_seqlens, or the flattening collator's position_ids) equal separate calls.
Skipped without transformers (an optional extra); the core never imports it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

transformers = pytest.importorskip("transformers")

from linrnn.hf import LinrnnCache, LinrnnConfig, LinrnnForCausalLM  # noqa: E402
from linrnn.models import MIXERS, CausalLM, LMConfig  # noqa: E402

V = 40
SMALL = {"gla": {"gate_low_rank_dim": 4}, "rwkv6": {"mix_low_rank_dim": 4, "decay_low_rank_dim": 8}}
VARIANTS = {name: {"mixer": name, "mixer_kwargs": SMALL.get(name, {})} for name in MIXERS}
VARIANTS["retention_rotary"] = {"mixer": "retention", "mixer_kwargs": {"rotary": True}}
VARIANTS["softmax_gqa"] = {"mixer": "softmax", "mixer_kwargs": {"num_kv_heads": 1}}
VARIANTS["rwkv6_block"] = {**VARIANTS["rwkv6"], "mlp": "rwkv", "norm": "layer", "embed_norm": True}


def config(name: str, **kw) -> LinrnnConfig:
    return LinrnnConfig(vocab_size=V, hidden_size=16, num_hidden_layers=2,
                        num_attention_heads=2, chunk_size=4, **VARIANTS[name], **kw)  # fmt: skip


def model(name: str, dtype=torch.float64, **kw) -> LinrnnForCausalLM:
    torch.manual_seed(0)
    m = transformers.AutoModelForCausalLM.from_config(config(name, **kw)).to(dtype).eval()
    with torch.no_grad():  # away from the initialization (symmetric gates, zero LoRAs)
        for p in m.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return m


def test_core_never_imports_transformers():
    code = (
        "import sys, linrnn, linrnn.layers, linrnn.models, linrnn.train, linrnn.models.generation;"
        "print('transformers' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_config_names_and_auto_registration():
    cfg = config("gla", tie_word_embeddings=False)
    assert (cfg.d_model, cfg.num_layers, cfg.num_heads, cfg.tie_embeddings) == (16, 2, 2, False)
    lm = cfg.lm_config()
    assert lm == LMConfig(vocab_size=V, d_model=16, num_layers=2, num_heads=2, chunk_size=4,
                          mixer="gla", mixer_kwargs=SMALL["gla"], tie_embeddings=False)  # fmt: skip
    assert LinrnnConfig.from_lm_config(lm).lm_config() == lm
    assert isinstance(transformers.AutoConfig.for_model("linrnn"), LinrnnConfig)
    with pytest.raises(ValueError, match="mixer must be one of"):
        LinrnnConfig(mixer="lstm")
    with pytest.raises(TypeError, match="hidden_size=16 and d_model=32"):
        LinrnnConfig(hidden_size=16, d_model=32)


@pytest.mark.parametrize("name", VARIANTS)
def test_save_load_round_trip_and_labels_loss(name, tmp_path):
    m = model(name, torch.float32, tie_word_embeddings=name != "mlstm")
    ids = torch.randint(0, V, (2, 9))
    m.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["model_type"] == "linrnn" and saved["mixer"] == VARIANTS[name]["mixer"]
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path)
    assert isinstance(loaded, LinrnnForCausalLM)
    assert loaded.config.lm_config() == m.config.lm_config()
    tied = loaded.model.lm_head.weight is loaded.model.embed.weight
    assert tied is (name != "mlstm")
    with torch.no_grad():
        out, again = m(ids, labels=ids), loaded(ids, labels=ids)
    assert torch.equal(out.logits, again.logits)
    ref = F.cross_entropy(out.logits[:, :-1].double().flatten(0, 1), ids[:, 1:].flatten())
    assert torch.allclose(out.loss.double(), ref, rtol=1e-6) and out.loss == again.loss


@pytest.mark.parametrize("name", VARIANTS)
def test_cached_greedy_generate_equals_full_forwards(name):
    m = model(name)
    prompt = torch.randint(1, V, (2, 6))  # 0 is the padding id
    seen = []
    hook = m.model.blocks[0].register_forward_pre_hook(
        lambda mod, args: seen.append(args[0].shape[1])
    )
    try:
        out = m.generate(prompt, max_new_tokens=7, do_sample=False, pad_token_id=0)
    finally:
        hook.remove()
    assert seen == [6] + [1] * 6  # the prompt once, then one token per step from the cache
    ids = prompt
    with torch.no_grad():
        for _ in range(7):
            nxt = m(ids, use_cache=False).logits[:, -1].argmax(-1)
            ids = torch.cat([ids, nxt[:, None]], 1)
    assert torch.equal(out, ids)
    assert torch.equal(out, m.model.generate(prompt, 7))  # linrnn's own generate agrees


def test_sampling_is_seeded():
    m = model("gla")
    prompt = torch.randint(1, V, (2, 5))  # 0 is the padding id
    kw = {"do_sample": True, "max_new_tokens": 10, "top_k": 20, "top_p": 0.9,
          "temperature": 1.3, "pad_token_id": 0}  # fmt: skip
    runs = []
    for seed in (1, 1, 2):
        torch.manual_seed(seed)
        runs.append(m.generate(prompt, **kw))
    assert torch.equal(runs[0], runs[1]) and not torch.equal(runs[0], runs[2])
    torch.manual_seed(3)
    one = m.generate(prompt, do_sample=True, top_k=1, max_new_tokens=6, pad_token_id=0)
    assert torch.equal(one, m.generate(prompt, do_sample=False, max_new_tokens=6, pad_token_id=0))


@pytest.mark.parametrize("name", VARIANTS)
def test_left_padded_batch_equals_unpadded_rows(name):
    m = model(name)
    rows = [torch.randint(1, V, (n,)) for n in (7, 3, 5)]
    T = 7
    ids = torch.zeros(3, T, dtype=torch.long)
    mask = torch.zeros(3, T, dtype=torch.long)
    for b, row in enumerate(rows):
        ids[b, T - len(row) :], mask[b, T - len(row) :] = row, 1
    out = m.generate(ids, attention_mask=mask, max_new_tokens=5, do_sample=False, pad_token_id=0)
    for b, row in enumerate(rows):
        alone = m.generate(row[None], max_new_tokens=5, do_sample=False, pad_token_id=0)
        assert torch.equal(out[b, T:], alone[0, len(row) :]), f"row {b}"


@pytest.mark.parametrize("name", VARIANTS)
def test_packed_documents_equal_separate_calls(name):
    m = model(name)
    docs = [torch.randint(0, V, (1, n)) for n in (5, 1, 8)]
    ids = torch.cat(docs, 1)
    position_ids = torch.cat([torch.arange(d.shape[1]) for d in docs])[None]
    with torch.no_grad():
        by_offsets = m(ids, cu_seqlens=[0, 5, 6, 14], use_cache=False).logits
        by_positions = m(ids, position_ids=position_ids, use_cache=False).logits
        alone = torch.cat([m(d, use_cache=False).logits for d in docs], 1)
    assert torch.allclose(by_offsets, alone, rtol=1e-9, atol=1e-9)
    assert torch.equal(by_positions, by_offsets)


def test_cache_continues_and_unknown_keywords_are_rejected():
    m = model("rwkv6")
    ids = torch.randint(0, V, (2, 9))
    with torch.no_grad():
        full = m(ids).logits
        first = m(ids[:, :5])
        assert isinstance(first.cache, LinrnnCache) and first.cache.get_seq_length() == 5
        rest = m(ids[:, 5:], past_key_values=first.cache).logits
    assert torch.allclose(torch.cat([first.logits, rest], 1), full, rtol=1e-9, atol=1e-9)
    with pytest.raises(TypeError, match="unexpected keyword arguments \\['foo'\\]"):
        m(ids, foo=1)


def test_linrnn_checkpoint_weights_load_into_the_hf_model(tmp_path):
    """The HF model's state dict is CausalLM's under ``model.``."""
    torch.manual_seed(0)
    lm = CausalLM(LMConfig(vocab_size=V, d_model=16, num_heads=2, num_layers=1))
    hf = LinrnnForCausalLM(LinrnnConfig.from_lm_config(lm.config))
    hf.model.load_state_dict(lm.state_dict())
    ids = torch.randint(0, V, (1, 6))
    with torch.no_grad():
        assert torch.equal(hf(ids).logits, lm(ids).logits)
