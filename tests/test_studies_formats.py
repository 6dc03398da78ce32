"""lowprec.studies.formats (notebook 01) and lowprec.studies.exp2 (notebook 02): the study
functions compute what their docstrings say, checked against facts from specs/formats.md and
bounds derived by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lowprec.studies import exp2
from lowprec.studies import formats as F


def _hif8_bits(e: int) -> float:
    """Mantissa width of HiF8 binade 2**e (specs/formats.md 1.1 table)."""
    a = abs(e)
    if -22 <= e <= -16:
        return 0.0  # DML: pure powers of two
    if a <= 3:
        return 3.0
    if a <= 7:
        return 2.0
    if e == 15:
        return 0.0  # 1.1 x 2^15 is the Inf code: 2^15 = 32768 (max) is the binade's only value
    if a <= 15:
        return 1.0
    return math.nan


def test_binade_bits_match_the_spec():
    exps = np.arange(-26, 18)
    got = F.binade_bits(F.value_set("hif8"), exps)
    want = np.array([_hif8_bits(int(e)) for e in exps])
    np.testing.assert_array_equal(got, want)
    # E4M3: subnormals m * 2^-9 (m = 1..7): binade 2^-9 holds 1, 2^-8 holds 2, 2^-7 holds 4;
    # 8 codes per normal binade, except 2^8 (256 .. 448: 7 codes, 0x7F is NaN)
    e4 = F.binade_bits(F.value_set("e4m3"), [-10, -9, -8, -7, -6, 0, 8, 9])
    np.testing.assert_array_equal(e4, [np.nan, 0, 1, 2, 3, 3, math.log2(7), np.nan])


def test_value_set_sizes():
    # positive finite codes: E4M3 126 (0x01..0x7E), E5M2 123 (0x01..0x7B), HiF8 7 DML +
    # 120 normal - 0 (0x7F is Inf): 0x01..0x7E = 126
    assert F.value_set("e4m3").size == 126
    assert F.value_set("e5m2").size == 123
    assert F.value_set("hif8").max() == 32768.0


def test_error_vs_magnitude_bounds():
    r = F.error_vs_magnitude(("e4m3", "e5m2"), ("nearest_even", "toward_zero", "stochastic"),
                             lo_exp=-4, hi_exp=4, per_binade=64, include_int8=False)
    for fmt, m in (("e4m3", 3), ("e5m2", 2)):
        ulp_rel = 2.0**-m  # one ulp relative to the binade's lower end
        ne = np.asarray(r["errors"][fmt]["nearest_even"]["max"])
        tz = np.asarray(r["errors"][fmt]["toward_zero"]["max"])
        sr = np.asarray(r["errors"][fmt]["stochastic"]["max"])
        assert np.all(ne <= ulp_rel / 2 + 1e-12)
        assert np.all(tz < ulp_rel)
        assert np.all(sr < ulp_rel)
        # truncation errs more than rounding to nearest on average
        assert np.all(np.asarray(r["errors"][fmt]["toward_zero"]["mean"])
                      > np.asarray(r["errors"][fmt]["nearest_even"]["mean"]))


def test_error_vs_magnitude_flush_and_overflow():
    r = F.error_vs_magnitude(("e4m3",), ("nearest_even",), lo_exp=-14, hi_exp=10,
                             per_binade=16, include_int8=False)
    exps = r["exps"]
    mean = r["errors"]["e4m3"]["nearest_even"]["mean"]
    assert mean[exps.index(-14)] == 1.0  # everything flushes to zero below 2^-10
    assert math.isnan(mean[exps.index(10)])  # overflow (NaN) is left out


def test_rounding_bias_signs():
    b = F.rounding_bias(("e4m3",), ("nearest_even", "up", "down", "stochastic"), n=4096)["e4m3"]
    assert b["up"] > 0.02 and b["down"] < -0.02
    assert abs(b["nearest_even"]) < 0.005 and abs(b["stochastic"]) < 0.005


def test_mx_outlier_confined_to_its_block():
    r = F.mx_outlier_study((1.0, 2.0**16), ("mxfp8_e4m3",), ("floor", "rceil"), blocks=64)
    for m in ("floor", "rceil"):
        clean = r["sqnr_clean"][f"mxfp8_e4m3 {m}"]
        assert clean[0] == pytest.approx(clean[1])  # other blocks do not see the outlier
    pt = r["sqnr_clean"]["e4m3 per-tensor"]
    assert pt[1] < pt[0] - 10  # one shared scale: the outlier coarsens every block
    # 2^16 above std-1 values: ordinary elements sit ~16 binades below the block max, beyond
    # E4M3's 17 binades for some of them -> some flush to zero
    assert r["flushed"]["mxfp8_e4m3 floor"][1] > 0


def test_int_granularity_ordering():
    r = F.int_granularity_study(tokens=32, channels=128)
    s = r["data"]["signed"]
    assert s["int8 per_channel sym"] > s["int8 per_block sym"] > s["int8 per_tensor sym"]
    relu = r["data"]["relu"]
    # one-sided data: an asymmetric (or UINT8) grid uses all codes
    assert relu["int8 per_tensor asym"] > relu["int8 per_tensor sym"] + 3
    # symmetric UINT8 clamps every negative value of signed data to 0
    assert s["uint8 per_tensor sym"] < 10 < s["uint8 per_tensor asym"]


def test_rank_agreement_by_hand():
    errors = {"default": 0.01, "e2e_hif8": 0.02, "exp2_e4m3": 0.03}
    r = exp2.rank_agreement(errors)
    # paper 64K: default 64.8 > e2e 64.0 > e4m3 58.1: all three pairs agree
    assert r == {"ours": ["default", "e2e_hif8", "exp2_e4m3"],
                 "paper": ["default", "e2e_hif8", "exp2_e4m3"], "agree": 3, "pairs": 3}
    errors["exp2_e4m3"] = 0.001  # now e4m3 first: both of its pairs disagree
    assert exp2.rank_agreement(errors)["agree"] == 1


def test_exp2_comparison_small():
    r = exp2.exp2_comparison((256,), (3.0,), ("default", "e2e_hif8", "naive_e2e"), heads=1,
                             n_query=16)
    e = {c: r["errors"][c][3.0][0] for c in r["errors"]}
    assert e["default"] < e["e2e_hif8"] < e["naive_e2e"]
    assert "paper (Table 1" in exp2.format_exp2_comparison(r)
