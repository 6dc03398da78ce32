"""QFlash's Algorithm 1 as one Triton kernel (the device path of ``qflash`` for calls without a
mask; docs/design.md "Attention on the device"): one program per block of query rows of one
entry walks the key tiles of ``block_k`` keys with the online integer max, ShiftExp2, the
int8 requantisation, ScaleRelease (or Scale Accumulation) and the ``l`` / ``acc`` updates,
and writes the output and the per-row hazard counters.

It mirrors :func:`lowprec.kernels.qflash_device._chunk` (the torch twin) step for step, with
the same integer operations: int32 values held in int64 and wrapped by a truncating
conversion (two's complement, ``x.to(int32).to(int64)``), arithmetic shifts with the GPU's
clamped count (outside ``[0, 31]``: by 63), integer division truncating toward zero, the
scores and ``P8 v8`` as int8 ``tl.dot`` into int32 (exact in any order); the final
``trunc(fp32(acc) / fp32(l))`` with ``tl.math.div_rn`` and the saturating conversion done by
hand; ``fp32(fp64(o8) s_v)``.  A key tile of ``block_k`` keys occupies the first ``block_k``
of ``BN`` (a power of two) lanes; keys past ``Lk`` in the last tile are the CPU's padding
(score ``MASK_BIAS``, counted as it counts them); lanes past ``block_k`` take no part.
Launched with ``enable_fp_fusion=False``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..kernels._qflash_rows import MASK_BIAS, SHIFT_EXP, SHIFT_RELEASE
from ._launch import LAUNCH_OPTS, device_guard
from ._tiles import kv_tile, pow2, q_tile, scores

_MASK_BIAS = tl.constexpr(MASK_BIAS)
_SHIFT_EXP = tl.constexpr(SHIFT_EXP)
_SHIFT_RELEASE = tl.constexpr(SHIFT_RELEASE)
_HALF_EXP = tl.constexpr(1 << (SHIFT_EXP - 1))
_HALF_RELEASE = tl.constexpr(1 << (SHIFT_RELEASE - 1))
_LOW = tl.constexpr(-(1 << 62))
_I32_MAX = tl.constexpr((1 << 31) - 1)
_I32_MIN = tl.constexpr(-(1 << 31))
#: the fast tiles' bound on a row's ``max |acc|`` (tests lower it to reach the checked update)
ACC_LIMIT = (1 << 31) - 1


@triton.jit
def _w32(x):
    """Two's-complement int32 wrap of int64 values."""
    return x.to(tl.int32).to(tl.int64)


@triton.jit
def _ashr(a, n):
    return a >> tl.where((n >= 0) & (n <= 31), n, 63)


@triton.jit
def _shexp(x, R, eM, DIVISION: tl.constexpr):
    """ShiftExp2 of int64 ``x`` (``qflash_device.shift_exp2``): ``(y, overflows, wraps)``."""
    if DIVISION:
        nx = _w32(-x)
        wr = (nx != -x).to(tl.int64)
        q = nx // R
        ovf = tl.zeros_like(x)
    else:
        prod = x * eM
        w = _w32(prod)
        ovf = (w != prod).to(tl.int64)
        q = w >> _SHIFT_EXP
        wr = tl.zeros_like(x)
    t = q * R
    qr = _w32(t)
    wr += (qr != t).to(tl.int64)
    t = x + qr
    r = _w32(t)
    wr += (r != t).to(tl.int64)
    t = (r >> 1) + R
    u = _w32(t)
    wr += (u != t).to(tl.int64)
    return _ashr(u, q), ovf, wr


@triton.jit
def _carry(x, alpha, M, term, f, ACCUMULATE: tl.constexpr):
    """``qflash_device._carry``: ``(y, wraps)``."""
    if ACCUMULATE:
        t = x * alpha
        a = _w32(t)
        wr = (a != t).to(tl.int64)
        t = term * f
        b = _w32(t)
        wr += (b != t).to(tl.int64)
    else:
        t = ((x * alpha) * M + _HALF_RELEASE) >> _SHIFT_RELEASE
        a = _w32(t)
        wr = (a != t).to(tl.int64)
        b = term
    raw = a + b
    y = _w32(raw)
    return y, wr + (y != raw).to(tl.int64)


@triton.jit
def _rows_safe(smin, mx, R, eM, rM, DIVISION: tl.constexpr):
    """int64 ``(BM,)`` -> bool: every ``x = s - mx`` with ``s >= smin`` (so ``x`` in
    ``[smin - mx, 0]``) runs ShiftExp2 and the requantisation's products without an int32
    wrap or overflow.  Each step is monotone in ``x`` or bounded by the range's ends,
    given ``exp_M <= 0``, ``R >= 1``, ``req_M >= 0`` (the kernel checks them once;
    docs/design.md "the fast tiles")."""
    xmin = smin - mx
    ok = xmin >= -_I32_MAX  # x and -x in int32
    if DIVISION:  # q = (-x) // R: q R <= -x, r in (-R, 0], u in [R / 2, R]
        big = R
    else:  # x exp_M >= 0 grows as x falls; r = x + q R in [xmin, q(xmin) R]
        pm = xmin * eM
        qm = pm >> _SHIFT_EXP
        rh = qm * R
        uh = (rh >> 1) + R
        ok = ok & (pm <= _I32_MAX) & (rh <= _I32_MAX) & (uh <= _I32_MAX)
        big = tl.maximum(uh, -((xmin >> 1) + R))  # |y| <= |u| <= big
        # tighter where q R nearly cancels x: r in (x kap / 2**16 - R, x kap / 2**16] with
        # kap = 2**16 + exp_M R (from x exp_M / 2**16 - 1 < q <= x exp_M / 2**16)
        kap = 65536 + eM * R
        tight = (kap <= 1 << 18) & (kap >= -(1 << 18))
        e = xmin * tl.where(tight, kap, 0)
        ul = (((tl.minimum(e, 0) >> 16) - R) >> 1) + R
        u2 = tl.maximum(((tl.maximum(e, 0) >> 16) >> 1) + R, tl.abs(ul))
        big = tl.where(tight, tl.minimum(big, u2), big)
    return ok & (big * rM <= _I32_MAX - _HALF_EXP)


@triton.jit
def _fast_p(s, mx, R, eM, rM, DIVISION: tl.constexpr):
    """ShiftExp2 and the requantisation of a safe tile (:func:`_rows_safe`) in int32, where
    no step wraps: the requantised values ``c`` before their int8 wrap."""
    x = s - mx[:, None].to(tl.int32)
    if DIVISION:
        q = (-x) // R.to(tl.int32)
    else:
        q = (x * eM.to(tl.int32)) >> _SHIFT_EXP
    r = x + q * R.to(tl.int32)
    u = (r >> 1) + R.to(tl.int32)
    y = u >> tl.minimum(q, 31)  # a count past 31 fills with the sign, as by 63 in int64
    return (y * rM.to(tl.int32) + _HALF_EXP) >> _SHIFT_EXP


@triton.jit
def _acc_checked(acc, alpha, aM, tile, f, ACCUMULATE: tl.constexpr):
    """The checked update of int32 ``acc`` (:func:`_carry` in int64): ``(acc, wraps of each
    row, max |acc| of each row)``."""
    a64, wr = _carry(acc.to(tl.int64), alpha[:, None], aM, tile.to(tl.int64), f[:, None],
                     ACCUMULATE)
    return a64.to(tl.int32), tl.sum(wr, axis=1), tl.max(tl.abs(a64), axis=1)


@triton.jit
def _qflash_kernel(Q8, K8, V8, CONST, SV, OUT, CNT, Lq, Lk, D, DV, shift, bk, nk, m_init,
                   acc_limit, fast_on, CAUSAL: tl.constexpr, DIVISION: tl.constexpr,
                   ACCUMULATE: tl.constexpr, BM: tl.constexpr,
                   BN: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr):
    """Rows ``BM`` of entry ``b``: ``OUT[b, rows]`` float32, ``CNT[b, rows, 0:9]`` int64.
    ``CONST`` int64 ``(B, 5)``: R, exp_M, req_M, l_M, acc_M of each entry.  With ``fast_on``,
    a tile whose keys every row sees and whose rows :func:`_rows_safe` clears runs its
    per-score steps in int32 without wrap tests, and ScaleRelease of ``acc`` without them
    while a row's bound on ``max |acc|`` stays below ``acc_limit``; every other tile takes
    the checked int64 steps.  Both give the same values and counters."""
    b = tl.program_id(1)
    r0 = tl.program_id(0) * BM
    offs_m = r0 + tl.arange(0, BM)
    lanes = tl.arange(0, BN)
    offs_d = tl.arange(0, BD)
    offs_v = tl.arange(0, BDV)
    rok = offs_m < Lq
    q = q_tile(Q8, b, offs_m, rok, Lq, D, offs_d)
    cb = CONST + b.to(tl.int64) * 5
    R = tl.load(cb)
    eM = tl.load(cb + 1)
    rM = tl.load(cb + 2)
    lM = tl.load(cb + 3)
    aM = tl.load(cb + 4)
    lim = (offs_m + shift).to(tl.int64)
    inb = lanes < bk
    # the constants' signs the fast tiles' bounds rely on (QFlashConstants gives them)
    fast_on = (fast_on != 0) & (eM <= 0) & (R >= 1) & (rM >= 0)

    zero = tl.zeros([BM], dtype=tl.int64)
    mrow = zero + m_init
    lsum = zero + 1
    acc = tl.zeros([BM, BDV], dtype=tl.int32)
    accb = zero  # a bound on max |acc| of each row
    vmax = zero + _LOW
    seen = zero
    c_wrap = zero
    c_ovf = zero
    c_req = zero
    c_neg = zero
    c_resc = zero
    f = zero + 1
    f_wrap = zero
    for t in range(0, nk):
        if ACCUMULATE:
            if t > 0:
                ff = f * R
                f = _w32(ff)
                f_wrap = (f != ff).to(tl.int64)
        j0 = t * bk
        cols = j0 + lanes
        real = inb & (cols < Lk)
        s32 = scores(q, K8, b, Lk, D, cols, real, offs_d)
        # fast candidates: every key of the tile seen by every row of the block, or (causal)
        # hidden from all of them, whose scores are then s + MASK_BIAS (no wrap: |s| < 2**30)
        if CAUSAL:
            hidden = j0 > r0 + (BM - 1) + shift
            dense = hidden | (j0 + bk - 1 <= r0 + shift)
            s32 = s32 + tl.where(hidden, _MASK_BIAS, 0)
        else:
            dense = j0 >= 0
        dense = dense & (j0 + bk <= Lk) & fast_on
        smax = tl.max(tl.where(inb[None, :], s32, _I32_MIN), axis=1).to(tl.int64)
        smin = tl.min(tl.where(inb[None, :], s32, _I32_MAX), axis=1).to(tl.int64)
        mxf = tl.maximum(mrow, smax)
        raw1 = mrow - mxf
        x1 = _w32(raw1)
        alpha, ovf1, wr1 = _shexp(x1, R, eM, DIVISION)
        ok = _rows_safe(smin, mxf, R, eM, rM, DIVISION)
        if not ACCUMULATE:  # the unchecked acc update: |t|, |t + tile| < 2**31 in every row
            mm = alpha * aM  # (acc alpha) M as acc (alpha M): both wrap mod 2**64
            nbp = ((accb * tl.abs(mm) + _HALF_RELEASE) >> _SHIFT_RELEASE) + 1 + 16384 * bk
            ok = ok & (tl.abs(mm) <= _I32_MAX) & (nbp <= acc_limit)
        fast = dense & (tl.min(ok.to(tl.int32), axis=0) == 1)
        if fast:  # no step wraps: counters only for the requantisation
            mx = mxf
            if CAUSAL:
                vmax = tl.where(hidden, vmax, tl.maximum(vmax, smax))
                seen = tl.where(hidden, seen, 1)
            else:
                vmax = tl.maximum(vmax, smax)
                seen = zero + 1
            c = _fast_p(s32, mx, R, eM, rM, DIVISION)
            c = tl.where(inb[None, :], c, 0)  # lanes past the tile take no part
            pv = c.to(tl.int8)
            n_req = tl.sum(((c < -128) | (c > 127)).to(tl.int64), axis=1)  # wrapped P8
            n_neg = tl.sum(((c < 0) & (c >= -128)).to(tl.int64), axis=1)  # negative P8
            c_req += n_req
            c_neg += n_neg
            rowsum = tl.sum(pv.to(tl.int32), axis=1).to(tl.int64)
            pabs = rowsum + 256 * (n_req + n_neg)  # >= sum |P8|
        else:
            s = s32.to(tl.int64)
            if CAUSAL:
                bij = tl.where(cols[None, :].to(tl.int64) > lim[:, None], _MASK_BIAS, 0)
            else:
                bij = tl.zeros([BM, BN], dtype=tl.int64)
            raw = s + bij
            w = _w32(raw)
            c_wrap += tl.sum((real[None, :] & (w != raw)).to(tl.int64), axis=1)
            vis = real[None, :] & (bij > _MASK_BIAS)
            seen = seen | tl.max(vis.to(tl.int64), axis=1)
            vmax = tl.maximum(vmax, tl.max(tl.where(vis, w, _LOW), axis=1))
            w = tl.where(real[None, :], w, _MASK_BIAS)  # the CPU's padding of the last tile
            mx = tl.maximum(mrow, tl.max(tl.where(inb[None, :], w, _LOW), axis=1))
            raw = w - mx[:, None]
            x = _w32(raw)
            c_wrap += tl.sum((inb[None, :] & (x != raw)).to(tl.int64), axis=1)
            y, ovf, wr = _shexp(x, R, eM, DIVISION)
            c_ovf += tl.sum(tl.where(inb[None, :], ovf, 0), axis=1)
            c_wrap += tl.sum(tl.where(inb[None, :], wr, 0), axis=1)
            # requantisation (qflash_device._requant)
            t1 = y * rM
            a1 = _w32(t1)
            wr = (a1 != t1).to(tl.int64)
            t1 = a1 + _HALF_EXP
            b1 = _w32(t1)
            wr += (b1 != t1).to(tl.int64)
            c1 = b1 >> _SHIFT_EXP
            pv = c1.to(tl.int8)
            rw = (pv.to(tl.int64) != c1).to(tl.int64)
            c_neg += tl.sum((inb[None, :] & (pv < 0) & (rw == 0)).to(tl.int64), axis=1)
            c_req += tl.sum(tl.where(inb[None, :], rw, 0), axis=1)
            c_wrap += tl.sum(tl.where(inb[None, :], wr, 0), axis=1)
            rowsum = tl.sum(tl.where(inb[None, :], pv.to(tl.int64), 0), axis=1)  # padding in
            pv = tl.where(real[None, :], pv, 0).to(tl.int8)  # P8 v8 of real keys only
            pabs = zero
            raw1 = mrow - mx
            x1 = _w32(raw1)
            alpha, ovf1, wr1 = _shexp(x1, R, eM, DIVISION)
        c_wrap += (x1 != raw1).to(tl.int64)
        c_ovf += ovf1
        c_wrap += wr1
        if t > 0:
            c_neg += (alpha < 0).to(tl.int64)
            c_resc += (mx != mrow).to(tl.int64)
        lsum, wr1 = _carry(lsum, alpha, lM, rowsum, f, ACCUMULATE)
        c_wrap += wr1 + f_wrap
        v = kv_tile(V8, b, Lk, DV, cols, real, offs_v)
        tile = tl.dot(pv, v, out_dtype=tl.int32)
        if ACCUMULATE:
            acc, wr2, accb = _acc_checked(acc, alpha, aM, tile, f, ACCUMULATE)
            c_wrap += wr2
        else:
            if fast:  # int32 x int32 -> int64 products (|alpha aM| < 2**31 checked above)
                mm32 = mm.to(tl.int32).to(tl.int64)
                t2 = (acc.to(tl.int64) * mm32[:, None] + _HALF_RELEASE) >> _SHIFT_RELEASE
                acc = t2.to(tl.int32) + tile
                accb = nbp - 16384 * bk + 128 * pabs  # the bound, with the tile's sum |P8|
            else:
                acc, wr2, accb = _acc_checked(acc, alpha, aM, tile, f, ACCUMULATE)
                c_wrap += wr2
        mrow = mx

    fl = lsum.to(tl.float32)
    ov = tl.math.div_rn(acc.to(tl.float32), fl[:, None])
    big = ov >= 2147483648.0
    small = ov < -2147483648.0
    bad = (ov != ov) | big | small
    o = tl.where(bad, 0.0, ov).to(tl.int64)
    o = tl.where(big, 2147483647, tl.where(small, -2147483648, o))
    o8 = o.to(tl.int8).to(tl.int64)
    sv = tl.load(SV + b)
    res = (o8.to(tl.float64) * sv).to(tl.float32)
    ob = b.to(tl.int64) * Lq * DV
    tl.store(OUT + ob + offs_m[:, None].to(tl.int64) * DV + offs_v[None, :], res,
             mask=rok[:, None] & (offs_v[None, :] < DV))
    cp = CNT + (b.to(tl.int64) * Lq + offs_m) * 9
    tl.store(cp + 0, zero + nk, mask=rok)
    tl.store(cp + 1, c_resc, mask=rok)
    tl.store(cp + 2, c_ovf, mask=rok)
    tl.store(cp + 3, c_req, mask=rok)
    tl.store(cp + 4, c_wrap, mask=rok)
    dvok = offs_v[None, :] < DV
    tl.store(cp + 5, tl.sum((dvok & (o8 != o)).to(tl.int64), axis=1), mask=rok)
    tl.store(cp + 6, (lsum == 0).to(tl.int64), mask=rok)
    tl.store(cp + 7, c_neg, mask=rok)
    tl.store(cp + 8, ((seen > 0) & (vmax < m_init)).to(tl.int64), mask=rok)


def qflash_rows(q8, k8, v8, const, sv, *, causal: bool, block_k: int, m_init: int,
                division: bool, accumulate: bool, fast: bool = True):
    """Run the kernel.

    Args:
        q8: int8 ``(B, Lq, d)``; k8, v8: int8 ``(B, Lk, d)``, ``(B, Lk, dv)`` (one per query
            entry); const: int64 ``(B, 5)`` (R, exp_M, req_M, l_M, acc_M); sv: float64
            ``(B,)``; contiguous, on one device.
        causal, block_k, m_init, division, accumulate: the scheme's options.
        fast: let tiles that provably wrap nowhere skip the wrap tests (the same results;
            False runs every tile through the checked steps, for tests).

    Returns:
        ``(out float32 (B, Lq, dv), counters int64 (B, Lq, 9))`` (the ``_C_*`` columns).
    """
    import torch

    B, Lq, d = q8.shape
    Lk, dv = k8.shape[1], v8.shape[2]
    out = torch.empty((B, Lq, dv), dtype=torch.float32, device=q8.device)
    cnt = torch.zeros((B, Lq, 9), dtype=torch.int64, device=q8.device)
    if B == 0 or Lq == 0:
        return out, cnt
    bm = 64
    nk = -(-Lk // block_k)
    with device_guard(q8):
        _qflash_kernel[(triton.cdiv(Lq, bm), B)](
            q8, k8, v8, const, sv, out, cnt, Lq, Lk, d, dv, Lk - Lq, block_k, nk, m_init,
            int(ACC_LIMIT), int(bool(fast)), CAUSAL=bool(causal), DIVISION=bool(division),
            ACCUMULATE=bool(accumulate), BM=bm, BN=pow2(block_k, 32), BD=pow2(d, 32),
            BDV=pow2(dv, 16), num_warps=4, num_stages=1, **LAUNCH_OPTS)
    return out, cnt


__all__ = ["qflash_rows"]
