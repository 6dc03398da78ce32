"""MXFP8 (formats.md section 3): golden blocks, gfloat on float64 blocks, exact scale modes,
non-finite policy, axes and partial blocks, errors."""

from fractions import Fraction

import gfloat
import numpy as np
import pytest
from gfloat.formats import (
    format_info_mxfp8_e4m3,
    format_info_mxfp8_e5m2,
    format_info_ocp_e4m3,
    format_info_ocp_e5m2,
)

import lowprec as lp

FMTS = ["mxfp8_e4m3", "mxfp8_e5m2"]
GF_BLOCK = {"mxfp8_e4m3": format_info_mxfp8_e4m3, "mxfp8_e5m2": format_info_mxfp8_e5m2}
GF_ELEM = {"mxfp8_e4m3": format_info_ocp_e4m3, "mxfp8_e5m2": format_info_ocp_e5m2}
EMAX = {"mxfp8_e4m3": 8, "mxfp8_e5m2": 15}
MAXE = {"mxfp8_e4m3": 448, "mxfp8_e5m2": 57344}
MBITS = {"mxfp8_e4m3": 3, "mxfp8_e5m2": 2}
RM = gfloat.RoundMode
GF_MODES = {
    "nearest_even": RM.TiesToEven,
    "nearest_away": RM.TiesToAway,
    "toward_zero": RM.TowardZero,
    "up": RM.TowardPositive,
    "down": RM.TowardNegative,
}


def f32(bits):
    return np.array([bits], np.uint32).view(np.float32)[0]


def block(vals, n=32, dtype=np.float32):
    x = np.zeros(n, dtype)
    x[: len(vals)] = vals
    return x


# formats.md 3.5 (scale code, element codes of the listed inputs)
GOLDEN = [
    ("MX1", [1000, 1, 0.3, -0.7, 3, 17, 2**-6, 2**-10, 930, -0.0], "mxfp8_e4m3", 0x80,
     "7E 30 22 AB 3C 50 04 00 7E 80"),
    ("MX1", [1000, 1, 0.3, -0.7, 3, 17, 2**-6, 2**-10, 930, -0.0], "mxfp8_e5m2", 0x79,
     "7B 54 4D D2 5A 64 3C 2C 7B 80"),
    ("MX2", [f32(0x43FFFFFF), 1, 0.1, -3], "mxfp8_e4m3", 0x7F, "7E 38 1D C4"),
    ("MX2", [f32(0x43FFFFFF), 1, 0.1, -3], "mxfp8_e5m2", 0x78, "7B 58 4A DE"),
    ("MX3", [256, 1.0625, 1.1875, 2**-10, 3 * 2**-10, -448], "mxfp8_e4m3", 0x7F,
     "78 38 3A 00 02 FE"),
    ("MX3", [256, 1.0625, 1.1875, 2**-10, 3 * 2**-10, -448], "mxfp8_e5m2", 0x78,
     "78 58 59 30 36 FB"),
    ("MX4", [], "mxfp8_e4m3", 0x00, ""),
    ("MX4", [], "mxfp8_e5m2", 0x00, ""),
    ("MX5", [2.0**-120, 2.0**-125, 2.0**-130, -(2.0**-121)], "mxfp8_e4m3", 0x00, "70 48 20 E8"),
    ("MX5", [2.0**-120, 2.0**-125, 2.0**-130, -(2.0**-121)], "mxfp8_e5m2", 0x00, "58 44 30 D4"),
]


@pytest.mark.parametrize("name,vals,fmt,scale,codes", GOLDEN)
def test_golden_blocks(name, vals, fmt, scale, codes):
    q = lp.encode(block(vals), fmt)
    assert int(q.scales[0]) == scale
    want = [int(c, 16) for c in codes.split()]
    assert q.codes[: len(want)].tolist() == want
    assert not q.codes[len(want):].any()  # zero padding encodes to +0
    # decoded values equal scale * element exactly
    y = lp.decode(q)
    elem = lp.get_format(fmt).values()[q.codes].astype(np.float64) * 2.0 ** (scale - 127)
    np.testing.assert_array_equal(y, elem.astype(np.float32))


def _gfloat_block(fmt, vals, rnd=RM.TiesToEven):
    """(scale code, element codes, decoded) from gfloat on one float64 block."""
    fi = GF_BLOCK[fmt]
    s = gfloat.compute_scale_amax(fi.etype.emax, vals)
    enc = list(gfloat.encode_block(fi, s, vals / s, rnd))
    dec = np.fromiter(gfloat.decode_block(fi, enc), float)
    return enc[0], np.array(enc[1:]), dec


def _random_blocks(rng, nblocks):
    out = []
    for _ in range(nblocks):
        mag = 2.0 ** rng.integers(-140, 120)
        v = rng.standard_normal(32) * mag
        v[rng.random(32) < 0.1] = 0.0
        out.append(v)
    return out


def _edge_blocks():
    return [
        np.zeros(32),
        block([2.0**-130, 2.0**-140, -(2.0**-149)], dtype=np.float64),  # subnormal amax
        block([2.0**-149], dtype=np.float64),
        block([448 * 2.0**100, 1.0, -3.0], dtype=np.float64),  # near overflow
        block([465 * 2.0**50, 464 * 2.0**50, -1.5], dtype=np.float64),
        block([57344 * 2.0**100, 61440 * 2.0**90, 1.0], dtype=np.float64),
        block([f32(0x7F7FFFFF), -f32(0x7F7FFFFF), 1e30], dtype=np.float64),
        block([1e-300, 1e-310], dtype=np.float64),  # float64 subnormals: scale clamps to -127
        block([1e300, 1.0], dtype=np.float64),  # beyond the scale range: clamps to 2**127
    ]


@pytest.mark.parametrize("fmt", FMTS)
def test_matches_gfloat_on_float64_blocks(fmt):
    rng = np.random.default_rng(7)
    blocks = _random_blocks(rng, 300) + _edge_blocks()
    for vals in blocks:
        vals = np.asarray(vals, np.float64)
        if np.any(np.abs(vals) > 0):
            # gfloat takes floor(log2) in float64: skip amax within an ulp-ish of a power of 2
            amax = np.max(np.abs(vals))
            if np.log2(amax) != np.floor(np.log2(amax)) and abs(
                    np.log2(amax) - np.round(np.log2(amax))) < 1e-12:
                continue
        s, codes, dec = _gfloat_block(fmt, vals)
        q = lp.encode(vals, fmt)
        assert int(q.scales[0]) == s, vals
        ours = q.codes.astype(np.int64)
        # gfloat writes -0 as 0x80 like us, NaN never occurs here
        np.testing.assert_array_equal(ours, codes)
        y = lp.decode(q).astype(np.float64)
        with np.errstate(over="ignore"):
            np.testing.assert_array_equal(y, dec.astype(np.float32).astype(np.float64))


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("mode", list(GF_MODES))
def test_element_rounding_modes_vs_gfloat(fmt, mode):
    rng = np.random.default_rng(11)
    for vals in _random_blocks(rng, 40):
        s, codes, _ = _gfloat_block(fmt, vals, GF_MODES[mode])
        q = lp.encode(vals, fmt, rounding=mode)
        assert int(q.scales[0]) == s
        np.testing.assert_array_equal(q.codes.astype(np.int64), codes)


def _exact_exp(amax: Fraction, mode: str, fmt: str) -> int:
    """Shared exponent of formats.md 3.2 / the scale modes, exactly with Fractions."""
    def floor_log2(a):
        e = a.numerator.bit_length() - a.denominator.bit_length()
        while Fraction(2) ** e > a:
            e -= 1
        while Fraction(2) ** (e + 1) <= a:
            e += 1
        return e

    if amax == 0:
        return -127
    fl = floor_log2(amax)
    if mode == "floor":
        e = fl - EMAX[fmt]
    elif mode == "ceil":
        e = (fl if Fraction(2) ** fl == amax else fl + 1) - EMAX[fmt]
    elif mode == "rceil":
        e = fl - EMAX[fmt] - 2
        while amax > MAXE[fmt] * Fraction(2) ** e:
            e += 1
    else:  # even: amax rounded half away to MBITS mantissa bits
        q = Fraction(2) ** (fl - MBITS[fmt])
        r = (amax / q + Fraction(1, 2)).__floor__() * q
        e = floor_log2(r) - EMAX[fmt]
    return max(-127, min(127, e))


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("mode", ["floor", "rceil", "ceil", "even"])
def test_scale_modes_exact(fmt, mode):
    rng = np.random.default_rng(3)
    maxe = MAXE[fmt]
    amaxes = [1.0, 2.0, 3.0, maxe, maxe * 1.03, maxe * 0.99, 465.0, 464.0, 480.0, 61440.0,
              f32(0x43FFFFFF), f32(0x3F7FFFFF), 2.0**-140, 1.9 * 2.0**-130, 0.0]
    amaxes += list(np.abs(rng.standard_normal(200)) * 2.0 ** rng.integers(-60, 60, 200))
    for a in amaxes:
        a = float(np.float32(a))
        x = block([a, -a / 3, a / 7])
        q = lp.encode(x, fmt, scale_mode=mode)
        assert int(q.scales[0]) - 127 == _exact_exp(Fraction(a), mode, fmt), (a, mode)
        # elements: saturating RNE of the exactly scaled values
        e = int(q.scales[0]) - 127
        want = lp.encode(x.astype(np.float64) * 2.0**-e, fmt.split("_")[1], saturate=True)
        np.testing.assert_array_equal(q.codes, want)


def test_scale_modes_differ_as_documented():
    # e4m3: floor keeps 2**0 and clamps 500 -> 448; 500 rounds to 2**9 at 3 mantissa bits, so
    # even (like ceil and rceil) takes 2**1 and 500 / 2 = 250 rounds to 256
    x = block([500.0, 1.0])
    fl = lp.encode(x, "mxfp8_e4m3", scale_mode="floor")
    ev = lp.encode(x, "mxfp8_e4m3", scale_mode="even")
    rc = lp.encode(x, "mxfp8_e4m3", scale_mode="rceil")
    assert lp.decode(fl)[0] == 448.0
    assert int(ev.scales[0]) == int(fl.scales[0]) + 1 == int(rc.scales[0])
    assert lp.decode(ev)[0] == 512.0
    # 465 rounds to 480 < 2**9 at 3 bits: even keeps the floor scale, rceil does not
    y = block([465.0])
    assert lp.encode(y, "mxfp8_e4m3", scale_mode="even").scales[0] == 127
    assert lp.encode(y, "mxfp8_e4m3", scale_mode="rceil").scales[0] == 128


@pytest.mark.parametrize("fmt", FMTS)
def test_nonfinite_policy(fmt):
    x = block([1.0, 2.0, np.nan])
    q = lp.encode(np.concatenate([x, block([1.0, 2.0])]), fmt)
    assert q.scales.tolist()[0] == 0xFF and q.scales.tolist()[1] != 0xFF
    y = lp.decode(q)
    assert np.isnan(y[:32]).all() and not np.isnan(y[32:]).any()
    # Inf: default "nan" -> NaN block; "saturate" -> gfloat's scale 2**127 + saturated element
    xi = block([np.inf, 1.0, -2.0])
    assert int(lp.encode(xi, fmt).scales[0]) == 0xFF
    assert np.isnan(lp.quantize(xi, fmt)).all()
    qs = lp.encode(xi, fmt, nonfinite="saturate")
    fi = GF_BLOCK[fmt]
    s = gfloat.compute_scale_amax(fi.etype.emax, xi.astype(np.float64))
    enc = list(gfloat.encode_block(fi, s, xi.astype(np.float64) / s, RM.TiesToEven))
    assert int(qs.scales[0]) == enc[0] == 0xFE
    np.testing.assert_array_equal(qs.codes.astype(np.int64), enc[1:])
    # -Inf saturates to -max
    qn = lp.encode(block([-np.inf]), fmt, nonfinite="saturate")
    assert lp.get_format(fmt).values()[qn.codes[0]] == -lp.get_format(fmt).info.max


@pytest.mark.parametrize("axis", [0, 1, -1, 2])
def test_axes_partial_blocks_match_manual_blocking(axis):
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((5, 70, 3)) * 4).astype(np.float32)
    q = lp.encode(x, "mxfp8_e4m3", axis=axis, block_size=32)
    ax = axis % 3
    nb = -(-x.shape[ax] // 32)
    assert q.scales.shape == x.shape[:ax] + (nb,) + x.shape[ax + 1:]
    assert q.codes.shape == x.shape
    xm = np.moveaxis(x, ax, -1)
    cm = np.moveaxis(q.codes, ax, -1)
    sm = np.moveaxis(q.scales, ax, -1)
    for idx in np.ndindex(xm.shape[:-1]):
        for b in range(nb):
            blk = xm[idx][b * 32:(b + 1) * 32]
            qb = lp.encode(blk, "mxfp8_e4m3")  # one (possibly partial) block
            assert int(qb.scales[0]) == int(sm[idx][b])
            np.testing.assert_array_equal(qb.codes, cm[idx][b * 32:(b + 1) * 32])
    np.testing.assert_array_equal(lp.decode(q), lp.quantize(x, "mxfp8_e4m3", axis=axis))


def test_partial_block_equals_zero_padding():
    x = np.random.default_rng(2).standard_normal(45).astype(np.float32)
    q = lp.encode(x, "mxfp8_e5m2")
    qp = lp.encode(np.concatenate([x, np.zeros(19, np.float32)]), "mxfp8_e5m2")
    np.testing.assert_array_equal(q.scales, qp.scales)
    np.testing.assert_array_equal(q.codes, qp.codes[:45])


def test_input_kinds_and_dtypes():
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(1).standard_normal((4, 64)).astype(np.float32)
    ref = lp.encode(x, "mxfp8_e4m3")
    for xi in (x.astype(np.float64), x.T.copy().T, torch.from_numpy(x)):
        q = lp.encode(xi, "mxfp8_e4m3")
        np.testing.assert_array_equal(np.asarray(q.codes), ref.codes)
    qt = lp.encode(torch.from_numpy(x), "mxfp8_e4m3")
    assert isinstance(qt.codes, torch.Tensor) and isinstance(lp.decode(qt), torch.Tensor)
    xb = torch.from_numpy(x).to(torch.bfloat16)
    np.testing.assert_array_equal(
        np.asarray(lp.encode(xb, "mxfp8_e4m3").codes),
        lp.encode(xb.float().numpy(), "mxfp8_e4m3").codes)


def test_stochastic_is_seeded_and_unbiased():
    x = np.full(200_000, 1.1, np.float32)
    x[::32] = 3.0  # fixes the scale of every block to 2**-7 (e4m3)
    a = lp.quantize(x, "mxfp8_e4m3", rounding="stochastic", seed=5)
    b = lp.quantize(x, "mxfp8_e4m3", rounding="stochastic", seed=5)
    np.testing.assert_array_equal(a, b)
    vals = a[x == np.float32(1.1)].astype(np.float64)
    err = vals - np.float64(np.float32(1.1))
    assert abs(err.mean()) < 3 * err.std() / np.sqrt(err.size)


def test_errors():
    x = np.ones((2, 40), np.float32)
    with pytest.raises(ValueError, match="scale_mode"):
        lp.encode(x, "mxfp8_e4m3", scale_mode="round")
    with pytest.raises(ValueError, match="block_size"):
        lp.encode(x, "mxfp8_e4m3", block_size=0)
    with pytest.raises(ValueError, match="axis"):
        lp.encode(x, "mxfp8_e4m3", axis=2)
    with pytest.raises(ValueError, match="saturate"):
        lp.encode(x, "mxfp8_e4m3", saturate=False)
    with pytest.raises(ValueError, match="nonfinite"):
        lp.encode(x, "mxfp8_e4m3", nonfinite="zero")
    with pytest.raises(ValueError, match="hybrid"):
        lp.encode(x, "mxfp8_e4m3", rounding="hybrid")
    with pytest.raises(TypeError, match="dtype"):
        lp.encode(np.ones(4, np.int32), "mxfp8_e4m3")
    with pytest.raises(ValueError, match="1-d"):
        lp.encode(np.float32(1.0), "mxfp8_e4m3")
    with pytest.raises(ValueError, match="seed"):
        lp.encode(x, "mxfp8_e4m3", rounding="stochastic")
    q = lp.encode(x, "mxfp8_e4m3")
    bad = lp.QuantizedArray(codes=q.codes, scales=q.scales[:, :1], format=q.format,
                            axis=q.axis, block_size=q.block_size)
    with pytest.raises(ValueError, match="scales shape"):
        lp.decode(bad)
    with pytest.raises(ValueError, match="scales"):
        lp.decode(q.codes, "mxfp8_e4m3")
