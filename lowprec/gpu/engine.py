"""Triton twin of the tiled online-softmax engine (:mod:`lowprec.kernels.online`).

Runs ``flash`` and every ``baps`` configuration on CUDA tensors and returns, bit for bit, what
:func:`lowprec.kernels.online.run_engine` returns on the CPU: the output, the per-tile flags and
the restarted-row counts.  The float32 operations and their order are the ones pinned in
docs/design.md ("Exact float32 semantics of the tiled schemes"); how each maps to Triton is in
docs/design.md ("GPU attention engine").  Every helper mirrors the Numba helper of the same name
(``_scores_row``, ``_row_max``, ``_p_row``, ``_round_max``, ``_pow2_exact``, ``_round_f16``,
``_round_bf16``, ``_acc``, ``_exp2``, ``_visible_tiles``, ``_visit_order``, ``lut_index``,
``qk_tile``, ``pv_tile``, ``_engine``): read the two side by side.  Differences are only in how
Triton spells a step: a helper works on a whole tile at once (rows are independent), choices
are ``tl.where`` (both sides evaluated, so shift counts and indices are clamped), and the
configuration switches are ``tl.constexpr`` (the other branches vanish at compile time).

Layout: one program per (batch entry, query tile, row block), ``b = z * Hq + h`` as on the
CPU.  q is ``(Z, Hq, Lq, d)``, k and v are ``(Z, Hkv, Lk, d)`` / ``(Z, Hkv, Lk, dv)`` with
``Hq % Hkv == 0`` (GQA: query head ``h`` reads key/value head ``h // (Hq // Hkv)``, no repeat),
any strides, float32, float16 or bfloat16: pre-passes widen them exactly (bfloat16-rounded
first when asked) into float32 blocks laid out for the products (q^T per row block, k^T and v
per key tile) and compute the guard's magnitudes.  Three-dimensional ``(B, L, d)`` inputs are
``Hq = Hkv = 1``.  Memory beyond inputs and outputs: O(L x d) per head (those blocks, the
mask-visibility bits, and a scratch buffer, bounded by ``SCRATCH_BYTES``, where each program
stages its P tile for the P v product); never an ``Lq x Lk`` matrix.

Exactness rules (specs/gpu.md section 2): every launch has ``enable_fp_fusion=False``; ``O / l``
is ``tl.math.div_rn``; exp2 in float32 is ``float32(exp2(float64(x)))`` (libdevice's double exp2,
checked exhaustively on the GPU) or a table; rint/ceil and the float16/bfloat16 roundings are
integer operations on the bits or the add-and-subtract trick; shift counts stay in [0, 31].
Both products are outer-product loops in the CPU's order (sequential over the reduction
index); ``tl.fma`` (always fused) equals the CPU's unfused ``fl(acc + fl(a b))`` only when every
product is exact, so the engine fuses only where a per-tile guard proves that (narrow
mantissas, no underflow, no overflow) and otherwise multiplies and adds separately.  The only
``tl.dot`` calls multiply constant zeros: they fix the register layout of the accumulators.
"""

from __future__ import annotations

import contextlib
import math

import numpy as np
import triton
import triton.language as tl

from ..formats.hif8 import HIF8_VALUES
from ..kernels import online as _cpu

# ---- the CPU engine's switches, read from it (not retyped)
FA2 = tl.constexpr(_cpu.FA2)
E2E = tl.constexpr(_cpu.E2E)
EXP_FLOAT = tl.constexpr(_cpu.EXP_FLOAT)
EXP_TABLE = tl.constexpr(_cpu.EXP_TABLE)
CRIT_NONE = tl.constexpr(_cpu.CRIT_NONE)
CRIT_FIRST = tl.constexpr(_cpu.CRIT_FIRST)
CRIT_FIRST_LAST = tl.constexpr(_cpu.CRIT_FIRST_LAST)
CRIT_FIRST_DIAG = tl.constexpr(_cpu.CRIT_FIRST_DIAG)
CRIT_LIST = tl.constexpr(_cpu.CRIT_LIST)
ROUND_CEIL = tl.constexpr(_cpu.ROUND_CEIL)
GRAN_TILE = tl.constexpr(_cpu.GRAN_TILE)
ACC_F16 = tl.constexpr(_cpu.ACC_F16)
ACC_BF16 = tl.constexpr(_cpu.ACC_BF16)
FLAG_CRITICAL = tl.constexpr(_cpu.FLAG_CRITICAL)
FLAG_SKIPPED = _cpu.FLAG_SKIPPED

# float32(log2 e), exactly the CPU's _LOG2E_F32 (a Python float holding a float32 value, so
# Triton's float32 constant is that value with no second rounding)
_LOG2E_F32 = tl.constexpr(float(np.float32(math.log2(math.e))))
# Exact-product guard margins: a product whose float32 rounding is >= 2**-125 is >= 2**-126
# exactly (no subnormal, hence exact with <= 24 significant bits); one whose rounding is
# < 2**126 is < 2**127 exactly (no overflow).  A factor of 2 of margin on each side.
_TINY = tl.constexpr(2.0**-125)
_HUGE = tl.constexpr(2.0**126)
# Mantissa bits that must be zero for exact products: q and k at most 12 significant bits each
# (bf16 has 8, fp16 11; 12 + 12 <= 24); v at most 24 - P_BITS with P_BITS = 4 (every 8-bit
# format value has at most 4 significant bits: checked on the table by _p_bits).
_LOW_QK = tl.constexpr(0xFFF)
_P_BITS_MAX = 4
_LOW_V = tl.constexpr((1 << _P_BITS_MAX) - 1)
# _exp2_float's verified domain: exp2(x) rounds to 0 for x <= -150 (2**-150 is a tie with 0,
# even) and to +inf for x >= 128; libdevice's double exp2 is used strictly inside (-150, 128)
_EXP2_LO = tl.constexpr(-150.0)
_EXP2_HI = tl.constexpr(128.0)
# math.ceil in Numba converts to int64: |x| >= 2**63, inf and NaN give INT64_MIN (x86 cvttss2si)
_TWO63 = tl.constexpr(2.0**63)
_RINT_MAGIC = tl.constexpr(2.0**23)  # |x| + 2**23 - 2**23 rounds |x| < 2**23 to an integer (RNE)

LAUNCH_OPTS = {"enable_fp_fusion": False}  # gpu.md section 2: no a*b+c -> fma contraction
SCRATCH_BYTES = 256 << 20  # cap on the P staging buffer; larger grids launch in parts


# ------------------------------------------------------------------------------------------
# scalar helpers (tile-wide)


@triton.jit
def _bits(x):
    """float32 -> its uint32 bit pattern."""
    return x.to(tl.uint32, bitcast=True)


@triton.jit
def _float(u):
    """uint32 bit pattern -> float32."""
    return u.to(tl.float32, bitcast=True)


@triton.jit
def _abs(x):
    """``|x|`` by clearing the sign bit (``tl.abs`` may compile to ``abs.ftz.f32``)."""
    return _float(_bits(x) & 0x7FFFFFFF)


@triton.jit
def _max(a, b):
    """Numba's ``max(a, b)`` on floats: ``b if b > a else a`` (keeps ``a`` on ties and NaN)."""
    return tl.where(b > a, b, a)


@triton.jit
def _round_f16(x):
    """float32 -> nearest float16 (ties to even) -> float32, Inf/NaN kept (online._round_f16)."""
    u = _bits(x)
    a = u & 0x7FFFFFFF
    # below 2**-14: fixed spacing 2**-24, the add-and-subtract trick (0.5 has ulp 2**-24)
    r_small = (_abs(x) + 0.5) - 0.5
    # the CPU's ``-r if x < 0 else r``: -0 for a tiny negative x, +0 for x = -0; the sign set
    # on the bits (Triton's unary minus is 0 - r, which gives +0 for r = +0)
    small = tl.where(x < 0, _float(_bits(r_small) | 0x80000000), r_small)
    lsb = (a >> 13) & 1
    r = (a + 0xFFF + lsb) & 0xFFFFE000
    r = tl.where(r > 0x477FE000, 0x7F800000, r)  # above 65504: Inf
    big = _float(r | (u & 0x80000000))
    res = tl.where(a < 0x38800000, small, big)
    return tl.where(a >= 0x7F800000, x, res)


@triton.jit
def _round_bf16(x):
    """float32 -> nearest bfloat16 (ties to even) -> float32, NaN kept (online._round_bf16)."""
    u = _bits(x)
    lsb = (u >> 16) & 1
    r = _float((u + 0x7FFF + lsb) & 0xFFFF0000)
    return tl.where((u & 0x7FFFFFFF) > 0x7F800000, x, r)


@triton.jit
def _acc(x, ACC: tl.constexpr):
    """Round an accumulator to its dtype (online._acc)."""
    if ACC == ACC_F16:
        return _round_f16(x)
    elif ACC == ACC_BF16:
        return _round_bf16(x)
    else:
        return x


@triton.jit
def lut_index(u, TAB):
    """Table index of the float32 bit patterns ``u`` (uint32): sign bit 11, then the rounded top
    11 magnitude bits (kernels._bytelut.lut_index).  ``TAB[e]`` packs ``addm1[e] | sh[e] << 24``
    (addm1 < 2**24, sh in {20, 21, 22, 31}: one gather instead of two)."""
    a = u & 0x7FFFFFFF
    sign = (u >> 20) & 0x800
    w = tl.load(TAB + (a >> 23).to(tl.int32)).to(tl.uint32, bitcast=True)
    addm1 = w & 0xFFFFFF
    sh = w >> 24
    r = a + addm1 + ((a >> sh) & 1)
    idx = tl.where(a > 0x7F800000, sign | 0x7FF, sign | (r >> 20))
    return idx.to(tl.int32)


@triton.jit
def _exp2_float(x):
    """``float32(exp2(float64(x)))`` (online._exp2_float): libdevice's double exp2 inside its
    exhaustively checked domain, the exact answers 0 and +inf outside; NaN stays NaN."""
    y = tl.exp2(x.to(tl.float64)).to(tl.float32)
    y = tl.where(x <= _EXP2_LO, 0.0, y)
    return tl.where(x >= _EXP2_HI, float("inf"), y)


@triton.jit
def _exp2(x, EXP: tl.constexpr, TAB, PTAB):
    """``exp2(x)``: float32 (``EXP_FLOAT``) or in format through the byte tables (online._exp2)."""
    if EXP == EXP_FLOAT:
        return _exp2_float(x)
    else:
        return tl.load(PTAB + lut_index(_bits(x), TAB))


@triton.jit
def _scores_row(s, jmask, c, mrow, HAS_MASK: tl.constexpr, PRE_HIF8: tl.constexpr, TAB, VTAB):
    """Scores of a tile (online._scores_row, every row at once): ``fl(dot * c)``
    (+ ``fl(mask * log2 e)``) where ``jmask`` (``j < jlim``), -inf elsewhere; HiF8-rounded
    through the plain HiF8 tables when ``PRE_HIF8``."""
    if HAS_MASK:
        s = (s * c) + (mrow * _LOG2E_F32)  # three roundings: fusion is off
    else:
        s = s * c
    s = tl.where(jmask, s, float("-inf"))
    if PRE_HIF8:
        s = tl.where(jmask, tl.load(VTAB + lut_index(_bits(s), TAB)), s)
    return s


@triton.jit
def _row_max(s):
    """``max`` of each row over its non-NaN scores, -inf when there is none (online._row_max:
    compiled with fast-math there, it ignores NaN in every position on x86-64, which is what
    this computes explicitly; max is order free otherwise)."""
    return tl.max(tl.where(s != s, float("-inf"), s), axis=1)


@triton.jit
def _p_row(s, m, ncol_mask, EXP: tl.constexpr, TAB, PTAB):
    """``P = exp2(fl(S - m))`` on the tile's keys (``ncol_mask``), 0 beyond and on rows whose
    max is -inf (online._p_row)."""
    p = _exp2(s - m[:, None], EXP, TAB, PTAB)
    p = tl.where(m[:, None] == float("-inf"), 0.0, p)
    return tl.where(ncol_mask, p, 0.0)


@triton.jit
def _rint(x):
    """``np.rint`` on float32: round half to even, sign of zero kept, |x| >= 2**23, Inf and NaN
    unchanged (the add-and-subtract trick on |x|)."""
    ax = _abs(x)
    r = (ax + _RINT_MAGIC) - _RINT_MAGIC
    r = _float(_bits(r) | (_bits(x) & 0x80000000))
    return tl.where(ax < _RINT_MAGIC, r, x)


@triton.jit
def _round_max(x, MODE: tl.constexpr):
    """The integer running max (online._round_max): ``np.rint`` or ``np.float32(math.ceil(x))``
    (an int64 conversion: zero comes out +0, and |x| >= 2**63, +Inf and NaN come out -2**63
    as Numba computes them); -inf kept."""
    r = _rint(x)
    if MODE == ROUND_CEIL:
        r = tl.where(r < x, r + 1.0, r)  # exact: |r| < 2**23 whenever r < x
        r = tl.where(r == 0.0, 0.0, r)
        r = tl.where(_abs(x) < _TWO63, r, -_TWO63)
    return tl.where(x == float("-inf"), x, r)


@triton.jit
def _pow2_exact(m_old, m_new):
    """``2**(m_old - m_new)`` for integer-valued float32 maxima (online._pow2_exact): 1 when
    equal, 0 when ``m_old`` is -inf, else the float32 rounding of the power of two, built from
    its bits (subnormal below 2**-126, 0 at or below 2**-150, NaN for NaN)."""
    dd = m_old.to(tl.float64) - m_new.to(tl.float64)
    isnan = dd != dd
    e = tl.minimum(tl.maximum(tl.where(isnan, 0.0, dd), -151.0), 128.0).to(tl.int32)
    normal = _float(((tl.maximum(e, -126) + 127) << 23).to(tl.uint32))
    sub = _float((1 << tl.minimum(tl.maximum(e + 149, 0), 22)).to(tl.uint32))
    r = tl.where(e >= -126, normal, sub)
    r = tl.where(dd <= -150.0, 0.0, r)
    r = tl.where(dd >= 128.0, float("inf"), r)
    r = tl.where(isnan, float("nan"), r)
    r = tl.where(m_old == float("-inf"), 0.0, r)
    return tl.where(m_old == m_new, 1.0, r)


@triton.jit
def _magnitude_range(x, LOW: tl.constexpr):
    """``(smallest non-zero |x|, largest |x|)`` of a tile for the exact-product guard; the
    largest is +inf when some element is Inf/NaN or has a non-zero bit under ``LOW`` (too many
    significant bits), the smallest +inf when every element is zero."""
    u = _bits(x)
    a = (u & 0x7FFFFFFF).to(tl.int32)
    narrow = tl.max((u & LOW).to(tl.int32)) == 0
    amax = tl.max(a)
    amin = tl.min(tl.where(a == 0, 0x7F800000, a))
    hi = tl.where(narrow & (amax < 0x7F800000), amax, 0x7F800000)
    return amin.to(tl.float32, bitcast=True), hi.to(tl.float32, bitcast=True)


# ------------------------------------------------------------------------------------------
# tile products (kernels._gemm): sequential over the reduction index from 0, one rounding per
# multiply and per add, as outer products ``acc = fl(acc + fl(a[:, kk] b[kk, :]))``, kk
# ascending; with ``FUSED`` one ``fma`` per term, equal whenever every product is exact (the
# per-tile guard).  The operands stream from memory one reduction step at a time (a column of
# the left factor, a row of the right one, both contiguous float32 laid out by the pre-passes),
# so each thread keeps only its accumulator block and a few operands in registers: the loop
# runs in the register layout of the accumulator it is given (the caller's, from a dot).


@triton.jit
def _outer_step(acc, kk, a_ptr, b_ptr, ra, rb, SA: tl.constexpr, SB: tl.constexpr,
                FUSED: tl.constexpr):
    """``acc + a[:, kk] b[kk, :]`` with ``a[:, kk]`` at ``a_ptr + kk * SA + ra`` and
    ``b[kk, :]`` at ``b_ptr + kk * SB + rb``."""
    a = tl.load(a_ptr + kk * SA + ra)
    b = tl.load(b_ptr + kk * SB + rb)
    if FUSED:
        return tl.fma(a[:, None], b[None, :], acc)
    else:
        return acc + a[:, None] * b[None, :]


@triton.jit
def qk_tile(acc, q_ptr, k_ptr, d, rows, jj, BM: tl.constexpr, BN: tl.constexpr,
            UK: tl.constexpr, STAGES: tl.constexpr, FUSED: tl.constexpr):
    """``S = q k^T`` of a tile (kernels._gemm.qk_tile) from the zero accumulator ``acc``:
    ``q_ptr`` the program's q^T block ``[d, BM]``, ``k_ptr`` the key tile's k^T ``[d, BN]``;
    UK steps of d per iteration (``STAGES`` > 0: software-pipelined through shared memory),
    the remainder one by one."""
    n_main = d - d % UK
    if STAGES > 0:
        for k0 in tl.range(0, n_main, UK, num_stages=STAGES):
            for u in tl.static_range(UK):
                acc = _outer_step(acc, k0 + u, q_ptr, k_ptr, rows, jj, BM, BN, FUSED)
    else:
        for k0 in range(0, n_main, UK):
            for u in tl.static_range(UK):
                acc = _outer_step(acc, k0 + u, q_ptr, k_ptr, rows, jj, BM, BN, FUSED)
    for kk in range(n_main, d):
        acc = _outer_step(acc, kk, q_ptr, k_ptr, rows, jj, BM, BN, FUSED)
    return acc


@triton.jit
def _pv_step(pv, rs, j, p_ptr, v_ptr, rows, dvc, BM: tl.constexpr, DV_PAD: tl.constexpr,
             FUSED: tl.constexpr):
    """Key ``j`` of :func:`pv_tile`, the row sum too: ``rs = fl(rs + P[:, j])``."""
    pc = tl.load(p_ptr + j * BM + rows)
    vr = tl.load(v_ptr + j * DV_PAD + dvc)
    if FUSED:
        pv = tl.fma(pc[:, None], vr[None, :], pv)
    else:
        pv = pv + pc[:, None] * vr[None, :]
    return pv, rs + pc


@triton.jit
def pv_tile(pv, rs, p_ptr, v_ptr, nkeys, rows, dvc, BM: tl.constexpr, DV_PAD: tl.constexpr,
            UNROLL: tl.constexpr, STAGES: tl.constexpr, FUSED: tl.constexpr):
    """``(P v, rowsum P)`` of a tile (kernels._gemm.pv_tile with v's column of ones) from
    the zero accumulators ``pv``, ``rs``: ``p_ptr`` the staged P^T ``[BN, BM]``, ``v_ptr`` the
    key tile's float32 v ``[BN, DV_PAD]``; keys ``j < nkeys``, UNROLL per iteration."""
    n_main = nkeys - nkeys % UNROLL
    if STAGES > 0:
        for j0 in tl.range(0, n_main, UNROLL, num_stages=STAGES):
            for u in tl.static_range(UNROLL):
                pv, rs = _pv_step(pv, rs, j0 + u, p_ptr, v_ptr, rows, dvc, BM, DV_PAD, FUSED)
    else:
        for j0 in range(0, n_main, UNROLL):
            for u in tl.static_range(UNROLL):
                pv, rs = _pv_step(pv, rs, j0 + u, p_ptr, v_ptr, rows, dvc, BM, DV_PAD, FUSED)
    for j in range(n_main, nkeys):
        pv, rs = _pv_step(pv, rs, j, p_ptr, v_ptr, rows, dvc, BM, DV_PAD, FUSED)
    return pv, rs


# ------------------------------------------------------------------------------------------
# tile visibility and visiting order


@triton.jit
def _tile_visible(t, VIS, vis_base, lim, Bc, nk, causal, HAS_MASK: tl.constexpr):
    """``vis[t]`` of online._visible_tiles: from the mask pre-pass (:func:`_visible_tiles`,
    causal folded in) or, without a mask, ``t * Bc <= lim`` (causal) / always."""
    inside = (t >= 0) & (t < nk)
    if HAS_MASK:
        tc = tl.minimum(tl.maximum(t, 0), nk - 1)
        ok = inside & (tl.load(VIS + vis_base + tc) != 0)
    else:
        ok = inside & ((causal == 0) | (t * Bc <= lim))
    return ok


@triton.jit
def _visit_order(vi, ncs, extra, CLIST, IN_LIST, VIS, vis_base, lim, Bc, nk,
                 causal, CRIT: tl.constexpr, HAS_MASK: tl.constexpr):
    """Slot ``vi`` of the visiting order (online._visit_order): ``(t, visit, critical)``.
    Slots ``vi < ncs`` are the critical tiles in order (tile 0 then ``extra`` for the named
    sets, the deduplicated list for ``CRIT_LIST``), the next ``nk`` slots every tile in
    ascending order; ``visit`` is False for invisible tiles and tiles already visited as
    critical."""
    critical = vi < ncs
    if CRIT == CRIT_LIST:
        t_main = vi - ncs
        t_crit = tl.load(CLIST + tl.minimum(vi, ncs - 1))
        t = tl.where(critical, t_crit, t_main)
        unlisted = tl.load(IN_LIST + tl.minimum(tl.maximum(t_main, 0), nk - 1)) == 0
        vis = _tile_visible(t, VIS, vis_base, lim, Bc, nk, causal, HAS_MASK)
        visit = vis & (critical | unlisted)
    elif CRIT == CRIT_NONE:
        t = vi
        visit = _tile_visible(t, VIS, vis_base, lim, Bc, nk, causal, HAS_MASK)
    else:
        t_main = vi - ncs
        t = tl.where(critical, tl.where(vi == 0, 0, extra), t_main)
        vis = _tile_visible(t, VIS, vis_base, lim, Bc, nk, causal, HAS_MASK)
        # the extra critical tile counts only when it is not tile 0 (already critical or
        # invisible); in the main slots, tile 0 and the extra tile were critical if visible
        visit = vis & tl.where(critical, (vi == 0) | (extra > 0),
                               (t_main != 0) & (t_main != extra))
    return t, visit, critical


@triton.jit
def _visible_tiles(MASK, VIS, smp, smm, smn, Lq, Lk, Br, Bc, nq, nk,
                   CAUSAL: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    """Mask pre-pass (online._visible_tiles), one program per (mask plane, query tile):
    ``VIS[plane, qt, t]`` = some (row, key) pair of key tile t is visible (mask not -inf and,
    when causal, key <= row + Lk - Lq).  Planes are shared between heads, so this runs once
    per plane, not per batch entry."""
    pid = tl.program_id(0)
    plane = pid // nq
    qt = pid % nq
    i0 = qt * Br
    nrow = tl.minimum(Br, Lq - i0)
    rows = tl.arange(0, BM)
    row_ok = rows < nrow
    gi = i0 + rows
    jj = tl.arange(0, BN)
    lim = i0 + nrow - 1 + (Lk - Lq)
    mbase = MASK + plane.to(tl.int64) * smp
    for t in range(0, nk):
        j0 = t * Bc
        ncol = tl.minimum(Bc, Lk - j0)
        ok = row_ok[:, None] & (jj < ncol)[None, :]
        if CAUSAL:
            ok = ok & ((j0 + jj)[None, :] <= (gi + (Lk - Lq))[:, None])
        mv = tl.load(mbase + gi[:, None].to(tl.int64) * smm + (j0 + jj)[None, :] * smn,
                     mask=ok, other=float("-inf"))
        seen = tl.max(((mv != float("-inf")) & ok).to(tl.int32)) > 0
        if CAUSAL:
            seen = seen & (j0 <= lim)
        tl.store(VIS + pid.to(tl.int64) * nk + t, seen.to(tl.int8))


@triton.jit
def _prep_q(Q, QT, QG, sqz, sqh, sqm, sqd, Hq, Lq, d, Br, nq, nsub, rsub,
            BQ: tl.constexpr, BM: tl.constexpr, D_PAD: tl.constexpr, ROUND: tl.constexpr,
            LOW: tl.constexpr):
    """q pre-pass, one program per (batch entry, query tile): the tile's q as float32
    (bfloat16-rounded first when ``ROUND``), transposed per row block, ``QT[(b, qt, sub), kk,
    r] = q[b, qt * Br + sub * rsub + r, kk]`` (zeros beyond Lq), and the tile's magnitude range
    ``QG[b, qt] = (min |q|, max |q|)`` for the exact-product guard (:func:`_magnitude_range`)."""
    pid = tl.program_id(0)
    b = pid // nq
    qt = pid % nq
    z = b // Hq
    h = b % Hq
    i0 = qt * Br
    rows = tl.arange(0, BQ)
    dq = tl.arange(0, D_PAD)
    nrow = tl.minimum(Br, Lq - i0)
    ok = (rows < nrow)[:, None] & (dq < d)[None, :]
    qb = Q + z.to(tl.int64) * sqz + h.to(tl.int64) * sqh + i0.to(tl.int64) * sqm
    x = tl.load(qb + rows[:, None] * sqm + dq[None, :] * sqd, mask=ok, other=0.0)
    x = x.to(tl.float32)
    if ROUND:
        x = _round_bf16(x)
    lo, hi = _magnitude_range(x, LOW)
    tl.store(QG + pid * 2, lo)
    tl.store(QG + pid * 2 + 1, hi)
    sub = rows // rsub
    dst = (QT + (pid.to(tl.int64) * nsub + sub[:, None]) * (d * BM) + dq[None, :] * BM
           + (rows - sub * rsub)[:, None])
    tl.store(dst, x, mask=(rows < Br)[:, None] & (dq < d)[None, :])


@triton.jit
def _prep_kv(K, V, KT, VF, G, skz, skh, skn, skd, svz, svh, svn, svd, Hkv, Lk, d, dv, Bc, nk,
             BN: tl.constexpr, D_PAD: tl.constexpr, DV_PAD: tl.constexpr, ROUND: tl.constexpr,
             LOW_K: tl.constexpr, LOW_V: tl.constexpr):
    """k/v pre-pass, one program per (key/value head, key tile), shared by every query tile
    and every query head of a GQA group: the tile as float32 (bfloat16-rounded first when
    ``ROUND``), ``KT[(bkv, t), kk, jj] = k[j0 + jj, kk]`` (k^T) and ``VF[(bkv, t), jj, c] =
    v[j0 + jj, c]`` for every ``jj < BN`` (keys of the next tile included: the CPU's P v runs
    up to ceil4(block_k) keys; zeros beyond Lk and dv), and the guard values ``G[(bkv, t)] =
    (min |k|, max |k|, min |v|, max |v|)`` of the tile's own keys (:func:`_magnitude_range`)."""
    pid = tl.program_id(0)
    bkv = pid // nk
    t = pid % nk
    z = bkv // Hkv
    h = bkv % Hkv
    j0 = t * Bc
    jj = tl.arange(0, BN)
    in_l = (j0 + jj) < Lk
    own = jj < Bc
    dc = tl.arange(0, D_PAD)
    kb = K + z.to(tl.int64) * skz + h.to(tl.int64) * skh + j0.to(tl.int64) * skn
    kt = tl.load(kb + jj[:, None] * skn + dc[None, :] * skd,
                 mask=in_l[:, None] & (dc < d)[None, :], other=0.0).to(tl.float32)
    dvc = tl.arange(0, DV_PAD)
    vb = V + z.to(tl.int64) * svz + h.to(tl.int64) * svh + j0.to(tl.int64) * svn
    vt = tl.load(vb + jj[:, None] * svn + dvc[None, :] * svd,
                 mask=in_l[:, None] & (dvc < dv)[None, :], other=0.0).to(tl.float32)
    if ROUND:
        kt = _round_bf16(kt)
        vt = _round_bf16(vt)
    klo, khi = _magnitude_range(tl.where(own[:, None], kt, 0.0), LOW_K)
    vlo, vhi = _magnitude_range(tl.where(own[:, None], vt, 0.0), LOW_V)
    g = G + pid.to(tl.int64) * 4
    tl.store(g, klo)
    tl.store(g + 1, khi)
    tl.store(g + 2, vlo)
    tl.store(g + 3, vhi)
    tile = pid.to(tl.int64)
    tl.store(KT + tile * (d * BN) + dc[None, :] * BN + jj[:, None], kt,
             mask=(dc < d)[None, :] & (jj >= 0)[:, None])
    tl.store(VF + tile * (BN * DV_PAD) + jj[:, None] * DV_PAD + dvc[None, :], vt)


@triton.jit
def _round_bf16_kernel(X, Y, n, BLOCK: tl.constexpr):
    """``Y`` (int16 bits of bfloat16) = :func:`_round_bf16` of float ``X`` (the ``baps``
    ``input_dtype="bfloat16"`` rounding, ml_dtypes RNE; NaN stays a quiet NaN)."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    x = tl.load(X + offs, mask=ok, other=0.0).to(tl.float32)
    u = _bits(_round_bf16(x))
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    hi = tl.where(nan, (u >> 16) | 0x7FC0, u >> 16)
    tl.store(Y + offs, hi.to(tl.uint16).to(tl.int16, bitcast=True), mask=ok)


# ------------------------------------------------------------------------------------------
# the engine


# shape and switch integers: one compiled variant for every shape (no value-1 or
# divisible-by-16 specialisation, which would recompile per shape or per causal flag)
_ENGINE_NO_SPEC = ("task0", "Hq", "group", "Lq", "Lk", "d", "dv", "Br", "Bc", "bc4", "nq", "nk",
                   "ncs", "causal", "c_bits", "thr_bits", "nsub", "rsub", "plo_bits",
                   "phi_bits")


@triton.jit(do_not_specialize=_ENGINE_NO_SPEC)
def _engine(QT, KT, VF, QG, G, MASK, MMAP, VIS, TAB, PTAB, VTAB, CLIST, IN_LIST, SCR,
            OUT, FLAGS, RR,
            smp, smm, smn, soz, soh, som, sod,
            task0, Hq, group, Lq, Lk, d, dv, Br, Bc, bc4, nq, nk, ncs, causal, c_bits,
            thr_bits, nsub, rsub, plo_bits, phi_bits,
            BM: tl.constexpr, BN: tl.constexpr, DV_PAD: tl.constexpr, UK: tl.constexpr,
            UNROLL: tl.constexpr, FLOW: tl.constexpr, EXP: tl.constexpr,
            PRE_HIF8: tl.constexpr, CRIT: tl.constexpr, MAX_ROUND: tl.constexpr,
            GRAN: tl.constexpr, ACC: tl.constexpr, HAS_MASK: tl.constexpr,
            TRY_EXACT_QK: tl.constexpr, TRY_EXACT_PV: tl.constexpr, O_MEM: tl.constexpr,
            QK_STAGES: tl.constexpr, PV_STAGES: tl.constexpr):
    """One program per (batch entry b, query tile qt, row block sub) (online._engine's task
    loop body): rows ``sub * rsub ..`` of the query tile, all of them (``nsub = 1``) for E2E,
    whose restart decision spans the tile; FA2 rows are independent, and every row block
    visits the key tiles of the whole query tile (visibility, critical set, flags).  q, k, v
    come from the pre-passes (:func:`_prep_q`, :func:`_prep_kv`): float32, transposed where a
    product streams them, one block per (row block) / (key tile).  ``O_MEM``: the O
    accumulator round-trips through OUT on every tile instead of living in registers (same
    values; frees BM x DV registers)."""
    pid = tl.program_id(0)
    task = task0 + pid
    sub = task % nsub
    tq = task // nsub
    b = tq // nq
    qt = tq % nq
    qt = tl.where(causal != 0, nq - 1 - qt, qt)  # longest causal rows first: load balance
    z = b // Hq
    h = b % Hq
    hk = h // group
    bkv = z * (Hq // group) + hk
    i0 = qt * Br
    ntile = tl.minimum(Br, Lq - i0)  # rows of the query tile
    r0 = i0 + sub * rsub  # this program's first row
    nrow = tl.minimum(rsub, i0 + ntile - r0)
    rows = tl.arange(0, BM)
    row_ok = rows < nrow
    gi = r0 + rows
    jj = tl.arange(0, BN)
    dvc = tl.arange(0, DV_PAD)
    c = c_bits.to(tl.float32, bitcast=True)
    thr = thr_bits.to(tl.float32, bitcast=True)
    q_ptr = QT + ((b.to(tl.int64) * nq + qt) * nsub + sub) * (d * BM)
    scr_ptr = SCR + pid.to(tl.int64) * (BM * BN)
    if HAS_MASK:
        plane = tl.load(MMAP + b).to(tl.int64)
        m_ptr = MASK + plane * smp + r0.to(tl.int64) * smm
        vis_base = (plane * nq + qt) * nk
    else:
        m_ptr = MASK
        vis_base = 0
    lim = i0 + ntile - 1 + (Lk - Lq)  # the tile's last row sees the most keys (causal)
    if TRY_EXACT_QK:  # the query tile's magnitudes for the exact-product guard
        qlo = tl.load(QG + (b * nq + qt) * 2)
        qhi = tl.load(QG + (b * nq + qt) * 2 + 1)
    plo = plo_bits.to(tl.float32, bitcast=True)
    phi = phi_bits.to(tl.float32, bitcast=True)
    # zero accumulators in the register layout of a dot (4 x 4 blocks per thread, the lanes
    # of a warp along the columns): the products' loops, hence S, P, O and the row vectors,
    # run in it (Triton's default layout gives each thread one column: a load per product)
    zs = tl.dot(tl.zeros((BM, 16), tl.float32), tl.zeros((16, BN), tl.float32),
                input_precision="ieee")
    zv = tl.dot(tl.zeros((BM, 16), tl.float32), tl.zeros((16, DV_PAD), tl.float32),
                input_precision="ieee")
    zr = tl.max(zv, axis=1)

    # ---- critical set (online._visit_order): the extra named tile
    extra = -1
    if CRIT == CRIT_FIRST_LAST:
        for t in range(0, nk):
            extra = tl.where(_tile_visible(t, VIS, vis_base, lim, Bc, nk, causal, HAS_MASK),
                             t, extra)
    elif CRIT == CRIT_FIRST_DIAG:
        key = tl.minimum(Lk - 1, lim)
        extra = tl.where(key >= 0, key // tl.maximum(Bc, 1), -1)

    m = zr + float("-inf")
    l = zr
    o = zv
    rr = tl.zeros([], tl.int32)
    o_base = OUT + z.to(tl.int64) * soz + h.to(tl.int64) * soh + r0.to(tl.int64) * som
    o_ptrs = o_base + rows[:, None] * som + dvc[None, :] * sod
    o_mask = row_ok[:, None] & (dvc < dv)[None, :]
    if O_MEM:  # O lives in this program's rows of OUT (fewer registers); loads follow barriers
        tl.store(o_ptrs, o, mask=o_mask)
    fbase = (b.to(tl.int64) * nq + qt) * nk
    for vi in range(0, ncs + nk):
        t, visit, critical = _visit_order(vi, ncs, extra, CLIST, IN_LIST, VIS, vis_base,
                                          lim, Bc, nk, causal, CRIT, HAS_MASK)
        if visit:
            j0 = t * Bc
            ncol = tl.minimum(Bc, Lk - j0)
            key_ok = jj < ncol
            tile = bkv.to(tl.int64) * nk + t
            k_ptr = KT + tile * (d * BN)
            v_ptr = VF + tile * (BN * DV_PAD)
            gt = G + tile * 4
            # ---- scores S = fl(dot * c) (+ fl(mask * log2 e)), -inf where masked
            if TRY_EXACT_QK:
                qk_exact = ((qlo * tl.load(gt)) >= _TINY) & ((qhi * tl.load(gt + 1)) < _HUGE)
                if qk_exact:
                    s = qk_tile(zs, q_ptr, k_ptr, d, rows, jj, BM, BN, UK, QK_STAGES, True)
                else:
                    s = qk_tile(zs, q_ptr, k_ptr, d, rows, jj, BM, BN, UK, QK_STAGES, False)
            else:
                s = qk_tile(zs, q_ptr, k_ptr, d, rows, jj, BM, BN, UK, QK_STAGES, False)
            jlim = tl.where(causal != 0,
                            tl.maximum(0, tl.minimum(ncol, gi + (Lk - Lq) - j0 + 1)), ncol)
            jmask = jj[None, :] < jlim[:, None]
            if HAS_MASK:
                mrow = tl.load(m_ptr + rows[:, None].to(tl.int64) * smm + (j0 + jj)[None, :] * smn,
                               mask=row_ok[:, None] & jmask, other=0.0)
            else:
                mrow = 0.0
            s = _scores_row(s, jmask, c, mrow, HAS_MASK, PRE_HIF8, TAB, VTAB)
            rmax = _row_max(s)
            # ---- running max and rescale factors
            if FLOW == E2E:
                over = ((rmax - m) >= thr) & row_ok  # NaN (both -inf): False
                restart = tl.max(over.to(tl.int32), axis=0) > 0
                if GRAN == GRAN_TILE:
                    over = over | restart
                upd = over | critical
                mn = tl.where(upd, _max(m, _round_max(rmax, MAX_ROUND)), m)
                alpha = tl.where(upd, _pow2_exact(m, mn), 1.0)
                m = mn
                rr += tl.where(critical, 0, tl.sum((upd & row_ok).to(tl.int32), axis=0))
                flag = tl.where(critical, FLAG_CRITICAL, restart.to(tl.int32))
            else:
                mn = _max(m, rmax)
                alpha = tl.where(mn == float("-inf"), 1.0, _exp2(m - mn, EXP, TAB, PTAB))
                m = mn
                flag = tl.zeros([], tl.int32)
            tl.store(FLAGS + fbase + t, flag.to(tl.int8))
            # ---- P, row sums, P v: P staged transposed in this program's scratch slice (a
            # register tile has no dynamic column access); the barriers order the whole
            # program's stores and loads
            p = _p_row(s, m, key_ok[None, :], EXP, TAB, PTAB)
            tl.debug_barrier()  # the previous tile's loads of the scratch are done
            tl.store(scr_ptr + jj[None, :] * BM + rows[:, None], p)
            tl.debug_barrier()
            # keys up to ceil4(Bc) take part with P = 0, as in the CPU's padded pv_tile
            nkeys = tl.minimum(bc4, Lk - j0)
            if TRY_EXACT_PV:
                # every P is a table value (<= 4 significant bits, finite ones in
                # [plo, phi]); NaN and Inf products are exact
                pv_exact = ((plo * tl.load(gt + 2)) >= _TINY) & ((phi * tl.load(gt + 3)) < _HUGE)
                if pv_exact:
                    pv, rs = pv_tile(zv, zr, scr_ptr, v_ptr, nkeys, rows, dvc, BM, DV_PAD,
                                     UNROLL, PV_STAGES, True)
                else:
                    pv, rs = pv_tile(zv, zr, scr_ptr, v_ptr, nkeys, rows, dvc, BM, DV_PAD,
                                     UNROLL, PV_STAGES, False)
            else:
                pv, rs = pv_tile(zv, zr, scr_ptr, v_ptr, nkeys, rows, dvc, BM, DV_PAD, UNROLL,
                                 PV_STAGES, False)
            l = _acc((l * alpha) + rs, ACC)
            if O_MEM:
                o_old = tl.load(o_ptrs, mask=o_mask, other=0.0)
                tl.store(o_ptrs, _acc((o_old * alpha[:, None]) + pv, ACC), mask=o_mask)
            else:
                o = _acc((o * alpha[:, None]) + pv, ACC)
    tl.store(RR + task, rr)
    if O_MEM:
        tl.debug_barrier()  # the last tile's stores of O are visible to every thread
        o = tl.load(o_ptrs, mask=o_mask, other=0.0)
    tl.store(o_ptrs, tl.math.div_rn(o, l[:, None]), mask=o_mask)


# ------------------------------------------------------------------------------------------
# launcher


def _np2(n: int, lo: int = 16) -> int:
    """Smallest power of two >= max(n, lo) (Triton block shapes; tl.dot needs >= 16)."""
    return max(lo, 1 << max(0, int(n) - 1).bit_length())


def _p_bits(table: np.ndarray) -> int:
    """Largest number of significant bits of a finite non-zero float32 table value."""
    f = np.asarray(table, dtype=np.float32)
    f = f[np.isfinite(f) & (f != 0)]
    if f.size == 0:
        return 0
    mant = (f.view(np.uint32) & np.uint32(0x7FFFFF)).astype(np.int64)
    low = np.where(mant == 0, 1 << 23, mant & -mant)  # lowest set bit (2**23: none)
    return int(24 - np.log2(low).astype(np.int64).min())


def _p_range(table: np.ndarray) -> tuple:
    """``(smallest, largest)`` magnitude of the finite non-zero float32 table values: bounds
    of every finite non-zero P of a table exponential (1, 1 when there is none), for the
    P v guard."""
    f = np.abs(np.asarray(table, dtype=np.float32))
    f = f[np.isfinite(f) & (f != 0)]
    if f.size == 0:
        return np.float32(1.0), np.float32(1.0)
    return np.float32(f.min()), np.float32(f.max())


_DEV_TABLES: dict = {}


def device_tables(cfg: _cpu.EngineConfig, device):
    """``(TAB int32[256], PTAB float32[4096], VTAB float32[4096], p_bits, (p_lo, p_hi))`` on
    ``device`` for ``cfg`` (:func:`_p_bits`, :func:`_p_range` of the table), from the objects
    the CPU engine uses (:func:`online.byte_tables`, ``cfg.table``, the HiF8 values); cached
    per (config tables, device)."""
    import torch

    table = cfg.table if cfg.table is not None else np.zeros(256, dtype=np.float32)
    key = (cfg.enc, bool(cfg.pre_hif8), np.asarray(table, dtype=np.float32).tobytes(),
           str(device))
    hit = _DEV_TABLES.get(key)
    if hit is not None:
        return hit
    addm1, sh, lut = _cpu.byte_tables(cfg.enc)
    if int(addm1.max()) >= 1 << 24 or int(sh.max()) > 31:
        raise AssertionError("byte tables do not fit the packed form addm1 | sh << 24")
    packed = (addm1.astype(np.uint32) | (sh.astype(np.uint32) << np.uint32(24))).view(np.int32)
    lut64 = lut.astype(np.int64)
    ptab = np.asarray(table, dtype=np.float32)[lut64]
    vtab = HIF8_VALUES.astype(np.float32)[lut64] if cfg.pre_hif8 else ptab
    out = tuple(torch.from_numpy(np.ascontiguousarray(a)).to(device)
                for a in (packed, ptab, vtab)) + (_p_bits(table), _p_range(table))
    _DEV_TABLES[key] = out
    return out


def _as4(x, what: str):
    if x.dim() == 3:
        return x.unsqueeze(1)
    if x.dim() != 4:
        raise ValueError(f"{what} must have shape (B, L, d) or (Z, H, L, d), got {tuple(x.shape)}")
    return x


def default_launch(BM: int, BN: int, DV_PAD: int, exp: int = _cpu.EXP_TABLE) -> dict:
    """Default launch settings for a tile shape and exponential (overridable by keyword;
    results never depend on them): ``num_warps``; ``dk`` and ``unroll``, the steps of d
    (q k^T) and keys (P v) per iteration of the product loops; ``o_mem`` (O in memory);
    ``rows``, query rows per program for the FA2 flows (None: the whole tile); ``maxnreg``,
    the ptxas register cap (without it ptxas chose 64 of the 128 registers 16 warps may have,
    and spilled); ``qk_stages`` and ``pv_stages``, software pipelining of the product loops'
    loads through shared memory (0: none).  Measured on an H100 (docs/design.md, "GPU
    attention engine"): table exponentials (exact fused products) run fastest with 16 warps
    and pipelined loads, ``flash``'s float exponential (unfused P v: two operations per
    product) with 8 warps of 64 accumulators and no pipelining."""
    big = BM * max(BN, DV_PAD)
    if exp == _cpu.EXP_FLOAT:
        nw = max(4, min(8, big // 2048))
        tune = {"dk": 8, "unroll": 8, "qk_stages": 0, "pv_stages": 0}
    else:
        nw = max(4, min(16, big // 1024))
        tune = {"dk": 8, "unroll": 8, "qk_stages": 3, "pv_stages": 3}
    return dict(tune, num_warps=nw, o_mem=False, rows=None,
                maxnreg=min(255, 65536 // (32 * nw)))


def round_bf16(x):
    """``x`` (float tensor) rounded to bfloat16, ties to even, on its device: the values
    ``baps`` computes with by default (``input_dtype="bfloat16"``); a bfloat16 tensor is
    returned unchanged."""
    import torch

    if x.dtype == torch.bfloat16:
        return x
    xc = x.contiguous()
    y = torch.empty(xc.shape, dtype=torch.int16, device=x.device)
    n = xc.numel()
    if n:
        block = 1 << 16 if _interpreting() else 1024
        _round_bf16_kernel[(triton.cdiv(n, block),)](xc, y, n, BLOCK=block, **LAUNCH_OPTS)
    return y.view(torch.bfloat16)


@contextlib.contextmanager
def sequential_interpreter_dot(counter: dict | None = None):
    """Within the context, the Triton interpreter's fused operations compute what the GPU's
    compute whenever every product is exact (the only place the engine fuses): ``tl.fma`` as
    ``fl(c + fl(a b))`` (what the interpreter does anyway) and ``tl.dot`` (the engine's
    layout anchors, on zeros) as ``acc = fl(acc + fl(a_k b_k))``, k ascending (the
    interpreter's own dot is NumPy's matmul, in BLAS order).  Every product is checked to be
    exact (AssertionError otherwise), so the engine's guard is verified on each fused
    operation it lets through; ``counter["n"]`` counts the fused operations with a non-zero
    operand.  For tests and ``--device cpu`` checks only."""
    from triton.runtime import interpreter as ti

    def exact_products(A, Bm):
        with np.errstate(invalid="ignore", over="ignore"):
            p32 = A * Bm
            p64 = A.astype(np.float64) * Bm.astype(np.float64)
        ok = (p32.astype(np.float64) == p64) | (np.isnan(p32) & np.isnan(p64))
        if not ok.all():
            raise AssertionError("a fused multiply-add was given an inexact product")
        return p32

    def count(*arrays):
        if counter is not None and any(np.any(x != 0) for x in arrays):
            counter["n"] = counter.get("n", 0) + 1

    def dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        A = a.data.astype(np.float32)
        Bm = b.data.astype(np.float32)
        acc = d.data.astype(np.float32).copy()
        with np.errstate(invalid="ignore", over="ignore"):
            for kk in range(A.shape[-1]):
                acc = acc + exact_products(A[:, kk, None], Bm[None, kk, :])
        count(A, Bm)
        return ti.TensorHandle(acc, d.dtype.scalar)

    def fma(self, x, y, z):
        X, Y = x.data.astype(np.float32), y.data.astype(np.float32)
        with np.errstate(invalid="ignore", over="ignore"):
            r = exact_products(X, Y) + z.data.astype(np.float32)
        count(X, Y)
        return ti.TensorHandle(r.astype(np.float32), z.dtype.scalar)

    orig = ti.InterpreterBuilder.create_dot, ti.InterpreterBuilder.create_fma
    ti.InterpreterBuilder.create_dot = dot
    ti.InterpreterBuilder.create_fma = fma
    try:
        yield
    finally:
        ti.InterpreterBuilder.create_dot, ti.InterpreterBuilder.create_fma = orig


def _interpreting() -> bool:
    import os

    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


_PLACEHOLDERS: dict = {}


def _placeholders(dev):
    """``(mask map int32, visibility int8, mask float32)`` one-element tensors on ``dev`` for
    the mask arguments of a call without a mask (the kernels do not read them), made once
    per device: three allocations fewer per call."""
    import torch

    key = str(dev)
    if key not in _PLACEHOLDERS:
        _PLACEHOLDERS[key] = (torch.zeros(1, dtype=torch.int32, device=dev),
                              torch.zeros(1, dtype=torch.int8, device=dev),
                              torch.zeros(1, dtype=torch.float32, device=dev))
    return _PLACEHOLDERS[key]


def _crit_tensors(crit_list, nk: int, crit: int, dev):
    """``(critical tiles int32, per key tile 1 if listed int32 (max(nk, 1),))`` on ``dev``,
    made once per list, tile count, mode and device and kept
    (:func:`lowprec.kernels.device_rows.index_tensor`; read only): a tensor built from a
    Python list on a CUDA device is a synchronising copy, which stopped the host at every
    engine call (one per SDPA call of ``lp.emulate``)."""
    import torch

    from ..kernels.device_rows import index_tensor

    dev = torch.device(dev)
    key = (tuple(int(c) for c in crit_list), nk, crit)

    def listed():
        il = np.zeros(max(nk, 1), dtype=np.int32)
        if crit == _cpu.CRIT_LIST:
            il[np.array(crit_list, dtype=np.int64)] = 1
        return il

    return (index_tensor(("crit_list",) + key,
                         lambda: np.array(crit_list or [0], dtype=np.int32), dev),
            index_tensor(("crit_in_list",) + key, listed, dev))


def run_engine_gpu(q, k, v, *, scale: float, causal: bool, mask=None, mask_map=None,
                   block_q: int, block_k: int, cfg: _cpu.EngineConfig,
                   round_inputs_bf16: bool = False, exact_dots: bool = True,
                   num_warps: int | None = None, dk: int | None = None,
                   unroll: int | None = None, o_mem: bool | None = None,
                   rows: int | None = None, maxnreg: int | None = None,
                   pv_stages: int | None = None, qk_stages: int | None = None,
                   raw_restarts: bool = False):
    """The engine on torch tensors of one device (a CUDA GPU, or CPU under the Triton
    interpreter); same meaning and results as :func:`lowprec.kernels.online.run_engine`.

    Args:
        q: ``(B, Lq, d)`` or ``(Z, Hq, Lq, d)``; float32, float16 or bfloat16, any strides.
        k, v: ``(B, Lk, d)`` / ``(B, Lk, dv)``, or ``(Z, Hkv, Lk, d)`` / ``(Z, Hkv, Lk, dv)``
            with ``Hq % Hkv == 0``: query head ``h`` reads key/value head ``h // (Hq // Hkv)``
            (GQA without a copy).  Values are used exactly (widened to float32).
        scale: softmax scale (``c = float32(scale * log2 e)``, as on the CPU).
        causal: bottom-right aligned causal mask.
        mask: None or a float32 tensor ``(M, Lq, Lk)`` of additive planes (0, finite, -inf).
        mask_map: ``(B,)`` integers (tensor or array): batch entry ``b = z * Hq + h`` uses
            ``mask[mask_map[b]]``.
        block_q, block_k: tile sizes (positive ints; any value, not only powers of two).
        cfg: the :class:`~lowprec.kernels.online.EngineConfig` (``baps.make_config``, or
            ``EngineConfig(flow=FA2, exp=EXP_FLOAT)`` for ``flash``).
        round_inputs_bf16: round q, k, v to bfloat16 on the device first (what ``baps`` does
            with ``input_dtype="bfloat16"`` before calling the CPU engine).
        exact_dots: allow fused products (``tl.fma``) where the guard proves every product
            exact (False: separate multiply and add everywhere; same results, slower; for
            tests).
        raw_restarts: return the restarted rows per row block, int32 ``(B, nq * nsub)``
            (``nsub`` row blocks per query tile), not their sums per entry (one reduction
            fewer for a caller that sums them itself: :mod:`lowprec.gpu.callstats`).
        num_warps, dk, unroll, o_mem, rows, maxnreg, qk_stages, pv_stages: launch tuning
            (results do not depend on them): :func:`default_launch` when None.

    Returns:
        ``(out, flags, row_restarts)``: float32 ``(B, Lq, dv)`` or ``(Z, Hq, Lq, dv)``;
        int8 ``(B, nq, nk)`` flags (1 restarted, 0 visited, -1 critical, -2 skipped) with
        ``B = Z * Hq``; int64 ``(B,)`` restarted rows.  All on q's device.

    Raises:
        ValueError: bad shapes, devices, block sizes, or a critical list out of range.

    Example::

        >>> cfg = lowprec.kernels.baps.make_config("e2e_hif8", tau=1)
        >>> out, flags, rr = run_engine_gpu(q, k, v, scale=d ** -0.5, causal=True,
        ...                                 block_q=128, block_k=128, cfg=cfg)
    """
    import torch

    q4, k4, v4 = _as4(q, "q"), _as4(k, "k"), _as4(v, "v")
    Z, Hq, Lq, d = q4.shape
    Zk, Hkv, Lk, dk_ = k4.shape
    if dk_ != d or v4.shape[0] != Zk or v4.shape[1] != Hkv or v4.shape[2] != Lk or Zk != Z:
        raise ValueError(f"shapes q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} "
                         "do not match (same batch, d, Lk)")
    if Hkv == 0 or Hq % Hkv:
        raise ValueError(f"q has {Hq} heads, k/v {Hkv}: Hq must be a multiple of Hkv")
    dev = q.device
    for name, t in (("k", k), ("v", v)):
        if t.device != dev:
            raise ValueError(f"{name} is on {t.device}, q on {dev}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise ValueError(f"{name} has dtype {t.dtype}; allowed float32, float16, bfloat16")
    for name, val in (("block_q", block_q), ("block_k", block_k)):
        if isinstance(val, bool) or not isinstance(val, (int, np.integer)) or val < 1:
            raise ValueError(f"{name} must be a positive int, got {val!r}")
    if cfg.pre_hif8 and cfg.enc != _cpu.ENC_HIF8:
        raise ValueError("pre_hif8 rounds the scores with the plain HiF8 tables: enc=ENC_HIF8")
    dv = v4.shape[3]
    B = Z * Hq
    Br, Bc = max(1, min(int(block_q), Lq)), max(1, min(int(block_k), Lk))
    nq = (Lq + Br - 1) // Br
    nk = (Lk + Bc - 1) // Bc
    out = torch.empty((Z, Hq, Lq, dv), dtype=torch.float32, device=dev)
    flags = torch.full((B, nq, nk), FLAG_SKIPPED, dtype=torch.int8, device=dev)
    shape_out = tuple(q.shape[:-1]) + (dv,)
    crit_list = [int(t) for t in cfg.crit_list]
    if cfg.crit == _cpu.CRIT_LIST:
        if not crit_list:
            raise ValueError("CRIT_LIST needs a non-empty critical list")
        bad = [t for t in crit_list if t < 0 or t >= nk]
        if bad and nk:
            raise ValueError(f"critical tile indices {bad} are out of range: there are {nk} "
                             "key tiles")
        crit_list = list(dict.fromkeys(crit_list))  # duplicates dropped, order kept
    if B * nq == 0 or Lk == 0:
        if Lk == 0:
            out.fill_(float("nan"))
        rr0 = torch.zeros((B, 0), dtype=torch.int32, device=dev) if raw_restarts else \
            torch.zeros(B, dtype=torch.int64, device=dev)
        return out.view(shape_out), flags, rr0
    with (torch.cuda.device(dev) if dev.type == "cuda" else contextlib.nullcontext()):
        return _launch(q4, k4, v4, out, flags, shape_out, crit_list, scale=scale,
                       causal=causal, mask=mask, mask_map=mask_map, Br=Br, Bc=Bc, nq=nq, nk=nk,
                       cfg=cfg, round_inputs_bf16=round_inputs_bf16, exact_dots=exact_dots,
                       num_warps=num_warps, dk=dk, unroll=unroll, o_mem=o_mem, rows=rows,
                       maxnreg=maxnreg, pv_stages=pv_stages, qk_stages=qk_stages,
                       raw_restarts=raw_restarts)


def _launch(q4, k4, v4, out, flags, shape_out, crit_list, *, scale, causal, mask, mask_map,
            Br, Bc, nq, nk, cfg, round_inputs_bf16, exact_dots, num_warps, dk, unroll, o_mem,
            rows, maxnreg, pv_stages, qk_stages, raw_restarts):
    """The launches of :func:`run_engine_gpu` (validated arguments, 4-d inputs, outputs
    allocated, under the device guard)."""
    import torch

    dev = q4.device
    Z, Hq, Lq, d = q4.shape
    Hkv, Lk, dv = k4.shape[1], k4.shape[2], v4.shape[3]
    B = Z * Hq
    BQ, BN = _np2(Br), _np2(Bc)  # register tiles of a whole query tile and a key tile
    D_PAD, DV_PAD = _np2(d), _np2(dv)
    # row blocks: FA2 rows are independent (E2E's restart decision spans the query tile)
    rsub = Br
    if cfg.flow == _cpu.FA2:
        rq = default_launch(BQ, BN, DV_PAD, cfg.exp)["rows"] if rows is None else rows
        rsub = max(1, min(Br, int(rq or Br)))
    nsub = -(-Br // rsub)
    BM = _np2(rsub)
    tune = default_launch(BM, BN, DV_PAD, cfg.exp)
    nw = int(num_warps or tune["num_warps"])
    UK = int(dk or tune["dk"])
    UNROLL = int(unroll or tune["unroll"])
    O_MEM = bool(tune["o_mem"] if o_mem is None else o_mem)
    mreg = tune["maxnreg"] if maxnreg is None else maxnreg
    PV_ST = int(tune["pv_stages"] if pv_stages is None else pv_stages)
    QK_ST = int(tune["qk_stages"] if qk_stages is None else qk_stages)
    if UK < 1 or UNROLL < 1:
        raise ValueError(f"dk and unroll must be positive, got {UK}, {UNROLL}")
    tab, ptab, vtab, p_bits, (p_lo, p_hi) = device_tables(cfg, dev)
    try_pv = cfg.exp == _cpu.EXP_TABLE and p_bits <= _P_BITS_MAX
    c_bits = int(np.float32(scale * math.log2(math.e)).view(np.int32))  # rounded once
    thr_bits = int(np.float32(cfg.thr).view(np.int32))
    i32, f32 = torch.int32, torch.float32
    rnd = bool(round_inputs_bf16)

    # ---- pre-passes: mask visibility per (plane, query tile); q, k, v as float32 blocks
    # (transposed where a product streams them) with the guard's magnitudes
    pre_warps = 8 if BN * max(BQ, D_PAD, DV_PAD) >= 16384 else 4  # whole tiles in registers
    has_mask = mask is not None
    if has_mask:
        if mask.dtype != torch.float32 or mask.dim() != 3 or tuple(mask.shape[1:]) != (Lq, Lk):
            raise ValueError(f"mask must be float32 (M, {Lq}, {Lk}), got {mask.dtype} "
                             f"{tuple(mask.shape)}")
        if mask.device != dev:
            raise ValueError(f"mask is on {mask.device}, q on {dev}")
        if mask_map is None:
            raise ValueError("a mask needs mask_map: the plane index of every batch entry")
        mmap = torch.as_tensor(np.asarray(mask_map) if not torch.is_tensor(mask_map)
                               else mask_map).to(device=dev, dtype=i32).reshape(-1)
        if mmap.numel() != B:
            raise ValueError(f"mask_map must have {B} entries, got {mmap.numel()}")
        M = mask.shape[0]
        vis = torch.empty((M, nq, nk), dtype=torch.int8, device=dev)
        _visible_tiles[(M * nq,)](mask, vis, *mask.stride(), Lq, Lk, Br, Bc, nq, nk,
                                  CAUSAL=bool(causal), BM=BQ, BN=BN, num_warps=pre_warps,
                                  **LAUNCH_OPTS)
        mask_arg, mstr = mask, mask.stride()
    else:  # (never read: placeholders, made once per device)
        mmap, vis, mask_arg = _placeholders(dev)
        mstr = (0, 0, 0)
    Bkv = Z * Hkv
    # slots past a row block's rows are never stored: zeros (read, then ignored)
    qt_buf = (torch.zeros if nsub * BM != Br else torch.empty)((B * nq * nsub, d, BM),
                                                                dtype=f32, device=dev)
    qg = torch.empty((B * nq, 2), dtype=f32, device=dev)
    _prep_q[(B * nq,)](q4, qt_buf, qg, *q4.stride(), Hq, Lq, d, Br, nq, nsub, rsub, BQ=BQ,
                       BM=BM, D_PAD=D_PAD, ROUND=rnd, LOW=_LOW_QK.value, num_warps=pre_warps,
                       **LAUNCH_OPTS)
    kt_buf = torch.empty((Bkv * nk, d, BN), dtype=f32, device=dev)
    vf_buf = torch.empty((Bkv * nk, BN, DV_PAD), dtype=f32, device=dev)
    guard = torch.empty((Bkv * nk, 4), dtype=f32, device=dev)
    _prep_kv[(Bkv * nk,)](k4, v4, kt_buf, vf_buf, guard, *k4.stride(), *v4.stride(), Hkv, Lk,
                          d, dv, Bc, nk, BN=BN, D_PAD=D_PAD, DV_PAD=DV_PAD, ROUND=rnd,
                          LOW_K=_LOW_QK.value, LOW_V=_LOW_V.value, num_warps=pre_warps,
                          **LAUNCH_OPTS)
    ncs = {int(_cpu.CRIT_NONE): 0, int(_cpu.CRIT_LIST): len(crit_list)}.get(int(cfg.crit), 2)
    cl, in_list = _crit_tensors(crit_list, nk, int(cfg.crit), dev)
    rr = torch.zeros(B * nq * nsub, dtype=i32, device=dev)
    plo_bits = int(np.float32(p_lo).view(np.int32))
    phi_bits = int(np.float32(p_hi).view(np.int32))
    extra = {} if _interpreting() or not mreg else {"maxnreg": int(mreg)}

    # ---- the engine, in parts so that the scratch buffer stays bounded
    ntask = B * nq * nsub
    per = max(1, min(ntask, SCRATCH_BYTES // (BM * BN * 4)))
    scr = torch.empty((per, BN * BM), dtype=f32, device=dev)
    for task0 in range(0, ntask, per):
        n = min(per, ntask - task0)
        _engine[(n,)](
            qt_buf, kt_buf, vf_buf, qg, guard, mask_arg, mmap, vis, tab, ptab, vtab, cl,
            in_list, scr, out, flags, rr, *mstr, *out.stride(),
            task0, Hq, Hq // Hkv, Lq, Lk, d, dv, Br, Bc, -(-Bc // 4) * 4, nq, nk, ncs,
            int(bool(causal)), c_bits, thr_bits, nsub, rsub, plo_bits, phi_bits,
            BM=BM, BN=BN, DV_PAD=DV_PAD, UK=UK, UNROLL=UNROLL,
            FLOW=int(cfg.flow), EXP=int(cfg.exp), PRE_HIF8=bool(cfg.pre_hif8),
            CRIT=int(cfg.crit), MAX_ROUND=int(cfg.max_round), GRAN=int(cfg.gran),
            ACC=int(cfg.acc), HAS_MASK=has_mask,
            TRY_EXACT_QK=bool(exact_dots), TRY_EXACT_PV=bool(try_pv and exact_dots), O_MEM=O_MEM,
            QK_STAGES=QK_ST, PV_STAGES=PV_ST, num_warps=nw, **extra, **LAUNCH_OPTS)
    if raw_restarts:
        return out.view(shape_out), flags, rr.view(B, nq * nsub)
    return out.view(shape_out), flags, rr.view(B, nq * nsub).sum(dim=1, dtype=torch.int64)


__all__ = ["run_engine_gpu", "round_bf16", "device_tables", "default_launch", "LAUNCH_OPTS",
           "sequential_interpreter_dot"]
