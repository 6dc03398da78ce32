"""Issue 17 ("Formats II"): the new element formats against independent oracles.

* value tables: every code decodes as ml_dtypes (e2m1, e2m3, e3m2, e8m0, e4m3fnuz, e5m2fnuz,
  e4m3_ieee, e3m4, bfloat16, float16) and gfloat (P3109 binary8p1..p7) decode it;
* encoding (own convention, non-saturating) equals ml_dtypes on 2^20 random float32 patterns,
  on every float16 and bfloat16 pattern and on float64 samples; P3109 equals gfloat
  (round_ndarray + encode_ndarray) in every deterministic mode, saturating or not;
* every rounding mode (stochastic included) at every midpoint, quarter point and grid point of
  each format, against the exact Fraction reference of ``naive/formats2.py``;
* descriptors: the derived FormatInfo of e4m3 / e5m2 equals the literals of formats.md 2.

Compiles are budgeted: the default run compiles every format's own mode on the float32 path and
every mode for a rotation of formats; the full matrix is ``-m slow``.  The 2^32 sweeps are in
``scripts/exhaustive_formats2.py`` (opt-in, see tests/test_exhaustive.py).
"""

from __future__ import annotations

import math
import warnings
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest
from naive import formats2 as R2
from naive.formats import sr_random

import lowprec as lp

ML = {**R2.ML_TYPES, "e8m0": ml_dtypes.float8_e8m0fnu, "bfloat16": ml_dtypes.bfloat16,
      "float16": np.float16}
MODES = ("nearest_even", "nearest_away", "toward_zero", "up", "down")
NEW = tuple(R2.FORMATS) + ("e8m0",)
SEED = 0x5EED_F0F0
# formats whose full (mode x saturate) matrix runs by default: no NaN/Inf (FP4), no mantissa
# bits (P3109 p1, where ties-to-even reads the exponent's parity) and e8m0 (its own codec);
# every other format runs its own mode and one more (mode, saturate) pair, rotating
FULL = ("e2m1", "binary8p1", "e8m0")


def _astype(x, t):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return x.astype(t)


def _nan_tab(fmt):
    return np.isnan(lp.get_format(fmt).values())


def assert_codes(fmt, x, got, want, what=""):
    """Codes equal as integers; an expected NaN code accepts any NaN code."""
    got = np.asarray(got).astype(np.int64).ravel()
    want = np.asarray(want).astype(np.int64).ravel()
    nan = _nan_tab(fmt)
    ok = (got == want) | (nan[got] & nan[want])
    if not ok.all():
        bad = np.flatnonzero(~ok)[:8]
        raise AssertionError(f"{fmt} {what}: {int((~ok).sum())} of {ok.size} differ: "
                             f"x={np.asarray(x).ravel()[bad]!r} got={got[bad]} want={want[bad]}")


# ------------------------------------------------------------------------------------------
# value tables and descriptors


@pytest.mark.parametrize("fmt", list(ML))
def test_values_equal_ml_dtypes(fmt):
    t = ML[fmt]
    f = lp.get_format(fmt)
    n = 1 << f.info.bits
    codes = np.arange(n, dtype=np.uint16 if n > 256 else np.uint8)
    want = codes.view(t).astype(np.float32) if n > 256 else \
        codes.view(np.uint8).view(t).astype(np.float32)
    got = f.values()
    assert got.shape == (n,)
    same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
    assert same.all(), np.flatnonzero(~same)[:8]
    assert f.info.max == float(ml_dtypes.finfo(t).max)
    assert f.info.min_normal == float(ml_dtypes.finfo(t).smallest_normal)
    assert np.array_equal(lp.decode(codes, fmt).view(np.uint32), got.view(np.uint32))


@pytest.mark.parametrize("p", range(1, 8))
def test_p3109_values_equal_gfloat(p):
    import gfloat
    from gfloat.formats import format_info_p3109

    fi = format_info_p3109(8, p)
    want = np.array([gfloat.decode_float(fi, c).fval for c in range(256)], np.float64)
    got = lp.get_format(f"binary8p{p}").values().astype(np.float64)
    assert np.array_equal(got, want, equal_nan=True)
    info = lp.get_format(f"binary8p{p}").info
    assert (info.max, info.min_subnormal) == (fi.max, fi.smallest_subnormal)
    assert info.nan_codes == (0x80,) and info.inf_codes == (0x7F, 0xFF)


def test_e4m3_e5m2_descriptors_give_the_spec_facts():
    # formats.md 2.1, typed here independently of the descriptors
    e4 = lp.get_format("e4m3").info
    assert (e4.max, e4.min_normal, e4.min_subnormal, e4.max_code) == (448.0, 2**-6, 2**-9, 0x7E)
    assert (e4.nan_codes, e4.inf_codes, e4.nan_code, e4.has_neg_zero) == ((0x7F, 0xFF), (), 0x7F,
                                                                            True)
    e5 = lp.get_format("e5m2").info
    assert (e5.max, e5.min_normal, e5.min_subnormal, e5.max_code) == (57344.0, 2**-14, 2**-16,
                                                                        0x7B)
    assert e5.nan_codes == (0x7D, 0x7E, 0x7F, 0xFD, 0xFE, 0xFF) and e5.inf_codes == (0x7C, 0xFC)
    assert lp.get_format("e4m3").spec is not None and lp.get_format("hif8").spec is not None


@pytest.mark.parametrize(("alias", "name"), [
    ("float4_e2m1fn", "e2m1"), ("float6_e2m3fn", "e2m3"), ("float8_e8m0fnu", "e8m0"),
    ("float8_e4m3fnuz", "e4m3fnuz"), ("float8_e4m3", "e4m3_ieee"), ("p3109_k8p3se", "binary8p3"),
    ("bf16", "bfloat16"), ("float8_e4m3fn", "e4m3"),
])
def test_aliases(alias, name):
    assert lp.get_format(alias).name == name


# ------------------------------------------------------------------------------------------
# encoding against the peers


def _random_f32(n, seed):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32).view(np.float32)


@pytest.mark.parametrize("fmt", list(ML))
def test_encode_equals_ml_dtypes(fmt):
    t = ML[fmt]
    f = lp.get_format(fmt)
    wide = f.info.bits > 8
    u16 = np.arange(1 << 16, dtype=np.uint16)
    x = np.concatenate([_random_f32(1 << 20, 7), u16.view(np.float16).astype(np.float32),
                        u16.view(ml_dtypes.bfloat16).astype(np.float32)])
    if fmt in ("e2m1", "e2m3", "e3m2"):
        x = x[~np.isnan(x)]  # no NaN code: lowprec writes -0, ml_dtypes -0 or +0 by sign
    if fmt == "e8m0":
        # ml_dtypes rounds float32 subnormals in (2**-127, 1.5 * 2**-127] up to 2**-126
        x = x[~((x > 0) & (x <= np.float32(1.5 * 2.0**-127)))]
    want = _astype(x, t).view(np.uint16 if wide else np.uint8)
    assert_codes(fmt, x, lp.encode(x, fmt), want, "float32")
    # float16 / bfloat16 input arrays give the same codes as their float32 widening
    h = u16.view(np.float16)
    assert_codes(fmt, h, lp.encode(h, fmt), lp.encode(h.astype(np.float32), fmt), "float16")


@pytest.mark.parametrize("fmt", ["e2m1", "e3m2", "e4m3fnuz", "e3m4", "bfloat16"])
def test_float64_input_equals_ml_dtypes(fmt):
    # float64 inputs near the format's grid: ml_dtypes converts float64 directly
    rng = np.random.default_rng(3)
    v = lp.get_format(fmt).values()
    v = v[np.isfinite(v)].astype(np.float64)
    x = np.concatenate([v * (1 + rng.uniform(-2**-20, 2**-20, v.size)),
                        rng.standard_normal(1 << 16) * 10.0 ** rng.integers(-5, 5, 1 << 16)])
    wide = lp.get_format(fmt).info.bits > 8
    want = _astype(x, ML[fmt]).view(np.uint16 if wide else np.uint8)
    assert_codes(fmt, x, lp.encode(x, fmt), want, "float64")


@pytest.mark.parametrize(("p", "mode"), [
    pytest.param(p, mode, marks=() if (p == 3 or mode == "nearest_even") else (pytest.mark.slow,))
    for p in range(1, 8) for mode in MODES])
def test_p3109_equals_gfloat(p, mode):
    import gfloat
    from gfloat.formats import format_info_p3109

    rm = {"nearest_even": gfloat.RoundMode.TiesToEven, "nearest_away": gfloat.RoundMode.TiesToAway,
          "toward_zero": gfloat.RoundMode.TowardZero, "up": gfloat.RoundMode.TowardPositive,
          "down": gfloat.RoundMode.TowardNegative}[mode]
    fi = format_info_p3109(8, p)
    rng = np.random.default_rng(p)
    x = np.concatenate([_random_f32(1 << 14, p).astype(np.float64),
                        rng.standard_normal(1 << 14) * 2.0 ** rng.integers(-70, 70, 1 << 14)])
    for sat in (False, True):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            want = gfloat.encode_ndarray(fi, gfloat.round_ndarray(fi, x, rm, sat))
        assert_codes(f"binary8p{p}", x, lp.encode(x, f"binary8p{p}", mode, sat), want,
                     f"{mode} sat={sat}")


# ------------------------------------------------------------------------------------------
# every rounding mode against the exact reference


def _points(fmt):
    """Grid points, midpoints, quarter points of each grid interval (both signs) as float32
    where exact, plus overflow neighbourhoods and specials."""
    if fmt == "e8m0":
        grid = [Fraction(2) ** e for e in range(-127, 129)]
        pts = list(grid)
    else:
        grid = list(R2.ref(fmt).grid)
        pts = list(grid)
    for lo, hi in zip(grid, grid[1:], strict=False):
        pts += [lo + (hi - lo) * Fraction(k, 4) for k in (1, 2, 3)]
    xs = [float(p) for p in pts if float(p) == p and abs(float(p)) < 3.4e38]
    big = float(grid[-1])
    xs += [big * 1.5, big * 4, 1e38, 1e-40, 2.0**-149, math.inf, math.nan, 0.0]
    x = np.array(xs, np.float32)
    x = np.concatenate([x, -x, np.nextafter(x, np.float32(np.inf)),
                        np.nextafter(x, np.float32(-np.inf))])
    return x[np.isfinite(x) | np.isinf(x) | np.isnan(x)]


def _ref_codes(fmt, x, mode, sat, sr_bits=32):
    out = []
    for i, v in enumerate(x.tolist()):
        r = sr_random(SEED, i, sr_bits) if mode == "stochastic" else 0
        if fmt == "e8m0":
            out.append(R2.round_e8m0(v, mode, sat, r, sr_bits))
        else:
            out.append(R2.round_ref(v, fmt, mode, sat, r, sr_bits))
    return np.array(out)


def _modes_params():
    out = []
    for fmt in NEW:
        for mode in (*MODES, "stochastic"):
            for sat in (False, True):
                own = mode == lp.get_format(fmt).info.default_rounding.name.lower() and not sat
                k = NEW.index(fmt)
                rot = (mode, sat) == ((*MODES, "stochastic")[k % 6], k % 2 == 1)
                marks = () if (own or rot or fmt in FULL) else (pytest.mark.slow,)
                out.append(pytest.param(fmt, mode, sat, marks=marks,
                                        id=f"{fmt}-{mode}-{'sat' if sat else 'nonsat'}"))
    return out


@pytest.mark.parametrize(("fmt", "mode", "sat"), _modes_params())
def test_modes_vs_fractions(fmt, mode, sat):
    x = _points(fmt)
    kw = dict(seed=SEED, sr_bits=13) if mode == "stochastic" else {}
    want = _ref_codes(fmt, x, mode, sat, 13)
    got = lp.encode(x, fmt, mode, sat, **kw)
    assert_codes(fmt, x, got, want, f"{mode} sat={sat}")
    if fmt in FULL and mode in ("nearest_even", "stochastic"):
        # fused quantize == decode(encode), and float64 input == float32 input
        q = lp.quantize(x, fmt, mode, sat, **kw)
        d = lp.decode(got, fmt)
        assert np.array_equal(q.view(np.uint32), d.view(np.uint32), equal_nan=False) or \
            np.array_equal(np.isnan(q), np.isnan(d))
        assert_codes(fmt, x, lp.encode(x.astype(np.float64), fmt, mode, sat, **kw), want,
                     "float64")


def test_no_nan_formats_write_negative_zero_for_nan():
    for fmt, code in (("e2m1", 0x8), ("e2m3", 0x20), ("e3m2", 0x20)):
        x = np.array([np.nan, -np.nan], np.float32)
        assert lp.encode(x, fmt).tolist() == [code, code]
        assert lp.encode(np.array([np.inf, 1e30], np.float32), fmt, saturate=False).tolist() == \
            [lp.get_format(fmt).info.max_code] * 2


def test_e8m0_specials_and_ties():
    x = np.array([0.0, -0.0, -1.0, np.nan, np.inf, 3.0, 1.5, 2.0**-140, 2.0**128 * 0.75],
                 np.float32)
    assert lp.encode(x, "e8m0").tolist() == [255, 255, 255, 255, 255, 129, 128, 0, 255]
    assert lp.encode(x, "e8m0", "nearest_even").tolist()[5:7] == [128, 128]  # ties to even
    assert lp.encode(x, "e8m0", saturate=True).tolist()[4] == 254


def test_bfloat16_stochastic_is_unbiased():
    # stochastic rounding to bfloat16 (training studies): the mean of many roundings of one
    # value approaches it, and every result is one of its two bfloat16 neighbours
    x = np.full(1 << 16, 1.0 + 2.0**-9, np.float32)  # a quarter of the way to the next bf16
    y = lp.quantize(x, "bfloat16", "stochastic", seed=1)
    assert set(np.unique(y).tolist()) == {1.0, 1.0 + 2.0**-7}
    assert abs(float(y.astype(np.float64).mean()) - (1.0 + 2.0**-9)) < 2.0**-12
    assert lp.encode(x, "bfloat16").dtype == np.uint16


# ------------------------------------------------------------------------------------------
# user formats


def test_user_format_equals_builtin():
    f = lp.float_format(4, 3, bias=7, inf="none", nan="top", name="t17_e4m3")
    assert f.info.max == 448.0 and f.name == "t17_e4m3"
    assert lp.float_format(4, 3, bias=7, inf="none", nan="top", name="t17_e4m3") is f
    x = np.concatenate([_random_f32(1 << 16, 11), _points("e4m3fnuz")])
    # (every mode and saturation on all 2^32 patterns: scripts/exhaustive_formats2.py --check user)
    for mode, sat in (("nearest_even", False), ("nearest_even", True), ("toward_zero", False),
                      ("up", False)):
        assert np.array_equal(lp.encode(x, "t17_e4m3", mode, sat), lp.encode(x, "e4m3", mode,
                                                                              sat))
    assert np.array_equal(lp.quantize(x, "t17_e4m3").view(np.uint32),
                          lp.quantize(x, "e4m3").view(np.uint32))
    g = lp.float_format(2, 1, bias=1, inf="none", nan="none", name="t17_fp4")
    assert np.array_equal(g.values(), lp.get_format("e2m1").values())
    assert "t17_e4m3" in lp.available_formats()


def test_user_format_odd_shapes_vs_fractions():
    # an IEEE-style e5m6 (13 bits, uint16 codes) checked against its own bit-field decode
    f = lp.float_format(5, 6, name="t17_e5m6")
    vals = f.values()
    assert vals.shape == (1 << 12,) and f.info.max == (2 - 2**-6) * 2.0**15
    rng = np.random.default_rng(5)
    x = (rng.standard_normal(4096) * 2.0 ** rng.integers(-20, 17, 4096)).astype(np.float32)
    c = lp.encode(x, "t17_e5m6")
    assert c.dtype == np.uint16
    fin = np.sort(np.unique(vals[np.isfinite(vals)].astype(np.float64)))
    xd = x.astype(np.float64)
    k = np.clip(np.searchsorted(fin, xd), 1, fin.size - 1)
    best = np.minimum(np.abs(fin[k] - xd), np.abs(fin[k - 1] - xd))
    ok = (np.abs(vals[c].astype(np.float64) - xd) == best) | (np.abs(xd) > f.info.max)
    assert ok.all()


@pytest.mark.parametrize(("kw", "msg"), [
    (dict(exp_bits=0, man_bits=3), "exp_bits"),
    (dict(exp_bits=4, man_bits=0), "mantissa bit"),
    (dict(exp_bits=4, man_bits=3, inf="top", nan="top"), "largest code"),
    (dict(exp_bits=8, man_bits=3, bias=300), "float32"),
    (dict(exp_bits=4, man_bits=3, inf="none", nan="neg_zero", negative_zero=True), "-0 code"),
    (dict(exp_bits=8, man_bits=8), "16"),
    (dict(exp_bits=4, man_bits=3, name="e4m3"), "taken"),
    (dict(exp_bits=4, man_bits=3, name="Bad Name"), "lower case"),
    (dict(exp_bits=4, man_bits=3, inf="sometimes"), "inf"),
    (dict(exp_bits=4, man_bits=3, signed=False), "exponent-only"),
    (dict(exp_bits=4.0, man_bits=3), "integer"),
])
def test_user_format_errors(kw, msg):
    with pytest.raises((ValueError, TypeError), match=msg):
        lp.float_format(**kw)


def test_user_format_in_emulate_hooks():
    from lowprec.torch.hooks import check_quant_format

    lp.float_format(3, 2, bias=3, inf="none", nan="none", name="t17_fp6")
    assert check_quant_format("t17_fp6", "activations") == "t17_fp6"
    assert check_quant_format("float6_e3m2fn", "weights") == "e3m2"
    with pytest.raises(ValueError, match="scaled"):
        check_quant_format("mxfp4", "weights")


def test_e8m0_fast_path_equals_generic_kernel():
    # the vectorized float32 E8M0 path against the generic (frexp) kernel: every float32
    # subnormal and the lowest normals, the overflow region, random patterns, every mode
    from lowprec.formats.minifloat import SPECS, run_kernel

    rng = np.random.default_rng(12)
    b = np.concatenate([np.arange(0, 1 << 24, 3, dtype=np.uint32),
                        np.arange(0x7E000000, 0x7F900000, 97, dtype=np.uint32),
                        rng.integers(0, 2**32, 1 << 18, dtype=np.uint64).astype(np.uint32)])
    for m in range(5):
        for sat in (False, True):
            for dt in (np.uint8, np.float32):
                fast, gen = np.empty(b.size, dt), np.empty(b.size, dt)
                run_kernel(SPECS["e8m0"], b, fast, m, sat)
                run_kernel(SPECS["e8m0"], b, gen, m, sat, generic=True)
                assert np.array_equal(fast.view(np.uint8 if dt == np.uint8 else np.uint32),
                                      gen.view(np.uint8 if dt == np.uint8 else np.uint32)), \
                    (m, sat, dt)


def test_cli_formats_lists_and_shows_new_and_user_formats(capsys):
    from lowprec.cli import main

    lp.float_format(3, 3, bias=2, inf="none", nan="neg_zero", name="t17_cli")
    assert main(["formats"]) == 0
    out = capsys.readouterr().out
    for name in ("e2m1", "binary8p3", "nvfp4", "int4", "t17_cli"):
        assert name in out
    for name in ("e2m1", "e3m2", "bfloat16", "mxfp4", "t17_cli"):
        assert main(["formats", name]) == 0
    assert "0x78" in capsys.readouterr().out  # the 7-bit user format's last row
