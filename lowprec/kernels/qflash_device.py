"""Device path of :mod:`.qflash`'s scheme ``qflash``: the CPU pipeline (:func:`.qflash._qflash`)
and Algorithm 1 (``_qflash_rows._qflash_kernel``) in torch int64 operations on the tensors' device,
bit-identical to the CPU path with equal statistics (docs/design.md "Row-wise schemes on the
device").

Per row chunk (:func:`~.device_rows.chunks`): the exact scores ``q8 k8^T`` (float64 GEMM of
int8 codes: exact, ``d <= 131071``), the int32 bias of the float mask (``rint(mask log2(e) /
s)`` clipped, ``-2**20`` for ``-inf``; causal keys ``-2**20``), then every key tile of
``block_k`` keys for all rows of the chunk at once: the online max, ShiftExp2, requant,
ScaleRelease (or Scale Accumulation, ``scale_update="accumulate"``) and the ``l`` / ``acc``
updates as int64 tensors holding int32 values with the
CPU's two's-complement wraps (:func:`wrap32`) and arithmetic shifts (a count outside ``[0,
31]`` shifts by 63, the GPU's clamped shift), the tile's ``P8 v8`` as a float64 GEMM of
integers (exact), and every hazard counted per row and summed per entry.  The final ``trunc(
fp32(acc) / fp32(l))`` is an int64 -> float32 conversion (correctly rounded), one IEEE float32
division and the saturating conversion; ``o8 s_v`` a float64 product rounded once.  Integer
and IEEE basic operations only: bit-identical by construction.  Memory O(chunk x Lk); the
tiles run as a Python loop of torch operations per chunk (``Lk / block_k`` steps).

The host constants (:meth:`~.qflash.QFlashConstants.from_scales`) and the ``on_hazard="raise"``
checks are the CPU's own code on scales read back per entry.
"""

from __future__ import annotations

import numpy as np

from ._qflash_rows import (
    _C_EXP_OVF,
    _C_I32_WRAP,
    _C_M_INIT,
    _C_NEG_EXP,
    _C_OUT_WRAP,
    _C_REQ_WRAP,
    _C_RESCALES,
    _C_TILES,
    _C_ZERO_DEN,
    _NCOUNT,
    INT32_MAX,
    INT32_MIN,
    MASK_BIAS,
    SHIFT_EXP,
    SHIFT_RELEASE,
)
from .device_rows import (
    DeviceProblem,
    check_finite,
    chunks,
    codes,
    fused_kernels,
    int8_codes,
    row_amax,
    seen_amax,
    to_device,
)
from .problem import LOG2E
from .qflash import (
    BLOCK_K_DEFAULT,
    M_INIT_DEFAULT,
    QFlashConstants,
    QFlashStats,
    check_exp_M,
    pipeline_stats,
    qflash_options,
)

_TWO31 = 1 << 31


def wrap32(x):
    """Two's-complement int32 wrap of an int64 tensor."""
    return ((x + _TWO31) & 0xFFFFFFFF) - _TWO31


def _wrap8(x):
    return ((x + 128) & 0xFF) - 128


def _ashr(a, n):
    """``a >> n`` with the GPU's clamped count (outside ``[0, 31]``: by 63)."""
    import torch

    return a >> torch.where((n >= 0) & (n <= 31), n, 63)


def shift_exp2(x, R, exp_M, division: bool):
    """ShiftExp2 (``_qflash_rows._shexp``) of int64 tensors: ``(y, overflows, other wraps)``, the
    counts as int64 tensors of ``y``'s shape."""
    import torch

    if division:
        nx = wrap32(-x)
        wr = (nx != -x).to(torch.int64)
        q = torch.div(nx, R, rounding_mode="trunc")
        ovf = torch.zeros_like(x)
    else:
        prod = x * exp_M
        w = wrap32(prod)
        ovf = (w != prod).to(torch.int64)
        q = w >> SHIFT_EXP
        wr = torch.zeros_like(x)
    t = q * R
    qr = wrap32(t)
    wr = wr + (qr != t)
    t = x + qr
    r = wrap32(t)
    wr = wr + (r != t)
    t = (r >> 1) + R
    u = wrap32(t)
    wr = wr + (u != t)
    return _ashr(u, q), ovf, wr


def _requant(p, req_M):
    """``_qflash_rows._requant``: ``(int8 value, wrapped to int8, other wraps)``."""
    t = p * req_M
    a = wrap32(t)
    wr = (a != t).to(p.dtype)
    t = a + (1 << (SHIFT_EXP - 1))
    b = wrap32(t)
    wr = wr + (b != t)
    c = b >> SHIFT_EXP
    y = _wrap8(c)
    return y, (y != c).to(p.dtype), wr


def _release(x, alpha, M):
    """ScaleRelease (``_qflash_rows._release``): int64 products wrapping, ``(y, wrapped)``."""
    t = ((x * alpha) * M + (1 << (SHIFT_RELEASE - 1))) >> SHIFT_RELEASE
    y = wrap32(t)
    return y, (y != t).to(x.dtype)


def _carry(x, alpha, M, term, f: int, accumulate: bool):
    """``_qflash_rows._carry``: ``int32(ScaleRelease(x, alpha) + term)`` or, accumulating,
    ``int32(int32(x * alpha) + int32(term * f))``; ``(y, wraps)``."""
    if accumulate:
        t = x * alpha
        a = wrap32(t)
        wr = (a != t).to(x.dtype)
        t = term * f
        b = wrap32(t)
        wr = wr + (b != t)
    else:
        a, wr = _release(x, alpha, M)
        b = term
    raw = a + b
    y = wrap32(raw)
    return y, wr + (y != raw)


def _f32_to_i32(v):
    """float32 -> int32 toward zero, saturating, NaN -> 0 (``cvt.rzi.s32.f32``)."""
    import torch

    big = v >= 2147483648.0
    small = v < -2147483648.0
    bad = torch.isnan(v) | big | small
    o = torch.where(bad, 0.0, v).to(torch.int64)
    return torch.where(big, INT32_MAX, torch.where(small, INT32_MIN, o))


def _scales(dp: DeviceProblem, scope: str):
    """float64 host ``(B,)`` scales of q, k, v (``qflash._qflash``'s) and the groups, after
    the CPU's finiteness check of q, k, v (``_int8.check_finite_inputs``' errors, in that
    order): one pass over each tensor for its row maxima (:func:`~.device_rows.row_amax`) and
    one read-back for both."""
    import torch

    aq, ak, av = (row_amax(x) for x in (dp.q_in, dp.k_in, dp.v_in))
    top = [seen_amax(a, None) for a in (aq, ak, av)]  # per entry / stored head; NaN, Inf kept
    ent = []
    if scope == "visible":  # per query entry, over its rows and keys taking part
        if dp.all_take_part:
            ent = [top[0], top[1][dp.kv], top[2][dp.kv]]
        else:
            rows, keys = dp.taking_part()
            ent = [seen_amax(aq, rows), seen_amax(ak[dp.kv], keys),
                   seen_amax(av[dp.kv], keys)]
    host = torch.cat(top + ent).cpu().numpy()
    B, Bk = dp.B, dp.k_in.shape[0]
    vals = np.split(host, np.cumsum([B, Bk, Bk, B, B]))
    check_finite(vals[:3])
    if scope == "visible":
        group = dp.seq_ids()
        amax = []
        for e in vals[3:6]:  # scoped_amax's maximum over each group (and 0), on the host
            g = np.zeros(int(group.max()) + 1)
            np.maximum.at(g, group, e)
            amax.append(g[group])
    else:
        group = np.zeros(B, dtype=np.int64)
        amax = [np.full(B, float(a.max()) if a.size else 0.0) for a in vals[:3]]
    return [np.where(a > 0, a / 127.0, 1.0) for a in amax], group


def _chunk(dp, q8, ent_c, g0, g1, r0, r1, bk: int, m_init: int, division: bool,
           accumulate: bool, cnt, out):
    """Algorithm 1 for the rows of one chunk (all key tiles); adds the per-row counters to
    ``cnt`` (device int64 ``(B, _NCOUNT)``) and writes ``out``."""
    import torch

    Lq, Lk, dev = dp.Lq, dp.Lk, dp.device
    gh, rows = g1 - g0, r1 - r0
    n = gh * rows
    ent = torch.arange(g0, g1, device=dev).repeat_interleave(rows)
    sk, sv, s = ent_c["sk"], ent_c["sv"], ent_c["s"]
    idx = dp.kv[g0:g1]
    k8 = codes(dp.k[idx], sk[g0:g1, None].expand(gh, Lk), qmin=-128)
    v8 = codes(dp.v[idx], sv[g0:g1, None].expand(gh, Lk), qmin=-128)
    S = torch.matmul(q8[g0:g1, r0:r1], k8.transpose(1, 2)).to(torch.int64).reshape(n, Lk)
    bias = None
    if dp.mask is not None:
        m = dp.mask[dp.mask_map[g0:g1]][:, r0:r1].double().reshape(n, Lk)
        masked = torch.isneginf(m)
        units = (torch.where(masked, 0.0, m) * LOG2E / s[ent][:, None]).round()
        units = torch.clamp(units, MASK_BIAS, -MASK_BIAS)
        bias = torch.where(masked, MASK_BIAS, units).to(torch.int64)
    i = torch.arange(r0, r1, device=dev).repeat(gh)
    lim = i + Lk - Lq
    R, eM, rM = (ent_c[c][ent][:, None] for c in ("R", "exp_M", "req_M"))
    lM, aM = ent_c["l_M"][ent], ent_c["acc_M"][ent][:, None]
    z = torch.zeros(n, dtype=torch.int64, device=dev)
    mrow = torch.full((n,), m_init, dtype=torch.int64, device=dev)
    lsum = torch.ones(n, dtype=torch.int64, device=dev)
    acc = torch.zeros((n, dp.dv), dtype=torch.int64, device=dev)
    vmax = torch.full((n,), -(1 << 62), dtype=torch.int64, device=dev)
    seen = torch.zeros(n, dtype=torch.bool, device=dev)
    c_wrap, c_ovf, c_req, c_neg, c_resc = z.clone(), z.clone(), z.clone(), z.clone(), z.clone()
    nk = -(-Lk // bk)
    f = torch.ones_like(z)  # Scale Accumulation: R**t per row (int32)
    f_wrap = z.clone()
    for t in range(nk):
        if accumulate and t > 0:
            ff = f * R[:, 0]
            f = wrap32(ff)
            f_wrap = (f != ff).to(torch.int64)
        j0 = t * bk
        nv = min(bk, Lk - j0)
        st = S[:, j0:j0 + nv]
        bij = torch.zeros_like(st) if bias is None else bias[:, j0:j0 + nv]
        if dp.causal:
            cols = torch.arange(j0, j0 + nv, device=dev)[None, :]
            bij = torch.where(cols > lim[:, None], MASK_BIAS, bij)
        raw = st + bij
        w = wrap32(raw)
        c_wrap += (w != raw).sum(dim=1)
        vis = bij > MASK_BIAS
        seen |= vis.any(dim=1)
        vmax = torch.maximum(vmax, torch.where(vis, w, -(1 << 62)).amax(dim=1))
        if nv < bk:
            w = torch.cat([w, torch.full((n, bk - nv), MASK_BIAS, dtype=torch.int64,
                                         device=dev)], dim=1)
        mx = torch.maximum(mrow, w.amax(dim=1))
        raw = w - mx[:, None]
        x = wrap32(raw)
        c_wrap += (x != raw).sum(dim=1)
        y, ovf, wr = shift_exp2(x, R, eM, division)
        c_ovf += ovf.sum(dim=1)
        c_wrap += wr.sum(dim=1)
        pv, rw, wr = _requant(y, rM)
        c_neg += ((pv < 0) & (rw == 0)).sum(dim=1)
        c_req += rw.sum(dim=1)
        c_wrap += wr.sum(dim=1)
        rowsum = pv.sum(dim=1)
        raw = mrow - mx
        x = wrap32(raw)
        c_wrap += (x != raw)
        alpha, ovf, wr = shift_exp2(x[:, None], R, eM, division)
        alpha = alpha[:, 0]
        c_ovf += ovf[:, 0]
        c_wrap += wr[:, 0]
        if t > 0:
            c_neg += alpha < 0
            c_resc += mx != mrow
        lsum, wr = _carry(lsum, alpha, lM, rowsum, f, accumulate)
        c_wrap += wr + f_wrap
        tile = torch.matmul(pv[:, :nv].double().reshape(gh, rows, nv),
                            v8[:, j0:j0 + nv]).to(torch.int64).reshape(n, dp.dv)
        acc, wr = _carry(acc, alpha[:, None], aM, tile, f[:, None], accumulate)
        c_wrap += wr.sum(dim=1)
        mrow = mx
    fl = lsum.to(torch.float32)
    o = _f32_to_i32(acc.to(torch.float32) / fl[:, None])
    o8 = _wrap8(o)
    c = torch.zeros((n, _NCOUNT), dtype=torch.int64, device=dev)
    c[:, _C_TILES] = nk
    c[:, _C_RESCALES] = c_resc
    c[:, _C_EXP_OVF] = c_ovf
    c[:, _C_REQ_WRAP] = c_req
    c[:, _C_I32_WRAP] = c_wrap
    c[:, _C_OUT_WRAP] = (o8 != o).sum(dim=1)
    c[:, _C_ZERO_DEN] = lsum == 0
    c[:, _C_NEG_EXP] = c_neg
    c[:, _C_M_INIT] = seen & (vmax < m_init)
    cnt.index_add_(0, ent, c)
    res = (o8.double() * sv[ent][:, None]).to(torch.float32)
    out[g0:g1, r0:r1] = res.reshape(gh, rows, dp.dv)


def qflash(dp: DeviceProblem, return_stats: bool, block_k: int = BLOCK_K_DEFAULT,
           m_init: int = M_INIT_DEFAULT, division: bool = False, on_hazard: str = "count",
           scale_scope: str = "visible", scale_update: str = "release"):
    """Scheme ``qflash`` on the device (``qflash._qflash``'s options, checks, messages,
    constants, hazards and per-entry statistics)."""
    import torch

    scope, bk, m_init, division, accumulate = qflash_options(
        dp.Lk, dp.d, block_k, m_init, division, on_hazard, scale_scope, scale_update)
    B, dev = dp.B, dp.device
    s_ent, group = _scales(dp, scope)
    bounds = np.flatnonzero(np.diff(group)) + 1
    consts, zero = [], False
    names = ("R", "exp_M", "req_M", "l_M", "acc_M")
    const = np.zeros((B, len(names)), np.int64)
    sv_h, s_h = np.zeros(B), np.zeros(B)
    for e0, e1 in zip(np.r_[0, bounds].tolist(), np.r_[bounds, B].tolist(), strict=True):
        sq, sk, sv = (float(s[e0]) for s in s_ent)
        c = QFlashConstants.from_scales(sq, sk, sv, dp.scale)
        check_exp_M(c, on_hazard)
        const[e0:e1] = [getattr(c, name) for name in names]
        sv_h[e0:e1], s_h[e0:e1] = c.s_v, c.s
        consts.append(c.to_dict())
        zero = zero or c.exp_M_zero
    # the host constants and scales on the device in one copy, without waiting
    const_t, sk_t, sv_t, s_t, sq_t = to_device([const, s_ent[1], sv_h, s_h, s_ent[0]], dev)
    ent_c = {name: const_t[:, i] for i, name in enumerate(names)}
    ent_c.update(sk=sk_t, sv=sv_t, s=s_t)
    if dp.mask is None and fused_kernels(dp):  # one Triton kernel (lowprec.gpu.qflash_kernel)
        from ..gpu.qflash_kernel import qflash_rows

        out, rc = qflash_rows(
            int8_codes(dp.q_in, sq_t, None, -128), int8_codes(dp.k_in, sk_t, dp.kv, -128),
            int8_codes(dp.v_in, sv_t, dp.kv, -128), const_t, sv_t,
            causal=dp.causal, block_k=bk, m_init=m_init, division=division,
            accumulate=accumulate)
        cnt = rc.sum(dim=1)
    else:
        q8 = codes(dp.q, sq_t[:, None].expand(B, dp.Lq), qmin=-128)
        out = torch.empty((B, dp.Lq, dp.dv), dtype=torch.float32, device=dev)
        cnt = torch.zeros((B, _NCOUNT), dtype=torch.int64, device=dev)
        for g0, g1, r0, r1 in chunks(dp):
            _chunk(dp, q8, ent_c, g0, g1, r0, r1, bk, m_init, division, accumulate, cnt, out)
    if not return_stats and on_hazard != "raise":  # the counters would go unread
        return out, None
    st = pipeline_stats(cnt.cpu().numpy(), zero, consts, on_hazard)
    return out, (st if return_stats else None)


__all__ = ["qflash", "shift_exp2", "wrap32", "QFlashStats"]
