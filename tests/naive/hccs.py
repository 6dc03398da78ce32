"""Slow, obviously-correct references of HCCS (specs/attention.md section 5; seed hccs.txt,
Algorithm 1 and eq. 6-9), written independently of lowprec.kernels.hccs: Python ints, one row
and one element at a time.
"""

from __future__ import annotations

import math

import numpy as np


def hccs_row_ref(x, B, S, Dmax, path="i16_div", out_shift=0, T=255, vis=None):
    """One row: list of Python ints (0 for masked entries)."""
    x = [int(v) for v in x]
    n = len(x)
    vis = [True] * n if vis is None else [bool(v) for v in vis]
    idx = [j for j in range(n) if vis[j]]
    if not idx:
        return [0] * n
    m = max(x[j] for j in idx)
    s = {}
    for j in idx:
        delta = min(m - x[j], Dmax)
        s[j] = B - S * delta
    Z = sum(s.values())
    out = [0] * n
    for j in idx:
        if path == "i16_div":
            out[j] = s[j] * (32767 // Z)
        elif path == "i8_div":
            rho = (255 * 2**15) // Z
            out[j] = (s[j] * rho) // 2 ** (15 + out_shift)
        elif path == "i8_clb":
            k = Z.bit_length() - 1  # floor(log2 Z)
            out[j] = min((s[j] * T) // 2**k, 255)
        else:
            raise ValueError(path)
    return out


def hccs_ref(x8, B, S, Dmax, path="i16_div", out_shift=0, clb_T=255, mask=None):
    """HCCS over rows along the last axis; parameters broadcast against x8.shape[:-1]."""
    x8 = np.asarray(x8)
    n = x8.shape[-1]
    lead = x8.shape[:-1]
    rows = x8.reshape(-1, n)
    Bs, Ss, Ds = (np.broadcast_to(np.asarray(v), lead).reshape(-1) for v in (B, S, Dmax))
    vis = None if mask is None else np.broadcast_to(mask, x8.shape).reshape(-1, n)
    out = np.zeros(rows.shape, dtype=np.int64)
    for r in range(rows.shape[0]):
        out[r] = hccs_row_ref(rows[r], int(Bs[r]), int(Ss[r]), int(Ds[r]), path, out_shift,
                              clb_T, None if vis is None else vis[r])
    return out.reshape(x8.shape)


def softmax64(vals, vis):
    """Row softmax in float64 of the visible entries (0 elsewhere)."""
    out = np.zeros(vals.shape)
    for r in range(vals.shape[0]):
        idx = [j for j in range(vals.shape[1]) if vis[r, j]]
        if not idx:
            continue
        m = max(vals[r, j] for j in idx)
        e = {j: math.exp(vals[r, j] - m) for j in idx}
        z = sum(e.values())
        for j in idx:
            out[r, j] = e[j] / z
    return out


def quantize_logits_ref(rows, s_x):
    """int8 logits clamp(RNE(rows / s_x), -127, 127); -inf entries masked."""
    vis = np.isfinite(rows)
    x8 = np.zeros(rows.shape, dtype=np.int64)
    for idx in zip(*np.nonzero(vis), strict=True):
        x8[idx] = min(max(round(float(rows[idx]) / s_x), -127), 127)
    return x8, vis


def mean_kl_ref(rows, s_x, B, S, Dmax):
    """Mean over rows (with a visible entry) of KL(softmax(x8 s_x) || p_i16 / sum p_i16)."""
    x8, vis = quantize_logits_ref(rows, s_x)
    q = softmax64(x8 * s_x, vis)
    kls = []
    for r in range(rows.shape[0]):
        if not vis[r].any():
            continue
        p = hccs_row_ref(x8[r], B, S, Dmax, "i16_div", vis=vis[r])
        tot = sum(p)
        kl = 0.0
        for j in range(rows.shape[1]):
            if vis[r, j] and q[r, j] > 0:
                kl += q[r, j] * math.log(q[r, j] / (p[j] / tot))
        kls.append(kl)
    return sum(kls) / len(kls)
