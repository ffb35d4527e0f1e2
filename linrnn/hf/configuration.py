"""The transformers configuration of linrnn's causal LM: the fields of
:class:`linrnn.models.LMConfig` under transformers' names where they have one."""

from __future__ import annotations

from dataclasses import MISSING, fields
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
        tie_word_embeddings: bool | None = None,
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
        self.vocab_size = vocab_size
        self.hidden_size = values["hidden_size"]
        self.num_hidden_layers = values["num_hidden_layers"]
        self.num_attention_heads = values["num_attention_heads"]
        self.use_cache = use_cache
        # Every other LMConfig field under its own name (fields added later included).
        mapped = {"vocab_size", *(lm_name for _, _, lm_name, _ in pairs)}
        for f in fields(LMConfig):
            if f.name not in mapped:
                default = f.default if f.default is not MISSING else f.default_factory()
                setattr(self, f.name, kwargs.pop(f.name, default))
        self.mixer_kwargs = dict(self.mixer_kwargs or {})
        if self.mixer not in MIXERS:
            raise ValueError(f"mixer must be one of {sorted(MIXERS)}, got {self.mixer!r}")
        super().__init__(tie_word_embeddings=values["tie_word_embeddings"], **kwargs)
        self.mlp_hidden = self.lm_config().mlp_hidden  # validates; fills in the default

    def lm_config(self) -> LMConfig:
        """The equivalent :class:`linrnn.models.LMConfig`."""
        names = {f.name for f in fields(LMConfig)}
        return LMConfig(**{name: getattr(self, name) for name in names})

    @classmethod
    def from_lm_config(cls, config: LMConfig, **kwargs) -> LinrnnConfig:
        """The transformers configuration of a :class:`linrnn.models.LMConfig`."""
        return cls(**{f.name: getattr(config, f.name) for f in fields(LMConfig)}, **kwargs)
