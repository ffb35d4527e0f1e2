"""Host-side hardening: the ops' front ends, the chunk-size rule, training resume, ``step`` and
``context_parallel`` argument handling.

* torch.compile with ``dynamic=True`` (every Python float a symbol) and with ``mark_dynamic``
  on T: scalar arguments are checked without reading the symbol, and T that is not a multiple
  of the chunk length compiles once for all lengths (inductor on CPU for a layer and the model);
* ``chunk_size`` larger than T is clamped (same results, no huge allocation), nonsense refused;
* ``step`` takes a family name like ``context_parallel``; flags take numpy bools.
"""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
import torch._dynamo.testing
import torch.nn.functional as F
from helpers import FAMILIES, assert_close, flat_state

import linrnn
from linrnn.models import CausalLM, LMConfig
from linrnn.models.causal_lm import MIXERS

B, H, K, V = 2, 2, 8, 8
L = 4  # chunk length: the lengths below cross its multiples


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _counter(backend: str = "aot_eager"):
    return torch._dynamo.testing.CompileCounterWithBackend(backend)


def _delta_inputs(T: int, gated: bool) -> dict:
    q, k = (torch.randn(B, T, H, K) for _ in range(2))
    k = F.normalize(k, dim=-1)
    inputs = {"q": q, "k": k, "v": torch.randn(B, T, H, V), "beta": torch.rand(B, T, H)}
    if gated:
        inputs["g"] = F.logsigmoid(torch.randn(B, T, H))
    return inputs


def _delta_call(gated: bool):
    def call(inputs, **kw):
        fn = linrnn.gated_delta_rule if gated else linrnn.delta_rule
        args = [inputs[n] for n in ("q", "k", "v", *(("g",) if gated else ()), "beta")]
        return fn(*args, **kw)

    return call


# Every family: (how to call it, how to build its inputs for a length T). The delta rule's
# PyTorch chunk walk compiles once per chunk count (linrnn/engine/torch_delta.py): its lengths
# share one count.
OPS = {name: (fam.call, lambda T, fam=fam: fam.build(B, T, H, K, V, False)) for name, fam in
       FAMILIES.items()}  # fmt: skip
OPS["delta_rule"] = (_delta_call(False), lambda T: _delta_inputs(T, False))
OPS["gated_delta_rule"] = (_delta_call(True), lambda T: _delta_inputs(T, True))
LENGTHS = {"delta_rule": (5, 8), "gated_delta_rule": (5, 8)}
# Recompilations after the first length: gla with gv keeps its chunk scan a loop when traced
# (documented), so a new chunk count recompiles.
FRAMES = {"gla_gv": 1}


def _float32(inputs: dict) -> dict:
    return {n: t.float() for n, t in inputs.items()}


# ------------------------------------------------------------------------------------------
# torch.compile: symbolic scalars, lengths that are not multiples of the chunk length


@pytest.mark.parametrize("name", list(OPS))
def test_compile_dynamic_true_with_float_scale(name):
    """``dynamic=True`` makes the Python float ``scale`` (and ``eps``) symbols: validating them
    must not call math.isfinite or float() on the symbol. One graph for lengths on both sides
    of chunk multiples (12 and 8 are ones), two scale values; equal to eager."""
    call, build = OPS[name]

    def f(inputs, scale):
        return call(inputs, scale=scale, chunk_size=L, backend="torch", output_final_state=True)

    cnt = _counter("eager")  # dynamo's guards; AOT's and inductor's: the tests below
    compiled = torch.compile(f, backend=cnt, fullgraph=True, dynamic=True)
    frames = []
    for T, scale in zip(LENGTHS.get(name, (7, 12)), (0.3, 0.7)):
        inputs = _float32(build(T))
        o, st = compiled(inputs, scale)
        frames.append(cnt.frame_count)
        o_ref, st_ref = f(inputs, scale)
        assert_close(f"{name} o T={T}", o, o_ref, torch.float32)
        for j, (s, s_ref) in enumerate(zip(flat_state(st), flat_state(st_ref))):
            assert_close(f"{name} state[{j}] T={T}", s, s_ref, torch.float32)
    # (The first call may count twice: dynamo restarts its analysis once to specialize a float
    # that inductor's scalar pass cannot keep symbolic.)
    assert frames[-1] - frames[0] == FRAMES.get(name, 0), frames


@pytest.mark.parametrize("name", ["linear_attn", "linear_attn_norm", "mlstm_exp", "delta_rule"])
def test_compile_dynamic_true_with_defaults(name):
    """With every argument at its default (``eps=1e-6`` is a float default: a symbol too)."""
    call, build = OPS[name]
    compiled = torch.compile(lambda x: call(x)[0], backend="eager", fullgraph=True,
                             dynamic=True)  # fmt: skip
    inputs = _float32(build(6))
    assert_close(name, compiled(inputs), call(inputs)[0], torch.float32)


def test_compile_recompile_after_scale_change():
    """``dynamic=None``: the second scale value recompiles with the scale as a symbol; a third
    value reuses that graph."""
    fam = FAMILIES["simple_gla"]
    cnt = _counter()
    compiled = torch.compile(lambda x, s: fam.call(x, scale=s, backend="torch")[0], backend=cnt,
                             fullgraph=True)  # fmt: skip
    inputs = _float32(fam.build(B, 6, H, K, V, False))
    frames = []
    for s in (0.3, 0.5, 0.9):
        assert_close(f"scale {s}", compiled(inputs, s), fam.call(inputs, scale=s)[0], torch.float32)
        frames.append(cnt.frame_count)
    assert frames[2] == frames[1] > frames[0], frames


def _layer_step(module, x, dy):
    y = module(x)
    return y, torch.autograd.grad(y, [x, *module.parameters()], dy, allow_unused=True)


@pytest.mark.interpreter  # the slow tier: inductor's code generation, both passes
@pytest.mark.parametrize("name", ["linear_attn", "mlstm"])
def test_inductor_layer_dynamic_true(name):
    """A layer under inductor with ``dynamic=True`` (its float attributes ``eps``/``scale``
    become symbols), forward and backward, lengths 6 and 9 (chunk length 4): one compilation,
    equal to eager."""
    layer = MIXERS[name](16, 2, chunk_size=L)
    cnt = _counter("inductor")
    compiled = torch.compile(layer, backend=cnt, fullgraph=True, dynamic=True)
    frames = []
    for T in (6, 9):
        x = torch.randn(1, T, 16, requires_grad=True)
        dy = torch.randn(1, T, 16)
        y, grads = _layer_step(compiled, x, dy)
        frames.append(cnt.frame_count)
        y_ref, grads_ref = _layer_step(layer, x, dy)
        assert_close(f"{name} y T={T}", y, y_ref, torch.float32)
        for j, (g, g_ref) in enumerate(zip(grads, grads_ref)):
            if g_ref is not None:
                assert_close(f"{name} grad[{j}] T={T}", g, g_ref, torch.float32)
    assert frames[1] == frames[0], frames  # (the first may count twice: see above)


@pytest.mark.interpreter  # the slow tier: inductor's code generation of a model, both passes
@pytest.mark.parametrize("mixer", ["gla", "mlstm", "simple_gla"])
def test_inductor_model_mark_dynamic(mixer):
    """The README's recipe (``mark_dynamic(ids, 1)``) under inductor, training step: lengths 6
    and 10 are not multiples of the chunk length 4, 12 is; one compilation. (Inductor had laid
    out the ops' transposed outputs on its own and pinned the backward to the first length.)"""
    torch.manual_seed(0)
    cfg = LMConfig(vocab_size=32, d_model=16, num_layers=1, num_heads=2, mixer=mixer,
                   chunk_size=L)  # fmt: skip
    model = CausalLM(cfg)
    cnt = _counter("inductor")
    compiled = torch.compile(model, backend=cnt, fullgraph=True)
    frames = []
    for T in (6, 10, 12):
        ids = torch.randint(0, 32, (1, T))
        torch._dynamo.mark_dynamic(ids, 1)
        loss = compiled(ids, targets=ids).loss
        frames.append(cnt.frame_count)
        grads = torch.autograd.grad(loss, list(model.parameters()))
        loss_ref = model(ids, targets=ids).loss
        grads_ref = torch.autograd.grad(loss_ref, list(model.parameters()))
        assert_close(f"loss T={T}", loss, loss_ref, torch.float32)
        for j, (g, g_ref) in enumerate(zip(grads, grads_ref)):
            assert_close(f"grad[{j}] T={T}", g, g_ref, torch.float32)
    assert frames[-1] == frames[0], frames


# ------------------------------------------------------------------------------------------
# chunk_size: cut to the call's length, nonsense refused


@pytest.mark.parametrize("value", [10**9, 4096, "auto"])
def test_chunk_size_cut_to_length(value):
    """The one chunk-size rule bounds L by the call's length (never below the defaults)."""
    q, v = torch.randn(1, 12, 2, 8), torch.randn(1, 12, 2, 8)
    for backend in ("torch", "triton"):
        r = linrnn.ops._generic.route("gla", q, v, mode="chunk", backend=backend,
                                      chunk_size=value)  # fmt: skip
        assert r.chunk_size <= 128, (backend, r)
    assert linrnn.engine.config.fit_length(64, 12) == 64  # defaults stand
    assert linrnn.engine.config.fit_length(4096, 1000) == 1024
    assert linrnn.engine.config.delta_chunk_size(100, 8, 8, T=12) == 100
    assert linrnn.engine.config.resolve_chunk_size(10**9, 8, 8, triton=False, T=None) == 10**9


def _huge_vs_default(name, backend, T=12):
    call, build = OPS[name]
    inputs = _float32(build(T)) if backend == "triton" else build(T)
    kw = dict(mode="chunk", backend=backend, output_final_state=True)
    o, st = call(inputs, chunk_size=10**9, **kw)
    o_ref, st_ref = call(inputs, **kw)
    dtype = o.dtype
    assert_close(f"{name} {backend} o", o, o_ref, dtype)
    for j, (s, s_ref) in enumerate(zip(flat_state(st), flat_state(st_ref))):
        assert_close(f"{name} {backend} state[{j}]", s, s_ref, dtype)


@pytest.mark.parametrize("name", list(OPS))
def test_huge_chunk_size_equals_default_torch(name):
    """chunk_size=10**9 at T = 12 (it tried to allocate [L, L] tiles of 4·10^18 bytes): the
    same result as the default chunk, fp64."""
    _huge_vs_default(name, "torch")


@pytest.mark.interpreter
@pytest.mark.parametrize("name", ["simple_gla", "gla", "delta_rule"])
def test_huge_chunk_size_equals_default_triton(name):
    """The Triton path (interpreter): it ran a loop over L = 10**9 rows."""
    _huge_vs_default(name, "triton")


@pytest.mark.parametrize(
    "value, error, text",
    [
        (0, ValueError, "chunk_size must be ≥ 1, got 0"),
        (-64, ValueError, "chunk_size must be ≥ 1, got -64"),
        (64.0, TypeError, "got 64.0"),
        (True, TypeError, "got True"),
        ("big", TypeError, "got 'big'"),
    ],
)
def test_chunk_size_nonsense_refused(value, error, text):
    for name in ("simple_gla", "delta_rule"):
        call, build = OPS[name]
        with pytest.raises(error, match=text):
            call(build(6), chunk_size=value)


# ------------------------------------------------------------------------------------------
# step takes a family name; flags take numpy bools


def test_step_takes_a_family_name():
    """``linrnn.step("gla", ...)`` as ``context_parallel("gla", ...)``: one resolver."""
    build = OPS["gla"][1]
    inputs = build(1)
    state = torch.randn(B, H, K, V, dtype=torch.float64)
    args = [inputs[n] for n in ("q", "k", "v", "gk")]
    o, S = linrnn.step("gla", *args, state=state)
    o_ref, S_ref = linrnn.step(linrnn.gla, *args, state=state)
    assert torch.equal(o, o_ref) and torch.equal(S, S_ref)
    with pytest.raises(ValueError, match=r"op must be one of \[.*'gla'.*\].*got 'attention'"):
        linrnn.step("attention", *args, state=state)
    with pytest.raises(TypeError, match=r"op must be a family name .* or an op function, got 3"):
        linrnn.step(3, *args, state=state)


@pytest.mark.parametrize("value, name", [("yes", "str"), (1, "int"), (None, "NoneType")])
def test_step_inplace_must_be_a_bool(value, name):
    build = OPS["simple_gla"][1]
    inputs = build(1)
    args = [inputs[n] for n in ("q", "k", "v", "g")]
    state = torch.randn(B, H, K, V)
    with pytest.raises(TypeError, match=f"^inplace must be a bool, got {name}$"):
        linrnn.step("simple_gla", *args, state=state, inplace=value)


@pytest.mark.parametrize("name", list(OPS))
def test_numpy_bools_are_bools(name):
    """``output_final_state=np.True_`` (what numpy comparisons give) is a bool, as numpy floats
    are numbers for ``scale``; the result equals the Python bool's."""
    np = pytest.importorskip("numpy")
    call, build = OPS[name]
    inputs = build(5)
    o, st = call(inputs, output_final_state=np.True_, backend="torch")
    o_ref, st_ref = call(inputs, output_final_state=True, backend="torch")
    assert torch.equal(o, o_ref)
    for s, s_ref in zip(flat_state(st), flat_state(st_ref)):
        assert torch.equal(s, s_ref)
    assert call(inputs, output_final_state=np.False_, backend="torch")[1] is None


def test_flag_messages_name_the_type():
    np = pytest.importorskip("numpy")
    call, build = OPS["linear_attn"]
    inputs = build(5)
    o, _ = call(inputs, normalize=np.True_)
    assert_close("normalize", o, call(inputs, normalize=True)[0], torch.float64)
    with pytest.raises(TypeError, match=r"^output_final_state must be a bool, got str$"):
        call(inputs, output_final_state="yes")
    with pytest.raises(TypeError, match=r"^normalize must be a bool or None, got int64$"):
        linrnn.mlstm(**{n: t for n, t in OPS["mlstm_exp"][1](5).items()}, normalize=np.int64(1))
    assert linrnn._validation.type_name(np.True_) in ("numpy.bool", "numpy.bool_")
    assert linrnn._validation.type_name(torch.ones(1)) == "Tensor"
