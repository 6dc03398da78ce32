"""Slow, obviously correct reference of QFlash (specs/attention.md section 4).

Pure Python integers: every int32 / int64 / int8 step is the exact result reduced modulo
2**bits into the signed range (two's complement wrapping), shifts are Python's ``>>`` (floor,
i.e. arithmetic) with the GPU's clamped count, one query row at a time, one key at a time.
Written from the spec text, not from the kernel.
"""

from __future__ import annotations

import numpy as np

MASK_BIAS = -(1 << 20)


def wrap(x: int, bits: int) -> int:
    """``x`` reduced into the signed ``bits``-bit range (two's complement)."""
    m = 1 << bits
    x %= m
    return x - m if x >= m // 2 else x


def i32(x: int) -> int:
    return wrap(x, 32)


def sra(a: int, n: int) -> int:
    """Arithmetic right shift; a count outside 0..31 gives the sign fill (0 or -1)."""
    if n < 0 or n > 31:
        return -1 if a < 0 else 0
    return a >> n


def c_div(a: int, b: int) -> int:
    """Integer division truncating toward zero (C semantics)."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


def shift_exp2(x: int, R: int, exp_M: int, division: bool = False):
    """``(y, overflowed)``: Algorithm 2 on one int32 ``x``; ``overflowed`` = ``x * exp_M``
    left int32 (multiply-shift form only)."""
    if division:
        q = c_div(i32(-x), R)
        ovf = False
    else:
        prod = x * exp_M
        ovf = not (-(2**31) <= prod < 2**31)
        q = i32(prod) >> 16
    r = i32(x + i32(q * R))
    return sra(i32((r >> 1) + R), q), ovf


def requant(p: int, req_M: int):
    """``(int8 result, wrapped)``."""
    t = i32(i32(p * req_M) + 2**15) >> 16
    return wrap(t, 8), not (-128 <= t <= 127)


def scale_release(x: int, alpha: int, M: int) -> int:
    t = wrap(wrap(x * alpha, 64) * M, 64)
    t = wrap(t + 2**29, 64) >> 30
    return i32(t)


def f32_to_i32(v: np.float32) -> int:
    """float32 -> int32 toward zero, saturating, NaN -> 0 (GPU conversion)."""
    if np.isnan(v):
        return 0
    if v >= 2.0**31:
        return 2**31 - 1
    if v < -(2.0**31):
        return -(2**31)
    return int(v)  # int() truncates toward zero


def qflash_head(q8, k8, v8, R, exp_M, req_M, l_M, acc_M, block_k=32, bias=None,
                m_init=MASK_BIAS, division=False, causal=False, scale_update="release"):
    """One head: int8 ``q8 (Lq, d)``, ``k8 (Lk, d)``, ``v8 (Lk, dv)`` -> ``(o8, counts)``.

    ``scale_update="accumulate"``: Scale Accumulation (the paper's eq. 13): no ScaleRelease;
    ``l`` and ``acc`` are multiplied by ``alpha`` and tile ``t``'s sums enter times ``R**t``
    (all int32, wrapping).

    ``bias``: None or an int ``(Lq, Lk)`` array.  ``counts``: dict with ``tiles``,
    ``rescales``, ``exp_overflows``, ``requant_wraps``, ``output_wraps``, ``zero_denominators``,
    ``negative_weights``.
    """
    Lq, d = q8.shape
    Lk, dv = v8.shape
    q = [[int(x) for x in row] for row in q8]
    k = [[int(x) for x in row] for row in k8]
    v = [[int(x) for x in row] for row in v8]
    counts = dict(tiles=0, rescales=0, exp_overflows=0, requant_wraps=0, output_wraps=0,
                  zero_denominators=0, negative_weights=0)
    out = np.zeros((Lq, dv), dtype=np.int8)
    for i in range(Lq):
        m, l, acc = m_init, 1, [0] * dv
        for t, j0 in enumerate(range(0, Lk, block_k)):
            f = i32(R**t)  # the accumulated scale of tile t (int32 products wrap mod 2**32)
            scores = []
            for j in range(j0, j0 + block_k):
                if j >= Lk:
                    scores.append(MASK_BIAS)  # padded key
                    continue
                sc = sum(q[i][x] * k[j][x] for x in range(d))
                if causal and j > i + Lk - Lq:
                    b = MASK_BIAS
                elif bias is not None:
                    b = int(bias[i][j])
                else:
                    b = 0
                scores.append(i32(sc + b))
            m_new = max([m] + scores)
            p8 = []
            for sc in scores:
                y, ovf = shift_exp2(i32(sc - m_new), R, exp_M, division)
                counts["exp_overflows"] += ovf
                pv, wrapped = requant(y, req_M)
                counts["negative_weights"] += pv < 0 and not wrapped
                counts["requant_wraps"] += wrapped
                p8.append(pv)
            alpha, ovf = shift_exp2(i32(m - m_new), R, exp_M, division)
            counts["exp_overflows"] += ovf
            counts["negative_weights"] += alpha < 0 and t > 0
            if scale_update == "accumulate":
                l = i32(i32(l * alpha) + i32(sum(p8) * f))
            else:
                l = i32(scale_release(l, alpha, l_M) + sum(p8))
            for c in range(dv):
                pv_sum = sum(p8[jj] * v[j0 + jj][c] for jj in range(len(p8)) if j0 + jj < Lk)
                if scale_update == "accumulate":
                    acc[c] = i32(i32(acc[c] * alpha) + i32(pv_sum * f))
                else:
                    acc[c] = i32(scale_release(acc[c], alpha, acc_M) + pv_sum)
            counts["tiles"] += 1
            if t > 0 and m_new != m:
                counts["rescales"] += 1
            m = m_new
        counts["zero_denominators"] += l == 0
        for c in range(dv):
            with np.errstate(divide="ignore", invalid="ignore"):
                quo = np.float32(acc[c]) / np.float32(l)
            o = f32_to_i32(np.float32(quo))
            counts["output_wraps"] += not (-128 <= o <= 127)
            out[i, c] = wrap(o, 8)
    return out, counts


def host_constants(s_q: float, s_k: float, s_v: float, scale: float) -> dict:
    """The host constants of spec section 4 from given scales (float64, Python round)."""
    s = scale * 1.4426950408889634 * (s_q * s_k)
    R = round(1 / s)
    return dict(s=s, R=R, exp_M=round(-s * 65536), req_M=round(127 * s * 65536),
                l_M=round(2**30 / R), acc_M=round(2**30 / R))
