"""Train a small byte-level language model on the shipped corpus (``linrnn/data/shakespeare.txt``,
package data: it is installed with linrnn).

``python -m linrnn.train`` (or ``python -m linrnn train``) with the defaults trains a 2-layer,
width-128 GLA model on a CPU in a few minutes; on a CUDA GPU the same command uses the Triton
kernels (bf16 autocast). It prints a progress bar (tqdm if installed), evaluates train and
validation loss periodically, and writes into ``--out``:

- ``history.json``: the losses and the run's settings;
- ``loss.png``: the loss curves (needs matplotlib; skipped with a message otherwise);
- ``checkpoint/``: ``config.json`` and ``model.safetensors`` (periodically and at the end),
  and ``train_state.pt``: what a resumed run needs (optimizer state, step, random states,
  the loss history and the run's settings);
- ``sample.txt``: a generation from the trained model.

With ``--pack`` the text is split into documents (at blank lines) and each training row is
filled with whole documents from a random one on, the last cut at the row's end; the rows go to
the model as one packed sequence with the documents' offsets (``cu_seqlens``), so no state
crosses a document boundary and no document's first byte is predicted from another document.

Tokens are bytes (vocabulary 256): no tokenizer and nothing to download.

``--resume DIR`` continues the run whose outputs are in ``DIR`` from its last checkpoint, with
its saved settings: the losses of the steps after it are the ones the run would have had
without the interruption (bitwise on a CPU).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from linrnn.models import MIXERS, CausalLM, LMConfig

DEFAULT_DATA = Path(__file__).resolve().parent / "data" / "shakespeare.txt"


@dataclass
class TrainConfig:
    """Settings of one run (the command line's options; see ``--help``)."""

    data: str = str(DEFAULT_DATA)
    out: str = "runs/gla"
    mixer: str = "gla"
    mixer_kwargs: dict = field(default_factory=dict)
    d_model: int = 128
    num_layers: int = 2
    num_heads: int = 4
    tie_embeddings: bool = True
    logit_softcap: float | None = None
    seq_len: int = 128
    batch_size: int = 16
    steps: int = 1000
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup: int = 50
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    eval_every: int = 100
    eval_batches: int = 4
    checkpoint_every: int = 0
    val_fraction: float = 0.1
    seed: int = 0
    device: str = "auto"
    amp: str = "auto"
    sample_prompt: str = "HAMLET\n"
    sample_tokens: int = 300
    temperature: float = 0.8
    top_k: int | None = 40
    plot: bool = True
    progress: bool = True
    pack: bool = False
    cuda_graph: bool = False


def _count(minimum: int):
    """An argparse type: an int ≥ ``minimum`` (a bad value is an argument error, exit 2)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be ≥ {minimum}, got {value}")
        return value

    parse.__name__ = f"int ≥ {minimum}"
    return parse


# Settings that count something: the least value each takes.
MINIMUM = {"d_model": 1, "num_layers": 1, "num_heads": 1, "seq_len": 1, "batch_size": 1,
           "steps": 1, "warmup": 0, "eval_every": 0, "eval_batches": 1, "checkpoint_every": 0,
           "sample_tokens": 0}  # fmt: skip


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = TrainConfig()
    p.add_argument("--data", default=d.data, help="training text (bytes); default: the shipped "
                   "corpus linrnn/data/shakespeare.txt")  # fmt: skip
    p.add_argument("--out", default=None, help="output folder (default runs/<mixer>)")
    p.add_argument("--mixer", default=d.mixer, choices=sorted(MIXERS), help="token mixer")
    p.add_argument(
        "--mixer-arg", action="append", default=[], metavar="KEY=VALUE",
        help="extra mixer argument (JSON value or string), e.g. input_gate=sigmoid or "
        "feature_map=performer; repeatable",
    )  # fmt: skip
    for name, kind, text in [
        ("d_model", int, "model width"),
        ("num_layers", int, "number of blocks"),
        ("num_heads", int, "heads per mixer"),
        ("seq_len", int, "training context length (bytes)"),
        ("batch_size", int, "sequences per step"),
        ("steps", int, "optimizer steps"),
        ("lr", float, "peak learning rate (AdamW, cosine schedule after warm-up)"),
        ("warmup", int, "linear warm-up steps"),
        ("weight_decay", float, "AdamW weight decay of the matrices"),
        ("grad_clip", float, "gradient-norm clip (0: off)"),
        ("eval_every", int, "evaluate train/val loss every N steps"),
        ("eval_batches", int, "batches per evaluation"),
        ("checkpoint_every", int, "also save a checkpoint every N steps (0: only at the end)"),
        ("seed", int, "seed of the model, the batches and the sample"),
        ("sample_tokens", int, "bytes to generate at the end"),
        ("temperature", float, "sampling temperature of the final sample (0: greedy)"),
    ]:
        flag = "--" + name.replace("_", "-")
        if name in MINIMUM:
            kind = _count(MINIMUM[name])
        p.add_argument(
            flag, type=kind, default=getattr(d, name), help=f"{text} ({getattr(d, name)})"
        )
    p.add_argument("--top-k", type=int, default=d.top_k, help=f"top-k of the sample ({d.top_k})")
    p.add_argument("--logit-softcap", type=float, default=None, help="logit soft-cap (off)")
    p.add_argument("--untied", action="store_true", help="separate output head")
    p.add_argument("--sample-prompt", default=d.sample_prompt, help="prompt of the final sample")
    p.add_argument("--device", default=d.device, help="auto (cuda if available), cpu, cuda, …")
    p.add_argument(
        "--amp", default=d.amp, choices=["auto", "bf16", "fp16", "off"],
        help="autocast dtype: auto = bf16 on CUDA, off on CPU",
    )  # fmt: skip
    p.add_argument("--no-plot", action="store_true", help="skip loss.png")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--pack", action="store_true",
        help="train on whole documents (split at blank lines) packed with their boundaries, "
        "instead of windows cut from one stream",
    )  # fmt: skip
    p.add_argument(
        "--cuda-graph", action="store_true",
        help="capture the training step in a CUDA graph and replay it (CUDA; fixed shapes: "
        "not with --pack or --amp fp16)",
    )  # fmt: skip
    p.add_argument(
        "--resume", metavar="DIR", default=None,
        help="continue the run saved in DIR (its --out folder) from its last checkpoint, with "
        "its saved settings (the other options are ignored)",
    )  # fmt: skip


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    mixer_kwargs = {}
    for item in args.mixer_arg:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--mixer-arg expects KEY=VALUE, got {item!r}")
        try:
            mixer_kwargs[key] = json.loads(value)
        except json.JSONDecodeError:
            mixer_kwargs[key] = value
    return TrainConfig(
        data=args.data, out=args.out or f"runs/{args.mixer}", mixer=args.mixer,
        mixer_kwargs=mixer_kwargs, d_model=args.d_model, num_layers=args.num_layers,
        num_heads=args.num_heads, tie_embeddings=not args.untied,
        logit_softcap=args.logit_softcap, seq_len=args.seq_len, batch_size=args.batch_size,
        steps=args.steps, lr=args.lr, warmup=args.warmup, weight_decay=args.weight_decay,
        grad_clip=args.grad_clip, eval_every=args.eval_every, eval_batches=args.eval_batches,
        checkpoint_every=args.checkpoint_every, seed=args.seed, device=args.device,
        amp=args.amp, sample_prompt=args.sample_prompt, sample_tokens=args.sample_tokens,
        temperature=args.temperature, top_k=args.top_k, plot=not args.no_plot,
        progress=not args.no_progress, pack=args.pack, cuda_graph=args.cuda_graph,
    )  # fmt: skip


def load_bytes(path, val_fraction: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The file as byte ids, split into a training head and a validation tail."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"training text {path} not found; pass --data FILE")
    raw = path.read_bytes()
    if len(raw) < 4:
        raise ValueError(
            f"training text {path} holds {len(raw)} bytes: too little to split into training "
            "and validation text; pass --data with a longer file"
        )
    data = torch.frombuffer(bytearray(raw), dtype=torch.uint8).long()
    n_val = max(int(len(data) * val_fraction), 2)
    return data[:-n_val], data[-n_val:]


# Byte ids up to this many bytes (int64) move to a CUDA device for the run: a batch is then
# gathered there. Gathered on the host (its gather runs on the host's threads), a B8-T8192
# batch took 1-2 ms alone and about 30 ms beside another busy process in a one-off probe on
# the GPU machine, inside every step.
DEVICE_DATA_BYTES = 1 << 30


def data_on(device: torch.device, *splits):
    """The splits on ``device`` where it is a CUDA device and they are small enough
    (:data:`DEVICE_DATA_BYTES`), else as they are (packed documents stay on the host)."""
    if device.type != "cuda" or not all(isinstance(t, torch.Tensor) for t in splits):
        return splits
    if sum(t.numel() * t.element_size() for t in splits) > DEVICE_DATA_BYTES:
        return splits
    return tuple(t.to(device) for t in splits)


@dataclass
class Documents:
    """A text split into documents (``--pack``): byte ids and the documents' offsets."""

    data: torch.Tensor  # [N] byte ids
    offsets: list[int]  # document d is data[offsets[d] : offsets[d + 1]]; 0 first, N last

    def __len__(self) -> int:
        return len(self.data)


def split_documents(data: torch.Tensor, separator: bytes = b"\n\n") -> Documents:
    """Documents end after each ``separator`` (a blank line: the plays' speeches)."""
    raw = bytes(data.to(torch.uint8).tolist())
    offsets, i = [0], raw.find(separator)
    while i != -1:
        end = i + len(separator)
        if end < len(raw):
            offsets.append(end)
        i = raw.find(separator, end)
    offsets.append(len(raw))
    return Documents(data, offsets)


def get_packed_batch(docs: Documents, batch_size: int, seq_len: int, gen, device):
    """``batch_size`` rows of ``seq_len`` bytes, each filled with whole documents from a random
    one on (the last cut at the row's end), as one packed sequence: inputs ``[1, B·L]``,
    aligned next-byte targets ``[1, B·L]`` (``-100`` after a document's last byte) and the
    documents' offsets ``cu_seqlens``."""
    data, off = docs.data, docs.offsets
    n_docs = len(off) - 1
    xs, ys, cu = [], [], [0]
    for first in torch.randint(0, n_docs, (batch_size,), generator=gen).tolist():
        filled, d = 0, first
        while filled < seq_len:
            start, end = off[d], off[d + 1]
            n = min(end - start, seq_len - filled)
            xs.append(data[start : start + n])
            y = data[start + 1 : start + n + 1].clone()
            if start + n == end:  # the document's last byte: nothing of it to predict
                y[-1] = -100
            ys.append(y)
            filled += n
            cu.append(cu[-1] + n)
            d = (d + 1) % n_docs
    return torch.cat(xs)[None].to(device), torch.cat(ys)[None].to(device), cu


def sample_batch(data, cfg: TrainConfig, gen, device):
    """``(inputs, targets, cu_seqlens)``: packed documents for :class:`Documents`, else random
    windows of one stream (cu_seqlens None)."""
    if isinstance(data, Documents):
        return get_packed_batch(data, cfg.batch_size, cfg.seq_len, gen, device)
    x, y = get_batch(data, cfg.batch_size, cfg.seq_len, gen, device)
    return x, y, None


def get_batch(data, batch_size, seq_len, gen, device):
    """Random windows: inputs ``[B, L]`` and the next bytes ``[B, L]``, gathered where ``data``
    lives (the window starts drawn on the host from ``gen``, so the batches do not depend on
    it)."""
    if len(data) < seq_len + 2:
        raise ValueError(
            f"the text ({len(data)} bytes) is shorter than seq_len + 2 = {seq_len + 2}; "
            "lower --seq-len or pass a longer --data file"
        )
    start = torch.randint(0, len(data) - seq_len - 1, (batch_size,), generator=gen)
    idx = start.to(data.device)[:, None] + torch.arange(seq_len + 1, device=data.device)
    chunk = data[idx]
    return chunk[:, :-1].to(device), chunk[:, 1:].to(device)


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up, then cosine decay to ``min_lr_ratio · lr``."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    frac = (step - cfg.warmup) / max(cfg.steps - cfg.warmup, 1)
    cos = 0.5 * (1 + math.cos(math.pi * min(frac, 1.0)))
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * cos)


class Progress:
    """tqdm when it is installed, else a plain bar on stderr (at most ~50 redraws)."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.total, self.enabled, self.n, self.postfix = total, enabled, 0, ""
        self.bar = None
        self.t0 = time.perf_counter()
        if enabled:
            try:
                from tqdm import tqdm
            except ImportError:
                pass
            else:
                self.bar = tqdm(total=total, dynamic_ncols=True)

    def update(self, postfix: str) -> None:
        self.n += 1
        self.postfix = postfix
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.set_postfix_str(postfix, refresh=False)
            self.bar.update(1)
            return
        if self.n == self.total or self.n % max(self.total // 50, 1) == 0:
            filled = int(30 * self.n / self.total)
            rate = self.n / max(time.perf_counter() - self.t0, 1e-9)
            sys.stderr.write(
                f"\r[{'#' * filled}{'.' * (30 - filled)}] {self.n}/{self.total} "
                f"{rate:.1f} it/s {postfix}"
            )
            sys.stderr.flush()

    def write(self, line: str) -> None:
        if self.bar is not None:
            self.bar.write(line)
        else:
            if self.enabled:
                sys.stderr.write("\n")
            print(line, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        elif self.enabled:
            sys.stderr.write("\n")


def make_optimizer(model: CausalLM, cfg: TrainConfig, fused: bool) -> torch.optim.Optimizer:
    """AdamW (β = 0.9, 0.95); weight decay on the matrices, not on norms, biases, gates'
    vectors or the embedding."""
    embed = {id(model.embed.weight)}
    decay, no_decay = [], []
    for p in model.parameters():
        (decay if p.dim() >= 2 and id(p) not in embed else no_decay).append(p)
    groups = [
        {"params": decay, "weight_decay": cfg.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95), fused=fused or None)


@torch.no_grad()
def evaluate(model, splits, cfg, device, autocast) -> dict[str, float]:
    """Mean loss over ``eval_batches`` fixed batches of each split."""
    model.eval()
    out = {}
    for name, data in splits.items():
        gen = torch.Generator().manual_seed(cfg.seed + 1)  # the same batches every time
        losses = []
        for _ in range(cfg.eval_batches):
            x, y, cu = sample_batch(data, cfg, gen, device)
            with autocast():
                losses.append(model(x, targets=y, cu_seqlens=cu).loss.item())
        out[name] = sum(losses) / len(losses)
    model.train()
    return out


def plot_history(history: dict, path: Path) -> str:
    """Write the loss curves; returns a message (also when matplotlib is missing)."""
    try:
        import matplotlib
    except ImportError:
        return "loss plot skipped: matplotlib is not installed (pip install matplotlib==3.10.0)"
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    steps, losses = zip(*history["train_step_loss"])
    ax.plot(steps, losses, lw=0.6, alpha=0.5, label="train (per step)")
    if history["eval"]:
        es = [e["step"] for e in history["eval"]]
        ax.plot(es, [e["train"] for e in history["eval"]], "o-", label="train (eval)")
        ax.plot(es, [e["val"] for e in history["eval"]], "s-", label="validation")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats / byte)")
    ax.set_title(f"{history['config']['mixer']}: byte-level LM")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return f"loss plot: {path}"


AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "off": None}


def resolve_device(cfg: TrainConfig):
    """``(device, amp, autocast)`` of a run: ``device="auto"`` is CUDA when available, and
    ``amp="auto"`` is bf16 on CUDA, off on CPU; ``autocast()`` is the matching context (the
    parameters and AdamW's state stay fp32)."""
    device = torch.device(
        ("cuda" if torch.cuda.is_available() else "cpu") if cfg.device == "auto" else cfg.device
    )
    amp = cfg.amp
    if amp == "auto":
        amp = "bf16" if device.type == "cuda" else "off"
    amp_dtype = AMP_DTYPES[amp]

    def autocast():
        return torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None)

    return device, amp, autocast


def model_config(cfg: TrainConfig, **overrides) -> LMConfig:
    """The byte-level :class:`LMConfig` of a run; ``overrides`` set other LMConfig fields
    (e.g. ``backend``, ``chunk_size``)."""
    return LMConfig(
        vocab_size=256, d_model=cfg.d_model, num_layers=cfg.num_layers,
        num_heads=cfg.num_heads, mixer=cfg.mixer, mixer_kwargs=cfg.mixer_kwargs,
        tie_embeddings=cfg.tie_embeddings, logit_softcap=cfg.logit_softcap, **overrides,
    )  # fmt: skip


def train_step(
    model, opt, scaler, x, y, autocast, grad_clip: float, cu_seqlens=None
) -> torch.Tensor:
    """One optimizer step on the batch ``(x, y)`` (packed documents with ``cu_seqlens``; the
    learning rate is the caller's); returns the loss, not yet synchronized (``.item()`` waits
    for the step)."""
    with autocast():
        loss = model(x, targets=y, cu_seqlens=cu_seqlens).loss
    opt.zero_grad(set_to_none=True)
    scaler.scale(loss).backward()
    if grad_clip > 0:
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    scaler.step(opt)
    scaler.update()
    return loss


class GraphedStep:
    """:func:`train_step` captured once in a CUDA graph and replayed every step after.

    An eager step of a small model is host-bound: the host needs about as long to queue its
    hundreds of launches (autograd, PyTorch's dispatcher, Triton's launcher) as the GPU needs
    to run them, so the GPU waits. A replay queues the whole step at once. What it takes:

    * **static inputs**: each step's batch is copied into the tensors the graph reads;
    * **a capturable optimizer**: the learning rate becomes a tensor on the device (each step's
      value is written into it before the replay) and AdamW runs with ``capturable=True``, its
      step counters on the device;
    * **no host work on tensor values**: linrnn's ops read none while a graph is captured, and
      autocast's weight cache is off inside the graph (PyTorch's rule for graphed regions).

    The first ``warmup`` calls run eagerly on a side stream (the allocator, cuBLAS's workspaces
    and the Triton kernels are ready before the capture); the next call captures and replays.
    Every call is one real optimizer step, so a run's losses match an eager run's. Fixed
    shapes only: no packed documents (their boundaries change per batch), and no fp16 autocast
    (its loss scaler reads the gradients' overflow on the host). Drop the losses of any eager
    steps taken on the model before: each keeps its autograd graph, whose gradient
    accumulators belong to the default stream, and a capture that meets them fails. On a CPU
    the steps run eagerly, the same code without the graph::

        step = GraphedStep(model, opt, torch.bfloat16, grad_clip=1.0)
        for i in range(steps):
            loss = step(x, y, lr_at(i, cfg)).item()
    """

    def __init__(self, model, opt, amp_dtype, grad_clip: float, warmup: int = 2) -> None:
        if amp_dtype is torch.float16:
            raise ValueError("a graphed step takes bf16 autocast or none, not fp16 (its loss "
                             "scaler reads the gradients' overflow on the host)")  # fmt: skip
        if warmup < 1:
            raise ValueError(f"warmup must be ≥ 1 eager step before the capture, got {warmup}")
        self.model, self.opt, self.amp_dtype, self.grad_clip = model, opt, amp_dtype, grad_clip
        self.device = next(model.parameters()).device
        self.graphed = self.device.type == "cuda"
        self.warmup, self.calls = warmup, 0
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=False)
        self.graph = self.x = self.y = self.loss = None
        if self.graphed:
            self.stream = torch.cuda.Stream(self.device)
            for group in opt.param_groups:  # one device tensor per group, written per step
                group["lr"] = torch.tensor(float(group["lr"]), device=self.device)
                group["capturable"] = True

    def _autocast(self):
        return torch.autocast(self.device.type, dtype=self.amp_dtype,
                              enabled=self.amp_dtype is not None, cache_enabled=False)  # fmt: skip

    def _step(self, x, y):
        return train_step(self.model, self.opt, self.scaler, x, y, self._autocast,
                          self.grad_clip)  # fmt: skip

    def __call__(self, x, y, lr: float) -> torch.Tensor:
        """One optimizer step on ``(x, y)`` at learning rate ``lr``; the loss, not yet
        synchronized."""
        set_lr(self.opt, lr)
        self.calls += 1
        if not self.graphed:
            return self._step(x, y)
        if self.graph is None and self.calls <= self.warmup:
            self.stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(self.stream):
                loss = self._step(x, y)
            torch.cuda.current_stream(self.device).wait_stream(self.stream)
            return loss
        if self.graph is None:
            self._capture(x, y)
        elif x.shape != self.x.shape or y.shape != self.y.shape:
            raise ValueError(f"a graphed step takes the captured batch shape "
                             f"{tuple(self.x.shape)}, got {tuple(x.shape)}")  # fmt: skip
        self.x.copy_(x)
        self.y.copy_(y)
        self.graph.replay()
        return self.loss.clone()

    def _capture(self, x, y) -> None:
        self.x, self.y = x.clone(), y.clone()
        torch.cuda.current_stream(self.device).synchronize()
        self.opt.zero_grad(set_to_none=True)  # the gradients come from the graph's pool
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, stream=self.stream):
            self.loss = self._step(self.x, self.y)


def set_lr(opt: torch.optim.Optimizer, lr: float) -> None:
    """Every parameter group's learning rate to ``lr`` (written into the tensor a graphed
    step's optimizer holds, :class:`GraphedStep`)."""
    for group in opt.param_groups:
        if isinstance(group["lr"], torch.Tensor):
            group["lr"].fill_(lr)
        else:
            group["lr"] = lr


def train(cfg: TrainConfig, resume: str | Path | None = None) -> dict:
    """Run training; returns the history (also written to ``out/history.json``). ``resume``: a
    run folder (or its ``checkpoint/``) whose saved state the run continues from; ``cfg``
    must then be that run's settings (:func:`resume_config` reads them)."""
    check_config(cfg)
    device, amp, autocast = resolve_device(cfg)
    if cfg.cuda_graph and device.type != "cuda":
        raise ValueError(f"cuda_graph needs a CUDA device, got {device}")
    torch.manual_seed(cfg.seed)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    train_data, val_data = load_bytes(cfg.data, cfg.val_fraction)
    if cfg.pack:
        train_data, val_data = split_documents(train_data), split_documents(val_data)
    train_data, val_data = data_on(device, train_data, val_data)
    model_cfg = model_config(cfg)
    model = CausalLM(model_cfg, device=device)
    opt = make_optimizer(model, cfg, fused=device.type == "cuda")
    scaler = torch.amp.GradScaler(device.type, enabled=amp == "fp16")
    gen = torch.Generator().manual_seed(cfg.seed)
    history = {"config": asdict(cfg), "model": asdict(model_cfg), "device": str(device),
               "parameters": model.num_parameters(), "train_step_loss": [], "eval": []}  # fmt: skip
    start = 0
    if resume is not None:
        start = restore_checkpoint(resume, cfg, model, opt, scaler, gen, history, device)
    graphed = GraphedStep(model, opt, AMP_DTYPES[amp], cfg.grad_clip) if cfg.cuda_graph else None
    bar = Progress(cfg.steps - start, cfg.progress)
    bar.write(
        f"linrnn.train: {cfg.mixer}, {model.num_parameters():,} parameters, {device} "
        f"(autocast {amp}{', CUDA graph' if graphed else ''}), {len(train_data):,} training "
        f"bytes, {cfg.steps} steps of "
        f"{cfg.batch_size}×{cfg.seq_len}" + (f", resumed at step {start}" if resume else "")
    )
    t0 = time.perf_counter()
    for step in range(start, cfg.steps):
        x, y, cu = sample_batch(train_data, cfg, gen, device)
        if graphed is not None:
            value = graphed(x, y, lr_at(step, cfg)).item()
        else:
            set_lr(opt, lr_at(step, cfg))
            value = train_step(model, opt, scaler, x, y, autocast, cfg.grad_clip, cu).item()
        if not math.isfinite(value):
            bar.close()
            raise FloatingPointError(f"loss became {value} at step {step}")
        history["train_step_loss"].append((step, value))
        bar.update(f"loss {value:.3f}")
        last = step + 1 == cfg.steps
        if (cfg.eval_every and (step + 1) % cfg.eval_every == 0) or last:
            ev = evaluate(model, {"train": train_data, "val": val_data}, cfg, device, autocast)
            history["eval"].append({"step": step + 1, **ev, "time_s": time.perf_counter() - t0})
            bar.write(f"step {step + 1:>6}: train {ev['train']:.4f}  val {ev['val']:.4f}")
        if cfg.checkpoint_every and (step + 1) % cfg.checkpoint_every == 0 and not last:
            save_checkpoint(out / "checkpoint", step + 1, cfg, model, opt, scaler, gen, history)
    bar.close()
    history["train_time_s"] = time.perf_counter() - t0
    save_checkpoint(out / "checkpoint", cfg.steps, cfg, model, opt, scaler, gen, history)
    print(f"checkpoint: {out / 'checkpoint'}")

    model.eval()
    prompt = torch.tensor([list(cfg.sample_prompt.encode())], dtype=torch.long, device=device)
    with autocast():
        ids = model.generate(
            prompt, cfg.sample_tokens, temperature=cfg.temperature, top_k=cfg.top_k,
            seed=cfg.seed,
        )  # fmt: skip
    sample = bytes(ids[0].tolist()).decode("utf-8", errors="replace")
    (out / "sample.txt").write_text(sample + "\n")
    history["sample"] = sample
    print(f"sample ({cfg.sample_tokens} bytes, temperature {cfg.temperature}):\n{sample}\n")
    (out / "history.json").write_text(json.dumps(history, indent=1) + "\n")
    if cfg.plot:
        print(plot_history(history, out / "loss.png"))
    return history


def check_config(cfg: TrainConfig) -> None:
    """Raise a ValueError naming the first setting out of its range."""
    for name, least in MINIMUM.items():
        value = getattr(cfg, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(f"{name} must be an int ≥ {least}, got {value!r}")
    if not 0 < cfg.val_fraction < 1:
        raise ValueError(f"val_fraction must lie in (0, 1), got {cfg.val_fraction!r}")
    if cfg.cuda_graph and cfg.pack:
        raise ValueError("cuda_graph takes fixed batch shapes: not with pack (each batch's "
                         "document boundaries differ)")  # fmt: skip
    if cfg.cuda_graph and cfg.amp == "fp16":
        raise ValueError("cuda_graph takes amp bf16 or off, not fp16 (its loss scaler reads "
                         "the gradients' overflow on the host)")  # fmt: skip


# --------------------------------------------------------------------------------------------
# Checkpoints that a run can resume from

STATE_NAME = "train_state.pt"
STATE_FORMAT = 1


def save_checkpoint(directory: Path, step: int, cfg, model, opt, scaler, gen, history) -> None:
    """Write the weights (``config.json``, ``model.safetensors``) and ``train_state.pt``: the
    number of steps done, the weights again (so that they and the optimizer state always
    belong to the same step, even if the run dies between the two files), the optimizer and
    grad-scaler state, the batch generator (the data position) and the global random states,
    the loss history and the settings. The state file is replaced atomically."""
    model.save_pretrained(directory)
    state = {
        "format": STATE_FORMAT,
        "step": step,
        "config": asdict(cfg),
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "scaler": scaler.state_dict(),
        "batch_rng": gen.get_state(),
        "torch_rng": torch.get_rng_state(),
        "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "history": {"train_step_loss": list(history["train_step_loss"]),
                    "eval": list(history["eval"])},
    }  # fmt: skip
    tmp = directory / (STATE_NAME + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, directory / STATE_NAME)


def _state_path(run: str | Path) -> Path:
    """``train_state.pt`` of a run folder or of its ``checkpoint/`` folder."""
    run = Path(run)
    for path in (run / "checkpoint" / STATE_NAME, run / STATE_NAME):
        if path.is_file():
            return path
    raise FileNotFoundError(
        f"no training state to resume in {run}: expected {run / 'checkpoint' / STATE_NAME} "
        "(written at every checkpoint; runs saved without it keep only their weights)"
    )


def load_state(run: str | Path) -> dict:
    state = torch.load(_state_path(run), map_location="cpu", weights_only=True)
    if state.get("format") != STATE_FORMAT:
        raise ValueError(
            f"{_state_path(run)} has format {state.get('format')!r}, this linrnn reads "
            f"format {STATE_FORMAT}"
        )
    return state


def resume_config(run: str | Path, **overrides) -> TrainConfig:
    """The settings of the run saved in ``run``, with ``out`` set to ``run`` (the run folder)
    and ``overrides`` (e.g. ``progress=False``) applied."""
    saved = dict(load_state(run)["config"])
    path = _state_path(run)
    saved["out"] = str(path.parent.parent)
    saved.update(overrides)
    return TrainConfig(**saved)


def restore_checkpoint(run, cfg, model, opt, scaler, gen, history, device) -> int:
    """Load the state saved in ``run`` into the fresh run's objects; returns the step to
    continue from. The settings that shape the run must equal the saved ones."""
    state = load_state(run)
    saved = state["config"]
    keep = ("out", "progress", "plot")  # where and how it reports may differ
    diff = {k: (saved[k], v) for k, v in asdict(cfg).items() if k not in keep and saved.get(k) != v}
    if diff:
        text = ", ".join(f"{k}: saved {a!r}, now {b!r}" for k, (a, b) in sorted(diff.items()))
        raise ValueError(f"cannot resume {run} with other settings ({text})")
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    scaler.load_state_dict(state["scaler"])
    gen.set_state(state["batch_rng"])
    torch.set_rng_state(state["torch_rng"])
    if state["cuda_rng"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda_rng"])
    history["train_step_loss"] = [tuple(x) for x in state["history"]["train_step_loss"]]
    history["eval"] = list(state["history"]["eval"])
    model.to(device)
    return int(state["step"])


def main(args: argparse.Namespace) -> int:
    try:
        if args.resume is not None:
            cfg = resume_config(args.resume, progress=not args.no_progress, plot=not args.no_plot)
        else:
            cfg = config_from_args(args)
        load_bytes(cfg.data, cfg.val_fraction)  # a missing or empty file: a message, no trace
    except (FileNotFoundError, ValueError) as e:
        raise SystemExit(f"linrnn.train: {e}") from None
    train(cfg, resume=args.resume)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m linrnn.train",
        description="Train a small byte-level language model on the shipped corpus.",
    )
    add_arguments(p)
    return p


if __name__ == "__main__":
    sys.exit(main(build_parser().parse_args()))
