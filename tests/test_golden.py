"""Golden vectors of formats.md 1.9 (HiF8, TA) and 2.4 (OCP E4M3 / E5M2, RNE), typed in from the
spec as float32 bit patterns and expected codes, plus the provisional HiF8 hybrid examples of
formats.md 1.6 and all 256 decodes against en-dtypes / ml_dtypes.

Every row is checked on the library's three float paths (float32 fast path, float32 generic
kernel, float64 input), for codes and fused ``quantize`` values, and against ``reference.py`` (so
the reference is anchored to the spec too).  Rows whose expected result is NaN are compared as
"any NaN code" (formats.md 2.4: any NaN code is correct).
"""

from __future__ import annotations

import math

import en_dtypes
import ml_dtypes
import numpy as np
import pytest
from naive import formats as R

import lowprec as lp
from lowprec.formats.hif8 import HIF8_SPEC
from lowprec.formats.minifloat import SPECS, run_kernel

KERNEL_SPECS = {"hif8": HIF8_SPEC, **SPECS}
INF = math.inf
NAN = math.nan

# formats.md 1.9: (row, float32 bits, TA non-sat code, decoded value, TA saturating code)
HIF8_GOLDEN = [
    ("H1", 0x00000000, 0x00, 0.0, 0x00),
    ("H2", 0x80000000, 0x00, 0.0, 0x00),
    ("H3", 0x3F800000, 0x08, 1.0, 0x08),
    ("H4", 0xBF800000, 0x88, -1.0, 0x88),
    ("H5", 0x3F880000, 0x09, 1.125, 0x09),
    ("H6", 0x3F980000, 0x0A, 1.25, 0x0A),
    ("H7", 0x3FF80000, 0x10, 2.0, 0x10),
    ("H8", 0x40000000, 0x10, 2.0, 0x10),
    ("H9", 0x3F000000, 0x18, 0.5, 0x18),
    ("H10", 0x40400000, 0x14, 3.0, 0x14),
    ("H11", 0x3F400000, 0x1C, 0.75, 0x1C),
    ("H12", 0x40800000, 0x20, 4.0, 0x20),
    ("H13", 0x3E800000, 0x30, 0.25, 0x30),
    ("H14", 0x41400000, 0x2C, 12.0, 0x2C),
    ("H15", 0x41780000, 0x40, 16.0, 0x40),
    ("H16", 0x41A00000, 0x41, 20.0, 0x41),
    ("H17", 0x41B00000, 0x42, 24.0, 0x42),
    ("H18", 0x42C80000, 0x4A, 96.0, 0x4A),
    ("H19", 0x3DCCCCCD, 0x52, 1.5 * 2.0**-4, 0x52),
    ("H20", 0x43800000, 0x60, 256.0, 0x60),
    ("H21", 0x43C00000, 0x61, 384.0, 0x61),
    ("H22", 0x43E00000, 0x62, 512.0, 0x62),
    ("H23", 0x43411383, 0x4E, 192.0, 0x4E),
    ("H24", 0x47000000, 0x6E, 32768.0, 0x6E),
    ("H25", 0x471FFFFF, 0x6E, 32768.0, 0x6E),
    ("H26", 0x47200000, 0x6F, INF, 0x6E),
    ("H27", 0x47800000, 0x6F, INF, 0x6E),
    ("H28", 0xC9742400, 0xEF, -INF, 0xEE),
    ("H29", 0x7F800000, 0x6F, INF, 0x6E),
    ("H30", 0xFF800000, 0xEF, -INF, 0xEE),
    ("H31", 0x7FC00000, 0x80, NAN, 0x80),
    ("H32", 0xFFC00000, 0x80, NAN, 0x80),
    ("H33", 0x38000000, 0x7E, 2.0**-15, 0x7E),
    ("H34", 0x38400000, 0x7F, 1.5 * 2.0**-15, 0x7F),
    ("H35", 0x38600000, 0x7C, 2.0**-14, 0x7C),
    ("H36", 0x37800000, 0x07, 2.0**-16, 0x07),
    ("H37", 0x37C00000, 0x7E, 2.0**-15, 0x7E),
    ("H38", 0x37B33333, 0x07, 2.0**-16, 0x07),
    ("H39", 0x34800000, 0x01, 2.0**-22, 0x01),
    ("H40", 0x34000000, 0x01, 2.0**-22, 0x01),
    ("H41", 0x33FFFFFF, 0x00, 0.0, 0x00),
    ("H42", 0x00000001, 0x00, 0.0, 0x00),
    ("H43", 0xB4A10FB0, 0x81, -(2.0**-22), 0x81),
]

# formats.md 2.4: (row, float32 bits, E4M3 non-SAT, E4M3 SAT, E5M2 non-SAT, E5M2 SAT,
#                  torch 2.13 e4m3fn, torch 2.13 e5m2).  NaN entries hold one valid NaN code.
FP8_GOLDEN = [
    ("F1", 0x00000000, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00),
    ("F2", 0x80000000, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80),
    ("F3", 0x3F800000, 0x38, 0x38, 0x3C, 0x3C, 0x38, 0x3C),
    ("F4", 0x3F880000, 0x38, 0x38, 0x3C, 0x3C, 0x38, 0x3C),
    ("F5", 0x3F980000, 0x3A, 0x3A, 0x3D, 0x3D, 0x3A, 0x3D),
    ("F6", 0x3F900000, 0x39, 0x39, 0x3C, 0x3C, 0x39, 0x3C),
    ("F7", 0x3FB00000, 0x3B, 0x3B, 0x3E, 0x3E, 0x3B, 0x3E),
    ("F8", 0x3DCCCCCD, 0x1D, 0x1D, 0x2E, 0x2E, 0x1D, 0x2E),
    ("F9", 0xC0533333, 0xC5, 0xC5, 0xC3, 0xC3, 0xC5, 0xC3),
    ("F10", 0x43E00000, 0x7E, 0x7E, 0x5F, 0x5F, 0x7E, 0x5F),
    ("F11", 0x43E80000, 0x7E, 0x7E, 0x5F, 0x5F, 0x7E, 0x5F),
    ("F12", 0x43E80001, 0x7F, 0x7E, 0x5F, 0x5F, 0x7E, 0x5F),
    ("F13", 0x43F00000, 0x7F, 0x7E, 0x60, 0x60, 0x7E, 0x60),
    ("F14", 0x49742400, 0x7F, 0x7E, 0x7C, 0x7B, 0x7E, 0x7C),
    ("F15", 0x47600000, 0x7F, 0x7E, 0x7B, 0x7B, 0x7E, 0x7B),
    ("F16", 0x476FFFFF, 0x7F, 0x7E, 0x7B, 0x7B, 0x7E, 0x7B),
    ("F17", 0x47700000, 0x7F, 0x7E, 0x7C, 0x7B, 0x7E, 0x7C),
    ("F18", 0x7F800000, 0x7F, 0x7E, 0x7C, 0x7B, 0x7E, 0x7C),
    ("F19", 0xFF800000, 0xFF, 0xFE, 0xFC, 0xFB, 0xFE, 0xFC),
    ("F20", 0x7FC00000, 0x7F, 0x7F, 0x7E, 0x7E, 0x7F, 0x7F),
    ("F21", 0x3C800000, 0x08, 0x08, 0x24, 0x24, 0x08, 0x24),
    ("F22", 0x3B000000, 0x01, 0x01, 0x18, 0x18, 0x01, 0x18),
    ("F23", 0x3A800000, 0x00, 0x00, 0x14, 0x14, 0x00, 0x14),
    ("F24", 0x3AC00000, 0x01, 0x01, 0x16, 0x16, 0x01, 0x16),
    ("F25", 0x38800000, 0x00, 0x00, 0x04, 0x04, 0x00, 0x04),
    ("F26", 0x37800000, 0x00, 0x00, 0x01, 0x01, 0x00, 0x01),
    ("F27", 0x37000000, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00),
    ("F28", 0x37C00000, 0x00, 0x00, 0x02, 0x02, 0x00, 0x02),
    ("F29", 0x00000001, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00),
]

# formats.md 1.6 provisional hybrid examples: (float32 bits, TA code, hybrid code)
HIF8_HYBRID = [
    (0x41A80000, 0x41, 0x42),  # 21.0: TA 20, HR 24
    (0x42C80000, 0x4A, 0x4B),  # 100.0: TA 96, HR 112
    (0x36A7C5AC, 0x05, 0x06),  # 5e-6: TA 2^-18, HR 2^-17
    (0x3F880000, 0x09, 0x09),  # 1.0625: |E| < 4, TA in both
    (0x41A00000, 0x41, 0x41),  # 20.0 exact: no rounding (exact-value guard)
]


def _f32(bits: int) -> np.ndarray:
    return np.array([bits], dtype=np.uint32).view(np.float32)


def _rows(fmt: str, sat: bool):
    """``(row, bits, expected code)`` for one format and saturation flag."""
    if fmt == "hif8":
        return [(r[0], r[1], r[4] if sat else r[2]) for r in HIF8_GOLDEN]
    col = {("e4m3", False): 2, ("e4m3", True): 3, ("e5m2", False): 4, ("e5m2", True): 5}
    return [(r[0], r[1], r[col[fmt, sat]]) for r in FP8_GOLDEN]


def _same(fmt: str, got: int, expected: int) -> bool:
    ref = R.REF[fmt]
    if ref.is_nan_code(expected):
        return ref.is_nan_code(got)
    return got == expected


def _run_path(x32: np.ndarray, fmt: str, mode: str, sat: bool, path: str, want_value: bool):
    if path == "f32":
        f = lp.quantize if want_value else lp.encode
        return f(x32, fmt, mode, sat)
    if path == "f64":
        f = lp.quantize if want_value else lp.encode
        return f(x32.astype(np.float64), fmt, mode, sat)
    out = np.empty(x32.shape, np.float32 if want_value else np.uint8)
    mode_id = int(lp.Rounding[mode.upper()])
    run_kernel(KERNEL_SPECS[fmt], x32.view(np.uint32), out, mode_id, sat, generic=True)
    return out


PATHS = ["f32", "f32_generic", "f64"]


@pytest.mark.parametrize("sat", [False, True], ids=["nonsat", "sat"])
@pytest.mark.parametrize("fmt", R.FORMATS)
def test_golden_reference(fmt, sat):
    """reference.py reproduces every golden row (anchors the reference to the spec)."""
    mode = "nearest_away" if fmt == "hif8" else "nearest_even"
    for row, bits, exp in _rows(fmt, sat):
        got = R.round_ref(_f32(bits)[0], fmt, mode, sat)
        assert _same(fmt, got, exp), f"{row}: reference gave {got:#04x}, spec {exp:#04x}"


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("sat", [False, True], ids=["nonsat", "sat"])
@pytest.mark.parametrize("fmt", R.FORMATS)
def test_golden_codes(fmt, sat, path):
    mode = "nearest_away" if fmt == "hif8" else "nearest_even"
    rows = _rows(fmt, sat)
    x = np.array([r[1] for r in rows], dtype=np.uint32).view(np.float32)
    got = np.asarray(_run_path(x, fmt, mode, sat, path, False))
    bad = [f"{row} ({bits:#010x}): expected {exp:#04x}, got {int(g):#04x}"
           for (row, bits, exp), g in zip(rows, got, strict=True)
           if not _same(fmt, int(g), exp)]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("path", ["f32", "f64"])
@pytest.mark.parametrize("sat", [False, True], ids=["nonsat", "sat"])
@pytest.mark.parametrize("fmt", R.FORMATS)
def test_golden_values(fmt, sat, path):
    """quantize returns exactly the decoded golden code (NaN rows: NaN)."""
    mode = "nearest_away" if fmt == "hif8" else "nearest_even"
    rows = _rows(fmt, sat)
    x = np.array([r[1] for r in rows], dtype=np.uint32).view(np.float32)
    got = np.asarray(_run_path(x, fmt, mode, sat, path, True))
    assert got.dtype == np.float32
    bad = []
    for (row, bits, exp), g in zip(rows, got, strict=True):
        want = np.float32(R.decode_ref(exp, fmt))
        ok = np.isnan(g) if np.isnan(want) else g.view(np.uint32) == want.view(np.uint32)
        if not ok:
            bad.append(f"{row} ({bits:#010x}): expected {want!r}, got {g!r}")
    assert not bad, "\n".join(bad)


def test_hif8_golden_decoded_column():
    """The 'decoded' column of formats.md 1.9 equals lp.decode of the TA code."""
    codes = np.array([r[2] for r in HIF8_GOLDEN], dtype=np.uint8)
    got = lp.decode(codes, "hif8")
    for (row, _bits, code, dec, _s), g in zip(HIF8_GOLDEN, got, strict=True):
        if math.isnan(dec):
            assert np.isnan(g), row
        else:
            assert g == np.float32(dec), f"{row}: code {code:#04x} decodes to {g}, spec {dec}"


def test_fp8_golden_torch_column():
    """The torch 2.13 column of formats.md 2.4: torch e4m3fn equals our saturating E4M3, torch
    e5m2 our non-saturating E5M2 (and torch itself matches the spec's column)."""
    torch = pytest.importorskip("torch")
    x = np.array([r[1] for r in FP8_GOLDEN], dtype=np.uint32).view(np.float32)
    t = torch.from_numpy(x)
    t43 = t.to(torch.float8_e4m3fn).view(torch.uint8).numpy()
    t52 = t.to(torch.float8_e5m2).view(torch.uint8).numpy()
    ours43 = lp.encode(x, "e4m3", "nearest_even", True)
    ours52 = lp.encode(x, "e5m2", "nearest_even", False)
    for i, r in enumerate(FP8_GOLDEN):
        assert _same("e4m3", int(t43[i]), r[6]), f"{r[0]}: torch e4m3fn {t43[i]:#04x}"
        assert _same("e5m2", int(t52[i]), r[7]), f"{r[0]}: torch e5m2 {t52[i]:#04x}"
        assert _same("e4m3", int(ours43[i]), r[6]), f"{r[0]}: e4m3 sat {ours43[i]:#04x}"
        assert _same("e5m2", int(ours52[i]), r[7]), f"{r[0]}: e5m2 {ours52[i]:#04x}"


@pytest.mark.parametrize("path", ["f32", "f32_generic"])
def test_hif8_hybrid_examples(path):
    """Provisional HR examples of formats.md 1.6 (our reading; not normative)."""
    x = np.array([b for b, _, _ in HIF8_HYBRID], dtype=np.uint32).view(np.float32)
    ta = [e for _, e, _ in HIF8_HYBRID]
    hr = [e for _, _, e in HIF8_HYBRID]
    if path == "f32":
        got_hr = lp.encode(x, "hif8", "hybrid")
    else:
        got_hr = np.empty(x.shape, np.uint8)
        run_kernel(HIF8_SPEC, x.view(np.uint32), got_hr, int(lp.Rounding.HYBRID), False,
                   generic=True)
    assert [int(c) for c in got_hr] == hr
    assert [int(c) for c in lp.encode(x, "hif8", "nearest_away")] == ta
    assert [R.round_ref(v, "hif8", "hybrid") for v in x] == hr
    assert [R.round_ref(v, "hif8", "nearest_away") for v in x] == ta
    vals = lp.quantize(x, "hif8", "hybrid")
    assert [float(v) for v in vals] == [R.decode_ref(c, "hif8") for c in hr]


def test_hybrid_rejects_float64():
    with pytest.raises(ValueError, match="float32"):
        lp.encode(np.array([1.0]), "hif8", "hybrid")


# ------------------------------------------------------------------------------------------
# All 256 decodes

PEERS = {"hif8": en_dtypes.hifloat8, "e4m3": ml_dtypes.float8_e4m3fn,
         "e5m2": ml_dtypes.float8_e5m2}


@pytest.mark.parametrize("fmt", R.FORMATS)
def test_decode_all_codes(fmt):
    """lp.decode of all 256 codes == peer library == reference.py, bit for bit (NaN by class)."""
    codes = np.arange(256, dtype=np.uint8)
    ours = lp.decode(codes, fmt)
    assert ours.dtype == np.float32
    peer = codes.view(PEERS[fmt]).astype(np.float32)
    ref = np.array([R.decode_ref(c, fmt) for c in range(256)], dtype=np.float32)
    table = lp.get_format(fmt).values()
    for name, other in (("peer", peer), ("reference", ref), ("values()", table)):
        nan_o, nan_p = np.isnan(ours), np.isnan(other)
        assert np.array_equal(nan_o, nan_p), f"{name}: NaN codes differ"
        same = ours[~nan_o].view(np.uint32) == other[~nan_o].view(np.uint32)
        bad = np.flatnonzero(~nan_o)[~same]
        assert bad.size == 0, f"{name}: codes {[hex(c) for c in bad]} differ"


@pytest.mark.parametrize("fmt", R.FORMATS)
def test_reference_tables(fmt):
    """Counts and extremes of reference.py's tables match formats.md 1.2 / 2.1."""
    f = R.REF[fmt]
    nan = sum(f.is_nan_code(c) for c in range(256))
    expected = {
        # (positive finite non-zero values, NaN codes, max, min subnormal, virtual point)
        "hif8": (126, 1, 32768, 2.0**-22, 49152),
        "e4m3": (126, 2, 448, 2.0**-9, 480),
        "e5m2": (123, 6, 57344, 2.0**-16, 65536),
    }[fmt]
    assert (len(f.values), nan, f.max, f.values[0], f.grid[-1]) == expected
    assert len(R.finite_values(fmt)) == 2 * expected[0] + 1


@pytest.mark.parametrize("fmt", R.FORMATS)
def test_canonical_nan_and_zero_codes(fmt):
    """The documented NaN codes (e4m3 0x7F|sign, e5m2 0x7E|sign, hif8 0x80) and zero codes."""
    x = np.array([np.nan, -np.nan, 0.0, -0.0], dtype=np.float32)
    x[1] = -np.abs(x[1])
    exp = {"hif8": [0x80, 0x80, 0, 0], "e4m3": [0x7F, 0xFF, 0, 0x80],
           "e5m2": [0x7E, 0xFE, 0, 0x80]}[fmt]
    for sat in (False, True):
        assert [int(c) for c in lp.encode(x, fmt, saturate=sat)] == exp
        assert [int(c) for c in lp.encode(x.astype(np.float64), fmt, saturate=sat)] == exp
        assert [R.round_ref(v, fmt, "nearest_even", sat) for v in x] == exp
