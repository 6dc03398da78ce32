"""INT-FlashAttention: per-token INT8 flash attention (specs/attention.md section 6; seed
``int-flashattention.txt``, Algorithm 1 and section 3.2).

Quantization (:func:`quantize_inputs`): per-token ``s_q[i] = max_d |q[i]| / 127`` (same for k),
one scale per (batch, head) for v (the paper's "tensor-level"), ``x8 = RNE(x / s)``.

Core (:func:`intflash_core`) per (batch, head), query tiles of ``block_q`` rows, key tiles of
``block_k`` keys, ``c = fp32(fp32(scale) * fp32(log2 e))`` (the authors' float32 ``sm_scale *
1.44269504``); every step is one correctly rounded float32 operation in this order (``f16()`` =
round to float16, nearest even)::

    m = -inf, l = 1, acc = 0                               (float32)
    per key tile:
      S     = fp32(fp32(fp32(q8 k8^T) * s_q[row]) * s_k[col])
      Y     = fp32(S * c)        (+ fp32(mask * fp32(log2 e)) with an additive mask)
      m_new = max(m, rowmax Y)   (= max(m, rowmax(S) * c) without a mask)
      p     = exp2(fp32(Y - m_new))                        (float32 of the float64 exp2)
      l_t   = sum of p over the tile, left to right, float32
      full: P8 = trunc(f16(f16(f16(p) * 127) + 0.5))      (round half up of 127 p, fp16 chain)
            T  = fp32(fp32(fp32(P8 v8) * s_v) / 127)       (P8 v8 exact int32)
      half: T  = sum_j fp32(f16(p_j) * v_j), left to right (v float16; products exact)
      alpha = exp2(fp32(m - m_new));  l = fp32(fp32(l * alpha) + l_t)
      acc   = fp32(fp32(acc * alpha) + T);  m = m_new
    O = f16(fp32(acc / l))

Choices (spec section 6; the paper's code is Triton on a GPU): the GPU's ``exp2`` and row
sums are replaced by the correctly rounded float32 ``exp2`` and left-to-right sums (the
hardware's approximate ``ex2`` and tree reductions are not reproducible on a CPU).  The
authors' kernels run by Triton's interpreter (``scripts/intflash_triton_oracle.py``) give these
bits exactly once the interpreter's ``exp2`` is correctly rounded and ``tl.sum`` runs left to
right; unpatched, the interpreter's numpy float32 ``exp2`` (SVML under AVX-512, within one ulp,
host-dependent) and ``np.sum``'s pairwise order move about 0.02 % of float16 outputs by one ulp,
host artefacts and not the GPU's arithmetic (docs/design.md, issue 16).  The block
sizes are parameters (the authors autotune them over 32..256; results depend on ``block_k``
only).  Causal is correct here (bottom-right aligned, section 0): key tiles entirely in a
query tile's future are skipped and a row's masked keys take no part; the authors' causal
full-INT8 kernel loses the running max between its two stages and so drops every
off-diagonal tile.  A row of a tile without a visible key is left untouched (exactly what
processing it with ``p = 0`` gives, up to the sign of a zero ``acc``), so results do not depend
on ``block_q``.  A row that sees no key at all gives NaN.

On CUDA tensors the scheme runs on their device (:mod:`.intflash_device`): the same bits and
statistics.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
from numba import prange

from ..formats._arrays import to_numpy
from ..formats._bits import f32_as_u32, u32_as_f32
from ..formats._jit import jit
from ..stats import Stats
from . import Scheme, register
from ._check import check_bool, check_choice, check_real, float_input
from ._fp import exp2_f32 as _exp2_float
from ._fp import exp2_f32_or_unsure, order_key
from ._fp import round_f16 as _round_f16
from ._gemm import RED, ROWS, pv_tile
from ._int8 import F32_EXACT, FINITE_WHY, int8_rows, score_chunks
from ._int8 import INT8_D_MAX as D_MAX
from .problem import (
    LOG2E,
    MASK_FLOOR,
    SCALE_SCOPES,
    Problem,
    check_block,
    core_lead,
    flat_lead,
    int8_input,
    kernel_array,
    mask_planes,
    sized,
)

BLOCK_Q_DEFAULT = 64  # attention.md 6: not pinned (the authors autotune 32..256)
BLOCK_K_DEFAULT = 64  # attention.md 6: not pinned (the authors autotune 32..256)
INT8_QMAX = 127  # attention.md 6: symmetric int8 range [-127, 127], P8 scale 127
BLOCK_K_MAX = (1 << 31) // (127 * 127) - 1  # int32 P8 v8 tile sums cannot wrap
VARIANTS = ("full", "half")
SCALE_DTYPES = ("float32", "float16")
OUTPUTS = ("float16", "float32")
_LOG2E_F32 = np.float32(LOG2E)
_NINF = np.float32(-np.inf)
_F127 = np.float32(127.0)
_C_TILES, _C_SKIPPED, _C_RESCALES, _C_F16_OVF = range(4)
_NCOUNT = 4


class IntFlashInputs(NamedTuple):
    """Quantized INT-FlashAttention inputs (:func:`quantize_inputs`).

    Attributes:
        q8, k8, v8: int8 codes of q, k, v (same shapes as the inputs).
        s_q, s_k: float32 per-token scales ``(..., Lq)``, ``(..., Lk)``.
        s_v: float32 per-(batch, head) scale ``(...)`` (v's leading shape).
        saturated: ``(q, k, v)`` counts of codes clamped to [-127, 127].
    """

    q8: np.ndarray
    k8: np.ndarray
    v8: np.ndarray
    s_q: np.ndarray
    s_k: np.ndarray
    s_v: np.ndarray
    saturated: tuple


def _float_input(x, what: str) -> np.ndarray:
    arr = float_input(x, what, min_ndim=2, finite=True, why=FINITE_WHY)
    return arr.astype(np.float32) if arr.dtype.name == "bfloat16" else arr


def _quantize(x: np.ndarray, ndim: int, scale_dtype: str):
    """Symmetric int8 codes and float32 scales with max-abs over the last ``ndim`` axes (the
    int8 plumbing with INT-FlashAttention's scale rules: a zero scale gives codes 0)."""
    lead = x.shape[:x.ndim - ndim]
    if scale_dtype == "float16":
        x16 = x.astype(np.float16)
        if not np.isfinite(x16).all():
            raise ValueError("input does not fit float16 (|x| > 65504) for scale_dtype "
                             "'float16'")
    n_lead = int(np.prod(lead, dtype=np.int64))
    codes, s, sat = int8_rows(x.reshape((n_lead, int(np.prod(x.shape[len(lead):])))),
                              scale_dtype=scale_dtype, zero_scale=0.0)
    return codes.reshape(x.shape), s.astype(np.float32).reshape(lead), sat


def quantize_inputs(q, k, v, *, scale_dtype: str = "float32") -> IntFlashInputs:
    """Quantize float q, k, v as INT-FlashAttention does (spec section 6).

    Per-token scales for q and k (``max_d |x[i]| / 127``), one scale per (batch, head) for v
    (max over its last two dims), codes ``RNE(x / s)`` clamped to [-127, 127]; a zero row (or
    zero v) gets scale 0 and codes 0.

    Args:
        q, k, v: float arrays (numpy or CPU torch) ``(..., Lq, d)``, ``(..., Lk, d)``,
            ``(..., Lk, dv)``.
        scale_dtype: ``"float32"`` (default: scale = float32 of the float64 ``max / 127``,
            quotient in float64) or ``"float16"`` (the authors' torch code on float16 tensors:
            inputs rounded to float16, scale and quotient computed in float16).

    Returns:
        :class:`IntFlashInputs` ``(q8, k8, v8, s_q, s_k, s_v, saturated)``.

    Raises:
        TypeError for non-float inputs, ValueError for NaN/Inf, bad shapes or scale_dtype.

    Example::

        >>> qi = quantize_inputs(q, k, v)
        >>> o = intflash_core(*qi[:6], scale=0.125, block_q=64, block_k=64)
    """
    check_choice(scale_dtype, "scale_dtype", SCALE_DTYPES)
    qa = _float_input(q, "q")
    ka = _float_input(k, "k")
    va = _float_input(v, "v")
    q8, s_q, nq = _quantize(qa, 1, scale_dtype)
    k8, s_k, nk = _quantize(ka, 1, scale_dtype)
    v8, s_v, nv = _quantize(va, 2, scale_dtype)
    return IntFlashInputs(q8, k8, v8, s_q, s_k, s_v, (nq, nk, nv))


# ------------------------------------------------------------------------------------------
# the kernel


def _p8_table() -> np.ndarray:
    """``trunc(f16(f16(h * 127) + 0.5))`` for every float16 ``h`` in [0, 1], indexed by
    :func:`_f16_index` (float16 arithmetic rounds each step as the kernel's chain does)."""
    h = np.arange(0x3C01, dtype=np.uint16).view(np.float16)  # the float16 values 0 .. 1
    t = (h * np.float16(127)).astype(np.float16)
    return np.trunc((t + np.float16(0.5)).astype(np.float16)).astype(np.int32)


_P8 = _p8_table()
_F16_NORMAL_BIAS = (127 - 15) << 10  # float32 -> float16 exponent rebias, in 13-bit-shifted bits


@jit(inline="always")
def _f16_index(h):
    """The float16 bit pattern of a non-negative float32 ``h`` that is a float16 value."""
    if h < np.float32(2.0**-14):
        return np.int64(h * np.float32(2.0**24))  # subnormal: h / 2**-24, exact
    return np.int64(f32_as_u32(h) >> np.uint32(13)) - _F16_NORMAL_BIAS


@jit(inline="always")
def _p8_of(p):
    """:func:`_p8` computed instead of looked up (three float16 roundings on the bits, no
    table: loops of it vectorize); equal for every float32 ``p`` in [0, 1]
    (tests/test_exhaustive.py).  As a float32 (an integer in [0, 127])."""
    t = _round_f16(np.float32(_round_f16(p) * np.float32(INT8_QMAX)))  # exact product
    return np.float32(np.floor(_round_f16(np.float32(t + np.float32(0.5)))))


@jit(inline="always")
def _p8(p, table):
    """``trunc(f16(f16(f16(p) * 127) + 0.5))`` for ``0 <= p <= 1`` (an int in [0, 127]): the
    first float16 rounding on the bits, the rest from the 15361-entry table."""
    return table[_f16_index(_round_f16(p))]


@jit(inline="always")
def _acc_tile(acc, r, tile, svb, alpha):
    """``acc[r] = fp32(fp32(acc[r] * alpha) + fp32(fp32(tile * s_v) / 127))`` (the tile's
    integer ``P8 v8`` sums in ``tile``)."""
    for cc in range(acc.shape[1]):
        tv = np.float32(np.float32(np.float32(tile[cc]) * svb) / _F127)
        acc[r, cc] = np.float32(np.float32(acc[r, cc] * alpha) + tv)


@jit(parallel=True)
def _intflash_kernel(S, v8, vh, sq, sk, sv, c, mask, mmap, has_mask, causal, Br, Bc, half,
                     round_out, g0, r0, Lq, p8tab, out):
    """Algorithm 1 on a chunk: ``S (gh, rows, Lk)`` holds the exact int8 score products of
    entries ``g0 ..`` and query rows ``r0 ..`` (``r0`` a multiple of ``Br``); one task per
    (entry, query tile).  ``v8``: float32 holding v's codes, padded with zero keys to a
    multiple of ``Bc`` plus :data:`~._gemm.RED`.  Returns per-task counters
    ``(gh * nq, _NCOUNT)``."""
    gh, rows, Lk = S.shape
    dv = out.shape[2]
    nq = (rows + Br - 1) // Br
    nk = (Lk + Bc - 1) // Bc
    ntask = gh * nq
    cnt = np.zeros((ntask, _NCOUNT), dtype=np.int64)
    bkp = (Bc + RED - 1) // RED * RED  # keys of a tile padded for pv_tile (v8 has them)
    tiled = not half and bkp * INT8_QMAX * INT8_QMAX <= F32_EXACT
    for task in prange(ntask):
        gi = task // nq
        b = g0 + gi
        i0 = r0 + (task % nq) * Br
        nr = min(Br, r0 + rows - i0)
        mb = mmap[b]
        m = np.full(nr, _NINF, dtype=np.float32)
        lsum = np.ones(nr, dtype=np.float32)
        acc = np.zeros((nr, dv), dtype=np.float32)
        y = np.empty(Bc, dtype=np.float32)
        p = np.empty(Bc, dtype=np.float32)
        ti = np.empty(dv, dtype=np.int32)
        tf = np.empty(dv, dtype=np.float32)
        nrp = (nr + ROWS - 1) // ROWS * ROWS
        p8t = np.zeros((nrp, bkp), dtype=np.float32)
        tt = np.empty((nrp, dv), dtype=np.float32)
        alphas = np.empty(nr, dtype=np.float32)
        upd = np.zeros(nr, dtype=np.bool_)
        c_tiles = 0
        c_skip = 0
        c_resc = 0
        c_ovf = 0
        off = Lk - Lq
        for t in range(nk):
            j0 = t * Bc
            nv = min(Bc, Lk - j0)
            upd[:] = False
            if causal and j0 > i0 + nr - 1 + off:
                c_skip += nk - t
                break
            if has_mask:
                anyvis = False
                for r in range(nr):
                    jl = nv
                    if causal:
                        jl = min(nv, i0 + r + off - j0 + 1)
                    for jj in range(jl):
                        if mask[mb, i0 + r, j0 + jj] != _NINF:
                            anyvis = True
                            break
                    if anyvis:
                        break
                if not anyvis:
                    c_skip += 1
                    continue
            c_tiles += 1
            for r in range(nr):
                i = i0 + r
                jl = nv
                if causal:
                    jl = min(nv, i + off - j0 + 1)
                if jl <= 0:
                    continue
                sqi = sq[b, i]
                rkey = order_key(np.int64(np.int32(f32_as_u32(_NINF))))
                for jj in range(jl):
                    # fp32(q8 k8^T): S holds the exact integer (float32 while it is exact there,
                    # else float64), so fp32(S) is the one rounding of the spec
                    sc = np.float32(np.float32(np.float32(S[gi, i - r0, j0 + jj]) * sqi)
                                    * sk[b, j0 + jj])
                    yv = np.float32(sc * c)
                    if has_mask:
                        yv = np.float32(yv + np.float32(mask[mb, i, j0 + jj] * _LOG2E_F32))
                    y[jj] = yv
                    # the row max on the bits (y is finite or -inf; a zero's sign is immaterial
                    # below: exp2 and the comparisons treat -0 as 0)
                    rkey = max(rkey, order_key(np.int64(np.int32(f32_as_u32(yv)))))
                rmax = u32_as_f32(np.uint32(order_key(rkey) & 0xFFFFFFFF))
                if rmax == _NINF:
                    continue
                mo = m[r]
                mn = max(mo, rmax)
                for jj in range(jl):  # vectorized; the rare unsure entries below
                    p[jj] = exp2_f32_or_unsure(np.float32(y[jj] - mn))
                lt = np.float32(0.0)
                for jj in range(jl):
                    pv = p[jj]
                    if pv < 0:
                        pv = _exp2_float(np.float32(y[jj] - mn))
                        p[jj] = pv
                    lt = np.float32(lt + pv)
                alpha = _exp2_float(np.float32(mo - mn))
                if mo != _NINF and mn != mo:
                    c_resc += 1
                lsum[r] = np.float32(np.float32(lsum[r] * alpha) + lt)
                if half:
                    tf[:] = 0.0
                    for jj in range(jl):
                        ph = _round_f16(p[jj])
                        if ph != 0.0:
                            for cc in range(dv):
                                tf[cc] = np.float32(tf[cc] + np.float32(ph * vh[b, j0 + jj, cc]))
                    for cc in range(dv):
                        acc[r, cc] = np.float32(np.float32(acc[r, cc] * alpha) + tf[cc])
                elif tiled:  # P8 of the row; the tile's P8 v8 below, for every row at once
                    for jj in range(jl):
                        p8t[r, jj] = _p8_of(p[jj])
                    for jj in range(jl, bkp):
                        p8t[r, jj] = 0.0
                    alphas[r] = alpha
                    upd[r] = True
                else:
                    ti[:] = 0
                    for jj in range(jl):  # int32 sums: block_k <= BLOCK_K_MAX
                        pq = _p8(p[jj], p8tab)
                        if pq != 0:
                            for cc in range(dv):
                                ti[cc] += pq * np.int64(v8[b, j0 + jj, cc])
                    _acc_tile(acc, r, ti, sv[b], alpha)
                m[r] = mn
            if tiled:  # exact integers in float32 (Bc + 3 keys of |P8 v8| <= 127 * 127)
                pv_tile(p8t, v8[b], tt, j0, nrp, bkp, dv)
                for r in range(nr):
                    if upd[r]:
                        _acc_tile(acc, r, tt[r], sv[b], alphas[r])
        for r in range(nr):
            i = i0 + r
            if m[r] == _NINF:
                for cc in range(dv):
                    out[b, i, cc] = np.nan
                continue
            for cc in range(dv):
                o = np.float32(acc[r, cc] / lsum[r])
                if round_out:
                    oh = _round_f16(o)
                    if math.isinf(oh) and not math.isinf(o):
                        c_ovf += 1
                    o = oh
                out[b, i, cc] = o
        cnt[task, _C_TILES] = c_tiles
        cnt[task, _C_SKIPPED] = c_skip
        cnt[task, _C_RESCALES] = c_resc
        cnt[task, _C_F16_OVF] = c_ovf
    return cnt


# ------------------------------------------------------------------------------------------
# statistics


@dataclass
class IntFlashStats(Stats):
    """Tile and saturation statistics of INT-FlashAttention (specs/attention.md 6 and 8).

    Per call, one int64 array ``(B,)`` per tile counter (leading dims flattened into ``B``):

    Attributes:
        tiles: (query tile, key tile) pairs computed.
        skipped_tiles: pairs skipped because no key of the tile is visible (causal / mask).
        rescales: (row, tile) steps in which a finite running max grew.
        fp16_overflows: output elements that overflowed float16 (became +-inf).
        saturated: per call, ``(q, k, v)`` int8 codes clamped by the quantizer (pipeline
            calls; ``(0, 0, 0)`` for core calls).
        calls: number of calls merged.
    """

    tiles: list = field(default_factory=list)
    skipped_tiles: list = field(default_factory=list)
    rescales: list = field(default_factory=list)
    fp16_overflows: list = field(default_factory=list)
    saturated: list = field(default_factory=list)
    calls: int = 0

    _COUNTERS = ("tiles", "skipped_tiles", "rescales", "fp16_overflows")  # kernel columns
    _totals = _COUNTERS + ("saturated",)
    _hazards = ("total_fp16_overflows", "total_saturated")
    _key = ("total_rescales", "total_skipped_tiles")


# ------------------------------------------------------------------------------------------
# the core



def _scales(x, what: str, shape: tuple) -> np.ndarray:
    arr, _ = to_numpy(x, what)
    if arr.dtype.kind != "f":
        raise TypeError(f"{what} has dtype {arr.dtype}; allowed: float32, float16, float64 "
                        "(rounded to float32)")
    a = np.asarray(arr, dtype=np.float32)
    if not (np.isfinite(a).all() and (a >= 0).all()):
        raise ValueError(f"{what} must be finite and >= 0")
    try:
        return np.ascontiguousarray(np.broadcast_to(a, shape))
    except ValueError:
        raise ValueError(f"{what} of shape {a.shape} does not broadcast to {shape}") from None


def _mask_planes(mask, lead: tuple, Lq: int, Lk: int):
    B = int(np.prod(lead, dtype=np.int64))
    if mask is None:
        return np.zeros((1, 0, 0), dtype=np.float32), np.zeros(B, dtype=np.int64), False
    arr, _ = to_numpy(mask, "mask")
    if arr.dtype == np.bool_:
        arr = np.where(arr, np.float32(0), np.float32(-np.inf))
    elif arr.dtype.kind != "f":
        raise TypeError(f"mask has dtype {arr.dtype}; allowed: bool (True = attend) or float "
                        "(additive, natural-log units, -inf = masked)")
    arr = np.asarray(arr, dtype=np.float32)
    if np.isnan(arr).any() or (arr == np.inf).any():
        raise ValueError("mask contains NaN or +inf; use -inf to mask a key")
    planes, mmap = mask_planes(arr, lead, Lq, Lk, "mask", np.float32)
    return planes, mmap, True


def _run(q8, k8, v8, vh, sq, sk, sv, scale, Br, Bc, causal, half, planes, mmap, has_mask,
         round_out=True):
    """Flat validated arrays -> (float32 out holding float16 values, counters (B, _NCOUNT)):
    the scores by the int8 plumbing's exact GEMM in chunks of whole query tiles."""
    B, Lq, _ = q8.shape
    dv = vh.shape[2] if half else v8.shape[2]
    c = score_unit(scale)
    out = np.empty((B, Lq, dv), dtype=np.float32)
    w = kernel_array
    Lk = k8.shape[1]
    if not half:  # zero keys up to whole tiles plus a pv_tile step (the kernel reads them)
        vp = np.zeros((v8.shape[0], -(-Lk // Bc) * Bc + RED, dv), dtype=np.float32)
        vp[:, :Lk] = v8
        v8 = vp
    args = (w(v8, np.float32), w(vh, np.float32), w(sq, np.float32), w(sk, np.float32),
            w(sv, np.float32), c, w(planes, np.float32), w(mmap, np.int64), has_mask, causal,
            Br, Bc, half, round_out)
    counts = np.zeros((B, _NCOUNT), dtype=np.int64)

    def work(g0, r0, S):
        return sized(_intflash_kernel, S.size)(S, *args, g0, r0, Lq, _P8, out)

    score_chunks(q8, k8, work, counts, align=min(Br, max(Lq, 1)))
    return out, counts


def intflash_core(q8, k8, v8, s_q, s_k, s_v, scale: float, block_q: int = BLOCK_Q_DEFAULT,
                  block_k: int = BLOCK_K_DEFAULT, causal: bool = False, variant: str = "full",
                  *, mask=None, output: str = "float16", return_stats: bool = False):
    """INT-FlashAttention Algorithm 1 on quantized inputs -> float16 output (spec section 6).

    The float32/float16 operations and their order are listed in the module docstring; they
    are emulated bit for bit (float16 rounding on the bits, nearest even).

    Args:
        q8, k8: int8 ``(..., Lq, d)``, ``(..., Lk, d)``.
        v8: int8 ``(..., Lk, dv)`` for ``variant="full"``; for ``variant="half"`` the float16
            values ``v`` themselves (float16 array).
        s_q, s_k: per-token scales broadcastable to ``(..., Lq)`` and ``(..., Lk)`` (float32).
        s_v: per-(batch, head) scale broadcastable to the leading shape (ignored, may be
            None, for ``"half"``).
        scale: softmax scale (``c = fp32(fp32(scale) * fp32(log2 e))``).
        block_q, block_k: tile sizes (results depend on ``block_k`` only).
        causal: bottom-right aligned causal mask (key ``j > i + Lk - Lq`` masked).
        variant: ``"full"`` (int8 P and v) or ``"half"`` (v float16, ``P = f16(p)``).
        mask: optional boolean (True = attend) or additive float mask (natural-log units, -inf
            = masked) broadcastable to ``(..., Lq, Lk)``.
        output: ``"float16"`` (the kernel's output) or ``"float32"`` (``fp32(acc / l)`` before
            the final float16 rounding; for analysis and tests).
        return_stats: also return an :class:`IntFlashStats`.

    Returns:
        float16 (or float32, see ``output``) ``(..., Lq, dv)`` (and the stats).  Rows that see
        no key are NaN.

    Raises:
        TypeError for wrong dtypes, ValueError for shape mismatches, negative/non-finite
        scales, a bad variant, ``d > 131071`` or ``block_k > 133143`` (int32 sums could wrap).

    Example::

        >>> qi = quantize_inputs(q, k, v)
        >>> o16 = intflash_core(qi.q8, qi.k8, qi.v8, qi.s_q, qi.s_k, qi.s_v, 0.125, 64, 64)
    """
    check_choice(variant, "variant", VARIANTS)
    check_choice(output, "output", OUTPUTS)
    half = variant == "half"
    qa = int8_input(q8, "q8")
    ka = int8_input(k8, "k8")
    if half:
        va, _ = to_numpy(v8, "v8")
        if va.dtype != np.float16:
            raise TypeError(f"v8 has dtype {va.dtype}; variant 'half' takes the float16 values "
                            "of v")
        if va.ndim < 2:
            raise ValueError(f"v8 must have shape (..., Lk, dv), got {va.shape}")
        if not np.isfinite(va).all():
            raise ValueError("v8 contains NaN or Inf")
    else:
        va = int8_input(v8, "v8")
    lead = core_lead(qa, ka, va)
    check_real(scale, "scale")
    Br = check_block(block_q, "block_q", qa.shape[-2])
    Bc = check_block(block_k, "block_k", ka.shape[-2])
    if Bc > BLOCK_K_MAX:
        raise ValueError(f"block_k = {Bc} > {BLOCK_K_MAX}: int32 tile sums of P8 v8 could wrap")
    check_bool(causal, "causal")
    check_bool(return_stats, "return_stats")
    Lq, d = qa.shape[-2:]
    Lk, dv = va.shape[-2:]
    B = int(np.prod(lead, dtype=np.int64))
    sq = _scales(s_q, "s_q", lead + (Lq,)).reshape(B, Lq)
    sk = _scales(s_k, "s_k", lead + (Lk,)).reshape(B, Lk)
    if half:
        sv = np.zeros(B, dtype=np.float32)
    else:
        if s_v is None:
            raise ValueError("s_v is required for variant 'full'")
        sv = _scales(s_v, "s_v", lead).reshape(B)

    def flat(a, L, D, dt):
        return flat_lead(a, lead, L, D, dt)

    if half:
        v8f = np.zeros((1, 0, 0), dtype=np.int32)
        vhf = flat(va, Lk, dv, np.float32)
    else:
        v8f = flat(va, Lk, dv, np.int32)
        vhf = np.zeros((1, 0, 0), dtype=np.float32)
    planes, mmap, has_mask = _mask_planes(mask, lead, Lq, Lk)
    out, cnt = _run(flat(qa, Lq, d, np.int8), flat(ka, Lk, d, np.int8), v8f, vhf, sq, sk, sv,
                    scale, Br, Bc, bool(causal), half, planes, mmap, has_mask,
                    output == "float16")
    res = out.astype(np.dtype(output)).reshape(lead + (Lq, dv))
    if return_stats:
        return res, _stats(cnt, (0, 0, 0))
    return res


def _stats(cnt: np.ndarray, saturated: tuple) -> IntFlashStats:
    return IntFlashStats.from_columns(cnt, IntFlashStats._COUNTERS,
                                      saturated=[tuple(int(x) for x in saturated)])


# ------------------------------------------------------------------------------------------
# the float pipeline (scheme "intflash")


def intflash_options(shape, block_q, block_k, variant: str, scale_dtype: str,
                     scale_scope: str) -> tuple[int, int, str]:
    """Scheme ``intflash``'s option checks, in the order and with the messages of the CPU path
    (shared with its device path, :mod:`.intflash_device`): ``(block_q, block_k, scope)``
    for a problem ``shape`` (anything with ``Lq``, ``Lk``, ``d``)."""
    check_choice(variant, "variant", VARIANTS)
    scope = check_choice(scale_scope, "scale_scope", SCALE_SCOPES)
    Br = check_block(block_q, "block_q", shape.Lq)
    Bc = check_block(block_k, "block_k", shape.Lk)
    if Bc > BLOCK_K_MAX:
        raise ValueError(f"block_k = {Bc} > {BLOCK_K_MAX}: int32 tile sums of P8 v8 could wrap")
    if shape.d > D_MAX:
        raise ValueError(f"d = {shape.d} > {D_MAX}: int8 dot products could wrap int32")
    check_choice(scale_dtype, "scale_dtype", SCALE_DTYPES)
    return Br, Bc, scope


def score_unit(scale: float) -> np.float32:
    """``c = fp32(fp32(scale) * fp32(log2 e))``: the authors' ``qk_scale = sm_scale;
    qk_scale *= 1.44269504`` (``sm_scale`` a float32 kernel argument, one float32
    multiplication; fp32(1.44269504) = fp32(log2 e)).  ``fp32(scale * log2 e)`` in float64
    differs by one ulp for ~28 % of scales (1.3, 1/sqrt(48))."""
    return np.float32(np.float32(scale) * _LOG2E_F32)


def _intflash(prob: Problem, return_stats: bool, block_q: int = BLOCK_Q_DEFAULT,
              block_k: int = BLOCK_K_DEFAULT, variant: str = "full",
              scale_dtype: str = "float32", scale_scope: str = "visible"):
    Br, Bc, scope = intflash_options(prob, block_q, block_k, variant, scale_dtype,
                                     scale_scope)
    v = prob.v
    if scope == "visible" and variant == "full":
        # q and k have per-token scales; v's per-(batch, head) scale comes from the keys that
        # take part (a key masked for every row has P = 0: its codes do not matter, so 0)
        keys = prob.taking_part()[1]
        if not keys.all():
            v = np.where(keys[..., None], v, np.float32(0.0))
    qi = quantize_inputs(prob.q, prob.k, v, scale_dtype=scale_dtype)
    half = variant == "half"
    B = prob.B
    if half:
        with np.errstate(over="ignore"):
            vh = prob.v.astype(np.float16)
        if not np.isfinite(vh).all():
            raise ValueError("v does not fit float16 (|v| > 65504) for variant 'half'")
        v8f = np.zeros((1, 0, 0), dtype=np.int32)
        vhf = vh.astype(np.float32)
        sat = (qi.saturated[0], qi.saturated[1], 0)
    else:
        v8f = qi.v8.astype(np.int32)
        vhf = np.zeros((1, 0, 0), dtype=np.float32)
        sat = qi.saturated
    has_mask = prob.mask is not None
    planes = prob.mask if has_mask else np.zeros((1, 0, 0), dtype=np.float32)
    out, cnt = _run(qi.q8, qi.k8, v8f, vhf, qi.s_q.reshape(B, prob.Lq),
                    qi.s_k.reshape(B, prob.Lk), qi.s_v.reshape(B), prob.scale, Br, Bc,
                    prob.causal, half, planes, prob.mask_map, has_mask)
    return out, (_stats(cnt, sat) if return_stats else None)


register(Scheme(
    "intflash",
    "INT-FlashAttention: per-token int8 q/k, int8 (full) or fp16 (half) v, float32 softmax",
    _intflash,
    options=("block_q", "block_k", "variant", "scale_dtype", "scale_scope"),
    variants=("variant", VARIANTS), stats=IntFlashStats, order=30, error_bound=0.3,
    mask_floor=MASK_FLOOR,
    noise=lambda o: "int8_token", device="intflash_device:intflash",
))

__all__ = ["IntFlashInputs", "IntFlashStats", "quantize_inputs", "intflash_core",
           "intflash_options", "score_unit", "BLOCK_Q_DEFAULT", "BLOCK_K_DEFAULT", "VARIANTS"]
