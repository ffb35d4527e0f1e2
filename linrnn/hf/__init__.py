"""linrnn models as Hugging Face transformers models (``pip install 'linrnn[hf]'``).

Importing this package registers :class:`LinrnnConfig` (``model_type="linrnn"``) and
:class:`LinrnnForCausalLM` with ``AutoConfig`` and ``AutoModelForCausalLM``::

    import linrnn.hf
    from transformers import AutoModelForCausalLM

    config = linrnn.hf.LinrnnConfig(mixer="gla", hidden_size=512, num_hidden_layers=8)
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained("ckpt")
    model = AutoModelForCausalLM.from_pretrained("ckpt")
    out = model.generate(ids, attention_mask=mask, max_new_tokens=50, do_sample=True, top_p=0.9)

The core of linrnn never imports transformers; only this package does.
:mod:`linrnn.hf.convert` turns fla checkpoints (GLA, RetNet) into linrnn ones.
"""

from __future__ import annotations

from transformers import AutoConfig, AutoModelForCausalLM

from linrnn.hf.configuration import LinrnnConfig
from linrnn.hf.modeling import LinrnnCache, LinrnnForCausalLM

AutoConfig.register(LinrnnConfig.model_type, LinrnnConfig, exist_ok=True)
AutoModelForCausalLM.register(LinrnnConfig, LinrnnForCausalLM, exist_ok=True)

__all__ = ["LinrnnCache", "LinrnnConfig", "LinrnnForCausalLM"]
