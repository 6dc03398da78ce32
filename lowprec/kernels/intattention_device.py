"""Device paths of :mod:`.intattention`'s schemes (``intattention``, ``quant_only``,
``index_softmax_only``): the CPU pipelines step by step in torch operations on the tensors'
device, on the plumbing of :mod:`.device_rows` (docs/design.md "Attention on the device").

Every step mirrors a step of the CPU path (the module docstring of :mod:`.intattention` gives
the roundings) with the same IEEE operation:

* ``intattention``: integer scores (exact float64 GEMM), the mask bias ``RNE(add / alpha)``
  in float64, the row max, distances and counters in int64, the LUT index
  ``trunc(fp32(fp32(nb D') / fp32(c_int)))`` (int64 -> float32 conversion and float32
  division, both correctly rounded), ``"nearest"`` and deploy indices in integers, the row
  sum in int64, the per-row table ``RNE(fp32(lut * pmax) / fp32(Z))`` (deploy: the kernel's
  ``ns`` from a float64 division rounded to float32); ``P v8`` exact; ``(acc s_v) / pmax`` in
  float64 rounded once.  Bit-identical by construction; the thresholds and their errors come
  from the CPU's own :func:`~.intattention.clip_threshold` on the host (one small copy).
* ``quant_only``: float32 scores ``((fp32(S) scale) s_q) s_k (+ mask)`` (separate float32
  products: no contraction in torch), the float64 ``exp(t - m)``, the row sum in the CPU's
  sequential order (:func:`lowprec.gpu.rowsum.seq_rowsum`), ``P8 = RNE(fp32(127 fp32(e /
  z)))``.  The one step not pinned bit for bit is ``exp``: the CPU calls the C library's
  float64 ``exp`` (glibc), the device torch's (CUDA's, within 1 ulp; on CPU tensors, SLEEF's).
  An ulp of ``e`` reaches the output only if it moves ``fp32(e / z)`` across a float32
  rounding boundary (about 2**-28 per probability) and that moves ``RNE(127 p)``: measured
  agreement in docs/design.md.  Calls without a mask run the same steps in one fused Triton
  kernel (:mod:`lowprec.gpu.quant_only_kernel`), whose ``exp`` is libdevice's ``__nv_exp``
  on the GPU (the CUDA math library's, which torch's CUDA ``exp`` calls) and NumPy's in
  Triton's interpreter: the same unpinned step.
* ``index_softmax_only``: the scores ``fp32(fp32(fp64(q . k) scale) + mask)`` and ``O = P v``
  are float64 GEMMs of float32 operands, whose order is BLAS's on the CPU (not pinned: it
  depends on the BLAS build) and cuBLAS's on the GPU; the float32 LUT softmax between them is
  exact.  A float64 sum differs between orders in its last bits only, which reaches a float32
  result when it lies within 2**-29 of a rounding boundary: measured agreement in
  docs/design.md.  (A fused Triton kernel with float64 ``tl.dot`` GEMMs was slower than
  cuBLAS's float64 GEMMs here, 101 against 64 ms at (1, 32, 4096, 128) on the H100: this
  scheme stays on torch operations; docs/design.md.)
"""

from __future__ import annotations

import math

import numpy as np

from ..stats import IntAttentionStats
from ._check import check_choice
from ._int8 import INT8_QMAX, NORM_TOL
from ._intattention_rows import (
    _I_EMPTY,
    _I_PSUM,
    _I_VIS,
    _MODE_FLOOR,
    _N_INFO,
    DEPLOY_NORM,
    DEPLOY_ROUND,
    DEPLOY_SHIFT,
    INT32_MAX,
    UINT16_MOD,
)
from .device_rows import (
    DeviceProblem,
    DeviceStats,
    chunks,
    float_output,
    float_scores,
    fused_kernels,
    none_visible,
    out_rows,
    quantize_problem,
)
from .intattention import (
    BITS_DEFAULT,
    BLOCK_DEFAULT,
    C_DEFAULT,
    LOGIT_LIMIT,
    NEON_LANES,
    P_SCALES,
    _check_bits,
    _check_c,
    _check_depth,
    _check_granularity,
    _deploy_mult,
    _head_stats,
    _index_mode,
    clip_threshold,
    index_lut,
    intattention_options,
)
from .problem import SCALE_SCOPES

_LUTS: dict = {}


def _device_lut(bits: int, c: float, lut: np.ndarray, dev, dtype=None):
    """The LUT of ``(bits, c)`` on ``dev`` (int64, or ``dtype``), copied there once."""
    import torch

    key = (bits, float(c), str(dev), str(dtype))
    t = _LUTS.get(key)
    if t is None:
        if len(_LUTS) > 64:
            _LUTS.clear()
        t = _LUTS[key] = torch.from_numpy(lut if dtype is None else lut.astype(dtype)).to(dev)
    return t


def _iz(lut: np.ndarray, nb: int) -> int:
    """First index whose LUT value is 0 (the LUT is non-increasing)."""
    iz = nb
    while iz > 0 and lut[iz - 1] == 0:
        iz -= 1
    return iz


def index_rows(s, visible, cint, mult, lut_t, iz: int, nb: int, mode: int, pmax: int,
               deploy: bool, tail_from: int):
    """IndexSoftmax of int64 logits ``s (n, L)`` (``_index_rows`` / ``_fused_rows``):
    ``(P int64 (n, L), info int64 (n, 8))``.  ``visible``: boolean ``(n, L)`` or None;
    ``cint``/``mult``: int64 ``(n,)`` thresholds and deploy multipliers; ``lut_t`` the int64
    LUT on the device."""
    import torch

    n, L = s.shape
    dev = s.device
    cols = torch.arange(L, device=dev)
    if visible is None:
        visible = torch.ones((n, L), dtype=torch.bool, device=dev)
    nvis = visible.sum(dim=1)
    empty = nvis == 0
    lowest = torch.iinfo(torch.int64).min
    m = torch.where(visible, s, lowest).amax(dim=1)
    dd = m[:, None] - s
    c = cint[:, None]
    dovf = (visible & (dd > INT32_MAX)).sum(dim=1)
    clipped = (visible & (dd >= c)).sum(dim=1)
    ddc = torch.where(visible, torch.minimum(dd, c), 0)
    if deploy:
        prod = ddc * mult[:, None]
        idx = torch.where(cols[None, :] < tail_from, (prod + DEPLOY_ROUND) >> DEPLOY_SHIFT,
                          prod >> DEPLOY_SHIFT)
    elif mode == _MODE_FLOOR:
        q = (nb * ddc).to(torch.float32) / cint.to(torch.float32)[:, None]
        idx = torch.clamp(q.to(torch.int64), max=nb)
    else:  # the exact quotient rounded half to even
        num = nb * ddc
        qq = torch.div(num, c, rounding_mode="floor")
        rr = num - qq * c
        up = (2 * rr > c) | ((2 * rr == c) & ((qq & 1) == 1))
        idx = qq + up.to(torch.int64)
    idx = torch.where(visible, idx, nb)
    E = lut_t[idx]
    z = E.sum(dim=1)
    zero = (visible & (idx >= iz)).sum(dim=1)
    wrap = torch.zeros_like(z)
    nsovf = torch.zeros_like(z)
    if deploy:
        z16 = z & (UINT16_MOD - 1)
        wrap = (z >= UINT16_MOD).to(torch.int64)
        qf = (DEPLOY_NORM / z16.to(torch.float64)).to(torch.float32)
        nsi = (qf.to(torch.float64) + 0.5).to(torch.float32).to(torch.int64)
        nsi = torch.where(z16 == 0, 0, nsi)  # (inf: its conversion is not read)
        nsovf = ((z16 == 0) | (nsi > 255)).to(torch.int64)
        ns = torch.where(z16 == 0, 255, nsi & 255)
        early = (z16 == pmax)[:, None]
        nsovf = torch.where(z16 == pmax, 0, nsovf)
        ptab = torch.where(early, lut_t[None, :], (lut_t[None, :] * ns[:, None] + 128) >> 8)
        ttab = torch.where(early, lut_t[None, :], (lut_t[None, :] * ns[:, None]) >> 8)
    else:
        zf = z.to(torch.float32)
        num = (lut_t * pmax).to(torch.float32)
        ptab = (num[None, :] / zf[:, None]).round()
        ptab = torch.where(empty[:, None], 0.0, ptab).to(torch.int64)
        ttab = ptab
    P = torch.gather(ptab, 1, idx)
    if deploy and tail_from < L:
        P = torch.where(cols[None, :] >= tail_from, torch.gather(ttab, 1, idx), P)
    P = torch.where(empty[:, None], 0, P)
    psum = P.sum(dim=1)
    info = torch.stack([clipped, zero, empty.to(torch.int64), wrap, nsovf, dovf, nvis, psum],
                       dim=1)
    only_empty = torch.zeros(_N_INFO, dtype=torch.int64, device=dev)
    only_empty[_I_EMPTY] = 1
    info = torch.where(empty[:, None], only_empty[None, :], info)
    return P, info


def intattention(dp: DeviceProblem, return_stats: bool, bits: int = BITS_DEFAULT,
                 c: float = C_DEFAULT, index_rounding: str = "floor",
                 granularity: str = "per_tensor", block: int = BLOCK_DEFAULT,
                 deploy: bool = False, neon_tail: bool = False, p_format: str = "uint8",
                 scale_scope: str = "visible"):
    """Scheme ``intattention`` on the device (``intattention._intattention``'s options,
    checks, messages and statistics)."""
    import torch

    dep, b, cf, mode, gran, blk, pf, tail, scope = intattention_options(
        dp, bits, c, index_rounding, granularity, block, deploy, neon_tail, p_format,
        scale_scope)
    B, Lq, Lk = dp.B, dp.Lq, dp.Lk
    dev = dp.device
    qz = quantize_problem(dp, gran, blk, scope, codes_kv=_fused_ok(dp, dep))
    # the thresholds per block of q's rows (one value per scale; cint_h repeats them per row)
    alpha_h = qz.host["sq"].astype(np.float64) * \
        qz.host["sk"].astype(np.float64)[:, None] * dp.scale  # (the same IEEE products)
    cint_b = np.asarray(clip_threshold(alpha_h, cf, deploy=dep), dtype=np.int64) \
        if alpha_h.size else np.zeros((B, qz.groups), dtype=np.int64)
    cint_h = _per_row(cint_b.reshape(B, qz.groups), qz.block, Lq)
    lut = index_lut(b, cf).astype(np.int64)
    nb = (1 << b) - 1
    pmax = P_SCALES[pf]
    mult_h = None  # (deploy's multipliers per row; zeros otherwise, made only where read)
    if dep and cint_h.size:
        uniq, inv = np.unique(cint_h, return_inverse=True)
        mults = np.array([_deploy_mult(int(t), nb) for t in uniq], dtype=np.int64)
        for t, mu in zip(uniq, mults, strict=True):
            top = (int(t) * int(mu) + DEPLOY_ROUND) >> DEPLOY_SHIFT
            if int(t) * int(mu) > INT32_MAX or top > nb:  # pragma: no cover - cannot happen
                raise ValueError(
                    f"deploy: T = {int(t)} with bits = {b} overflows the kernel's int32 "
                    f"index product (T * mult = {int(t) * int(mu)})")
        mult_h = mults[inv.reshape(-1)].reshape((B, Lq))
    tail_from = (Lk // NEON_LANES) * NEON_LANES if (dep and tail) else Lk
    lut_t = _device_lut(b, cf, lut, dev)
    iz = _iz(lut, nb)
    if _fused_ok(dp, dep):
        from ..gpu._launch import host_to_device
        from ..gpu.index_attention import intattention_rows

        # the host's thresholds (clip_threshold's), one per block of rows, int32 in one
        # non-blocking copy, repeated per row on the device (a (B, Lq) host array would
        # need a large pinned buffer after the read-back, on the host's critical path)
        cb = host_to_device(torch.from_numpy(np.ascontiguousarray(
            cint_b.reshape(B, qz.groups), np.int32)), dev)
        cint_t = (cb[:, :1].expand(B, Lq) if qz.groups == 1 else
                  cb.repeat_interleave(qz.block, dim=1)[:, :Lq]).contiguous()
        k8, v8 = qz.int8_kv()
        out, info_all = intattention_rows(
            qz.q8i, k8, v8, cint_t, _device_lut(b, cf, lut, dev, np.int32), qz.sv.contiguous(),
            causal=dp.causal, mode=mode, nb=nb, iz=iz, pmax=pmax,
            c_max=int(cint_b.max()) if cint_h.size else 1)
        msat = None  # (no mask: nothing saturates)
    else:
        cint_t = torch.from_numpy(np.ascontiguousarray(cint_h)).to(dev)
        mult_t = torch.from_numpy(np.zeros((B, Lq), dtype=np.int64) if mult_h is None
                                  else mult_h).to(dev)
        out, info_all, msat = _intattention_rows(dp, qz, _alpha_rows(dp, qz), cint_t, mult_t,
                                                 lut_t, iz, nb, mode, pmax, dep, tail_from)
    if not return_stats:
        return out, None
    # sums on the device (the CPU's _core_stats of the row counters), read back by the caller
    seen = info_all[..., _I_VIS] > 0
    # rows whose integer sum is off by more than NORM_TOL of full scale (unnormalized: the
    # distance is an integer, so <= NORM_TOL * full iff <= its floor)
    tol = math.floor(NORM_TOL * float(pmax))
    off = ((info_all[..., _I_PSUM] - pmax).abs() > tol) & seen
    parts = [info_all.sum(dim=1).reshape(-1), off.sum().reshape(1)]
    if msat is not None:
        parts.append(msat.reshape(1))
    c_rec = cint_b.reshape(B, qz.groups) if Lq else np.zeros((B, 0), np.int64)
    quantized, saturated = qz.quantized, qz.saturated

    def build(red):
        st = _head_stats(red[:B * _N_INFO].reshape(B, _N_INFO), B * Lq,
                         np.ascontiguousarray(c_rec), quantized, saturated,
                         int(red[B * _N_INFO + 1]) if msat is not None else 0)
        st.unnormalized_rows = int(red[B * _N_INFO])
        return st

    return out, DeviceStats(parts, build)


def _per_row(blocks: np.ndarray, block: int, Lq: int) -> np.ndarray:
    """``(B, Lq)``: the values of ``blocks (B, groups)``, one per ``block`` rows, repeated
    for each row (a read-only broadcast view for one group)."""
    if blocks.shape[1] == 1:
        return np.broadcast_to(blocks, (blocks.shape[0], Lq))
    return np.repeat(blocks, block, axis=1)[:, :Lq]


def _alpha_rows(dp: DeviceProblem, qz):
    """float64 ``(B, Lq)`` logit scales ``s_q s_k scale`` of every row on the device (the
    products of the host's ``alpha``)."""
    return qz.sq_row.double() * qz.sk.double()[:, None] * dp.scale


def _fused_ok(dp: DeviceProblem, deploy: bool) -> bool:
    """Whether the fused Triton kernel (:mod:`lowprec.gpu.index_attention`) computes the
    call: no mask, no deploy mode (:func:`~.device_rows.fused_kernels`)."""
    return not deploy and dp.mask is None and fused_kernels(dp)


def _intattention_rows(dp, qz, alpha_row, cint_t, mult_t, lut_t, iz, nb, mode, pmax, dep,
                       tail_from):
    """The torch-operations path of :func:`intattention` (masks, deploy mode): ``(out,
    info, mask saturations)``."""
    import torch

    B, Lq, Lk = dp.B, dp.Lq, dp.Lk
    dev = dp.device
    out = torch.empty((B, Lq, dp.dv), dtype=torch.float32, device=dev)
    info_all = torch.zeros((B, Lq, _N_INFO), dtype=torch.int64, device=dev)
    msat = torch.zeros((), dtype=torch.int64, device=dev)
    for g0, g1, r0, r1 in chunks(dp):
        gh, rows = g1 - g0, r1 - r0
        rm = dp.rows(g0, g1, r0, r1)
        S = qz.scores(g0, g1, r0, r1)  # exact integers, float64
        if rm.add is not None:
            bias = (rm.add.double() / alpha_row[g0:g1, r0:r1, None]).round().clamp(
                -2.0 * LOGIT_LIMIT, 2.0 * LOGIT_LIMIT)
            S = S + bias
            big = S.abs() > LOGIT_LIMIT
            big = big & rm.vis.reshape(S.shape)
            msat += big.sum()
            S = S.clamp(-LOGIT_LIMIT, LOGIT_LIMIT)
        s2 = S.to(torch.int64).reshape(gh * rows, Lk)
        P, info = index_rows(s2, rm.visible(Lk, dp.causal),
                             cint_t[g0:g1, r0:r1].reshape(-1),
                             mult_t[g0:g1, r0:r1].reshape(-1), lut_t, iz, nb, mode, pmax, dep,
                             tail_from)
        info_all[g0:g1, r0:r1] = info.reshape(gh, rows, _N_INFO)
        acc = torch.matmul(P.double().reshape(gh, rows, Lk), qz.v8(g0, g1))
        out[g0:g1, r0:r1] = out_rows(acc, qz.sv[g0:g1], pmax)
    return out, info_all, msat


def quant_only(dp: DeviceProblem, return_stats: bool, granularity: str = "per_tensor",
               block: int = BLOCK_DEFAULT, scale_scope: str = "visible"):
    """Scheme ``quant_only`` on the device (``intattention._quant_only``; the module docstring
    says which step is not pinned).  Calls without a mask run the fused Triton kernel
    (:mod:`lowprec.gpu.quant_only_kernel`, under :func:`~.device_rows.fused_kernels`), the
    others the torch operations per chunk of rows; the statistics stay on the device
    (:class:`~.device_rows.DeviceStats`: no read-back in the call)."""
    gran, blk = _check_granularity(granularity, block, dp.Lq)
    _check_depth(dp.d)
    fused = dp.mask is None and fused_kernels(dp)
    qz = quantize_problem(dp, gran, blk, check_choice(scale_scope, "scale_scope",
                                                      SCALE_SCOPES), codes_kv=fused)
    if fused:
        out, counts = _quant_only_fused(dp, qz, return_stats)
    else:
        out, counts = _quant_only_rows(dp, qz, return_stats)
    if not return_stats:
        return out, None
    B, Lq = dp.B, dp.Lq
    quantized, saturated = qz.quantized, qz.saturated

    def build(red):
        return IntAttentionStats(calls=1, rows=B * Lq, empty_rows=int(red[0]),
                                 quantized=quantized, saturated=saturated,
                                 unnormalized_rows=int(red[1]))

    return out, DeviceStats(counts, build)


#: ``unnormalized``'s bound on ``|sum P8 - 127|`` (``NORM_TOL`` of full scale, in float64 as
#: the CPU compares it)
_QO_TOL = NORM_TOL * float(INT8_QMAX)


def _quant_only_fused(dp: DeviceProblem, qz, return_stats: bool):
    """:func:`quant_only` by the fused kernel: ``(out, [empty rows, unnormalized rows])``
    (int64 device tensors; None without statistics)."""
    import torch

    from ..gpu.quant_only_kernel import STATE_EMPTY, STATE_NAN, quant_only_rows

    k8, v8 = qz.int8_kv()
    out, info = quant_only_rows(qz.q8i, k8, v8, qz.sq_row, qz.sk.contiguous(),
                                qz.sv.contiguous(), dp.scale, causal=dp.causal)
    if not return_stats:
        return out, None
    psum, state = info[..., 0], info[..., 1]
    seen = state != STATE_EMPTY
    # (integer sums: |psum - 127| <= 12.7 in float64 iff <= 12 in integers; a NaN row's
    # float64 sum is NaN, never within the bound)
    off = seen & ((state == STATE_NAN) | ((psum - INT8_QMAX).abs() > math.floor(_QO_TOL)))
    return out, [(~seen).sum(dtype=torch.int64).reshape(1),
                 off.sum(dtype=torch.int64).reshape(1)]


def _quant_only_rows(dp: DeviceProblem, qz, return_stats: bool):
    """:func:`quant_only` in torch operations per chunk of rows (masks; CPU tensors outside
    the interpreter): ``(out, [empty rows, unnormalized rows])`` as
    :func:`_quant_only_fused`."""
    import torch

    from ..gpu.rowsum import seq_rowsum

    Lk = dp.Lk
    dev = dp.device
    scale32 = torch.tensor(float(np.float32(dp.scale)), dtype=torch.float32, device=dev)
    out = torch.empty((dp.B, dp.Lq, dp.dv), dtype=torch.float32, device=dev)
    empty_n = torch.zeros(1, dtype=torch.int64, device=dev)
    off_n = torch.zeros(1, dtype=torch.int64, device=dev)
    for g0, g1, r0, r1 in chunks(dp):
        gh, rows = g1 - g0, r1 - r0
        n = gh * rows
        rm = dp.rows(g0, g1, r0, r1)
        S = qz.scores(g0, g1, r0, r1).reshape(n, Lk)
        sq = qz.sq_row[g0:g1, r0:r1].reshape(-1)
        sk = qz.sk[g0:g1].repeat_interleave(rows)
        t = ((S.to(torch.float32) * scale32) * sq[:, None]) * sk[:, None]
        if rm.add is not None:
            t = t + rm.add.reshape(n, Lk)
        vis = rm.visible(Lk, dp.causal)
        if vis is None:
            vis = torch.ones((n, Lk), dtype=torch.bool, device=dev)
        m = torch.where(vis, t, -np.inf).amax(dim=1)
        has = m != -np.inf
        ok = vis & has[:, None]
        e = torch.where(ok, torch.exp(t.double() - m.double()[:, None]), 0.0)
        z = seq_rowsum(e)
        p = (e / z[:, None]).to(torch.float32)
        p8 = (p.double() * INT8_QMAX).to(torch.float32).double().round()
        P8 = torch.where(ok, p8, 0.0)
        acc = torch.matmul(P8.reshape(gh, rows, Lk), qz.v8(g0, g1))
        out[g0:g1, r0:r1] = out_rows(acc, qz.sv[g0:g1], INT8_QMAX)
        if return_stats:
            none = none_visible(rm.vis, rm.lim, Lk)
            empty_n += none.sum()
            # unnormalized(): not |sum - 127| <= 12.7 in float64 (NaN sums included)
            near = (P8.sum(dim=1) - INT8_QMAX).abs() <= _QO_TOL
            off_n += (~near & ~none).sum()
    return out, ([empty_n, off_n] if return_stats else None)


def index_softmax_rows(x, visible, lut_t, nb: int, cf32, mode: int):
    """The LUT softmax of float32 scores ``x (n, L)`` (``_float_index_rows``): float32
    probabilities ``(n, L)``, NaN rows where a visible score is NaN or ``+inf`` or no finite
    score is visible."""
    import torch

    n, L = x.shape
    dev = x.device
    if visible is None:
        visible = torch.ones((n, L), dtype=torch.bool, device=dev)
    bad = (visible & (torch.isnan(x) | (x == np.inf))).any(dim=1)
    use = visible & (x != -np.inf)
    nvis = use.sum(dim=1)
    m = torch.where(use & ~torch.isnan(x), x, -np.inf).amax(dim=1)
    dd = torch.minimum(m[:, None] - x, cf32)
    q = (dd * float(nb)) / cf32
    idx = q.to(torch.int64) if mode == _MODE_FLOOR else q.round().to(torch.int64)
    idx = torch.where(use, torch.clamp(idx, 0, nb), 0)  # (NaN rows: replaced below)
    z = torch.where(use, lut_t[idx], 0).sum(dim=1)
    ptab = lut_t.to(torch.float32)[None, :] / z.to(torch.float32)[:, None]
    P = torch.where(use, torch.gather(ptab, 1, idx), 0.0)
    return torch.where((bad | (nvis == 0))[:, None], np.nan, P)


def index_softmax_only(dp: DeviceProblem, return_stats: bool, bits: int = BITS_DEFAULT,
                       c: float = C_DEFAULT, index_rounding: str = "floor"):
    """Scheme ``index_softmax_only`` on the device (``intattention._index_softmax_only``; the
    module docstring says which steps are not pinned).  Torch operations per chunk of rows;
    the statistic (``empty_rows``: the NaN rows) stays on the device
    (:class:`~.device_rows.DeviceStats`: no read-back in the call)."""
    import torch

    b = _check_bits(bits)
    cf = _check_c(c)
    mode = _index_mode(index_rounding)
    Lk = dp.Lk
    dev = dp.device
    nb = (1 << b) - 1
    lut_t = torch.from_numpy(index_lut(b, cf).astype(np.int64)).to(dev)
    cf32 = torch.tensor(float(np.float32(cf)), dtype=torch.float32, device=dev)
    q64 = dp.q.double()
    out = torch.empty((dp.B, dp.Lq, dp.dv), dtype=torch.float32, device=dev)
    nan_n = torch.zeros(1, dtype=torch.int64, device=dev)
    for g0, g1, r0, r1 in chunks(dp):
        rm = dp.rows(g0, g1, r0, r1)
        x = float_scores(dp, g0, g1, r0, r1, rm, q64)
        P = index_softmax_rows(x, rm.visible(Lk, dp.causal), lut_t, nb, cf32, mode)
        nan_n += torch.isnan(P[:, 0]).sum()
        out[g0:g1, r0:r1] = float_output(P, dp, g0, g1)
    if not return_stats:
        return out, None
    rows = dp.B * dp.Lq

    def build(red):
        return IntAttentionStats(calls=1, rows=rows, empty_rows=int(red[0]))

    return out, DeviceStats([nan_n], build)


__all__ = ["intattention", "quant_only", "index_softmax_only", "index_rows",
           "index_softmax_rows"]
