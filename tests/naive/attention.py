"""Slow, obviously-correct twins of the tiled attention engine and a float64 attention oracle.

Written from the text of specs/attention.md sections 0-2 and docs/design.md ("Exact float32
semantics of the tiled schemes"); it shares no code with ``lowprec/kernels/online.py`` and
evaluates several steps differently on purpose.  Tiles are Python loops, every float32 operation
is a NumPy float32 ufunc (one correctly rounded operation, never fused), sums run sequentially in
the pinned order, visibility comes from a dense ``(Lq, Lk)`` mask, and the exp2 "in format" is
the explicit chain of BAPS appendix A.1 (Algorithm 2) evaluated element by element (the engine
uses a 256-entry table):

    x --round to fmt_in--> x8 --exact--> float16 --2**x in float64--> float16 (RNE)
      --round to fmt_out--> P

Format rounding goes through :func:`lowprec.formats.quantize` (exhaustively verified against a
Fraction reference and the peer libraries in the format tests); float16 and bfloat16 through
NumPy / ml_dtypes casts (RNE).  The restart test of ``e2e_hif8`` is evaluated literally: some
visible ``hif8(fl(S - m)) > tau`` (the engine uses an equivalent float32 threshold).

Public functions:

* :func:`oracle_attention` - float64 softmax attention, one row at a time, dense masks.
* :func:`dense_visibility` - boolean ``(B, Lq, Lk)`` visibility (causal bottom-right + mask).
* :func:`exp2_chain` - the explicit exp2-in-format chain.
* :func:`twin_attention` - ``flash`` and every ``baps`` configuration; returns the output, the
  per-tile flags, the restarted-row counts and every rescale factor it applied.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import ml_dtypes
import numpy as np

import lowprec as lp

F32 = np.float32
LOG2E = math.log2(math.e)  # log2(e) in float64
LOG2E_F32 = np.float32(LOG2E)  # design.md: masks are added as fl(mask * float32(log2 e))
NINF = np.float32(-np.inf)

# flags (design.md / online.py conventions): visited tiles of the FA2 flow are 0
FLAG_RESTART = 1
FLAG_PLAIN = 0
FLAG_CRITICAL = -1
FLAG_SKIPPED = -2

FA2_CONFIGS = ("default", "exp2_hif8", "exp2_e4m3", "exp2_e5m2", "exp2_e4m3xe5m2", "naive_e2e")
ALL_CONFIGS = FA2_CONFIGS + ("e2e_hif8",)
# input / output format of exp2 per configuration (specs/attention.md 2)
EXP2_FORMATS = {
    "exp2_hif8": ("hif8", "hif8"),
    "exp2_e4m3": ("e4m3", "e4m3"),
    "exp2_e5m2": ("e5m2", "e5m2"),
    "exp2_e4m3xe5m2": ("e4m3", "e5m2"),
    "naive_e2e": ("hif8", "hif8"),
    "e2e_hif8": ("hif8", "hif8"),
}


# ------------------------------------------------------------------------------------------
# masks and the float64 oracle


def additive_mask(attn_mask, B: int, Lq: int, Lk: int):
    """float32 ``(B, Lq, Lk)`` additive mask from a boolean (True = attend) or float mask
    broadcastable to that shape; None stays None."""
    if attn_mask is None:
        return None
    m = np.asarray(attn_mask)
    if m.dtype == np.bool_:
        m = np.where(m, 0.0, -np.inf)
    return np.broadcast_to(np.asarray(m, dtype=np.float32), (B, Lq, Lk))


def dense_visibility(B: int, Lq: int, Lk: int, causal: bool, mask) -> np.ndarray:
    """Boolean ``(B, Lq, Lk)``: query i sees key j (causal: ``j <= i + Lk - Lq``; mask: not
    ``-inf``)."""
    vis = np.ones((B, Lq, Lk), dtype=bool)
    if causal:
        for i in range(Lq):
            for j in range(Lk):
                if j > i + (Lk - Lq):
                    vis[:, i, j] = False
    if mask is not None:
        vis &= np.asarray(mask) != -np.inf
    return vis


def oracle_attention(q, k, v, *, scale=None, causal=False, attn_mask=None) -> np.ndarray:
    """Exact-ish float64 attention ``softmax(q k^T scale + mask) v``, one query row at a time.

    ``q (B, Lq, d)``, ``k (B, Lk, d)``, ``v (B, Lk, dv)`` (any float dtype, converted exactly
    to float64); ``attn_mask`` boolean or additive, broadcastable to ``(B, Lq, Lk)``.  A row
    with no visible key is NaN.  Returns float64 ``(B, Lq, dv)``.
    """
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    B, Lq, d = q.shape
    Lk, dv = v.shape[1], v.shape[2]
    sc = 1.0 / math.sqrt(d) if scale is None else float(scale)
    add = additive_mask(attn_mask, B, Lq, Lk)
    vis = dense_visibility(B, Lq, Lk, causal, add)
    out = np.full((B, Lq, dv), np.nan)
    for b in range(B):
        for i in range(Lq):
            js = np.flatnonzero(vis[b, i])
            if js.size == 0:
                continue
            s = np.array([float(np.dot(q[b, i], k[b, j])) * sc for j in js])
            if add is not None:
                s = s + add[b, i, js].astype(np.float64)
            e = np.exp(s - s.max())
            out[b, i] = (e[:, None] * v[b, js]).sum(axis=0) / e.sum()
    return out


def relative_error(out, ref) -> float:
    """``||out - ref||_F / ||ref||_F`` in float64 over the finite entries of ``ref``."""
    o = np.asarray(out, dtype=np.float64)
    r = np.asarray(ref, dtype=np.float64)
    keep = np.isfinite(r)
    return float(np.linalg.norm((o - r)[keep]) / np.linalg.norm(r[keep]))


# ------------------------------------------------------------------------------------------
# roundings and exp2 in format


def to_format(x, fmt: str, saturate: bool) -> np.ndarray:
    """``x`` rounded to ``fmt`` with its default rounding (HiF8 nearest_away, E4M3/E5M2
    nearest_even), float32 values."""
    return np.asarray(lp.formats.quantize(np.asarray(x), fmt, saturate=saturate),
                      dtype=np.float32)


def round_accum(x: np.ndarray, accum: str) -> np.ndarray:
    """Round float32 ``x`` to the accumulator dtype (RNE) and back to float32."""
    if accum == "float32":
        return x
    if accum == "float16":
        with np.errstate(over="ignore"):
            return x.astype(np.float16).astype(np.float32)
    if accum == "bfloat16":
        return x.astype(ml_dtypes.bfloat16).astype(np.float32)
    raise ValueError(accum)


def exp2_chain(x, fmt_in: str, fmt_out: str, *, fp16: bool = True,
               saturate_in: bool = True) -> np.ndarray:
    """``2**x`` in format, element by element (BAPS appendix A.1, Algorithm 2).

    ``x`` rounded to ``fmt_in`` (saturating if ``saturate_in``), converted exactly to float16,
    ``2**x`` computed in float64 and rounded to float16 (RNE; skipped when ``fp16=False``),
    then rounded to ``fmt_out`` (non-saturating).  Returns float32 of ``x``'s shape.
    """
    x = np.asarray(x, dtype=np.float32)
    xi = to_format(x, fmt_in, saturate_in)
    flat = xi.reshape(-1)
    res = np.empty(flat.size, dtype=np.float64)
    for n, xv in enumerate(flat):
        if np.isnan(xv):
            res[n] = np.nan
            continue
        if fp16:
            h = np.float16(xv)
            assert np.float32(h) == xv or np.isnan(xv), "format value not exact in float16"
            xd = float(h)
        else:
            xd = float(xv)
        try:
            y = 0.0 if xd == -math.inf else (math.inf if xd == math.inf else 2.0 ** xd)
        except OverflowError:  # 2**x beyond float64 (possible only without the fp16 step)
            y = math.inf
        if fp16:
            with np.errstate(over="ignore"):
                y = float(np.float16(y))  # float64 -> float16, one RNE rounding
        res[n] = y
    return to_format(res, fmt_out, False).reshape(x.shape)


def exp2_float(x: np.ndarray) -> np.ndarray:
    """float32 exp2 of ``flash`` / ``default``: ``float32(2**float64(x))``."""
    with np.errstate(over="ignore"):
        return np.exp2(np.asarray(x, dtype=np.float64)).astype(np.float32)


def pow2_exact(m_old: float, m_new: float) -> np.float32:
    """``2**(m_old - m_new)`` for integer-valued maxima: 1 when equal, 0 when ``m_old`` is
    -inf, else the float32 rounding of the exact power of two."""
    if m_old == m_new:
        return F32(1.0)
    if m_old == -math.inf:
        return F32(0.0)
    e = float(m_old) - float(m_new)
    assert e == int(e), "running max is not an integer"
    return F32(math.ldexp(1.0, int(e)))


# ------------------------------------------------------------------------------------------
# the twin


@dataclass
class TwinResult:
    """What :func:`twin_attention` computed.

    Attributes:
        out: float32 ``(B, Lq, dv)``.
        flags: int8 ``(B, nq, nk)``: 1 restarted, 0 visited (not restarted / FA2 flow),
            -1 critical, -2 skipped (fully masked).
        row_restarts: int64 ``(B,)`` restarted rows (``e2e_hif8``; 0 otherwise).
        alphas: one record per visited tile: ``(b, qtile, ktile, alpha float32 (rows,),
            m float32 (rows,) after the tile)``.
    """

    out: np.ndarray
    flags: np.ndarray
    row_restarts: np.ndarray
    alphas: list = field(default_factory=list)


def _scores(qb, kb, rows, cols, c, add_b, vis_b, pre_hif8):
    """The score tile: sequential float32 dot, ``fl(dot * c)``, ``+ fl(mask * log2e)``,
    -inf where not visible, HiF8 rounded when ``pre_hif8``."""
    d = qb.shape[1]
    acc = np.zeros((len(rows), len(cols)), dtype=np.float32)
    for kk in range(d):
        acc = acc + np.multiply.outer(qb[rows, kk], kb[cols, kk])
    s = acc * c
    if add_b is not None:
        s = s + add_b[np.ix_(rows, cols)] * LOG2E_F32
    vis = vis_b[np.ix_(rows, cols)]
    s = np.where(vis, s, NINF).astype(np.float32)
    if pre_hif8:
        s = to_format(s, "hif8", False)
    return s, vis


def _critical_tiles(critical, vis_t, nk, i_last, Lq, Lk, Bc):
    """Critical key tiles of one query tile, in visiting order (design.md)."""
    crit = []

    def add(t):
        if 0 <= t < nk and vis_t[t] and t not in crit:
            crit.append(t)

    if isinstance(critical, str):
        add(0)
        if critical == "first+last":
            vis_idx = [t for t in range(nk) if vis_t[t]]
            if vis_idx:
                add(vis_idx[-1])
        elif critical == "first+diagonal":
            key = min(Lk - 1, i_last + (Lk - Lq))
            if key >= 0:
                add(key // Bc)
        else:
            assert critical == "first", critical
    else:
        for t in critical:
            add(int(t))
    return crit


@np.errstate(invalid="ignore", over="ignore")  # inf - inf in degenerate rows, as the engine
def twin_attention(q, k, v, *, scheme: str = "baps", config: str = "default", scale=None,
                   causal: bool = False, attn_mask=None, block_q: int = 128,
                   block_k: int = 128, input_dtype: str = "bfloat16", tau: int = 1,
                   critical="first", max_round: str = "rint", granularity: str = "tile",
                   accum: str = "float32", exp2_fp16: bool = True) -> TwinResult:
    """The tiled engine, slowly: ``scheme="flash"`` or ``"baps"`` with any ``config``.

    ``q (B, Lq, d)``, ``k (B, Lk, d)``, ``v (B, Lk, dv)`` float arrays (converted to float32;
    ``baps`` then rounds them to ``input_dtype``), ``attn_mask`` boolean or additive and
    broadcastable to ``(B, Lq, Lk)``.  Options as ``lp.attention(..., scheme="baps")``.
    """
    q, k, v = (np.asarray(a, dtype=np.float32) for a in (q, k, v))
    if scheme == "flash":
        config = "default"
    elif input_dtype == "bfloat16":
        q, k, v = (a.astype(ml_dtypes.bfloat16).astype(np.float32) for a in (q, k, v))
    B, Lq, d = q.shape
    Lk, dv = v.shape[1], v.shape[2]
    sc = 1.0 / math.sqrt(d) if scale is None else float(scale)
    c = F32(sc * LOG2E)  # rounded once from float64
    add = additive_mask(attn_mask, B, Lq, Lk)
    vis_all = dense_visibility(B, Lq, Lk, causal, add)
    Br, Bc = block_q, block_k
    nq, nk = -(-Lq // Br), -(-Lk // Bc)
    e2e = config == "e2e_hif8"
    table = config not in ("default",)
    fin, fout = EXP2_FORMATS.get(config, (None, None))
    sat_in = not (e2e or config == "naive_e2e")  # design.md: exp2_F input rounding saturates

    def exp2(x):
        if not table:
            return exp2_float(x)
        return exp2_chain(x, fin, fout, fp16=exp2_fp16, saturate_in=sat_in)

    out = np.empty((B, Lq, dv), dtype=np.float32)
    flags = np.full((B, nq, nk), FLAG_SKIPPED, dtype=np.int8)
    row_restarts = np.zeros(B, dtype=np.int64)
    alphas = []
    for b in range(B):
        add_b = None if add is None else add[b]
        for qt in range(nq):
            rows = list(range(qt * Br, min(Lq, qt * Br + Br)))
            nr = len(rows)
            vis_t = [bool(vis_all[b][np.ix_(rows, list(range(t * Bc, min(Lk, t * Bc + Bc))))]
                          .any()) for t in range(nk)]
            if e2e:
                crit = _critical_tiles(critical, vis_t, nk, rows[-1], Lq, Lk, Bc)
            else:
                crit = []
            order = crit + [t for t in range(nk) if vis_t[t] and t not in crit]
            m = np.full(nr, NINF, dtype=np.float32)
            l = np.zeros(nr, dtype=np.float32)
            o = np.zeros((nr, dv), dtype=np.float32)
            for t in order:
                cols = list(range(t * Bc, min(Lk, t * Bc + Bc)))
                s, vis = _scores(q[b], k[b], rows, cols, c, add_b, vis_all[b], config ==
                                 "naive_e2e")
                rmax = np.array([s[r].max() for r in range(nr)], dtype=np.float32)
                alpha = np.ones(nr, dtype=np.float32)
                if not e2e:
                    for r in range(nr):
                        mn = max(m[r], rmax[r])
                        if mn != NINF:
                            alpha[r] = exp2(np.float32(m[r] - mn).reshape(1))[0]
                        m[r] = mn
                    flags[b, qt, t] = FLAG_PLAIN
                else:
                    is_crit = t in crit
                    if is_crit:
                        upd = [True] * nr
                    else:
                        with np.errstate(invalid="ignore"):
                            xt = to_format((s - m[:, None]).astype(np.float32), "hif8", False)
                            over = (xt > tau) & vis
                        upd = [bool(over[r].any()) for r in range(nr)]
                        restarted = any(upd)
                        if restarted and granularity == "tile":
                            upd = [True] * nr
                        flags[b, qt, t] = FLAG_RESTART if restarted else FLAG_PLAIN
                        row_restarts[b] += sum(upd)
                    if is_crit:
                        flags[b, qt, t] = FLAG_CRITICAL
                    for r in range(nr):
                        if not upd[r]:
                            continue
                        rm = rmax[r]
                        if rm != NINF:
                            rm = F32(np.rint(rm) if max_round == "rint" else np.ceil(rm))
                        mn = max(m[r], rm)
                        alpha[r] = pow2_exact(m[r], mn)
                        m[r] = mn
                # P = exp2(fl(S - m)), 0 on rows whose max is still -inf
                p = np.zeros(s.shape, dtype=np.float32)
                for r in range(nr):
                    if m[r] != NINF:
                        x = (s[r] - m[r]).astype(np.float32)
                        if e2e:
                            x = to_format(x, "hif8", False)
                        p[r] = exp2(x)
                rs = np.zeros(nr, dtype=np.float32)
                pv = np.zeros((nr, dv), dtype=np.float32)
                for jj, j in enumerate(cols):  # ascending keys, one rounding per op
                    rs = rs + p[:, jj]
                    pv = pv + p[:, jj, None] * v[b, j][None, :]
                l = round_accum((l * alpha + rs).astype(np.float32), accum)
                o = round_accum((o * alpha[:, None] + pv).astype(np.float32), accum)
                alphas.append((b, qt, t, alpha.copy(), m.copy()))
            with np.errstate(invalid="ignore", divide="ignore"):
                out[b, rows] = o / l[:, None]
    return TwinResult(out=out, flags=flags, row_restarts=row_restarts, alphas=alphas)
