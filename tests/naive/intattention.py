"""Slow, obviously-correct references for the IntAttention family (specs/attention.md section 3).

Written independently of ``lowprec.kernels.intattention``: Python integers, ``fractions`` for
exact quotients, numpy float32 *scalars* for the float32 steps the spec pins (each such operation
is one IEEE float32 operation), explicit loops.  Only for small inputs.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

F32 = np.float32


def lut(bits: int, c: float) -> list[int]:
    """``LUT[i] = RNE(255 exp(-c i / (2**bits - 1)))``, ``LUT[0] = 255``, ``LUT[last] = 0``."""
    nb = 2**bits - 1
    t = [round(255 * math.exp(-c * i / nb)) for i in range(nb + 1)]  # round(): half to even
    t[0] = 255
    t[nb] = 0
    return t


def deploy_mult(T: int, bits: int) -> int:
    """``int(fp32(nb * 2**26) / fp32(T) + 0.5f)`` with float32 scalar arithmetic."""
    nb = 2**bits - 1
    q = F32(nb * 2**26) / F32(T)
    return int(q + F32(0.5))


def softmax_row(row, c_int: int, bits: int = 5, rounding: str = "floor", visible=None,
                c: float = 6.6, deploy: bool = False, tail_from: int | None = None,
                pmax: int = 255) -> list[int]:
    """IndexSoftmax of one row of Python ints (attention.md 3 steps 1-4, or the deploy kernel).

    ``visible``: list of bools (None: all); ``tail_from``: first column of the NEON scalar tail
    (deploy only; None: no tail).
    """
    L = len(row)
    vis = [True] * L if visible is None else list(visible)
    if not any(vis):
        return [0] * L
    table = lut(bits, c)
    nb = 2**bits - 1
    m = max(int(x) for x, v in zip(row, vis, strict=True) if v)
    tail = L if tail_from is None else tail_from
    idx = []
    for j, (x, v) in enumerate(zip(row, vis, strict=True)):
        if not v:
            idx.append(None)
            continue
        dp = min(m - int(x), c_int)
        if deploy:
            prod = dp * deploy_mult(c_int, bits)
            i = (prod + 2**25) >> 26 if j < tail else prod >> 26
        elif rounding == "floor":
            i = int(F32(nb * dp) / F32(c_int))
            i = min(i, nb)
        else:
            i = round(Fraction(nb * dp, c_int))  # Fraction rounds half to even
        idx.append(i)
    E = [0 if i is None else table[i] for i in idx]
    Z = sum(E)
    if not deploy:
        zf = F32(Z)
        return [round(float(F32(e * pmax) / zf)) for e in E]
    z16 = Z % 65536
    if z16 == 255:
        return E
    if z16 == 0:
        ns = 255  # fcvtzu(inf) saturates to 0xFFFFFFFF; the byte store keeps 0xFF
    else:
        ns = int(F32(65280) / F32(z16) + F32(0.5)) % 256
    return [(e * ns + 128) >> 8 if j < tail else (e * ns) >> 8 for j, e in enumerate(E)]


def index_softmax(s: np.ndarray, c_int, bits=5, rounding="floor", mask=None, c=6.6,
                  deploy=False, neon_tail=False, pmax=255) -> np.ndarray:
    """Row-by-row :func:`softmax_row` over ``s (..., L)``; ``c_int`` int or per-row array,
    ``mask`` bool broadcastable (True = visible).  Returns int64 of ``s.shape``."""
    s = np.asarray(s)
    L = s.shape[-1]
    rows = s.reshape(-1, L)
    cs = np.broadcast_to(np.asarray(c_int), s.shape[:-1]).reshape(-1)
    ms = None if mask is None else np.broadcast_to(mask, s.shape).reshape(-1, L)
    tail = (L // 16) * 16 if neon_tail else None
    out = np.zeros(rows.shape, dtype=np.int64)
    for r in range(rows.shape[0]):
        out[r] = softmax_row([int(x) for x in rows[r]], int(cs[r]), bits, rounding,
                             None if ms is None else [bool(b) for b in ms[r]], c, deploy, tail,
                             pmax)
    return out.reshape(s.shape)


def float_softmax_row(x, bits=5, c=6.6, rounding="floor") -> list[float]:
    """LUT softmax of float32 scores (the ``index_softmax`` surrogate), float32 scalar steps."""
    xs = [F32(v) for v in x]
    fin = [v for v in xs if v != -np.inf]
    if not fin or any(np.isnan(v) or v == np.inf for v in xs):
        return [float("nan")] * len(xs)
    m = max(fin)
    nb = 2**bits - 1
    table = lut(bits, c)
    cf = F32(c)
    E = []
    for v in xs:
        if v == -np.inf:
            E.append(None)
            continue
        d = min(F32(m - v), cf)
        q = F32(d * F32(nb)) / cf
        i = int(q) if rounding == "floor" else int(np.rint(q))
        E.append(table[min(i, nb)])
    zf = F32(sum(e for e in E if e is not None))
    return [0.0 if e is None else float(F32(F32(e) / zf)) for e in E]


def int8_scale(values) -> np.float32:
    """``s = fp32(max|x| / 127)`` (1.0 for an all-zero group)."""
    amax = max((abs(float(v)) for v in values), default=0.0)
    return F32(1.0) if amax == 0.0 else F32(F32(amax) / F32(127))


def int8_code(x, s) -> int:
    """``clamp(RNE(x / s), -127, 127)`` with the exact quotient."""
    return max(-127, min(127, round(Fraction(float(x)) / Fraction(float(s)))))


def quantize_groups(x: np.ndarray, granularity: str, block: int = 128, is_q: bool = False):
    """int8 codes (Python-int array) and per-(head, row) float32 scales of ``x (B, L, d)``."""
    B, L, _ = x.shape
    scales = np.zeros((B, L), dtype=np.float32)
    if granularity == "per_tensor":
        scales[:] = int8_scale(x.reshape(-1))
    elif granularity == "per_channel" or not is_q:
        for b in range(B):
            scales[b] = int8_scale(x[b].reshape(-1))
    else:
        for b in range(B):
            for r0 in range(0, L, block):
                scales[b, r0:r0 + block] = int8_scale(x[b, r0:r0 + block].reshape(-1))
    codes = np.zeros(x.shape, dtype=np.int64)
    for b in range(B):
        for i in range(L):
            for t in range(x.shape[2]):
                codes[b, i, t] = int8_code(x[b, i, t], scales[b, i])
    return codes, scales


def visible(Lq: int, Lk: int, causal: bool, mask_plane) -> np.ndarray:
    """Boolean (Lq, Lk) visibility (causal bottom-right, -inf mask entries masked)."""
    vis = np.ones((Lq, Lk), dtype=bool)
    if causal:
        for i in range(Lq):
            for j in range(Lk):
                vis[i, j] = j <= i + (Lk - Lq)
    if mask_plane is not None:
        vis &= mask_plane != -np.inf
    return vis


def intattention(q, k, v, scale=None, causal=False, mask=None, bits=5, c=6.6,
                 rounding="floor", granularity="per_tensor", block=128, deploy=False,
                 neon_tail=False, pmax=255) -> np.ndarray:
    """The ``intattention`` float pipeline on float32 ``q (B, Lq, d)``, ``k``, ``v`` with an
    optional additive float32 mask ``(B, Lq, Lk)``; float32 ``(B, Lq, dv)``."""
    B, Lq, d = q.shape
    Lk = k.shape[1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    q8, sq = quantize_groups(q, granularity, block, is_q=True)
    k8, sk = quantize_groups(k, granularity)
    v8, sv = quantize_groups(v, granularity)
    out = np.zeros((B, Lq, v.shape[2]), dtype=np.float32)
    lim = 2**30 - 1
    for b in range(B):
        plane = None if mask is None else mask[b]
        vis = visible(Lq, Lk, causal, plane)
        for i in range(Lq):
            alpha = float(sq[b, i]) * float(sk[b, 0]) * scale
            x = c / alpha
            cint = math.floor(x + 0.5) if deploy else round(x)
            row = []
            for j in range(Lk):
                sij = sum(int(q8[b, i, t]) * int(k8[b, j, t]) for t in range(d))
                if plane is not None and vis[i, j] and plane[i, j] != 0:
                    bias = round(float(plane[i, j]) / alpha)
                    sij = max(-lim, min(lim, sij + bias))
                row.append(sij)
            tail = (Lk // 16) * 16 if neon_tail else None
            P = softmax_row(row, cint, bits, rounding, list(vis[i]), c, deploy, tail, pmax)
            if not vis[i].any():
                out[b, i] = np.nan
                continue
            for t in range(v.shape[2]):
                acc = sum(P[j] * int(v8[b, j, t]) for j in range(Lk))
                out[b, i, t] = F32((acc * float(sv[b, 0])) / pmax)
    return out


def attention64(q, k, v, scale=None, causal=False, mask=None) -> np.ndarray:
    """Float64 softmax attention (loops over rows), NaN for rows without a visible key."""
    B, Lq, d = q.shape
    Lk = k.shape[1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    out = np.zeros((B, Lq, v.shape[2]))
    for b in range(B):
        plane = None if mask is None else mask[b]
        vis = visible(Lq, Lk, causal, plane)
        s = q[b].astype(np.float64) @ k[b].astype(np.float64).T * scale
        if plane is not None:
            s = s + np.where(vis, plane, 0.0)
        for i in range(Lq):
            if not vis[i].any():
                out[b, i] = np.nan
                continue
            row = np.where(vis[i], s[i], -np.inf)
            e = np.exp(row - row.max())
            out[b, i] = (e / e.sum()) @ v[b].astype(np.float64)
    return out
