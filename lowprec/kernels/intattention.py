"""IntAttention / IndexSoftmax and the baselines of the same paper (specs/attention.md section 3;
seed ``intattention.txt``, equations 2 to 18, Table 9, Figure 9).

Integer core (public, bit-exact by construction)
------------------------------------------------
:func:`index_softmax` maps int32 logits ``S (..., L, S)`` to 8-bit probabilities, row by row:

1. ``D = rowmax(S) - S`` over the visible entries (eq. 7), ``D' = min(D, c_int)`` (eq. 9).
2. ``E = LUT[idx]`` with the ``2**bits``-entry table of :func:`index_lut` (eq. 10, 13, 14).
3. ``idx`` (eq. 11): ``index_rounding="floor"`` (default) is what the authors' simulation -- the
   code behind every accuracy number of the paper -- computes, ``trunc(fp32(nb * D') /
   fp32(c_int))`` with ``nb = 2**bits - 1``; ``"nearest"`` is eq. 11 as printed, the exact
   rational ``nb * D' / c_int`` rounded half to even.
4. ``Z = rowsum(E)`` (exact), ``P = RNE(fp32(E * 255) / fp32(Z))`` (eq. 15): uint8 in [0, 255];
   rows need not sum to 255.  ``p_format="int8"`` uses 127 instead of 255 (Table 9's INT8 P).

``deploy=True`` models the authors' Arm NEON kernel instead: the threshold is the kernel's ``T``
(pass it as ``c_int``), ``idx = (D' * mult + 2**25) >> 26`` with ``mult = int(fp32(nb * 2**26 /
T) + 0.5)`` (:func:`deploy_multiplier`), the row sum is kept in uint16 and wraps (counted in the
statistics), a row whose wrapped sum is 255 is left unnormalised (the kernel's early exit), else
``ns = uint8(int(fp32(65280 / Z16) + 0.5))`` and ``P = (E * ns + 128) >> 8``.  A wrapped sum
below 255 gives an ``ns`` that does not fit 8 bits: C++ leaves that conversion undefined; we
keep the low byte of the saturated unsigned conversion (what AArch64 ``fcvtzu`` and a byte store
give; ``Z16 = 0`` gives ``ns = 255``) and count the row in ``reciprocal_overflows``.
``neon_tail=True`` also reproduces the kernel's scalar loop over the last ``L % 16`` columns,
which truncates instead of rounding in both shifts.

Float pipelines (``lp.attention(..., scheme=...)``)
--------------------------------------------------
* ``intattention``: int8 q, k, v (symmetric, ``s = amax / 127``, ``x8 = clamp(RNE(x / s), -127,
  127)``, eq. 2-3, computed by :mod:`lowprec.formats.integer`), ``S = q8 k8^T`` exact int32
  (eq. 4), ``c_int = RNE(c / alpha)`` in float64 with ``alpha = s_q s_k scale`` (eq. 8;
  ``deploy=True``: ``T = floor(c / alpha + 0.5)``, the kernel's ``int(x + 0.5)``), the core
  above, ``O = (P v8) * s_v / 255`` (eq. 5; float64, rounded once to float32).
* ``quant_only``: the same int8 logits dequantised in float32 (``((fp32(S) * fp32(scale)) * s_q)
  * s_k``, the authors' order), a correctly rounded float32 softmax (float64 inside),
  ``P8 = RNE(fp32(127 p))`` as int8, ``O = (P8 v8) * s_v / 127``.
* ``index_softmax_only``: float32 scores with the LUT softmax of :func:`index_softmax_float`,
  ``O = P v`` (float64 accumulation of the float32 ``P``).

Granularity (section 3.3, eq. 16-18), option ``granularity``:

* ``per_tensor`` (default, the paper's): one scale each for q, k and v over the whole call (every
  batch and head entry), as the authors' simulation.
* ``per_channel``: one scale per attention head (per entry of the flattened leading dims) for each
  of q, k, v; ``c_int`` per head.
* ``per_block``: q scales per block of ``block`` consecutive query tokens of a head (default
  128, SageAttention's query block), k and v per head; ``c_int`` per (head, query block).
  Key-side blocks are not offered: the integer row max of eq. 7 needs every logit of a row in one
  unit ``alpha``, so the key scale must be constant along a row.

Masking (tiling.py): causal (bottom-right aligned) and ``-inf``/False mask entries are excluded
from the row max and get ``E = 0`` -- equivalent to the authors' fill with the large negative
integer ``-2**20``, without its failure when real logits lie below it (``d >= 65``).  A finite
additive mask value ``m`` is added to the logits in logit units, ``RNE(m / alpha)``, and the sum
saturates to ``+-(2**30 - 1)`` (so ``rowmax - S`` stays in int32; counted in
``mask_saturated``).  A query row that sees no key gives NaN output in every scheme here; the core
returns zeros for such rows (``empty_rows`` in the statistics).

Hazards (spec section 3): ``c_int`` is computed in float64 and a ValueError is raised when it is
< 1 or does not fit int32 (the authors' fp16 arithmetic overflows and silently gives uniform
attention); non-finite q, k, v raise ValueError (the int8 scale needs a finite ``amax``).
"""

from __future__ import annotations

import numpy as np
from numba import prange

from ..formats._arrays import to_numpy
from ..formats._jit import for_size, jit
from ..stats import IntAttentionStats
from . import Scheme, register
from ._check import bool_mask, check_bool, check_choice, check_int, check_real
from ._fp import dense_max
from ._int8 import (
    INT8_QMAX,
    check_positive_scale,
    exact_pv,
    int_scores,
    quantize_problem,
    unnormalized,
)
from ._intattention_rows import (
    _I_CLIPPED,
    _I_DOVF,
    _I_EMPTY,
    _I_NSOVF,
    _I_PSUM,
    _I_VIS,
    _I_WRAP,
    _I_ZERO,
    _MODE_FLOOR,
    _MODE_NEAREST,
    _N_INFO,
    DEPLOY_ROUND,
    DEPLOY_SHIFT,
    INT32_MAX,
    _fused_rows,
    _index_rows,
)
from ._scores import (
    ALL_VISIBLE,
    float64_operands,
    float_rows_output,
    float_scores,
    nan_rows,
)
from .problem import (
    MASK_FLOOR,
    SCALE_SCOPES,
    Problem,
    check_block,
    each_chunk,
    scratch,
    sized,
    softmax_rows,
)

BITS_DEFAULT = 5  # attention.md 3: b = 5, a 32-entry LUT (paper section 4.4)
C_DEFAULT = 6.6  # attention.md 3: clipping threshold c (paper section 4.4)
BITS_MAX = 8  # indices are stored in uint8 while a row is processed
LUT_SCALE = 255  # eq. 13: LUT entries are RNE(255 * exp(...))
P_SCALES = {"uint8": 255, "int8": 127}  # eq. 15 (x255); Table 9's INT8 P (x127)
LOGIT_LIMIT = 2**30 - 1  # logits + mask bias saturate here, so rowmax - S fits int32
DEPLOY_T_MAX = 2**24 - 1  # the kernel computes T and mult in float32: T must be exact there
NEON_LANES = 16  # columns per vector step of the NEON kernel (the rest is the scalar tail)
BLOCK_DEFAULT = 128  # per_block: query tokens per scale block
INDEX_ROUNDINGS = ("floor", "nearest")
GRANULARITIES = ("per_tensor", "per_channel", "per_block")
P_FORMATS = tuple(P_SCALES)


# --------------------------------------------------------------------------------------------
# Statistics


# --------------------------------------------------------------------------------------------
# Validation helpers


def _check_bits(bits, lo: int = 1, hi: int = BITS_MAX) -> int:
    return check_int(bits, "bits", lo, hi)


def _check_c(c) -> float:
    return check_real(c, "c", positive=True)


def _index_mode(index_rounding) -> int:
    rounding = check_choice(index_rounding, "index_rounding", INDEX_ROUNDINGS)
    return _MODE_FLOOR if rounding == "floor" else _MODE_NEAREST


# --------------------------------------------------------------------------------------------
# LUT and constants


def index_lut(bits: int = BITS_DEFAULT, c: float = C_DEFAULT) -> np.ndarray:
    """The UINT8 exponent table of IndexSoftmax (attention.md 3 step 2; paper eq. 10 and 13).

    ``LUT[i] = RNE(255 * exp(-c * i / (2**bits - 1)))`` for ``i < 2**bits - 1`` (float64 exp),
    ``LUT[0] = 255`` and ``LUT[2**bits - 1] = 0``.

    Args:
        bits: LUT resolution ``b`` (1..8); ``2**bits`` entries.
        c: clipping threshold in natural-log units (> 0).

    Returns:
        uint8 array of ``2**bits`` entries, non-increasing.

    Raises:
        ValueError: ``bits`` outside 1..8, ``c`` not finite and positive.  TypeError: ``c`` not
        a number.

    Example:
        >>> index_lut(5, 6.6)[:6]
        array([255, 206, 167, 135, 109,  88], dtype=uint8)
    """
    b = _check_bits(bits)
    cf = _check_c(c)
    nb = (1 << b) - 1
    i = np.arange(nb + 1, dtype=np.float64)
    lut = np.rint(LUT_SCALE * np.exp(-cf * i / nb))
    lut[0] = LUT_SCALE
    lut[nb] = 0
    return lut.astype(np.uint8)


def clip_threshold(alpha, c: float = C_DEFAULT, *, deploy: bool = False):
    """Integer clipping threshold ``c_int`` from the logit scale ``alpha`` (paper eq. 8, 16).

    ``c_int = RNE(c / alpha)`` computed in float64; ``deploy=True`` gives the NEON kernel's
    ``T = floor(c / alpha + 0.5)`` (its ``int(c * c_scale + 0.5f)``, here in float64).

    Args:
        alpha: ``s_q s_k scale`` (float > 0, or an array of them).
        c: clipping threshold in natural-log units.
        deploy: round half up as the deployment kernel instead of half to even.

    Returns:
        int (scalar ``alpha``) or int64 array of ``alpha``'s shape.

    Raises:
        ValueError: ``alpha`` not finite and positive; a threshold < 1 (inputs so large that
        ``alpha > 2 c``) or above ``2**31 - 1`` (inputs so small that the int32 threshold
        overflows -- the authors' fp16 simulation then silently gives uniform attention); in
        deploy mode also above ``2**24 - 1`` (the kernel's float32 ``T`` and ``mult``).

    Example:
        >>> clip_threshold(0.001)
        6600
    """
    cf = _check_c(c)
    a = np.asarray(alpha, dtype=np.float64)
    if not np.all(np.isfinite(a) & (a > 0)):
        raise ValueError("alpha must be finite and > 0 (alpha = s_q * s_k * scale)")
    x = cf / a
    t = np.floor(x + 0.5) if deploy else np.rint(x)
    hi = DEPLOY_T_MAX if deploy else INT32_MAX
    if np.any(t < 1):
        raise ValueError(
            f"c_int = round(c / alpha) = {float(t.min()):.0f} < 1 (c = {cf}, alpha = "
            f"{float(a.max()):.6g}): the int8 logit unit is coarser than the clipping range; "
            "scale q or k down, or raise c"
        )
    if np.any(t > hi):
        raise ValueError(
            f"c_int = round(c / alpha) = {float(t.max()):.6g} does not fit "
            f"{'the deploy kernel (2**24 - 1)' if deploy else 'int32'} (c = {cf}, alpha = "
            f"{float(a.min()):.6g}): q or k are too small for per-tensor int8 logits; use a "
            "finer granularity or rescale the inputs"
        )
    t = t.astype(np.int64)
    return int(t) if t.ndim == 0 else t


def deploy_multiplier(c_int: int, bits: int = BITS_DEFAULT) -> int:
    """Q26 index multiplier of the NEON kernel: ``int(fp32(fp32(nb * 2**26) / fp32(T)) + 0.5)``
    with ``nb = 2**bits - 1`` and every step a float32 operation (attention.md 3, deploy).

    Args:
        c_int: the kernel's threshold ``T`` (1 .. 2**24 - 1).
        bits: LUT resolution (1..5: ``nb * 2**26`` must fit int32).

    Returns:
        int ``mult``; ``idx = (D' * mult + 2**25) >> 26`` maps ``D'`` in ``[0, T]`` to
        ``[0, nb]``.

    Raises:
        ValueError: ``c_int`` or ``bits`` out of range.

    Example:
        >>> deploy_multiplier(6600)
        315208
    """
    b = _check_bits(bits, 1, 5)
    t = check_int(c_int, "deploy c_int (T)", 1, DEPLOY_T_MAX)
    return _deploy_mult(t, (1 << b) - 1)


def _deploy_mult(t: int, nb: int) -> int:
    num = np.float32(nb * (1 << DEPLOY_SHIFT))  # exact: nb * 2**26 has <= 5 significant bits
    q = np.float32(np.float64(num) / np.float64(np.float32(t)))  # one float32 division
    return int(np.float32(np.float64(q) + 0.5))  # float32 add, then truncation


# --------------------------------------------------------------------------------------------
# Numba kernels (plain arrays and ints)


@jit(inline="always")
def _index_of_score(dd, cf, nb32, nb, mode):
    """The LUT index of a clamped distance ``0 <= dd <= cf`` (float32 steps)."""
    q = np.float32(np.float32(dd * nb32) / cf)
    idx = np.int64(q) if mode == _MODE_FLOOR else np.int64(np.rint(q))
    return min(idx, nb)


@jit(parallel=True)
def _float_index_rows(x, lim, vis, has_vis, lut, nb, cf, mode, out):
    """LUT softmax of float32 scores ``x`` (N, L) into ``out`` (float32, or float64 holding the
    float32 results; see :func:`index_softmax_float`); ``-inf`` scores and masked keys give 0,
    rows with NaN or ``+inf``, or without a visible finite score, give NaN.  Rows run in
    parallel; every step is one float32 operation (IEEE: the same bits as the float64
    evaluation rounded once, which the spec states).  Rows with every key visible and finite
    scores run without branches (LLVM vectorizes them)."""
    N, L = x.shape
    nb32 = np.float32(nb)
    ne = lut.shape[0]
    for r in prange(N):
        idxs = np.empty(L, np.int64)
        ptab = np.empty(ne, np.float32)
        top = min(lim[r], L - 1)
        dense = False
        if not has_vis and top == L - 1:
            dense, m = dense_max(x, r)
        if dense:  # two loops: the lookups kept LLVM from vectorizing the first
            for j in range(L):
                idxs[j] = _index_of_score(min(np.float32(m - x[r, j]), cf), cf, nb32, nb, mode)
            z = np.int64(0)
            for j in range(L):
                z += lut[idxs[j]]
        else:
            m = np.float32(-np.inf)
            nvis = 0
            bad = False
            for j in range(top + 1):
                if has_vis and not vis[r, j]:
                    continue
                v = x[r, j]
                if v != v or v == np.inf:
                    bad = True
                if v == -np.inf:
                    continue
                nvis += 1
                if v > m:
                    m = v
            if bad or nvis == 0:
                for j in range(L):
                    out[r, j] = np.nan
                continue
            z = np.int64(0)
            for j in range(L):
                if j > top or (has_vis and not vis[r, j]) or x[r, j] == -np.inf:
                    idxs[j] = -1
                    continue
                dd = np.float32(m - x[r, j])
                if dd > cf:
                    dd = cf
                idx = _index_of_score(dd, cf, nb32, nb, mode)
                idxs[j] = idx
                z += lut[idx]
        zf = np.float32(z)
        for u in range(ne):
            ptab[u] = np.float32(np.float32(lut[u]) / zf)
        if dense:
            for j in range(L):
                out[r, j] = ptab[idxs[j]]
        else:
            for j in range(L):
                out[r, j] = 0.0 if idxs[j] < 0 else ptab[idxs[j]]


@jit(parallel=True)
def _quant_only_rows(S, scale32, sq, sk, add, has_add, lim, vis, has_vis, out):
    """``quant_only`` rows: scores ``fl32(fl32(fl32(S * scale) * s_q) * s_k) (+ add)`` (the
    authors' order), float softmax (float64 inside, rounded to float32), then
    ``P8 = RNE(fp32(127 p))`` into float32 ``out``; masked keys and empty rows give 0.  Returns
    the largest row sum of ``P8``."""
    N, L = S.shape
    psum = np.zeros(N, dtype=np.int64)
    for r in prange(N):
        top = min(lim[r], L - 1)
        sc = np.empty(L, np.float32)
        e = np.empty(L, np.float64)
        m = -np.inf
        for j in range(top + 1):
            t = np.float32(np.float32(np.float32(np.float32(S[r, j]) * scale32) * sq[r]) * sk[r])
            if has_add:
                t = np.float32(t + add[r, j])
            sc[j] = t
            if has_vis and not vis[r, j]:
                continue
            if t > m:
                m = t
        for j in range(L):
            out[r, j] = 0.0
        if m == -np.inf:
            continue
        z = 0.0
        for j in range(top + 1):
            if has_vis and not vis[r, j]:
                continue
            e[j] = np.exp(np.float64(sc[j]) - m)
            z += e[j]
        ps = 0
        for j in range(top + 1):
            if has_vis and not vis[r, j]:
                continue
            p = np.float32(e[j] / z)
            p8 = np.rint(np.float64(np.float32(np.float64(p) * INT8_QMAX)))
            out[r, j] = np.float32(p8)
            ps += np.int64(p8)
        psum[r] = ps
    return psum.max() if N else 0


# --------------------------------------------------------------------------------------------
# Integer core (public)


def _int_logits(s, what: str = "s") -> tuple[np.ndarray, bool]:
    arr, was_torch = to_numpy(s, what)
    if arr.dtype.kind not in "iu":
        raise TypeError(
            f"{what} has dtype {arr.dtype}; allowed: an integer dtype holding int32 logits "
            "(int8, int16, int32, uint8, uint16, or int64/uint32 within the int32 range)"
        )
    if arr.ndim < 1:
        raise ValueError(f"{what} must have shape (..., L, S) (at least one dim), got a scalar")
    if arr.dtype.itemsize >= 4 and arr.dtype != np.int32 and arr.size:
        lo, hi = int(arr.min()), int(arr.max())
        if lo < -(2**31) or hi > INT32_MAX:
            raise ValueError(f"{what} has values in [{lo}, {hi}], outside int32")
    return np.ascontiguousarray(arr, dtype=np.int32), was_torch


def _row_thresholds(c_int, lead: tuple, deploy: bool) -> np.ndarray:
    """``c_int`` broadcast to one int64 threshold per row (``lead`` = s.shape[:-1])."""
    if isinstance(c_int, bool):
        raise TypeError("c_int must be an integer (or an integer array), got bool")
    arr, _ = to_numpy(c_int, "c_int") if not isinstance(c_int, (int, np.integer)) else \
        (np.asarray(c_int), False)
    if arr.dtype.kind not in "iu":
        raise TypeError(
            f"c_int has dtype {arr.dtype}; allowed: an int or an integer array (compute it with "
            "clip_threshold(alpha, c))"
        )
    hi = DEPLOY_T_MAX if deploy else INT32_MAX
    if arr.size and (int(arr.min()) < 1 or int(arr.max()) > hi):
        raise ValueError(
            f"c_int must lie in 1..{hi}{' (deploy: float32-exact T)' if deploy else ''}, got "
            f"values in [{int(arr.min())}, {int(arr.max())}]"
        )
    try:
        full = np.broadcast_to(arr.astype(np.int64), lead)
    except ValueError:
        raise ValueError(
            f"c_int of shape {arr.shape} does not broadcast to the rows of s, {lead} (one "
            "threshold per row, group or tensor)"
        ) from None
    return np.ascontiguousarray(full).reshape(-1)


def _run_core(s2, cint, lim, vis, lut, nb, mode, pmax, deploy, neon_tail, bits):
    """Run the core kernel on (N, L) int32 logits; returns (P uint8 (N, L), info (N, 8))."""
    N, L = s2.shape
    if deploy:
        uniq, inv = np.unique(cint, return_inverse=True)
        mults = np.array([_deploy_mult(int(t), nb) for t in uniq], dtype=np.int64)
        for t, mu in zip(uniq, mults, strict=True):
            top = (int(t) * int(mu) + DEPLOY_ROUND) >> DEPLOY_SHIFT
            if int(t) * int(mu) > INT32_MAX or top > nb:
                raise ValueError(
                    f"deploy: T = {int(t)} with bits = {bits} overflows the kernel's int32 "
                    f"index product (T * mult = {int(t) * int(mu)})"
                )
        mult = mults[inv.reshape(-1)]
        tail_from = (L // NEON_LANES) * NEON_LANES if neon_tail else L
    else:
        mult = np.zeros(1, dtype=np.int64)
        tail_from = L
    has_vis = vis is not None
    v = vis if has_vis else np.ones((1, 1), dtype=np.bool_)
    out = np.empty((N, L), dtype=np.uint8)
    info = np.empty((N, _N_INFO), dtype=np.int64)
    _index_rows(s2, cint, lim, v, has_vis, lut, nb, mode, pmax, deploy, mult, tail_from, out,
                info)
    return out, info


def index_softmax(s, c_int, bits: int = BITS_DEFAULT, index_rounding: str = "floor",
                  mask=None, c: float = C_DEFAULT, *, deploy: bool = False,
                  neon_tail: bool = False, p_format: str = "uint8",
                  return_stats: bool = False):
    """IndexSoftmax on integer logits, rows along the last axis (attention.md 3 steps 1-4).

    Bit-exact integer core of IntAttention: ``D = rowmax - S``, ``D' = min(D, c_int)``
    (eq. 7, 9), ``idx`` (eq. 11; see ``index_rounding``), ``E = LUT[idx]`` (eq. 12-14,
    :func:`index_lut`), ``P = RNE(fp32(E * 255) / fp32(rowsum E))`` (eq. 15).  The module
    docstring gives every rounding, and the ``deploy`` variant (the authors' NEON kernel).

    Args:
        s: int32 logits ``(..., L, S)`` (any integer dtype within int32; numpy or CPU torch).
        c_int: the integer clipping threshold (eq. 8; :func:`clip_threshold`), an int in
            ``1 .. 2**31 - 1`` or an integer array broadcastable to ``s.shape[:-1]`` (one per
            row; rows of a scale group share theirs, eq. 16-17).  Deploy: the kernel's ``T``,
            ``1 .. 2**24 - 1``.
        bits: LUT resolution ``b``, 1..8 (deploy: 1..5).
        index_rounding: ``"floor"`` (default; the authors' simulation,
            ``trunc(fp32(nb * D') / fp32(c_int))``) or ``"nearest"`` (eq. 11 as printed:
            ``nb * D' / c_int`` rounded half to even, exactly).  Ignored when ``deploy``.
        mask: optional bool array broadcastable to ``s.shape``; True = the key takes part
            (torch SDPA's convention).  Masked keys are left out of the row max and get
            ``E = 0``.
        c: the clipping threshold in natural-log units that built the LUT (default 6.6).
        deploy: emulate the authors' Arm NEON kernel (Q26 rounding-shift index, uint16 row sum
            that wraps, 8-bit reciprocal normalisation, early exit at row sum 255).
        neon_tail: deploy only: the last ``S % 16`` columns truncate in both shifts, as the
            kernel's scalar tail loop does.
        p_format: ``"uint8"`` (x255, default) or ``"int8"`` (x127; Table 9's INT8 P; not with
            ``deploy``).
        return_stats: also return an :class:`IntAttentionStats` (``uint16_wraps`` in deploy).

    Returns:
        ``P`` of ``s.shape``: uint8 in [0, 255] (int8 in [0, 127] for ``p_format="int8"``),
        numpy or torch as ``s``; rows without a visible key are all 0.  With
        ``return_stats``: ``(P, stats)``.

    Raises:
        TypeError: non-integer ``s`` or ``c_int``, non-bool ``mask`` or flags.
        ValueError: logits outside int32, ``c_int`` out of range or not broadcastable, bad
            ``bits``, ``c``, ``index_rounding``, ``p_format``, a mask that does not broadcast,
            ``deploy`` with ``p_format="int8"``, ``neon_tail`` without ``deploy``.

    Example:
        >>> s = np.array([[0, -1000, -6600, 500]], dtype=np.int32)
        >>> index_softmax(s, 6600)          # idx = 2, 7, 31, 0: E = 167, 57, 0, 255
        array([[ 89,  30,   0, 136]], dtype=uint8)
        >>> index_softmax(s, 6600, deploy=True)
        array([[ 89,  30,   0, 135]], dtype=uint8)
    """
    b = _check_bits(bits, 1, 5 if check_bool(deploy, "deploy") else BITS_MAX)
    cf = _check_c(c)
    mode = _index_mode(index_rounding)
    pf = check_choice(p_format, "p_format", P_FORMATS)
    tail = check_bool(neon_tail, "neon_tail")
    check_bool(return_stats, "return_stats")
    if deploy and pf != "uint8":
        raise ValueError("deploy=True models the UINT8 kernel: p_format must be 'uint8'")
    if tail and not deploy:
        raise ValueError("neon_tail=True needs deploy=True (it models the NEON kernel's tail)")
    arr, was_torch = _int_logits(s)
    shape = arr.shape
    cint = _row_thresholds(c_int, shape[:-1], deploy)
    L = shape[-1]
    s2 = arr.reshape((-1, L)) if arr.size else arr.reshape((int(np.prod(shape[:-1])), L))
    vis = None if mask is None else bool_mask(mask, shape).reshape(s2.shape)
    lut = index_lut(b, cf).astype(np.int64)
    lim = np.full(s2.shape[0], L - 1, dtype=np.int64)
    out, info = _run_core(s2, cint, lim, vis, lut, (1 << b) - 1, mode, P_SCALES[pf], bool(deploy),
                          tail, b)
    res = out.reshape(shape)
    if pf == "int8":
        res = res.view(np.int8)
    if was_torch:
        import torch

        res = torch.from_numpy(res)
    if not return_stats:
        return res
    c_rec = np.asarray(c_int).astype(np.int64).reshape(1, -1)
    st = _core_stats(info, 1, c_rec)
    return res, st


def _core_stats(info: np.ndarray, B: int, c_rec: np.ndarray, quantized: int = 0,
                saturated: int = 0, mask_saturated: int = 0) -> IntAttentionStats:
    per = info.reshape((B, -1, _N_INFO)).sum(axis=1) if info.size else \
        np.zeros((B, _N_INFO), dtype=np.int64)
    return _head_stats(per, int(info.shape[0]), c_rec, quantized, saturated, mask_saturated)


def _head_stats(per: np.ndarray, rows: int, c_rec: np.ndarray, quantized: int = 0,
                saturated: int = 0, mask_saturated: int = 0) -> IntAttentionStats:
    """The statistics of a call from its per-entry sums of the row counters ``per (B, 8)``
    (:func:`_core_stats`; the device path sums on the device)."""
    tot = per.sum(axis=0)
    return IntAttentionStats(
        calls=1, rows=int(rows), empty_rows=int(tot[_I_EMPTY]),
        logits=int(tot[_I_VIS]), clipped=int(tot[_I_CLIPPED]), zero_exp=int(tot[_I_ZERO]),
        quantized=int(quantized), saturated=int(saturated), mask_saturated=int(mask_saturated),
        uint16_wraps=int(tot[_I_WRAP]), reciprocal_overflows=int(tot[_I_NSOVF]),
        diff_overflows=int(tot[_I_DOVF]), c_int=[c_rec],
        head_logits=[per[:, _I_VIS].copy()], head_clipped=[per[:, _I_CLIPPED].copy()],
        head_wraps=[per[:, _I_WRAP].copy()],
    )


# --------------------------------------------------------------------------------------------
# Softmax surrogates on float scores (public)


def index_softmax_float(scores, axis: int = -1, *, bits: int = BITS_DEFAULT,
                        c: float = C_DEFAULT, index_rounding: str = "floor",
                        return_stats: bool = False):
    """IndexSoftmax on float scores: the ``index_softmax`` softmax surrogate and the softmax of
    the ``index_softmax_only`` baseline (the authors' ``idx_softmax_fp``).

    Per row, in float32 arithmetic (each step one correctly rounded float32 operation):
    ``D = min(rowmax - x, c)``, ``idx = trunc(fp32(fp32(D * nb) / fp32(c)))`` (``"nearest"``:
    the same quotient rounded half to even), clamped to ``nb = 2**bits - 1``; ``E = LUT[idx]``
    (:func:`index_lut`, integers 0..255); returns ``fp32(E / fp32(rowsum E))``.  The float
    scores are the logits in natural-log units, so no scale is involved.

    Args:
        scores: float32/float16/bfloat16/float64 array or CPU tensor (float64 is rounded to
            float32 first).
        axis: the softmax axis.
        bits: LUT resolution (1..8).
        c: clipping threshold (natural-log units, > 0).
        index_rounding: ``"floor"`` or ``"nearest"``.
        return_stats: also return an :class:`IntAttentionStats` (``rows``, ``empty_rows``,
            ``logits``).

    Returns:
        float32 probabilities in [0, 1], same shape and kind as ``scores``: the normalised LUT
        values (not quantised to 8 bits; rows sum to 1 up to float32 rounding).  ``-inf``
        entries give 0; a row with NaN or ``+inf``, or with every entry ``-inf``, gives NaN.
        With ``return_stats``: ``(p, stats)``.

    Raises:
        TypeError / ValueError: non-float scores, bad axis, bad ``bits``, ``c`` or
        ``index_rounding``.

    Example:
        >>> index_softmax_float(np.array([0.0, 0.0, -100.0], np.float32))
        array([0.5, 0.5, 0. ], dtype=float32)
    """
    b = _check_bits(bits)
    cf = _check_c(c)
    mode = _index_mode(index_rounding)
    check_bool(return_stats, "return_stats")
    rows, restore = softmax_rows(scores, axis)
    out = np.empty(rows.shape, dtype=np.float32)
    lim = np.full(rows.shape[0], rows.shape[1] - 1, dtype=np.int64)
    for_size(_float_index_rows, rows.size)(rows, lim, np.ones((1, 1), np.bool_), False,
                      index_lut(b, cf).astype(np.int64), (1 << b) - 1, np.float32(cf), mode, out)
    if not return_stats:
        return restore(out)
    fin = rows > -np.inf
    empty = int(np.count_nonzero(~fin.any(axis=1))) if rows.shape[1] else rows.shape[0]
    return restore(out), IntAttentionStats(calls=1, rows=rows.shape[0], empty_rows=empty,
                                           logits=int(np.count_nonzero(fin)))


# --------------------------------------------------------------------------------------------
# Float pipelines


def _out_rows(acc: np.ndarray, sv: np.ndarray, pmax: int) -> np.ndarray:
    """``(acc * s_v) / pmax`` in float64 (acc exact integers), per head ``s_v``."""
    return (acc.astype(np.float64) * sv.astype(np.float64)[:, None, None]) / float(pmax)


def _check_granularity(granularity, block, Lq: int) -> tuple[str, int]:
    g = check_choice(granularity, "granularity", GRANULARITIES)
    return g, check_block(block, "block", Lq)  # one block of every row = per entry


def _check_depth(d: int) -> None:
    if INT8_QMAX * INT8_QMAX * d > LOGIT_LIMIT:
        raise ValueError(f"head dim d = {d} is too large for int32 logits (d <= 66571)")


def intattention_options(prob, bits, c, index_rounding, granularity, block, deploy, neon_tail,
                        p_format, scale_scope) -> tuple:
    """The checks of ``intattention``'s options against a problem (a
    :class:`~.problem.Problem` or its device twin), in the scheme's order and with its
    messages: ``(deploy, bits, c, index mode, granularity, block, p_format, neon_tail,
    scale_scope)``."""
    dep = check_bool(deploy, "deploy")
    b = _check_bits(bits, 1, 5 if dep else BITS_MAX)
    cf = _check_c(c)
    mode = _index_mode(index_rounding)
    gran, blk = _check_granularity(granularity, block, prob.Lq)
    pf = check_choice(p_format, "p_format", P_FORMATS)
    tail = check_bool(neon_tail, "neon_tail")
    if dep and pf != "uint8":
        raise ValueError("deploy=True models the UINT8 kernel: p_format must be 'uint8'")
    if tail and not dep:
        raise ValueError("neon_tail=True needs deploy=True (it models the NEON kernel's tail)")
    _check_depth(prob.d)
    check_positive_scale(prob.scale, "intattention", "c_int = c / alpha")
    return dep, b, cf, mode, gran, blk, pf, tail, check_choice(scale_scope, "scale_scope",
                                                               SCALE_SCOPES)


def _intattention(prob: Problem, return_stats: bool, bits: int = BITS_DEFAULT,
                  c: float = C_DEFAULT, index_rounding: str = "floor",
                  granularity: str = "per_tensor", block: int = BLOCK_DEFAULT,
                  deploy: bool = False, neon_tail: bool = False, p_format: str = "uint8",
                  scale_scope: str = "visible"):
    """Scheme ``intattention`` (module docstring).  Options: ``bits`` (1..8, deploy 1..5),
    ``c``, ``index_rounding``, ``granularity`` (per_tensor, per_channel, per_block), ``block``
    (per_block query tokens, default 128), ``deploy``, ``neon_tail``, ``p_format``,
    ``scale_scope`` (``"visible"``: scales from the rows and keys that take part, per_tensor
    per sequence; ``"tensor"``: the paper's, over every entry)."""
    dep, b, cf, mode, gran, blk, pf, tail, scope = intattention_options(
        prob, bits, c, index_rounding, granularity, block, deploy, neon_tail, p_format,
        scale_scope)
    B, Lq, Lk = prob.B, prob.Lq, prob.Lk
    qz = quantize_problem(prob, gran, blk, scope)
    alpha_row = qz.sq_row.astype(np.float64) * qz.sk.astype(np.float64)[:, None] * prob.scale
    cint_row = clip_threshold(alpha_row, cf, deploy=dep) if alpha_row.size else \
        np.zeros((B, Lq), dtype=np.int64)
    cint_row = np.asarray(cint_row, dtype=np.int64).reshape((B, Lq))
    lut = index_lut(b, cf).astype(np.int64)
    nb = (1 << b) - 1
    pmax = P_SCALES[pf]
    info_all = np.zeros((B, Lq, _N_INFO), dtype=np.int64)
    msat = [0]

    def step(g0, g1, r0, r1, rm):
        gh, rows = g1 - g0, r1 - r0
        sat = 0
        lim, vis, add = rm
        S = int_scores(qz.q8[g0:g1, r0:r1], qz.k8t[g0:g1])  # exact integers (< 2**31)
        cint = np.ascontiguousarray(cint_row[g0:g1, r0:r1]).reshape(-1)
        if not dep and vis is None and add is None:  # fast path: no dtype copies
            info = np.empty((gh * rows, _N_INFO), dtype=np.int64)
            P = np.empty((gh, rows, Lk), dtype=np.float32)
            _fused_rows(S.reshape((gh * rows, Lk)), cint, lim, lut, nb, mode, pmax,
                        P.reshape((gh * rows, Lk)), info)
        else:
            if add is not None:
                bias = np.clip(np.rint(add.astype(np.float64) / alpha_row[g0:g1, r0:r1, None]),
                               -2.0 * LOGIT_LIMIT, 2.0 * LOGIT_LIMIT)
                S = S + bias
                big = np.abs(S) > LOGIT_LIMIT
                if vis is not None:
                    big &= vis.reshape(S.shape)
                sat = int(np.count_nonzero(big))
                S = np.clip(S, -LOGIT_LIMIT, LOGIT_LIMIT)
            s2 = S.astype(np.int32).reshape((gh * rows, Lk))
            P, info = _run_core(s2, cint, lim, vis, lut, nb, mode, pmax, dep, tail, b)
            P = P.reshape((gh, rows, Lk))
        psum = int(info[:, _I_PSUM].max()) if info.size else 0
        info_all[g0:g1, r0:r1] = info.reshape((gh, rows, _N_INFO))
        return _out_rows(exact_pv(P, qz.v8[g0:g1], psum), qz.sv[g0:g1], pmax), sat

    def then(sat):
        msat[0] += sat

    out = each_chunk(prob, step, then)
    msat = msat[0]
    if not return_stats:
        return out, None
    c_rec = cint_row[:, ::qz.block][:, :qz.groups] if Lq else np.zeros((B, 0), np.int64)
    st = _core_stats(info_all.reshape((-1, _N_INFO)), B, np.ascontiguousarray(c_rec),
                     qz.quantized, qz.saturated, msat)
    seen = info_all[..., _I_VIS] > 0
    st.unnormalized_rows = unnormalized(info_all[..., _I_PSUM], float(pmax), seen)
    return out, st


def _index_softmax_only(prob: Problem, return_stats: bool, bits: int = BITS_DEFAULT,
                        c: float = C_DEFAULT, index_rounding: str = "floor"):
    """Scheme ``index_softmax_only``: float32 scores ``fp32(fp64(q . k) * scale) + mask``,
    :func:`index_softmax_float`, ``O = P v`` (float64 sums of the float32 ``P``)."""
    b = _check_bits(bits)
    cf = _check_c(c)
    mode = _index_mode(index_rounding)
    Lk = prob.Lk
    lut = index_lut(b, cf).astype(np.int64)
    q64, k64t, v64 = float64_operands(prob)
    empty_rows = []

    def step(g0, g1, r0, r1, rm):
        lim, vis, add = rm
        sc = float_scores(prob, g0, g1, r0, r1, add, q64, k64t)
        P = scratch("index_softmax_only.P", sc.shape, np.float64)
        sized(_float_index_rows, sc.size)(sc, lim, ALL_VISIBLE if vis is None else vis,
                                          vis is not None, lut, (1 << b) - 1, np.float32(cf),
                                          mode, P)
        return float_rows_output(P.reshape((g1 - g0, r1 - r0, Lk)), v64, g0, g1), nan_rows(P)

    out = each_chunk(prob, step, empty_rows.append)
    st = IntAttentionStats(calls=1, rows=prob.B * prob.Lq, empty_rows=sum(empty_rows)) \
        if return_stats else None
    return out, st


def _quant_only(prob: Problem, return_stats: bool, granularity: str = "per_tensor",
                block: int = BLOCK_DEFAULT, scale_scope: str = "visible"):
    """Scheme ``quant_only`` (module docstring); ``granularity``, ``block`` and
    ``scale_scope`` as ``intattention``."""
    gran, blk = _check_granularity(granularity, block, prob.Lq)
    Lk = prob.Lk
    _check_depth(prob.d)
    qz = quantize_problem(prob, gran, blk, check_choice(scale_scope, "scale_scope",
                                                        SCALE_SCOPES))
    scale32 = np.float32(prob.scale)
    counts = np.zeros(2, dtype=np.int64)  # empty rows, unnormalized rows

    def step(g0, g1, r0, r1, rm):
        gh, rows = g1 - g0, r1 - r0
        lim, vis, add = rm
        S = int_scores(qz.q8[g0:g1, r0:r1], qz.k8t[g0:g1]).reshape((gh * rows, Lk))
        sq = np.ascontiguousarray(qz.sq_row[g0:g1, r0:r1]).reshape(-1)
        sk = np.repeat(qz.sk[g0:g1], rows)
        P8 = np.empty(S.shape, dtype=np.float32)
        addr = add.reshape(S.shape) if add is not None else P8
        psum = sized(_quant_only_rows, S.size)(S, scale32, sq, sk, addr, add is not None, lim,
                                               ALL_VISIBLE if vis is None else vis,
                                               vis is not None, P8)
        none = rm.none_visible(Lk)
        cnt = (int(none.sum()),
               unnormalized(P8.sum(axis=1, dtype=np.float64), float(INT8_QMAX), ~none))
        return _out_rows(exact_pv(P8.reshape((gh, rows, Lk)), qz.v8[g0:g1], psum),
                         qz.sv[g0:g1], INT8_QMAX), cnt

    def then(cnt):
        counts[:] += cnt

    out = each_chunk(prob, step, then)
    st = None
    if return_stats:
        st = IntAttentionStats(calls=1, rows=prob.B * prob.Lq, empty_rows=int(counts[0]),
                               quantized=qz.quantized, saturated=qz.saturated,
                               unnormalized_rows=int(counts[1]))
    return out, st


# --------------------------------------------------------------------------------------------
# Softmax-surrogate front ends and registration


def _noise_model(options: dict) -> str:
    """The q/k rounding of the int8 pipelines for ``Stats.noisy_rows`` (per_block's query
    scales are finer than one per entry: the entry estimate bounds them)."""
    return "int8_tensor" if options.get("granularity", "per_tensor") == "per_tensor" \
        else "int8_entry"


def _softmax_index(scores, axis, return_stats, **opts):
    return index_softmax_float(scores, axis, return_stats=True, **opts)


register(Scheme(
    "intattention",
    "IntAttention: int8 q/k/v, int32 logits, IndexSoftmax LUT (b=5, c=6.6), UINT8 P",
    _intattention,
    options=("bits", "c", "index_rounding", "granularity", "block", "deploy", "neon_tail",
             "p_format", "scale_scope"),
    stats=IntAttentionStats, order=50, error_bound=0.2, mask_floor=MASK_FLOOR, noise=_noise_model,
    device="intattention_device:intattention",
))
register(Scheme(
    "quant_only",
    "IntAttention baseline: int8 q/k/v, float32 softmax, P = RNE(127 p) as int8",
    _quant_only, options=("granularity", "block", "scale_scope"), stats=IntAttentionStats,
    order=60, error_bound=0.2,
    mask_floor=MASK_FLOOR, noise=_noise_model, device="intattention_device:quant_only",
))
register(Scheme(
    "index_softmax_only",
    "IntAttention baseline: float32 scores with the IndexSoftmax LUT softmax",
    _index_softmax_only, options=("bits", "c", "index_rounding"), stats=IntAttentionStats,
    order=70, error_bound=0.12, mask_floor=MASK_FLOOR,
    device="intattention_device:index_softmax_only",
))
register(Scheme("index_softmax", "IndexSoftmax LUT softmax on float scores (b=5, c=6.6)",
                _softmax_index, options=("bits", "c", "index_rounding"), kind="softmax",
                stats=IntAttentionStats,
                mask_floor=MASK_FLOOR))
__all__ = [
    "index_softmax", "index_lut", "clip_threshold", "deploy_multiplier", "index_softmax_float",
    "IntAttentionStats", "BITS_DEFAULT", "C_DEFAULT",
    "BLOCK_DEFAULT", "GRANULARITIES", "INDEX_ROUNDINGS", "P_FORMATS",
]


_MOVED = {"exaq_softmax", "exaq_clip", "EXAQ_AB", "EXAQ_BITS_DEFAULT"}  # to lowprec.kernels.exaq


def __getattr__(name: str):
    # EXAQ (another paper) lives in lowprec.kernels.exaq; its names stay reachable here as
    # deprecated aliases (imported on first use only, so this module imports no scheme module)
    if name in _MOVED:
        import importlib

        return getattr(importlib.import_module("lowprec.kernels.exaq"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
