"""The Triton engine as ``torch.library`` custom ops, for ``torch.compile``.

Why opaque ops. The Triton hosts do work on every call — chunk tables built from the packed
offsets, tile choices, kernel launches with Python-computed grids — that Dynamo cannot trace
into a graph. Each host's forward and backward therefore become two custom ops, each with a
fake (meta) implementation that gives the output shapes from the input shapes (symbolically: a
new sequence length T does not recompile), linked by ``torch.library.register_autograd``. The
ops are thin: they call the hosts' own ``forward`` and ``backward`` (:mod:`~linrnn.engine.scalar`,
:mod:`~linrnn.engine.vector`, :mod:`~linrnn.engine.recurrent`), the same functions eager calls
run, so compiled and eager results are bitwise the same.

Saved tensors travel by name. A forward op returns the outputs and what the host's ``forward``
saved (its names, in a fixed order); the autograd setup keeps them under those names, and the
backward op takes them back as named arguments and rebuilds the host's ``saved`` dict.

Eager calls do not go through these ops: ``linrnn.ops._generic`` routes to them only while
``torch.compile`` traces (an op call costs a dispatcher round trip, and the eager recurrent
kernel can write a decode step's state in place, which a functional op cannot).

Optional outputs (a normalizer state without ``track_n``, saved tensors a variant does not
use) are returned as empty tensors, since an op cannot return None; outputs never alias the
inputs or each other (a custom op's contract).

A new Triton entry point needs its own op pair here before it can be compiled.
"""

import torch
from torch import Tensor

from linrnn.engine import config, delta, scalar, vector
from linrnn.engine import recurrent as rec


def _empty(like: Tensor) -> Tensor:
    return torch.empty(0, device=like.device, dtype=torch.float32)


def _distinct(outs, inputs) -> list[Tensor]:
    """``outs`` with every tensor that shares storage with an input or an earlier output
    cloned, and all made contiguous (the fake implementations promise contiguous outputs)."""
    seen = {t.untyped_storage()._cdata for t in inputs if isinstance(t, Tensor)}
    result = []
    for t in outs:
        t = t.contiguous()
        if t.untyped_storage()._cdata in seen:
            t = t.clone()
        seen.add(t.untyped_storage()._cdata)
        result.append(t)
    return result


def _norm_code(normalizer: str) -> str | None:
    return None if normalizer == "none" else normalizer


# ---------------------------------------------------------------------------------------------
# Chunk engine (modes "chunk" and "fused_chunk")


def _chunk_config(q, k, v, g, gi, scale, eps, L, fused, stabilize, track_n, normalizer, offsets):
    return scalar.config(
        q, k, v, scale=scale, g=g, gi=gi, stabilize=stabilize, track_n=track_n,
        normalizer=_norm_code(normalizer), eps=eps, chunk_size=L, fused=fused, offsets=offsets,
    )  # fmt: skip


_chunk_counts = config.chunk_counts  # (N states, NT chunk rows, NSEQ sequences per row)

# linrnn::chunk_fwd returns the outputs and what scalar.forward saved besides the inputs, by
# these names; linrnn::chunk_bwd takes the tensors of _CHUNK_BWD (the inputs, then the outputs
# and what was produced, less m_T), then the cotangents.
_CHUNK_OUT = ("o", "S_T", "n_T", "m_T", *scalar.PRODUCED)
_CHUNK_BWD = scalar.INPUTS + scalar.OUTPUTS + scalar.PRODUCED


@torch.library.custom_op("linrnn::chunk_fwd", mutates_args=())
def _chunk_fwd(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor | None, gi: Tensor | None,
    S0: Tensor | None, n0: Tensor | None, m0: Tensor | None, scale: float, eps: float,
    chunk_size: int, fused: bool, stabilize: bool, track_n: bool, normalizer: str,
    offsets: list[int] | None,
) -> list[Tensor]:  # fmt: skip
    """The tensors of :data:`_CHUNK_OUT` (empty where the call makes none)."""
    c = _chunk_config(q, k, v, g, gi, scale, eps, chunk_size, fused, stabilize, track_n,
                      normalizer, offsets)  # fmt: skip
    outputs, saved = scalar.forward(q, k, v, g, gi, S0, n0, m0, c)
    named = dict(saved, m_T=outputs[3])
    outs = [_empty(q) if named[name] is None else named[name] for name in _CHUNK_OUT]
    return _distinct(outs, (q, k, v, g, gi, S0, n0, m0))


@_chunk_fwd.register_fake
def _chunk_fwd_fake(q, k, v, g, gi, S0, n0, m0, scale, eps, chunk_size, fused, stabilize,
                    track_n, normalizer, offsets):  # fmt: skip
    B, T, _, K = q.shape
    H, V = v.shape[2], v.shape[3]  # value heads (q, k may be grouped)
    N, NT, NSEQ = _chunk_counts(B, T, chunk_size, offsets)
    BH = B * H
    f = lambda *shape: q.new_empty(shape, dtype=torch.float32)  # noqa: E731
    e = lambda used, *shape: f(*shape) if used else f(0)  # noqa: E731
    states = f(0) if fused else q.new_empty(BH, NT, K, V, dtype=config.chunk_state_dtype(q.dtype))
    return [
        q.new_empty(v.shape), f(N, H, K, V), e(track_n, N, H, K), e(stabilize, N, H),
        e(g is not None, BH, T), e(gi is not None, BH, T), states,
        e(track_n and not fused, BH, NT, K), e(stabilize, BH, NT + NSEQ),
        e(normalizer != "none", BH, T), e(stabilize, BH, T),
    ]  # fmt: skip


@torch.library.custom_op("linrnn::chunk_bwd", mutates_args=())
def _chunk_bwd(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor | None, gi: Tensor | None,
    S0: Tensor | None, n0: Tensor | None, m0: Tensor | None, o: Tensor, S_T: Tensor,
    n_T: Tensor, b: Tensor, a: Tensor, states: Tensor, ns: Tensor, mc: Tensor, den: Tensor,
    m_row: Tensor, do: Tensor, dS_T: Tensor | None, dn_T: Tensor | None, dm_T: Tensor | None,
    scale: float, eps: float, chunk_size: int, fused: bool, stabilize: bool, track_n: bool,
    normalizer: str, offsets: list[int] | None, need_gate_grads: bool,
) -> list[Tensor]:  # fmt: skip
    """[dq, dk, dv, dg, dgi, dS0, dn0, dm0] (empty where the input was None, and dg, dgi
    without ``need_gate_grads``: scalar.backward)."""
    c = _chunk_config(q, k, v, g, gi, scale, eps, chunk_size, fused, stabilize, track_n,
                      normalizer, offsets)  # fmt: skip
    has = scalar.kept(c)
    tensors = (o, S_T, n_T, b, a, states, ns, mc, den, m_row)
    saved = dict(q=q.contiguous(), k=k.contiguous(), v=v.contiguous(), g=g, gi=gi, S0=S0,
                 n0=n0, m0=m0)  # fmt: skip
    made = scalar.OUTPUTS + scalar.PRODUCED
    saved.update({n: x if has[n] else None for n, x in zip(made, tensors)})
    grads = list(scalar.backward(saved, c, do, dS_T, dn_T, dm_T, need_gate_grads))
    if not need_gate_grads:  # (the max state forms them anyway: wants_gate_grads)
        grads[3:5] = [None, None]
    outs = [_empty(q) if x is None else x for x in grads]
    return _distinct(outs, (q, k, v, g, gi, S0, n0, m0, *tensors, do, dS_T, dn_T, dm_T))


@_chunk_bwd.register_fake
def _chunk_bwd_fake(q, k, v, g, gi, S0, n0, m0, *rest):
    f = lambda x: _empty(q) if x is None else x.new_empty(x.shape, dtype=torch.float32)  # noqa: E731
    gate = f if rest[-1] else lambda x: _empty(q)  # (rest[-1]: need_gate_grads)
    return [q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), gate(g), gate(gi),
            f(S0), f(n0), f(m0)]  # fmt: skip


_CHUNK_OPTS = ("scale", "eps", "chunk_size", "fused", "stabilize", "track_n", "normalizer",
               "offsets")  # fmt: skip


def _chunk_setup(ctx, inputs, output):
    named = dict(zip(scalar.INPUTS, inputs))
    ctx.opts = dict(zip(_CHUNK_OPTS, inputs[len(scalar.INPUTS) :]))
    ctx.has = [named[n] is not None for n in scalar.INPUTS[3:]]
    named.update(zip(_CHUNK_OUT, output))
    ctx.save_for_backward(*(named[n] for n in _CHUNK_BWD))
    ctx.set_materialize_grads(False)


def _chunk_backward(ctx, grads):
    do, dS_T, dn_T, dm_T = grads[:4]
    opts = ctx.opts
    saved = dict(zip(_CHUNK_BWD, ctx.saved_tensors))
    if do is None:
        do = torch.zeros_like(saved["o"])
    dn_T = dn_T if opts["track_n"] else None
    dm_T = dm_T if opts["stabilize"] else None
    need = ctx.needs_input_grad[3] or ctx.needs_input_grad[4]  # g, gi
    dq, dk, dv, *rest = torch.ops.linrnn.chunk_bwd(
        *saved.values(), do, dS_T, dn_T, dm_T, *opts.values(), need
    )
    rest = [x if has else None for x, has in zip(rest, ctx.has)]
    if not need:
        rest[:2] = [None, None]
    return (dq, dk, dv, *rest) + (None,) * len(_CHUNK_OPTS)


torch.library.register_autograd("linrnn::chunk_fwd", _chunk_backward, setup_context=_chunk_setup)


# Per-channel decays (vector): their own pair, the saved tensors differ.


def _vec_config(q, k, v, u, scale, L, fused, offsets):
    return vector.config(q, k, v, scale=scale, exclusive=u is not None, chunk_size=L,
                         fused=fused, offsets=offsets)  # fmt: skip


def _vec_kept(q, v, gv, u, fused) -> dict[str, bool]:
    return vector.kept(fused=fused, exclusive=u is not None, has_gv=gv is not None,
                       dtype=q.dtype, V=v.shape[3])  # fmt: skip


# linrnn::chunk_vec_fwd returns the outputs and what vector.forward saved besides the inputs,
# by these names; linrnn::chunk_vec_bwd takes the tensors of _VEC_BWD (the inputs, then the
# final state and what was produced), then the cotangents.
_VEC_IN = ("q", "k", "v", "g", "gv", "u", "S0")
_VEC_OUT = ("o", *vector.OUTPUTS, *vector.PRODUCED)
_VEC_BWD = _VEC_IN + vector.OUTPUTS + vector.PRODUCED


@torch.library.custom_op("linrnn::chunk_vec_fwd", mutates_args=())
def _chunk_vec_fwd(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, gv: Tensor | None, u: Tensor | None,
    S0: Tensor | None, scale: float, chunk_size: int, fused: bool, offsets: list[int] | None,
) -> list[Tensor]:  # fmt: skip
    """The tensors of :data:`_VEC_OUT` (empty where the call makes none)."""
    c = _vec_config(q, k, v, u, scale, chunk_size, fused, offsets)
    outputs, saved = vector.forward(q, k, v, g, gv, u, S0, c)
    named = dict(saved, o=outputs[0])
    outs = [_empty(q) if named[name] is None else named[name] for name in _VEC_OUT]
    return _distinct(outs, (q, k, v, g, gv, u, S0))


@_chunk_vec_fwd.register_fake
def _chunk_vec_fwd_fake(q, k, v, g, gv, u, S0, scale, chunk_size, fused, offsets):
    B, T, H, K = q.shape
    V = v.shape[3]
    N, NT, _ = _chunk_counts(B, T, chunk_size, offsets)
    f32, x16 = torch.float32, q.dtype
    shapes = dict(
        o=((B, T, H, V), x16), S_T=((N, H, K, V), f32), Gk=((B, T, H, K), f32),
        Gx=((B, T, H, K), f32), Gv=((B, T, H, V), f32), spans=((NT, B * H), f32),
        QG=((B, T, H, K), x16), KG=((B, T, H, K), x16), states=((B * H, NT, K, V), f32),
        A=((B, T, H, chunk_size), x16), o32=((B, T, H, V), f32), o_in=((B, T, H, V), f32),
        o_x=((B, T, H, V), f32),
    )  # fmt: skip
    has = dict(_vec_kept(q, v, gv, u, fused), o=True, S_T=True)
    return [
        q.new_empty(shapes[n][0], dtype=shapes[n][1]) if has[n] else _empty(q) for n in _VEC_OUT
    ]


@torch.library.custom_op("linrnn::chunk_vec_bwd", mutates_args=())
def _chunk_vec_bwd(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, gv: Tensor | None, u: Tensor | None,
    S0: Tensor | None, S_T: Tensor, Gk: Tensor, Gx: Tensor, Gv: Tensor, spans: Tensor,
    QG: Tensor, KG: Tensor, states: Tensor, A: Tensor, o32: Tensor, o_in: Tensor, o_x: Tensor,
    do: Tensor, dS_T: Tensor | None, scale: float, chunk_size: int, fused: bool,
    offsets: list[int] | None,
) -> list[Tensor]:  # fmt: skip
    """[dq, dk, dv, dg, dgv, du, dS0] (empty where the input was None)."""
    c = _vec_config(q, k, v, u, scale, chunk_size, fused, offsets)
    has = _vec_kept(q, v, gv, u, fused)
    tensors = (Gk, Gx, Gv, spans, QG, KG, states, A, o32, o_in, o_x)
    saved = dict(q=q.contiguous(), k=k.contiguous(), v=v.contiguous(), u=u, S0=S0, S_T=S_T)
    saved.update({n: x if has[n] else None for n, x in zip(vector.PRODUCED, tensors)})
    grads = vector.backward(saved, c, do, dS_T)
    outs = [_empty(q) if x is None else x for x in grads]
    return _distinct(outs, (q, k, v, g, gv, u, S0, S_T, *tensors, do, dS_T))


@_chunk_vec_bwd.register_fake
def _chunk_vec_bwd_fake(q, k, v, g, gv, u, S0, *rest):
    f = lambda x: _empty(q) if x is None else x.new_empty(x.shape, dtype=torch.float32)  # noqa: E731
    return [q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), f(g), f(gv),
            f(u), f(S0)]  # fmt: skip


_VEC_OPTS = ("scale", "chunk_size", "fused", "offsets")


def _chunk_vec_setup(ctx, inputs, output):
    named = dict(zip(_VEC_IN, inputs))
    ctx.opts = dict(zip(_VEC_OPTS, inputs[len(_VEC_IN) :]))
    ctx.has = [named[n] is not None for n in _VEC_IN[3:]]
    named.update(zip(_VEC_OUT, output))
    ctx.save_for_backward(*(named[n] for n in _VEC_BWD))
    ctx.set_materialize_grads(False)


def _chunk_vec_backward(ctx, grads):
    do, dS_T = grads[:2]
    saved = dict(zip(_VEC_BWD, ctx.saved_tensors))
    if do is None:
        do = torch.zeros_like(saved["v"], dtype=saved["q"].dtype)
    dq, dk, dv, *rest = torch.ops.linrnn.chunk_vec_bwd(
        *saved.values(), do, dS_T, *ctx.opts.values()
    )
    rest = [x if has else None for x, has in zip(rest, ctx.has)]
    return (dq, dk, dv, *rest) + (None,) * len(_VEC_OPTS)


torch.library.register_autograd("linrnn::chunk_vec_fwd", _chunk_vec_backward,
                                setup_context=_chunk_vec_setup)  # fmt: skip


def chunk(q, k, v, *, scale, g=None, gi=None, stabilize=False, track_n=False, normalizer=None,
          eps=0.0, S0=None, n0=None, m0=None, chunk_size=None, fused=False,
          offsets=None, gv=None, u=None):  # fmt: skip
    """The chunk engine through the custom ops: :func:`linrnn.engine.scalar.chunk`, or for
    per-channel decays the vector host's ``chunk`` (same arguments and result)."""
    K, V = q.shape[3], v.shape[3]
    per_channel = (g is not None and g.dim() == 4) or gv is not None or u is not None
    L = config.resolve_chunk_size(chunk_size, K, V, triton=True, fused=fused, vector=per_channel)
    offs = None if offsets is None else [int(x) for x in offsets]
    if per_channel:
        if gi is not None or stabilize or track_n or normalizer is not None:
            raise NotImplementedError("vector gates with input gate / normalizer: no kernel")
        if u is not None and gv is not None:
            raise NotImplementedError("the Triton chunk engine has no exclusive form with gv")
        S0 = S0.float().contiguous() if S0 is not None else None
        f32 = lambda x: None if x is None else x.float().contiguous()  # noqa: E731
        out = torch.ops.linrnn.chunk_vec_fwd(
            q, k, v, f32(g), f32(gv), f32(u), S0, float(scale), L, fused, offs
        )
        return out[0], out[1], None, None
    S0, n0, m0 = scalar.prepare_state(S0, n0, m0, track_n, stabilize)
    out = torch.ops.linrnn.chunk_fwd(
        q, k, v, g, gi, S0, n0, m0, float(scale), float(eps), L, fused, stabilize, track_n,
        normalizer or "none", offs,
    )  # fmt: skip
    o, S_T, n_T, m_T = out[:4]
    return o, S_T, (n_T if track_n else None), (m_T if stabilize else None)


# ---------------------------------------------------------------------------------------------
# Recurrent kernels (mode "recurrent"): linrnn.engine.recurrent's forward and backward


@torch.library.custom_op("linrnn::recurrent_fwd", mutates_args=())
def _recurrent_fwd(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor | None, gv: Tensor | None,
    gi: Tensor | None, u: Tensor | None, S0: Tensor | None, n0: Tensor | None,
    m0: Tensor | None, scale: float, eps: float, stabilize: bool, track_n: bool,
    normalizer: str, offsets: list[int] | None, save: bool,
) -> list[Tensor]:  # fmt: skip
    """[o, S_T, n_T, m_T, den, m_row] (empty where unused; den/m_row only with ``save``)."""
    (o, S_T, n_T, m_T), saved = rec.forward(
        q, k, v, scale=scale, g=g, gv=gv, gi=gi, u=u, stabilize=stabilize, track_n=track_n,
        normalizer=_norm_code(normalizer), eps=eps, S0=S0, n0=n0, m0=m0, offsets=offsets,
        save=save,
    )  # fmt: skip
    saved = saved or {}
    e = lambda x: _empty(q) if x is None else x  # noqa: E731
    outs = [o, S_T, e(n_T), e(m_T), e(saved.get("den")), e(saved.get("m_row"))]
    return _distinct(outs, (q, k, v, g, gv, gi, u, S0, n0, m0))


@_recurrent_fwd.register_fake
def _recurrent_fwd_fake(q, k, v, g, gv, gi, u, S0, n0, m0, scale, eps, stabilize, track_n,
                        normalizer, offsets, save):  # fmt: skip
    B, T, _, K = q.shape
    H, V = v.shape[2], v.shape[3]  # value heads (q, k may be grouped)
    N = B if offsets is None else len(offsets) - 1
    f = lambda *shape: q.new_empty(shape, dtype=torch.float32)  # noqa: E731
    e = lambda used, *shape: f(*shape) if used else f(0)  # noqa: E731
    return [
        q.new_empty(v.shape), f(N, H, K, V), e(track_n, N, H, K), e(stabilize, N, H),
        e(save and normalizer != "none", B * H, T), e(save and stabilize, B * H, T),
    ]  # fmt: skip


@torch.library.custom_op("linrnn::recurrent_bwd", mutates_args=())
def _recurrent_bwd(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor | None, gv: Tensor | None,
    gi: Tensor | None, u: Tensor | None, S0: Tensor | None, n0: Tensor | None,
    m0: Tensor | None, o: Tensor, S_T: Tensor, n_T: Tensor, den: Tensor, m_row: Tensor,
    do: Tensor, dS_T: Tensor | None, dn_T: Tensor | None, dm_T: Tensor | None,
    scale: float, eps: float, stabilize: bool, track_n: bool, normalizer: str,
    offsets: list[int] | None, need_gate_grads: bool,
) -> list[Tensor]:  # fmt: skip
    """[dq, dk, dv, dg, dgv, dgi, du, dS0, dn0, dm0] (empty where the input was None, and the
    gates' without ``need_gate_grads``). The saved tensors come in :data:`recurrent.SAVED`
    order (empty where unused)."""
    norm = normalizer != "none"
    saved = dict(
        q=q.contiguous(), k=k.contiguous(), v=v.contiguous(), g=g, gv=gv, gi=gi, u=u, S0=S0,
        n0=n0, m0=m0, o=o, S_T=S_T, n_T=n_T if track_n else None, den=den if norm else None,
        m_row=m_row if stabilize else None,
    )  # fmt: skip
    grads = rec.backward(
        saved, do, dS_T, dn_T, dm_T, scale=scale, eps=eps, normalizer=_norm_code(normalizer),
        stabilize=stabilize, track_n=track_n, offsets=offsets, need_gate_grads=need_gate_grads,
    )  # fmt: skip
    if not need_gate_grads:  # (the max state forms them anyway)
        grads.update(g=None, gv=None, gi=None)
    outs = [_empty(q) if grads[n] is None else grads[n] for n in rec.GRADS]
    return _distinct(outs, (q, k, v, g, gv, gi, u, S0, n0, m0, o, S_T, n_T, den, m_row, do,
                            dS_T, dn_T, dm_T))  # fmt: skip


@_recurrent_bwd.register_fake
def _recurrent_bwd_fake(q, k, v, g, gv, gi, u, S0, n0, m0, *rest):
    f = lambda x: _empty(q) if x is None else x.new_empty(x.shape, dtype=torch.float32)  # noqa: E731
    gate = f if rest[-1] else lambda x: _empty(q)  # (rest[-1]: need_gate_grads)
    return [q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), gate(g), gate(gv),
            gate(gi), f(u), f(S0), f(n0), f(m0)]  # fmt: skip


_REC_INPUTS = ("q", "k", "v", "g", "gv", "gi", "u", "S0", "n0", "m0")
_REC_OUTPUTS = ("o", "S_T", "n_T", "m_T", "den", "m_row")
_REC_OPTS = ("scale", "eps", "stabilize", "track_n", "normalizer", "offsets", "save")


def _rec_setup(ctx, inputs, output):
    named = dict(zip(_REC_INPUTS, inputs))
    ctx.opts = dict(zip(_REC_OPTS, inputs[len(_REC_INPUTS) :]))
    ctx.has = [named[n] is not None for n in _REC_INPUTS[3:]]
    named.update(zip(_REC_OUTPUTS, output))
    ctx.save_for_backward(*(named[n] for n in rec.SAVED))
    ctx.set_materialize_grads(False)


def _rec_backward(ctx, grads):
    do, dS_T, dn_T, dm_T = grads[:4]
    opts = dict(ctx.opts)
    if not opts.pop("save"):
        raise RuntimeError("linrnn::recurrent_fwd ran without saving for backward (save=False)")
    saved = dict(zip(rec.SAVED, ctx.saved_tensors))
    if do is None:
        do = torch.zeros_like(saved["o"])
    dn_T = dn_T if opts["track_n"] else None
    dm_T = dm_T if opts["stabilize"] else None
    need = any(ctx.needs_input_grad[3:6])  # g, gv, gi
    dq, dk, dv, *rest = torch.ops.linrnn.recurrent_bwd(
        *saved.values(), do, dS_T, dn_T, dm_T, *opts.values(), need
    )
    rest = [x if has else None for x, has in zip(rest, ctx.has)]
    if not need:
        rest[:3] = [None, None, None]
    return (dq, dk, dv, *rest) + (None,) * len(_REC_OPTS)


torch.library.register_autograd("linrnn::recurrent_fwd", _rec_backward, setup_context=_rec_setup)


def recurrent(q, k, v, *, scale, g=None, gv=None, gi=None, u=None, stabilize=False,
              track_n=False, normalizer=None, eps=0.0, S0=None, n0=None, m0=None,
              offsets=None, save=True):  # fmt: skip
    """:func:`linrnn.engine.recurrent.recurrent` (``save=True``: differentiable) or
    :func:`linrnn.engine.recurrent.forward` without ``out_state`` (``save=False``) through
    the custom ops. Returns ``(o, S_T, n_T, m_T)``."""
    if save and u is not None and gv is not None:
        raise NotImplementedError("the recurrent backward has no exclusive form with gv")
    S0, n0, m0 = rec.prepare_state(S0, n0, m0, track_n, stabilize)
    f32 = rec.fp32_contiguous
    out = torch.ops.linrnn.recurrent_fwd(
        q, k, v, f32(g), f32(gv), f32(gi), f32(u), S0, n0, m0, float(scale), float(eps),
        stabilize, track_n, normalizer or "none",
        None if offsets is None else [int(x) for x in offsets], save,
    )  # fmt: skip
    o, S_T, n_T, m_T = out[:4]
    return o, S_T, (n_T if track_n else None), (m_T if stabilize else None)


# ---------------------------------------------------------------------------------------------
# The delta rule's chunk path (linrnn.engine.delta): its own pair, the saved tensors differ

_DELTA_IN = ("q", "k", "v", "beta", "g", "S0")
_DELTA_MADE = ("b", "A", "vn", "states")  # what delta.forward saves besides inputs and S_T


def _delta_config(q, k, v, g, scale, L, offsets):
    return delta.config(q, k, v, scale=scale, g=g, chunk_size=L, offsets=offsets)


@torch.library.custom_op("linrnn::delta_chunk_fwd", mutates_args=())
def _delta_chunk_fwd(
    q: Tensor, k: Tensor, v: Tensor, beta: Tensor, g: Tensor | None, S0: Tensor | None,
    scale: float, chunk_size: int, offsets: list[int] | None,
) -> list[Tensor]:  # fmt: skip
    """[o, S_T, b, A, vn, states] (b empty without g)."""
    cfg = _delta_config(q, k, v, g, scale, chunk_size, offsets)
    (o, S_T), saved = delta.forward(q, k, v, beta, g, S0, cfg)
    made = [_empty(q) if saved[n] is None else saved[n] for n in _DELTA_MADE]
    return _distinct([o, S_T, *made], (q, k, v, beta, g, S0))


@_delta_chunk_fwd.register_fake
def _delta_chunk_fwd_fake(q, k, v, beta, g, S0, scale, chunk_size, offsets):
    B, T, _H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    N, NT, _ = _chunk_counts(B, T, chunk_size, offsets)
    f = lambda *shape: q.new_empty(shape, dtype=torch.float32)  # noqa: E731
    return [
        q.new_empty(v.shape), f(N, HV, K, V), f(B * HV, T) if g is not None else f(0),
        f(B * HV, T, chunk_size), v.new_empty(v.shape), k.new_empty(B * HV, NT, K, V),
    ]  # fmt: skip


@torch.library.custom_op("linrnn::delta_chunk_bwd", mutates_args=())
def _delta_chunk_bwd(
    q: Tensor, k: Tensor, v: Tensor, beta: Tensor, g: Tensor | None, S0: Tensor | None,
    S_T: Tensor, b: Tensor, A: Tensor, vn: Tensor, states: Tensor, do: Tensor,
    dS_T: Tensor | None, scale: float, chunk_size: int, offsets: list[int] | None,
) -> list[Tensor]:  # fmt: skip
    """[dq, dk, dv, dbeta, dg, dS0] (empty where the input was None)."""
    cfg = _delta_config(q, k, v, g, scale, chunk_size, offsets)
    saved = dict(q=q.contiguous(), k=k.contiguous(), v=v.contiguous(), beta=beta, g=g, S0=S0,
                 b=b if g is not None else None, A=A, vn=vn, states=states, S_T=S_T)  # fmt: skip
    grads = delta.backward(saved, cfg, do.contiguous(), dS_T)
    outs = [_empty(q) if x is None else x for x in grads]
    return _distinct(outs, (q, k, v, beta, g, S0, S_T, b, A, vn, states, do, dS_T))


@_delta_chunk_bwd.register_fake
def _delta_chunk_bwd_fake(q, k, v, beta, g, S0, *rest):
    f = lambda x: _empty(q) if x is None else x.new_empty(x.shape, dtype=torch.float32)  # noqa: E731
    return [q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), f(beta), f(g),
            f(S0)]  # fmt: skip


_DELTA_OPTS = ("scale", "chunk_size", "offsets")


def _delta_setup(ctx, inputs, output):
    named = dict(zip(_DELTA_IN, inputs))
    ctx.opts = inputs[len(_DELTA_IN) :]
    ctx.has = [named[n] is not None for n in _DELTA_IN[4:]]
    ctx.save_for_backward(*inputs[: len(_DELTA_IN)], *output[1:])
    ctx.set_materialize_grads(False)


def _delta_backward(ctx, grads):
    do, dS_T = grads[:2]
    saved = ctx.saved_tensors
    if do is None:
        do = torch.zeros_like(saved[2])
    dq, dk, dv, dbeta, *rest = torch.ops.linrnn.delta_chunk_bwd(*saved, do, dS_T, *ctx.opts)
    rest = [x if has else None for x, has in zip(rest, ctx.has)]
    return (dq, dk, dv, dbeta, *rest) + (None,) * len(_DELTA_OPTS)


torch.library.register_autograd("linrnn::delta_chunk_fwd", _delta_backward,
                                setup_context=_delta_setup)  # fmt: skip


def delta_chunk(q, k, v, beta, g=None, *, scale, S0=None, offsets=None, chunk_size=None):
    """:func:`linrnn.engine.delta.chunk` through the custom ops (same arguments and result)."""
    delta.check(q, k, v, beta, g, S0, offsets)
    L = config.delta_chunk_size(chunk_size, q.shape[3], v.shape[3], dtype=q.dtype,
                                device=q.device)  # fmt: skip
    offs = None if offsets is None else [int(x) for x in offsets]
    f32 = lambda x: None if x is None else x.float().contiguous()  # noqa: E731
    out = torch.ops.linrnn.delta_chunk_fwd(q, k, v, f32(beta), f32(g), f32(S0), float(scale),
                                           L, offs)  # fmt: skip
    return out[0], out[1]
