"""The float32-order evaluation (``exact=False``, the default) of I-ViT Shiftmax and I-BERT
i-exp: the Numba row kernels behind :func:`lowprec.kernels.baselines.ivit_shiftmax` and
:func:`~lowprec.kernels.baselines.ibert_softmax` (whose module docstring gives the arithmetic
and its float32 order), kept apart so that ``baselines.py`` stays under the kernels' 900-line
limit.  Only ``baselines.py`` imports this module.

Every row takes one of two paths that give the same bits:

* the general path (masked entries, ``-inf``, NaN or ``+inf``, a row maximum of zero): the
  entries one by one, as the published code;
* the dense path (every entry visible and finite): the same float32 operations written without
  branches, so that LLVM vectorizes them.  The row maximum of ``fl(x / s)`` is ``fl(max x /
  s)`` (division by ``s > 0`` is monotone; a zero maximum goes the general path, which keeps the
  sign of the first maximal zero), taken on the bits; ``2**k`` is built from its bits; a row sum
  of integer-valued float32 terms whose exact total is at most ``2**24`` is that total (every
  partial sum is then exact), else it is taken left to right.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from ..formats._bits import F32_FRAC_BITS, f32_as_u32, u32_as_f32
from ..formats._jit import jit
from ._baselines_exact import (
    _C_EMPTY,
    _C_FLOOR,
    _C_NAN,
    _C_REQ,
    _C_SUM,
    _C_ZERO,
    IBERT_E16_MAX,
    IBERT_E16_MIN,
    _visible,
)
from ._fp import add32 as _add
from ._fp import dense_max as _dense_max
from ._fp import div32 as _div
from ._fp import floor32 as _floor
from ._fp import mul32 as _mul
from ._fp import sub32 as _sub
from ._surrogate import row_block, vis_block

_POW2_F32 = np.ldexp(1.0, np.arange(64)).astype(np.float32)  # 2**k, exact
_HALF32 = np.float32(0.5)
_SIXTEENTH32 = np.float32(0.0625)
_F32_BIAS = 127  # exponent bias: 2**k has the bits (k + 127) << 23
_EXACT_SUM = 1 << 24  # non-negative integer float32 terms summing to at most this: exact sums


# --------------------------------------------------------------------------------------------
# dense-row helpers (branch-free loops that LLVM vectorizes)


@jit(inline="always")
def _pow2(k):
    """float32 ``2**k`` for an integer ``0 <= k <= 127`` (from its bits)."""
    return u32_as_f32(np.uint32((np.int64(k) + _F32_BIAS) << F32_FRAC_BITS))


@jit(inline="always")
def _left_sum(e, L):
    """float32 sum ``e[0] + e[1] + ...`` taken left to right of non-negative integer-valued
    float32 terms: their exact total when it is at most ``2**24``."""
    tot = np.int64(0)
    neg = False
    for j in range(L):
        tot += min(np.int64(e[j]), np.int64(_EXACT_SUM + 1))
        neg |= e[j] < 0
    if tot <= _EXACT_SUM and not neg:
        return np.float32(tot)
    z = np.float32(0.0)
    for j in range(L):
        z = _add(z, e[j])
    return z


@jit(inline="always")
def _dense_normalise(y, r, e, f, out_div, counts):
    """:func:`_normalise_row` of a row whose entries are all used."""
    zero = 0
    for j in range(e.shape[0]):
        v = _floor(_div(_mul(e[j], f), out_div))
        y[r, j] = v
        zero += v == 0
    counts[_C_ZERO] += zero


# --------------------------------------------------------------------------------------------
# general-row helpers


@jit(inline="always")
def _row_scan_f32(x, vis, use_vis, r, s, xi, used):
    """float32 ``x / s`` of the visible entries of row r into xi; returns (count, max, bad)."""
    L = x.shape[1]
    cnt = 0
    bad = False
    m = np.float32(-np.inf)
    for j in range(L):
        u = _visible(x, vis, use_vis, r, j)
        used[j] = u
        if not u:
            continue
        v = x[r, j]
        if not v < np.inf:  # NaN or +inf
            bad = True
        t = _div(v, s)
        xi[j] = t
        if t > m:
            m = t
        cnt += 1
    return cnt, m, bad


@jit(inline="always")
def _normalise_row(y, r, e, used, f, out_div, counts):
    """Output row ``r`` in float32 order: ``y = floor(fl(fl(e f) / out_div))`` where ``used``,
    0 elsewhere; counts the zero outputs."""
    for j in range(e.shape[0]):
        if not used[j]:
            y[r, j] = 0.0
            continue
        v = _floor(_div(_mul(e[j], f), out_div))
        y[r, j] = v
        if v == 0:
            counts[_C_ZERO] += 1


# --------------------------------------------------------------------------------------------
# I-ViT Shiftmax


@jit(inline="always")
def _ivit_e(xs, m, x0, nx0, n):
    """Shiftmax's ``e`` of one entry in float32 order from ``xs = fl(x / s)`` and the row max
    ``m``; returns ``(e, clamped to the floor n x0)``."""
    t = _sub(xs, m)
    a = _floor(_mul(t, _HALF32))
    b = _floor(_mul(t, _SIXTEENTH32))
    t = _sub(_add(t, a), b)
    clamped = t < nx0
    if clamped:
        t = nx0
    q = _floor(_div(t, x0))
    rr = _sub(t, _mul(x0, q))
    u = _sub(_mul(rr, _HALF32), x0)
    ev = _floor(_mul(u, _POW2_F32[int(n - q)]))  # 0 <= n - q <= n
    if ev < 0:
        ev = np.float32(0.0)
    return ev, clamped


@jit(inline="always")
def _ivit_e_dense(x, r, s, m, x0, nx0, n, e):
    """:func:`_ivit_e` of every entry of a dense row into ``e``; returns the floor clamps."""
    nfl = 0
    for j in range(x.shape[1]):
        t = _sub(_div(x[r, j], s), m)
        t = _sub(_add(t, _floor(_mul(t, _HALF32))), _floor(_mul(t, _SIXTEENTH32)))
        cl = t < nx0
        t = nx0 if cl else t
        nfl += cl
        q = _floor(_div(t, x0))
        u = _sub(_mul(_sub(t, _mul(x0, q)), _HALF32), x0)
        ev = _floor(_mul(u, _pow2(n - np.int64(q))))  # 0 <= n - q <= n
        e[j] = np.float32(0.0) if ev < 0 else ev
    return nfl


@jit(inline="always")
def _left_sums4(E, z):
    """:func:`_left_sum` of the four rows of ``E (4, L)`` into ``z``: the exact totals where
    they are at most ``2**24``, else the four left-to-right sums interleaved (independent
    chains of additions; one row's sums take as long as four's)."""
    L = E.shape[1]
    exact = True
    for k in range(4):
        tot = np.int64(0)
        neg = False
        for j in range(L):
            tot += min(np.int64(E[k, j]), np.int64(_EXACT_SUM + 1))
            neg |= E[k, j] < 0
        z[k] = np.float32(tot)
        exact &= tot <= _EXACT_SUM and not neg
    if not exact:
        z0 = z1 = z2 = z3 = np.float32(0.0)
        for j in range(L):
            z0 = _add(z0, E[0, j])
            z1 = _add(z1, E[1, j])
            z2 = _add(z2, E[2, j])
            z3 = _add(z3, E[3, j])
        z[0], z[1], z[2], z[3] = z0, z1, z2, z3


@jit(inline="always")
def _ivit_finish(y, r, e, used, dense, z, out_bits, counts):
    """Clamp the row sum ``z``, take the reciprocal and write output row ``r``."""
    two31 = np.float32(2.0**31)
    out_div = np.float32(2.0 ** (32 - out_bits))
    if z >= two31:
        z = two31
        counts[_C_SUM] += 1
    f = _floor(_div(two31, z))
    if dense:
        _dense_normalise(y, r, e, f, out_div, counts)
    else:
        _normalise_row(y, r, e, used, f, out_div, counts)


@jit
def _ivit_f32(x, codes, xvals, vis, s, x0, nx0, n, out_bits, y, counts):
    """I-ViT Shiftmax rows in float32 order.  With ``codes`` (uint8 ``(R, L)``, the index of
    each entry's value in ``xvals``; ``(0, 0)`` = none) every row evaluates ``e`` once per code
    (the same float32 operations on the same values, so the same bits) and looks entries up.
    Dense rows go four at a time, so that their row sums interleave (:func:`_left_sums4`)."""
    R, L = x.shape
    use_vis = vis.shape[0] > 0
    coded = codes.shape[0] > 0
    nc = xvals.shape[0]
    xi = np.empty(L, np.float32)
    E = np.zeros((4, L), np.float32)  # e of the group's dense rows
    zg = np.empty(4, np.float32)
    rows = np.empty(4, np.int64)
    used = np.empty(L, np.bool_)
    etabs = np.empty((nc, nc), np.float32)  # e of every code for each row max code (cached:
    ftabs = np.empty((nc, nc), np.bool_)  # e depends on the entry's and the max's codes only)
    have = np.zeros(nc, np.bool_)
    for g in range(0, R, 4):
        nd = 0
        for r in range(g, min(R, g + 4)):
            dense = False
            if coded:  # the visible max code gives the max of fl(x / s) (monotone in x)
                cnt = 0
                cm = 0
                if not use_vis:
                    for j in range(L):
                        cm = max(cm, np.int64(codes[r, j]))
                    cnt = L
                    dense = True
                else:
                    for j in range(L):
                        used[j] = vis[r, j]
                        if used[j]:
                            cnt += 1
                            cm = max(cm, np.int64(codes[r, j]))
                m = _div(xvals[cm], s)
                bad = False
            elif not use_vis:
                dense, mx = _dense_max(x, r)
                if dense:
                    cnt, m, bad = L, _div(mx, s), False
            if not coded and not dense:
                cnt, m, bad = _row_scan_f32(x, vis, use_vis, r, s, xi, used)
            if cnt == 0 or bad:
                counts[_C_EMPTY if cnt == 0 else _C_NAN] += 1
                for j in range(L):
                    y[r, j] = np.nan
                continue
            if coded:
                if not have[cm]:
                    for c in range(cm + 1):
                        etabs[cm, c], ftabs[cm, c] = _ivit_e(_div(xvals[c], s), m, x0, nx0, n)
                    have[cm] = True
                etab, ftab = etabs[cm], ftabs[cm]
            if dense:  # e now, the row sum with the group's
                e = E[nd]
                if coded:
                    nfl = 0
                    for j in range(L):
                        e[j] = etab[codes[r, j]]
                        nfl += ftab[codes[r, j]]
                else:
                    nfl = _ivit_e_dense(x, r, s, m, x0, nx0, n, e)
                counts[_C_FLOOR] += nfl
                rows[nd] = r
                nd += 1
                continue
            e = E[3]  # a general row is finished at once (its slot is not taken yet)
            z = np.float32(0.0)
            for j in range(L):
                if not used[j]:
                    continue
                if coded:
                    ev = etab[codes[r, j]]
                    clamped = ftab[codes[r, j]]
                else:
                    ev, clamped = _ivit_e(xi[j], m, x0, nx0, n)
                if clamped:
                    counts[_C_FLOOR] += 1
                e[j] = ev
                z = _add(z, ev)
            _ivit_finish(y, r, e, used, False, z, out_bits, counts)
        if nd == 1:
            _ivit_finish(y, rows[0], E[0], used, True, _left_sum(E[0], L), out_bits, counts)
        elif nd > 1:
            _left_sums4(E, zg)
            for k in range(nd):
                _ivit_finish(y, rows[k], E[k], used, True, zg[k], out_bits, counts)


# --------------------------------------------------------------------------------------------
# I-BERT: pass 1 computes e (and the tensor max), pass 2 requantises and normalises.


@jit(inline="always")
def _ibert_e_dense(x, r, s, m, x0i, nx0, bi, ci, n, e):
    """Pass 1 of a dense row into ``e`` (a row buffer: ``x`` may be the output array, and
    writing the row in place would keep LLVM from vectorizing); returns ``(floor clamps, the
    row's max e)``."""
    nfl = 0
    ek = np.int64(0)  # max e on the bits (e >= 0, or -0.0, which leaves the max unchanged)
    for j in range(x.shape[1]):
        t = _sub(_div(x[r, j], s), m)
        cl = t < nx0
        t = nx0 if cl else t
        nfl += cl
        q = _floor(_div(t, x0i))
        rr = _sub(t, _mul(x0i, q))
        zz = _add(_mul(rr, _add(rr, bi)), ci)
        ev = _floor(_mul(zz, _pow2(n - np.int64(q))))  # 0 <= n - q <= n
        ev = np.float32(0.0) if ev < 0 else ev
        e[j] = ev
        ek = max(ek, np.int64(np.int32(f32_as_u32(ev))))
    return nfl, u32_as_f32(np.uint32(ek))


@jit
def _ibert_exp_f32(x, vis, s, x0i, nx0, bi, ci, n, e, rowflag, counts):
    """Pass 1 (float32): e per visible entry (-1 for entries that take no part); rowflag 0 ok,
    1 empty, 2 NaN.  Returns max(e) over visible entries (-1 when none)."""
    R, L = x.shape
    use_vis = vis.shape[0] > 0
    xi = np.empty(L, np.float32)
    used = np.empty(L, np.bool_)
    emax = np.float32(-1.0)
    for r in range(R):
        if not use_vis:
            dense, mx = _dense_max(x, r)
            if dense:
                rowflag[r] = 0
                nfl, em = _ibert_e_dense(x, r, s, _div(mx, s), x0i, nx0, bi, ci, n, xi)
                e[r] = xi
                counts[_C_FLOOR] += nfl
                if em > emax:
                    emax = em
                continue
        cnt, m, bad = _row_scan_f32(x, vis, use_vis, r, s, xi, used)
        if cnt == 0 or bad:
            rowflag[r] = 1 if cnt == 0 else 2
            counts[_C_EMPTY if cnt == 0 else _C_NAN] += 1
            for j in range(L):
                e[r, j] = -1.0
            continue
        rowflag[r] = 0
        for j in range(L):
            if not used[j]:
                e[r, j] = -1.0
                continue
            t = _sub(xi[j], m)
            if t < nx0:
                t = nx0
                counts[_C_FLOOR] += 1
            q = _floor(_div(t, x0i))
            rr = _sub(t, _mul(x0i, q))
            zz = _add(rr, bi)
            zz = _mul(rr, zz)
            zz = _add(zz, ci)
            ev = _floor(_mul(zz, _POW2_F32[int(n - q)]))  # 0 <= n - q <= n
            if ev < 0:
                ev = np.float32(0.0)
            e[r, j] = ev
            if ev > emax:
                emax = ev
    return emax


@jit
def _ibert_norm_f32(e, rowflag, m31, inv_shift, out_bits, y, counts):
    """Pass 2 (float32 order): 16-bit requantisation, row sum, reciprocal, output."""
    R, L = e.shape
    e16 = np.empty(L, np.float32)
    used = np.empty(L, np.bool_)
    two32 = np.float32(2.0**32)
    out_div = np.float32(2.0 ** (32 - out_bits))
    for r in range(R):
        if rowflag[r] != 0:
            for j in range(L):
                y[r, j] = np.nan
            continue
        dense = True
        for j in range(L):
            dense &= e[r, j] >= 0
        if dense:  # every entry used: the same requantisation without branches
            req = 0
            for j in range(L):
                v = np.rint((np.float64(e[r, j]) * m31) * inv_shift)
                req += (v > IBERT_E16_MAX) | (v < IBERT_E16_MIN)
                e16[j] = np.float32(min(max(v, IBERT_E16_MIN), IBERT_E16_MAX))
            counts[_C_REQ] += req
            _dense_normalise(y, r, e16, _floor(_div(two32, _left_sum(e16, L))), out_div, counts)
            continue
        z = np.float32(0.0)
        for j in range(L):
            ev = e[r, j]
            used[j] = ev >= 0
            if ev < 0:
                continue
            v = np.rint((np.float64(ev) * m31) * inv_shift)  # fl64(e * m) / 2**shift, RNE
            if v > IBERT_E16_MAX:
                v = IBERT_E16_MAX
                counts[_C_REQ] += 1
            elif v < IBERT_E16_MIN:
                v = IBERT_E16_MIN
                counts[_C_REQ] += 1
            e16[j] = np.float32(v)
            z = _add(z, e16[j])
        _normalise_row(y, r, e16, used, _floor(_div(two32, z)), out_div, counts)


# --------------------------------------------------------------------------------------------
# parallel drivers: blocks of rows, each with its own counters (rows are independent)


@jit(parallel=True)
def _ivit_f32_par(x, codes, xvals, vis, s, x0, nx0, n, out_bits, y, counts):
    for t in prange(counts.shape[0]):
        r0, r1 = row_block(t, x.shape[0], counts.shape[0])
        _ivit_f32(x[r0:r1], vis_block(codes, r0, r1), xvals, vis_block(vis, r0, r1), s, x0, nx0,
                  n, out_bits, y[r0:r1], counts[t])


@jit(parallel=True)
def _ibert_exp_f32_par(x, vis, s, x0i, nx0, bi, ci, n, e, rowflag, counts, emax):
    for t in prange(counts.shape[0]):
        r0, r1 = row_block(t, x.shape[0], counts.shape[0])
        emax[t] = _ibert_exp_f32(x[r0:r1], vis_block(vis, r0, r1), s, x0i, nx0, bi, ci, n,
                                 e[r0:r1], rowflag[r0:r1], counts[t])


@jit(parallel=True)
def _ibert_norm_f32_par(e, rowflag, m31, inv_shift, out_bits, y, counts):
    for t in prange(counts.shape[0]):
        r0, r1 = row_block(t, e.shape[0], counts.shape[0])
        _ibert_norm_f32(e[r0:r1], rowflag[r0:r1], m31, inv_shift, out_bits, y[r0:r1],
                        counts[t])


__all__ = ["_ivit_f32_par", "_ibert_exp_f32_par", "_ibert_norm_f32_par", "_ivit_f32",
           "_ibert_exp_f32", "_ibert_norm_f32"]
