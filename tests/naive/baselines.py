"""Slow, obviously-correct references of the I-ViT and I-BERT integer softmax
(specs/attention.md section 7), written independently of lowprec.kernels.baselines.

Float32 order: every step is a numpy float32 *scalar* operation (numpy rounds each one
correctly to float32), in the order of the spec / the published code.  Exact order: Python
ints and fractions.Fraction.  One row at a time, one element at a time.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

F = np.float32


def _floor(v):
    return F(math.floor(float(v)))


def _rows(x, vis):
    x = np.asarray(x, dtype=np.float32)
    L = x.shape[-1]
    rows = x.reshape(-1, L)
    if vis is None:
        v = np.ones(rows.shape, dtype=bool)
    else:
        v = np.broadcast_to(np.asarray(vis, dtype=bool), x.shape).reshape(-1, L)
    v = v & (rows != -np.inf)
    return x.shape, rows, v


def _bad_row(row, vis_row):
    vals = [row[j] for j in range(len(row)) if vis_row[j]]
    return not vals or any(not (float(t) < math.inf) for t in vals)


def ivit_ref(x, s, out_bits=8, exact=False, vis=None, n=15):
    """I-ViT Shiftmax: float32 array of integer outputs, same shape as x."""
    shape, rows, V = _rows(x, vis)
    s = F(s)
    out = np.zeros(rows.shape, dtype=np.float32)
    for r in range(rows.shape[0]):
        row, vr = rows[r], V[r]
        idx = [j for j in range(len(row)) if vr[j]]
        if _bad_row(row, vr):
            out[r, :] = np.nan
            continue
        if exact:
            xs = {j: round(float(row[j]) / float(s)) for j in idx}  # float64 quotient, RNE
            m = max(xs.values())
            x0 = math.floor(Fraction(-1) / Fraction(float(s)))
            e = {}
            for j in idx:
                t = xs[j] - m
                t = t + t // 2 - t // 16
                t = max(t, n * x0)
                q = t // x0
                rr = t - x0 * q
                e[j] = max(math.floor((Fraction(rr, 2) - x0) * Fraction(2) ** (n - q)), 0)
            Z = min(sum(e.values()), 2**31 - 1)
            f = 2**31 // Z
            for j in idx:
                out[r, j] = (e[j] * f) // 2 ** (32 - out_bits)
            continue
        xs = {j: F(row[j]) / s for j in idx}
        m = max(xs.values())
        x0 = _floor(-(F(1.0) / s))
        nx0 = F(n) * x0
        e = {}
        for j in idx:
            t = xs[j] - m
            a = _floor(t / F(2.0))
            b = _floor(t / F(16.0))
            t = (t + a) - b
            t = max(t, nx0)
            q = _floor(t / x0)
            rr = t - x0 * q
            u = rr / F(2.0) - x0
            ev = _floor(u * F(2.0 ** (n - int(q))))
            e[j] = max(ev, F(0.0))
        Z = F(0.0)
        for j in idx:
            Z = Z + e[j]
        Z = min(Z, F(2.0**31))
        f = _floor(F(2.0**31) / Z)
        for j in idx:
            out[r, j] = _floor((e[j] * f) / F(2.0 ** (32 - out_bits)))
    return out.reshape(shape)


X0 = -0.6931
A = 0.35815147
B = 0.96963238 / A
C = 1.0 / A


def _multiplier(ratio):
    m, ex = math.frexp(ratio)
    mi = int(math.floor(m * 2**31 + 0.5))  # round half up
    return mi, 31 - ex


def ibert_ref(x, s, out_bits=8, exact=False, vis=None, n=30):
    """I-BERT i-exp softmax (16-bit requantisation with the range of the whole input)."""
    shape, rows, V = _rows(x, vis)
    s = F(s)
    R, L = rows.shape
    out = np.zeros(rows.shape, dtype=np.float32)
    good = [not _bad_row(rows[r], V[r]) for r in range(R)]
    zs = {}  # (r, j) -> e (float32) or (z, q) (exact)
    if exact:
        x0i = math.floor(Fraction(X0) / Fraction(float(s)))
        bi = math.floor(Fraction(B) / Fraction(float(s)))
        ci = math.floor(Fraction(C) / Fraction(float(s)) ** 2)
    else:
        inv = F(1.0) / s
        x0i = _floor(inv * F(X0))
        bi = _floor(inv * F(B))
        s2 = s * s
        ci = _floor((F(1.0) / s2) * F(C))
        nx0 = F(n) * x0i
    for r in range(R):
        if not good[r]:
            continue
        idx = [j for j in range(L) if V[r, j]]
        if exact:
            xs = {j: round(float(rows[r, j]) / float(s)) for j in idx}
            m = max(xs.values())
            for j in idx:
                t = max(xs[j] - m, n * x0i)
                q = t // x0i
                rr = t - x0i * q
                z = max(rr * (rr + bi) + ci, 0)
                zs[(r, j)] = (z, q)
        else:
            xs = {j: F(rows[r, j]) / s for j in idx}
            m = max(xs.values())
            for j in idx:
                t = max(xs[j] - m, nx0)
                q = _floor(t / x0i)
                rr = t - x0i * q
                z = rr + bi
                z = rr * z
                z = z + ci
                ev = _floor(z * F(2.0 ** (n - int(q))))
                zs[(r, j)] = max(ev, F(0.0))
    if not zs:
        out[:] = np.nan
        return out.reshape(shape)
    if exact:
        emax = max(z * 2 ** (n - q) for z, q in zs.values())
        m31, shift = _multiplier(32767 / float(emax))
    else:
        emax = max(zs.values())
        s_e = (F(A) * s2) / F(2.0**n)
        s16 = (emax * s_e) / F(32767.0)
        m31, shift = _multiplier(float(s_e) / float(s16))
    for r in range(R):
        if not good[r]:
            out[r, :] = np.nan
            continue
        idx = [j for j in range(L) if V[r, j]]
        e16 = {}
        for j in idx:
            if exact:
                z, q = zs[(r, j)]
                v = Fraction(z * m31, 2 ** (shift - (n - q))) if shift >= n - q else \
                    Fraction(z * m31 * 2 ** ((n - q) - shift))
                v = round(v)  # Fraction round: half to even
            else:
                v = round((float(zs[(r, j)]) * float(m31)) / 2.0**shift)
            e16[j] = min(max(v, -32768), 32767)
        if exact:
            Z = sum(e16.values())
            f = 2**32 // Z
            for j in idx:
                out[r, j] = (e16[j] * f) // 2 ** (32 - out_bits)
        else:
            Z = F(0.0)
            for j in idx:
                Z = Z + F(e16[j])
            f = _floor(F(2.0**32) / Z)
            for j in idx:
                out[r, j] = _floor((F(e16[j]) * f) / F(2.0 ** (32 - out_bits)))
    return out.reshape(shape)
