"""The layers' fused output norm and gate (linrnn.engine.norm_gate through
linrnn.layers.common.norm_gate with backend="triton") against float64 autograd of the same
formula written with torch's own rms_norm/layer_norm: values and the gradients of x, the gate,
the weight and the bias; RMSNorm and LayerNorm, silu and sigmoid gates, the gate before and
after the norm, per-row-slot and shared weights, widths that are and are not powers of two
(up to the 8-warp tile), token counts that are not multiples of a program's, strided inputs
(a gate split off a wider projection), fp32 and bf16."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import rel_err

from linrnn.layers import common

pytest.importorskip("triton")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
ACT = {"silu": F.silu, "sigmoid": torch.sigmoid}


def _ref(x, z, w, b, layer, act, gate_first, eps):
    """fp64, written independently of the code under test."""
    S, D = x.shape[-2:]
    w = w.reshape(-1, D).expand(S, D)
    b = None if b is None else b.reshape(-1, D).expand(S, D)
    a = ACT[act](z) if act else None
    h = x * a if gate_first else x
    y = F.layer_norm(h, (D,), eps=eps) if layer else F.rms_norm(h, (D,), eps=eps)
    y = y * w + (0 if b is None else b)
    return y * a if act and not gate_first else y


CASES = [  # layer, act, gate_first, bias, shared weight
    (False, None, False, False, False),
    (False, "silu", False, False, False),
    (False, "silu", False, False, True),
    (True, "silu", False, True, False),
    (True, "sigmoid", False, True, False),
    (False, "silu", True, False, False),
    (True, None, False, True, True),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(3, 61, 3, 16), (1, 19, 2, 48), (1, 23, 1, 1500)])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_values_and_gradients(case, shape, dtype):
    layer, act, gate_first, has_bias, shared = case
    S, D = shape[-2:]
    eps = 1e-5
    x = 3 * torch.randn(shape) + (1.5 if layer else 0.0)
    x[0, 0, 0] = 0.0  # a zero row stays finite (eps)
    wide = torch.randn(*shape[:-2], 2 * S * D)  # the gate a view of a wider projection
    z = wide[..., S * D :].unflatten(-1, (S, D)) if act else None
    w = 1 + 0.3 * torch.randn(D if shared else S * D)
    b = 0.2 * torch.randn(D if shared else S * D) if has_bias else None
    dy = torch.randn(shape)
    leaves = [t for t in (x, z, w, b) if t is not None]
    got = [t.to(DEVICE, dtype if t.dim() > 1 else torch.float32).requires_grad_()
           for t in leaves]  # fmt: skip
    it = iter(got)
    gx, gz = next(it), (next(it) if act else None)
    gw, gb = next(it), (next(it) if has_bias else None)
    if gz is not None:  # keep the gate strided, as a split of a projection
        gz_wide = wide.to(DEVICE, dtype).requires_grad_()
        gz = gz_wide[..., S * D :].unflatten(-1, (S, D))
        got[1] = gz_wide
        assert not gz.is_contiguous()
    y = common.norm_gate(gx, gw, gb, gz, layer=layer, act=act, gate_first=gate_first, eps=eps,
                         backend="triton")  # fmt: skip
    grads = torch.autograd.grad(y, got, dy.to(DEVICE, dtype))
    ref_leaves = [t.double().requires_grad_() for t in leaves]
    it = iter(ref_leaves)
    rx, rz = next(it), (next(it) if act else None)
    rw, rb = next(it), (next(it) if has_bias else None)
    y64 = _ref(rx, rz, rw, rb, layer, act, gate_first, eps)
    ref_grads = torch.autograd.grad(y64, ref_leaves, dy.double())
    if act:
        grads = list(grads)
        assert not grads[1][..., : S * D].any()  # the projection's other half: untouched
        grads[1] = grads[1][..., S * D :].unflatten(-1, (S, D))
    assert y.dtype == dtype and y.shape == x.shape
    tol = 1e-5 if dtype == torch.float32 else 2e-2  # bf16: the inputs' and outputs' rounding
    assert rel_err(y.cpu(), y64) < tol
    names = ["x", "z", "w", "b"] if act else ["x", "w", "b"]
    for name, g, r in zip(names, grads, ref_grads):
        assert g.dtype == (dtype if name in "xz" else torch.float32), name
        assert rel_err(g.cpu(), r) < tol, name


def test_matches_the_pytorch_form():
    """The Triton path and the PyTorch form of :func:`norm_gate` agree (fp32), so a layer gives
    the same result on both backends."""
    x, z = torch.randn(2, 9, 4, 32), torch.randn(2, 9, 4, 32)
    w, b = torch.randn(128), torch.randn(128)
    for layer, act, first in [(False, "silu", False), (True, "sigmoid", False),
                              (False, "silu", True)]:  # fmt: skip
        kw = dict(layer=layer, act=act, gate_first=first, eps=1e-6)
        fused = common.norm_gate(x.to(DEVICE), w.to(DEVICE), b.to(DEVICE), z.to(DEVICE),
                                 backend="triton", **kw)  # fmt: skip
        plain = common.norm_gate(x, w, b, z, backend="torch", **kw)
        assert rel_err(fused.cpu(), plain) < 1e-6


def test_bad_arguments():
    x = torch.randn(2, 3, 4)
    with pytest.raises(ValueError, match="act must be"):
        common.norm_gate(x, torch.ones(4), None, x, act="relu")
    with pytest.raises(ValueError, match="both gate and act"):
        common.norm_gate(x, torch.ones(4), None, x)


@pytest.mark.parametrize("branch_dtype", [torch.bfloat16, torch.float32, None])
@pytest.mark.parametrize("layer", [False, True])
@pytest.mark.parametrize("stream_grad", [True, False])
def test_add_norm(branch_dtype, layer, stream_grad):
    """A block's residual add and norm (common.add_norm, backend="triton") under bf16
    autocast: the stream r = x + a is torch's sum bit for bit; the norm comes out in bf16 (the
    products' dtype); the gradients of x, a, the weight and the bias (with and without a
    gradient of r itself, as at the model's last norm) match float64 autograd, and a's is x's
    in a's dtype."""
    shape, D = (2, 37, 96), 96
    x = 2 * torch.randn(shape) + (1.0 if layer else 0.0)
    a = torch.randn(shape).to(branch_dtype) if branch_dtype else None
    w, b = 1 + 0.3 * torch.randn(D), (0.2 * torch.randn(D) if layer else None)
    dh, dr = torch.randn(shape), torch.randn(shape)
    leaves = [t for t in (x, a, w, b) if t is not None]
    got = [t.to(DEVICE).requires_grad_() for t in leaves]
    gx, ga = got[0], (got[1] if a is not None else None)
    gw, gb = got[1 + (a is not None)], (got[-1] if layer else None)
    with torch.autocast(DEVICE, dtype=torch.bfloat16):
        r, h = common.add_norm(gx, ga, gw, gb, layer=layer, eps=1e-5, backend="triton")
    assert r.dtype == torch.float32 and h.dtype == torch.bfloat16
    assert torch.equal(r, gx + ga) if a is not None else r is gx
    outs, cots = [h], [dh.to(DEVICE, torch.bfloat16)]
    if stream_grad:
        outs, cots = [h, r], [*cots, dr.to(DEVICE)]
    grads = torch.autograd.grad(outs, got, cots, allow_unused=True)
    ref = [t.double().requires_grad_() for t in leaves]
    rx, ra = ref[0], (ref[1] if a is not None else None)
    rw, rb = ref[1 + (a is not None)], (ref[-1] if layer else None)
    r64 = rx if ra is None else rx + ra
    h64 = F.layer_norm(r64, (D,), eps=1e-5) if layer else F.rms_norm(r64, (D,), eps=1e-5)
    h64 = h64 * rw + (0 if rb is None else rb)
    outs64, cots64 = [h64], [cots[0].double().cpu()]
    if stream_grad:
        outs64, cots64 = [h64, r64], [*cots64, dr.double()]
    ref_grads = torch.autograd.grad(outs64, ref, cots64)
    assert rel_err(h.cpu(), h64) < 2e-2  # bf16 output
    for i, (g, r_) in enumerate(zip(grads, ref_grads)):
        assert g is not None and g.dtype == leaves[i].dtype, i
        # fp32 gradients to 1e-5; a bf16 branch's is rounded once (2^-9 relative)
        assert rel_err(g.cpu(), r_) < (8e-3 if leaves[i].dtype == torch.bfloat16 else 1e-5), i
    if a is not None:  # the branch's gradient: the stream's, rounded once to a's dtype
        ulp = 2.0**-7 if branch_dtype == torch.bfloat16 else 0.0  # (one bf16 ulp)
        assert ((grads[1].float() - grads[0]).abs() <= ulp * grads[0].abs()).all()


def test_add_norm_matches_the_pytorch_form():
    """Triton and the PyTorch form of :func:`add_norm` agree (fp32, no autocast): a model
    gives the same result on both backends."""
    x, a = torch.randn(3, 11, 64), torch.randn(3, 11, 64)
    w, b = torch.randn(64), torch.randn(64)
    for layer in (False, True):
        bias = b if layer else None
        r, h = common.add_norm(x.to(DEVICE), a.to(DEVICE), w.to(DEVICE),
                               None if bias is None else bias.to(DEVICE), layer=layer,
                               backend="triton")  # fmt: skip
        r0, h0 = common.add_norm(x, a, w, bias, layer=layer, backend="torch")
        assert torch.equal(r.cpu(), r0) and rel_err(h.cpu(), h0) < 1e-6
