"""The int8 plumbing of the integer attention schemes, written once: symmetric int8 quantization
of q, k, v (through :mod:`lowprec.formats.integer`), exact integer products and the int32
accumulator checks.

One scale per *row* of a 2-D view is the only primitive (:func:`int8_rows`); every granularity
of the schemes is a reshape to it: per tensor (one row), per (batch, head) entry (``(B, L*d)``),
per token (``(..., d)``), per block of query tokens (``(B*nblk, block*d)``).  The codes are the
integer codec's own (``formats.integer``: float64 quotient ``x / s``, rounded half to even,
clamped), with the scale the scheme's paper prescribes (``scale_dtype``):

* ``"float32"`` (IntAttention, I-ViT, I-BERT, HCCS, INT-FlashAttention): ``s = fl32(amax /
  127)`` from the float64 ``amax``; with ``zero_scale=1.0`` exactly :func:`lowprec.encode`'s
  rule (an all-zero row gets 1.0, a scale below the smallest float32 is clamped to it), with
  ``zero_scale=0.0`` INT-FlashAttention's (``s`` as rounded, possibly 0; a row with ``s = 0``
  gets codes 0);
* ``"float64"`` (QFlash): ``s = amax / 127`` in float64 (1.0 for an all-zero row), codes in
  ``[-128, 127]`` (``narrow=False``);
* ``"float16"`` (INT-FlashAttention's torch code on float16 tensors): ``x`` rounded to float16,
  ``s = f16(amax / 127)``, the quotient ``f16(x / s)`` rounded half to even (``s = 0``: codes 0).

Products: int8 dot products of depth ``d`` stay exact in float32 BLAS while ``127 * 127 * d <=
2**24`` (``d <= 1040``) and in float64 BLAS far beyond; :func:`int_scores` and :func:`exact_pv`
pick the cheaper exact one and return float arrays holding integers, so no int32/int64 copy of an
``L x L`` matrix is ever made.  (The GPU port mirrors these with exact int8 tensor-core dots.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numba import prange

from ..formats import integer as _integer
from ..formats._bits import f32_as_u32, u32_as_f32
from ..formats._jit import jit
from ..formats.core import Rounding
from ..formats.rounding import SR_BITS_DEFAULT
from ._check import float_input

INT8_QMAX = 127  # symmetric int8: codes in [-127, 127] (narrow) or [-128, 127] (wide)
INT8_QMIN_WIDE = -128
F32_EXACT = 1 << 24  # integers up to this are exact in float32
F64_EXACT = 1 << 53  # integers up to this are exact in float64
INT32_MAX = (1 << 31) - 1
INT8_D_MAX = (1 << 31) // (128 * 128) - 1  # largest d whose int8 dot products cannot wrap int32
SCALE_DTYPES = ("float32", "float64", "float16")
ROUND_LIMIT = 127.5  # |x / s| above this is clamped by the codes (counted as saturation)
ENCODE_PARALLEL_MIN = 1 << 21  # q, k, v elements from which the codes are computed in parallel
# (below it waking threads costs more than it saves, and far more on a busy machine)


def _amax_rows(x2: np.ndarray) -> np.ndarray:
    """float64 ``max |x|`` of each row of a float32/float64 ``(N, M)`` array (finite only)."""
    lay = _integer._Layout(x2.shape, "per_token", None, None)
    lo, hi = _integer._group_minmax(x2.reshape(-1), lay)
    return np.maximum(-lo, hi)


def _codes(x2: np.ndarray, s64: np.ndarray, qmin: int, what: str = "x") -> np.ndarray:
    """int8 codes ``clamp(RNE(x / s), qmin, 127)`` of each row with its float64 scale (> 0), by
    the integer codec's kernel (ValueError for NaN, as :func:`lowprec.encode`)."""
    N, M = x2.shape
    lay = _integer._Layout((N, M), "per_token", None, None)
    out = np.empty(N * M, dtype=np.uint8)
    flat = x2.reshape(-1)
    if flat.shape[0] >= ENCODE_PARALLEL_MIN:
        p = {"flat": flat, "scales": s64, "zps": None, "lay": lay,
             "mode": int(Rounding.NEAREST_EVEN), "seed": 0, "sr_bits": SR_BITS_DEFAULT,
             "qmin": qmin, "qmax": INT8_QMAX}
        nan = _integer._run(p, out, False)
    else:  # the codec's serial kernel (its _run goes parallel from 2**17 elements)
        nan = int(_integer._encode_serial(
            flat, s64.astype(np.float64), np.zeros(s64.shape[0]), out, *lay.args,
            np.float64(qmin), np.float64(INT8_QMAX), np.int64(int(Rounding.NEAREST_EVEN)),
            np.uint64(0), np.int64(SR_BITS_DEFAULT)))
    if nan:
        raise ValueError(f"{what}: NaN has no int8 code ({nan} NaN value(s) in x); use "
                         "quantize() to propagate NaN, or remove NaNs first")
    return out.view(np.int8).reshape((N, M))


def row_scales(x2: np.ndarray, scale_dtype: str = "float64") -> np.ndarray:
    """The data scale ``amax / 127`` of each row of a float32/float64 ``(N, M)`` array:
    float64 (QFlash: 1.0 for an all-zero row) or float32 (:func:`lowprec.encode`'s rule)."""
    amax = _amax_rows(np.ascontiguousarray(x2))
    if scale_dtype == "float64":
        return np.where(amax > 0, amax / INT8_QMAX, 1.0)
    s = _integer._to_f32_scale(amax / INT8_QMAX)
    s[amax == 0] = 1.0
    return s


def int8_rows(x2, *, scale_dtype: str = "float32", narrow: bool = True,
              zero_scale: float = 1.0, what: str = "x") -> tuple[np.ndarray, np.ndarray, int]:
    """Symmetric int8 codes with one scale per row of a 2-D float array (module docstring).

    Args:
        x2: float ``(N, M)`` array (float32, float64, float16; finite values).
        scale_dtype: ``"float32"``, ``"float64"`` or ``"float16"`` (module docstring).
        narrow: codes in ``[-127, 127]`` (True) or ``[-128, 127]``.
        zero_scale: float32 rule only: 1.0 (the integer codec's rule) or 0.0
            (INT-FlashAttention's).
        what: the input's name in error messages.

    Returns:
        ``(codes int8 (N, M), scales (N,) of scale_dtype, saturated)`` where ``saturated``
        counts values whose code was clamped (``|x| > 127.5 s``; float16: ``|f16(x / s)|``
        rounding beyond the range): 0 for data scales unless a scale is subnormal.
    """
    if scale_dtype not in SCALE_DTYPES:
        raise ValueError(f"scale_dtype {scale_dtype!r} is not one of {', '.join(SCALE_DTYPES)}")
    qmin = -INT8_QMAX if narrow else INT8_QMIN_WIDE
    if scale_dtype == "float16":
        x16 = np.asarray(x2).astype(np.float16)  # the caller checks that x fits float16
        amax = np.abs(x16).max(axis=1, keepdims=True, initial=np.float16(0))
        s = (amax / np.float16(INT8_QMAX)).astype(np.float16)
        with np.errstate(divide="ignore", invalid="ignore"):
            r = np.rint((x16 / s).astype(np.float16)).astype(np.float64)
        r = np.where(s == 0, 0.0, r)
        sat = int(np.count_nonzero((r > INT8_QMAX) | (r < qmin)))
        return np.clip(r, qmin, INT8_QMAX).astype(np.int8), s.reshape(-1), sat
    x = np.asarray(x2)
    if x.dtype not in (np.float32, np.float64):
        x = x.astype(np.float32)
    x = np.ascontiguousarray(x)
    if scale_dtype == "float64" or zero_scale == 1.0:
        s = row_scales(x, scale_dtype)
        codes = _codes(x, s.astype(np.float64), qmin, what)
        return codes, s, saturated(x, s[:, None])
    s = (_amax_rows(x) / INT8_QMAX).astype(np.float32)
    zero = s == 0
    codes = _codes(x, np.where(zero, 1.0, s.astype(np.float64)), qmin, what)
    if zero.any():
        codes[zero] = 0
    return codes, s, saturated(x[~zero], s[~zero, None])


QKV_GRANULARITIES = ("per_tensor", "per_channel", "per_block")


def _per(a: np.ndarray, rows: int) -> np.ndarray:
    """``a`` as ``(rows, size / rows)`` (explicit sizes: an empty tensor stays reshapeable)."""
    return a.reshape((rows, a.size // rows if rows else 0))


@dataclass
class QKV8:
    """int8 q, k, v of an attention problem, ready for exact GEMMs (:func:`quantize_qkv`).

    Attributes:
        q8: ``(B, Lq, d)`` float32 (float64 when ``127 * 127 * d > 2**24``) holding the codes.
        k8t: ``(B, d, Lk)``, k's codes transposed, same dtype.
        v8: ``(B, Lk, dv)`` float32 holding v's codes.
        sq_row: float32 ``(B, Lq)``: the scale of each query row.
        sk, sv: float32 ``(B,)``: the scale of each entry's k and v.
        groups, block: query-scale groups per entry and rows per group (1 and Lq unless
            ``per_block``).
        quantized, saturated: elements quantised and of those clamped (``|x| > 127.5 s``).
    """

    q8: np.ndarray
    k8t: np.ndarray
    v8: np.ndarray
    sq_row: np.ndarray
    sk: np.ndarray
    sv: np.ndarray
    groups: int
    block: int
    quantized: int
    saturated: int


#: why the integer attention schemes refuse NaN/Inf inputs (every scheme says it the same way)
FINITE_WHY = ("the integer attention schemes quantize q, k and v to int8 with a scale "
              "max|x| / 127, which must be finite (flash, baps and reference propagate NaN/Inf)")


#: a row whose integer probabilities sum to more than this fraction away from full scale is
#: unnormalized (``unnormalized_rows``): 8-bit P over many flat keys, a clamped or coarse
#: normalisation, a row whose weights all rounded to 0
NORM_TOL = 0.1


def unnormalized(rowsum: np.ndarray, full: float, seen: np.ndarray | None = None,
                 tol: float = NORM_TOL) -> int:
    """Rows whose probability sum ``rowsum`` (in units where ``full`` is 1) is more than
    ``tol`` (default :data:`NORM_TOL`) away from ``full``, among the rows ``seen`` (rows that
    see a key; None: all)."""
    off = ~(np.abs(np.asarray(rowsum, dtype=np.float64) - full) <= tol * full)
    if seen is not None:
        off &= seen
    return int(np.count_nonzero(off))


def check_finite_inputs(*named) -> None:
    """ValueError naming the first of the ``(name, array)`` pairs that holds NaN or Inf
    (:data:`FINITE_WHY`)."""
    for name, a in named:
        if a.size and not np.all(np.isfinite(a)):
            raise ValueError(f"{name} contains NaN or Inf; {FINITE_WHY}")


def check_positive_scale(scale: float, scheme: str, why: str) -> None:
    """ValueError unless the softmax scale is > 0 (schemes whose integer softmax needs a
    positive logit unit; ``why`` names the quantity, e.g. ``"c_int = c / alpha"``)."""
    if not scale > 0:
        raise ValueError(f"{scheme} needs scale > 0 ({why}), got {scale}")


def quantize_qkv(q: np.ndarray, k: np.ndarray, v: np.ndarray,
                 granularity: str = "per_tensor", block: int = 128, *,
                 require_finite: bool = True) -> QKV8:
    """Symmetric int8 (float32 scales, ``[-127, 127]``) of flattened ``q (B, Lq, d)``,
    ``k (B, Lk, d)``, ``v (B, Lk, dv)`` at ``granularity``: ``per_tensor`` (one scale per tensor
    over every entry), ``per_channel`` (one per entry, i.e. per head) or ``per_block`` (q per
    block of ``block`` query rows of an entry, k and v per entry).

    ``require_finite`` (default) raises ValueError for NaN/Inf (:func:`check_finite_inputs`);
    otherwise NaN raises as in :func:`lowprec.encode` and Inf saturates.
    """
    if require_finite:
        check_finite_inputs(("q", q), ("k", k), ("v", v))
    B, Lq, d = q.shape
    rows = 1 if granularity == "per_tensor" else B
    groups = 1
    if granularity == "per_block" and Lq:
        groups = -(-Lq // block)
        qp = np.zeros((B, groups * block, d), dtype=q.dtype)
        qp[:, :Lq] = q
        c8, sb, sat_q = int8_rows(qp.reshape((B * groups, block * d)), what="q")
        q8 = c8.reshape((B, groups * block, d))[:, :Lq]
        sq_row = np.repeat(sb.reshape((B, groups)), block, axis=1)[:, :Lq]
    else:
        c8, sqs, sat_q = int8_rows(_per(q, rows), what="q")
        q8 = c8.reshape(q.shape)
        sq_row = np.broadcast_to(sqs.reshape((-1, 1)), (B, Lq))
        block = max(Lq, 1)
    k8, sks, sat_k = int8_rows(_per(k, rows), what="k")
    v8, svs, sat_v = int8_rows(_per(v, rows), what="v")
    dt = gemm_dtype(d)
    return QKV8(
        q8=q8.astype(dt), k8t=np.ascontiguousarray(k8.reshape(k.shape).transpose(0, 2, 1), dt),
        v8=v8.reshape(v.shape).astype(np.float32),
        sq_row=np.ascontiguousarray(sq_row, dtype=np.float32),
        sk=np.broadcast_to(sks, (B,)).astype(np.float32),
        sv=np.broadcast_to(svs, (B,)).astype(np.float32), groups=groups, block=block,
        quantized=q.size + k.size + v.size, saturated=sat_q + sat_k + sat_v)


@jit(parallel=True)
def _row_absmax(x, out):
    """``out[b, i] = max |x[b, i, :]|`` of float32 ``x (B, L, D)``, taken on the bits (Inf and
    NaN compare above every finite value, so ``out`` is finite iff the row is)."""
    B, L, D = x.shape
    for b in prange(B):
        for i in range(L):
            m = np.uint32(0)
            for c in range(D):
                m = max(m, np.uint32(f32_as_u32(x[b, i, c]) & np.uint32(0x7FFFFFFF)))
            out[b, i] = np.float64(u32_as_f32(m))


def _small_serial(kernel, n: int):
    """``kernel`` for the q, k or v of a call of ``n`` elements: its serial compilation below
    :data:`ENCODE_PARALLEL_MIN` (as the codes of :func:`_codes`)."""
    return kernel if n >= ENCODE_PARALLEL_MIN else kernel.serial


def row_amax(x: np.ndarray) -> np.ndarray:
    """float64 ``max |x|`` of every row of ``x (B, L, D)`` (0 for ``D == 0``; NaN or Inf where
    the row holds one)."""
    B, L, D = x.shape
    if x.dtype == np.float32 and x.size:
        a = np.empty((B, L), dtype=np.float64)
        _small_serial(_row_absmax, x.size)(np.ascontiguousarray(x), a)
        return a
    if x.size == 0:
        return np.zeros((B, L), dtype=np.float64)
    return np.abs(x).max(axis=2).astype(np.float64)


def scoped_amax(x: np.ndarray, seen: np.ndarray, group: np.ndarray | None,
                rows_amax: np.ndarray | None = None) -> np.ndarray:
    """float64 ``max |x|`` of every entry of ``x (B, L, D)`` over its rows ``seen (B, L)``,
    maximised over the entries of one ``group`` (``(B,)`` ints; None: each entry alone); 0 for
    an entry (group) with no row seen.  ``rows_amax``: :func:`row_amax` of ``x`` if known."""
    B, L = x.shape[:2]
    a = row_amax(x) if rows_amax is None else rows_amax
    if not L:
        e = np.zeros(B, dtype=np.float64)
    elif seen.all():
        e = a.max(axis=1)
    else:
        e = np.where(seen, a, 0.0).max(axis=1)
    if group is None or B == 0:
        return e
    g = np.zeros(int(group.max()) + 1, dtype=np.float64)
    np.maximum.at(g, group, e)
    return g[group]


def _entry_scales(amax: np.ndarray, scale_dtype: str) -> np.ndarray:
    """Scales from max-abs values: float32 ``fl32(amax / 127)`` (the integer codec's rule, 1.0
    for 0) or float64 ``amax / 127`` (QFlash's, 1.0 for 0)."""
    if scale_dtype == "float64":
        return np.where(amax > 0, amax / INT8_QMAX, 1.0)
    s = _integer._to_f32_scale(amax / INT8_QMAX) if amax.size else np.zeros(0, np.float32)
    s = np.asarray(s, dtype=np.float32)
    s[amax == 0] = 1.0
    return s


@jit(parallel=True)
def _encode_rows(x, s, qmin, out, transpose):
    """The int8 codes ``clamp(RNE(fl64(x) / s[b, i]), qmin, 127)`` of finite float32
    ``x (B, L, D)`` (the integer codec's arithmetic) as floats into ``out (B, L, D)``, or
    ``(B, D, L)`` with ``transpose``."""
    B, L, D = x.shape
    for b in prange(B):
        for i in range(L):
            sc = s[b, i]
            for c in range(D):
                t = min(max(np.rint(np.float64(x[b, i, c]) / sc), qmin), 127.0)
                if transpose:
                    out[b, c, i] = t
                else:
                    out[b, i, c] = t


def _codes_with(x: np.ndarray, s_rows: np.ndarray, qmin: int, what: str, dtype,
                transpose: bool = False) -> np.ndarray:
    """int8 codes of finite ``x (B, L, D)`` with one float64 scale per row ``s_rows (B, L)``, as
    a float array of ``dtype`` (``(B, D, L)`` with ``transpose``)."""
    B, L, D = x.shape
    shape = (B, D, L) if transpose else (B, L, D)
    if x.dtype != np.float32:  # the integer codec's kernel
        c = np.zeros(x.shape, dtype=np.int8) if x.size == 0 else _codes(
            np.ascontiguousarray(x.reshape((B * L, D))),
            np.ascontiguousarray(s_rows, dtype=np.float64).reshape(-1), qmin, what
        ).reshape(x.shape)
        return np.ascontiguousarray(c.transpose(0, 2, 1) if transpose else c, dtype=dtype)
    out = np.empty(shape, dtype=dtype)
    if x.size:
        _small_serial(_encode_rows, x.size)(np.ascontiguousarray(x),
                                           np.ascontiguousarray(s_rows, dtype=np.float64),
                                           float(qmin), out, transpose)
    return out


_F32_MIN_NORMAL = 2.0**-126


def _saturated_visible(x: np.ndarray, s_rows: np.ndarray, seen: np.ndarray) -> int:
    """:func:`saturated` over the rows ``seen`` of ``x (B, L, D)`` with the float32 data scales
    ``s_rows (B, L)`` taken from the amax of those rows: 0 without a look at ``x`` when every
    scale of a seen row is a normal float32 (then ``127.5 fl32(amax / 127) > amax``)."""
    sr = s_rows if seen.all() else s_rows[seen]
    if sr.size == 0 or float(sr.min()) >= _F32_MIN_NORMAL:
        return 0
    return saturated(x[seen], s_rows[seen][:, None])


def quantize_visible(q: np.ndarray, k: np.ndarray, v: np.ndarray, rows: np.ndarray,
                     keys: np.ndarray, sequence: np.ndarray, granularity: str = "per_tensor",
                     block: int = 128) -> QKV8:
    """:func:`quantize_qkv` with ``scale_scope="visible"`` (:meth:`Problem.taking_part`): the
    amax of each scale is taken over the query ``rows`` and ``keys`` (``(B, Lq)``, ``(B, Lk)``
    boolean) that take part, and ``per_tensor`` spans one ``sequence`` (``(B,)`` ints: the
    entries of one batch element), so neither padding keys, nor padding query rows, nor the
    other sequences of a batch change a sequence's codes.  Codes of every row are computed
    (rows not taking part may clamp; only those taking part count as ``saturated``).
    """
    B, Lq, d = q.shape
    amaxes = [row_amax(x) for x in (q, k, v)]
    for name, a in zip("qkv", amaxes, strict=True):  # NaN/Inf: the row max is not finite
        if a.size and not np.all(np.isfinite(a)):
            raise ValueError(f"{name} contains NaN or Inf; {FINITE_WHY}")
    group = sequence if granularity == "per_tensor" else None
    sk = _entry_scales(scoped_amax(k, keys, group, amaxes[1]), "float32")
    sv = _entry_scales(scoped_amax(v, keys, group, amaxes[2]), "float32")
    blocks, nblk = 1, max(Lq, 1)
    if granularity == "per_block" and Lq:
        nblk = block
        blocks = -(-Lq // block)
        pad = blocks * block - Lq
        ap = np.concatenate([amaxes[0], np.zeros((B, pad))], axis=1) if pad else amaxes[0]
        rp = np.concatenate([rows, np.zeros((B, pad), bool)], axis=1) if pad else rows
        amax = scoped_amax(ap.reshape((B * blocks, block, 1)), rp.reshape((B * blocks, block)),
                           None, ap.reshape((B * blocks, block))).reshape((B, blocks))
        sq_row = np.repeat(_entry_scales(amax.reshape(-1), "float32").reshape((B, blocks)),
                           block, axis=1)[:, :Lq]
    else:
        sq_row = np.repeat(_entry_scales(scoped_amax(q, rows, group, amaxes[0]),
                                         "float32")[:, None], Lq, axis=1)
    sk_row = np.repeat(sk[:, None], k.shape[1], axis=1)
    sv_row = np.repeat(sv[:, None], v.shape[1], axis=1)
    dt = gemm_dtype(d)
    sat = (_saturated_visible(q, sq_row, rows) + _saturated_visible(k, sk_row, keys)
           + _saturated_visible(v, sv_row, keys))
    return QKV8(
        q8=_codes_with(q, sq_row, -INT8_QMAX, "q", dt),
        k8t=_codes_with(k, sk_row, -INT8_QMAX, "k", dt, transpose=True),
        v8=_codes_with(v, sv_row, -INT8_QMAX, "v", np.float32),
        sq_row=np.ascontiguousarray(sq_row, dtype=np.float32),
        sk=sk.astype(np.float32), sv=sv.astype(np.float32), groups=blocks, block=nblk,
        quantized=q.size + k.size + v.size, saturated=sat)


def quantize_problem(prob, granularity: str = "per_tensor", block: int = 128,
                     scope: str = "visible") -> QKV8:
    """int8 q, k, v of a :class:`~lowprec.kernels.problem.Problem` with the ``scale_scope``
    ``scope``: ``"visible"`` (:func:`quantize_visible`) or ``"tensor"`` (the papers' scales
    over every entry, :func:`quantize_qkv`)."""
    if scope == "tensor":
        return quantize_qkv(prob.q, prob.k, prob.v, granularity, block)
    rows, keys = prob.taking_part()
    return quantize_visible(prob.q, prob.k, prob.v, rows, keys, prob.sequences(), granularity,
                            block)


def quantize_int8(x, s: float, *, narrow: bool = False, return_saturated: bool = False):
    """int8 codes of ``x`` at a given scale: ``clamp(RNE(x / s), -128, 127)`` with the float64
    quotient (``narrow=True``: ``[-127, 127]``); QFlash's eq. 2 (specs/attention.md 4).

    This is the one meaning of the name in lowprec (``lowprec.kernels.qflash.quantize_int8`` is
    this function).

    Args:
        x: float array (numpy or CPU torch; finite values).
        s: positive finite scale (e.g. ``host_constants(...).s_q``).
        narrow: clamp to ``[-127, 127]`` instead of ``[-128, 127]``.
        return_saturated: also return how many values were clamped.

    Returns:
        int8 array of ``x``'s shape (and the clamp count).

    Raises:
        TypeError for non-float ``x``; ValueError for NaN/Inf in ``x`` or a bad ``s``.

    Example::

        >>> quantize_int8(np.array([1.0, -0.5]), 1 / 127)
        array([ 127, -64], dtype=int8)
    """
    a = float_input(x, "x", finite=True, why="int8 codes need finite inputs")
    s = float(s)
    if not (math.isfinite(s) and s > 0):
        raise ValueError(f"scale s must be finite and > 0, got {s}")
    a64 = np.asarray(a, dtype=np.float64)
    qmin = -INT8_QMAX if narrow else INT8_QMIN_WIDE
    codes = _codes(np.ascontiguousarray(a64.reshape((1, -1))), np.array([s]), qmin)
    out = codes.reshape(a64.shape)
    if not return_saturated:
        return out
    with np.errstate(over="ignore"):
        r = np.rint(a64 / s)
    return out, int(np.count_nonzero((r > INT8_QMAX) | (r < qmin)))


def saturated(x: np.ndarray, s: np.ndarray) -> int:
    """How many ``|x| > 127.5 s`` (values an int8 code clamps; ``s`` broadcasts to ``x``)."""
    thr = ROUND_LIMIT * np.asarray(s, dtype=np.float64)  # exact: 127.5 * a float32
    return int(np.count_nonzero(np.abs(x.astype(np.float64)) > thr))


def gemm_dtype(depth: int, amax: int = INT8_QMAX, bmax: int = INT8_QMAX):
    """float32 when every partial sum of ``depth`` products ``|a b| <= amax bmax`` is an integer
    exact in float32, float64 otherwise (exact below 2**53)."""
    bound = depth * amax * bmax
    if bound <= F32_EXACT:
        return np.float32
    if bound < F64_EXACT:
        return np.float64
    raise ValueError(f"{depth} products of |a| <= {amax}, |b| <= {bmax} can exceed 2**53")


def check_gemm_depth(depth: int, amax: int, bmax: int, what: str) -> None:
    """Raise ValueError when ``depth * amax * bmax`` can exceed the int32 accumulator."""
    if depth * amax * bmax > INT32_MAX:
        raise ValueError(
            f"{what}: {depth} terms of |a| <= {amax}, |b| <= {bmax} can overflow the int32 "
            f"accumulator (depth must be <= {INT32_MAX // (amax * bmax)})"
        )


def int_scores(q8: np.ndarray, k8t: np.ndarray) -> np.ndarray:
    """Exact ``q8 @ k8t`` of int8 values held in float arrays ``(..., M, d) @ (..., d, N)``:
    float32 (exact while ``127 * 127 * d <= 2**24``) or float64 (the operands' dtype, chosen by
    :func:`gemm_dtype`)."""
    return np.matmul(q8, k8t)


def score_chunks(q8: np.ndarray, k8: np.ndarray, work, counts: np.ndarray,
                 align: int = 1) -> None:
    """``work(g0, r0, S)`` over the row chunks (:func:`~.problem.row_chunks`) of int8
    ``q8 (B, Lq, d)`` and ``k8 (B, Lk, d)``, with ``S (g1 - g0, r1 - r0, Lk)`` the exact
    products ``q8 k8^T`` (float, from one BLAS call per chunk; codes in [-128, 127]); ``work``
    returns per-row counters ``(rows, K)``, summed per entry into ``counts (B, K)``.  Large
    calls run the chunks in parallel (:func:`~.problem.run_chunks`: ``work`` calls its
    parallel kernels through :func:`~.problem.sized`)."""
    from .problem import chunk_threads, row_chunks, run_chunks

    B, Lq, d = q8.shape
    Lk = k8.shape[1]
    dt = gemm_dtype(d, 128, 128)
    qf = np.asarray(q8, dtype=dt)
    kt = np.ascontiguousarray(np.transpose(k8, (0, 2, 1)), dtype=dt)
    threads = chunk_threads(B * Lq * Lk)

    def chunk(g0, g1, r0, r1):
        cnt = work(g0, r0, int_scores(qf[g0:g1, r0:r1], kt[g0:g1]))
        return g0, g1, cnt.reshape((g1 - g0, -1, counts.shape[1])).sum(axis=1)

    def then(res):
        g0, g1, cnt = res
        counts[g0:g1] += cnt

    run_chunks(list(row_chunks(B, Lq, Lk, align=align, parts=threads)), chunk, then, threads)


def exact_pv(P: np.ndarray, v8: np.ndarray, max_row_sum: int) -> np.ndarray:
    """Exact ``P @ v8`` for integer-valued ``P >= 0`` (rows summing to at most ``max_row_sum``)
    and int8-valued float32 ``v8``: float32 BLAS when every partial sum is below 2**24
    (``127 * max_row_sum``), float64 otherwise."""
    if INT8_QMAX * max_row_sum <= F32_EXACT:
        return np.matmul(P.astype(np.float32, copy=False), v8)
    return np.matmul(P.astype(np.float64), v8.astype(np.float64))


__all__ = ["int8_rows", "row_scales", "quantize_qkv", "QKV8", "quantize_int8", "saturated",
           "gemm_dtype", "check_gemm_depth", "int_scores", "exact_pv", "INT8_QMAX",
           "INT8_D_MAX", "F32_EXACT", "SCALE_DTYPES"]
