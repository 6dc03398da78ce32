"""Attention front end, ``reference`` and ``flash`` (specs/attention.md sections 0, 1 and 8).

Checked against the slow twins of ``tests/naive/attention.py`` (bitwise for ``flash``), the
float64 row-by-row oracle there, and torch's own lower-right causal mask and SDPA as peers.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
import torch
from conftest import rand_qkv, same_bits
from naive import attention as AR
from torch.nn.attention.bias import causal_lower_right

import lowprec as lp

BF16 = np.dtype(ml_dtypes.bfloat16)
FLASH_TOL = 1e-5  # specs/attention.md 1: flash agrees with reference to float32 accuracy


def torch_to_np(t: torch.Tensor) -> np.ndarray:
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(BF16)
    return t.numpy()


def np_to_torch(a: np.ndarray) -> torch.Tensor:
    if a.dtype == BF16:
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(a.copy())


# ------------------------------------------------------------------------------------------
# registry


def test_schemes_lists_the_issue_3_schemes():
    s = lp.schemes()
    assert isinstance(s, dict)
    for name in ("reference", "flash", "baps"):
        assert name in s
        assert isinstance(s[name], str) and s[name] and "\n" not in s[name]
    assert "hif8_exp2" in lp.schemes("softmax")
    assert "hif8_exp2" not in s
    with pytest.raises(ValueError, match="attention, softmax"):
        lp.schemes("bogus")


def test_unknown_scheme_lists_valid_names():
    q, k, v = rand_qkv(1, 3, 3, 4, 2)
    with pytest.raises(ValueError, match=r"'flashy' is not one of .*baps.*flash.*reference"):
        lp.attention(q, k, v, "flashy")
    with pytest.raises(ValueError):
        lp.attention(q, k, v, scheme=None)


# ------------------------------------------------------------------------------------------
# reference and flash accuracy


SHAPES = [  # (B, Lq, Lk, d, dv, block_q, block_k)
    (2, 37, 53, 16, 8, 16, 16),  # partial tiles on both sides
    (1, 64, 64, 32, 32, 32, 32),  # exact tiles
    (3, 1, 29, 8, 4, 16, 8),  # L = 1 query
    (1, 29, 1, 8, 3, 8, 8),  # L = 1 key
    (2, 70, 45, 12, 7, 128, 128),  # default-size tiles larger than L
]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", SHAPES)
def test_reference_matches_oracle(shape, causal):
    B, Lq, Lk, d, dv, _, _ = shape
    q, k, v = rand_qkv(B, Lq, Lk, d, dv, seed=1, amp=2.0, dtype=np.float64)
    got = lp.attention(q, k, v, "reference", causal=causal)
    exp = AR.oracle_attention(q, k, v, causal=causal)
    assert got.dtype == np.float64
    assert np.array_equal(np.isnan(got), np.isnan(exp))
    np.testing.assert_allclose(got, exp, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", SHAPES)
def test_flash_within_1e5_of_reference(shape, causal):
    B, Lq, Lk, d, dv, bq, bk = shape
    q, k, v = rand_qkv(B, Lq, Lk, d, dv, seed=2, amp=1.5)
    out = lp.attention(q, k, v, "flash", causal=causal, block_q=bq, block_k=bk)
    ref = lp.attention(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64),
                       "reference", causal=causal)
    keep = np.isfinite(ref)
    assert np.array_equal(np.isfinite(out), keep)
    assert AR.relative_error(out, ref) < FLASH_TOL
    # elementwise too, relative to the size of each output row
    scale = np.abs(ref).max(axis=-1, keepdims=True)
    with np.errstate(invalid="ignore"):
        assert np.nanmax(np.abs(out - ref) / scale) < 10 * FLASH_TOL


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", SHAPES)
def test_flash_equals_twin_bitwise(shape, causal):
    B, Lq, Lk, d, dv, bq, bk = shape
    q, k, v = rand_qkv(B, Lq, Lk, d, dv, seed=3, amp=2.0)
    out, st = lp.attention(q, k, v, "flash", causal=causal, block_q=bq, block_k=bk,
                           return_stats=True)
    tw = AR.twin_attention(q, k, v, scheme="flash", causal=causal, block_q=bq, block_k=bk)
    assert same_bits(out, tw.out)
    assert np.array_equal(st.flags[0], tw.flags)


@pytest.mark.parametrize("bq,bk", [(1, 1), (1, 7), (5, 1), (100, 100), (3, 64)])
def test_flash_block_sizes_1_and_larger_than_L(bq, bk):
    q, k, v = rand_qkv(2, 9, 13, 6, 4, seed=4, amp=2.0)
    for causal in (False, True):
        out = lp.attention(q, k, v, "flash", causal=causal, block_q=bq, block_k=bk)
        tw = AR.twin_attention(q, k, v, scheme="flash", causal=causal, block_q=bq, block_k=bk)
        assert same_bits(out, tw.out)
        ref = AR.oracle_attention(q, k, v, causal=causal)
        assert AR.relative_error(out, ref) < FLASH_TOL


def test_huge_blocks_behave_like_one_tile():
    q, k, v = rand_qkv(1, 5, 6, 4, 3, seed=22)
    one = lp.attention(q, k, v, "flash", block_q=5, block_k=6)
    assert same_bits(lp.attention(q, k, v, "flash", block_q=2**31, block_k=2**31), one)


def test_flash_result_depends_only_on_tiles_not_on_threads_or_batch():
    """A batch entry gives the same bits alone and inside a batch (tasks are independent)."""
    q, k, v = rand_qkv(4, 21, 33, 8, 5, seed=5, amp=2.0)
    full = lp.attention(q, k, v, "flash", block_q=8, block_k=8)
    for b in range(4):
        one = lp.attention(q[b], k[b], v[b], "flash", block_q=8, block_k=8)
        assert same_bits(full[b], one)


def test_flash_stats_count_visited_tiles_without_restarts():
    q, k, v = rand_qkv(2, 20, 30, 4, 3, seed=6)
    _, st = lp.attention(q, k, v, "flash", causal=True, block_q=8, block_k=8,
                         return_stats=True)
    vis = AR.dense_visibility(2, 20, 30, True, None)
    exp = sum(vis[0, i0:i0 + 8, j0:j0 + 8].any() for i0 in range(0, 20, 8)
              for j0 in range(0, 30, 8))
    assert st.tiles[0].tolist() == [exp, exp]
    # flash has no restart test: no restart rate (issue 12 item 19)
    assert st.total_restarts == 0 and st.restart_rate is None and st.peak_restart_rate is None
    assert lp.attention(q, k, v, "reference", return_stats=True)[1] is None


# ------------------------------------------------------------------------------------------
# partial tiles == padding with masked keys


def _pad_keys(k, v, Lk_pad, rng):
    B, Lk, d = k.shape
    kp = rng.standard_normal((B, Lk_pad, d)).astype(np.float32) * 3  # garbage: must not matter
    vp = rng.standard_normal((B, Lk_pad, v.shape[2])).astype(np.float32) * 3
    kp[:, :Lk], vp[:, :Lk] = k, v
    return kp, vp


@pytest.mark.parametrize("scheme,opts", [
    ("flash", {}),
    ("baps", {"config": "default"}),
    ("baps", {"config": "exp2_e4m3"}),
    ("baps", {"config": "naive_e2e"}),
    ("baps", {"config": "e2e_hif8", "tau": 0}),
    ("baps", {"config": "e2e_hif8", "critical": "first+last", "granularity": "row"}),
])
def test_partial_tile_equals_padding_with_masked_keys(scheme, opts):
    rng = np.random.default_rng(7)
    B, Lq, Lk, d, dv, bq, bk = 2, 13, 21, 8, 5, 4, 8
    q, k, v = rand_qkv(B, Lq, Lk, d, dv, seed=8, amp=2.5)
    base_mask = rng.random((B, Lq, Lk)) < 0.85
    out = lp.attention(q, k, v, scheme, attn_mask=base_mask, block_q=bq, block_k=bk, **opts)
    Lk_pad = 24  # a multiple of block_k
    kp, vp = _pad_keys(k, v, Lk_pad, rng)
    mp = np.zeros((B, Lq, Lk_pad), dtype=bool)
    mp[:, :, :Lk] = base_mask
    got = lp.attention(q, kp, vp, scheme, attn_mask=mp, block_q=bq, block_k=bk, **opts)
    assert same_bits(out, got)
    # extra query rows do not change the real rows either
    qp = np.concatenate([q, rng.standard_normal((B, 3, d)).astype(np.float32)], axis=1)
    mq = np.concatenate([mp, np.ones((B, 3, Lk_pad), dtype=bool)], axis=1)
    got_q = lp.attention(qp, kp, vp, scheme, attn_mask=mq, block_q=bq, block_k=bk, **opts)
    assert same_bits(out, got_q[:, :Lq])


# ------------------------------------------------------------------------------------------
# input kinds, dtypes, shapes


@pytest.mark.parametrize("kind", ["numpy", "torch"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, BF16])
@pytest.mark.parametrize("scheme,opts", [("reference", {}), ("flash", {}),
                                         ("baps", {"config": "default"})])
def test_output_kind_dtype_and_value(kind, dtype, scheme, opts):
    q, k, v = rand_qkv(2, 11, 17, 8, 6, seed=9)
    q, k, v = (a.astype(dtype) for a in (q, k, v))
    args = (q, k, v) if kind == "numpy" else tuple(np_to_torch(a) for a in (q, k, v))
    out = lp.attention(*args, scheme, **opts)
    if kind == "torch":
        assert isinstance(out, torch.Tensor)
        assert out.dtype == {np.dtype(np.float32): torch.float32,
                             np.dtype(np.float16): torch.float16,
                             BF16: torch.bfloat16}[np.dtype(dtype)]
        out = torch_to_np(out)
    else:
        assert isinstance(out, np.ndarray)
    assert out.dtype == np.dtype(dtype) and out.shape == (2, 11, 6)
    # the same computation on the (exactly) widened inputs, rounded once to the input dtype
    q32, k32, v32 = (a.astype(np.float32) for a in (q, k, v))
    if scheme == "reference":
        wide = lp.attention(*(a.astype(np.float64) for a in (q32, k32, v32)), "reference")
    else:
        wide = lp.attention(q32, k32, v32, scheme, **opts)
    assert same_bits(out, wide.astype(dtype))
    if scheme == "baps":  # baps rounds its inputs to bfloat16 first (input_dtype)
        q32, k32, v32 = (a.astype(BF16).astype(np.float32) for a in (q32, k32, v32))
    ref = AR.oracle_attention(q32, k32, v32)
    tol = {np.dtype(np.float32): 1e-5, np.dtype(np.float16): 2e-3, BF16: 1e-2}[np.dtype(dtype)]
    assert AR.relative_error(out, ref) < tol


def test_float64_inputs():
    q, k, v = rand_qkv(1, 6, 9, 4, 3, seed=10, dtype=np.float64)
    r = lp.attention(q, k, v, "reference")
    assert r.dtype == np.float64
    np.testing.assert_allclose(r, AR.oracle_attention(q, k, v), rtol=1e-13)
    f = lp.attention(q, k, v, "flash")
    assert f.dtype == np.float64  # returned in the input dtype, computed in float32
    f32 = lp.attention(*(a.astype(np.float32) for a in (q, k, v)), "flash")
    assert np.array_equal(f, f32.astype(np.float64))


def test_torch_kind_follows_q_and_grad_tensors_are_accepted():
    q, k, v = rand_qkv(1, 5, 7, 4, 3, seed=11)
    tq = torch.from_numpy(q).requires_grad_(True)
    out = lp.attention(tq, k, v, "flash")
    assert isinstance(out, torch.Tensor) and not out.requires_grad
    assert same_bits(out.numpy(), lp.attention(q, k, v, "flash"))
    out_np = lp.attention(q, torch.from_numpy(k), torch.from_numpy(v), "flash")
    assert isinstance(out_np, np.ndarray)


def test_leading_dims_broadcast():
    rng = np.random.default_rng(12)
    Lq, Lk, d, dv = 7, 10, 8, 5
    q = rng.standard_normal((2, 3, Lq, d)).astype(np.float32)
    k = rng.standard_normal((3, Lk, d)).astype(np.float32)
    v = rng.standard_normal((1, 3, Lk, dv)).astype(np.float32)
    mask = rng.random((3, 1, Lk)) < 0.7  # per head, broadcast over queries
    mask[:, :, 0] = True
    out = lp.attention(q, k, v, "flash", attn_mask=mask, block_q=4, block_k=4)
    assert out.shape == (2, 3, Lq, dv)
    for b in range(2):
        for h in range(3):
            one = lp.attention(q[b, h], k[h], v[0, h], "flash",
                               attn_mask=np.broadcast_to(mask[h], (Lq, Lk)), block_q=4,
                               block_k=4)
            assert same_bits(out[b, h], one)
            ref = AR.oracle_attention(q[b, h][None], k[h][None], v[0, h][None],
                                      attn_mask=mask[h][None])
            assert AR.relative_error(out[b, h], ref[0]) < FLASH_TOL


def test_no_leading_dims():
    q, k, v = rand_qkv(1, 6, 8, 4, 3, seed=13)
    out = lp.attention(q[0], k[0], v[0], "flash")
    assert out.shape == (6, 3)
    assert same_bits(out, lp.attention(q, k, v, "flash")[0])


def test_scale_default_and_explicit():
    q, k, v = rand_qkv(2, 9, 12, 16, 4, seed=14)
    a = lp.attention(q, k, v, "flash")
    assert same_bits(a, lp.attention(q, k, v, "flash", scale=1 / math.sqrt(16)))
    b = lp.attention(q, k, v, "flash", scale=0.7)
    assert not np.array_equal(a, b)
    assert AR.relative_error(b, AR.oracle_attention(q, k, v, scale=0.7)) < FLASH_TOL
    r = lp.attention(*(x.astype(np.float64) for x in (q, k, v)), "reference", scale=2)
    np.testing.assert_allclose(r, AR.oracle_attention(q, k, v, scale=2.0), rtol=1e-12)


# ------------------------------------------------------------------------------------------
# causal and masks


@pytest.mark.filterwarnings("ignore:Lower right causal bias:UserWarning")
@pytest.mark.parametrize("Lq,Lk", [(5, 12), (12, 12), (12, 5), (1, 9), (9, 1)])
def test_causal_is_bottom_right_aligned(Lq, Lk):
    q, k, v = rand_qkv(2, Lq, Lk, 8, 4, seed=15, amp=2.0)
    vis = causal_lower_right(Lq, Lk)._materialize().numpy()  # torch's lower-right mask
    assert np.array_equal(AR.dense_visibility(1, Lq, Lk, True, None)[0], vis)
    ref = lp.attention(*(x.astype(np.float64) for x in (q, k, v)), "reference", causal=True)
    np.testing.assert_allclose(ref, AR.oracle_attention(q, k, v, attn_mask=vis), rtol=1e-12)
    empty_rows = ~vis.any(axis=1)
    assert np.isnan(ref[:, empty_rows]).all() and np.isfinite(ref[:, ~empty_rows]).all()
    qt, kt, vt = (torch.from_numpy(x.astype(np.float64)) for x in (q, k, v))
    peer = torch.nn.functional.scaled_dot_product_attention(
        qt, kt, vt, attn_mask=torch.from_numpy(vis)).numpy()
    np.testing.assert_allclose(ref[:, ~empty_rows], peer[:, ~empty_rows], rtol=1e-10,
                               atol=1e-12)
    for scheme, opts in (("flash", {}), ("baps", {"config": "e2e_hif8"}),
                         ("baps", {"config": "exp2_hif8"})):
        a = lp.attention(q, k, v, scheme, causal=True, block_q=4, block_k=4, **opts)
        b = lp.attention(q, k, v, scheme, attn_mask=vis, block_q=4, block_k=4, **opts)
        assert same_bits(a, b)  # causal == the explicit boolean mask, bit for bit
        assert np.isnan(a[:, empty_rows]).all() and np.isfinite(a[:, ~empty_rows]).all()


def test_boolean_and_additive_masks():
    rng = np.random.default_rng(16)
    B, Lq, Lk = 3, 9, 14
    q, k, v = rand_qkv(B, Lq, Lk, 8, 4, seed=17, amp=2.0)
    bmask = rng.random((B, Lq, Lk)) < 0.6
    bmask[:, :, 3] = True
    add = np.where(bmask, 0.0, -np.inf).astype(np.float32)
    for scheme, opts in (("flash", {}), ("baps", {"config": "e2e_hif8"})):
        a = lp.attention(q, k, v, scheme, attn_mask=bmask, block_q=4, block_k=4, **opts)
        b = lp.attention(q, k, v, scheme, attn_mask=add, block_q=4, block_k=4, **opts)
        assert same_bits(a, b)
    # finite additive bias (ALiBi-like) broadcast over the batch, plus -inf entries
    bias = (rng.standard_normal((Lq, Lk)) * 2).astype(np.float32)
    bias[rng.random((Lq, Lk)) < 0.3] = -np.inf
    bias[:, 0] = 1.0
    ref = lp.attention(*(x.astype(np.float64) for x in (q, k, v)), "reference", attn_mask=bias)
    np.testing.assert_allclose(ref, AR.oracle_attention(q, k, v, attn_mask=bias[None]),
                               rtol=1e-12)
    peer = torch.nn.functional.scaled_dot_product_attention(
        *(torch.from_numpy(x.astype(np.float64)) for x in (q, k, v)),
        attn_mask=torch.from_numpy(bias.astype(np.float64))).numpy()
    np.testing.assert_allclose(ref, peer, rtol=1e-10, atol=1e-12)
    f = lp.attention(q, k, v, "flash", attn_mask=bias, block_q=4, block_k=4)
    assert AR.relative_error(f, ref) < FLASH_TOL
    tw = AR.twin_attention(q, k, v, scheme="flash", attn_mask=bias, block_q=4, block_k=4)
    assert same_bits(f, tw.out)
    # masks given as torch float tensors and as bfloat16 arrays
    ft = lp.attention(q, k, v, "flash", attn_mask=torch.from_numpy(bias), block_q=4, block_k=4)
    assert same_bits(ft, f)
    bias_bf = bias.astype(BF16)
    fb = lp.attention(q, k, v, "flash", attn_mask=bias_bf, block_q=4, block_k=4)
    assert same_bits(fb, lp.attention(q, k, v, "flash", attn_mask=bias_bf.astype(np.float32),
                                      block_q=4, block_k=4))


def test_torch_boolean_mask():
    q, k, v = rand_qkv(1, 4, 6, 4, 3, seed=18)
    m = np.tril(np.ones((4, 6), dtype=bool), 2)
    a = lp.attention(q, k, v, "flash", attn_mask=torch.from_numpy(m))
    assert same_bits(a, lp.attention(q, k, v, "flash", attn_mask=m))


FULLY_MASKED_SCHEMES = [("reference", {}), ("flash", {})] + [
    ("baps", {"config": c}) for c in AR.ALL_CONFIGS
]


@pytest.mark.parametrize("scheme,opts", FULLY_MASKED_SCHEMES)
def test_fully_masked_row_gives_nan(scheme, opts):
    q, k, v = rand_qkv(2, 7, 9, 4, 3, seed=19)
    m = np.ones((2, 7, 9), dtype=bool)
    m[0, 2] = False
    m[1, 6] = False
    m[1, 0, 4:] = False  # a partly masked row stays finite
    if scheme != "reference":
        opts = dict(opts, block_q=4, block_k=4)
    out = lp.attention(q, k, v, scheme, attn_mask=m, **opts)
    nan = np.isnan(out).all(axis=-1)
    exp = np.zeros((2, 7), dtype=bool)
    exp[0, 2] = exp[1, 6] = True
    assert np.array_equal(nan, exp)
    assert np.isfinite(out[~exp]).all()


# ------------------------------------------------------------------------------------------
# bad inputs


def _qkv():
    return rand_qkv(1, 4, 5, 4, 3, seed=20)


BAD_CALLS = [
    (lambda q, k, v: lp.attention(q.astype(np.int32), k, v, "flash"), TypeError,
     r"q has dtype int32; allowed: float32, float16, bfloat16"),
    (lambda q, k, v: lp.attention(q, k.astype(np.complex64), v, "flash"), TypeError,
     r"k has dtype complex64"),
    (lambda q, k, v: lp.attention(q, k, "v", "flash"), TypeError, r"numpy array"),
    (lambda q, k, v: lp.attention(q[0, 0], k, v, "flash"), ValueError, r"\(\.\.\., L, d\)"),
    (lambda q, k, v: lp.attention(q, k[..., :3], v, "flash"), ValueError, r"same last dim d"),
    (lambda q, k, v: lp.attention(q, k, v[:, :4], "flash"), ValueError,
     r"same sequence length Lk"),
    (lambda q, k, v: lp.attention(np.repeat(q, 2, 0), np.repeat(k, 3, 0), v, "flash"),
     ValueError, r"leading \(batch, head\) dims .* do not broadcast"),
    (lambda q, k, v: lp.attention(q, k, v, "flash", tau=1), ValueError,
     r"unknown option\(s\) tau for scheme 'flash'; allowed: block_k, block_q"),
    (lambda q, k, v: lp.attention(q, k, v, "reference", block_q=4), ValueError,
     r"unknown option\(s\) block_q for scheme 'reference'; allowed: \(none\)"),
    (lambda q, k, v: lp.attention(q, k, v, "flash", block_q=0), ValueError,
     r"block_q must be a positive int, got 0"),
    (lambda q, k, v: lp.attention(q, k, v, "flash", block_k=-3), ValueError,
     r"block_k must be a positive int"),
    (lambda q, k, v: lp.attention(q, k, v, "flash", block_k=2.0), ValueError,
     r"block_k must be a positive int"),
    (lambda q, k, v: lp.attention(q, k, v, "flash", block_q=True), ValueError,
     r"block_q must be a positive int"),
    (lambda q, k, v: lp.attention(q, k, v, "baps", block_k=0), ValueError,
     r"block_k must be a positive int"),
    (lambda q, k, v: lp.attention(q, k, v, "flash", scale=float("nan")), ValueError,
     r"scale must be finite"),
    (lambda q, k, v: lp.attention(q, k, v, "flash", scale="1"), TypeError,
     r"scale must be a real number"),
    (lambda q, k, v: lp.attention(q, k, v, "flash", causal=1), TypeError,
     r"causal must be a bool"),
    (lambda q, k, v: lp.attention(q, k, v, "flash", return_stats="yes"), TypeError,
     r"return_stats must be a bool"),
    (lambda q, k, v: lp.attention(q, k, v, "flash",
                                  attn_mask=np.full((4, 5), np.nan, np.float32)),
     ValueError, r"attn_mask contains NaN"),
    (lambda q, k, v: lp.attention(q, k, v, "flash",
                                  attn_mask=np.where(np.eye(4, 5) > 0, np.inf, 0.0)),
     ValueError, r"attn_mask contains \+inf"),
    (lambda q, k, v: lp.attention(q, k, v, "flash", attn_mask=np.ones((4, 5), np.int64)),
     TypeError, r"attn_mask has dtype int64; allowed: bool"),
    (lambda q, k, v: lp.attention(q, k, v, "flash", attn_mask=np.ones((5, 4), bool)),
     ValueError, r"attn_mask of shape \(5, 4\) does not broadcast to \(1, 4, 5\)"),
    (lambda q, k, v: lp.attention(q[:, :, :0], k[:, :, :0], v, "flash"), ValueError,
     r"head dimension d is 0"),
]


@pytest.mark.parametrize("call,exc,msg", BAD_CALLS, ids=[str(i) for i in range(len(BAD_CALLS))])
def test_bad_inputs_raise_clear_errors(call, exc, msg):
    with pytest.raises(exc, match=msg):
        call(*_qkv())


@pytest.mark.parametrize("scheme", ["reference", "flash", "baps"])
def test_empty_sequences_and_head_dim(scheme):
    q, k, v = rand_qkv(2, 4, 5, 4, 3, seed=21)
    out = lp.attention(q, k[:, :0], v[:, :0], scheme)  # no key: every row NaN
    assert out.shape == (2, 4, 3) and np.isnan(out).all()
    out = lp.attention(q[:, :0], k, v, scheme)  # no query: empty result
    assert out.shape == (2, 0, 3)
    # d = 0 with an explicit scale: every score is 0, attention is the mean of the values
    out = lp.attention(q[..., :0], k[..., :0], v, scheme, scale=1.0)
    np.testing.assert_allclose(out, np.broadcast_to(v.mean(axis=1, keepdims=True), out.shape),
                               rtol=1e-6, atol=5e-3 if scheme == "baps" else 1e-7)
