"""Device path of :mod:`.hccs`'s attention scheme ``hccs``: the CPU pipeline
(:func:`.hccs._hccs_attention`) step by step in torch operations on the tensors' device,
bit-identical to the CPU path with equal statistics (docs/design.md "Row-wise schemes on the
device").

Per row chunk (:func:`~.device_rows.chunks`; memory O(chunk x Lk), never an ``L x L`` plane
per head on the device): the exact int8 scores ``S = q8 k8^T`` (float64 GEMM of integer
operands), the float64 logits ``fl64(S c) (+ mask)``, ``x8 = clamp(RNE(logit / s_x), -127,
127)`` (float64 division by a device tensor: correctly rounded), the HCCS core in int64
(:func:`hccs_rows`: the CPU's int32 arithmetic never wraps under the parameter constraints,
so int64 gives the same integers; ``floor(log2 Z)`` by integer comparisons), the exact ``P
v8`` and the dequantisation (float64 product or quotient, one rounding to float32).  Every
step is an integer operation or one IEEE float64 basic operation: bit-identical by
construction.

Given parameters (``params=``) run entirely on the device.  The per-call calibration
(``params=None``) takes each (sequence, head)'s logit scale from the maxima of ``|logit|``
computed on the device (one float64 per row read back; a max is order-free), then runs the
CPU's grid search on the host (:func:`._hccs_search.calibrate_span`, the CPU's own code) on
the rows' code histograms, counted on the device (:func:`code_histograms`: integers, exact in
any order) and read back once (``B Lq x 255`` int16, 8 MiB per head at L = 16384); everything
the calibration computes in floating point reads the histograms, not the logits, in the same
order on both paths.  The final pass recomputes the int8 logits on the device.
"""

from __future__ import annotations

import numpy as np

from ._hccs_search import DELTA_BINS, calibrate_span, scales_from_amax
from ._int8 import check_positive_scale, unnormalized
from .device_rows import DeviceProblem, chunks, quantize_problem
from .hccs import (
    _C_CLIP,
    _C_EMPTY,
    _C_RHO,
    _C_SAT,
    CLB_T_DEFAULT,
    HCCS_NORM_TOL,
    I8_T,
    INT16_MAX,
    INV_SHIFT,
    U8_MAX,
    X8_MAX,
    HccsParams,
    _check_clb_t,
    _check_out_shift,
    _check_path,
    _core_stats,
    hccs_options,
)

_I16_T = INT16_MAX  # i16_div's T = 32767
_LOG2_BITS = 32  # Z < 2**31: floor(log2 Z) from 31 comparisons


def hccs_rows(x8, vis, b, sl, dm, code: int, osh: int, ct: int, counts):
    """The HCCS core (``hccs._hccs_rows``) of int64 logits ``x8 (n, L)`` with per-row int64
    parameters ``b``, ``sl``, ``dm`` ``(n,)``: int64 outputs ``(n, L)`` (0 where masked and in
    rows without a visible key); adds the counters to ``counts`` (device int64 ``(4,)``)."""
    import torch

    n, L = x8.shape
    dev = x8.device
    if vis is None:
        vis = torch.ones((n, L), dtype=torch.bool, device=dev)
    empty = ~vis.any(dim=1)
    live = vis & ~empty[:, None]
    m = torch.where(vis, x8, -129).amax(dim=1)
    d = m[:, None] - x8
    dmc = dm[:, None]
    clip = live & (d > dmc)
    s = torch.where(live, b[:, None] - sl[:, None] * torch.minimum(d, dmc), 0)
    z = torch.where(empty, 1, s.sum(dim=1))
    if code == 0:
        p = s * torch.div(torch.full_like(z, _I16_T), z, rounding_mode="floor")[:, None]
    elif code == 1:
        rho = torch.div(torch.full_like(z, I8_T << INV_SHIFT), z, rounding_mode="floor")
        counts[_C_RHO] += ((rho > INT16_MAX) & ~empty).sum()
        p = (s * rho[:, None]) >> (INV_SHIFT + osh)
    else:
        k = sum((z >= (1 << i)).to(torch.int64) for i in range(1, _LOG2_BITS))
        p = (s * ct) >> k[:, None]
        counts[_C_SAT] += (live & (p > U8_MAX)).sum()
        p = torch.clamp(p, max=U8_MAX)
    counts[_C_EMPTY] += empty.sum()
    counts[_C_CLIP] += clip.sum()
    return torch.where(live, p, 0)


def _x8(dp: DeviceProblem, qz, g0, g1, r0, r1, c_ent, xs_ent):
    """The chunk's float64 logits ``(n, L)``, their int8 codes (float64, clamped), the codes
    before the clamp, and the visibility ``(n, L)`` (None: every key)."""
    import torch

    rows = r1 - r0
    n = (g1 - g0) * rows
    rm = dp.rows(g0, g1, r0, r1)
    lg = qz.scores(g0, g1, r0, r1) * c_ent[g0:g1, None, None]
    if rm.add is not None:
        lg = lg + rm.add.double()
    lg = lg.reshape(n, dp.Lk)
    t = (lg / xs_ent[g0:g1].repeat_interleave(rows)[:, None]).round()
    return lg, torch.clamp(t, -X8_MAX, X8_MAX), t, rm.visible(dp.Lk, dp.causal)


def code_histograms(x8, vis):
    """int16 ``(n, 255)``: how many visible entries of each row of the chunk's int8 codes ``x8``
    (float64 ``(n, L)``) have each code (column ``code + 127``; ``vis`` ``(n, L)`` or None:
    every entry), ``_hccs_search.code_histograms`` on the device (counts are exact in any
    order; ``Lk <= 32767`` keeps them in int16)."""
    import torch

    n = x8.shape[0]
    idx = x8.to(torch.int64) + X8_MAX
    idx += torch.arange(0, n * DELTA_BINS, DELTA_BINS, device=x8.device)[:, None]
    idx = idx.reshape(-1) if vis is None else idx[vis]
    return torch.bincount(idx, minlength=n * DELTA_BINS).view(n, DELTA_BINS).to(torch.int16)


def _spans(group: np.ndarray) -> list:
    bounds = np.flatnonzero(np.diff(group)) + 1
    return list(zip(np.r_[0, bounds].tolist(), np.r_[bounds, len(group)].tolist(),
                    strict=True))


def _calibrate(dp: DeviceProblem, qz, c_ent, spans, H: int, scope: str):
    """``(fitted params per span, x_scale per entry)`` of the per-call calibration (the module
    docstring says what runs where)."""
    import torch

    B, Lq, Lk, dev = dp.B, dp.Lq, dp.Lk, dp.device
    ones = torch.ones(B, dtype=torch.float64, device=dev)
    amax = torch.zeros((B, Lq), dtype=torch.float64, device=dev)
    seen = torch.ones((B, Lq), dtype=torch.bool, device=dev)
    for g0, g1, r0, r1 in chunks(dp):
        lg, _, _, vis = _x8(dp, qz, g0, g1, r0, r1, c_ent, ones)
        a = lg.abs() if vis is None else torch.where(vis, lg.abs(), 0.0)
        amax[g0:g1, r0:r1] = a.amax(dim=1).reshape(g1 - g0, r1 - r0)
        if vis is not None:
            seen[g0:g1, r0:r1] = vis.any(dim=1).reshape(g1 - g0, r1 - r0)
    if scope == "visible":
        seen &= dp.taking_part()[0]
    seen_h = seen.reshape(-1).cpu().numpy()
    s_x = scales_from_amax(amax.reshape(-1).cpu().numpy(), seen_h, spans, H, Lq)
    span = np.repeat(np.arange(len(spans)), [e1 - e0 for e0, e1 in spans])
    xs_h = s_x[span, np.arange(B) % H]
    xs_ent = torch.from_numpy(xs_h).to(dev)
    hist = torch.empty((B, Lq, DELTA_BINS), dtype=torch.int16, device=dev)
    for g0, g1, r0, r1 in chunks(dp):
        _, x8, _, vis = _x8(dp, qz, g0, g1, r0, r1, c_ent, xs_ent)
        hist[g0:g1, r0:r1] = code_histograms(x8, vis).view(g1 - g0, r1 - r0, DELTA_BINS)
    hist_h = hist.view(B * Lq, DELTA_BINS).cpu().numpy()
    fitted = [HccsParams(**calibrate_span(hist_h, seen_h, s_x[i], e0, e1, H, Lq, Lk, scope))
              for i, (e0, e1) in enumerate(spans)]
    return fitted, xs_h


def hccs(dp: DeviceProblem, return_stats: bool, params=None, path: str = "i16_div",
         out_shift: int = 0, clb_T: int = CLB_T_DEFAULT, dequant: str = "scale",
         scale_scope: str = "visible"):
    """Scheme ``hccs`` on the device (``hccs._hccs_attention``'s options, checks, messages,
    parameters and statistics; the module docstring says where the calibration runs)."""
    import torch

    params, scope, unit, H = hccs_options(dp.lead, dp.Lk, params, path, out_shift, clb_T,
                                          dequant, scale_scope)
    B, Lq, Lk, dev = dp.B, dp.Lq, dp.Lk, dp.device
    check_positive_scale(dp.scale, "hccs", "its int8 logits x = S * c / x_scale clip at the "
                         "row max")
    qz = quantize_problem(dp, "per_tensor", 128, scope)
    c_h = (qz.sq_row[:, 0].cpu().numpy().astype(np.float64)
           * qz.sk.cpu().numpy().astype(np.float64) * dp.scale)
    c_ent = torch.from_numpy(c_h).to(dev)
    group = dp.sequences().cpu().numpy() if scope == "visible" else np.zeros(B, np.int64)
    spans = _spans(group)
    if params is None:
        fitted, xs_h = _calibrate(dp, qz, c_ent, spans, H, scope)
    else:
        fitted = [params] * len(spans)
        xs_h = np.broadcast_to(params.x_scale, (H,))[np.arange(B) % H]
    ent_p = {n: np.empty(B, dtype=np.int64) for n in ("B", "S", "Dmax")}
    for (e0, e1), pg in zip(spans, fitted, strict=True):
        for n in ent_p:
            ent_p[n][e0:e1] = np.broadcast_to(getattr(pg, n), (H,))[np.arange(e0, e1) % H]
    pb, ps, pd = (torch.from_numpy(ent_p[n]).to(dev) for n in ("B", "S", "Dmax"))
    xs_ent = torch.from_numpy(np.ascontiguousarray(xs_h, dtype=np.float64)).to(dev)
    code, osh, ct = _check_path(path), _check_out_shift(out_shift, path), _check_clb_t(clb_T)
    counts = torch.zeros(4, dtype=torch.int64, device=dev)
    sat = torch.zeros((), dtype=torch.int64, device=dev)
    out = torch.empty((B, Lq, dp.dv), dtype=torch.float32, device=dev)
    rowsum = torch.zeros((B, Lq), dtype=torch.float64, device=dev)
    seen = torch.ones((B, Lq), dtype=torch.bool, device=dev)
    sv = qz.sv.double()
    for g0, g1, r0, r1 in chunks(dp):
        gh, rows = g1 - g0, r1 - r0
        _, x8, t, vis = _x8(dp, qz, g0, g1, r0, r1, c_ent, xs_ent)
        off = x8 != t
        sat += (off if vis is None else off & vis).sum()
        ent = torch.arange(g0, g1, device=dev).repeat_interleave(rows)
        P = hccs_rows(x8.to(torch.int64), vis, pb[ent], ps[ent], pd[ent], code, osh, ct,
                      counts).double()
        rs = P.sum(dim=1).reshape(gh, rows)
        rowsum[g0:g1, r0:r1] = rs
        if vis is not None:
            seen[g0:g1, r0:r1] = vis.any(dim=1).reshape(gh, rows)
        O = torch.matmul(P.reshape(gh, rows, Lk), qz.v8(g0, g1))
        if dequant == "scale":
            o = O * (sv[g0:g1] * unit)[:, None, None]
        else:
            o = (O * sv[g0:g1, None, None]) / rs[..., None]
        out[g0:g1, r0:r1] = o.to(torch.float32)
    if not return_stats:
        return out, None
    st = _core_stats(counts.cpu().numpy(), B * Lq)
    st.logit_saturated = int(sat)
    st.params = [pg.to_dict() for pg in fitted] if len(spans) > 1 else [fitted[0].to_dict()]
    if dequant == "scale":
        rs_h = rowsum.cpu().numpy()
        seen_h = seen.cpu().numpy() if (dp.mask is not None or dp.causal) else rs_h > 0
        st.unnormalized_rows = unnormalized(rs_h, 1.0 / unit, seen_h, HCCS_NORM_TOL)
    return out, st


__all__ = ["hccs", "hccs_rows"]
