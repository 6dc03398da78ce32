"""Device paths of :mod:`.baselines`' attention schemes ``ivit`` and ``ibert`` (the float32
order and ``exact=True``): the CPU pipeline (:func:`.baselines._int8_attention` around
:mod:`._surrogate`) step by step in torch operations on the tensors' device, bit-identical to
the CPU path with equal statistics (docs/design.md "Row-wise schemes on the device").

Pipeline, per row chunk (:func:`~.device_rows.chunks`), memory O(chunk x Lk) per call (never
the CPU's ``(B Lq, Lk)`` logits buffer): the exact int8 scores ``S = q8 k8^T`` (float64 GEMM
of integer operands), the logits ``fl32(fl64(S) s_in + mask)`` (float64 product and sum, one
rounding), the surrogate row by row, the exact ``P v8`` and ``fl32(O (s_v unit))``.  What the
CPU takes over a whole group of rows (the logit requantisation range of ``logit_bits``,
I-BERT's ``max(e)`` for its 16-bit requantisation) is taken in an earlier pass over the chunks
that recomputes the logits (the same bits each time) and reduces per entry; the host reads
back one value per entry and derives the group's constants with the CPU's own code
(``_check_scale``, ``_ibert_consts``, ``_frexp_multiplier``), so the checks and messages are
the CPU's.  I-ViT with ``logit_bits`` takes two passes over the scores, I-BERT two (three
with ``logit_bits``).

Exactness (specs/gpu.md sections 2-3): every step of the surrogates is one IEEE float32 (or
float64) basic operation, ``floor``, a comparison, a power of two from a table or an integer
operation, each exact or correctly rounded in torch on both devices; the divisors are device
tensors (a CUDA division by a host scalar is a product with its reciprocal, not IEEE).  The
row sums of ``e`` are float32 sums left to right (:func:`lowprec.gpu.rowsum.seq_rowsum`, the
CPU's order; the CPU's exact shortcut for totals up to ``2**24`` gives the same value).  No
transcendental function and no float GEMM whose order matters: bit-identical by construction.

``ivit`` and ``ibert`` in float32 order without a mask run fused Triton kernels instead of
the passes over the chunks (:mod:`lowprec.gpu.ivit_kernel`, under
:func:`~.device_rows.fused_kernels`: CUDA tensors, or CPU tensors under Triton's
interpreter): the same operations in the same order, per-row counters reduced on the device
(:class:`~.device_rows.DeviceStats`), the ``logit_bits`` range from a per-row ``max |S|``
kernel; I-BERT's ``max(e)`` from a per-row kernel, read back per entry (as above), its
multiplier from the host's :func:`_ibert_mult` (the torch path's code), then one kernel for
the rows.

``exact=True`` (``_baselines_exact``): ``RNE(x / s)`` as a float64 division, every other step
in int64 (floor divisions, arithmetic shifts by per-entry amounts, I-ViT's saturating sum as a
sum of terms clamped to ``2**31 - 1``, I-BERT's 93-bit ``RNE(z m31 / 2**k)`` in two 31-bit
halves: :func:`mul_shift_rne`); its range check reads back the largest finite ``|x|`` per
entry (every entry, masked ones too, as the CPU), I-BERT's ``max(z 2**(n - q))`` is an earlier
pass (float64, as the CPU).  Exact by construction.
"""

from __future__ import annotations

import math

import numpy as np

from ._baselines_exact import (
    _C_EMPTY,
    _C_FLOOR,
    _C_NAN,
    _C_REQ,
    _C_SUM,
    _C_ZERO,
    _LOW31,
    _NCOUNT,
    IBERT_E16_MAX,
    IVIT_SUM_MAX,
)
from ._check import check_bool, check_choice
from ._int8 import NORM_TOL, check_positive_scale, unnormalized
from .baselines import (
    IBERT_A,
    IBERT_N,
    IVIT_ATTN_LOGIT_BITS,
    IVIT_ATTN_OUT_BITS,
    IVIT_N,
    BaselineStats,
    _check_exact_range,
    _check_logit_bits,
    _check_out_bits,
    _check_scale,
    _div_py,
    _floor_frac,
    _frexp_multiplier,
    _ibert_consts,
    _stats_from,
    ibert_scale,
    ivit_scale,
)
from .device_rows import DeviceProblem, DeviceStats, chunks, fused_kernels, quantize_problem
from .problem import SCALE_SCOPES

_IVIT, _IBERT = "ivit", "ibert"


class _Consts:
    """Per-entry float32 constants of the surrogate (device tensors ``(B,)``), one value per
    group, made on the host with the CPU's code."""

    def __init__(self, dev, **host):
        import torch

        for name, arr in host.items():
            setattr(self, name, torch.from_numpy(np.asarray(arr)).to(dev))


def _pow2_table(n: int, dev):
    import torch

    return torch.tensor([2.0**k for k in range(n + 1)], dtype=torch.float32, device=dev)


def _logits(dp: DeviceProblem, qz, g0, g1, r0, r1, s_row, req):
    """The chunk's logits float32 ``(n, Lk)``, its visibility ``(n, Lk)`` (None: every key)
    and its rows' entries: ``fl32(fl64(S) s_row + mask)``, requantised when ``req = (s_x,
    qmax)`` (float64 ``(B,)`` device tensors) is given."""
    import torch

    rows = r1 - r0
    n = (g1 - g0) * rows
    rm = dp.rows(g0, g1, r0, r1)
    S = qz.scores(g0, g1, r0, r1)
    t = S * s_row[g0:g1, None, None]
    if rm.add is not None:
        t = t + rm.add.double()
    x = t.to(torch.float32).reshape(n, dp.Lk)
    ent = torch.arange(g0, g1, device=dp.device).repeat_interleave(rows)
    if req is not None:
        sx, qmax = req[0][ent][:, None], req[1]
        code = (x.double() / sx).round().clamp(-qmax, qmax)
        x = (code * sx).to(torch.float32)
    return x, rm.visible(dp.Lk, dp.causal), ent


def _use(x, vis):
    """Entries that take part: visible and not ``-inf`` (``_baselines_exact._visible``)."""
    use = x != -math.inf
    return use if vis is None else use & vis


def _scan(x, use, s):
    """``(xs = fl32(x / s), row max m, good rows, empty rows, bad rows)`` of a chunk."""
    import torch

    cnt = use.sum(dim=1)
    bad = (use & ~(x < math.inf)).any(dim=1) & (cnt > 0)
    good = (cnt > 0) & ~bad
    xs = x / s[:, None]
    m = torch.where(use, xs, -math.inf).amax(dim=1)
    m = torch.where(good, m, 0.0)
    ok = use & good[:, None]
    xs = torch.where(ok, xs, m[:, None])  # t = 0 where not used: the tables stay in range
    return xs, m, ok, good, cnt == 0, bad


def _ivit_rows(x, use, c, ent, pow2, out_bits: int, counts):
    """I-ViT Shiftmax (float32 order, ``_baselines_f32._ivit_f32``) of a chunk: float32 ``y``
    (NaN rows for empty and bad rows); adds the chunk's counters to ``counts`` (device int64
    ``(_NCOUNT,)``)."""
    import torch

    from ..gpu.rowsum import seq_rowsum

    s, x0, nx0 = c.s[ent], c.x0[ent][:, None], c.nx0[ent][:, None]
    xs, m, ok, good, empty, bad = _scan(x, use, s)
    t = xs - m[:, None]
    t = (t + torch.floor(t * 0.5)) - torch.floor(t * 0.0625)
    cl = t < nx0
    t = torch.where(cl, nx0, t)
    q = torch.floor(t / x0)
    rr = t - x0 * q
    u = rr * 0.5 - x0
    ev = torch.floor(u * pow2[(IVIT_N - q).to(torch.int64)])
    ev = torch.where(ev < 0, 0.0, ev)
    e = torch.where(ok, ev, 0.0)
    z = seq_rowsum(e)
    two31 = torch.full_like(z, 2.0**31)
    sc = z >= two31
    z = torch.where(sc, two31, z)
    f = torch.floor(two31 / z)
    div = torch.full_like(z, 2.0 ** (32 - out_bits))[:, None]
    y = torch.floor((e * f[:, None]) / div)
    y = torch.where(ok, y, 0.0)
    counts[_C_EMPTY] += empty.sum()
    counts[_C_NAN] += bad.sum()
    counts[_C_FLOOR] += (cl & ok).sum()
    counts[_C_SUM] += (sc & good).sum()
    counts[_C_ZERO] += (ok & (y == 0)).sum()
    return torch.where(good[:, None], y, math.nan)


def _ibert_e(x, use, c, ent, pow2):
    """I-BERT pass 1 (float32 order, ``_baselines_f32._ibert_exp_f32``) of a chunk:
    ``(e float32 (n, L), entries used, good rows, empty rows, bad rows, floor clamps)``."""
    import torch

    s, x0i, nx0 = c.s[ent], c.x0[ent][:, None], c.nx0[ent][:, None]
    bi, ci = c.bi[ent][:, None], c.ci[ent][:, None]
    xs, m, ok, good, empty, bad = _scan(x, use, s)
    t = xs - m[:, None]
    cl = t < nx0
    t = torch.where(cl, nx0, t)
    q = torch.floor(t / x0i)
    rr = t - x0i * q
    zz = rr * (rr + bi) + ci
    ev = torch.floor(zz * pow2[(IBERT_N - q).to(torch.int64)])
    ev = torch.where(ev < 0, 0.0, ev)
    return torch.where(ok, ev, 0.0), ok, good, empty, bad, (cl & ok).sum()


def _ibert_norm(e, ok, good, ent, m31, inv_shift, out_bits: int, counts):
    """I-BERT pass 2 (``_baselines_f32._ibert_norm_f32``): 16-bit requantisation with the
    entry's multiplier (float64 ``(B,)`` device tensors ``m31``, ``inv_shift``; ``m31 = 0``:
    the group has no positive ``e``, its rows are NaN), row sums, reciprocal, output."""
    import torch

    from ..gpu.rowsum import seq_rowsum

    v = ((e.double() * m31[ent][:, None]) * inv_shift[ent][:, None]).round()
    req = ok & (v > IBERT_E16_MAX)
    e16 = torch.where(ok, v.clamp(max=IBERT_E16_MAX).to(torch.float32), 0.0)
    z = seq_rowsum(e16)
    f = torch.floor(torch.full_like(z, 2.0**32) / z)
    div = torch.full_like(z, 2.0 ** (32 - out_bits))[:, None]
    y = torch.where(ok, torch.floor((e16 * f[:, None]) / div), 0.0)
    live = good & (m31[ent] > 0)
    counts[_C_REQ] += (req & live[:, None]).sum()
    counts[_C_ZERO] += (ok & live[:, None] & (y == 0)).sum()
    return torch.where(live[:, None], y, math.nan)


def _groups(dp: DeviceProblem, scope: str) -> np.ndarray:
    """The group of every entry (host int64 ``(B,)``): one per sequence or one in all."""
    if scope == "visible":
        return dp.seq_ids()
    return np.zeros(dp.B, dtype=np.int64)


def _per_group(vals: np.ndarray, group: np.ndarray, reduce) -> np.ndarray:
    """``reduce`` of ``vals (B,)`` over each group, spread back to the entries."""
    out = np.empty_like(vals)
    for g in np.unique(group):
        sel = group == g
        out[sel] = reduce(vals[sel])
    return out


def _attention(dp: DeviceProblem, return_stats: bool, name: str, out_bits, exact,
               logit_bits, scale_scope):
    """``baselines._int8_attention`` of scheme ``name`` on the device (its checks in its
    order; the module docstring gives the passes)."""
    import torch

    ob = _check_out_bits(out_bits)
    ex = check_bool(exact, "exact")
    lb = _check_logit_bits(logit_bits)
    scope = check_choice(scale_scope, "scale_scope", SCALE_SCOPES)
    check_positive_scale(dp.scale, "I-ViT / I-BERT", "the integer softmax takes logits in "
                         "units of s_q s_k scale > 0")
    dev = dp.device
    unit = ivit_scale(ob) if name == _IVIT else ibert_scale(ob)
    # the fused kernels (lowprec.gpu.ivit_kernel): the float32 order without a mask
    fused = not ex and dp.mask is None and fused_kernels(dp)
    qz = quantize_problem(dp, "per_tensor", 128, scope, codes_kv=fused)
    group = _groups(dp, scope)
    hs = qz.host  # (the scales' host copies, read back by quantize_problem)
    sq_h = hs["sq"][:, 0] if hs is not None else qz.sq_row[:, 0].cpu().numpy()
    sk_h = hs["sk"] if hs is not None else qz.sk.cpu().numpy()
    s_ent = (sq_h.astype(np.float64) * sk_h.astype(np.float64) * dp.scale).astype(np.float32)
    s_row = torch.from_numpy(s_ent.astype(np.float64)).to(dev)
    req = None
    s_in = s_ent
    if lb is not None:  # pass: the logits' range per entry, then per group
        qmax = 2 ** (lb - 1) - 1
        if fused:
            amax = _fused_amax(dp, qz, s_row)
        else:
            amax = _logit_amax(dp, qz, s_row, scope)
        am = _per_group(amax.cpu().numpy(), group, np.max)
        s_x = np.array([np.float32(float(a) / qmax) if a > 0 else np.float32(1.0)
                        for a in am], dtype=np.float32)
        req = (torch.from_numpy(s_x.astype(np.float64)).to(dev), float(qmax))
        s_in = s_x
    s_in = np.where(s_in > 0, s_in, np.float32(1.0)).astype(np.float32)
    if fused:
        run = _ivit_fused if name == _IVIT else _ibert_fused
        return run(dp, qz, group, s_in, s_row, req, ob, unit, return_stats)
    run = _exact_rows if ex else _f32_rows
    y_of, counts = run(dp, qz, name, group, s_in, s_row, req, ob)
    return _finish(dp, qz, unit, y_of, counts, return_stats)


def _logit_amax(dp: DeviceProblem, qz, s_row, scope: str):
    """float32 ``(B,)``: per entry the largest ``|x|`` of the visible, non-NaN logits of the
    rows taking part (the CPU's ``_logit_amax``), a pass over the chunks."""
    import torch

    part = dp.taking_part()[0] if scope == "visible" else None
    amax = torch.zeros(dp.B, dtype=torch.float32, device=dp.device)
    for g0, g1, r0, r1 in chunks(dp):
        x, vis, ent = _logits(dp, qz, g0, g1, r0, r1, s_row, None)
        a = x.abs()
        keep = ~torch.isnan(a) if vis is None else vis & ~torch.isnan(a)
        if part is not None:
            keep = keep & part[g0:g1, r0:r1].reshape(-1)[:, None]
        ra = torch.where(keep, a, 0.0).amax(dim=1)
        amax = amax.scatter_reduce(0, ent, ra, reduce="amax")
    return amax


def _fused_amax(dp: DeviceProblem, qz, s_row):
    """:func:`_logit_amax` without a mask from the kernel's per-row largest visible ``|S|``:
    ``|x| = fp32(fp64(|S|) s_ent)`` is monotone in ``|S|`` (and never NaN), and a row that
    sees no key (the only rows that do not take part) gives 0."""
    import torch

    from ..gpu.ivit_kernel import row_absmax

    k8, _ = qz.int8_kv()
    top = row_absmax(qz.q8i, k8, causal=dp.causal).amax(dim=1)
    return (top.double() * s_row).to(torch.float32)


def _group_scales(name: str, group, s_in):
    """``(first, kc, s_chk)``: the checked logit unit of each group (``_check_scale``) and
    I-BERT's constants, once per group in group order as the CPU checks them, and the unit of
    every entry (float32 ``(B,)``)."""
    first, kc = {}, {}
    for b in range(len(group)):
        if group[b] not in first:
            first[group[b]] = s = _check_scale(float(s_in[b]))
            if name == _IBERT:
                kc[group[b]] = _ibert_consts(s, False)
    return first, kc, np.array([first[g] for g in group], dtype=np.float32)


def _ivit_x0(s_chk):
    """I-ViT's ``x0 = floor(-fl32(1 / s))`` and ``n x0`` per entry (float32, the CPU's)."""
    x0 = np.array([np.float32(np.floor(-_div_py(1.0, s))) for s in s_chk], np.float32)
    return x0, (np.float32(IVIT_N) * x0).astype(np.float32)


def _ivit_fused(dp: DeviceProblem, qz, group, s_in, s_row, req, ob: int, unit: float,
                return_stats: bool):
    """``ivit`` (float32 order, no mask) by the fused kernel (:mod:`lowprec.gpu.ivit_kernel`):
    ``(out, DeviceStats)``, the counters reduced on the device from the kernel's per-row
    columns (no read-back in the call)."""
    import torch

    from ..gpu.ivit_kernel import ivit_rows

    dev = dp.device
    s_chk = _group_scales(_IVIT, group, s_in)[2]
    x0, nx0 = _ivit_x0(s_chk)
    cst = torch.from_numpy(np.stack([s_chk, x0, nx0], axis=1).astype(np.float32)).to(dev)
    k8, v8 = qz.int8_kv()
    svu = qz.sv.double() * unit  # (exact: a power of two)
    out, info = ivit_rows(qz.q8i, k8, v8, s_row, s_row if req is None else req[0], cst, svu,
                          qmax=0 if req is None else int(req[1]), out_bits=ob,
                          causal=dp.causal, requant=req is not None)
    return out, (_fused_stats(dp, info, unit, _C_SUM) if return_stats else None)


def _ibert_mult(first, group, em):
    """I-BERT's multiplier per entry, float64 ``(m31, 2**-shift)`` ``(B,)`` each, from the
    group's ``max(e)`` (``em``, per entry) as the CPU's ``_ibert_core`` (0, 0 for a group
    without a positive ``e``)."""
    B = len(group)
    m31 = np.zeros(B, np.float64)
    inv = np.zeros(B, np.float64)
    for g in first:
        sel = group == g
        s = np.float32(first[g])
        e_g = np.float32(em[sel][0])
        if e_g > 0:
            s_e = np.float32(np.float32(np.float32(IBERT_A) * np.float32(s * s))
                             / np.float32(2.0**IBERT_N))
            s16 = np.float32(np.float32(e_g * s_e) / np.float32(IBERT_E16_MAX))
            mm, sh = _frexp_multiplier(float(s_e) / float(s16))
            m31[sel], inv[sel] = float(mm), math.ldexp(1.0, -sh)
    return m31, inv


def _ibert_cst(kc, group, s_chk):
    """float32 ``(B, 5)``: ``(s, x0i, n x0i, bi, ci)`` of every entry's group."""
    x0 = np.array([kc[g][0] for g in group], np.float32)
    return np.stack([s_chk, x0, (np.float32(IBERT_N) * x0).astype(np.float32),
                     np.array([kc[g][1] for g in group], np.float32),
                     np.array([kc[g][2] for g in group], np.float32)], axis=1)


def _ibert_fused(dp: DeviceProblem, qz, group, s_in, s_row, req, ob: int, unit: float,
                 return_stats: bool):
    """``ibert`` (float32 order, no mask) by the fused kernels (:mod:`lowprec.gpu.ivit_kernel`):
    per row the largest ``e`` (:func:`~lowprec.gpu.ivit_kernel.ibert_emax`), read back per
    entry, the group's multiplier on the host (:func:`_ibert_mult`), then the rows
    (:func:`~lowprec.gpu.ivit_kernel.ibert_rows`); ``(out, DeviceStats)``."""
    import torch

    from ..gpu.ivit_kernel import ibert_emax, ibert_rows

    dev = dp.device
    first, kc, s_chk = _group_scales(_IBERT, group, s_in)
    cst = torch.from_numpy(_ibert_cst(kc, group, s_chk).astype(np.float32)).to(dev)
    k8, v8 = qz.int8_kv()
    sx = s_row if req is None else req[0]
    kw = dict(qmax=0 if req is None else int(req[1]), causal=dp.causal,
              requant=req is not None)
    er, scan = ibert_emax(qz.q8i, k8, s_row, sx, cst, with_scan=True, **kw)
    emax = er.amax(dim=1) if dp.Lq else er.new_full((dp.B,), -1.0)
    em = _per_group(emax.cpu().numpy(), group, np.max)
    m31, inv = _ibert_mult(first, group, em)
    mul = torch.from_numpy(np.stack([m31, inv], axis=1)).to(dev)
    svu = qz.sv.double() * unit  # (exact: a power of two)
    out, info = ibert_rows(qz.q8i, k8, v8, s_row, sx, cst, mul, svu, out_bits=ob, scan=scan,
                           **kw)
    return out, (_fused_stats(dp, info, unit, _C_REQ) if return_stats else None)


def _fused_stats(dp: DeviceProblem, info, unit: float, col2: int):
    """:class:`~.device_rows.DeviceStats` of a fused kernel's per-row columns ``info``
    (``col2``: the counter of its third column, I-ViT's sum or I-BERT's requantisation
    clamps), reduced on the device (no read-back in the call)."""
    import torch

    from ..gpu.ivit_kernel import STATE_BAD, STATE_EMPTY, STATE_ROW

    state = info[..., 0]
    full = 1.0 / unit
    tot = info[..., 1:4].sum(dim=(0, 1))
    counts = torch.zeros(_NCOUNT, dtype=torch.int64, device=info.device)
    counts[_C_EMPTY] = (state == STATE_EMPTY).sum()
    counts[_C_NAN] = (state == STATE_BAD).sum()
    counts[_C_FLOOR] = tot[0]
    counts[col2] = tot[1]
    counts[_C_ZERO] = tot[2]
    # unnormalized(): not |sum y - full| <= NORM_TOL full in float64, among the rows not NaN
    near = (info[..., 4].double() - full).abs() <= NORM_TOL * full
    off = ((state == STATE_ROW) & ~near).sum(dtype=torch.int64).reshape(1)
    rows = dp.B * dp.Lq

    def build(host):
        st = _stats_from(np.asarray(host[:_NCOUNT], dtype=np.int64), rows)
        st.unnormalized_rows = int(host[_NCOUNT])
        return st

    return DeviceStats([counts, off], build)


def _f32_rows(dp: DeviceProblem, qz, name: str, group, s_in, s_row, req, ob: int):
    """The float32-order surrogate: its group constants (host, the CPU's checks in group
    order) and earlier passes; returns ``(y_of(g0, g1, r0, r1) -> y, counts)``."""
    import torch

    B, dev = dp.B, dp.device
    first, kc, s_chk = _group_scales(name, group, s_in)
    pow2 = _pow2_table(IVIT_N if name == _IVIT else IBERT_N, dev)
    counts = torch.zeros(_NCOUNT, dtype=torch.int64, device=dev)
    if name == _IVIT:
        x0, nx0 = _ivit_x0(s_chk)
        cst = _Consts(dev, s=s_chk, x0=x0, nx0=nx0)
    else:
        c5 = _ibert_cst(kc, group, s_chk)
        cst = _Consts(dev, s=s_chk, x0=c5[:, 1], nx0=c5[:, 2], bi=c5[:, 3], ci=c5[:, 4])
        emax = torch.full((B,), -1.0, dtype=torch.float32, device=dev)
        for g0, g1, r0, r1 in chunks(dp):  # pass: max(e) per entry, then per group
            x, vis, ent = _logits(dp, qz, g0, g1, r0, r1, s_row, req)
            e, ok = _ibert_e(x, _use(x, vis), cst, ent, pow2)[:2]
            re = torch.where(ok, e, -1.0).amax(dim=1)
            emax = emax.scatter_reduce(0, ent, re, reduce="amax")
        m31, inv = _ibert_mult(first, group, _per_group(emax.cpu().numpy(), group, np.max))
        m31_t, inv_t = torch.from_numpy(m31).to(dev), torch.from_numpy(inv).to(dev)

    def y_of(g0, g1, r0, r1):
        x, vis, ent = _logits(dp, qz, g0, g1, r0, r1, s_row, req)
        use = _use(x, vis)
        if name == _IVIT:
            return _ivit_rows(x, use, cst, ent, pow2, ob, counts)
        e, ok, good, empty, bad, ncl = _ibert_e(x, use, cst, ent, pow2)
        counts[_C_EMPTY] += empty.sum()
        counts[_C_NAN] += bad.sum()
        counts[_C_FLOOR] += ncl
        return _ibert_norm(e, ok, good, ent, m31_t, inv_t, ob, counts)

    return y_of, counts


def _shl(a, k):
    """``a << k`` (int64 tensors; ``k`` clamped to ``[0, 63]``: the callers select the
    entries where it is in range)."""
    return torch_shift(a, k, left=True)


def torch_shift(a, k, left: bool):
    """``a << k`` or ``a >> k`` (arithmetic) with ``k`` clamped to ``[0, 63]``."""
    import torch

    k = torch.clamp(k, 0, 63) if not isinstance(k, int) else min(max(k, 0), 63)
    return torch.bitwise_left_shift(a, k) if left else torch.bitwise_right_shift(a, k)


def _pow2_f64(k):
    """float64 ``2**k`` of an int64 tensor, built from its bits (k clamped to the normal
    range ``[-1022, 1023]``)."""
    import torch

    kk = torch.clamp(k, -1022, 1023)
    return ((kk + 1023) << 52).view(torch.float64)


def mul_shift_rne(z, m: int, k):
    """``_baselines_exact._mul_shift_rne`` on int64 tensors: ``RNE(z * m / 2**k)`` exactly for
    ``0 <= z < 2**62``, ``0 <= m <= 2**31`` and int64 ``k`` (the 93-bit product in two
    31-bit halves; results above about ``2**50`` are ``2**62``)."""
    import torch

    low31 = _LOW31
    sat = (z.double() * float(m)) * _pow2_f64(-k) > 2.0**50
    zh, zl = z >> 31, z & low31
    hi, lo = zh * m, zl * m
    r0 = _shl(_shl(hi, torch.full_like(k, 31)) + lo, -k)  # k <= 0
    k1 = torch.clamp(k, 1, 31)
    q1 = _shl(hi, 31 - k1) + torch_shift(lo, k1, left=False)
    rem = lo & (_shl(torch.ones_like(k1), k1) - 1)
    half = _shl(torch.ones_like(k1), k1 - 1)
    q1 = q1 + ((rem > half) | ((rem == half) & ((q1 & 1) == 1))).to(torch.int64)
    c = hi + (lo >> 31)
    low = lo & low31
    kk = torch.clamp(k - 31, 1, 62)
    q2 = torch_shift(c, kk, left=False)
    rh = c & (_shl(torch.ones_like(kk), kk) - 1)
    hh = _shl(torch.ones_like(kk), kk - 1)
    q2 = q2 + ((rh > hh) | ((rh == hh) & ((low > 0) | ((q2 & 1) == 1)))).to(torch.int64)
    q2 = torch.where(k - 31 >= 63, 0, q2)
    v = torch.where(k <= 0, r0, torch.where(k <= 31, q1, q2))
    v = torch.where(sat, 2**62, v)
    return torch.where((z == 0) | (m == 0), 0, v)


def _exact_scan(x, use, s64):
    """``(xi = RNE(x / s) int64, row max m, used entries, good, empty, bad rows)``."""
    import torch

    cnt = use.sum(dim=1)
    bad = (use & ~(x < math.inf)).any(dim=1) & (cnt > 0)
    good = (cnt > 0) & ~bad
    ok = use & good[:, None]
    xi = torch.where(ok, (x.double() / s64[:, None]).round(), 0.0).to(torch.int64)
    m = torch.where(ok, xi, -(2**62)).amax(dim=1)
    m = torch.where(good, m, 0)
    return torch.where(ok, xi, m[:, None]), m, ok, good, cnt == 0, bad


def _exact_rows(dp: DeviceProblem, qz, name: str, group, s_in, s_row, req, ob: int):
    """The exact integer surrogate (``exact=True``, ``_baselines_exact``): the group checks
    and constants in the CPU's order (``_check_scale``, ``_ibert_consts``,
    ``_check_exact_range`` on the group's largest finite ``|x|``, read back per entry), I-BERT's
    ``max e`` in an earlier pass; returns ``(y_of(chunk) -> y, counts)``."""
    import torch

    B, dev = dp.B, dp.device
    amax = torch.zeros(B, dtype=torch.float32, device=dev)
    for g0, g1, r0, r1 in chunks(dp):  # pass: the largest finite |x| (every entry, as the CPU)
        x, _, ent = _logits(dp, qz, g0, g1, r0, r1, s_row, req)
        a = torch.where(torch.isfinite(x), x.abs(), 0.0).amax(dim=1)
        amax = amax.scatter_reduce(0, ent, a, reduce="amax")
    am = _per_group(amax.cpu().numpy(), group, np.max)
    first, kc = {}, {}
    for b in range(B):
        g = group[b]
        if g in first:
            continue
        first[g] = sg = _check_scale(float(s_in[b]))
        if name == _IBERT:
            kc[g] = _ibert_consts(sg, True)
        _check_exact_range(np.array([am[b]], np.float32), sg)
        if name == _IVIT:
            kc[g] = (_floor_frac(-1.0, sg),)
    s64 = torch.from_numpy(np.array([float(first[g]) for g in group])).to(dev)
    cols = list(zip(*(kc[g] for g in group), strict=True))
    k_t = [torch.tensor([int(v) for v in col], dtype=torch.int64, device=dev) for col in cols]
    counts = torch.zeros(_NCOUNT, dtype=torch.int64, device=dev)
    n = IVIT_N if name == _IVIT else IBERT_N
    sh_out = 32 - ob

    def first_pass(g0, g1, r0, r1):
        x, vis, ent = _logits(dp, qz, g0, g1, r0, r1, s_row, req)
        xi, m, ok, good, empty, bad = _exact_scan(x, _use(x, vis), s64[ent])
        x0 = k_t[0][ent][:, None]
        t = xi - m[:, None]
        if name == _IVIT:
            t = t + (t >> 1) - (t >> 4)
        cl = t < n * x0
        t = torch.where(cl, n * x0, t)
        q = torch.div(t, x0, rounding_mode="floor")
        rr = t - x0 * q
        return ent, ok, good, empty, bad, (cl & ok).sum(), q, rr

    if name == _IBERT:
        emax = torch.full((B,), -1.0, dtype=torch.float64, device=dev)
        for g0, g1, r0, r1 in chunks(dp):  # pass: max z 2**(n - q) per entry, then group
            ent, ok, _, _, _, _, q, rr = first_pass(g0, g1, r0, r1)
            zz = torch.clamp(rr * (rr + k_t[1][ent][:, None]) + k_t[2][ent][:, None], min=0)
            ev = torch.where(ok, zz.double() * _pow2_f64(n - q), -1.0)
            emax = emax.scatter_reduce(0, ent, ev.amax(dim=1), reduce="amax")
        em = _per_group(emax.cpu().numpy(), group, np.max)
        mult = {}
        for b in range(B):
            if group[b] not in mult:
                mult[group[b]] = _frexp_multiplier(IBERT_E16_MAX / float(em[b])) \
                    if em[b] > 0 else (0, 0)
        m31_ent = torch.tensor([mult[g][0] for g in group], dtype=torch.int64, device=dev)
        sh_ent = torch.tensor([mult[g][1] for g in group], dtype=torch.int64, device=dev)

    def y_of(g0, g1, r0, r1):
        ent, ok, good, empty, bad, ncl, q, rr = first_pass(g0, g1, r0, r1)
        counts[_C_EMPTY] += empty.sum()
        counts[_C_NAN] += bad.sum()
        counts[_C_FLOOR] += ncl
        if name == _IVIT:
            x0 = k_t[0][ent][:, None]
            w = rr - 2 * x0
            k = n - q
            ev = torch.where(k >= 1, _shl(w, k - 1), torch_shift(w, 1 - k, left=False))
            e = torch.where(ok, torch.clamp(ev, min=0), 0)
            z = torch.clamp(e, max=IVIT_SUM_MAX).sum(dim=1)
            sc = z >= IVIT_SUM_MAX
            z = torch.clamp(z, max=IVIT_SUM_MAX)
            counts[_C_SUM] += (sc & good).sum()
            live = good
            f = torch.div(torch.full_like(z, 2**31), torch.clamp(z, min=1), rounding_mode="floor")
        else:
            zz = torch.clamp(rr * (rr + k_t[1][ent][:, None]) + k_t[2][ent][:, None], min=0)
            live = good & (m31_ent[ent] > 0)
            m31 = m31_ent[ent][:, None]
            v = torch.zeros_like(zz)
            for mv in torch.unique(m31_ent).tolist():  # the multiplier is one per group
                sel = m31 == mv
                vv = mul_shift_rne(zz, int(mv), sh_ent[ent][:, None] - (n - q))
                v = torch.where(sel, vv, v)
            req_n = ok & live[:, None] & (v > IBERT_E16_MAX)
            counts[_C_REQ] += req_n.sum()
            e = torch.where(ok, torch.clamp(v, max=IBERT_E16_MAX), 0)
            z = e.sum(dim=1)
            f = torch.div(torch.full_like(z, 2**32), torch.clamp(z, min=1), rounding_mode="floor")
        y = torch.where(ok, (e * f[:, None]) >> sh_out, 0)
        counts[_C_ZERO] += (ok & live[:, None] & (y == 0)).sum()
        return torch.where(live[:, None], y.to(torch.float32), math.nan)

    return y_of, counts


def _finish(dp: DeviceProblem, qz, unit: float, y_of, counts, return_stats: bool):
    """The exact ``O = P v8`` of the surrogate's rows ``y_of(chunk)`` (NaN rows out NaN),
    ``fl32(O (s_v unit))`` and the statistics."""
    import torch

    B, Lk, dev = dp.B, dp.Lk, dp.device
    out = torch.empty((B, dp.Lq, dp.dv), dtype=torch.float32, device=dev)
    rowsum = torch.zeros((B, dp.Lq), dtype=torch.float64, device=dev)
    badrows = torch.zeros((B, dp.Lq), dtype=torch.bool, device=dev)
    sv_unit = qz.sv.double() * unit
    for g0, g1, r0, r1 in chunks(dp):
        gh, rows = g1 - g0, r1 - r0
        y = y_of(g0, g1, r0, r1)
        nan = torch.isnan(y[:, 0])
        P = torch.where(nan[:, None], 0.0, y).double()
        rowsum[g0:g1, r0:r1] = P.sum(dim=1).reshape(gh, rows)
        badrows[g0:g1, r0:r1] = nan.reshape(gh, rows)
        O = torch.matmul(P.reshape(gh, rows, Lk), qz.v8(g0, g1))
        o = (O * sv_unit[g0:g1, None, None]).to(torch.float32)
        out[g0:g1, r0:r1] = torch.where(nan.reshape(gh, rows, 1), math.nan, o)
    if not return_stats:
        return out, None
    st = _stats_from(counts.cpu().numpy(), B * dp.Lq)
    st.unnormalized_rows = unnormalized(rowsum.reshape(-1).cpu().numpy(), 1.0 / unit,
                                        ~badrows.reshape(-1).cpu().numpy())
    return out, st


def ivit_attention(dp: DeviceProblem, return_stats: bool, out_bits: int = IVIT_ATTN_OUT_BITS,
                   exact: bool = False, logit_bits=IVIT_ATTN_LOGIT_BITS,
                   scale_scope: str = "visible"):
    """Scheme ``ivit`` on the device (``baselines._ivit_attention``'s options, checks,
    messages and statistics, ``exact=True`` included)."""
    return _attention(dp, return_stats, _IVIT, out_bits, exact, logit_bits, scale_scope)


def ibert_attention(dp: DeviceProblem, return_stats: bool, out_bits: int = 8,
                    exact: bool = False, logit_bits=None, scale_scope: str = "visible"):
    """Scheme ``ibert`` on the device (``baselines._ibert_attention``'s options, checks,
    messages and statistics, ``exact=True`` included)."""
    return _attention(dp, return_stats, _IBERT, out_bits, exact, logit_bits, scale_scope)


__all__ = ["ivit_attention", "ibert_attention", "BaselineStats"]
