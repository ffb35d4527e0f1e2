"""mLSTM (xLSTM / TFLA): scalar forget and input gates from pre-activations, with the
exponential input gate stabilized by a max state, or a sigmoid input gate."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from linrnn import _runtime
from linrnn import _validation as check
from linrnn.ops import _generic
from linrnn.ops._generic import compute_dtype, document, prepare


@document
def mlstm(
    q,
    k,
    v,
    i,
    f,
    *,
    input_gate: str = "exp",
    normalize: bool | None = None,
    eps: float = 1e-6,
    scale=None,
    initial_state=None,
    output_final_state: bool = False,
    cu_seqlens=None,
    mode=None,
    chunk_size=None,
    backend=None,
):
    """mLSTM cell.

    ``input_gate="exp"`` (stabilized, docs/DESIGN.md §1)::

        m_t = max(log σ(f̃_t) + m_{t-1}, ĩ_t)
        C_t = exp(log σ(f̃_t) + m_{t-1} − m_t) C_{t-1} + exp(ĩ_t − m_t) k_t v_tᵀ
        n_t = (the same gates) n_{t-1} + (…) k_t
        h_t = scale·C_tᵀ q_t / (max(|scale·n_tᵀ q_t|, exp(−m_t)) + eps)

    ``input_gate="sigmoid"``: ``C_t = σ(f̃_t) C_{t-1} + σ(ĩ_t) k_t v_tᵀ``,
    ``h_t = scale·C_tᵀ q_t``, or with ``normalize`` ``h_t / (max(|scale·n_tᵀ q_t|, 1) + eps)``.

    Args:
        q, k: ``[B, T, H, K]``; v: ``[B, T, H, V]``; one float dtype (fp16/bf16/fp32/fp64).
        i, f: ``[B, T, H]`` input and forget gate *pre-activations* ĩ, f̃, finite; fp32 math.
        input_gate: ``"exp"`` or ``"sigmoid"``.
        normalize: exp: always True (False is an error); sigmoid: default False.
        eps: added to the normalizer's denominator.
        {common}

    State: always the tuple ``(C [N, H, K, V], n [N, H, K], m [N, H])``, stabilized as in the
    recurrence above (true state = ``C·exp(m)``). With no initial state ``m_0 = −∞``. For the
    sigmoid gate m is returned as zeros, and an initial state's m is folded into C and n.

    Example:
        >>> i, f = torch.randn(2, 128, 4), torch.randn(2, 128, 4) + 3
        >>> h, (C, n, m) = linrnn.mlstm(q, k, v, i, f, output_final_state=True)
    """
    c = prepare(q, k, v, scale, cu_seqlens, mode, backend, chunk_size, output_final_state)
    check.choice("input_gate", input_gate, ("exp", "sigmoid"))
    exp_gate = input_gate == "exp"
    normalize = check.flag("normalize", normalize, optional=True)
    if normalize is None:
        normalize = exp_gate
    if exp_gate and not normalize:
        raise ValueError(
            "input_gate='exp' always normalizes (its output is defined only up to exp(m_t)); "
            "got normalize=False"
        )
    eps = check.eps(eps)
    i = check.gate("i", i, (c.B, c.T, c.H), q, layout="[B, T, H]")
    f = check.gate("f", f, (c.B, c.T, c.H), q, layout="[B, T, H]")
    C0 = n0 = m0 = None
    if initial_state is not None:
        C0, n0, m0 = check.state_tuple("initial_state", initial_state, 3, "(C, n, m)")
        C0 = c.state("initial_state[0] (C)", C0)
        n0 = c.state("initial_state[1] (n)", n0, "n")
        m0 = c.state("initial_state[2] (m)", m0, "m")
        bad = torch.isnan(m0) | (m0 == float("inf")) if _runtime.data_checks(m0) else None
        if bad is not None and bool(bad.any()):
            idx = bad.nonzero()[0].tolist()
            raise ValueError(
                f"initial_state[2] (m) must be finite or −∞ (no state); {int(bad.sum())} of "
                f"{m0.numel()} values are not (first at index {idx}: {m0[tuple(idx)].item()})"
            )
    cdt = compute_dtype(q)
    step_gates = None
    starts = [0] if c.offsets is None else c.offsets[:-1]
    ends = [c.T] if c.offsets is None else c.offsets[1:]
    every_seq_steps = all(a < b for a, b in zip(starts, ends))
    grad = _generic._needs_grad(q, k, v, i, f, C0, n0, m0)
    if c.kernel_gates("mlstm", v, grad) and (exp_gate or every_seq_steps):
        # A decode step: the kernel forms log σ(f) (and log σ(i), and joins the sigmoid form's
        # m_0 to each sequence's first decay, as below; m_T = 0 since every sequence steps).
        if exp_gate:
            log_f, gi, step_gates = None, i, dict(f=f)
        else:
            log_f, gi, step_gates, m0 = None, None, dict(f=f, i=i, fold_m0=m0), None
    else:
        log_f = F.logsigmoid(f.to(cdt))
        gi = i.to(cdt) if exp_gate else F.logsigmoid(i.to(cdt))
    if m0 is not None and not exp_gate:  # the sigmoid form carries the true (unscaled) state
        if every_seq_steps and c.route("mlstm", v, grad).mode == "recurrent":
            # Stepwise: exp(m_0) joins the first step's forget gate, f_1·e^{m_0}, instead of a
            # rescaled copy of the whole state (which doubled a decode step's memory traffic).
            # Exact for a recurrence that applies each step's decay on its own; every sequence
            # has a first step here (an empty one would keep its state unscaled).
            m0 = m0.to(cdt)
            if c.offsets is None:
                log_f = torch.cat([log_f[:, :1] + m0[:, None], log_f[:, 1:]], dim=1)
            else:
                idx = torch.as_tensor(starts, device=log_f.device)
                log_f = log_f.index_add(1, idx, m0[None])
            C0, n0, m0 = C0.to(cdt), n0.to(cdt), None
        else:
            scale_0 = torch.exp(m0.to(cdt))
            C0, n0, m0 = (
                C0.to(cdt) * scale_0[..., None, None],
                n0.to(cdt) * scale_0[..., None],
                None,
            )
    o, (C, n, m) = c.run(
        "mlstm", q, k, v, g=log_f, gi=gi, stabilize=exp_gate, track_n=True,
        normalizer="mlstm" if normalize else None, eps=eps, S0=C0, n0=n0, m0=m0,
        step_gates=step_gates,
    )  # fmt: skip
    if not output_final_state:
        return o, None
    if m is None:  # the sigmoid form: m = 0 (an in-place step zeroes the caller's m itself)
        out = None if _runtime.tracing() else _generic.OUT_STATE.get()
        m_out = out[2] if out is not None and len(out) > 2 else None
        if m_out is not None and m_out.shape == C.shape[:2] and m_out.dtype == C.dtype:
            m = m_out.zero_()
        else:
            m = C.new_zeros(C.shape[:2])
    return o, (C, n, m)
