"""A small causal language model over the layers: token embedding, pre-norm blocks
``x + mixer(RMSNorm(x))``, ``x + SwiGLU(RMSNorm(x))``, a final RMSNorm and a tied or untied
output head with optional logit soft-capping; ``generate()`` decodes with the recurrent cache,
and weights are saved and loaded with safetensors."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import torch
from torch import Tensor, nn

from linrnn.layers import (
    Cache,
    DeltaNet,
    GatedDeltaNet,
    GatedLinearAttention,
    LinearAttention,
    Mamba2,
    MultiScaleRetention,
    RMSNorm,
    RWKV6TimeMix,
    SimpleGLA,
    SoftmaxAttention,
    mLSTMLayer,
)
from linrnn.layers.common import LayerNorm, as_packing, softcap, upcast
from linrnn.models.feedforward import RWKVChannelMix, SwiGLU
from linrnn.models.generation import check_generation, lm_loss, sample_next

MIXERS = {
    "linear_attn": LinearAttention,
    "gla": GatedLinearAttention,
    "simple_gla": SimpleGLA,
    "retention": MultiScaleRetention,
    "rwkv6": RWKV6TimeMix,
    "mlstm": mLSTMLayer,
    "delta_net": DeltaNet,
    "gated_delta_net": GatedDeltaNet,
    "mamba2": Mamba2,
    "softmax": SoftmaxAttention,
}

WEIGHTS_NAME, CONFIG_NAME = "model.safetensors", "config.json"


@dataclass
class LMConfig:
    """Configuration of :class:`CausalLM`.

    Attributes:
        vocab_size: number of token ids (256 for bytes).
        d_model, num_layers, num_heads: width, depth, heads of every mixer.
        mixer: one of :data:`MIXERS` (``"linear_attn"``, ``"gla"``, ``"simple_gla"``,
            ``"retention"``, ``"rwkv6"``, ``"mlstm"``, ``"delta_net"``, ``"gated_delta_net"``,
            ``"mamba2"``, ``"softmax"``).
        mixer_kwargs: extra keyword arguments of the mixer class, e.g.
            ``{"input_gate": "sigmoid"}`` for mLSTM or ``{"feature_map": "performer"}``.
        mlp: the feed-forward half of each block: ``"swiglu"`` (default) or ``"rwkv"`` (RWKV6's
            channel mixing, with its token shift; RWKV6 models use it with norm="layer").
        mlp_hidden: the feed-forward hidden width; None: for SwiGLU 8/3·d_model rounded up to a
            multiple of 32, for RWKV 3.5·d_model rounded up to a multiple of 32.
        tie_embeddings: share the embedding matrix with the output head.
        logit_softcap: soft-cap ``c·tanh(logits/c)`` (xLSTM/Gemma 2 use 30); None: off.
        norm: the block and final norms: ``"rms"`` (RMSNorm, default) or ``"layer"``
            (LayerNorm with bias, as RWKV).
        embed_norm: normalize the embeddings before the first block (RWKV's ``ln0``).
        norm_eps: epsilon of those norms.
        init_std: standard deviation of the embedding, MLP and head initialization.
        mode, chunk_size, backend: passed to every linear mixer's op (mode None: the op's
            own choice); backend also to the norms and the SwiGLU activation (their glue
            kernels).
    """

    vocab_size: int = 256
    d_model: int = 128
    num_layers: int = 2
    num_heads: int = 4
    mixer: str = "gla"
    mixer_kwargs: dict = field(default_factory=dict)
    mlp: str = "swiglu"
    mlp_hidden: int | None = None
    tie_embeddings: bool = True
    logit_softcap: float | None = None
    norm: str = "rms"
    embed_norm: bool = False
    norm_eps: float = 1e-6
    init_std: float = 0.02
    mode: str | None = None
    chunk_size: int | None = None
    backend: str | None = None

    def __post_init__(self) -> None:
        if self.mixer not in MIXERS:
            raise ValueError(f"mixer must be one of {sorted(MIXERS)}, got {self.mixer!r}")
        if self.mlp not in ("swiglu", "rwkv"):
            raise ValueError(f"mlp must be 'swiglu' or 'rwkv', got {self.mlp!r}")
        if self.norm not in ("rms", "layer"):
            raise ValueError(f"norm must be 'rms' or 'layer', got {self.norm!r}")
        if self.mlp_hidden is None:
            if self.mlp == "swiglu":
                self.mlp_hidden = 32 * math.ceil(8 * self.d_model / 3 / 32)
            else:
                self.mlp_hidden = 32 * math.ceil(int(3.5 * self.d_model) / 32)

    @classmethod
    def from_dict(cls, d: dict) -> LMConfig:
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"unknown LMConfig fields {unknown}")
        return cls(**d)


@dataclass
class LMOutput:
    logits: Tensor  # [B, T, vocab]
    loss: Tensor | None = None  # mean cross-entropy over the targets that are not ignored


class Block(nn.Module):
    def __init__(self, config: LMConfig, layer_idx: int, device=None, dtype=None) -> None:
        super().__init__()
        kw = {"device": device, "dtype": dtype}
        c = config
        extra = dict(c.mixer_kwargs)
        if c.mixer == "rwkv6":
            extra.setdefault("num_layers", c.num_layers)
        if c.mixer != "softmax":
            extra.update(mode=c.mode, chunk_size=c.chunk_size, backend=c.backend)
        self.layer_idx = layer_idx
        self.mixer_norm = make_norm(c, **kw)
        self.mixer = MIXERS[c.mixer](c.d_model, c.num_heads, layer_idx=layer_idx, **extra, **kw)
        self.mlp_norm = make_norm(c, **kw)
        if c.mlp == "swiglu":
            self.mlp = SwiGLU(c.d_model, c.mlp_hidden, backend=c.backend, **kw)
        else:
            self.mlp = RWKVChannelMix(c.d_model, c.mlp_hidden, **kw)

    def forward(self, x: Tensor, pending: Tensor | None = None, attention_mask=None,
                cache: Cache | None = None) -> tuple[Tensor, Tensor]:  # fmt: skip
        """The block on the residual stream ``x + pending`` (``pending``: the previous block's
        last branch, not yet added, or None) → ``(stream, y)``: the stream before this
        block's feed-forward branch ``y`` is added; the next norm adds y in its own pass
        (``norm.add``: the residual add, the norm and the products' cast in one pass each
        way on Triton), so the block output is ``stream + y``. ``attention_mask``: None or
        the model's :class:`~linrnn.layers.Packing` (padding or packed documents)."""
        packing = attention_mask
        x, h = self.mixer_norm.add(x, pending)
        x, h = self.mlp_norm.add(x, self.mixer(h, attention_mask=packing, cache=cache))
        key = ("mlp", self.layer_idx)  # the channel mix's token shift, next to the mixer's entry
        previous = cache[key].get("shift") if cache is not None else None
        y, last = self.mlp(h, packing, previous)
        if cache is not None and last is not None:
            cache.update(key, {"shift": last})
        return x, y


def make_norm(config: LMConfig, device=None, dtype=None) -> nn.Module:
    norm = RMSNorm if config.norm == "rms" else LayerNorm
    return norm(config.d_model, config.norm_eps, device=device, dtype=dtype,
                backend=config.backend)  # fmt: skip


class CausalLM(nn.Module):
    """Causal language model with a selectable token mixer (see :class:`LMConfig`).

    Example:
        >>> model = CausalLM(LMConfig(mixer="gla", d_model=128, num_layers=2))
        >>> out = model(ids, labels=ids)                # out.logits, out.loss
        >>> new = model.generate(ids, max_new_tokens=50, do_sample=True, temperature=0.8,
        ...                      top_p=0.9, seed=0)
        >>> model.save_pretrained("ckpt"); same = CausalLM.from_pretrained("ckpt")
    """

    def __init__(self, config: LMConfig, device=None, dtype=None) -> None:
        super().__init__()
        kw = {"device": device, "dtype": dtype}
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.d_model, **kw)
        self.embed_norm = make_norm(config, **kw) if config.embed_norm else None
        self.blocks = nn.ModuleList(Block(config, i, **kw) for i in range(config.num_layers))
        self.norm = make_norm(config, **kw)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False, **kw)
        self.reset_parameters()
        if config.tie_embeddings:
            self.lm_head.weight = self.embed.weight

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Normal(0, init_std) embedding, MLP and head; the MLP's output projection scaled by
        1/√(2·num_layers). The mixers keep their own initializations."""
        std = self.config.init_std
        nn.init.normal_(self.embed.weight, std=std)
        if not self.config.tie_embeddings:
            nn.init.normal_(self.lm_head.weight, std=std)
        for i, block in enumerate(self.blocks):
            if isinstance(block.mlp, RWKVChannelMix):
                block.mlp.reset_parameters(std, len(self.blocks), i)
            else:
                block.mlp.reset_parameters(std, len(self.blocks))

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        cache: Cache | None = None,
        labels: Tensor | None = None,
        *,
        targets: Tensor | None = None,
        cu_seqlens=None,
    ) -> LMOutput:
        """Args:
        input_ids: ``[B, T]`` token ids.
        attention_mask: optional ``[B, T]``, 1 = token, 0 = padding (left or right).
        cache: optional :class:`~linrnn.layers.Cache`, continued and updated in place.
        labels: optional ``[B, T]`` ids in transformers' convention: position t is trained to
            predict ``labels[t + 1]`` (the shift happens here, so ``labels=input_ids`` is the
            usual language-model loss); ``-100`` = ignore, as are padding positions and, with
            cu_seqlens, the first token of every document.
        targets: optional ``[B, T]`` ids already aligned with the positions: position t is
            trained to predict ``targets[t]`` (``-100`` and padding ignored). Pass labels or
            targets, not both.
        cu_seqlens: optional offsets ``[N + 1]`` of N documents packed in ``input_ids [1, T]``:
            every layer's state restarts at each offset, so the logits equal N separate calls.

        The loss is the mean cross-entropy over the positions that are not ignored.
        """
        if labels is not None and targets is not None:
            raise ValueError("pass labels (shifted inside) or targets (aligned), not both")
        x = self.embed(input_ids)
        packing = as_packing(attention_mask, x, cu_seqlens)  # built once for all the layers
        logits = self.logits(x, packing, cache)
        loss = None
        if labels is not None or targets is not None:
            loss = lm_loss(logits, labels, targets, attention_mask, packing)
        return LMOutput(logits, loss)

    def logits(self, x: Tensor, packing, cache: Cache | None) -> Tensor:
        """Logits of the embedded tokens ``x [B, T, D]`` (fp32 for a 16-bit model; ``packing``:
        None or a :class:`~linrnn.layers.Packing`); advances ``cache``."""
        if self.embed_norm is not None:
            x = self.embed_norm(x)
        pending = None  # each block's last branch, added by the next norm
        for block in self.blocks:
            x, pending = block(x, pending, attention_mask=packing, cache=cache)
        if cache is not None:
            cache.seen_tokens += x.shape[1]
        _, h = self.norm.add(x, pending)
        return softcap(upcast(self.lm_head(h)), self.config.logit_softcap)

    @torch.no_grad()
    def generate(
        self,
        input_ids: Tensor,
        max_new_tokens: int,
        *,
        attention_mask: Tensor | None = None,
        do_sample: bool | None = None,
        temperature: float | None = None,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        eos_token_id: int | None = None,
    ) -> Tensor:
        """Continue ``input_ids [B, T]`` by ``max_new_tokens`` tokens: one forward over the
        prompt with a :class:`~linrnn.layers.Cache`, then one token per step from the cache.

        Args:
            attention_mask: ``[B, T]`` for padded prompts (left or right padding); each row
                continues after its own last token.
            do_sample: sample from ``softmax(logits / temperature)`` (True) or decode greedily
                (False). None (the default) samples exactly when a temperature > 0 is given,
                so ``temperature=0.8`` alone samples and no arguments decode greedily.
            temperature: > 0 when sampling (default 1.0 with ``do_sample=True``).
            top_k: sample only among the ``top_k`` most likely tokens (≥ 1).
            top_p: sample only among the most likely tokens whose probabilities sum to
                ``top_p`` (nucleus sampling, 0 < top_p ≤ 1; the most likely token always stays).
            seed: seeds a private generator for sampling (reproducible; the global RNG is
                left alone).
            eos_token_id: a row that produced it keeps producing it.

        Returns:
            ``[B, T + max_new_tokens]``: the prompt followed by the new tokens.
        """
        sample = check_generation(
            input_ids, max_new_tokens, attention_mask, do_sample, temperature, top_k, top_p
        )
        B, T = input_ids.shape
        gen = None
        if seed is not None:
            gen = torch.Generator(device=input_ids.device).manual_seed(seed)
        if max_new_tokens == 0:
            return input_ids
        cache = Cache()
        logits = self(input_ids, attention_mask=attention_mask, cache=cache).logits
        if attention_mask is None:
            last = logits[:, -1]
        else:
            valid = attention_mask.to(input_ids.device).bool()
            idx = (valid * torch.arange(T, device=input_ids.device)).argmax(1)
            last = logits[torch.arange(B, device=input_ids.device), idx]
        out = [input_ids]
        done = torch.zeros(B, dtype=torch.bool, device=input_ids.device)
        temperature = 1.0 if temperature is None else temperature
        for step in range(max_new_tokens):
            if sample:
                nxt = sample_next(last, temperature, top_k, top_p, gen)
            else:
                nxt = last.argmax(-1)
            if eos_token_id is not None:
                nxt = torch.where(done, torch.full_like(nxt, eos_token_id), nxt)
                done |= nxt == eos_token_id
            out.append(nxt[:, None])
            if step + 1 < max_new_tokens:
                last = self(nxt[:, None], cache=cache).logits[:, -1]
        return torch.cat(out, dim=1)

    def save_pretrained(self, directory) -> Path:
        """Write ``config.json`` and ``model.safetensors`` (tied weights stored once)."""
        st = _safetensors()
        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        (path / CONFIG_NAME).write_text(json.dumps(asdict(self.config), indent=2) + "\n")
        st.save_model(self, str(path / WEIGHTS_NAME))
        return path

    @classmethod
    def from_pretrained(cls, directory, device=None, dtype=None) -> CausalLM:
        """Build the model from ``config.json`` and load ``model.safetensors``; the weights are
        converted to ``dtype`` when given (an fp32 checkpoint loads as bf16)."""
        path = Path(directory)
        config = LMConfig.from_dict(json.loads((path / CONFIG_NAME).read_text()))
        model = cls(config, device=device, dtype=dtype)
        load_weights(model, path / WEIGHTS_NAME)
        return model


def load_weights(model: nn.Module, file) -> None:
    """Load a safetensors file saved by :meth:`CausalLM.save_pretrained` (tied weights stored
    once) into ``model``, converting every tensor to the dtype and device of the model's."""
    st = _safetensors()
    own = model.state_dict()
    state = st.load_file(str(file))
    for a, b in (("lm_head.weight", "embed.weight"), ("embed.weight", "lm_head.weight")):
        if a not in state and b in state and a in own and own[a].data_ptr() == own[b].data_ptr():
            state[a] = state[b]  # a tied pair stored under one name
    state = {
        k: v.to(device=own[k].device, dtype=own[k].dtype) if k in own else v
        for k, v in state.items()
    }
    model.load_state_dict(state, strict=True)


def _safetensors():
    try:
        import safetensors.torch as st
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(
            "saving and loading weights needs safetensors: pip install safetensors "
            "(or pip install 'linrnn[models]')"
        ) from e
    return st
