"""``torch.nn.functional.multi_head_attention_forward`` with a pluggable attention core.

``nn.MultiheadAttention`` (and through it ``nn.TransformerEncoderLayer`` / ``DecoderLayer``)
computes attention inside ``F.multi_head_attention_forward``.  Under a
``TorchFunctionMode`` that function is handed to the mode as one call, and while the mode
handles it the mode is switched off, so the ``scaled_dot_product_attention`` call inside it
(or the ``bmm`` + ``softmax`` it uses when ``need_weights=True``) would escape emulation.
:func:`mha_forward` therefore re-states the function's semantics (torch 2.x, the
``need_weights=False`` path) around an ``attend(q, k, v, attn_mask, is_causal)`` callable
``(N, H, L, E)`` -> ``(N, H, L, E)`` that the emulation supplies:

* input projections (packed ``in_proj_weight`` or separate ``q/k/v_proj_weight``), ``bias_k`` /
  ``bias_v``, ``add_zero_attn``, ``static_k`` / ``static_v``, the output projection;
* masks as torch defines them for this function: a boolean ``attn_mask`` or
  ``key_padding_mask`` is True where attention is *not* allowed (the opposite of SDPA's
  convention); float masks are added; both are combined by addition;
* ``is_causal`` as torch uses it: a hint that ``attn_mask`` is the causal mask; with no key
  padding mask and ``need_weights=False`` it replaces ``attn_mask`` by SDPA's (top-left)
  causal flag, otherwise ``attn_mask`` is used and the flag dropped;
* unbatched ``(L, E)`` inputs, and ``dropout_p`` applied only when ``training``.

Attention weights: when ``need_weights=True`` the *output* still comes from ``attend`` (it is
emulated) and the returned weights are the float ``softmax(q k^T / sqrt(E) + mask)`` computed
by torch (averaged over heads unless ``average_attn_weights=False``); they are not emulated.
"""

from __future__ import annotations

import math


def _as_additive(mask, dtype, name: str):
    """torch's MHA mask convention -> an additive float mask (None stays None)."""
    import torch

    if mask is None:
        return None
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(
            mask, float("-inf"))
    if not torch.is_floating_point(mask):
        raise TypeError(f"{name} must be a bool or float tensor, got {mask.dtype}")
    return mask


def _project(x, w, b):
    import torch.nn.functional as F

    return F.linear(x, w, b)


def mha_forward(attend, query, key, value, embed_dim_to_check, num_heads, in_proj_weight,
                in_proj_bias, bias_k, bias_v, add_zero_attn, dropout_p, out_proj_weight,
                out_proj_bias, training=True, key_padding_mask=None, need_weights=True,
                attn_mask=None, use_separate_proj_weight=False, q_proj_weight=None,
                k_proj_weight=None, v_proj_weight=None, static_k=None, static_v=None,
                average_attn_weights=True, is_causal=False):
    """``F.multi_head_attention_forward`` (same arguments and results) with its attention
    computed by ``attend(q, k, v, attn_mask=..., is_causal=..., dropout_p=...)`` on
    ``(N, H, L, E)`` tensors; see the module docstring for what is and is not emulated.

    Returns:
        ``(attn_output, attn_weights or None)`` as torch returns them.

    Raises:
        ValueError / RuntimeError: shapes and masks torch would reject.
    """
    import torch

    if query.dim() not in (2, 3):
        raise ValueError(f"query must be (L, E) or (L, N, E), got {tuple(query.shape)}")
    batched = query.dim() == 3
    if not batched:
        query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
        if key_padding_mask is not None:
            key_padding_mask = key_padding_mask.unsqueeze(0)
    tgt_len, bsz, embed_dim = query.shape
    if embed_dim != embed_dim_to_check:
        raise ValueError(f"expected embedding dimension {embed_dim_to_check}, got {embed_dim}")
    head_dim = embed_dim // num_heads
    if head_dim * num_heads != embed_dim:
        raise ValueError(f"embed_dim {embed_dim} is not divisible by num_heads {num_heads}")
    if is_causal and attn_mask is None:
        raise RuntimeError("is_causal=True needs attn_mask (the causal mask it describes)")
    kpm = _as_additive(key_padding_mask, query.dtype, "key_padding_mask")
    use_causal_flag = bool(is_causal) and kpm is None and not need_weights
    am = None if use_causal_flag else _as_additive(attn_mask, query.dtype, "attn_mask")

    # input projections
    if not use_separate_proj_weight:
        if in_proj_weight is None:
            raise ValueError("in_proj_weight is None while use_separate_proj_weight is False")
        wq, wk, wv = in_proj_weight.chunk(3)
    else:
        if q_proj_weight is None or k_proj_weight is None or v_proj_weight is None:
            raise ValueError("use_separate_proj_weight=True needs q/k/v_proj_weight")
        wq, wk, wv = q_proj_weight, k_proj_weight, v_proj_weight
    bq = bk = bv = None
    if in_proj_bias is not None:
        bq, bk, bv = in_proj_bias.chunk(3)
    q = _project(query, wq, bq)
    k = _project(key, wk, bk)
    v = _project(value, wv, bv)

    if am is not None:
        if am.dim() == 2:
            if tuple(am.shape) != (tgt_len, key.shape[0]):
                raise RuntimeError(f"2-D attn_mask has shape {tuple(am.shape)}, expected "
                                   f"{(tgt_len, key.shape[0])}")
            am = am.unsqueeze(0)
        elif am.dim() == 3:
            if tuple(am.shape) != (bsz * num_heads, tgt_len, key.shape[0]):
                raise RuntimeError(f"3-D attn_mask has shape {tuple(am.shape)}, expected "
                                   f"{(bsz * num_heads, tgt_len, key.shape[0])}")
        else:
            raise RuntimeError(f"attn_mask with {am.dim()} dims is not supported")
    if bias_k is not None or bias_v is not None:
        if bias_k is None or bias_v is None:
            raise ValueError("bias_k and bias_v must be given together")
        if static_k is not None or static_v is not None:
            raise ValueError("bias_k/bias_v cannot be added to static_k/static_v")
        k = torch.cat([k, bias_k.repeat(1, bsz, 1)])
        v = torch.cat([v, bias_v.repeat(1, bsz, 1)])
        am = None if am is None else torch.nn.functional.pad(am, (0, 1))
        kpm = None if kpm is None else torch.nn.functional.pad(kpm, (0, 1))

    def heads(x, static, what):
        if static is None:
            return x.reshape(x.shape[0], bsz * num_heads, head_dim).transpose(0, 1)
        if static.shape[0] != bsz * num_heads or static.shape[2] != head_dim:
            raise ValueError(f"{what} must have shape ({bsz * num_heads}, S, {head_dim}), got "
                             f"{tuple(static.shape)}")
        return static

    q = q.reshape(tgt_len, bsz * num_heads, head_dim).transpose(0, 1)
    k = heads(k, static_k, "static_k")
    v = heads(v, static_v, "static_v")
    if add_zero_attn:
        z = torch.zeros((bsz * num_heads, 1, head_dim), dtype=k.dtype, device=k.device)
        k = torch.cat([k, z], dim=1)
        v = torch.cat([v, z.to(v.dtype)], dim=1)
        am = None if am is None else torch.nn.functional.pad(am, (0, 1))
        kpm = None if kpm is None else torch.nn.functional.pad(kpm, (0, 1))
    src_len = k.shape[1]
    if kpm is not None:
        if tuple(kpm.shape) != (bsz, src_len):
            raise RuntimeError(f"key_padding_mask has shape {tuple(kpm.shape)}, expected "
                               f"{(bsz, src_len)}")
        kpm = kpm.view(bsz, 1, 1, src_len).expand(-1, num_heads, -1, -1)
        kpm = kpm.reshape(bsz * num_heads, 1, src_len)
        am = kpm if am is None else am + kpm
    p = float(dropout_p) if training else 0.0

    q4 = q.reshape(bsz, num_heads, tgt_len, head_dim)
    k4 = k.reshape(bsz, num_heads, src_len, head_dim)
    v4 = v.reshape(bsz, num_heads, src_len, head_dim)
    m4 = None
    if am is not None:
        m4 = am.unsqueeze(0) if am.shape[0] == 1 else am.reshape(bsz, num_heads, -1, src_len)
    out = attend(q4, k4, v4, attn_mask=m4, is_causal=use_causal_flag, dropout_p=p)
    out = out.permute(2, 0, 1, 3).reshape(bsz * tgt_len, embed_dim)
    out = _project(out, out_proj_weight, out_proj_bias).view(tgt_len, bsz, -1)
    if not batched:
        out = out.squeeze(1)

    weights = None
    if need_weights:
        s = torch.matmul(q4 * math.sqrt(1.0 / head_dim), k4.transpose(-2, -1))
        if m4 is not None:
            s = s + m4
        weights = torch.softmax(s, dim=-1)
        if average_attn_weights:
            weights = weights.mean(dim=1)
        if not batched:
            weights = weights.squeeze(0)
    return out, weights


__all__ = ["mha_forward"]
