"""Integer softmax baselines: I-ViT Shiftmax and I-BERT i-exp (specs/attention.md section 7).

Both papers replace ``exp`` by shifts (and, for I-BERT, a second-order polynomial) on integer
logits ``x_int`` with a float scale ``s`` (the logit is ``x_int * s``), and normalise with one
integer reciprocal per row.  The authors run them as float32 tensors that hold integers; this
module reproduces that float32 evaluation order by default and offers an exact integer
evaluation (``exact=True``).

I-ViT Shiftmax (:func:`ivit_shiftmax`, ``n = 15``), per row::

    x = x/s - rowmax                        x = x + floor(x/2) - floor(x/16)   (~ x * log2 e)
    x0 = floor(-1/s)                         x = max(x, n * x0)
    q = floor(x / x0)                        r = x - x0 q
    e = max(floor((r/2 - x0) * 2**(n - q)), 0)
    Z = min(sum e, 2**31 - 1)                f = floor(2**31 / Z)
    y = floor(e f / 2**(32 - out_bits))      (probability = y * 2**-(out_bits - 1))

I-BERT i-exp softmax (:func:`ibert_softmax`, ``n = 30``, ``x0 = -0.6931``), per row::

    x = x/s - rowmax                         x0i = floor(x0 / s)      x = max(x, n x0i)
    q = floor(x / x0i)                       r = x - x0i q
    bi = floor(b / s), ci = floor(c / s**2)  (a, b, c = 0.35815147, 0.96963238/a, 1/a)
    z = r (r + bi) + ci                      e = max(floor(z * 2**(n - q)), 0)
    s_e = a s**2 / 2**n                      s16 = max(e) s_e / 32767   (range of the tensor)
    m, k = frexp(s_e / s16)  (float64; m31 = round_half_up(m * 2**31), shift = 31 - k)
    e16 = clamp(RNE(e * m31 / 2**shift), -32768, 32767)
    f = floor(2**32 / sum e16)               y = floor(e16 f / 2**(32 - out_bits))
                                             (probability = y * 2**-out_bits)

Float32 evaluation order (default, ``exact=False``): every arithmetic step above is one
correctly rounded float32 operation, in the order written, as the published PyTorch code
computes it: ``x / s`` is a float32 division; ``x0 / s`` and ``b / s`` are the float32
reciprocal ``fl(1/s)`` times the constant rounded to float32 (``Tensor.__rtruediv__``); ``s**2``
is ``fl(s * s)``; ``c / s**2`` is ``fl(fl(1 / fl(s*s)) * fl(c))``; ``n * x0`` and the products
``x0 * q``, ``r (r + bi)``, ``e * f`` are float32 products; powers of two are exact.  The row sums
are float32 sums taken left to right (torch's reduction order is not specified; ours is
sequential).  I-ViT's clamp ``min(Z, 2**31 - 1)`` is ``min(Z, 2**31)`` in float32 (2**31 - 1
rounds to 2**31), and ``2**31 / Z`` is ``fl(fl(1/Z) * 2**31) = fl(2**31 / Z)``.  I-BERT's
16-bit requantisation follows the spec's model: ``s_e = fl(fl(a) * fl(s*s)) / 2**30``,
``s16 = fl(fl(max(e) * s_e) / 32767)``, ``m31`` and ``shift`` from ``math.frexp`` of the float64
ratio ``s_e / s16``, ``e16 = RNE(fl64(e * m31) / 2**shift)``; the code's round trip
``fl(fl(e16 * s16) / s16)`` (identity up to an ulp) is not modelled.

Exact integer evaluation (``exact=True``): ``x_int = RNE(x / s)`` (float64 quotient; it must fit
int32), the constants ``x0i = floor(x0 / s)``, ``bi``, ``ci`` (and I-ViT's ``x0 = floor(-1/s)``)
are exact floors of the real quotients of the float64 constants by the float32 ``s``
(``fractions.Fraction``), every other step is an exact integer operation (``floor(x/2)`` is an
arithmetic shift, ``floor`` of the half-integer ``(r/2 - x0) 2**(n-q)`` is exact), ``Z`` is
exact (I-ViT: clamped to ``2**31 - 1``).  I-BERT's multiplier comes from the float64 ratio
``32767 / max(e)`` (``max(e)`` evaluated in float64) and ``e16 = RNE(z m31 / 2**(shift - n + q))``
is computed exactly with a 93-bit product.  The two evaluations agree except in rare entries:
float32 rounding of large ``e``, and ``fl(x / s)`` landing just below an integer, which moves
a floor; with fine scales (s <= 0.05, int8 logits) under 1 % of the entries differ, by one
unit; with a coarse scale (s = 0.3) about 2 % differ, by up to several units.

Masking: entries where ``mask`` is False or ``x`` is ``-inf`` take no part (they give 0 and are
left out of the max and the sums).  The published code has no mask argument: a ``-inf`` logit
there is clamped to the floor ``n * x0`` and gets a small non-zero probability; ours gives 0.
A row with no visible entry, or with NaN or ``+inf`` among its visible entries, gives NaN.

Attention schemes ``ivit`` and ``ibert`` (like ``quant_only`` of section 3): q, k, v per-tensor
symmetric int8 (``s = max|x| / 127``, RNE, ``[-127, 127]``), ``S = q8 k8^T`` exact int32, the
surrogate on ``x = fl32(S * s_in)`` with input scale ``s_in = fl32(s_q s_k scale)`` (so ``x``
holds the integer logit times its scale, exactly while ``|S| < 2**29``; a finite additive mask
is added in float64 before that one rounding: ``fl32(S s_in + mask)``), ``P = y`` (integer),
``O = P v8`` exact int32, output ``O * s_v * 2**-(out_bits - 1)`` (I-ViT) or
``O * s_v * 2**-out_bits`` (I-BERT).

Option ``logit_bits``: requantise the logits per tensor to that many bits first
(``s_x = max|logit| / (2**(b-1) - 1)``, RNE, clamped to the symmetric range), as I-ViT's model
does with its 8-bit ``QuantAct`` (``qact_attn1``) before ``IntSoftmax``.  Defaults differ per
scheme:

* ``ivit``: ``logit_bits=8, out_bits=16``, the configuration of I-ViT's published ViT/DeiT
  models (8-bit logits, ``IntSoftmax(output_bit=16)``).  Shiftmax needs a coarse logit
  scale: its exponentials reach ``e = |x0| 2**15`` with ``|x0| = ceil(1/s)`` and its
  normalisation is ``f = floor(2**31 / Z)``, so with the fine scale of raw int32 logits
  (``s = s_q s_k scale``, about 1e-4 for int8 inputs of amplitude 4) ``Z`` is ~``2**28`` per
  dominant key, ``f`` keeps only a few bits, and ``Z`` passes ``2**31 - 1`` as soon as a few
  keys carry weight.  The clamp then gives ``f = 1`` and rows that sum to ``Z / 2**31 > 1``
  (the published code, spec section 7: kept, counted as ``sum_clamped``).  Measured on
  N(0, 1) inputs (d = 64, scale 1/8) with ``logit_bits=None, out_bits=8``: 369 of 394 rows
  clamp at L = 197, relative L2 error 1.05; 8.3 at L = 2048.  With the defaults no row
  clamps and the error is 0.038 (L = 197), 0.081 (L = 2048), 0.16 (L = 8192).  With 8-bit
  logits a row can still clamp, but only if ``L |x0| >= 2**16`` (``|x0| ~ 127 / max|logit|``)
  and the row is nearly flat, i.e. ``L >= ~516 max|logit|``.  Pass ``logit_bits=None,
  out_bits=8`` for the spec's literal composition (int32 logits, 8-bit output).
* ``ibert``: ``logit_bits=None, out_bits=8`` (I-BERT feeds its int32 scores to the softmax and
  requantises the exponentials to 16 bits itself, so it has no such limit).

Softmax surrogates ``ivit`` and ``ibert`` (``lp.softmax``): the scores are first quantised to
integers ``x_int = RNE(scores / scale)`` (``scale=None``: per-tensor int8, ``max|scores| / 127``,
clamped to [-127, 127]); the result is ``y * 2**-(out_bits - 1)`` (I-ViT) or ``y * 2**-out_bits``
(I-BERT) as float32 (rows do not sum to 1 exactly).

Statistics: :class:`BaselineStats` (rows, empty and NaN rows, entries clamped at the exponent
floor, I-ViT sums clamped at 2**31 - 1, I-BERT 16-bit requantisation clamps, visible entries
whose output is 0).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
from numba import prange

from ..formats._arrays import to_numpy
from ..formats._bits import F32_ABS, F32_EXP, f32_as_u32, u32_as_f32
from ..formats._jit import for_size, jit
from ..stats import Stats
from . import Scheme, register
from ._baselines_exact import (
    _NCOUNT,
    IBERT_E16_MAX,
    _ibert_exp_exact,
    _ibert_norm_exact,
    _ivit_exact,
)
from ._baselines_f32 import _ibert_exp_f32_par, _ibert_norm_f32_par, _ivit_f32_par
from ._check import bool_mask, check_bool, check_choice, check_int, check_real
from ._int8 import INT8_QMAX, check_positive_scale, quantize_problem, unnormalized
from ._surrogate import exact_attend, fill_logits, logits_f32, visibility
from .problem import MASK_FLOOR, SCALE_SCOPES, Problem, sized, softmax_rows

# --------------------------------------------------------------------------------------------
# Constants (specs/attention.md section 7)

IVIT_N = 15  # I-ViT shift exponent n ("sufficiently large integer")
IBERT_N = 30  # I-BERT shift exponent n
IBERT_X0 = -0.6931  # I-BERT x0 = -ln 2 (as written in the paper's code)
IBERT_A = 0.35815147  # I-BERT polynomial a (a (x + b)**2 + c approximates exp on [-ln2, 0])
IBERT_B = 0.96963238 / IBERT_A  # b, float64 as the code computes it
IBERT_C = 1.0 / IBERT_A  # c, float64 as the code computes it
IVIT_ATTN_LOGIT_BITS = 8  # scheme "ivit": I-ViT's 8-bit QuantAct before IntSoftmax
IVIT_ATTN_OUT_BITS = 16  # scheme "ivit": I-ViT's models use IntSoftmax(output_bit=16)
IBERT_M_BITS = 31  # mantissa bits of the fixed-point multiplier (batch_frexp max_bit)
IBERT_F_BITS = 32  # I-BERT normalises with floor(2**32 / sum)
IVIT_F_BITS = 31  # I-ViT normalises with floor(2**31 / sum)
OUT_BITS_MIN = 2
OUT_BITS_MAX = 16
SCALE_MIN = 2.0**-40  # smallest input scale accepted (keeps every constant finite and normal)
EXACT_X_MAX = 2**31  # exact mode: |x / s| must fit int32
IBERT_EXACT_C_MAX = 2**61  # exact mode: ci must stay below this (int64 polynomial)
LOGIT_BITS_MIN, LOGIT_BITS_MAX = 2, 24  # option logit_bits
ROW_BLOCKS = 64  # row blocks of the parallel drivers (each with its own counters)
_NO_CODES = np.zeros((0, 0), dtype=np.uint8)
CODED_MAX = 255  # the pipeline's logits use per-value tables up to this many values




@dataclass
class BaselineStats(Stats):
    """Counts of the I-ViT / I-BERT integer softmax (specs/attention.md sections 7 and 8).

    Attributes:
        calls: softmax evaluations merged.
        rows: rows processed.
        empty_rows: rows with no visible entry (NaN output).
        nan_rows: rows with NaN or ``+inf`` among their visible entries (NaN output).
        floor_clamped: visible entries clamped to the exponent floor ``n * x0`` (their exp
            underflows to the floor value ``2**-n``).
        sum_clamped: I-ViT rows whose sum of ``e`` reached ``2**31 - 1`` and was clamped
            (then ``f = 1`` and the row's probabilities sum to about ``Z / 2**31 > 1``).
        requant_clamped: I-BERT entries whose 16-bit requantisation clamped.
        zero_outputs: visible entries whose output ``y`` is 0 (probability underflow).
        unnormalized_rows: attention rows that see a key and whose integer probabilities sum
            more than 10 % away from 1 (I-ViT's floor reciprocal ``f = floor(2**31 / Z)`` with
            few bits on fine logit scales, 8-bit output on long flat rows), a hazard.
    """

    calls: int = 0
    rows: int = 0
    empty_rows: int = 0
    nan_rows: int = 0
    floor_clamped: int = 0
    sum_clamped: int = 0
    requant_clamped: int = 0
    zero_outputs: int = 0
    unnormalized_rows: int = 0

    _COUNTERS = ("empty_rows", "nan_rows", "floor_clamped", "sum_clamped", "requant_clamped",
                 "zero_outputs")  # the kernels' count slots, in order
    _hazards = ("nan_rows", "sum_clamped", "requant_clamped", "unnormalized_rows")
    _key = ("floor_clamped", "zero_outputs")



def _stats_from(counts: np.ndarray, rows: int) -> BaselineStats:
    c = counts.reshape((-1, _NCOUNT)).sum(axis=0)
    return BaselineStats(calls=1, rows=rows,
                         **{n: int(c[i]) for i, n in enumerate(BaselineStats._COUNTERS)})


# --------------------------------------------------------------------------------------------
# validation


def _check_scale(scale) -> np.float32:
    check_real(scale, "scale", finite=False)
    s = np.float32(scale)
    if not (np.isfinite(s) and float(s) >= SCALE_MIN):
        raise ValueError(
            f"scale must be finite and >= 2**-40 after rounding to float32, got {scale!r}"
        )
    return s


def _check_out_bits(out_bits) -> int:
    return check_int(out_bits, "out_bits", OUT_BITS_MIN, OUT_BITS_MAX)


def _check_logit_bits(b) -> int | None:
    if b is None:
        return None
    return check_int(b, "logit_bits", LOGIT_BITS_MIN, LOGIT_BITS_MAX,
                     what=f"None or an int in [{LOGIT_BITS_MIN}, {LOGIT_BITS_MAX}]")


def _rows_and_mask(x, mask):
    rows, restore = softmax_rows(x, -1, "x")
    if mask is None:
        return rows, restore, np.zeros((0, 0), dtype=np.bool_)
    shape = np.shape(to_numpy(x, "x")[0])
    return rows, restore, bool_mask(mask, shape).reshape(rows.shape)


def _floor_frac(num: float, s: np.float32) -> int:
    """Exact ``floor(num / s)`` of the float64 ``num`` and float32 ``s``."""
    return math.floor(Fraction(num) / Fraction(float(s)))


def _frexp_multiplier(ratio: float) -> tuple[int, int]:
    """Fixed-point ``ratio = m31 / 2**shift``: float64 frexp, 31-bit mantissa rounded half up
    (I-BERT's ``batch_frexp``)."""
    m, ex = math.frexp(ratio)
    m31 = math.floor(m * 2.0**IBERT_M_BITS + 0.5)  # exact: m * 2**31 + 0.5 is representable
    return int(m31), IBERT_M_BITS - ex


def _div_py(a: float, b: np.float32) -> np.float32:
    """One float32 division (numpy float32 scalars are correctly rounded)."""
    return np.float32(np.float32(a) / np.float32(b))


def _check_exact_range(rows: np.ndarray, s: np.float32) -> None:
    fin = rows[np.isfinite(rows)]
    if fin.size and float(np.abs(fin).max()) / float(s) >= EXACT_X_MAX - 0.5:
        raise ValueError(
            "exact=True needs integer logits x / scale that fit int32; got max |x / scale| = "
            f"{float(np.abs(fin).max()) / float(s):.4g}"
        )


# --------------------------------------------------------------------------------------------
# cores: validated float32 rows (R, L), the visibility (0, 0) = all, in-place output allowed


def _ivit_core(rows: np.ndarray, vis: np.ndarray, s: np.float32, ob: int, exact: bool,
               y: np.ndarray, codes=None) -> np.ndarray:
    """I-ViT Shiftmax of validated rows into ``y`` (may be ``rows`` itself); returns the
    counters ``(blocks, _NCOUNT)``.  ``codes = (uint8 (R, L), float32 values)`` says that every
    entry is one of few values (the pipeline's 8-bit logits): ``e`` is then computed per value
    (float32 order only)."""
    if exact:
        counts = np.zeros((1, _NCOUNT), dtype=np.int64)
        _check_exact_range(rows, s)
        x0 = _floor_frac(-1.0, s)
        _ivit_exact(rows, vis, float(s), np.int64(x0), IVIT_N, ob, y, counts[0])
        return counts
    counts = np.zeros((ROW_BLOCKS, _NCOUNT), dtype=np.int64)
    x0 = np.float32(np.floor(-_div_py(1.0, s)))  # -(1/s): reciprocal then * -1
    nx0 = np.float32(np.float32(IVIT_N) * x0)
    cd, xv = codes if codes is not None else (_NO_CODES, np.zeros(0, np.float32))
    for_size(_ivit_f32_par, rows.size)(rows, cd, xv, vis, s, x0, nx0, IVIT_N, ob, y, counts)
    return counts


def _ibert_consts(s: np.float32, exact: bool):
    """I-BERT's integer constants for scale ``s`` (ValueError when out of range)."""
    if exact:
        x0i = _floor_frac(IBERT_X0, s)
        bi = _floor_frac(IBERT_B, s)
        ci = math.floor(Fraction(IBERT_C) / Fraction(float(s)) ** 2)
        if ci < 1:
            raise ValueError(f"scale {float(s)!r} is too large for I-BERT: floor(c / s**2) = 0")
        if ci >= IBERT_EXACT_C_MAX:
            raise ValueError(
                f"scale {float(s)!r} is too small for exact I-BERT evaluation in int64: "
                f"floor(c / s**2) = {ci} >= 2**61; use exact=False"
            )
        return x0i, bi, ci
    inv = _div_py(1.0, s)  # float32 reciprocal fl(1/s)
    x0i = np.float32(np.floor(np.float32(inv * np.float32(IBERT_X0))))
    bi = np.float32(np.floor(np.float32(inv * np.float32(IBERT_B))))
    with np.errstate(over="ignore"):  # s**2 overflows to inf: ci = 0, refused below
        s2 = np.float32(s * s)
    ci = np.float32(np.floor(np.float32(_div_py(1.0, s2) * np.float32(IBERT_C))))
    if ci < 1:
        raise ValueError(f"scale {float(s)!r} is too large for I-BERT: floor(c / s**2) = 0")
    return x0i, bi, ci


def _ibert_core(rows: np.ndarray, vis: np.ndarray, s: np.float32, ob: int, exact: bool,
                y: np.ndarray) -> np.ndarray:
    """I-BERT softmax of validated rows into ``y`` (may be ``rows`` itself); returns the
    counters ``(blocks, _NCOUNT)``."""
    R, L = rows.shape
    rowflag = np.zeros(R, dtype=np.int8)
    x0i, bi, ci = _ibert_consts(s, exact)
    if exact:
        counts = np.zeros((1, _NCOUNT), dtype=np.int64)
        _check_exact_range(rows, s)
        zq = np.empty((R, L), dtype=np.int64)
        qq = np.zeros((R, L), dtype=np.int64)
        emax = _ibert_exp_exact(rows, vis, float(s), np.int64(x0i), np.int64(bi),
                                np.int64(ci), IBERT_N, zq, qq, rowflag, counts[0])
        if emax > 0:
            m31, shift = _frexp_multiplier(IBERT_E16_MAX / emax)
            _ibert_norm_exact(zq, qq, rowflag, np.int64(m31), shift, IBERT_N, ob, y, counts[0])
        else:
            y[:] = np.nan
        return counts
    counts = np.zeros((ROW_BLOCKS, _NCOUNT), dtype=np.int64)
    nx0 = np.float32(np.float32(IBERT_N) * x0i)
    s_e = np.float32(np.float32(np.float32(IBERT_A) * np.float32(s * s))
                     / np.float32(2.0**IBERT_N))
    emaxs = np.full(ROW_BLOCKS, -1.0, dtype=np.float32)
    e = y  # pass 1 writes e where y goes (a row's x is read before its e is written)
    for_size(_ibert_exp_f32_par, rows.size)(rows, vis, s, x0i, nx0, bi, ci, IBERT_N, e,
                                            rowflag, counts, emaxs)
    emax = emaxs.max()
    if emax > 0:
        s16 = np.float32(np.float32(emax * s_e) / np.float32(IBERT_E16_MAX))
        m31, shift = _frexp_multiplier(float(s_e) / float(s16))
        for_size(_ibert_norm_f32_par, e.size)(e, rowflag, float(m31), math.ldexp(1.0, -shift),
                                              ob, y, counts)
    else:
        y[:] = np.nan
    return counts


# --------------------------------------------------------------------------------------------
# Public softmax functions


def ivit_shiftmax(x, scale: float, out_bits: int = 8, *, exact: bool = False, mask=None,
                  return_stats: bool = False):
    """I-ViT Shiftmax on rows along the last axis (specs/attention.md section 7).

    Args:
        x: float32 array (numpy or CPU torch; float16/bfloat16/float64 are rounded to float32)
            holding ``x_int * scale``; ``-inf`` entries are masked.
        scale: the input scale ``s`` (positive, rounded to float32, >= 2**-40).
        out_bits: output bits (2..16); the output scale is ``2**-(out_bits - 1)``.
        exact: False (default): the published float32 evaluation order; True: exact integers
            (``x / s`` must round to integers that fit int32).
        mask: optional bool array broadcastable to ``x`` (True = take part).
        return_stats: also return a :class:`BaselineStats`.

    Returns:
        float32 array of ``x``'s shape holding the integer outputs ``y`` (0 for masked
        entries; NaN for rows without visible entry or with NaN/+inf), numpy or torch as ``x``;
        with ``return_stats`` a tuple ``(y, stats)``.

    Raises:
        TypeError: non-float ``x``, non-bool ``mask``/``exact``.
        ValueError: bad ``scale`` or ``out_bits``; exact mode with ``|x / s| >= 2**31``.

    Example::

        >>> s = 0.05
        >>> y = ivit_shiftmax(np.array([0.0, -0.5, 1.0], np.float32), s)
        >>> y * 2.0**-7          # approximate softmax probabilities
    """
    return _public_softmax(_ivit_core, x, scale, out_bits, exact, mask, return_stats)


def ibert_softmax(x, scale: float, out_bits: int = 8, *, exact: bool = False, mask=None,
                  return_stats: bool = False):
    """I-BERT i-exp integer softmax on rows along the last axis (specs/attention.md section 7).

    The 16-bit requantisation takes its range from the whole input (every row of ``x``), as
    the authors' ``QuantAct`` does on the current tensor.

    Args:
        x: float32 array (numpy or CPU torch; other float dtypes are rounded to float32)
            holding ``x_int * scale``; ``-inf`` entries are masked.
        scale: the input scale ``s`` (positive, float32, >= 2**-40, and small enough that
            ``floor(c / s**2) >= 1``, i.e. ``s <= 1.67``).
        out_bits: output bits (2..16); the output scale is ``2**-out_bits``.
        exact: False (default): float32 evaluation order; True: exact integers (needs
            ``|x / s| < 2**31`` and ``floor(c / s**2) < 2**61``).
        mask: optional bool array broadcastable to ``x`` (True = take part).
        return_stats: also return a :class:`BaselineStats`.

    Returns:
        float32 integer-valued outputs ``y`` of ``x``'s shape (0 for masked entries, NaN rows
        as :func:`ivit_shiftmax`); with ``return_stats`` a tuple ``(y, stats)``.

    Raises:
        TypeError, ValueError: as :func:`ivit_shiftmax`, and for a scale outside the range
        above.

    Example::

        >>> y = ibert_softmax(np.array([0.0, -0.5, 1.0], np.float32), 0.05)
        >>> y * 2.0**-8
    """
    return _public_softmax(_ibert_core, x, scale, out_bits, exact, mask, return_stats)


def _public_softmax(core, x, scale, out_bits, exact, mask, return_stats):
    """Validate the arguments of :func:`ivit_shiftmax` / :func:`ibert_softmax`, run ``core``."""
    s = _check_scale(scale)
    ob = _check_out_bits(out_bits)
    ex = check_bool(exact, "exact")
    rb = check_bool(return_stats, "return_stats")
    rows, restore, vis = _rows_and_mask(x, mask)
    y = np.empty(rows.shape, dtype=np.float32)
    counts = core(rows, vis, s, ob, ex, y)
    out = restore(y)
    return (out, _stats_from(counts, rows.shape[0])) if rb else out


def ivit_scale(out_bits: int = 8) -> float:
    """Value of one output unit of :func:`ivit_shiftmax`: ``2**-(out_bits - 1)``."""
    return 2.0 ** -(_check_out_bits(out_bits) - 1)


def ibert_scale(out_bits: int = 8) -> float:
    """Value of one output unit of :func:`ibert_softmax`: ``2**-out_bits``."""
    return 2.0 ** -_check_out_bits(out_bits)


# --------------------------------------------------------------------------------------------
# attention pipelines (schemes "ivit" and "ibert")


@jit(parallel=True)
def _vis_amax(x, vis):
    """max |x| over the visible entries (``vis``; (0, 0) = all), NaN left out."""
    n, L = x.shape
    part = np.zeros(n, dtype=np.float32)
    for r in prange(n):
        m = np.float32(0.0)
        if vis.shape[0] == 0:  # on the bits (branch-free: vectorizes), unless a NaN is there
            mb = np.uint32(0)
            for j in range(L):
                mb = max(mb, np.uint32(f32_as_u32(x[r, j]) & np.uint32(F32_ABS)))
            if mb <= np.uint32(F32_EXP):
                part[r] = u32_as_f32(mb)
                continue
        for j in range(L):
            if vis.shape[0] > 0 and not vis[r, j]:
                continue
            a = abs(x[r, j])
            if a > m:
                m = a
        part[r] = m
    return part.max() if n else np.float32(0.0)


def _logit_amax(x: np.ndarray, vis: np.ndarray, rows: np.ndarray | None) -> float:
    """max |x| over the visible logits of the rows that take part (``rows``; None: all)."""
    if rows is not None and not rows.all():
        x = x[rows]
        vis = vis[rows] if vis.shape[0] else vis
    return float(for_size(_vis_amax, x.size)(x, vis)) if x.size else 0.0


@jit(parallel=True)
def _requantize(x, s_x, qmax, codes, coded):
    """``x = fl32(clamp(RNE(x / s_x), -qmax, qmax) * s_x)`` (float64 quotient), in place; with
    ``coded`` instead ``codes = RNE(x / s_x) + qmax`` (uint8, ``2 qmax + 1 <= 256``; the
    surrogate then reads the codes only, ``x`` is left as it is)."""
    n, L = x.shape
    for r in prange(n):
        if coded:
            for j in range(L):
                t = min(max(np.rint(np.float64(x[r, j]) / s_x), -qmax), qmax)
                codes[r, j] = np.uint8(t + qmax)
        else:
            for j in range(L):
                t = min(max(np.rint(np.float64(x[r, j]) / s_x), -qmax), qmax)
                x[r, j] = np.float32(t * s_x)


def _int8_attention(prob: Problem, return_stats: bool, core, out_scale: float, out_bits: int,
                    exact: bool, logit_bits, scale_scope: str = "visible"):
    """The pipeline of :mod:`._surrogate` with logits ``fl32(S s_in + mask)`` (optionally
    requantised to ``logit_bits``) and the surrogate ``core``; output ``P v8 * s_v * unit``.
    The int8 scales, the logit unit ``s_in`` and the logit requantisation scale are per
    sequence with ``scale_scope="visible"`` (one group per batch element), per tensor with
    ``"tensor"`` (one group)."""
    lb = _check_logit_bits(logit_bits)
    scope = check_choice(scale_scope, "scale_scope", SCALE_SCOPES)
    B, Lq, Lk = prob.B, prob.Lq, prob.Lk
    if B == 0 or Lq == 0 or Lk == 0:
        out = np.zeros((B, Lq, prob.dv), dtype=np.float32)
        st = BaselineStats(calls=1, rows=B * Lq, empty_rows=B * Lq)
        return out, (st if return_stats else None)
    check_positive_scale(prob.scale, "I-ViT / I-BERT", "the integer softmax takes logits in "
                         "units of s_q s_k scale > 0")
    qz = quantize_problem(prob, scope=scope)
    group = prob.sequences() if scope == "visible" else np.zeros(B, dtype=np.int64)
    # the logit unit in float32, as the published code holds it; when it underflows to 0 (q, k
    # of amplitude ~1e-20 and below) every float32 logit is 0 and the softmax uniform, which
    # the core computes with any positive unit
    s_ent = (qz.sq_row[:, 0].astype(np.float64) * qz.sk.astype(np.float64)
             * prob.scale).astype(np.float32)  # (B,): one value per group
    s_row = np.repeat(s_ent.astype(np.float64), Lq)
    x = np.empty((B * Lq, Lk), dtype=np.float32)  # logits, then the surrogate's output

    def fill(rows, S, add):
        xr = x[rows]
        sized(logits_f32, S.size)(xr, s_row[rows], xr if add is None else add, add is not None,
                                  S, S.base is not x)  # float64 scores (d > 1040) are read

    fill_logits(prob, qz, fill, out=x)
    vis = visibility(prob)
    part = prob.taking_part()[0].reshape(-1) if scope == "visible" else None
    counts = np.zeros(_NCOUNT, dtype=np.int64)
    bounds = np.flatnonzero(np.diff(group)) + 1
    for e0, e1 in zip(np.r_[0, bounds], np.r_[bounds, B], strict=True):  # one group of entries
        rs = slice(int(e0) * Lq, int(e1) * Lq)
        xg, vg = x[rs], vis[rs] if vis.shape[0] else vis
        s_in = s_ent[e0]
        kw = {}
        if lb is not None:
            qmax = 2 ** (lb - 1) - 1
            amax = _logit_amax(xg, vg, None if part is None else part[rs])
            s_x = np.float32(amax / qmax) if amax > 0 else np.float32(1.0)
            coded = core is _ivit_core and not exact and 2 * qmax + 1 <= CODED_MAX and \
                Lk >= 2 * (2 * qmax + 1)  # a per-value table pays for itself on long rows
            cd = np.empty(xg.shape, np.uint8) if coded else _NO_CODES
            for_size(_requantize, xg.size)(xg, np.float64(s_x), float(qmax), cd, coded)
            s_in = s_x
            if coded:
                xvals = ((np.arange(2 * qmax + 1) - qmax) * np.float64(s_x)).astype(np.float32)
                kw = {"codes": (cd, xvals)}
        if not s_in > 0:  # every logit underflowed to 0 (see above)
            s_in = np.float32(1.0)
        counts += np.asarray(core(xg, vg, _check_scale(float(s_in)), out_bits, exact, xg, **kw),
                             dtype=np.int64).reshape((-1, _NCOUNT)).sum(axis=0)  # xg -> y
    bad = np.isnan(x[:, 0])  # rows the surrogate gave NaN (no visible key): NaN out
    x[bad] = 0.0
    O, rowsum = exact_attend(x, prob, qz.v8)
    out = (O * (qz.sv.astype(np.float64)[:, None, None] * out_scale)).astype(np.float32)
    out.reshape((-1, prob.dv))[bad] = np.nan
    if not return_stats:
        return out, None
    st = _stats_from(counts, B * Lq)
    st.unnormalized_rows = unnormalized(rowsum.reshape(-1), 1.0 / out_scale, ~bad)
    return out, st


def _ivit_attention(prob: Problem, return_stats: bool, out_bits: int = IVIT_ATTN_OUT_BITS,
                    exact: bool = False, logit_bits=IVIT_ATTN_LOGIT_BITS,
                    scale_scope: str = "visible"):
    ob = _check_out_bits(out_bits)
    ex = check_bool(exact, "exact")
    return _int8_attention(prob, return_stats, _ivit_core, ivit_scale(ob), ob, ex, logit_bits,
                           scale_scope)


def _ibert_attention(prob: Problem, return_stats: bool, out_bits: int = 8, exact: bool = False,
                     logit_bits=None, scale_scope: str = "visible"):
    ob = _check_out_bits(out_bits)
    ex = check_bool(exact, "exact")
    return _int8_attention(prob, return_stats, _ibert_core, ibert_scale(ob), ob, ex,
                           logit_bits, scale_scope)


def _surrogate(core, unit, scores, axis, scale=None, out_bits: int = 8, exact: bool = False):
    """Softmax surrogate front end: int8-quantised scores (``scale=None``: per tensor), the
    core, ``(y * unit, BaselineStats)``."""
    rows, restore = softmax_rows(scores, axis)
    ob = _check_out_bits(out_bits)
    ex = check_bool(exact, "exact")
    fin = np.isfinite(rows)
    if scale is None:
        amax = float(np.abs(rows[fin]).max()) if fin.any() else 0.0
        s = np.float32(amax / INT8_QMAX) if amax > 0 else np.float32(1.0)
        qmax = INT8_QMAX
    else:
        s = _check_scale(scale)
        qmax = None
    with np.errstate(invalid="ignore"):
        xi = np.rint(rows.astype(np.float64) / np.float64(s))
        if qmax is not None:
            xi = np.clip(xi, -qmax, qmax)
        x = np.where(fin, xi * np.float64(s), rows).astype(np.float32)
    s = _check_scale(float(s))
    y = np.empty(x.shape, dtype=np.float32)
    counts = core(x, np.zeros((0, 0), dtype=np.bool_), s, ob, ex, y)
    return (restore((y * np.float32(unit(ob))).astype(np.float32)),
            _stats_from(counts, rows.shape[0]))


def _ivit_softmax_scheme(scores, axis, return_stats, **opts):
    return _surrogate(_ivit_core, ivit_scale, scores, axis, **opts)


def _ibert_softmax_scheme(scores, axis, return_stats, **opts):
    return _surrogate(_ibert_core, ibert_scale, scores, axis, **opts)


register(Scheme("ivit", "int8 q k v, 8-bit logits, I-ViT Shiftmax (16-bit P, float32 order), "
                "int32 P v",
                _ivit_attention, options=("out_bits", "exact", "logit_bits", "scale_scope"),
                stats=BaselineStats, order=90, error_bound=0.35, mask_floor=MASK_FLOOR,
                noise=lambda o: "int8_tensor", device="baselines_device:ivit_attention"))
register(Scheme("ibert", "int8 q k v, I-BERT i-exp integer softmax (float32 order), int32 P v",
                _ibert_attention, options=("out_bits", "exact", "logit_bits", "scale_scope"),
                stats=BaselineStats, order=100, error_bound=0.2, mask_floor=MASK_FLOOR,
                noise=lambda o: "int8_tensor", device="baselines_device:ibert_attention"))
register(Scheme("ivit", "I-ViT Shiftmax on int8-quantised scores (y * 2**-(out_bits-1))",
                _ivit_softmax_scheme, options=("scale", "out_bits", "exact"), kind="softmax",
                stats=BaselineStats,
                mask_floor=MASK_FLOOR))
register(Scheme("ibert", "I-BERT i-exp softmax on int8-quantised scores (y * 2**-out_bits)",
                _ibert_softmax_scheme, options=("scale", "out_bits", "exact"), kind="softmax",
                stats=BaselineStats,
                mask_floor=MASK_FLOOR))

__all__ = ["ivit_shiftmax", "ibert_softmax", "ivit_scale", "ibert_scale", "BaselineStats",
           "IVIT_N", "IBERT_N", "IVIT_ATTN_LOGIT_BITS", "IVIT_ATTN_OUT_BITS"]
