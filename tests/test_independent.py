"""Checks against formulas written independently of linrnn's references: seed 002's naive
RWKV6 loop, explicit causal linear attention, and the *unstabilized* mLSTM."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_close

import linrnn

MODES = ["reference", "parallel", "chunk"]


@pytest.mark.parametrize("mode", MODES)
def test_rwkv6_matches_seed_002_naive_loop(mode):
    """Seed 002's loop in [B, H, T, D] layout, no scale: o_t = Σ_k q_k (h + u k v)_k; then
    h = h·exp(w_t) + k v."""
    B, H, T, K, V = 2, 3, 29, 10, 6
    q, k = torch.randn(B, H, T, K, dtype=torch.float64), torch.randn(B, H, T, K).double()
    v = torch.randn(B, H, T, V, dtype=torch.float64)
    w = -torch.exp(torch.randn(B, H, T, K, dtype=torch.float64))
    u = torch.randn(H, K, dtype=torch.float64)
    h0 = torch.randn(B, H, K, V, dtype=torch.float64)
    h = h0.clone()
    o = torch.zeros(B, H, T, V, dtype=torch.float64)
    for i in range(T):
        kv = k[:, :, i, :, None] * v[:, :, i, None, :]
        o[:, :, i] = ((h + u[None, :, :, None] * kv) * q[:, :, i, :, None]).sum(-2)
        h = h * w[:, :, i].exp()[..., None] + kv
    bthk = lambda x: x.transpose(1, 2)  # noqa: E731
    got, hT = linrnn.rwkv6(
        bthk(q), bthk(k), bthk(v), bthk(w), u, scale=1.0, initial_state=h0,
        output_final_state=True, mode=mode, chunk_size=8,
    )  # fmt: skip
    assert_close("o", got, bthk(o), torch.float64)
    assert_close("h_T", hT, h, torch.float64)


@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("mode", MODES)
def test_linear_attn_is_masked_attention(mode, normalize):
    """O = tril(φ(Q)φ(K)ᵀ)·V (and / row sums when normalized), per head."""
    B, T, H, K, V = 2, 33, 2, 8, 5
    q = F.elu(torch.randn(B, T, H, K, dtype=torch.float64)) + 1
    k = F.elu(torch.randn(B, T, H, K, dtype=torch.float64)) + 1
    v = torch.randn(B, T, H, V, dtype=torch.float64)
    scores = torch.einsum("bthk,bshk->bhts", q * K**-0.5, k).tril()
    want = torch.einsum("bhts,bshv->bthv", scores, v)
    if normalize:
        want = want / (scores.sum(-1).transpose(1, 2)[..., None] + 1e-6)
    got, _ = linrnn.linear_attn(q, k, v, normalize=normalize, mode=mode, chunk_size=8)
    assert_close("o", got, want, torch.float64)


@pytest.mark.parametrize("mode", MODES)
def test_mlstm_exp_equals_unstabilized(mode):
    """With eps = 0 the stabilized mLSTM equals the plain one: C_t = σ(f̃) C + exp(ĩ) k vᵀ,
    h = C q / max(|n q|, 1) — computed here without any max state, in float64."""
    B, T, H, K, V = 1, 31, 2, 6, 4
    q, k = torch.randn(B, T, H, K).double(), torch.randn(B, T, H, K).double()
    v = torch.randn(B, T, H, V).double()
    i, f = torch.randn(B, T, H).double() * 3, torch.randn(B, T, H).double() + 2
    C = torch.zeros(B, H, K, V, dtype=torch.float64)
    n = torch.zeros(B, H, K, dtype=torch.float64)
    out = []
    for t in range(T):
        fg, ig = torch.sigmoid(f[:, t])[..., None], torch.exp(i[:, t])[..., None]
        C = fg[..., None] * C + ig[..., None] * k[:, t, ..., None] * v[:, t, :, None, :]
        n = fg * n + ig * k[:, t]
        qs = q[:, t] * K**-0.5
        num = (qs[..., None] * C).sum(-2)
        den = (qs * n).sum(-1).abs().clamp_min(1.0)[..., None]
        out.append(num / den)
    want = torch.stack(out, dim=1)
    got, (C_s, n_s, m) = linrnn.mlstm(
        q, k, v, i, f, eps=0.0, mode=mode, chunk_size=8, output_final_state=True
    )
    assert_close("h", got, want, torch.float64)
    assert_close("C_T·exp(m_T)", C_s * m.exp()[..., None, None], C, torch.float64)
    assert_close("n_T·exp(m_T)", n_s * m.exp()[..., None], n, torch.float64)
