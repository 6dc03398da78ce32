"""EXAQ (specs/attention.md 3; lowprec.kernels.exaq): the softmax against the slow twin
``tests/naive/exaq.py``, the attention scheme against float64 attention, masks, errors and
statistics."""

from __future__ import annotations

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
