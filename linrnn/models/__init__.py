"""Models built from :mod:`linrnn.layers`."""

from linrnn.models.causal_lm import MIXERS, CausalLM, LMConfig, LMOutput

__all__ = ["MIXERS", "CausalLM", "LMConfig", "LMOutput"]
