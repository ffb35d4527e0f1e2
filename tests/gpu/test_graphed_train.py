"""A training step replayed from a CUDA graph (linrnn.train.GraphedStep) takes the same steps as
eager training: from the same initial weights and batches, with a learning rate that changes
every step, the per-step losses and the final weights of the two runs agree (fp32, no autocast:
the replay runs the eager step's kernels on the same values)."""

from __future__ import annotations

import pytest
import torch

from linrnn.models import CausalLM, LMConfig
from linrnn.train import GraphedStep, TrainConfig, make_optimizer, set_lr, train_step

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

STEPS = 6
MIXERS = [
    ("softmax", {}),
    ("gla", {}),
    ("simple_gla", {}),
    ("rwkv6", {}),
    ("mlstm", {"input_gate": "exp"}),
    ("gated_delta_net", {}),
    ("mamba2", {}),
]


def _run(mixer, kwargs, graphed: bool, seed: int):
    torch.manual_seed(seed)
    cfg = TrainConfig(d_model=64, num_layers=2, num_heads=2, lr=3e-3, grad_clip=0.5)
    lm = LMConfig(vocab_size=256, d_model=64, num_layers=2, num_heads=2, mixer=mixer,
                  mixer_kwargs=kwargs)  # fmt: skip
    model = CausalLM(lm, device="cuda")
    opt = make_optimizer(model, cfg, fused=True)
    gen = torch.Generator().manual_seed(seed + 1)
    batches = [torch.randint(0, 256, (2, 257), generator=gen).cuda() for _ in range(STEPS)]
    lrs = [3e-3 * (i + 1) / STEPS for i in range(STEPS)]
    step = GraphedStep(model, opt, None, cfg.grad_clip) if graphed else None
    scaler = torch.amp.GradScaler("cuda", enabled=False)
    losses = []
    for b, lr in zip(batches, lrs):
        x, y = b[:, :-1].contiguous(), b[:, 1:].contiguous()
        if graphed:
            loss = step(x, y, lr)
        else:
            set_lr(opt, lr)
            loss = train_step(model, opt, scaler, x, y, _off, cfg.grad_clip)
        losses.append(loss.item())
    return losses, [p.detach().clone() for p in model.parameters()], step


def _off():
    return torch.autocast("cuda", enabled=False)


@pytest.mark.parametrize("mixer,kwargs", MIXERS, ids=[m + "_exp" * bool(k) for m, k in MIXERS])
def test_graphed_steps_match_eager_steps(mixer, kwargs):
    seed = torch.randint(0, 2**31 - 1, ()).item()
    eager, w_eager, _ = _run(mixer, kwargs, False, seed)
    graphed, w_graph, step = _run(mixer, kwargs, True, seed)
    assert step.graph is not None  # the later steps were replays
    assert all(v == v for v in graphed)
    for i, (a, b) in enumerate(zip(eager, graphed)):
        assert abs(a - b) <= 1e-4 * abs(a), (seed, i, a, b)
    assert eager[-1] != eager[0]  # the runs trained
    for a, b in zip(w_eager, w_graph):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5, msg=lambda m: f"seed {seed}: {m}")


def test_batches_gathered_on_the_device_are_the_hosts():
    from linrnn.train import DEFAULT_DATA, data_on, get_batch, load_bytes

    train, val = load_bytes(DEFAULT_DATA, 0.1)
    dev_train, dev_val = data_on(torch.device("cuda"), train, val)
    assert dev_train.is_cuda and dev_val.is_cuda
    for data, dev in ((train, dev_train), (val, dev_val)):
        a = get_batch(data, 4, 300, torch.Generator().manual_seed(5), "cuda")
        b = get_batch(dev, 4, 300, torch.Generator().manual_seed(5), "cuda")
        assert all(torch.equal(x, y) for x, y in zip(a, b))
