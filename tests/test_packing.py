"""Packed documents (``cu_seqlens``): every layer and the causal LM give, for N documents laid
end to end in one row, what N separate calls give — every state restarts at each offset (the
op's, the short convolutions', RWKV6's token shift, retention's rotary positions, softmax
attention's keys) — with and without a cache, with empty and one-token documents; the labels
loss does not predict across documents."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_close

from linrnn.layers import Cache, MultiScaleRetention, ShortConvolution
from linrnn.models import MIXERS, CausalLM, LMConfig
from linrnn.models.generation import cu_seqlens_from_position_ids

D, H = 16, 2
LENGTHS = [7, 1, 0, 12, 3]  # one-token and empty documents included
SMALL = {  # small versions of the mixers whose defaults are wide
    "gla": {"gate_low_rank_dim": 4},
    "rwkv6": {"mix_low_rank_dim": 4, "decay_low_rank_dim": 8, "num_layers": 3, "layer_idx": 1},
}
LAYERS = {name: (name, SMALL.get(name, {})) for name in MIXERS}
LAYERS["retention_rotary"] = ("retention", {"rotary": True})
LAYERS["mlstm_sig"] = ("mlstm", {"input_gate": "sigmoid"})
LAYERS["softmax_gqa"] = ("softmax", {"num_kv_heads": 1})


def make_layer(name: str):
    mixer, kwargs = LAYERS[name]
    extra = {} if mixer == "softmax" else {"chunk_size": 4}
    torch.manual_seed(0)
    layer = MIXERS[mixer](D, H, **kwargs, **extra).double()
    with torch.no_grad():  # move every parameter away from its (often symmetric) initialization
        for p in layer.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return layer


def offsets(lengths):
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    return cu


@pytest.mark.parametrize("as_tensor", [False, True])
@pytest.mark.parametrize("name", LAYERS)
def test_layer_packed_documents_equal_separate_calls(name, as_tensor):
    layer = make_layer(name)
    docs = [torch.randn(1, n, D, dtype=torch.float64) for n in LENGTHS]
    cu = offsets(LENGTHS)
    with torch.no_grad():
        packed = layer(torch.cat(docs, 1), cu_seqlens=torch.tensor(cu) if as_tensor else cu)
        for n, doc in enumerate(docs):
            if doc.shape[1]:
                assert_close(f"{name} doc {n}", packed[:, cu[n] : cu[n + 1]], layer(doc),
                             torch.float64)  # fmt: skip


@pytest.mark.parametrize("name", [n for n in LAYERS if not n.startswith("softmax")])
def test_layer_packed_prompts_continue_per_document(name):
    """A packed prompt with a cache, then one token per document (packed again): each
    document continues from its own state, as the document alone with its own cache does."""
    layer = make_layer(name)
    lengths = [5, 9, 1]
    docs = [torch.randn(1, n, D, dtype=torch.float64) for n in lengths]
    nxt = torch.randn(1, len(lengths), D, dtype=torch.float64)
    with torch.no_grad():
        cache = Cache()
        layer(torch.cat(docs, 1), cache=cache, cu_seqlens=offsets(lengths))
        y = layer(nxt, cache=cache, cu_seqlens=list(range(len(lengths) + 1)))
        for n, doc in enumerate(docs):
            alone = Cache()
            layer(doc, cache=alone)
            assert_close(f"{name} doc {n}", y[:, n], layer(nxt[:, n : n + 1], cache=alone)[:, 0],
                         torch.float64)  # fmt: skip


def test_short_convolution_restarts_at_offsets():
    conv = ShortConvolution(6, kernel_size=4, bias=True).double()
    docs = [torch.randn(1, n, 6, dtype=torch.float64) for n in [2, 5, 1]]
    y, _ = conv(torch.cat(docs, 1), cu_seqlens=offsets([2, 5, 1]))
    ref = torch.cat([conv(d)[0] for d in docs], 1)
    assert_close("conv", y, ref, torch.float64)


def test_retention_rotary_positions_restart_and_continue():
    """Rotary retention: the positions restart with each document and go on in the cache (a
    prompt then single tokens equals one call); without rotary the outputs differ."""
    torch.manual_seed(1)
    layer = MultiScaleRetention(D, H, rotary=True).double()
    x = torch.randn(1, 10, D, dtype=torch.float64)
    with torch.no_grad():
        full = layer(x)
        cache = Cache()
        parts = [layer(x[:, :6], cache=cache)] + [
            layer(x[:, t : t + 1], cache=cache) for t in range(6, 10)
        ]
        layer.rotary = False
        plain = layer(x)
    assert_close("rotary decode", torch.cat(parts, 1), full, torch.float64)
    assert (plain - full).abs().max() > 1e-3


@pytest.mark.parametrize("mixer", [*sorted(MIXERS), "rwkv6_block"])
def test_model_packed_documents_equal_separate_calls(mixer):
    torch.manual_seed(0)
    extra = {}
    if mixer == "rwkv6_block":  # RWKV6's whole block: the channel mix's token shift restarts too
        mixer, extra = "rwkv6", {"mlp": "rwkv", "norm": "layer", "embed_norm": True}
    skip = ("layer_idx", "num_layers")
    mixer_kwargs = {k: v for k, v in SMALL.get(mixer, {}).items() if k not in skip}
    config = LMConfig(mixer=mixer, mixer_kwargs=mixer_kwargs, d_model=D, num_heads=H,
                      num_layers=2, vocab_size=40, chunk_size=4, **extra)  # fmt: skip
    model = CausalLM(config).double()
    with torch.no_grad():  # away from the initialization (zero LoRAs, equal mixing)
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    lengths = [6, 1, 9]
    docs = [torch.randint(0, 40, (1, n)) for n in lengths]
    cu = offsets(lengths)
    ids = torch.cat(docs, 1)
    with torch.no_grad():
        out = model(ids, cu_seqlens=cu, labels=ids)
        losses, count = 0.0, 0
        for n, doc in enumerate(docs):
            alone = model(doc).logits
            assert_close(f"{mixer} doc {n}", out.logits[:, cu[n] : cu[n + 1]], alone,
                         torch.float64)  # fmt: skip
            if doc.shape[1] > 1:
                losses += F.cross_entropy(alone[0, :-1], doc[0, 1:], reduction="sum")
                count += doc.shape[1] - 1
    # The loss never asks a document to predict the next document's first token.
    assert torch.allclose(out.loss, losses / count)


def test_position_ids_convention():
    """transformers' flattening collator: positions restart at 0 at each document."""
    pos = torch.tensor([[0, 1, 2, 0, 0, 1, 2, 3]])
    assert cu_seqlens_from_position_ids(pos) == [0, 3, 4, 8]
    assert cu_seqlens_from_position_ids(torch.arange(5)[None]) is None
    assert cu_seqlens_from_position_ids(torch.tensor([[4]])) is None
    assert cu_seqlens_from_position_ids(pos.expand(2, -1)) is None  # a padded batch


def test_packing_arguments_are_checked():
    layer = make_layer("gla")
    x = torch.randn(1, 6, D, dtype=torch.float64)
    with pytest.raises(ValueError, match="cu_seqlens must start at 0 and end at T=6"):
        layer(x, cu_seqlens=[0, 2, 5])
    with pytest.raises(ValueError, match="batch size must be 1"):
        layer(x.expand(2, -1, -1), cu_seqlens=[0, 6])
    with pytest.raises(ValueError, match="not both"):
        layer(x, attention_mask=torch.ones(1, 6), cu_seqlens=[0, 6])
    softmax = make_layer("softmax")
    with pytest.raises(ValueError, match="no cache together with cu_seqlens"):
        softmax(x, cache=Cache(), cu_seqlens=[0, 6])
