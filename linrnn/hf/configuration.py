"""The transformers configuration of linrnn's causal LM: the fields of
:class:`linrnn.models.LMConfig` under transformers' names where they have one."""

from __future__ import annotations

from dataclasses import fields
from typing import ClassVar

from transformers import PretrainedConfig

from linrnn.models import MIXERS, LMConfig


class LinrnnConfig(PretrainedConfig):
    """Configuration of :class:`~linrnn.hf.LinrnnForCausalLM` (``model_type="linrnn"``).

    The fields are those of :class:`linrnn.models.LMConfig` (see there), with transformers'
    names for the shared ones: ``hidden_size`` (LMConfig's d_model), ``num_hidden_layers``
    (num_layers), ``num_attention_heads`` (num_heads) and ``tie_word_embeddings``
    (tie_embeddings); LMConfig's names are accepted too and read back through
    ``attribute_map``. ``mixer`` is any name of :data:`linrnn.models.MIXERS`, read when the
    configuration is made, so mixers registered later are accepted. ``use_cache`` (True):
    return the recurrent state from a forward without labels (what ``generate`` continues).
    """

    model_type = "linrnn"
    keys_to_ignore_at_inference: ClassVar[list[str]] = ["cache", "past_key_values"]
    attribute_map: ClassVar[dict[str, str]] = {
        "d_model": "hidden_size",
        "num_layers": "num_hidden_layers",
        "num_heads": "num_attention_heads",
        "tie_embeddings": "tie_word_embeddings",
    }

    def __init__(
        self,
        vocab_size: int = 256,
        hidden_size: int | None = None,
        num_hidden_layers: int | None = None,
        num_attention_heads: int | None = None,
        mixer: str = "gla",
        mixer_kwargs: dict | None = None,
        mlp_hidden: int | None = None,
        tie_word_embeddings: bool | None = None,
        logit_softcap: float | None = None,
        norm_eps: float = 1e-6,
        init_std: float = 0.02,
        mode: str = "chunk",
        chunk_size: int | None = None,
        backend: str | None = None,
        use_cache: bool = True,
        d_model: int | None = None,
        num_layers: int | None = None,
        num_heads: int | None = None,
        tie_embeddings: bool | None = None,
        **kwargs,
    ) -> None:
        defaults = LMConfig()
        pairs = [
            ("hidden_size", hidden_size, "d_model", d_model),
            ("num_hidden_layers", num_hidden_layers, "num_layers", num_layers),
            ("num_attention_heads", num_attention_heads, "num_heads", num_heads),
            ("tie_word_embeddings", tie_word_embeddings, "tie_embeddings", tie_embeddings),
        ]
        values = {}
        for hf_name, hf_value, lm_name, lm_value in pairs:
            if hf_value is not None and lm_value is not None and hf_value != lm_value:
                raise TypeError(
                    f"LinrnnConfig got {hf_name}={hf_value!r} and {lm_name}={lm_value!r}: they "
                    "name the same field; pass one"
                )
            value = hf_value if hf_value is not None else lm_value
            values[hf_name] = getattr(defaults, lm_name) if value is None else value
        if mixer not in MIXERS:
            raise ValueError(f"mixer must be one of {sorted(MIXERS)}, got {mixer!r}")
        self.vocab_size = vocab_size
        self.hidden_size = values["hidden_size"]
        self.num_hidden_layers = values["num_hidden_layers"]
        self.num_attention_heads = values["num_attention_heads"]
        self.mixer = mixer
        self.mixer_kwargs = dict(mixer_kwargs or {})
        self.mlp_hidden = mlp_hidden
        self.logit_softcap = logit_softcap
        self.norm_eps = norm_eps
        self.init_std = init_std
        self.mode = mode
        self.chunk_size = chunk_size
        self.backend = backend
        self.use_cache = use_cache
        super().__init__(tie_word_embeddings=values["tie_word_embeddings"], **kwargs)
        self.lm_config()  # validates the fields and fills in mlp_hidden
        self.mlp_hidden = self.lm_config().mlp_hidden

    def lm_config(self) -> LMConfig:
        """The equivalent :class:`linrnn.models.LMConfig`."""
        names = {f.name for f in fields(LMConfig)}
        return LMConfig(**{name: getattr(self, name) for name in names})

    @classmethod
    def from_lm_config(cls, config: LMConfig, **kwargs) -> LinrnnConfig:
        """The transformers configuration of a :class:`linrnn.models.LMConfig`."""
        return cls(**{f.name: getattr(config, f.name) for f in fields(LMConfig)}, **kwargs)
