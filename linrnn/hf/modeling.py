"""linrnn's causal LM as a transformers ``PreTrainedModel`` with ``GenerationMixin``.

The weights are those of :class:`linrnn.models.CausalLM` under ``model.`` (so a linrnn
checkpoint's state dict loads with that prefix). Decoding keeps the recurrent state: the cache
is a :class:`LinrnnCache` (linrnn's :class:`~linrnn.layers.Cache`, made by the first forward
with ``use_cache``), and ``generate()`` feeds one new token per step, which costs one
recurrence step per layer whatever the length so far. transformers does not make or manage
this cache (as for its own recurrent models): it passes the one the previous step returned.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from torch import Tensor
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from linrnn.hf.configuration import LinrnnConfig
from linrnn.layers import Cache
from linrnn.layers.common import as_packing
from linrnn.models import CausalLM
from linrnn.models.generation import cu_seqlens_from_position_ids, lm_loss

# Keywords that transformers passes to every model's forward, which this model has no use for.
IGNORED_KWARGS = frozenset({
    "return_dict", "output_attentions", "output_hidden_states", "cache_position",
    "logits_to_keep", "num_items_in_batch", "token_type_ids",
})  # fmt: skip
_CACHE_FIELD = (
    "cache"
    if "cache" in {f.name for f in dataclasses.fields(CausalLMOutputWithPast)}
    else "past_key_values"
)


class LinrnnCache(Cache):
    """The recurrent state of every layer (linrnn's :class:`~linrnn.layers.Cache`) with what
    transformers' generation asks of a cache: all layers are linear (no key/value cache to
    slice against), it cannot be cropped or compiled, and ``get_seq_length`` counts the tokens
    seen."""

    is_compileable = False
    is_croppable = False

    @property
    def is_linear(self) -> list[bool]:
        return [True] * max(len(self), 1)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.seen_tokens

    def reorder_cache(self, beam_idx: Tensor) -> None:
        """Keep the rows ``beam_idx`` of every state (beam search)."""
        for entry in self.layers.values():
            for key, value in entry.items():
                if isinstance(value, Tensor):
                    entry[key] = value.index_select(0, beam_idx.to(value.device))
                elif isinstance(value, (tuple, list)):
                    entry[key] = type(value)(
                        v.index_select(0, beam_idx.to(v.device)) for v in value
                    )


class LinrnnPreTrainedModel(PreTrainedModel):
    config_class = LinrnnConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    _no_split_modules: ClassVar[list[str]] = ["Block"]
    _is_stateful = True
    supports_gradient_checkpointing = False

    def _init_weights(self, module) -> None:
        """linrnn's layers initialize themselves when they are built (each as its paper
        does); transformers' generic initialization would overwrite that, so it is not run."""

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # the model makes its own cache (LinrnnCache)


class LinrnnForCausalLM(LinrnnPreTrainedModel, GenerationMixin):
    """A linrnn causal LM (any mixer of :data:`linrnn.models.MIXERS`) for transformers:
    ``from_pretrained``/``save_pretrained`` (safetensors), ``generate()`` and the ``labels``
    loss; ``model.model`` is the :class:`linrnn.models.CausalLM`."""

    _tied_weights_keys: ClassVar[dict[str, str]] = {"model.lm_head.weight": "model.embed.weight"}

    def __init__(self, config: LinrnnConfig) -> None:
        super().__init__(config)
        self.model = CausalLM(config.lm_config())
        self.post_init()

    def get_input_embeddings(self):
        return self.model.embed

    def set_input_embeddings(self, value) -> None:
        self.model.embed = value

    def get_output_embeddings(self):
        return self.model.lm_head

    def set_output_embeddings(self, value) -> None:
        self.model.lm_head = value

    def forward(
        self,
        input_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        labels: Tensor | None = None,
        past_key_values: LinrnnCache | None = None,
        use_cache: bool | None = None,
        cu_seqlens=None,
        position_ids: Tensor | None = None,
        cache: LinrnnCache | None = None,
        inputs_embeds: Tensor | None = None,
        **kwargs,
    ) -> CausalLMOutputWithPast:
        """Logits ``[B, T, vocab]`` (fp32) and, with ``labels`` (shifted inside, ``-100``
        ignored), the mean next-token loss.

        Args:
            input_ids: ``[B, T]`` token ids (or ``inputs_embeds [B, T, D]``).
            attention_mask: ``[B, T]`` 1 = token, 0 = padding (left or right); with a cache it
                may cover the earlier tokens too (as ``generate`` passes it): its last T
                columns are used.
            past_key_values / cache: a :class:`LinrnnCache` to continue (transformers has used
                both names); with ``use_cache`` (default ``config.use_cache``) a new one is made
                when none is given and returned in the output.
            cu_seqlens: offsets ``[N + 1]`` of N documents packed in ``input_ids [1, T]``; every
                state restarts at each offset.
            position_ids: transformers' flattened packing (``DataCollatorWithFlattening``: one
                row whose positions restart at 0 at each document) gives the documents when
                cu_seqlens is not given; otherwise positions are not needed (recurrent mixers
                have none, softmax attention counts its own).
        """
        unknown = sorted(set(kwargs) - IGNORED_KWARGS)
        if unknown:
            raise TypeError(
                f"LinrnnForCausalLM.forward() got unexpected keyword arguments {unknown}"
            )
        if past_key_values is not None and cache is not None and past_key_values is not cache:
            raise ValueError("pass the cache as past_key_values or as cache, not both")
        cache = cache if cache is not None else past_key_values
        use_cache = self.config.use_cache if use_cache is None else use_cache
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids and inputs_embeds")
        lm = self.model
        x = lm.embed(input_ids) if inputs_embeds is None else inputs_embeds
        B, T = x.shape[:2]
        if cache is not None and not isinstance(cache, Cache):
            raise TypeError(f"the cache must be a LinrnnCache, got {type(cache).__name__}")
        if cache is None and use_cache and labels is None:
            cache = LinrnnCache()  # (not while training with labels: states are not needed)
        if attention_mask is not None:
            if attention_mask.dim() != 2 or attention_mask.shape[0] != B:
                raise ValueError(
                    f"attention_mask must be [B, T'] with B={B}, got {tuple(attention_mask.shape)}"
                )
            attention_mask = attention_mask[:, -T:]
            if bool(attention_mask.bool().all()):
                attention_mask = None
        if cu_seqlens is None and attention_mask is None:
            cu_seqlens = cu_seqlens_from_position_ids(position_ids)
        packing = as_packing(attention_mask, x, cu_seqlens)
        logits = lm.logits(x, packing, cache)
        loss = None
        if labels is not None:
            loss = lm_loss(logits, labels, None, attention_mask, packing)
        return CausalLMOutputWithPast(loss=loss, logits=logits, **{_CACHE_FIELD: cache})

    def prepare_inputs_for_generation(self, input_ids, *args, **kwargs):
        inputs = super().prepare_inputs_for_generation(input_ids, *args, **kwargs)
        inputs.pop("position_ids", None)  # positions come from the cache, not from here
        return inputs


__all__ = ["LinrnnCache", "LinrnnForCausalLM"]
