"""Decoding with CUDA graphs: a model's one-token step captured once, replayed per token.

A decode step of a :class:`~linrnn.models.CausalLM` with a linear mixer is a fixed sequence of
kernel launches on tensors of fixed shapes — exactly what a CUDA graph replays without the
Python and launch overhead that dominates small-batch decoding. What makes it capturable:

* **static buffers**: a :class:`StaticCache` keeps every layer's state in tensors that never
  move; each step writes the new state *into* them (the Triton decode kernel writes over the
  old state directly; elsewhere the new state is copied in), and the token ids go into one
  static input tensor;
* **no host syncs**: value checks of the inputs are skipped while a graph is captured (see
  :func:`linrnn.set_checks`), the decode path reads no tensor values on the host, and the
  layers make no data-dependent Python choices for one-token, unpadded inputs.

:class:`DecodeGraph` (made by :func:`capture_decode`) does the capture and the replay. On a
CPU (or with ``graph=False``) it runs the same static-buffer step eagerly, so its logic is the
same everywhere and testable without a GPU.

Example::

    cache = Cache()
    logits = model(prompt_ids, cache=cache).logits[:, -1]  # prefill [B, T]
    dec = linrnn.graphs.capture_decode(model, cache)  # static copy of the cache; captures
    tok = logits.argmax(-1)
    for _ in range(100):
        tok = dec.step(tok).argmax(-1)  # logits [B, vocab] of the next position

Softmax attention (its key/value cache grows every step) cannot be captured this way.
"""

from __future__ import annotations

import torch
from torch import Tensor

from linrnn.layers.common import Cache


def _clone(x):
    if isinstance(x, Tensor):
        return x.detach().clone(memory_format=torch.contiguous_format)
    if isinstance(x, (tuple, list)):
        return type(x)(_clone(p) for p in x)
    return x


def _copy_into(dst, src) -> None:
    """Copy ``src`` into the tensors of ``dst`` (same structure); a part that *is* its
    destination (written in place already) is skipped."""
    if isinstance(dst, Tensor):
        if src is not dst:
            dst.copy_(src)
    elif isinstance(dst, (tuple, list)):
        if not isinstance(src, (tuple, list)) or len(src) != len(dst):
            raise ValueError(f"cache entry changed structure: {type(dst)} → {type(src)}")
        for d, s in zip(dst, src):
            _copy_into(d, s)
    elif dst is not None or src is not None:
        raise ValueError(f"cache entry changed structure: {type(dst)} → {type(src)}")


class StaticCache(Cache):
    """A :class:`~linrnn.layers.Cache` whose tensors never move: once a layer has an entry,
    :meth:`update` copies the new values into the existing tensors (the same keys and shapes
    are required). Layers see ``inplace_state = True`` and let the Triton decode kernel write
    the new state over the old one, so the copy is skipped there."""

    inplace_state = True

    @classmethod
    def from_cache(cls, cache: Cache) -> StaticCache:
        """A static copy of ``cache`` (every tensor cloned, contiguous)."""
        out = cls()
        out.layers = {i: {key: _clone(x) for key, x in e.items()} for i, e in cache.layers.items()}
        out.seen_tokens = cache.seen_tokens
        return out

    def update(self, layer_idx: int, entry: dict) -> None:
        old = self.layers.get(layer_idx)
        if old is None:
            self.layers[layer_idx] = {key: _clone(x) for key, x in entry.items()}
            return
        if set(old) != set(entry):
            raise ValueError(
                f"StaticCache: layer {layer_idx} changed its entries {sorted(old)} → "
                f"{sorted(entry)}"
            )
        for key, new in entry.items():
            _copy_into(old[key], new)

    def load(self, cache: Cache) -> None:
        """Copy another cache's tensors (same layers, keys and shapes) into these buffers:
        one captured graph then serves a new prompt."""
        if set(cache.layers) != set(self.layers):
            raise ValueError(f"layers {sorted(cache.layers)} ≠ {sorted(self.layers)}")
        for i, entry in cache.layers.items():
            self.update(i, entry)
        self.seen_tokens = cache.seen_tokens


def _tensors(x):
    if isinstance(x, Tensor):
        yield x
    elif isinstance(x, (tuple, list)):
        for p in x:
            yield from _tensors(p)
    elif isinstance(x, dict):
        for p in x.values():
            yield from _tensors(p)


class DecodeGraph:
    """One-token decode step of ``model`` on static buffers, captured into a CUDA graph.

    Args:
        model: a :class:`~linrnn.models.CausalLM` (any linear mixer; not ``"softmax"``).
        cache: a prefilled :class:`~linrnn.layers.Cache` (``model(prompt, cache=cache)``); it is
            copied into a :class:`StaticCache` (``self.cache``), which every step updates.
        graph: capture a CUDA graph (default: when the model is on a CUDA device). False runs
            the same step eagerly (CPU, debugging).
        warmup: eager steps on a side stream before the capture (CUDA's requirement: lazy
            initialization, Triton compilation); the cache is restored afterwards.
        pool: optional graph memory pool to share with other graphs
            (``torch.cuda.graph_pool_handle()``).

    :meth:`step` takes the token ids ``[B]`` (or ``[B, 1]``) and returns the logits
    ``[B, vocab]`` of the next position. With a graph these logits live in a static buffer
    that the next step overwrites: clone them to keep them.
    """

    def __init__(self, model, cache: Cache, *, graph: bool | None = None, warmup: int = 2,
                 pool=None) -> None:  # fmt: skip
        mixer = getattr(getattr(model, "config", None), "mixer", None)
        if mixer == "softmax":
            raise ValueError(
                "softmax attention's key/value cache grows every step, so its decode step "
                "cannot be captured; use a linear mixer"
            )
        if not len(cache):
            raise ValueError("cache is empty: prefill it first (model(prompt, cache=cache))")
        self.model = model
        self.cache = StaticCache.from_cache(cache)
        first = next(_tensors(self.cache.layers))
        self.batch_size = first.shape[0]
        self.device = next(model.parameters()).device
        self.ids = torch.zeros(self.batch_size, 1, dtype=torch.long, device=self.device)
        self.graph = None
        self.logits = None
        use_graph = self.device.type == "cuda" if graph is None else graph
        if use_graph:
            if self.device.type != "cuda":
                raise ValueError(f"graph=True needs a CUDA model, got device {self.device}")
            self._capture(warmup, pool)

    def _run(self) -> Tensor:
        with torch.no_grad():
            return self.model(self.ids, cache=self.cache).logits[:, -1]

    def _capture(self, warmup: int, pool) -> None:
        saved = [t.clone() for t in _tensors(self.cache.layers)]
        seen = self.cache.seen_tokens
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(max(warmup, 1)):
                self._run()
        torch.cuda.current_stream(self.device).wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            self.logits = self._run()
        for t, s in zip(_tensors(self.cache.layers), saved):  # undo the warm-up steps
            t.copy_(s)
        self.cache.seen_tokens = seen

    def step(self, ids: Tensor) -> Tensor:
        """Advance every row by its token ``ids [B]``; returns the logits ``[B, vocab]``."""
        if ids.numel() != self.batch_size:
            raise ValueError(f"expected {self.batch_size} token ids, got shape {tuple(ids.shape)}")
        seen = self.cache.seen_tokens
        self.ids.copy_(ids.reshape(self.batch_size, 1))
        if self.graph is not None:
            self.graph.replay()
            logits = self.logits
        else:
            logits = self._run()
        self.cache.seen_tokens = seen + 1
        return logits

    def load(self, cache: Cache) -> None:
        """Start from another prefilled cache (same batch size and model): copies it into the
        static buffers, so the captured graph serves a new prompt."""
        self.cache.load(cache)

    @torch.no_grad()
    def generate(self, first_ids: Tensor, max_new_tokens: int) -> Tensor:
        """Greedy decoding from ``first_ids [B]`` (the token after the prefilled prompt):
        returns ``[B, max_new_tokens]``, ``first_ids`` first."""
        out = [first_ids.reshape(self.batch_size)]
        for _ in range(max_new_tokens - 1):
            out.append(self.step(out[-1]).argmax(-1))
        return torch.stack(out, dim=1)


def capture_decode(model, cache: Cache, **kwargs) -> DecodeGraph:
    """:class:`DecodeGraph` ``(model, cache, **kwargs)``: a static-buffer decode step,
    captured into a CUDA graph on CUDA devices (see the module docstring)."""
    return DecodeGraph(model, cache, **kwargs)
