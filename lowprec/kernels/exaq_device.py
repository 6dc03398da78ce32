"""Device path of :mod:`.exaq`'s attention scheme ``exaq`` (every ``bits`` and ``scale_scope``):
the CPU pipeline (:func:`.exaq._exaq`) in torch operations on the tensors' device, with the
CPU's results and statistics (docs/design.md "Row-wise schemes on the device").

Pass 1 (per row chunk, on the device): the float32 scores ``fp32(fp32(fp64(q . k) scale) +
mask)`` (:func:`~.device_rows.float_scores`), with the keys a row does not see, and the rows
that do not take part (``scale_scope="visible"``), set to ``-inf`` (what the CPU's kernels
skip), the row maxima (NaN ignored, as the CPU's ``row_max``), ``xc = fp32(x - m)`` and the
terms of :func:`.exaq.exact_moments` per group: the count, the infinite count, the minimum
and the integer sums of each ``|xc|``'s significand (and of its halves' products) by binade,
from the float32 bits (``torch.bincount`` with float64 weights: every partial sum is an
integer below 2**48, exact in any order), then int64 across chunks.  One read-back of those
``groups x (3 + 1024)`` values; the group's ``(sigma, C, lo, delta)`` are the CPU's
``_exaq_params``.

Pass 2 (per row chunk, on the device): the scores again (the same GEMM, the same bits), the row
maximum (NaN ignored, as the CPU's ``row_max``), ``xc = fp32(x - m)``, the level ``q =
clamp(RNE((clamp(xc, lo, 0) - lo) / delta), 0, 2**bits - 1)`` in float64 (a division by a
device tensor: IEEE), the exponential of each level from a host table ``exp(lv[u] - lv[qmax])``
(``lv[u] = lo + u delta``, ``qmax`` the row's largest level; the table is computed with the C
library's ``exp``, the function the CPU's Numba kernels call, on at most ``16 x 16`` values per
group), the row sums left to right (:func:`lowprec.gpu.rowsum.seq_rowsum`), ``fp32(e / z)``,
0 at masked keys and NaN rows as the CPU's kernel writes them, ``exaq_merged`` per row.  A
group whose every level collapses (``lo = 0``: all visible scores equal their row's maximum)
has ``e = exp(0) = 1``; a group without a counted score (``delta`` NaN, e.g. every row that
takes part overflowed) runs its rows through the CPU's kernel on the host.  ``O = P v`` in
float64.

Exactness: the two float64 GEMMs (the scores and ``P v``) sum in cuBLAS's order on the GPU and in
BLAS's on the CPU (not pinned: :func:`~.device_rows.float_scores`); every other step is the
CPU's own code, an IEEE operation, a max, a table value or a sum in the CPU's order.  A float64
GEMM differs in its last bits between orders, which reaches a float32 score only within about
2**-29 of a rounding boundary: measured agreement in docs/design.md.
"""

from __future__ import annotations

import math

import numpy as np

from ..stats import IntAttentionStats
from ._scores import ALL_VISIBLE
from .device_rows import DeviceProblem, chunks, float_output, float_scores
from .exaq import (
    _SPLIT,
    EXAQ_BITS_DEFAULT,
    MERGE_NATS,
    N_BINS,
    _exaq_params,
    _exaq_rows,
    exaq_options,
)

_QUANT, _FLAT, _HOST = 0, 1, 2  # how a group's pass 2 runs (module docstring)


def _hidden(x, vis, rows_ok):
    """``x`` with the keys a row does not see (``vis``, None: all) and the rows not in
    ``rows_ok`` (None: all) set to ``-inf``."""
    import torch

    keep = vis
    if rows_ok is not None:
        keep = rows_ok[:, None] if keep is None else keep & rows_ok[:, None]
    return x if keep is None else torch.where(keep, x, -math.inf)


def _level_tables(params, nl: int):
    """Per group: the kind, ``lv[u] = lo + u delta`` and ``E[qmax, u] = exp(lv[u] -
    lv[qmax])`` for ``u <= qmax`` (Python floats: the same IEEE float64 operations and the C
    library's ``exp`` as the CPU's kernel)."""
    kinds, lvs, exps = [], [], []
    for _, _, lo, delta in params:
        if delta > 0.0 and math.isfinite(delta):
            lv = [lo + float(u) * delta for u in range(nl)]
            kinds.append(_QUANT)
            lvs.append(lv)
            exps.append([[math.exp(lv[u] - lv[qm]) if u <= qm else 0.0 for u in range(nl)]
                         for qm in range(nl)])  # (a row's levels never exceed its qmax)
            continue
        kinds.append(_FLAT if delta == 0.0 else _HOST)
        lvs.append([0.0] * nl)
        exps.append([[1.0] * nl for _ in range(nl)])
    return kinds, np.array(lvs), np.array(exps)


def _moments(dp: DeviceProblem, q64, group_t, part, ng: int):
    """Pass 1 (module docstring): ``(acc (ng, 3) float64, bins (ng, 4, N_BINS) int64)`` on
    the host, :func:`.exaq._exaq_accumulate`'s values for every group."""
    import torch

    dev, Lk = dp.device, dp.Lk
    cnt = torch.zeros((ng, 2), dtype=torch.int64, device=dev)  # count, infinite count
    low = torch.full((ng,), math.inf, dtype=torch.float64, device=dev)
    bins = torch.zeros((ng, 4, N_BINS), dtype=torch.int64, device=dev)
    for g0, g1, r0, r1 in chunks(dp):
        rm = dp.rows(g0, g1, r0, r1)
        x = float_scores(dp, g0, g1, r0, r1, rm, q64)
        ok = None if part is None else part[g0:g1, r0:r1].reshape(-1)
        x = _hidden(x, rm.visible(Lk, dp.causal), ok)
        m = torch.where(torch.isnan(x), -math.inf, x).amax(dim=1)
        use = torch.isfinite(m)[:, None] & (x > -math.inf)  # (False for NaN)
        xc = x - m[:, None]  # float32: fp32(x - m) (float64's difference, rounded once)
        inf = use & (xc == -math.inf)
        fin = use & ~inf
        grp = group_t[g0:g1].repeat_interleave(r1 - r0)
        cnt.index_add_(0, grp, torch.stack([use.sum(dim=1), inf.sum(dim=1)], dim=1))
        low.scatter_reduce_(0, grp, torch.where(use, xc, math.inf).amin(dim=1).double(),
                            "amin")
        y = torch.where(fin, -xc, 0.0).view(torch.int32)  # (|xc|'s bits: xc <= 0)
        e = y >> 23
        sig = (y & 0x7FFFFF) | ((e > 0).to(torch.int32) << 23)
        idx = ((e - 1).clamp(min=0).to(torch.int64) + (grp * N_BINS)[:, None]).reshape(-1)
        sig = sig.reshape(-1).to(torch.int64)
        hi, lo = sig >> _SPLIT, sig & ((1 << _SPLIT) - 1)
        for row, w in enumerate((sig, hi * hi, hi * lo, lo * lo)):
            # a chunk holds at most DEVICE_CHUNK_ELEMS = 2**24 scores (a row more only when
            # Lk > 2**24): sums below 2**48, exact in float64 in any order
            part_sum = torch.bincount(idx, weights=w.double(), minlength=ng * N_BINS)
            bins[:, row] += part_sum.to(torch.int64).reshape(ng, N_BINS)
    host = torch.cat([cnt.reshape(-1), low.view(torch.int64), bins.reshape(-1)]).cpu().numpy()
    acc = np.empty((ng, 3))
    acc[:, :2] = host[:2 * ng].reshape(ng, 2)
    acc[:, 2] = host[2 * ng:3 * ng].view(np.float64)
    return acc, host[3 * ng:].reshape(ng, 4, N_BINS)


def exaq(dp: DeviceProblem, return_stats: bool, bits: int = EXAQ_BITS_DEFAULT,
         scale_scope: str = "visible"):
    """Scheme ``exaq`` on the device (``exaq._exaq``'s options, checks and statistics; the
    module docstring gives the steps)."""
    import torch

    from ..gpu.rowsum import seq_rowsum

    b, group_t, part = exaq_options(dp, bits, scale_scope)
    B, Lk, dev = dp.B, dp.Lk, dp.device
    group = group_t.cpu().numpy()
    ng = int(group.max()) + 1 if B else 1
    q64 = dp.q.double()
    acc, bins = _moments(dp, q64, group_t, part, ng)
    params = [_exaq_params(acc[g], bins[g], b) for g in range(ng)]
    nl = 1 << b
    kinds, lvs, exps = _level_tables(params, nl)
    kind_t = torch.tensor(kinds, dtype=torch.int64, device=dev)
    lo_t = torch.tensor([p[2] for p in params], dtype=torch.float64, device=dev)
    de_t = torch.tensor([p[3] if k == _QUANT else 1.0 for p, k in zip(params, kinds,
                                                                          strict=True)],
                        dtype=torch.float64, device=dev)
    lv_t = torch.from_numpy(lvs.reshape(-1)).to(dev)
    ex_t = torch.from_numpy(exps.reshape(-1)).to(dev)

    # pass 2: quantise and normalise on the device
    out = torch.empty((B, dp.Lq, dp.dv), dtype=torch.float32, device=dev)
    empty_n = torch.zeros((), dtype=torch.int64, device=dev)
    merged_n = torch.zeros((), dtype=torch.int64, device=dev)
    for g0, g1, r0, r1 in chunks(dp):
        rows = r1 - r0
        rm = dp.rows(g0, g1, r0, r1)
        x = float_scores(dp, g0, g1, r0, r1, rm, q64)
        vis = rm.visible(Lk, dp.causal)
        if vis is None:
            vis = torch.ones(x.shape, dtype=torch.bool, device=dev)
        grp = group_t[g0:g1].repeat_interleave(rows)
        m = torch.where(vis & ~torch.isnan(x), x, -math.inf).amax(dim=1)
        bad = (m == -math.inf) | (m == math.inf)
        use = vis & (x != -math.inf)
        xc = x - m[:, None]
        nan = torch.isnan(xc) & use
        lo = lo_t[grp][:, None]
        xv = torch.minimum(torch.maximum(xc.double(), lo), torch.zeros_like(lo))
        lev = ((xv - lo) / de_t[grp][:, None]).round().clamp(0, nl - 1)
        lev = torch.where(use & ~nan, lev, -1.0).to(torch.int64)
        qmax = lev.amax(dim=1).clamp(min=0)
        base = (grp * nl)[:, None]
        e = ex_t[(base + qmax[:, None]) * nl + lev.clamp(min=0)]
        e = torch.where(nan, math.nan, torch.where(use, e, 0.0))
        z = seq_rowsum(e)
        P = torch.where(use, (e / z[:, None]).to(torch.float32), 0.0)
        P = torch.where(bad[:, None], math.nan, P)
        quant = kind_t[grp] == _QUANT
        mg = (lev >= 0) & (xc < -MERGE_NATS) & (lv_t[base + lev.clamp(min=0)]
                                                 > -0.5 * MERGE_NATS)
        mg = mg.sum(dim=1) * (quant & ~bad)
        hostk = [e for e in range(g0, g1) if kinds[group[e]] == _HOST]
        if hostk:  # rare: a group without a counted score, through the CPU's kernel
            xs = _hidden(x, vis, None)
            for e in hostk:
                rs = slice((e - g0) * rows, (e - g0 + 1) * rows)
                xe = xs[rs].cpu().numpy()
                pe = np.empty(xe.shape, dtype=np.float32)
                me = np.zeros(rows, dtype=np.int64)
                _, _, lo_e, de_e = params[group[e]]
                _exaq_rows(xe, np.full(rows, Lk - 1, np.int64), ALL_VISIBLE, False, lo_e,
                           de_e, float(nl), pe, me)
                P[rs] = torch.from_numpy(pe).to(dev)
                mg[rs] = torch.from_numpy(me).to(dev)
        empty_n += torch.isnan(P[:, 0]).sum()
        merged_n += mg.sum()
        out[g0:g1, r0:r1] = float_output(P, dp, g0, g1)
    st = None
    if return_stats:
        st = IntAttentionStats(calls=1, rows=B * dp.Lq, empty_rows=int(empty_n),
                               logits=int(acc[:, 0].sum()), exaq_merged=int(merged_n),
                               exaq_clip=[[sg, cv, lo] for sg, cv, lo, _ in params])
    return out, st


__all__ = ["exaq"]
