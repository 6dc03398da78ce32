"""The tiled online-softmax engine shared by ``flash`` and every ``baps`` configuration.

One Numba kernel, parameterized by small integer switches, runs the FlashAttention-2 loop in
base 2 (specs/attention.md sections 1 and 2) over ``(batch entry, query tile)`` tasks in
parallel.  Memory beyond inputs and outputs: padded copies of q, k^T and v (O(L x d)) and one
``block_q x block_k`` score tile per task; never an ``Lq x Lk`` matrix.  Every float32 operation
and its order is pinned in docs/design.md ("Exact float32 semantics of the tiled schemes"); the
NumPy twin in tests/naive/attention.py follows the same text and the two agree bit for bit.

Switches (see :class:`EngineConfig`):

* ``flow``: ``FA2`` (running max of the scores, ``alpha = exp2(m - m_new)`` on every tile) or
  ``E2E`` (BAPS: integer running max, critical tiles first, restart test against ``tau``,
  exact power-of-two rescale).
* ``exp``: ``EXP_FLOAT`` (``float32(exp2(float64(x)))``) or ``EXP_TABLE`` (encode ``x`` to an
  8-bit format, look the code up in a 256-entry table: exp2 in format).
* ``enc``: which 8-bit rounding feeds the table (``ENC_*``), done by the byte tables of
  :mod:`._bytelut` (equal to the codecs' encoders on all float32 bit patterns); ``pre_hif8``
  rounds the scores to HiF8 first (``naive_e2e``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numba import prange

from ..formats._bits import f32_as_u32
from ..formats._jit import jit
from ..formats.hif8 import HIF8_VALUES
from ..stats import BapsStats
from ._bytelut import build_tables, lut_index
from ._fp import exp2_f32 as _exp2_float
from ._fp import round_bf16 as _round_bf16
from ._fp import round_f16 as _round_f16
from ._gemm import RED, ROWS, pv_tile, qk_tile

BLOCK_Q_DEFAULT = 128  # query rows per tile of flash and baps (docs/design.md)
BLOCK_K_DEFAULT = 128  # keys per tile of flash and baps
FA2 = 0
E2E = 1
EXP_FLOAT = 0
EXP_TABLE = 1
ENC_HIF8 = 0  # HiF8 nearest_away, non-saturating
ENC_HIF8_SAT = 1  # HiF8 nearest_away, saturating
ENC_E4M3_SAT = 2  # E4M3 nearest_even, saturating
ENC_E5M2_SAT = 3  # E5M2 nearest_even, saturating
CRIT_NONE = 0
CRIT_FIRST = 1
CRIT_FIRST_LAST = 2
CRIT_FIRST_DIAG = 3
CRIT_LIST = 4
ROUND_RINT = 0
ROUND_CEIL = 1
GRAN_TILE = 0
GRAN_ROW = 1
ACC_F32 = 0
ACC_F16 = 1
ACC_BF16 = 2

FLAG_CRITICAL = -1
FLAG_SKIPPED = -2

# enc -> (format, rounding, saturate, ties to even)
_ENC_FUNCS = {ENC_HIF8: ("hif8", "nearest_away", False, False),
              ENC_HIF8_SAT: ("hif8", "nearest_away", True, False),
              ENC_E4M3_SAT: ("e4m3", "nearest_even", True, True),
              ENC_E5M2_SAT: ("e5m2", "nearest_even", True, True)}
_BYTE_TABLES: dict = {}
_EXTRA_POINTS = {"hif8": (49152.0,)}  # formats.md 1.4: a virtual 49152 stands for Inf


def byte_tables(enc: int):
    """The :mod:`._bytelut` tables ``(addm1, sh, lut)`` of an ``ENC_*`` rounding (cached)."""
    tabs = _BYTE_TABLES.get(enc)
    if tabs is None:
        from ..formats import encode, get_format

        name, rounding, sat, ties_even = _ENC_FUNCS[enc]
        tabs = build_tables(get_format(name).values().astype(np.float64),
                            lambda x: encode(x, name, rounding=rounding, saturate=sat),
                            ties_even, extra_points=_EXTRA_POINTS.get(name, ()))
        _BYTE_TABLES[enc] = tabs
    return tabs


_HIF8_VALUES = HIF8_VALUES.astype(np.float32)
_LOG2E_F32 = np.float32(math.log2(math.e))
_NINF = np.float32(-np.inf)


@dataclass(frozen=True)
class EngineConfig:
    """Integer switches of :func:`run_engine` (module docstring); ``table`` is the float32
    exp2 table indexed by codes of the ``enc`` format, ``thr`` the smallest float32 ``x`` whose
    HiF8 rounding exceeds ``tau`` (the restart test is ``fl(rowmax - m) >= thr``)."""

    flow: int = FA2
    exp: int = EXP_FLOAT
    enc: int = ENC_HIF8
    pre_hif8: bool = False
    crit: int = CRIT_NONE
    crit_list: tuple = ()
    max_round: int = ROUND_RINT
    gran: int = GRAN_TILE
    acc: int = ACC_F32
    thr: float = math.inf
    table: np.ndarray | None = None


# ------------------------------------------------------------------------------------------
# scalar helpers


@jit(inline="always")
def _acc(x, acc):
    if acc == ACC_F16:
        return _round_f16(x)
    if acc == ACC_BF16:
        return _round_bf16(x)
    return x


@jit(inline="always")
def _exp2(x, exp, addm1, sh, ptab):
    """``exp2(x)``: float32 (``EXP_FLOAT``) or in format through the byte tables."""
    if exp == EXP_FLOAT:
        return _exp2_float(x)
    return ptab[lut_index(f32_as_u32(x), addm1, sh)]


@jit
def _scores_row(srow, jlim, ncol, c, mrow, j0, has_mask, pre_hif8, addm1, sh, vtab):
    """One row of scores in place: ``fl(dot * c)`` (+ ``fl(mask * log2 e)``) for ``j < jlim``,
    -inf beyond (causal); HiF8-rounded when ``pre_hif8``."""
    if has_mask:
        for j in range(jlim):
            srow[j] = np.float32(np.float32(srow[j] * c) + np.float32(mrow[j0 + j] * _LOG2E_F32))
    else:
        for j in range(jlim):
            srow[j] = np.float32(srow[j] * c)
    for j in range(jlim, ncol):
        srow[j] = _NINF
    if pre_hif8:
        for j in range(jlim):
            srow[j] = vtab[lut_index(f32_as_u32(srow[j]), addm1, sh)]


@jit(fastmath={"nnan", "nsz"})
def _row_max(srow, n):
    """``max(srow[:n])`` (-inf when ``n == 0``).  The fast-math flags let LLVM vectorize the
    reduction; a NaN score makes its row's output NaN through P whatever this returns."""
    mx = _NINF
    for j in range(n):
        mx = max(mx, srow[j])
    return mx


@jit
def _p_row(srow, prow, n, m, exp, addm1, sh, ptab):
    """``prow[j] = exp2(fl(srow[j] - m))`` for ``j < n`` (0 when ``m`` is -inf).  Table
    exponentials round ``fl(srow[j] - m)`` to the input format through the byte tables of
    :mod:`._bytelut` (``ptab`` maps a table index straight to the exp2 value)."""
    if m == _NINF:
        for j in range(n):
            prow[j] = np.float32(0.0)
        return
    if exp == EXP_FLOAT:
        for j in range(n):
            prow[j] = _exp2_float(np.float32(srow[j] - m))
        return
    for j in range(n):
        prow[j] = ptab[lut_index(f32_as_u32(np.float32(srow[j] - m)), addm1, sh)]


@jit(inline="always")
def _round_max(x, mode):
    if mode == ROUND_CEIL:
        return np.float32(math.ceil(x)) if x != _NINF else x
    return np.float32(np.rint(x)) if x != _NINF else x


@jit(inline="always")
def _pow2_exact(m_old, m_new):
    """``2**(m_old - m_new)`` for integer-valued float32 maxima (0 when m_old is -inf)."""
    if m_old == m_new:
        return np.float32(1.0)
    if m_old == _NINF:
        return np.float32(0.0)
    return np.float32(2.0 ** (np.float64(m_old) - np.float64(m_new)))


# ------------------------------------------------------------------------------------------
# tile visibility and visiting order


@jit
def _visible_tiles(vis, b, i0, nrow, Lq, Lk, Bc, nk, causal, mask, mmap, has_mask):
    """``vis[t]`` = some (row, key) pair of key tile t is visible from query rows i0..i0+nrow."""
    for t in range(nk):
        j0 = t * Bc
        j1 = min(j0 + Bc, Lk)
        ok = False
        if causal:
            lim = i0 + nrow - 1 + (Lk - Lq)  # the last row sees the most keys
            if j0 > lim:
                vis[t] = False
                continue
        if not has_mask:
            ok = True
        else:
            mp = mask[mmap[b]]
            for i in range(i0, i0 + nrow):
                jmax = j1 - 1
                if causal:
                    jmax = min(jmax, i + (Lk - Lq))
                for j in range(j0, jmax + 1):
                    if mp[i, j] != _NINF:
                        ok = True
                        break
                if ok:
                    break
        vis[t] = ok


@jit
def _visit_order(order, is_crit, vis, nk, crit, crit_list, i_last, Lq, Lk, Bc):
    """Fill ``order`` with the tiles to visit (critical first); returns (count, n_critical)."""
    n = 0
    for t in range(nk):
        is_crit[t] = False
    if crit != CRIT_NONE:
        extra = -1
        if crit == CRIT_FIRST_LAST:
            for t in range(nk - 1, -1, -1):
                if vis[t]:
                    extra = t
                    break
        elif crit == CRIT_FIRST_DIAG:
            extra = min(Lk - 1, i_last + (Lk - Lq)) // Bc
        if crit == CRIT_LIST:
            for c in range(crit_list.shape[0]):
                t = crit_list[c]
                if vis[t] and not is_crit[t]:
                    order[n] = t
                    is_crit[t] = True
                    n += 1
        else:
            if vis[0]:
                order[n] = 0
                is_crit[0] = True
                n += 1
            if extra >= 0 and vis[extra] and not is_crit[extra]:
                order[n] = extra
                is_crit[extra] = True
                n += 1
    ncrit = n
    for t in range(nk):
        if vis[t] and not is_crit[t]:
            order[n] = t
            n += 1
    return n, ncrit


# ------------------------------------------------------------------------------------------
# the engine


@jit(parallel=True)
def _engine(q, kt, v, Lq, Lk, dv, Br, Bc, c, causal, mask, mmap, has_mask,
            flow, exp, pre_hif8, crit, crit_list, max_round, gran, acc, thr,
            addm1, sh, ptab, vtab, out, flags, row_restarts):
    B = q.shape[0]
    nq = (Lq + Br - 1) // Br
    nk = (Lk + Bc - 1) // Bc
    br_pad = ((Br + ROWS - 1) // ROWS) * ROWS
    bc_pad = ((Bc + RED - 1) // RED) * RED
    d_pad = q.shape[2]
    dv_pad = v.shape[2]
    for task in prange(B * nq):
        b = task // nq
        qt = task % nq
        i0 = qt * Br
        nrow = min(Br, Lq - i0)
        s = np.empty((br_pad, bc_pad), dtype=np.float32)
        p = np.zeros((br_pad, bc_pad), dtype=np.float32)
        pv = np.empty((br_pad, dv_pad), dtype=np.float32)
        o = np.zeros((br_pad, dv_pad), dtype=np.float32)
        m = np.full(br_pad, _NINF, dtype=np.float32)
        l = np.zeros(br_pad, dtype=np.float32)
        rmax = np.empty(br_pad, dtype=np.float32)
        upd = np.zeros(br_pad, dtype=np.bool_)
        alpha = np.ones(br_pad, dtype=np.float32)
        vis = np.empty(nk, dtype=np.bool_)
        is_crit = np.empty(nk, dtype=np.bool_)
        order = np.empty(nk, dtype=np.int64)
        _visible_tiles(vis, b, i0, nrow, Lq, Lk, Bc, nk, causal, mask, mmap, has_mask)
        nvisit, ncrit = _visit_order(order, is_crit, vis, nk, crit, crit_list, i0 + nrow - 1,
                                     Lq, Lk, Bc)
        for t in range(nk):
            flags[b, qt, t] = FLAG_SKIPPED
        rr = 0
        mp = mask[mmap[b]] if has_mask else mask[0]
        if not has_mask:
            mp = np.zeros((Lq, 1), dtype=np.float32)  # never read
        for vi in range(nvisit):
            t = order[vi]
            j0 = t * Bc
            ncol = min(Bc, Lk - j0)
            critical = vi < ncrit
            # ---- scores S = fl(dot * c) (+ fl(mask * log2 e)), -inf where masked
            qk_tile(q[b], kt[b, t], s, i0, 0, br_pad, ncol, d_pad)
            for i in range(nrow):
                jlim = ncol
                if causal:
                    jlim = max(0, min(ncol, i0 + i + (Lk - Lq) - j0 + 1))
                _scores_row(s[i], jlim, ncol, c, mp[i0 + i], j0, has_mask, pre_hif8, addm1, sh,
                            vtab)
                rmax[i] = _row_max(s[i], jlim)
            # ---- running max and rescale factors
            if flow == FA2:
                for i in range(nrow):
                    mn = max(m[i], rmax[i])
                    if mn == _NINF:
                        alpha[i] = np.float32(1.0)
                    else:
                        alpha[i] = _exp2(np.float32(m[i] - mn), exp, addm1, sh, ptab)
                    m[i] = mn
                flags[b, qt, t] = 0
            else:
                restart = False
                for i in range(nrow):
                    if critical:
                        upd[i] = True
                    else:
                        upd[i] = np.float32(rmax[i] - m[i]) >= thr  # NaN (both -inf): False
                        restart = restart or upd[i]
                if not critical and gran == GRAN_TILE and restart:
                    for i in range(nrow):
                        upd[i] = True
                for i in range(nrow):
                    if upd[i]:
                        mn = max(m[i], _round_max(rmax[i], max_round))
                        alpha[i] = _pow2_exact(m[i], mn)
                        m[i] = mn
                        if not critical:
                            rr += 1
                    else:
                        alpha[i] = np.float32(1.0)
                if critical:
                    flags[b, qt, t] = FLAG_CRITICAL
                else:
                    flags[b, qt, t] = 1 if restart else 0
            # ---- P, row sums, P v
            for i in range(nrow):
                _p_row(s[i], p[i], ncol, m[i], exp, addm1, sh, ptab)
                for j in range(ncol, bc_pad):
                    p[i, j] = np.float32(0.0)
            pv_tile(p, v[b], pv, j0, br_pad, bc_pad, dv_pad)
            for i in range(nrow):
                rs = pv[i, dv]  # the ones column of v: fl(rs + fl(P * 1)) = fl(rs + P) in order
                a = alpha[i]
                l[i] = _acc(np.float32(np.float32(l[i] * a) + rs), acc)
                for cc in range(dv):
                    o[i, cc] = _acc(np.float32(np.float32(o[i, cc] * a) + pv[i, cc]), acc)
        row_restarts[task] = rr
        for i in range(nrow):
            for cc in range(dv):
                out[b, i0 + i, cc] = np.float32(o[i, cc] / l[i])


def _pad(a: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """Zero-padded float32 copy of ``a (B, r, c)`` with shape ``(B, rows, cols)``."""
    outp = np.zeros((a.shape[0], rows, cols), dtype=np.float32)
    outp[:, : a.shape[1], : a.shape[2]] = a
    return outp


def run_engine(q: np.ndarray, k: np.ndarray, v: np.ndarray, *, scale: float, causal: bool,
               mask: np.ndarray | None, mask_map: np.ndarray, block_q: int, block_k: int,
               cfg: EngineConfig):
    """Run the engine on float32 ``q (B, Lq, d)``, ``k (B, Lk, d)``, ``v (B, Lk, dv)``.

    Returns ``(out (B, Lq, dv) float32, flags (B, nq, nk) int8, row_restarts (B,) int64)``;
    flags are 1 (restarted), 0, -1 (critical), -2 (skipped: fully masked).
    """
    B, Lq, d = q.shape
    Lk, dv = v.shape[1], v.shape[2]
    # a tile larger than the sequence holds the same rows/keys as one of exactly its length
    # (padding rows are ignored, padding keys are masked), so cap them: same results, and
    # memory follows L, not the block size
    Br, Bc = max(1, min(int(block_q), Lq)), max(1, min(int(block_k), Lk))
    nq = (Lq + Br - 1) // Br
    nk = (Lk + Bc - 1) // Bc
    d_pad = -(-max(d, 1) // RED) * RED
    dv_pad = dv + 1  # v gets a column of ones: P v then yields the row sums as well
    br_pad = -(-Br // ROWS) * ROWS
    bc_pad = -(-Bc // RED) * RED
    qp = _pad(q, nq * Br + br_pad, d_pad)
    # k transposed per key tile, (B, nk, d_pad, bc_pad) contiguous: a tile's product reads one
    # contiguous block instead of d_pad rows strided by the whole sequence
    kpad = np.zeros((B, nk * Bc, d_pad), dtype=np.float32)
    kpad[:, :Lk, :d] = k
    ktp = np.zeros((B, nk, d_pad, bc_pad), dtype=np.float32)
    ktp[..., :Bc] = kpad.reshape(B, nk, Bc, d_pad).transpose(0, 1, 3, 2)
    vp = _pad(v, nk * Bc + bc_pad, dv_pad)
    vp[:, :Lk, dv] = 1.0
    c = np.float32(scale * math.log2(math.e))
    has_mask = mask is not None
    mk = mask if has_mask else np.zeros((1, 1, 1), dtype=np.float32)
    table = cfg.table if cfg.table is not None else np.zeros(256, dtype=np.float32)
    addm1, sh, lut = byte_tables(cfg.enc)
    ptab = table.astype(np.float32)[lut.astype(np.int64)]
    if cfg.pre_hif8 and cfg.enc != ENC_HIF8:
        raise ValueError("pre_hif8 rounds the scores with the plain HiF8 tables: enc=ENC_HIF8")
    vtab = _HIF8_VALUES[lut.astype(np.int64)] if cfg.pre_hif8 else ptab
    out = np.empty((B, Lq, dv), dtype=np.float32)
    flags = np.empty((B, nq, nk), dtype=np.int8)
    rr = np.zeros(B * nq, dtype=np.int64)
    crit_list = np.asarray(cfg.crit_list, dtype=np.int64)
    if B * nq > 0 and Lk > 0:
        _engine(qp, ktp, vp, Lq, Lk, dv, Br, Bc, c, bool(causal), mk,
                np.ascontiguousarray(mask_map, dtype=np.int64), has_mask, cfg.flow, cfg.exp,
                bool(cfg.pre_hif8), cfg.crit, crit_list, cfg.max_round, cfg.gran, cfg.acc,
                np.float32(cfg.thr), addm1, sh, ptab, vtab, out, flags, rr)
    elif Lk == 0:
        out[:] = np.nan
        flags[:] = FLAG_SKIPPED
    return out, flags, rr.reshape(B, nq).sum(axis=1)


def tile_stats(flags: np.ndarray, row_restarts: np.ndarray, restartable: bool) -> BapsStats:
    """One call's :class:`~lowprec.stats.BapsStats` from the engine's per-tile flags;
    ``restartable``: the flow has a restart test (BAPS ``e2e_hif8``), else the restart rates
    are None."""
    tiles = ((flags == 0) | (flags == 1)).sum(axis=(1, 2)).astype(np.int64)
    restarts = (flags == 1).sum(axis=(1, 2)).astype(np.int64)
    return BapsStats(tiles=[tiles], restarts=[restarts],
                     row_restarts=[np.asarray(row_restarts, dtype=np.int64)], flags=[flags],
                     calls=1, restartable=int(bool(restartable)))
