"""torch.compile and CUDA-graph decoding.

* every op (all family variants) under ``torch.compile(fullgraph=True)``: outputs, final
  states and every gradient match eager; a new sequence length does not recompile (T marked
  dynamic; frames counted by a counting backend);
* the torch path's ``mode="recurrent"`` (T = 1: the step loop; T > 1: the chunk engine, see
  linrnn/ops/_generic.py), ``linrnn.step(inplace=True)`` inside a compiled function;
* the Triton path (the interpreter on CPU) through its torch.library custom ops, all modes,
  and ``torch.library.opcheck`` of the ops;
* every layer and the small LM (forward + backward), one ``inductor`` case;
* the loop-free scans used while tracing against the eager loops;
* value checks: on by default for CPU tensors in eager mode, ``linrnn.set_checks``;
* ``linrnn.graphs``: the static-buffer decode step (its non-graph fallback on CPU) equals
  ``CausalLM.generate``. The CUDA capture itself: benchmarks/compile_graphs.py on a GPU.

Most cases use ``backend="aot_eager"`` (traces forward and backward like inductor, without
code generation), shapes are tiny: the file runs in a few minutes on two cores.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch._dynamo
import torch._dynamo.testing
import torch.nn.functional as F
from helpers import FAMILIES, RTOL, assert_close, flat_state, rel_err

import linrnn
from linrnn.engine import torch_chunk
from linrnn.layers import Cache
from linrnn.models import CausalLM, LMConfig
from linrnn.models.causal_lm import MIXERS

B, H, K, V = 2, 2, 8, 8
L = 4  # chunk size: several chunks at tiny T


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Each test compiles from scratch (the caches are keyed by code object, shared by the
    parametrized cases)."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _counter(backend: str = "aot_eager"):
    return torch._dynamo.testing.CompileCounterWithBackend(backend)


def _leaves(fam, T, initial_state: bool, extreme: bool = False):
    inputs = {n: t.float() for n, t in fam.build(B, T, H, K, V, extreme).items()}
    state = fam.make_state(B, H, K, V, torch.float32) if initial_state else None
    return inputs, state


def _run(fn, fam, inputs, state, dynamic=False, **kw):
    """(outputs, final-state tensors, gradients) of ``fn`` with fixed cotangents; ``dynamic``
    marks T (dim 1 of every input that runs along T) dynamic."""
    leaves = {n: t.detach().clone().requires_grad_() for n, t in inputs.items()}
    if dynamic:
        for t in leaves.values():
            if t.dim() >= 3:
                torch._dynamo.mark_dynamic(t, 1)
    init = None
    if state is not None:
        parts = [s.detach().clone().requires_grad_() for s in flat_state(state)]
        init = tuple(parts) if isinstance(state, tuple) else parts[0]
        leaves.update({f"h0[{j}]": p for j, p in enumerate(parts)})
    o, st = fn(leaves, init, **kw)
    states = flat_state(st)
    gen = torch.Generator().manual_seed(7)
    loss = (o * torch.randn(o.shape, generator=gen)).sum()
    for s in states:
        loss = loss + (s * torch.randn(s.shape, generator=gen)).sum()
    names = list(leaves)
    grads = torch.autograd.grad(loss, [leaves[n] for n in names], allow_unused=True)
    return o.detach(), [s.detach() for s in states], dict(zip(names, grads))


def _compare(got, ref, tag: str, factor: float = 1.0):
    o, states, grads = got
    o_ref, states_ref, grads_ref = ref
    assert_close(f"{tag} o", o, o_ref, torch.float32, factor)
    for j, (s, s_ref) in enumerate(zip(states, states_ref)):
        assert_close(f"{tag} state[{j}]", s, s_ref, torch.float32, factor)
    for n, g_ref in grads_ref.items():
        if g_ref is None:
            assert grads[n] is None, f"{tag} d{n}: compiled has a gradient, eager none"
            continue
        assert_close(f"{tag} d{n}", grads[n], g_ref, torch.float32, factor)


def _op(fam, mode, **kw):
    def f(leaves, init):
        return fam.call(leaves, initial_state=init, output_final_state=True, mode=mode, **kw)

    return f


# ------------------------------------------------------------------------------------------
# Ops on the PyTorch path


@pytest.mark.parametrize("name", list(FAMILIES))
def test_op_chunk_compiles_without_recompiling(name):
    """chunk mode, fullgraph, T dynamic: matches eager for two lengths, one compilation."""
    fam = FAMILIES[name]
    eager = _op(fam, "chunk", chunk_size=L, backend="torch")
    cnt = _counter()
    compiled = torch.compile(eager, backend=cnt, fullgraph=True)
    for T, h0 in ((7, True), (13, True)):
        inputs, state = _leaves(fam, T, h0)
        got = _run(compiled, fam, inputs, state, dynamic=True)
        _compare(got, _run(eager, fam, inputs, state), name)
    # gla with gv: the scan over chunks stays a loop when traced (its closed form would need
    # [N, N, K, V] weights), so a new chunk count recompiles (documented in torch_chunk).
    assert cnt.frame_count == (2 if name == "gla_gv" else 1)


def _fp64(state):
    """An initial state (a tensor or a tuple of them) in fp64."""
    if isinstance(state, tuple):
        return tuple(s.double() for s in state)
    return None if state is None else state.double()


@pytest.mark.parametrize("name", ["simple_gla", "gla", "mlstm_exp", "retention"])
def test_op_chunk_strong_decays(name):
    """The data-independent safe paths taken while tracing also hold for gates that decay by
    e^-30 per step and mLSTM input pre-activations of ±20: against eager in fp64, the compiled
    fp32 result is as accurate as eager's fp32 result (within twice its error, or fp32's
    tolerance). Compiled against eager fp32 directly is not a fair test here: with these
    inputs fp32 itself is ~1e-3 off in mLSTM's dq and dk, so two fp32 computations that
    round differently may differ by more than fp32's 1e-4 tolerance."""
    fam = FAMILIES[name]
    eager = _op(fam, "chunk", chunk_size=L, backend="torch")
    compiled = torch.compile(eager, backend="aot_eager", fullgraph=True)
    inputs, state = _leaves(fam, 9, True, extreme=True)
    got, low = _run(compiled, fam, inputs, state), _run(eager, fam, inputs, state)
    ref = _run(eager, fam, {n: t.double() for n, t in inputs.items()}, _fp64(state))
    pairs = [("o", got[0], low[0], ref[0])]
    pairs += [(f"state[{j}]", *x) for j, x in enumerate(zip(got[1], low[1], ref[1]))]
    for n, g_ref in ref[2].items():
        if g_ref is None:
            assert got[2][n] is None, f"{name} d{n}: compiled has a gradient, eager none"
            continue
        pairs.append((f"d{n}", got[2][n], low[2][n], g_ref))
    for what, g, e, r in pairs:
        assert bool(torch.isfinite(g).all()), f"{name} {what}: not finite"
        err, base = rel_err(g, r), rel_err(e, r)
        assert err <= max(2.0 * base, RTOL[torch.float32]), (
            f"{name} {what}: compiled {err:.2e} off fp64, eager fp32 {base:.2e}"
        )


@pytest.mark.parametrize("T", [1, 6])
@pytest.mark.parametrize("name", list(FAMILIES))
def test_op_recurrent_mode(name, T):
    """mode="recurrent" on the PyTorch path: T = 1 traces the step loop, T > 1 the chunk
    engine (a loop over T would recompile per length); both equal eager's loop."""
    fam = FAMILIES[name]
    eager = _op(fam, "recurrent", backend="torch")
    compiled = torch.compile(eager, backend="aot_eager", fullgraph=True)
    inputs, state = _leaves(fam, T, True)
    _compare(_run(compiled, fam, inputs, state), _run(eager, fam, inputs, state), name)


def test_recurrent_mode_new_length_does_not_recompile():
    fam = FAMILIES["mlstm_exp"]
    cnt = _counter()
    compiled = torch.compile(_op(fam, "recurrent", backend="torch"), backend=cnt, fullgraph=True)
    for T in (5, 9, 17):
        inputs, state = _leaves(fam, T, True)
        _run(compiled, fam, inputs, state, dynamic=True)
    assert cnt.frame_count == 1


def test_step_inplace_compiles():
    """linrnn.step(inplace=True) inside a compiled function (one decode token): the state
    tensors are updated in place and equal eager's."""
    q, k, v = (torch.randn(B, 1, H, K) for _ in range(3))
    i, f = torch.randn(B, 1, H), torch.randn(B, 1, H) + 3
    state = FAMILIES["mlstm_exp"].make_state(B, H, K, V, torch.float32)
    ref_state = tuple(s.clone() for s in state)

    def step(q, k, v, i, f, state):
        return linrnn.mlstm_step(q, k, v, i, f, state=state, inplace=True, backend="torch")[0]

    o = torch.compile(step, backend="aot_eager", fullgraph=True)(q, k, v, i, f, state)
    o_ref = step(q, k, v, i, f, ref_state)
    assert_close("o", o, o_ref, torch.float32)
    for j, (s, s_ref) in enumerate(zip(state, ref_state)):
        assert_close(f"state[{j}]", s, s_ref, torch.float32)


@pytest.mark.parametrize("vector", [False, True], ids=["scalar", "vector"])
@pytest.mark.parametrize("h0", [False, True], ids=["zero", "h0"])
def test_scan_parallel_equals_loop(vector, h0):
    """The closed-form chunk scan used while tracing equals the loop, gradients included,
    also with a −∞ log decay in chunk 0 (mLSTM-exp without an initial max state)."""
    Bs, Hs, N = 2, 3, 5
    shape = (Bs, Hs, N, K, 1) if vector else (Bs, Hs, N, 1, 1)
    log_d = (-torch.rand(shape, dtype=torch.float64) * 3).requires_grad_()
    U = torch.randn(Bs, Hs, N, K, V, dtype=torch.float64, requires_grad=True)
    S0 = torch.randn(Bs, Hs, K, V, dtype=torch.float64, requires_grad=True) if h0 else None
    ref = torch_chunk._scan(log_d.exp(), U, S0)
    got = torch_chunk._scan_parallel(log_d, U, S0)
    leaves = [x for x in (log_d, U, S0) if x is not None]
    cot = [torch.randn_like(r) for r in ref]
    g_ref = torch.autograd.grad(ref, leaves, cot)
    g_got = torch.autograd.grad(got, leaves, cot)
    for a, b in zip((*got, *g_got), (*ref, *g_ref)):
        assert_close("scan", a, b, torch.float64)
    # −∞ in chunk 0: its decay multiplies only the initial state.
    inf_d = log_d.detach().clone()
    inf_d[:, :, 0] = float("-inf")
    ref = torch_chunk._scan(inf_d.exp(), U.detach(), None if S0 is None else S0.detach())
    got = torch_chunk._scan_parallel(inf_d, U.detach(), None if S0 is None else S0.detach())
    for a, b in zip(got, ref):
        assert_close("scan -inf", a, b, torch.float64)


def test_max_scan_closed_form_equals_loop(monkeypatch):
    N = 6
    b_end = -torch.rand(B, H, N, dtype=torch.float64) * 5
    m_loc = torch.randn(B, H, N, dtype=torch.float64) * 4
    for m0 in (None, torch.randn(B, H, dtype=torch.float64)):
        ref = torch_chunk._max_scan(b_end, m_loc, m0)
        monkeypatch.setattr(linrnn._runtime, "tracing", lambda: True)
        got = torch_chunk._max_scan(b_end, m_loc, m0)
        monkeypatch.undo()
        assert_close("m", got, ref, torch.float64)


def test_inductor_op():
    """One real inductor compilation (CPU C++ code generation): simple GLA forward and
    backward (static shapes: a dynamic T costs inductor ~4× the compile time on CPU; the
    aot_eager cases above check the dynamic graphs)."""
    fam = FAMILIES["simple_gla"]
    eager = _op(fam, "chunk", chunk_size=L, backend="torch")
    compiled = torch.compile(eager, backend="inductor", fullgraph=True)
    inputs, state = _leaves(fam, 9, True)
    _compare(_run(compiled, fam, inputs, state), _run(eager, fam, inputs, state), "inductor")


# ------------------------------------------------------------------------------------------
# The Triton path (interpreter on CPU) through the custom ops

triton_only = pytest.mark.skipif(
    linrnn.ops._generic.custom_ops is None
    or (not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"),
    reason="needs Triton (a GPU, or TRITON_INTERPRET=1)",
)


@triton_only
@pytest.mark.parametrize("mode", ["chunk", "fused_chunk", "recurrent"])
@pytest.mark.parametrize("name", ["simple_gla", "linear_attn_norm", "mlstm_exp", "gla_gv", "rwkv6"])
def test_triton_ops_compile(name, mode):
    """backend="triton": the same kernels as eager (bitwise equal results), no recompilation
    for a new T."""
    fam = FAMILIES[name]
    eager = _op(fam, mode, backend="triton")
    cnt = _counter()
    compiled = torch.compile(eager, backend=cnt, fullgraph=True)
    for T in (5, 11):
        inputs, state = _leaves(fam, T, True)
        got = _run(compiled, fam, inputs, state, dynamic=True)
        ref = _run(eager, fam, inputs, state)
        _compare(got, ref, f"{name} {mode}", factor=1e-3)
    assert cnt.frame_count == 1


@triton_only
@pytest.mark.parametrize("fused", [True, False], ids=["fused-route", "chunk-route"])
def test_triton_mode_none_compiles(fused):
    """mode=None traced takes the route eager takes (fused_chunk where FUSED_DEFAULT names the
    call, chunk with too few walkers), one compilation for two lengths, eager's results."""
    from linrnn.engine import config
    from linrnn.ops import _generic

    fam = FAMILIES["linear_attn"]
    fewest, dims = config.FUSED_DEFAULT["linear_attn"][True]
    heads, (k_dim, v_dim) = (fewest if fused else 2), dims[0]
    eager = _op(fam, None, backend="triton")
    cnt = _counter()
    compiled = torch.compile(eager, backend=cnt, fullgraph=True)
    for T in (70, 90):
        inputs = {n: t.float() for n, t in fam.build(1, T, heads, k_dim, v_dim, False).items()}
        got = _run(compiled, fam, inputs, None, dynamic=True)
        ref = _run(eager, fam, inputs, None)
        _compare(got, ref, f"mode=None, {heads} heads", factor=1e-3)
    assert cnt.frame_count == 1
    # the traced call's engine op, and its fused flag (chunk_fwd's 12th argument)
    (call,) = [n for n in cnt.graphs[0].graph.nodes if "chunk_fwd" in str(n.target)]
    assert call.args[11] is fused
    q = torch.empty(1, 70, heads, k_dim)  # eager routes the same way
    assert _generic.route("linear_attn", q, q, grad=True, backend="triton").mode == (
        "fused_chunk" if fused else "chunk"
    )


@triton_only
@pytest.mark.parametrize("name", ["gla", "rwkv6"])
def test_triton_recurrent_vector_gates_compile(name):
    fam = FAMILIES[name]
    eager = _op(fam, "recurrent", backend="triton")
    compiled = torch.compile(eager, backend="aot_eager", fullgraph=True)
    inputs, state = _leaves(fam, 6, True)
    _compare(_run(compiled, fam, inputs, state), _run(eager, fam, inputs, state), name, 1e-3)


@triton_only
def test_triton_custom_ops_opcheck():
    """torch.library.opcheck: schema, fake (meta) implementations, autograd registration."""
    T = 6
    q, k, v = (torch.randn(B, T, H, K, requires_grad=True) for _ in range(3))
    g = F.logsigmoid(torch.randn(B, T, H)).requires_grad_()
    gi = torch.randn(B, T, H, requires_grad=True)
    S0 = torch.randn(B, H, K, V, requires_grad=True)
    n0, m0 = torch.rand(B, H, K, requires_grad=True), torch.randn(B, H, requires_grad=True)
    torch.library.opcheck(
        torch.ops.linrnn.chunk_fwd,
        (q, k, v, g, gi, S0, n0, m0, 0.5, 1e-6, 4, False, True, True, "mlstm", None),
    )
    for fused in (False, True):  # a decay that wants no gradient (the backward skips dg)
        torch.library.opcheck(
            torch.ops.linrnn.chunk_fwd,
            (q, k, v, g.detach(), None, S0, None, None, 0.5, 0.0, 4, fused, False, False,
             "none", None),
        )  # fmt: skip
    torch.library.opcheck(
        torch.ops.linrnn.recurrent_fwd,
        (q, k, v, g, None, gi, None, S0, n0, m0, 0.5, 1e-6, True, True, "mlstm", None, True),
    )
    torch.library.opcheck(
        torch.ops.linrnn.recurrent_fwd,
        (q, k, v, g.detach(), None, None, None, S0, None, None, 0.5, 0.0, False, False, "none",
         None, True),
    )  # fmt: skip
    gk = F.logsigmoid(torch.randn(B, T, H, K)).requires_grad_()
    gv = F.logsigmoid(torch.randn(B, T, H, V)).requires_grad_()
    u = torch.randn(H, K, requires_grad=True)
    for fused in (False, True):
        torch.library.opcheck(
            torch.ops.linrnn.chunk_vec_fwd, (q, k, v, gk, gv, None, S0, 0.5, 4, fused, None)
        )
        torch.library.opcheck(
            torch.ops.linrnn.chunk_vec_fwd, (q, k, v, gk, None, u, S0, 0.5, 4, fused, None)
        )


@triton_only
def test_triton_stored_scores_compile():
    """The gk-only chunk path with stored scores (no bonus): opcheck of its custom op. (A
    compiled call of that path equal to eager, backward included: test_triton_ops_compile's
    rwkv6 chunk case, gk alone in chunk mode being the stored-scores path.)"""
    T = 6
    q, k, v = (torch.randn(B, T, H, K, requires_grad=True) for _ in range(3))
    gk = F.logsigmoid(torch.randn(B, T, H, K)).requires_grad_()
    S0 = torch.randn(B, H, K, V, requires_grad=True)
    # (with RWKV6's bonus u: in test_triton_custom_ops_opcheck)
    torch.library.opcheck(
        torch.ops.linrnn.chunk_vec_fwd, (q, k, v, gk, None, None, S0, 0.5, 4, False, None)
    )


# ------------------------------------------------------------------------------------------
# Layers and the model


def _layer(name):
    kw = {"num_layers": 2, "layer_idx": 1} if name == "rwkv6" else {}
    if name != "softmax":
        kw["chunk_size"] = L
    return MIXERS[name](16, 2, **kw)


# The delta rule's PyTorch chunk walk compiles once per chunk count (linrnn/engine/torch_delta.py):
# two lengths with the same count.
ONE_CHUNK_COUNT = {"delta_net": (5, 7), "gated_delta_net": (5, 7)}


@pytest.mark.parametrize("name", list(MIXERS))
def test_layer_compiles(name):
    layer = _layer(name)
    params = list(layer.parameters())
    cnt = _counter()
    compiled = torch.compile(layer, backend=cnt, fullgraph=True)
    for T in ONE_CHUNK_COUNT.get(name, (7, 13)):
        x = torch.randn(2, T, 16, requires_grad=True)
        torch._dynamo.mark_dynamic(x, 1)
        dy = torch.randn(2, T, 16)
        y = compiled(x)
        grads = torch.autograd.grad(y, [x, *params], dy, allow_unused=True)
        y_ref = layer(x)
        grads_ref = torch.autograd.grad(y_ref, [x, *params], dy, allow_unused=True)
        assert_close(f"{name} y", y, y_ref, torch.float32)
        for j, (g, g_ref) in enumerate(zip(grads, grads_ref)):
            if g_ref is not None:
                assert_close(f"{name} grad[{j}]", g, g_ref, torch.float32)
    assert cnt.frame_count == 1


def test_model_training_step_compiles():
    torch.manual_seed(0)
    model = CausalLM(LMConfig(vocab_size=32, d_model=16, num_layers=2, num_heads=2,
                              mixer="mlstm", chunk_size=L))  # fmt: skip
    cnt = _counter()
    compiled = torch.compile(model, backend=cnt, fullgraph=True)
    for T in (9, 14):
        ids = torch.randint(0, 32, (2, T))
        torch._dynamo.mark_dynamic(ids, 1)
        loss = compiled(ids, targets=ids).loss
        grads = torch.autograd.grad(loss, list(model.parameters()))
        loss_ref = model(ids, targets=ids).loss
        grads_ref = torch.autograd.grad(loss_ref, list(model.parameters()))
        assert_close("loss", loss, loss_ref, torch.float32)
        for j, (g, g_ref) in enumerate(zip(grads, grads_ref)):
            assert_close(f"grad[{j}]", g, g_ref, torch.float32)
    assert cnt.frame_count == 1


# ------------------------------------------------------------------------------------------
# Value checks


def _positive_decay():
    q, k, v = (torch.randn(1, 4, 2, 8) for _ in range(3))
    g = torch.zeros(1, 4, 2)
    g[0, 1, 1] = 0.5
    return q, k, v, g


def test_checks_default_on_for_cpu_and_can_be_turned_off():
    q, k, v, g = _positive_decay()
    assert linrnn._runtime.get_checks() is None  # auto
    with pytest.raises(ValueError, match="g is a log decay and must be ≤ 0"):
        linrnn.simple_gla(q, k, v, g)
    with linrnn.checks(False):
        o, _ = linrnn.simple_gla(q, k, v, g)  # no check: the (meaningless) result comes back
        assert o.shape == v.shape
    assert linrnn._runtime.get_checks() is None
    previous = linrnn.set_checks(True)
    try:
        with pytest.raises(ValueError):
            linrnn.simple_gla(q, k, v, g)
    finally:
        linrnn.set_checks(previous)
    with pytest.raises(TypeError, match="set_checks takes True, False or None"):
        linrnn.set_checks("yes")


def test_checks_off_on_accelerators_by_default(monkeypatch):
    """auto: value checks run for CPU tensors only (elsewhere they would sync)."""
    q = torch.randn(1, 1, 1, 1)
    assert linrnn._runtime.data_checks(q)
    monkeypatch.setattr(linrnn._runtime, "capturing", lambda: True)
    assert not linrnn._runtime.data_checks(q)  # never during CUDA-graph capture


def test_compiled_op_skips_value_checks_without_graph_break():
    """Traced, the data checks are skipped (they would read values: a graph break, an error
    under fullgraph); shape checks still run (at trace time)."""
    q, k, v, g = _positive_decay()
    compiled = torch.compile(linrnn.simple_gla, backend="aot_eager", fullgraph=True)
    o, _ = compiled(q, k, v, g)
    assert o.shape == v.shape
    with pytest.raises(Exception, match="must have shape"):
        torch.compile(linrnn.simple_gla, backend="aot_eager", fullgraph=True)(q, k, v, g[:, :2])


# ------------------------------------------------------------------------------------------
# linrnn.graphs: the static-buffer decode step (its eager fallback here)


@pytest.mark.parametrize("mixer", ["gla", "mlstm", "rwkv6", "linear_attn"])
def test_decode_graph_fallback_equals_generate(mixer):
    torch.manual_seed(0)
    model = CausalLM(LMConfig(vocab_size=32, d_model=16, num_layers=2, num_heads=2,
                              mixer=mixer)).eval()  # fmt: skip
    prompt = torch.randint(0, 32, (3, 5))
    ref = model.generate(prompt, max_new_tokens=6)
    cache = Cache()
    with torch.no_grad():
        first = model(prompt, cache=cache).logits[:, -1].argmax(-1)
    dec = linrnn.graphs.capture_decode(model, cache)
    assert dec.graph is None  # CPU: no capture
    buffers = [t.data_ptr() for t in linrnn.graphs._tensors(dec.cache.layers)]
    out = dec.generate(first, 6)
    assert torch.equal(torch.cat([prompt, out], dim=1), ref)
    assert [t.data_ptr() for t in linrnn.graphs._tensors(dec.cache.layers)] == buffers
    assert dec.cache.seen_tokens == 5 + 5
    # load(): a second prompt reuses the same buffers
    cache2 = Cache()
    prompt2 = torch.randint(0, 32, (3, 5))
    with torch.no_grad():
        first2 = model(prompt2, cache=cache2).logits[:, -1].argmax(-1)
    dec.load(cache2)
    out2 = dec.generate(first2, 4)
    assert torch.equal(torch.cat([prompt2, out2], 1), model.generate(prompt2, max_new_tokens=4))


def test_decode_graph_refuses_what_it_cannot_capture():
    model = CausalLM(LMConfig(vocab_size=32, d_model=16, num_layers=1, num_heads=2,
                              mixer="softmax"))  # fmt: skip
    with pytest.raises(ValueError, match="softmax attention"):
        linrnn.graphs.capture_decode(model, Cache())
    model = CausalLM(LMConfig(vocab_size=32, d_model=16, num_layers=1, num_heads=2))
    with pytest.raises(ValueError, match="cache is empty"):
        linrnn.graphs.capture_decode(model, Cache())
    cache = Cache()
    with torch.no_grad():
        model(torch.zeros(2, 3, dtype=torch.long), cache=cache)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="graph=True needs a CUDA model"):
            linrnn.graphs.capture_decode(model, cache, graph=True)
    dec = linrnn.graphs.capture_decode(model, cache, graph=False)
    with pytest.raises(ValueError, match="expected 2 token ids"):
        dec.step(torch.zeros(3, dtype=torch.long))
