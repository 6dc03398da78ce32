"""Inputs and comparisons shared by the GPU tests (interpreter and CUDA) and
``scripts/gpu_exhaustive.py``: binade edges and special values of each format, random bit
patterns, MX and INT blocks; mismatch counts with NaN compared by class.

Expected outputs always come from the CPU (Numba) path, never from the code under test.
"""

from __future__ import annotations

import numpy as np

import lowprec as lp

FLOAT_FORMATS = ("hif8", "e4m3", "e5m2")
DET_MODES = ("nearest_even", "nearest_away", "toward_zero", "up", "down")
OVERFLOW_POINTS = (464.0, 480.0, 61440.0, 65536.0, 40960.0, 49152.0, 36864.0)


def modes(fmt: str) -> tuple[str, ...]:
    """Every rounding mode of a float format (hybrid for hif8 only)."""
    return DET_MODES + ("stochastic",) + (("hybrid",) if fmt == "hif8" else ())


def _neighbours(bits: np.ndarray, width: int, reach: int) -> np.ndarray:
    dt = np.uint32 if width == 32 else np.uint64
    b = bits.astype(np.int64 if width == 32 else object)
    out = [(b + d) for d in range(-reach, reach + 1)]
    arr = np.concatenate([np.asarray(o, dtype=object) for o in out])
    top = 1 << width
    arr = np.array([int(v) % top for v in arr], dtype=dt)
    return arr


def edge_values(fmt: str) -> np.ndarray:
    """float64 points where a rounding decision changes: every finite value of ``fmt``, the
    midpoints between neighbours (and between 0 and the smallest), the overflow thresholds,
    and the powers of two across the format's range (binade edges)."""
    v = lp.get_format(fmt).values().astype(np.float64)
    v = np.unique(np.abs(v[np.isfinite(v)]))
    mids = (v[1:] + v[:-1]) / 2
    pw = np.ldexp(1.0, np.arange(-30, 18))
    pw = np.concatenate([pw, pw * 1.25, pw * 1.5, pw * 1.75])
    return np.unique(np.concatenate([v, mids, pw, OVERFLOW_POINTS]))


def edge_bits32(fmt: str) -> np.ndarray:
    """uint32 float32 patterns: :func:`edge_values` and their neighbours within 2 ulp, both
    signs, plus float32 specials (zeros, subnormals, max, Inf, NaN payloads)."""
    b = edge_values(fmt).astype(np.float32).view(np.uint32)
    b = _neighbours(b, 32, 2)
    specials = np.array([0, 1, 2, 0x7FFFFF, 0x800000, 0x7F7FFFFF, 0x7F800000, 0x7F800001,
                         0x7FC00000, 0x7FFFFFFF, 0x3F800000], dtype=np.uint32)
    b = np.concatenate([b, specials])
    return np.unique(np.concatenate([b, b | np.uint32(0x80000000)]))


def edge_bits64(fmt: str) -> np.ndarray:
    """uint64 float64 patterns around :func:`edge_values` (within 2 float64 ulp, and the float32
    neighbours as float64), both signs, plus float64 specials."""
    v = edge_values(fmt)
    b = _neighbours(v.view(np.uint64), 64, 2)
    with np.errstate(invalid="ignore"):  # NaN payloads
        b32 = edge_bits32(fmt).view(np.float32).astype(np.float64).view(np.uint64)
    specials = np.array([0, 1, 0xFFFFFFFFFFFFF, 0x10000000000000, 0x7FEFFFFFFFFFFFFF,
                         0x7FF0000000000000, 0x7FF0000000000001, 0x7FF8000000000000],
                        dtype=np.uint64)
    b = np.concatenate([b, b32, specials])
    return np.unique(np.concatenate([b, b | np.uint64(1 << 63)]))


def random_bits32(n: int, seed: int, fmt: str | None = None) -> np.ndarray:
    """``n`` uint32 patterns: half uniform over all 2**32, half with the exponent drawn from
    the format's range +-4 binades (where the codes change)."""
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 1 << 32, n // 2, dtype=np.uint64).astype(np.uint32)
    lo, hi = (-30, 20) if fmt is None else _erange(fmt)
    e = rng.integers(lo + 127, hi + 128, n - n // 2).astype(np.uint32)
    m = rng.integers(0, 1 << 23, n - n // 2, dtype=np.uint32)
    s = rng.integers(0, 2, n - n // 2, dtype=np.uint32) << np.uint32(31)
    return np.concatenate([a, s | (e << np.uint32(23)) | m])


def random_float64(n: int, seed: int, fmt: str | None = None) -> np.ndarray:
    """``n`` float64 values spread over the format's range (53-bit significands, so that
    rounding directly from float64 is exercised), plus 1/8 uniform random bit patterns."""
    rng = np.random.default_rng(seed)
    lo, hi = (-30, 20) if fmt is None else _erange(fmt)
    k = n - n // 8
    x = np.ldexp(1.0 + rng.random(k), rng.integers(lo, hi + 1, k))
    x *= rng.choice([-1.0, 1.0], k)
    u = rng.integers(0, 1 << 64, n // 8, dtype=np.uint64).view(np.float64)
    return np.concatenate([x, u])


def _erange(fmt: str) -> tuple[int, int]:
    return {"hif8": (-26, 17), "e4m3": (-13, 10), "e5m2": (-20, 17)}.get(fmt, (-30, 20))


def count_code_mismatches(got, want) -> int:
    """Codes compared as integers."""
    return int(np.count_nonzero(np.asarray(got) != np.asarray(want)))


def count_value_mismatches(got, want) -> int:
    """float32 values compared bit for bit, NaN by class (any NaN equals any NaN)."""
    g, w = np.asarray(got, np.float32), np.asarray(want, np.float32)
    gn, wn = np.isnan(g), np.isnan(w)
    same = (g.view(np.uint32) == w.view(np.uint32)) | (gn & wn)
    return int(np.count_nonzero(~same))


def nvfp4_mismatches(x: np.ndarray, t, kw: dict) -> int:
    """Mismatches of ``lp.encode(t, "nvfp4", **kw)`` on the tensor ``t`` (the device path: a
    CUDA tensor, or a CPU one with ``ops.TRITON_ON_CPU``) against the CPU path on ``x``, the same
    values as a NumPy array: codes, scale codes, the tensor scale's bits, decode and quantize
    values, and for an even last axis the packed bytes and their decode."""
    import torch

    def host(a):
        assert a.device == t.device  # computed on the input's device
        return a.cpu().numpy()

    q, w = lp.encode(t, "nvfp4", **kw), lp.encode(x, "nvfp4", **kw)
    ts = q.tensor_scale.item() if isinstance(q.tensor_scale, torch.Tensor) else q.tensor_scale
    v = lp.decode(w)
    bad = (count_code_mismatches(host(q.codes), w.codes)
           + count_code_mismatches(host(q.scales), w.scales)
           + int(np.float32(ts).view(np.uint32) != np.float32(w.tensor_scale).view(np.uint32))
           + count_value_mismatches(host(lp.decode(q)), v)
           + count_value_mismatches(host(lp.quantize(t, "nvfp4", **kw)), v))
    if x.shape[-1] % 2 == 0:
        qp, wp = lp.encode(t, "nvfp4", packed=True, **kw), lp.encode(x, "nvfp4", packed=True, **kw)
        bad += (count_code_mismatches(host(qp.codes), wp.codes)
                + count_value_mismatches(host(lp.decode(qp)), v))
    return bad


def mx_blocks(rows: int, n: int, seed: int, dtype=np.float32) -> np.ndarray:
    """Random MX rows with edge blocks: mixed magnitudes per row, zeros, Inf, NaN, tiny and
    subnormal rows, an all-zero row, rows at a power of two and just below one."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, n)) * np.exp2(rng.integers(-40, 40, (rows, 1)))
    x[rng.random((rows, n)) < 0.01] = np.inf
    x[rng.random((rows, n)) < 0.01] = -np.inf
    x[rng.random((rows, n)) < 0.005] = np.nan
    x[rng.random((rows, n)) < 0.05] = 0.0
    if rows > 8:
        x[1] = np.exp2(rng.integers(-150, -120, n))  # float32 subnormals and tiny normals
        x[2] = 0.0
        x[3] = 448.0 * np.exp2(rng.integers(-10, 0, n))
        x[4] = np.nextafter(np.float32(512.0), np.float32(0)) * rng.random(n)
        x[5, ::3] = 465.0
        x[6] = rng.standard_normal(n) * 1e-38
        x[7] = rng.standard_normal(n) * 2.0**-1000  # float64 tiny (0 in float32)
    return x.astype(dtype)


def int_inputs(shape, seed: int, dtype=np.float32) -> np.ndarray:
    """Random INT inputs: mixed signs and scales per row, zeros, +-Inf, a constant slice."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape) * np.exp2(rng.integers(-6, 6, shape[:1] + (1,) * (len(shape)
                                                                                  - 1)))
    flat = x.reshape(-1)
    flat[rng.random(flat.size) < 0.01] = np.inf
    flat[rng.random(flat.size) < 0.01] = -np.inf
    flat[rng.random(flat.size) < 0.03] = 0.0
    if shape[0] > 2:
        x[1] = 0.0
        x[2] = 0.75
    return x.astype(dtype)


NVFP4_N = 16 * 8 + 7  # elements per nvfp4_rows row: eight blocks of 16 and a partial one


def nvfp4_rows(rows: int, seed: int, dtype=np.float32) -> np.ndarray:
    """Random NVFP4 rows of :data:`NVFP4_N` elements, each row at its own magnitude in
    2**-140 .. 2**125 (block scales clamped at 2**-6 or saturated at 448, elements that
    overflow ``x * (1 / s)``), with zeros, a zero block every third row, NaN, +Inf and -Inf
    elements, an all-NaN and an all-Inf block, and Inf in the partial last block."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, NVFP4_N)) * np.exp2(rng.integers(-140, 126, (rows, 1)))
    x[rng.random(x.shape) < 0.05] = 0.0
    x[::3, 32:48] = 0.0
    x[1::5, 40] = np.nan
    x[2::5, 70] = np.inf
    x[3::5, 100] = -np.inf
    x[4::7, 112:128] = np.nan
    x[5::7, 16:32] = -np.inf
    x[0, -3:] = np.inf
    return x.astype(dtype)


# NVFP4 "tie" rows: the tensor amax 8 * 2688 makes the two-level tensor scale t = 8 exactly, so
# both levels see the same rounding boundaries
NVFP4_TIE_AMAX = 8 * 2688.0
E2M1_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)


def nvfp4_ties() -> np.ndarray:
    """NVFP4 blocks on the recipes' rounding boundaries, where a last-bit difference in any
    float32 step changes a code (rows of 128, one block of :data:`NVFP4_TIE_AMAX`): blocks
    whose amax / 6 (single level) or (amax / 6) / 8 (two level) is an E4M3 midpoint, and the
    blocks of its float32 neighbours; blocks whose scale ``s`` is an E4M3 value, holding
    ``s`` times every E2M1 midpoint and their float32 neighbours, both signs."""
    import ml_dtypes

    e4 = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    v = np.unique(e4[np.isfinite(e4) & (e4 >= 2.0**-6) & (e4 <= 56.0)])
    rng = np.random.default_rng(17)
    blocks = [np.full(16, NVFP4_TIE_AMAX)]
    for m in (v[1:] + v[:-1]) / 2:  # scale ties: amax = 48 m (exact in float32)
        a = np.float32(48.0 * m)
        for b in (np.nextafter(a, np.float32(0)), a, np.nextafter(a, np.float32(np.inf))):
            blk = rng.uniform(-1.0, 1.0, 16).astype(np.float32) * b
            blk[0] = b
            blocks.append(blk)
    mids = np.float32(E2M1_MIDPOINTS)
    for s in v:  # element ties: x = s8 * (E2M1 midpoint), s8 = 8 s the single-level scale
        s8 = np.float32(8.0 * s)
        els = np.concatenate([mids * s8, np.nextafter(mids * s8, np.float32(0)),
                              np.nextafter(mids * s8, np.float32(np.inf))])
        els = np.concatenate([els, -els])  # 42 elements: three blocks led by amax = 6 * s8
        for part in np.array_split(els, 3):
            blk = np.zeros(16, np.float32)
            blk[0] = np.float32(6.0) * s8
            blk[1:1 + part.size] = part
            blocks.append(blk)
    x = np.concatenate(blocks).astype(np.float32)
    x = np.concatenate([x, np.zeros(-x.size % 128, np.float32)])
    return x.reshape(-1, 128)
