"""What the causal LM's loss and decoding share with the transformers wrapper: the two label
conventions, the checks of the generation arguments, top-k / nucleus sampling, and packed
documents from transformers' position-id convention."""

from __future__ import annotations

import math
import numbers

import torch
import torch.nn.functional as F
from torch import Tensor

from linrnn.layers.common import Packing

IGNORE = -100


def lm_loss(
    logits: Tensor,
    labels: Tensor | None,
    targets: Tensor | None,
    attention_mask: Tensor | None,
    packing: Packing | None,
) -> Tensor:
    """Mean cross-entropy of ``logits [B, T, V]``.

    ``labels`` (transformers' convention): position t predicts ``labels[t + 1]``; ignored are
    ``-100``, padding labels, labels after a padding position, and with packed documents the
    first token of each document (it cannot be predicted from the previous document).
    ``targets`` (aligned): position t predicts ``targets[t]``; ignored are ``-100`` and padding.
    """
    valid = None if attention_mask is None else attention_mask.to(logits.device).bool()
    if targets is not None:
        if valid is not None:
            targets = targets.masked_fill(~valid, IGNORE)
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE)
    if labels.shape != logits.shape[:2]:
        raise ValueError(
            f"labels must have the shape of input_ids {tuple(logits.shape[:2])}, got "
            f"{tuple(labels.shape)}"
        )
    shifted = labels[:, 1:]
    if valid is not None:
        shifted = shifted.masked_fill(~(valid[:, 1:] & valid[:, :-1]), IGNORE)
    if packing is not None and packing.packed:
        starts = [c - 1 for c in packing.cu_seqlens[1:-1] if 0 < c < labels.shape[1]]
        if starts:
            shifted = shifted.clone()
            shifted[:, starts] = IGNORE
    return F.cross_entropy(
        logits[:, :-1].flatten(0, 1), shifted.flatten().to(logits.device), ignore_index=IGNORE
    )


def check_generation(
    input_ids, max_new_tokens, attention_mask, do_sample, temperature, top_k, top_p
) -> bool:
    """Validate the arguments of ``generate``; returns whether it samples."""
    if not isinstance(input_ids, Tensor) or input_ids.dim() != 2:
        raise ValueError(
            f"input_ids must be a [B, T] tensor of token ids, got "
            f"{tuple(input_ids.shape) if isinstance(input_ids, Tensor) else type(input_ids)}"
        )
    B, T = input_ids.shape
    if B == 0 or T == 0:
        raise ValueError(f"the prompt is empty: input_ids has shape {(B, T)}; give ≥ 1 token")
    if attention_mask is not None:
        if tuple(attention_mask.shape) != (B, T):
            raise ValueError(
                f"attention_mask must have the shape of input_ids {(B, T)}, got "
                f"{tuple(attention_mask.shape)}"
            )
        empty = (~attention_mask.bool().any(1)).nonzero().flatten().tolist()
        if empty:
            raise ValueError(f"prompt rows {empty} are all padding; give each row ≥ 1 token")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, numbers.Integral):
        raise TypeError(f"max_new_tokens must be an int, got {type(max_new_tokens).__name__}")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be ≥ 0, got {max_new_tokens}")
    if do_sample is not None and not isinstance(do_sample, bool):
        raise TypeError(f"do_sample must be a bool or None, got {type(do_sample).__name__}")
    if temperature is not None:
        if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real):
            raise TypeError(f"temperature must be a float, got {type(temperature).__name__}")
        if not math.isfinite(temperature) or temperature < 0:
            raise ValueError(f"temperature must be finite and ≥ 0, got {temperature}")
    sample = do_sample if do_sample is not None else (temperature or 0) > 0
    if sample and temperature is not None and temperature == 0:
        raise ValueError("do_sample=True needs temperature > 0, got temperature=0")
    if top_k is not None:
        if isinstance(top_k, bool) or not isinstance(top_k, numbers.Integral):
            raise TypeError(f"top_k must be an int or None, got {type(top_k).__name__}")
        if top_k < 1:
            raise ValueError(f"top_k must be ≥ 1, got {top_k}")
    if top_p is not None:
        if isinstance(top_p, bool) or not isinstance(top_p, numbers.Real):
            raise TypeError(f"top_p must be a float or None, got {type(top_p).__name__}")
        if not (0 < top_p <= 1):
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    return sample


def sample_next(logits: Tensor, temperature: float, top_k, top_p, gen) -> Tensor:
    """One token per row from ``softmax(logits [B, V] / temperature)``, restricted to the top_k
    most likely tokens and to the smallest set of most likely tokens with probability ≥ top_p."""
    logits = logits.float() / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        before = probs.cumsum(-1) - probs  # mass of the more likely tokens
        drop = before >= top_p  # the first token (before = 0) always stays
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
    return torch.multinomial(logits.softmax(-1), 1, generator=gen)[:, 0]


def cu_seqlens_from_position_ids(position_ids: Tensor | None) -> list[int] | None:
    """Packed documents in transformers' flattening convention (``DataCollatorWithFlattening``:
    one row ``[1, T]`` whose positions restart at 0 at every document start) as offsets; None
    when there is no restart after the first token (one ordinary sequence) or B > 1."""
    if position_ids is None or position_ids.dim() != 2 or position_ids.shape[0] != 1:
        return None
    starts = (position_ids[0, 1:] == 0).nonzero().flatten()
    if starts.numel() == 0:
        return None
    T = position_ids.shape[1]
    return [0, *(starts + 1).tolist(), T]
