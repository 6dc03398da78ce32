"""Slow, obviously correct reference of INT-FlashAttention (specs/attention.md section 6).

One query row at a time, one key at a time, with numpy float32 scalars (every operation one
correctly rounded float32 operation) and numpy's float32 -> float16 conversion (round to
nearest even) for the fp16 steps.  Written from the spec text, not from the kernel.
"""

from __future__ import annotations

import math

import numpy as np

f32 = np.float32
LOG2E = 1.4426950408889634


def f16(x) -> np.float32:
    """Round a float32 to float16 (nearest even) and back (exact)."""
    return f32(np.float16(f32(x)))


def exp2f(x) -> np.float32:
    """float32 of the float64 ``2**x``."""
    return f32(np.exp2(np.float64(x)))


def p8_of(p: np.float32) -> int:
    """``trunc(f16(f16(f16(p) * 127) + 0.5))``."""
    t = f16(f32(f16(p) * f32(127)))
    t = f16(f32(t + f32(0.5)))
    return math.trunc(float(t))


def intflash_head(q8, k8, v, s_q, s_k, s_v, scale, block_k, causal=False, variant="full",
                  mask=None, output="float16"):
    """One head: int8 ``q8 (Lq, d)``, ``k8 (Lk, d)``, ``v (Lk, dv)`` (int8 for "full", float16
    for "half"), scales ``s_q (Lq,)``, ``s_k (Lk,)``, ``s_v`` -> float16 ``(Lq, dv)``.

    ``mask``: None or a float32 additive ``(Lq, Lk)`` mask (natural-log units, -inf masked).
    ``output="float32"`` returns ``acc / l`` before the float16 rounding.
    """
    Lq, d = q8.shape
    Lk, dv = v.shape
    c = f32(f32(scale) * f32(LOG2E))  # the authors' float32 sm_scale * 1.44269504
    out = np.zeros((Lq, dv), dtype=np.dtype(output))
    for i in range(Lq):
        m, l, acc = f32(-np.inf), f32(1.0), [f32(0.0)] * dv
        for j0 in range(0, Lk, block_k):
            keys = [j for j in range(j0, min(j0 + block_k, Lk))
                    if not (causal and j > i + Lk - Lq)]
            ys = []
            for j in keys:
                dot = int(sum(int(q8[i, x]) * int(k8[j, x]) for x in range(d)))
                s = f32(f32(f32(dot) * f32(s_q[i])) * f32(s_k[j]))
                y = f32(s * c)
                if mask is not None:
                    y = f32(y + f32(f32(mask[i, j]) * f32(LOG2E)))
                ys.append(y)
            if not ys or max(ys) == -np.inf:
                continue  # no visible key of this tile: the row is untouched
            m_new = max(m, max(ys))
            ps = [exp2f(f32(y - m_new)) for y in ys]
            lt = f32(0.0)
            for p in ps:
                lt = f32(lt + p)
            if variant == "full":
                p8 = [p8_of(p) for p in ps]
                tile = []
                for cc in range(dv):
                    tot = sum(p8[n] * int(v[j, cc]) for n, j in enumerate(keys))
                    tile.append(f32(f32(f32(tot) * f32(s_v)) / f32(127)))
            else:
                tile = []
                for cc in range(dv):
                    tot = f32(0.0)
                    for n, j in enumerate(keys):
                        tot = f32(tot + f32(f16(ps[n]) * f32(v[j, cc])))
                    tile.append(tot)
            alpha = exp2f(f32(m - m_new))
            l = f32(f32(l * alpha) + lt)
            acc = [f32(f32(acc[cc] * alpha) + tile[cc]) for cc in range(dv)]
            m = m_new
        if m == -np.inf:
            out[i] = np.nan
        else:
            with np.errstate(over="ignore"):  # float16 overflow gives inf, as intended
                out[i] = [f32(acc[cc] / l) for cc in range(dv)]
    return out


def quantize_rows(x: np.ndarray, scale_dtype: str = "float32"):
    """Per-row symmetric int8 of a 2-D array: ``(codes, scales)`` (row by row, Python)."""
    codes = np.zeros(x.shape, dtype=np.int8)
    scales = np.zeros(x.shape[0], dtype=np.float32)
    for r, row in enumerate(x):
        if scale_dtype == "float16":
            row16 = [np.float16(val) for val in row]
            amax = max([abs(val) for val in row16], default=np.float16(0))
            s = np.float16(np.float16(amax) / np.float16(127))
            scales[r] = s
            if s != 0:
                codes[r] = [int(np.rint(np.float16(val / s))) for val in row16]
        else:
            amax = max([abs(float(val)) for val in row], default=0.0)
            s = f32(amax / 127)
            scales[r] = s
            if s != 0:
                codes[r] = [int(np.rint(float(val) / float(s))) for val in row]
    return codes, scales
