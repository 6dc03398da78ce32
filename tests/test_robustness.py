"""Robustness of every attention scheme (issue 12): a property sweep over random shapes, masks,
amplitudes and block sizes; a sequence alone equals the same sequence padded in a batch; one
regression test per class of the hardening issue's broken promises.

The property sweep asserts, for every scheme of ``lp.schemes()`` and every case: the call raises
nothing but ``ValueError``/``TypeError`` (with a message), and its output is within the scheme's
documented ``Scheme.error_bound`` of ``reference`` (``lp.kernels.attention_error``) unless its
statistics report a hazard.  ``pytest -m slow`` runs it on 2,000 cases instead of 120.
"""

from __future__ import annotations

import numpy as np
import pytest

import lowprec as lp
from lowprec.kernels import attention_error, get_scheme
from lowprec.kernels.problem import MASK_FLOOR

SCHEMES = [s for s in lp.schemes() if s != "reference"]
INTEGER = ["intattention", "quant_only", "qflash", "intflash", "hccs", "ivit", "ibert", "exaq",
           "index_softmax_only"]
BLOCK_OPTS = {"flash": ("block_q", "block_k"), "baps": ("block_q", "block_k"),
              "qflash": ("block_k",), "intflash": ("block_q", "block_k")}
BLOCKS = (1, 3, 16, 2**31, 2**63, 2**64)
FMIN = np.finfo(np.float32).min


def make_case(rng):
    """Random (q, k, v, options, log10 amplitude): 0-69 tokens, head dims 4-128, masks of every
    kind (finfo.min padding, boolean with an all-masked row, causal, additive -inf), amplitudes
    1e-30 .. 1e20 (half the cases in 10**[-1.5, 1.5], where the schemes are meant to work)."""
    B, H = int(rng.integers(1, 3)), int(rng.integers(1, 3))
    Lq, Lk = int(rng.integers(0, 70)), int(rng.integers(0, 70))
    d = int(rng.choice([4, 8, 16, 64, 128]))
    la = rng.uniform(-1.5, 1.5) if rng.random() < 0.5 else rng.uniform(-30, 20)
    q = (rng.standard_normal((B, H, Lq, d)) * 10.0**la).astype(np.float32)
    k = (rng.standard_normal((B, H, Lk, d)) * 10.0**la).astype(np.float32)
    v = (rng.standard_normal((B, H, Lk, 3)) * 10.0 ** rng.uniform(-3, 3)).astype(np.float32)
    kw = {}
    kind = int(rng.integers(0, 5))
    if kind == 1 and Lk:  # transformers' padding: finfo.min on the last keys (maybe all)
        m = np.zeros((B, 1, Lq, Lk), np.float32)
        m[..., Lk - int(rng.integers(0, Lk + 1)):] = FMIN
        kw["attn_mask"] = m
    elif kind == 2:  # boolean, one row sees nothing
        m = rng.random((B, 1, Lq, Lk)) < 0.7
        if Lq:
            m[..., int(rng.integers(0, Lq)), :] = False
        kw["attn_mask"] = m
    elif kind == 3:
        kw["causal"] = True
    elif kind == 4 and Lk:
        kw["attn_mask"] = np.where(rng.random((1, 1, Lq, Lk)) < 0.8, 0.0,
                                   -np.inf).astype(np.float32)
    return q, k, v, kw, la


def reference(q, k, v, kw):
    """float64 attention; a row whose every mask value is at or below MASK_FLOOR is shifted by
    its largest one first (the softmax is shift invariant; the integer schemes do the same,
    where float64 would absorb the scores into finfo.min and average v)."""
    kr = dict(kw)
    m = kw.get("attn_mask")
    if m is not None and m.dtype != bool and m.size:
        top = m.max(axis=-1, keepdims=True)
        sunk = (top <= MASK_FLOOR) & np.isfinite(top)
        with np.errstate(invalid="ignore"):  # -inf - -inf in rows that are not shifted
            kr["attn_mask"] = np.where(sunk, (m.astype(np.float64) - top).astype(np.float32),
                                       m)
    return lp.attention(q, k, v, "reference", **kr)


def sweep(n_cases, seed):
    rng = np.random.default_rng(seed)
    results = {s: [] for s in SCHEMES}  # (error, flagged, log10 amplitude)
    failures = []
    for _ in range(n_cases):
        q, k, v, kw, la = make_case(rng)
        ref = reference(q, k, v, kw)
        for s in SCHEMES:
            opts = {}
            if s in BLOCK_OPTS and rng.random() < 0.5:
                opts[str(rng.choice(BLOCK_OPTS[s]))] = int(rng.choice(BLOCKS))
            try:
                out, st = lp.attention(q, k, v, s, return_stats=True, **kw, **opts)
            except (ValueError, TypeError) as e:
                assert str(e), (s, q.shape, k.shape, kw.keys(), opts)
                continue
            assert out.shape == q.shape[:-1] + (3,)
            if out.size == 0:
                continue
            err = attention_error(out, ref, v)
            flagged = st is not None and any(st.hazards.values())
            results[s].append((err, flagged, la))
            if not flagged and not err <= get_scheme(s).error_bound:
                failures.append((s, round(err, 4), round(la, 2), q.shape, k.shape,
                                 sorted(kw), opts))
    return results, failures


def check_sweep(n_cases, seed):
    results, failures = sweep(n_cases, seed)
    assert not failures, failures[:10]
    for s, rs in results.items():
        # the sweep is not vacuous: cases at natural amplitudes run, many are not flagged
        natural = [f for e, f, la in rs if -1.5 <= la <= 1.5]
        assert len(natural) >= n_cases // 4, (s, len(natural))
        assert sum(not f for f in natural) >= len(natural) // 3, s  # ivit: ~45 %


def test_property_sweep_every_scheme():
    check_sweep(120, seed=12)


@pytest.mark.slow
def test_property_sweep_every_scheme_long():
    check_sweep(2000, seed=1212)


def test_attention_error_measure():
    rng = np.random.default_rng(0)
    v = rng.standard_normal((2, 5, 4))
    ref = np.stack([v[0, :3], v[1, :3]])
    assert attention_error(ref, ref, v) == 0.0
    swapped = np.stack([v[0, 1:4], v[1, 1:4]])  # every row another key's value row: ~1.4
    assert 0.8 < attention_error(swapped, ref, v) < 2.0
    bad = ref.copy()
    bad[0, 1, 2] = np.nan
    assert attention_error(bad, ref, v) == np.inf
    ref_nan = ref.copy()
    ref_nan[0, 1] = np.nan  # a row that sees no key is left out
    assert attention_error(bad, ref_nan, v) == 0.0
    with pytest.raises(ValueError, match="shape"):
        attention_error(ref[:1], ref, v)


# --------------------------------------------------------------------------------------------
# A sequence alone and padded in a batch (item 16): the default scale_scope="visible".

def _padded(rng, n, L, B, causal, mask_kind):
    d, dv, H = 16, 8, 2
    seqs = [(rng.standard_normal((H, n, d)).astype(np.float32) * 1.5,
             rng.standard_normal((H, n, d)).astype(np.float32) * 1.5,
             rng.standard_normal((H, n, dv)).astype(np.float32)) for _ in range(B)]
    q = (rng.standard_normal((B, H, L, d)) * 40).astype(np.float32)  # garbage padding
    k = (rng.standard_normal((B, H, L, d)) * 40).astype(np.float32)
    v = (rng.standard_normal((B, H, L, dv)) * 40).astype(np.float32)
    lengths = [n, n - 3, n - 7][:B]
    for b, (qs, ks, vs) in enumerate(seqs):
        m = lengths[b]
        q[b, :, :m], k[b, :, :m], v[b, :, :m] = qs[:, :m], ks[:, :m], vs[:, :m]
    pad = np.arange(L)[None, :] >= np.array(lengths)[:, None]  # (B, L) True at padding
    if mask_kind == "bool":
        mask = ~pad[:, None, None, :]
    else:
        mask = np.where(pad, FMIN, 0.0).astype(np.float32)[:, None, None, :]
    return seqs, lengths, q, k, v, mask, causal


@pytest.mark.parametrize("scheme", INTEGER + ["flash", "baps"])
@pytest.mark.parametrize("causal,mask_kind", [(False, "bool"), (True, "finfo_min")])
def test_sequence_alone_equals_padded(scheme, causal, mask_kind):
    rng = np.random.default_rng(16)
    seqs, lengths, q, k, v, mask, causal = _padded(rng, 20, 33, 3, causal, mask_kind)
    out = lp.attention(q, k, v, scheme, attn_mask=mask, causal=causal)
    for b, (qs, ks, vs) in enumerate(seqs):
        m = lengths[b]
        alone = lp.attention(qs[None, :, :m], ks[None, :, :m], vs[None, :, :m], scheme,
                             causal=causal)[0]  # (1, H, m, d): one sequence of H heads
        got = out[b, :, :m]
        np.testing.assert_array_equal(got, alone, err_msg=f"{scheme} sequence {b}")


def test_tensor_scope_sees_the_padding():
    """The papers' whole-tensor scales (scale_scope="tensor") do depend on padding content."""
    rng = np.random.default_rng(16)
    seqs, lengths, q, k, v, mask, _ = _padded(rng, 20, 33, 2, False, "bool")
    for s in ("intattention", "qflash", "ivit", "hccs"):
        out = lp.attention(q, k, v, s, attn_mask=mask, scale_scope="tensor")
        qs, ks, vs = seqs[0]
        alone = lp.attention(qs[None], ks[None], vs[None], s, scale_scope="tensor")[0]
        assert not np.array_equal(out[0, :, :20], alone), s
        with pytest.raises(ValueError, match="scale_scope"):
            lp.attention(qs, ks, vs, s, scale_scope="rows")


# --------------------------------------------------------------------------------------------
# Regression tests, one per class of broken promise.

QKV = tuple(np.random.default_rng(3).standard_normal((3, 1, 2, 16, 8)).astype(np.float32))


@pytest.mark.parametrize("scheme", ["ivit", "ibert", "hccs", "intattention", "qflash"])
@pytest.mark.parametrize("scale", [0.0, -0.5])
def test_non_positive_scale_raises(scheme, scale):  # item 2
    q, k, v = QKV
    with pytest.raises(ValueError, match="scale"):
        lp.attention(q, k, v, scheme, scale=scale)


@pytest.mark.parametrize("scheme", INTEGER)
def test_tiny_and_huge_inputs_raise_or_are_flagged(scheme):  # items 2, 3
    q, k, v = QKV
    for amp in (1e-30, 1e19):
        try:
            out, st = lp.attention(q * amp, k * amp, v, scheme, return_stats=True)
        except ValueError as e:
            assert "scale" in str(e) or "c_int" in str(e) or "unit" in str(e), str(e)
            continue
        ref = lp.attention(q * amp, k * amp, v, "reference")
        err = attention_error(out, ref, v)
        assert err <= get_scheme(scheme).error_bound or any(st.hazards.values()), (amp, err)


@pytest.mark.parametrize("scheme", INTEGER)
def test_non_finite_inputs(scheme):  # item 7: a clear error, or NaN rows as reference gives
    q, k, v = QKV
    for bad in (np.inf, -np.inf, np.nan):
        qb = q.copy()
        qb[0, 1, 3, 2] = bad
        ref = lp.attention(qb, k, v, "reference")
        try:
            out = lp.attention(qb, k, v, scheme)
        except ValueError as e:
            assert "NaN or Inf" in str(e) and "quantize()" not in str(e)
            continue
        np.testing.assert_array_equal(np.isnan(out), np.isnan(ref))


@pytest.mark.parametrize("scheme,opt", [("qflash", "block_k"), ("intflash", "block_q"),
                                        ("intflash", "block_k"), ("flash", "block_k"),
                                        ("baps", "block_q")])
def test_huge_block_sizes_are_one_tile(scheme, opt):  # item 5
    q, k, v = QKV
    want = lp.attention(q, k, v, scheme, **{opt: 16})
    for b in (2**31, 2**63, 2**64, 10**30):
        np.testing.assert_array_equal(lp.attention(q, k, v, scheme, **{opt: b}), want)
    for b in (0, -1, 1e8, True, "16"):
        with pytest.raises((ValueError, TypeError), match=opt):
            lp.attention(q, k, v, scheme, **{opt: b})


@pytest.mark.parametrize("scheme", INTEGER)
def test_finfo_min_padding_is_minus_infinity(scheme):  # item 6
    q, k, v = QKV
    m_inf = np.zeros((16, 16), np.float32)
    m_inf[:, 11:] = -np.inf
    m_min = np.where(np.isinf(m_inf), FMIN, 0.0).astype(np.float32)
    a, st = lp.attention(q, k, v, scheme, attn_mask=m_min, return_stats=True)
    np.testing.assert_array_equal(a, lp.attention(q, k, v, scheme, attn_mask=m_inf))
    assert st.mask_floored == 16 * 5
    # a row whose every key carries finfo.min (left padding + causal) still sees its keys,
    # shifted by its largest mask value (exact for the softmax), never NaN
    m_all = m_min.copy()
    m_all[2] = FMIN
    out = lp.attention(q, k, v, scheme, attn_mask=m_all)
    assert np.isfinite(out).all()
    shifted = m_all.astype(np.float64)
    shifted[2] -= FMIN
    np.testing.assert_array_equal(out, lp.attention(q, k, v, scheme,
                                                    attn_mask=shifted.astype(np.float32)))


@pytest.mark.parametrize("surrogate", [s for s in lp.schemes("softmax")
                                       if get_scheme(s, "softmax").mask_floor is not None])
def test_softmax_finfo_min_scores(surrogate):  # item 6, lp.softmax
    x = np.random.default_rng(1).standard_normal((4, 9)).astype(np.float32) * 3
    xm = x.copy()
    xm[:, 6:] = FMIN
    xi = x.copy()
    xi[:, 6:] = -np.inf
    np.testing.assert_array_equal(lp.softmax(xm, surrogate), lp.softmax(xi, surrogate))
    row = np.full((1, 9), FMIN, np.float32)
    row[0, 3] = FMIN / 2  # every score below the floor: shifted by the row max
    p = lp.softmax(row, surrogate)
    assert np.isfinite(p).all() and np.argmax(p) == 3


@pytest.mark.parametrize("surrogate", lp.schemes("softmax"))
def test_softmax_return_stats(surrogate):  # item 15
    x = np.array([[0.0, 1e-4, 2e-4], [0.0, -1.0, 3.0]], np.float32)
    p, st = lp.softmax(x, surrogate, return_stats=True)
    assert p.shape == x.shape
    if surrogate == "hif8_exp2":
        assert st is None
    else:
        assert isinstance(st.hazards, dict) and "nonfinite_rows" in st.hazards
    with pytest.raises(TypeError, match="return_stats"):
        lp.softmax(x, surrogate, return_stats="yes")


def test_ivit_clamped_softmax_is_flagged():  # item 15: rows summing to 266 say so
    x = np.array([[0.0, 1e-4, 2e-4] * 3], np.float32)
    p, st = lp.softmax(x, "ivit", return_stats=True)
    if abs(float(p.sum()) - 1.0) > 0.1:
        assert any(st.hazards.values()), (p.sum(), st.hazards)


def test_small_option_errors():  # item 13
    q, k, v = QKV
    with pytest.raises(TypeError, match="scale"):
        lp.attention(q, k, v, "quant_only", scale=True)
    with pytest.raises(TypeError, match="exp2_fp16"):
        lp.softmax(q, "hif8_exp2", exp2_fp16="no")
    with pytest.raises(ValueError, match="out_shift"):
        lp.attention(q, k, v, "hccs", path="i8_div", out_shift=16)
    from lowprec.kernels.baps import restart_threshold

    with pytest.raises(ValueError):
        restart_threshold(-1)
    with pytest.raises((ValueError, TypeError), match="scale_scope"):
        lp.attention(q, k, v, "intattention", scale_scope=None)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_empty_axes(scheme):  # item 11
    rng = np.random.default_rng(0)
    for Lq, Lk, d, dv in ((0, 5, 4, 3), (5, 0, 4, 3), (5, 5, 4, 0), (0, 0, 4, 3)):
        q = rng.standard_normal((2, Lq, d)).astype(np.float32)
        k = rng.standard_normal((2, Lk, d)).astype(np.float32)
        v = rng.standard_normal((2, Lk, dv)).astype(np.float32)
        out = lp.attention(q, k, v, scheme)
        assert out.shape == (2, Lq, dv)
        if Lk == 0 and Lq and dv:
            assert np.isnan(out).all()
