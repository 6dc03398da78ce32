"""``lowprec.torch.mha.mha_forward`` restates ``F.multi_head_attention_forward`` around a
pluggable attention core: with torch's own SDPA as the core it must give torch's results
(bit for bit on the ``need_weights=False`` path that torch computes with SDPA too)."""

from __future__ import annotations

import itertools

import pytest

torch = pytest.importorskip("torch")
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from lowprec.torch.mha import mha_forward  # noqa: E402

E, H, L, S, N = 16, 4, 5, 7, 3


def _sdpa(q, k, v, attn_mask=None, is_causal=False, dropout_p=0.0):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal,
                                          dropout_p=dropout_p)


def _mask(kind, batched):
    if kind == "bool2":
        return torch.rand(L, S) < 0.3
    if kind == "float2":
        return torch.randn(L, S)
    if kind == "bool3":
        return torch.rand(N * H, L, S) < 0.3
    return None


CASES = [c for c in itertools.product(
    [False, True], [False, True], [None, 12], [True, False], [None, "bool2", "float2", "bool3"],
    [None, "bool", "float"], [False, True]) if not (not c[3] and c[4] == "bool3")
    and not (c[4] in ("bool2", "bool3") and c[5] == "float")
    and not (c[4] == "float2" and c[5] == "bool")]


@pytest.mark.parametrize("bias, zero, kdim, batched, mask, kpm_kind, need_weights", CASES)
def test_equals_torch(bias, zero, kdim, batched, mask, kpm_kind, need_weights):
    torch.manual_seed(CASES.index((bias, zero, kdim, batched, mask, kpm_kind, need_weights)))
    mha = nn.MultiheadAttention(E, H, add_bias_kv=bias, add_zero_attn=zero, kdim=kdim,
                                vdim=kdim).eval()
    q = torch.randn(L, N, E) if batched else torch.randn(L, E)
    kv = torch.randn(S, N, kdim or E) if batched else torch.randn(S, kdim or E)
    kpm = None
    if kpm_kind:
        kpm = torch.rand(N, S) < 0.3 if batched else torch.rand(S) < 0.3
        if kpm_kind == "float":
            kpm = torch.where(kpm, -1e4, 0.0)
    args = (q, kv, kv, E, H, mha.in_proj_weight, mha.in_proj_bias, mha.bias_k, mha.bias_v,
            zero, 0.0, mha.out_proj.weight, mha.out_proj.bias)
    kw = dict(training=False, key_padding_mask=kpm, need_weights=need_weights,
              attn_mask=_mask(mask, batched), use_separate_proj_weight=kdim is not None,
              q_proj_weight=mha.q_proj_weight, k_proj_weight=mha.k_proj_weight,
              v_proj_weight=mha.v_proj_weight)
    with torch.no_grad():
        ref = F.multi_head_attention_forward(*args, **kw)
        got = mha_forward(_sdpa, *args, **kw)
    if need_weights:  # torch computes this path with bmm + softmax, we with SDPA
        # a query row that sees no key is NaN on torch's bmm + softmax path and not on its
        # SDPA path (which is what the emulation replaces); compare the other rows
        seen = ref[0].isfinite().all(-1)
        torch.testing.assert_close(got[0][seen], ref[0][seen], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(got[1], ref[1], atol=1e-6, rtol=1e-5, equal_nan=True)
    else:
        assert torch.equal(got[0].nan_to_num(7.0), ref[0].nan_to_num(7.0))
        assert got[1] is None and ref[1] is None


@pytest.mark.parametrize("need_weights", [False, True])
def test_causal_hint(need_weights):
    torch.manual_seed(1)
    mha = nn.MultiheadAttention(E, H).eval()
    q = torch.randn(L, N, E)
    cm = nn.Transformer.generate_square_subsequent_mask(L)
    args = (q, q, q, E, H, mha.in_proj_weight, mha.in_proj_bias, None, None, False, 0.0,
            mha.out_proj.weight, mha.out_proj.bias)
    kw = dict(training=False, need_weights=need_weights, attn_mask=cm, is_causal=True)
    with torch.no_grad():
        ref = F.multi_head_attention_forward(*args, **kw)
        got = mha_forward(_sdpa, *args, **kw)
    torch.testing.assert_close(got[0], ref[0], atol=1e-6, rtol=1e-5)
    with pytest.raises(RuntimeError, match="is_causal"):
        mha_forward(_sdpa, *args, **{**kw, "attn_mask": None})


def test_bad_shapes():
    mha = nn.MultiheadAttention(E, H).eval()
    q = torch.randn(L, N, E)
    args = (q, q, q, E + 1, H, mha.in_proj_weight, mha.in_proj_bias, None, None, False, 0.0,
            mha.out_proj.weight, mha.out_proj.bias)
    with pytest.raises(ValueError, match="embedding dimension"):
        mha_forward(_sdpa, *args)
    with pytest.raises(RuntimeError, match="2-D attn_mask"):
        mha_forward(_sdpa, *(args[:3] + (E,) + args[4:]), attn_mask=torch.zeros(2, 2))
