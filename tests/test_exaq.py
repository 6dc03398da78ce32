"""EXAQ (specs/attention.md 3; lowprec.kernels.exaq): the softmax against the slow twin
``tests/naive/exaq.py``, the attention scheme against float64 attention, masks, errors and
statistics."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from conftest import normal_qkv, rel_err, structured_qkv
from naive import exaq as ref

import lowprec as lp
from lowprec.kernels import exaq as ex
from lowprec.stats import IntAttentionStats


@pytest.mark.parametrize("bits", [2, 3, 4])
def test_exaq_softmax_matches_reference(bits):
    rng = np.random.default_rng(44 + bits)
    x = (rng.standard_normal((16, 50)) * 2).astype(np.float32)
    got = ex.exaq_softmax(x, bits=bits)
    np.testing.assert_allclose(got, ref.exaq_probs(x, bits), rtol=2e-6, atol=1e-9)
    # at most 2**bits distinct probabilities per row
    assert all(len(np.unique(r)) <= 2**bits for r in got)
    np.testing.assert_array_equal(lp.softmax(x, "exaq", bits=bits), got)


def _sigma_oracle(x):
    """sigma from the exact sums of the max-centred float32 scores (Python fractions), each
    sum rounded once to float64, then the scheme's float64 formula."""
    xc = (x.astype(np.float64) - x.max(axis=1, keepdims=True)).astype(np.float32)
    vals = [Fraction(float(v)) for v in xc.astype(np.float64).ravel()]
    n = float(len(vals))
    s1, s2 = float(sum(vals)), float(sum(v * v for v in vals))
    mean = s1 / n
    var = s2 / n - mean * mean
    return math.sqrt(var) if var > 0 else 0.0


def test_exaq_sigma_exact_sums_any_order():
    """sigma's sums are the exactly rounded ones (a Python-fractions oracle) over scores of
    very different sizes (rows scaled from 1e-30 to 1e30, float32 subnormal differences), and
    the same bits for any order of the rows and keys (what lets a GPU compute them in
    parallel: lowprec.kernels.exaq_device)."""
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((40, 33)) * np.exp(rng.uniform(-69, 69, (40, 1)))).astype(np.float32)
    x[5] = np.float32(1e-44) * np.arange(33, dtype=np.float32)  # subnormal scores
    sigma = ex.exaq_softmax(x, return_stats=True)[1].exaq_clip[0][0]
    assert sigma == _sigma_oracle(x)
    for seed in range(3):
        r = np.random.default_rng(seed)
        p = np.ascontiguousarray(x[r.permutation(40)][:, r.permutation(33)])
        assert ex.exaq_softmax(p, return_stats=True)[1].exaq_clip[0][0] == sigma
    # a difference beyond float32's range: xc = -inf, sigma NaN, the fallback clip
    y = np.array([[3e38, -3e38, 0.0]], dtype=np.float32)
    sg, cval, _ = ex.exaq_softmax(y, return_stats=True)[1].exaq_clip[0]
    assert math.isnan(sg) and cval == ex.EXAQ_C_FALLBACK


def test_exaq_error_falls_with_bits():
    rng = np.random.default_rng(45)
    q, k, v = structured_qkv(rng, 2, 128, 64)
    want = lp.attention(q, k, v, "reference").astype(np.float64)
    errs = []
    for b in (2, 3, 4):
        out, st = lp.attention(q, k, v, "exaq", bits=b, return_stats=True)
        errs.append(rel_err(out, want))
        sigma, C, lo = st.exaq_clip[0]
        assert C == pytest.approx(ex.EXAQ_AB[b][0] * sigma + ex.EXAQ_AB[b][1]) and lo >= C
        assert isinstance(st, IntAttentionStats)
    assert errs[0] > errs[1] > errs[2]


def test_error_bound_vs_float64():
    # measured on these seeds (relative L2 error vs float64, random causal / structured):
    # exaq (3 bits) 0.109 / 0.130; the bounds leave about 40 % margin
    rng = np.random.default_rng(21)
    q, k, v = normal_qkv(rng, 4, 128, 128, 64)
    want = lp.attention(q, k, v, "reference", causal=True).astype(np.float64)
    assert rel_err(lp.attention(q, k, v, "exaq", causal=True), want) < 0.15
    qs, ks, vs = structured_qkv(rng, 4, 128, 64)
    want = lp.attention(qs, ks, vs, "reference").astype(np.float64)
    assert rel_err(lp.attention(qs, ks, vs, "exaq"), want) < 0.18


def test_masks():
    rng = np.random.default_rng(46)
    q, k, v = normal_qkv(rng, 2, 6, 4, 8)
    out = lp.attention(q, k, v, "exaq", causal=True)  # Lq > Lk: first two rows see no key
    assert np.isnan(out[:, :2]).all() and np.isfinite(out[:, 2:]).all()
    m = np.ones((2, 6, 4), dtype=bool)
    m[1, 3] = False
    out = lp.attention(q, k, v, "exaq", attn_mask=m)
    assert np.isnan(out[1, 3]).all() and np.isfinite(out[0]).all()
    assert np.isfinite(np.delete(out[1], 3, axis=0)).all()


def test_errors_and_registry():
    q, k, v = normal_qkv(np.random.default_rng(0), 1, 4, 4, 8)
    with pytest.raises(ValueError, match="exaq bits"):
        lp.attention(q, k, v, "exaq", bits=5)
    assert "exaq" in lp.schemes() and "exaq" in lp.schemes("softmax")


def test_old_names_still_reachable():
    from lowprec.kernels import intattention as ia

    assert ia.exaq_softmax is ex.exaq_softmax and ia.EXAQ_AB is ex.EXAQ_AB
