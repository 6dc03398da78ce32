"""INT8 / UINT8 affine quantization (``lowprec.formats.integer``).

Tested against the exact Fraction reference in ``tests/int_reference.py`` (every rounding mode,
every granularity, scales from the data and explicit) and against PyTorch's round-half-even
quantizers where the conventions coincide.
"""

from __future__ import annotations

import math

import ml_dtypes
import numba
import numpy as np
import pytest
from naive import integer as R

import lowprec as lp
from lowprec.formats import integer

MODES = ["nearest_even", "nearest_away", "toward_zero", "up", "down", "stochastic"]
BF16 = np.dtype(ml_dtypes.bfloat16)
SEED = 1234


def check_against_reference(x, fmt, **kw):
    """encode, quantize and decode(encode) all equal the reference, bit for bit."""
    codes, nan, s, z, vals = R.ref_quantize(x, fmt, **{"seed": SEED, **kw})
    ikw = {k: v for k, v in kw.items() if k != "quotient"}
    if "stochastic" == kw.get("rounding"):
        ikw["seed"] = SEED
    y = lp.quantize(x, fmt, **ikw)
    assert y.dtype == np.float32 and y.shape == x.shape
    np.testing.assert_array_equal(y.view(np.uint32)[~nan], vals.view(np.uint32)[~nan])
    assert np.isnan(y[nan]).all()
    if nan.any():
        with pytest.raises(ValueError, match=f"NaN has no {fmt} code"):
            lp.encode(x, fmt, **ikw)
        return
    q = lp.encode(x, fmt, **ikw)
    assert q.codes.dtype == (np.int8 if fmt == "int8" else np.uint8)
    np.testing.assert_array_equal(q.codes.astype(np.int64), codes)
    assert q.scales.dtype == np.float32
    np.testing.assert_array_equal(q.scales, s)
    if z is None:
        assert q.zero_points is None
    else:
        assert q.zero_points.dtype == np.int32
        np.testing.assert_array_equal(q.zero_points, z)
    np.testing.assert_array_equal(lp.decode(q).view(np.uint32), y.view(np.uint32))
    return q


# --------------------------------------------------------------------------------------------
# Registration


def test_formats_registered():
    assert {"int8", "uint8"} <= set(lp.available_formats())
    i8, u8 = lp.get_format("int8"), lp.get_format("uint8")
    np.testing.assert_array_equal(
        i8.values(), np.arange(256).astype(np.uint8).view(np.int8).astype(np.float32)
    )
    np.testing.assert_array_equal(u8.values(), np.arange(256, dtype=np.float32))
    assert (i8.info.kind, i8.info.scaled, i8.info.qmin, i8.info.qmax) == ("int", True, -127, 127)
    assert (u8.info.kind, u8.info.scaled, u8.info.qmin, u8.info.qmax) == ("int", True, 0, 255)
    for f, top in ((i8, 127), (u8, 255)):
        info = f.info
        assert info.max == float(top) and info.max_code == top
        assert not info.has_nan and not info.has_inf and info.nan_code is None
        assert info.nan_codes == () and info.inf_codes == ()
        assert info.min_normal == 0.0 and info.min_subnormal == 1.0
        assert info.default_rounding == lp.Rounding.NEAREST_EVEN


# --------------------------------------------------------------------------------------------
# Rounding at midpoints, their neighbours and the clamping edges, every mode


def _around(values, dtype):
    """``values`` in ``dtype`` with both neighbours of each."""
    v = np.asarray(values, np.float64).astype(dtype)
    up = np.nextafter(v, np.asarray(np.inf, dtype))
    dn = np.nextafter(v, np.asarray(-np.inf, dtype))
    return np.concatenate([v, up, dn])


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fmt", ["int8", "uint8"])
def test_midpoints_every_mode(mode, fmt):
    ks = np.arange(-131, 131) if fmt == "int8" else np.arange(-3, 259)
    for s in (1.0, 0.25, 2.0**-20, 3.0, 0.1, 1 / 3, 7.3e-3, 1e30):
        s32 = float(np.float32(s))
        x = _around(np.concatenate([(ks + 0.5) * s32, ks * s32]), np.float32)
        check_against_reference(x, fmt, rounding=mode, scale=s32)
        if fmt == "int8":
            check_against_reference(x, fmt, rounding=mode, scale=s32, narrow=False)


@pytest.mark.parametrize("dtype", [np.float16, BF16, np.float64])
def test_midpoints_other_dtypes(dtype):
    ks = np.arange(-131, 131)
    for s in (0.5, 2.0**-6, 3.0):
        x = _around(np.concatenate([(ks + 0.5) * s, ks * s]), dtype)
        for mode in MODES:
            check_against_reference(x, "int8", rounding=mode, scale=s)


@pytest.mark.parametrize("mode", MODES)
def test_asymmetric_explicit_zero_point(mode):
    s = 0.125
    for fmt, zs in (("int8", (-128, -5, 0, 3, 127)), ("uint8", (0, 1, 128, 255))):
        qmin, qmax = R.qrange(fmt, False, None)
        ks = np.arange(qmin - 3, qmax + 3)
        for z in zs:
            x = _around((ks - z + 0.5) * s, np.float32)
            check_against_reference(x, fmt, rounding=mode, symmetric=False, scale=s,
                                    zero_point=z)


def test_float32_quotient_decisions_are_exact():
    """The float64 quotient decides every deterministic mode like the exact one (float32 in)."""
    rng = np.random.default_rng(0)
    s = (10.0 ** rng.uniform(-3, 3, 40)).astype(np.float32)
    for sv in s:
        k = rng.integers(-127, 128, 50)
        frac = rng.choice([0.5, 0.0, 0.25, 1 - 2**-20, 2**-20], 50)
        x = ((k + frac) * np.float64(sv)).astype(np.float32)
        x = _around(x, np.float32)
        for mode in MODES[:5]:
            c_exact = R.ref_quantize(x, "int8", rounding=mode, scale=sv, quotient="exact")[0]
            c_64 = R.ref_quantize(x, "int8", rounding=mode, scale=sv, quotient="float64")[0]
            np.testing.assert_array_equal(c_exact, c_64)
            np.testing.assert_array_equal(
                lp.encode(x, "int8", rounding=mode, scale=sv).codes, c_exact
            )


def test_tiny_quotients_directed_modes():
    x = np.array([1e-30, -1e-30, 1e-45, 1.0, 0.0], np.float32)
    assert lp.encode(x, "int8", rounding="up").codes.tolist() == [1, 0, 1, 127, 0]
    assert lp.encode(x, "int8", rounding="down").codes.tolist() == [0, -1, 0, 127, 0]
    assert lp.encode(x, "int8", rounding="toward_zero").codes.tolist() == [0, 0, 0, 127, 0]
    x64 = np.array([1e-300, -1e-300, 5e-324], np.float64)
    assert lp.encode(x64, "int8", rounding="up", scale=1.0).codes.tolist() == [1, 0, 1]
    assert lp.encode(x64, "int8", rounding="down", scale=1.0).codes.tolist() == [0, -1, 0]
    for mode in MODES:
        check_against_reference(np.concatenate([x, -x]), "int8", rounding=mode)
        check_against_reference(x64, "uint8", rounding=mode, symmetric=False, scale=0.5,
                                zero_point=7)


# --------------------------------------------------------------------------------------------
# Granularities, scales from the data, symmetric and asymmetric


def _random_case(rng):
    nd = int(rng.integers(1, 5))
    shape = tuple(int(v) for v in rng.integers(1, 8, nd))
    gran = str(rng.choice(integer.GRANULARITIES))
    kw = {"granularity": gran}
    if gran in ("per_channel", "per_block") and rng.random() < 0.7:
        kw["axis"] = int(rng.integers(-nd, nd))
    if gran == "per_block":
        kw["block_size"] = int(rng.integers(1, 6))
    kw["symmetric"] = bool(rng.random() < 0.5)
    if not kw["symmetric"] and rng.random() < 0.3:
        kw["narrow"] = True
    fmt = "uint8" if (rng.random() < 0.3 and not kw.get("narrow")) else "int8"
    kw["rounding"] = str(rng.choice(MODES))
    if kw["rounding"] == "stochastic" and rng.random() < 0.5:
        kw["sr_bits"] = int(rng.integers(1, 33))
    dtype = [np.float32, np.float64, np.float16, BF16][int(rng.integers(0, 4))]
    x = rng.standard_normal(shape) * 10.0 ** rng.uniform(-3, 3, shape)
    if fmt == "uint8" and kw["symmetric"] and rng.random() < 0.7:
        x = np.abs(x)
    if rng.random() < 0.3:
        x = x + rng.uniform(-5, 5)  # offset data: asymmetric ranges
    if rng.random() < 0.2:
        x.reshape(-1)[rng.integers(0, x.size)] = rng.choice([np.inf, -np.inf])
    if rng.random() < 0.2:
        x[..., 0] = 0.0  # groups of zeros: scale 1
    return x.astype(dtype), fmt, kw


def test_granularities_random_against_reference():
    rng = np.random.default_rng(2024)
    seen = set()
    for _ in range(120):
        x, fmt, kw = _random_case(rng)
        q = check_against_reference(x, fmt, **kw)
        gran = kw["granularity"]
        seen.add(gran)
        assert q.granularity == gran
        if gran in ("per_tensor", "per_token"):
            assert q.axis is None
        else:
            assert q.axis == kw.get("axis", 0 if gran == "per_channel" else -1) % x.ndim
        assert q.block_size == kw.get("block_size")
        assert q.scales.shape == R.scale_shape(x.shape, gran, q.axis, q.block_size)
    assert seen == set(integer.GRANULARITIES)


def test_scale_shapes_and_partial_blocks():
    x = np.random.default_rng(1).standard_normal((3, 10, 4)).astype(np.float32)
    cases = {
        ("per_tensor", None, None): (1, 1, 1),
        ("per_channel", None, None): (3, 1, 1),
        ("per_channel", -1, None): (1, 1, 4),
        ("per_token", None, None): (3, 10, 1),
        ("per_block", None, 3): (3, 10, 2),
        ("per_block", 1, 4): (3, 3, 4),
        ("per_block", 1, 10): (3, 1, 4),
        ("per_block", 1, 11): (3, 1, 4),
    }
    for (g, a, b), shape in cases.items():
        q = lp.encode(x, "int8", granularity=g, axis=a, block_size=b)
        assert q.scales.shape == shape
        y = lp.quantize(x, "int8", granularity=g, axis=a, block_size=b)
        np.testing.assert_array_equal(lp.decode(q), y)
        # per group, the largest magnitude maps to +-127 (symmetric, scale from amax)
        assert np.abs(q.codes.astype(int)).max() == 127


def test_explicit_scales_reproduce_data_scales():
    rng = np.random.default_rng(5)
    for _ in range(20):
        x, fmt, kw = _random_case(rng)
        x = np.where(np.isfinite(x), x, 0).astype(x.dtype)
        kw.pop("sr_bits", None)
        kw["rounding"] = "nearest_even"
        q = lp.encode(x, fmt, **kw)
        extra = {} if q.zero_points is None else {"zero_point": q.zero_points}
        q2 = lp.encode(x, fmt, scale=q.scales, **extra, **kw)
        np.testing.assert_array_equal(q2.codes, q.codes)
        np.testing.assert_array_equal(q2.scales, q.scales)
        if q.zero_points is not None:  # zero points from the data with the given scales
            q3 = lp.encode(x, fmt, scale=q.scales, **kw)
            np.testing.assert_array_equal(q3.zero_points, q.zero_points)


def test_explicit_scale_broadcasting():
    rng = np.random.default_rng(6)
    x = rng.standard_normal((4, 6)).astype(np.float32)
    s = np.array([0.01, 0.02, 0.03, 0.04], np.float32)
    a = lp.quantize(x, "int8", granularity="per_channel", axis=0, scale=s)  # 1-D per channel
    b = lp.quantize(x, "int8", granularity="per_channel", axis=0, scale=s[:, None])
    np.testing.assert_array_equal(a, b)
    check_against_reference(x, "int8", granularity="per_channel", axis=0, scale=s[:, None])
    s6 = np.linspace(0.01, 0.06, 6, dtype=np.float32)
    a = lp.quantize(x, "int8", granularity="per_channel", axis=-1, scale=s6)
    np.testing.assert_array_equal(a, lp.quantize(x, "int8", granularity="per_channel", axis=1,
                                                 scale=s6[None, :]))
    check_against_reference(x, "int8", granularity="per_channel", axis=1, scale=s6[None, :])
    zp = np.array([1, -2, 3, 0])
    q = lp.encode(x, "int8", granularity="per_channel", scale=s, zero_point=zp, symmetric=False)
    assert q.zero_points.shape == (4, 1) and q.zero_points.ravel().tolist() == zp.tolist()
    check_against_reference(x, "uint8", granularity="per_block", block_size=4, scale=0.05,
                            symmetric=False, zero_point=100)


def test_symmetric_uint8_clamps_negatives_and_scale_from_amax():
    x = np.array([-3.0, -0.5, 0.0, 1.0, 2.0], np.float32)
    q = lp.encode(x, "uint8")
    assert q.zero_points is None
    assert q.scales.item() == np.float32(3.0 / 255)
    assert q.codes.tolist() == [0, 0, 0, 85, 170]


def test_asymmetric_zero_is_exact_and_range_used():
    rng = np.random.default_rng(7)
    for fmt in ("int8", "uint8"):
        x = (rng.uniform(0.5, 3.0, 1000)).astype(np.float32)
        x[0] = 0.0
        q = lp.encode(x, fmt, symmetric=False)
        qmin, qmax = R.qrange(fmt, False, None)
        assert q.zero_points.item() == qmin  # min(x) = 0
        assert lp.decode(q)[0] == 0.0
        assert q.codes.astype(int).max() == qmax and q.codes.astype(int).min() == qmin
        x = -x
        q = lp.encode(x, fmt, symmetric=False)
        assert q.zero_points.item() == qmax
        assert lp.decode(q)[0] == 0.0


def test_all_zero_and_empty_inputs():
    z = np.zeros((2, 3), np.float32)
    for sym in (True, False):
        q = lp.encode(z, "int8", symmetric=sym, granularity="per_token")
        assert (q.scales == 1.0).all() and (lp.decode(q) == 0).all()
        assert (q.codes == (0 if sym else -128)).all()
    for shape, kw in [((0,), {}), ((3, 0), {"granularity": "per_token"}),
                      ((0, 4), {"granularity": "per_block", "block_size": 2}),
                      ((3, 0), {"granularity": "per_block", "block_size": 2}),
                      ((0, 2), {"granularity": "per_channel", "axis": 1})]:
        e = np.zeros(shape, np.float32)
        q = lp.encode(e, "uint8", **kw)
        assert q.codes.shape == shape
        assert lp.decode(q).shape == shape and lp.quantize(e, "uint8", **kw).shape == shape
    x0 = np.array(2.5, np.float32)
    q = lp.encode(x0, "int8")
    assert q.codes.shape == () and q.codes == 127 and lp.decode(q) == np.float32(2.5)


def test_scale_range_clamped_to_float32():
    x = np.array([1e300, -2e300], np.float64)
    q = lp.encode(x, "int8")
    assert q.scales.item() == np.finfo(np.float32).max
    assert q.codes.tolist() == [127, -127]
    t = np.array([1.4e-45, 0.0], np.float32)  # amax / 127 underflows float32
    q = lp.encode(t, "int8")
    assert q.scales.item() == np.float32(2.0**-149) and q.codes.tolist() == [1, 0]
    check_against_reference(x, "int8")
    check_against_reference(t, "int8")


def test_noncontiguous_and_list_inputs():
    rng = np.random.default_rng(8)
    x = rng.standard_normal((6, 8)).astype(np.float32)
    for v in (x.T, x[:, ::3], x[::-1]):
        for mode in ("nearest_even", "stochastic"):
            kw = {"rounding": mode, "seed": 3, "granularity": "per_block", "block_size": 3}
            np.testing.assert_array_equal(lp.quantize(v, "int8", **kw),
                                          lp.quantize(np.ascontiguousarray(v), "int8", **kw))
    np.testing.assert_array_equal(lp.quantize([0.5, -1.0], "int8"),
                                  lp.quantize(np.array([0.5, -1.0]), "int8"))


# --------------------------------------------------------------------------------------------
# NaN and Inf


def test_nan_and_inf():
    x = np.array([1.0, np.nan, np.inf, -np.inf, -2.0], np.float32)
    with pytest.raises(ValueError, match="NaN has no int8 code"):
        lp.encode(x, "int8")
    with pytest.raises(ValueError, match="NaN has no uint8 code"):
        lp.encode(x, "uint8", symmetric=False)
    y = lp.quantize(x, "int8")
    s = np.float32(2.0 / 127)  # NaN and Inf do not count in amax
    assert np.isnan(y[1])
    assert y[2] == np.float32(127 * np.float64(s)) and y[3] == -y[2]
    q = lp.encode(x[[0, 2, 3, 4]], "int8", narrow=False)
    assert q.codes.tolist() == [64, 127, -128, -127]
    q = lp.encode(np.array([np.inf, -np.inf, 1.0]), "uint8", symmetric=False)
    assert q.codes.tolist()[:2] == [255, 0]
    check_against_reference(x, "int8", granularity="per_token")
    check_against_reference(x.reshape(1, 5), "uint8", symmetric=False, granularity="per_block",
                            block_size=2)


def test_saturate_accepted_and_irrelevant():
    x = np.array([1.0, 5.0, -9.0], np.float32)
    for sat in (None, False, True):
        assert lp.encode(x, "int8", saturate=sat, scale=0.01).codes.tolist() == [100, 127, -127]


# --------------------------------------------------------------------------------------------
# Stochastic rounding


def test_stochastic_unbiased():
    n = 10**6
    rng = np.random.default_rng(9)
    x = rng.uniform(-100, 100, n).astype(np.float32)
    y = lp.quantize(x, "int8", rounding="stochastic", seed=11, scale=1.0).astype(np.float64)
    f = np.abs(x) - np.floor(np.abs(x))
    se = math.sqrt(np.sum(f * (1 - f))) / n
    assert abs(np.mean(y - x)) < 3 * se
    assert set(np.unique(np.abs(y - x) < 1)) == {True}
    # a constant: rounds up with probability = fraction
    c = np.full(n, 0.3, np.float32)
    yc = lp.quantize(c, "uint8", rounding="stochastic", seed=12, scale=1.0)
    p = float(np.float32(0.3))
    assert abs(yc.mean() - p) < 3 * math.sqrt(p * (1 - p) / n)
    # sr_bits = 2: the fraction is truncated to 2 bits first -> probability 1/4
    y2 = lp.quantize(-c, "int8", rounding="stochastic", seed=13, scale=1.0, sr_bits=2)
    assert abs(-y2.mean() - 0.25) < 3 * math.sqrt(0.25 * 0.75 / n)


def test_stochastic_seed_behaviour():
    x = np.linspace(-3, 3, 1001, dtype=np.float32)
    a = lp.quantize(x, "int8", rounding="stochastic", seed=1)
    np.testing.assert_array_equal(a, lp.quantize(x, "int8", rounding="stochastic", seed=1))
    assert not np.array_equal(a, lp.quantize(x, "int8", rounding="stochastic", seed=2))
    g = lp.quantize(x, "int8", rounding="stochastic", seed=np.random.default_rng(0))
    assert g.shape == x.shape


def test_large_arrays_parallel_path_and_thread_count():
    """Above the parallel threshold: same bits for 1 and 2 threads, equal to the reference."""
    rng = np.random.default_rng(10)
    x = rng.standard_normal((64, 4097)).astype(np.float32)  # > 2**17 elements
    assert x.size >= integer.PARALLEL_MIN
    cases = [dict(rounding="stochastic", seed=5, granularity="per_block", block_size=100),
             dict(rounding="nearest_even", granularity="per_channel", axis=1, symmetric=False),
             dict(rounding="up", granularity="per_token")]
    nthreads = min(2, numba.config.NUMBA_NUM_THREADS)
    old = numba.get_num_threads()
    try:
        for kw in cases:
            res = []
            for t in sorted({1, nthreads}):
                numba.set_num_threads(t)
                res.append((lp.quantize(x, "int8", **kw), lp.encode(x, "int8", **kw)))
            for y, q in res[1:]:
                np.testing.assert_array_equal(y, res[0][0])
                np.testing.assert_array_equal(q.codes, res[0][1].codes)
            y, q = res[0]
            np.testing.assert_array_equal(lp.decode(q), y)
            # spot-check elements against the reference (flat index = counter)
            s = np.broadcast_to(q.scales if kw.get("granularity") != "per_block" else
                                np.repeat(q.scales, 100, axis=1)[:, :x.shape[1]], x.shape)
            z = (np.zeros(x.shape, int) if q.zero_points is None else
                 np.broadcast_to(q.zero_points, x.shape))
            qmin, qmax = R.qrange("int8", kw.get("symmetric", True), None)
            for k in rng.integers(0, x.size, 300):
                idx = np.unravel_index(k, x.shape)
                quot = "float64" if kw["rounding"] == "stochastic" else "exact"
                c = R.ref_code(float(x[idx]), float(s[idx]), int(z[idx]), qmin, qmax,
                               kw["rounding"], kw.get("seed", 0), int(k), 32, quot)
                assert int(q.codes[idx]) == c
    finally:
        numba.set_num_threads(old)


# --------------------------------------------------------------------------------------------
# Torch: tensors in and out, and agreement with torch's quantizers


def test_torch_in_torch_out():
    torch = pytest.importorskip("torch")
    x = torch.randn(5, 7)
    y = lp.quantize(x, "int8", granularity="per_token")
    assert isinstance(y, torch.Tensor) and y.dtype == torch.float32
    q = lp.encode(x, "int8", granularity="per_token", symmetric=False)
    assert isinstance(q.codes, torch.Tensor) and q.codes.dtype == torch.int8
    assert isinstance(q.scales, torch.Tensor) and isinstance(q.zero_points, torch.Tensor)
    d = lp.decode(q)
    assert isinstance(d, torch.Tensor)
    np.testing.assert_array_equal(
        d.numpy(), lp.quantize(x.numpy(), "int8", granularity="per_token", symmetric=False)
    )
    xb = x.to(torch.bfloat16)
    yb = lp.quantize(xb, "uint8", symmetric=False)
    np.testing.assert_array_equal(
        yb.numpy(), lp.quantize(x.to(torch.bfloat16).float().numpy(), "uint8", symmetric=False)
    )
    assert lp.encode(xb, "uint8").codes.dtype == torch.uint8
    o = torch.empty(5, 7)
    assert lp.quantize(x, "int8", out=o) is o
    np.testing.assert_array_equal(o.numpy(), lp.quantize(x.numpy(), "int8"))


@pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor:UserWarning")
@pytest.mark.parametrize("fmt", ["int8", "uint8"])
def test_matches_torch_per_tensor_power_of_two_scales(fmt):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(11)
    qmin, qmax = R.qrange(fmt, False, None)
    tdtype = torch.qint8 if fmt == "int8" else torch.quint8
    for s in (2.0**-4, 2.0**-10, 1.0, 8.0):
        for z in ((-128, -3, 0, 77, 126, 127) if fmt == "int8" else (0, 5, 128, 254, 255)):
            k = rng.integers(qmin - z - 5, qmax - z + 5, 2000)
            frac = rng.choice([0.0, 0.5, 0.25, 0.75, 0.5 - 2**-12, 0.5 + 2**-12], 2000)
            x = ((k + frac) * s).astype(np.float32)
            ours = lp.quantize(x, fmt, symmetric=False, scale=s, zero_point=z)
            ref = torch.fake_quantize_per_tensor_affine(torch.from_numpy(x), s, z, qmin, qmax)
            np.testing.assert_array_equal(ours, ref.numpy())
            if z % 2 == 0:  # quantize_per_tensor rounds x / s + z: same ties for even z only
                codes = lp.encode(x, fmt, symmetric=False, scale=s, zero_point=z).codes
                tq = torch.quantize_per_tensor(torch.from_numpy(x), s, z, tdtype)
                np.testing.assert_array_equal(codes, tq.int_repr().numpy())


def test_matches_torch_per_channel():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(12)
    x = (rng.integers(-300, 300, (6, 5, 4)) * 0.5 + rng.choice([0, 0.25], (6, 5, 4)))
    for axis in (0, 1, 2):
        n = x.shape[axis]
        s = 2.0 ** rng.integers(-3, 2, n)
        z = rng.integers(-20, 20, n)
        xs = (x * 2.0 ** rng.integers(-2, 2)).astype(np.float32)
        ours = lp.quantize(xs, "int8", granularity="per_channel", axis=axis, scale=s,
                           zero_point=z, symmetric=False)
        ref = torch.fake_quantize_per_channel_affine(
            torch.from_numpy(xs), torch.from_numpy(s.astype(np.float32)),
            torch.from_numpy(z.astype(np.int32)), axis, -128, 127)
        np.testing.assert_array_equal(ours, ref.numpy())


@pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor:UserWarning")
def test_close_to_torch_with_data_scales():
    """Data-derived scales (not powers of two): torch multiplies by a float32 reciprocal, so the
    codes may differ, by one, only where x / s is within rounding error of a tie."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(13)
    x = rng.standard_normal(20000).astype(np.float32)
    q = lp.encode(x, "int8", symmetric=False)
    s, z = float(q.scales.item()), int(q.zero_points.item())
    tq = torch.quantize_per_tensor(torch.from_numpy(x), s, z, torch.qint8).int_repr().numpy()
    diff = q.codes.astype(int) != tq.astype(int)
    assert (np.abs(q.codes.astype(int) - tq)[diff] == 1).all()
    t = x[diff].astype(np.float64) / np.float64(np.float32(s))
    assert (np.abs(t - np.floor(t) - 0.5) < 1e-5).all()
    assert diff.mean() < 1e-3


# --------------------------------------------------------------------------------------------
# Errors


def test_bad_inputs():
    x = np.ones((2, 3), np.float32)
    with pytest.raises(TypeError, match="allowed: float32, float64, float16, bfloat16"):
        lp.encode(np.ones(3, np.int32), "int8")
    with pytest.raises(ValueError, match="per_tensor, per_channel, per_token, per_block"):
        lp.quantize(x, "int8", granularity="per_row")
    for axis in (2, -3, 1.0, True):
        with pytest.raises(ValueError, match="allowed: integers -2..1"):
            lp.encode(x, "int8", granularity="per_channel", axis=axis)
    with pytest.raises(ValueError, match="axis applies to"):
        lp.encode(x, "int8", granularity="per_token", axis=0)
    for b in (None, 0, -1, 2.5, True):
        with pytest.raises(ValueError, match="block_size must be an integer >= 1"):
            lp.encode(x, "int8", granularity="per_block", block_size=b)
    with pytest.raises(ValueError, match="block_size applies to"):
        lp.encode(x, "int8", block_size=4)
    with pytest.raises(ValueError, match="at least 1 axis"):
        lp.encode(np.float32(1.0), "int8", granularity="per_token")
    for s in (0.0, -1.0, np.nan, np.inf, [1.0, 0.0, 2.0]):
        with pytest.raises(ValueError, match="scale must be finite and > 0"):
            lp.quantize(x, "int8", granularity="per_channel", axis=1, scale=s)
    with pytest.raises(ValueError, match="under- or overflows float32"):
        lp.quantize(x, "int8", scale=1e-60)
    with pytest.raises(ValueError, match="does not broadcast"):
        lp.quantize(x, "int8", granularity="per_channel", axis=0, scale=[1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match=r"zero_point must lie in \[-128, 127\]"):
        lp.encode(x, "int8", symmetric=False, scale=1.0, zero_point=200)
    with pytest.raises(ValueError, match="zero_point must hold integers"):
        lp.encode(x, "uint8", symmetric=False, scale=1.0, zero_point=2.5)
    with pytest.raises(ValueError, match="zero_point applies to symmetric=False"):
        lp.encode(x, "int8", scale=1.0, zero_point=0)
    with pytest.raises(ValueError, match="zero_point= needs scale="):
        lp.encode(x, "int8", symmetric=False, zero_point=0)
    with pytest.raises(ValueError, match="narrow=True applies to int8 only"):
        lp.encode(x, "uint8", narrow=True)
    with pytest.raises(TypeError, match="narrow must be"):
        lp.encode(x, "int8", narrow="yes")
    with pytest.raises(TypeError, match="symmetric must be"):
        lp.encode(x, "int8", symmetric=None)
    with pytest.raises(ValueError, match="hybrid"):
        lp.quantize(x, "int8", rounding="hybrid")
    with pytest.raises(ValueError, match="is not one of"):
        lp.quantize(x, "int8", rounding="nearest")
    with pytest.raises(ValueError, match="needs a seed"):
        lp.quantize(x, "int8", rounding="stochastic")
    with pytest.raises(ValueError, match=r"sr_bits must be in \[1, 32\]"):
        lp.quantize(x, "int8", rounding="stochastic", seed=1, sr_bits=0)
    with pytest.raises(ValueError, match="out must have dtype float32"):
        lp.quantize(x, "int8", out=np.empty((2, 3), np.float64))
    with pytest.raises(TypeError):
        lp.encode(x, "int8", block=3)


def test_decode_validation():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    q = lp.encode(x, "int8", granularity="per_block", block_size=3)
    bad = lp.QuantizedArray(codes=q.codes.view(np.uint8), scales=q.scales, format="int8",
                            axis=1, block_size=3, granularity="per_block")
    with pytest.raises(TypeError, match="int8 codes must have dtype int8"):
        lp.decode(bad)
    bad = lp.QuantizedArray(codes=q.codes, scales=q.scales[:, :1], format="int8", axis=1,
                            block_size=3, granularity="per_block")
    with pytest.raises(ValueError, match=r"per_block scales must have shape \(3, 2\)"):
        lp.decode(bad)
    bad = lp.QuantizedArray(codes=q.codes, scales=np.ones((2, 1), np.float32), format="int8",
                            granularity="per_token")
    with pytest.raises(ValueError, match="do not broadcast"):
        lp.decode(bad)
    with pytest.raises(ValueError, match="need their scales"):
        lp.decode(q.codes.view(np.uint8), "int8")
