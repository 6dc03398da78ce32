"""Device path of :mod:`.intflash`'s scheme ``intflash`` (both variants, every option): the CPU
pipeline (:func:`.intflash._intflash`, Algorithm 1 in ``intflash._intflash_kernel``) in torch
operations on the tensors' device, bit-identical to the CPU path with equal statistics
(docs/design.md "Row-wise schemes on the device").

Quantization (``intflash.quantize_inputs``): per-token scales of q and k, one per entry for v
(from the keys that take part with ``scale_scope="visible"``), each ``fl32(amax / 127)`` (a
float64 division by a device tensor, rounded once; 0 for a zero row, whose codes are 0) or,
with ``scale_dtype="float16"``, ``f16(amax16 / 127)`` and ``RNE(f16(x16 / s))`` (float32
divisions rounded to float16: NumPy's float16 arithmetic); codes ``clamp(RNE(fl64(x) / s))``
(:func:`~.device_rows.codes`); the saturation counters as the CPU's.  Key codes and scales are
made once per stored key/value head and read by index (GQA).

Per row chunk (whole query tiles; memory O(chunk x Lk)) the exact scores ``q8 k8^T`` (float64
GEMM of integers), ``S = fp32(fp32(fp32(S) s_q) s_k)``, ``Y = fp32(S c)`` (+ ``fp32(mask
fp32(log2 e))``), then all key tiles of the chunk's rows at once where the order does not
matter: each tile's row maximum (a max, order-free; NaN ignored as the CPU's maximum on the
bits ignores x86's negative default NaN), the running maxima ``m_t`` (a cumulative max), ``p
= exp2(fp32(Y - m_t))`` and ``alpha = exp2(fp32(m_{t-1} - m_t))`` by the CPU's float32 exp2
(:func:`._fp_device.exp2_f32`: exact), the tile sums ``l_t`` left to right
(:func:`lowprec.gpu.rowsum.seq_rowsum`), ``P8`` from the CPU's own table (``intflash._P8``,
indexed by the float16 bits of ``p``); then the tiles in order: ``T`` (full: the exact ``P8
v8`` of the tile, ``fp32(fp32(fp32(T) s_v) / 127)``; half: ``sum_j fp32(f16(p_j) v_j)`` left
to right, :func:`seq_rowsum` of the exact products), ``l = fp32(fp32(l alpha) + l_t)``, ``acc
= fp32(fp32(acc alpha) + T)`` for the rows whose tile holds a visible key (the others are left
untouched, as the CPU leaves them); finally ``f16(fp32(acc / l))``.  Every step is an integer
operation, one IEEE float32/float64 operation (separate torch operations: no contraction), a
max, a table read, a sequential sum in the CPU's order or the CPU's exp2: bit-identical by
construction.  Statistics per (entry, query tile, key tile) from the visibility (a pair is
skipped when none of its keys is visible to any of its rows), the rescales and float16
overflows per row, summed per entry.

Calls without a mask (CUDA tensors or Triton's interpreter: :func:`_fused_ok`) run all of
this for every row in one Triton kernel instead (:mod:`lowprec.gpu.intflash_kernel`, the same
steps; the exp2 of :mod:`lowprec.gpu.exp2f`, the sequential sums as FMA dots of exact
products): int8 codes in one pass, v's once per stored head (every key takes part), the tile
counts from the shape (:func:`tile_counts`).

The CPU's float16 rounding of the output takes its sign from ``x < 0``: ``fp32(acc / l) = -0``
(possible with subnormal v scales) gives ``+0``, a tiny negative ``-0``; torch's cast keeps
``-0``, so zeros are made ``+0`` after it.

Not mirrored: the CPU's row maximum over NaN on the bits (the NaN of ``inf * 0`` from scores
overflowing float32, inputs beyond ~1e18) takes x86's negative NaN as smallest; a CPU whose NaN
is positive (ARM) would differ there, and so does nothing here but the ``rescales`` count of
such rows (their outputs are NaN either way).
"""

from __future__ import annotations

import math

import numpy as np

from ._fp_device import exp2_f32
from ._int8 import FINITE_WHY
from .device_rows import (
    DeviceProblem,
    check_finite,
    chunks,
    codes,
    fused_kernels,
    row_amax,
)
from .intflash import (
    _C_F16_OVF,
    _C_RESCALES,
    _C_SKIPPED,
    _C_TILES,
    _LOG2E_F32,
    _NCOUNT,
    _P8,
    BLOCK_K_DEFAULT,
    BLOCK_Q_DEFAULT,
    INT8_QMAX,
    IntFlashStats,
    _stats,
    intflash_options,
    score_unit,
)

_F16_WHY = "input does not fit float16 (|x| > 65504) for scale_dtype 'float16'"


def _const(value: float, dtype, dev):
    """A 0-d tensor on ``dev``: a divisor must be a device tensor (torch's CUDA division by a
    host scalar multiplies by its rounded reciprocal, not IEEE division)."""
    import torch

    return torch.full((), value, dtype=dtype, device=dev)


def quantize_rows(x, scale_dtype: str):
    """``intflash._quantize`` of every row of ``x (..., D)`` (float32): ``(codes float64,
    scales float32 (...), saturated int64 (...))``; the caller has checked that ``x`` is
    finite (and fits float16 for ``scale_dtype="float16"``)."""
    import torch

    dev = x.device
    if scale_dtype == "float16":
        x16 = x.to(torch.float16)
        if x.shape[-1]:
            amax = x16.abs().amax(dim=-1)
        else:
            amax = torch.zeros(x.shape[:-1], dtype=torch.float16, device=dev)
        s = (amax.float() / _const(INT8_QMAX, torch.float32, dev)).to(torch.float16)
        r = (x16.float() / s.float()[..., None]).to(torch.float16).double().round()
        r = torch.where((s == 0)[..., None], 0.0, r)
        sat = ((r > INT8_QMAX) | (r < -INT8_QMAX)).sum(dim=-1)
        return r.clamp(-INT8_QMAX, INT8_QMAX), s.float(), sat
    s = (row_amax(x) / _const(INT8_QMAX, torch.float64, dev)).float()
    zero = s == 0
    c = codes(x, torch.where(zero, 1.0, s))
    c = torch.where(zero[..., None], 0.0, c)
    return c, s, _saturated(x, s, zero, 1)


def _saturated(x, s, zero, per: int):
    """Codes of ``x`` that saturated, ``|x| > 127.5 s`` (``ROUND_LIMIT * s``: exact in
    float64), rows with a zero scale left out: counts over the last ``per`` dims of ``x`` (1:
    per row, with ``s`` and ``zero`` of ``x.shape[:-1]``; 2: per entry, with ``(N,)``)."""
    ex = (...,) + (None,) * per
    big = x.double().abs() > 127.5 * s.double()[ex]
    return (big & ~zero[ex]).sum(dim=tuple(range(-per, 0)))


def _check_inputs(dp: DeviceProblem, keys, scale_dtype: str):
    """The CPU's input errors in its order (``intflash.quantize_inputs``): NaN or Inf in q, k
    or a v that takes part (``keys (B, Lk)``, None: every key), then, with
    ``scale_dtype="float16"``, values beyond float16."""
    import torch

    def seen(flags):
        return flags if keys is None else flags & keys

    vbad = ~torch.isfinite(dp.v).all(dim=-1)[dp.kv]  # (B, Lk): a key with NaN/Inf in v
    for name, bad in (("q", ~torch.isfinite(dp.q).all()), ("k", ~torch.isfinite(dp.k).all()),
                      ("v", seen(vbad).any())):
        if bool(bad):
            raise ValueError(f"{name} contains NaN or Inf; {FINITE_WHY}")
    if scale_dtype == "float16":
        v16 = seen(torch.isinf(dp.v.to(torch.float16)).any(dim=-1)[dp.kv])
        for bad in (torch.isinf(dp.q.to(torch.float16)).any(),
                    torch.isinf(dp.k.to(torch.float16)).any(), v16.any()):
            if bool(bad):
                raise ValueError(_F16_WHY)


def _check_amax(amax, stats: bool) -> list:
    """The CPU's NaN / Inf errors of q, k, v (:func:`_check_inputs` without a mask, in its
    order) from their row maxima ``amax`` (NaN / Inf iff the tensor holds one; every stored
    key/value head is some entry's), in one read-back; with ``stats`` the same read-back
    tells, per tensor, whether a nonzero row maximum is below ``127 * 2**-126`` (a subnormal
    scale: saturations to count)."""
    import torch

    parts = [a.amax().reshape(1) for a in amax]
    if stats:
        low = _const(INT8_QMAX * 2.0**-126, torch.float64, amax[0].device)
        parts += [((a > 0) & (a < low)).any().reshape(1).double() for a in amax]
    host = torch.cat(parts).cpu().numpy()
    check_finite(host[:3])
    return [bool(x) for x in host[3:]] if stats else [False] * 3


def _half_v(dp: DeviceProblem):
    """v in float16 (variant ``"half"``), with the CPU's error when it does not fit."""
    import torch

    vh = dp.v.to(torch.float16)
    if bool(torch.isinf(vh).any()):
        raise ValueError("v does not fit float16 (|v| > 65504) for variant 'half'")
    return vh


class _Inputs:
    """The quantized inputs of a call on the device (``intflash.quantize_inputs``)."""

    def __init__(self, dp: DeviceProblem, scope: str, half: bool, scale_dtype: str):
        import torch

        self.dp, self.half, self.scale_dtype = dp, half, scale_dtype
        dev = dp.device
        self.keys = None
        if scope == "visible" and not half:
            self.keys = dp.taking_part()[1]  # v's keys that take part, per query entry
        _check_inputs(dp, self.keys, scale_dtype)
        self.q8, self.sq, satq = quantize_rows(dp.q, scale_dtype)
        self.k8, self.sk, satk = quantize_rows(dp.k, scale_dtype)  # per stored head
        B = dp.B
        self.vh = None
        if half:
            self.vh = _half_v(dp).float()
            sv = torch.zeros(B, dtype=torch.float32, device=dev)
            satv = 0
        else:
            sv, satv = self._v_scales()
        self.sv = sv
        self.saturated = (int(satq.sum()), int(satk.sum(dim=1)[dp.kv].sum()), int(satv))
        self._cache = None

    def _v_entry(self, b0: int, b1: int):
        """float32 ``(b1 - b0, Lk, dv)``: the v of entries ``b0 .. b1 - 1``, zero at keys that
        do not take part (``_intflash``'s ``np.where(keys, v, 0)``)."""
        v = self.dp.v[self.dp.kv[b0:b1]]
        return v if self.keys is None else _zero_keys(self.keys[b0:b1], v)

    def _v_scales(self):
        """v's per-entry scales and saturation count (all entries, in blocks of entries)."""
        import torch

        dp = self.dp
        sv = torch.empty(dp.B, dtype=torch.float32, device=dp.device)
        sat = torch.zeros((), dtype=torch.int64, device=dp.device)
        step = max(1, (1 << 24) // max(dp.Lk * max(dp.dv, 1), 1))
        for b0 in range(0, dp.B, step):
            b1 = min(dp.B, b0 + step)
            v = self._v_entry(b0, b1)
            _, s, n = quantize_rows(v.reshape(b1 - b0, -1), self.scale_dtype)
            sv[b0:b1] = s
            sat += n.sum()
        return sv, sat

    def v_tiles(self, g0: int, g1: int, Lp: int):
        """Entries ``g0 .. g1 - 1``: full, v's codes float64 ``(gh, Lp, dv)``; half, v's
        float16 values transposed, float32 ``(gh, dv, Lp)``; zero keys up to ``Lp``."""
        import torch

        if self._cache is not None and self._cache[0] == (g0, g1):
            return self._cache[1]
        dp = self.dp
        if self.half:
            t = self.vh[dp.kv[g0:g1]].transpose(1, 2)
        else:
            v = self._v_entry(g0, g1)
            t = quantize_rows(v.reshape(g1 - g0, -1), self.scale_dtype)[0].reshape(v.shape)
        pad = Lp - dp.Lk
        if pad:
            t = torch.nn.functional.pad(t, (0, pad) if self.half else (0, 0, 0, pad))
        self._cache = ((g0, g1), t)
        return t


def _zero_keys(keys, v):
    """``v (n, Lk, dv)`` with the rows of keys not in ``keys (n, Lk)`` set to 0."""
    import torch

    return torch.where(keys[..., None], v, torch.zeros((), dtype=v.dtype, device=v.device))


def _p8(p, table):
    """``trunc(f16(f16(f16(p) 127) + 0.5))`` of float32 ``p`` in [0, 1] from the CPU's table
    (float64; NaN stays NaN)."""
    import torch

    idx = p.to(torch.float16).view(torch.int16).to(torch.int64)
    ok = (idx >= 0) & (idx < table.numel())
    val = table[torch.where(ok, idx, 0)]
    return torch.where(torch.isnan(p), math.nan, val)


def _chunk(dp: DeviceProblem, qi: _Inputs, g0, g1, r0, r1, Br: int, Bc: int, c32, p8tab,
           cnt, out):
    """Algorithm 1 for the rows of one chunk (all key tiles); adds the per-entry counters to
    ``cnt`` (device int64 ``(B, _NCOUNT)``) and writes ``out``."""
    import torch

    from ..gpu.rowsum import seq_rowsum

    dev = dp.device
    gh, rows = g1 - g0, r1 - r0
    n = gh * rows
    Lk, dv = dp.Lk, dp.dv
    nk = -(-Lk // Bc)
    Lp = nk * Bc
    idx = dp.kv[g0:g1]
    S = torch.matmul(qi.q8[g0:g1, r0:r1], qi.k8[idx].transpose(1, 2))  # exact integers
    y = (S.to(torch.float32) * qi.sq[g0:g1, r0:r1, None]) * qi.sk[idx][:, None, :]
    y = y * c32
    vis = None
    if dp.mask is not None:
        plane = dp.mask[dp.mask_map[g0:g1]][:, r0:r1]
        y = y + plane * _const(float(_LOG2E_F32), torch.float32, dev)
        vis = (plane != -math.inf).reshape(n, Lk)
    lim = dp.row_limits(r0, r1).repeat(gh)
    cols = torch.arange(Lp, device=dev)
    incl = cols[None, :] <= lim[:, None]  # the keys the CPU's loop visits (causal: j <= lim)
    y = torch.nn.functional.pad(y.reshape(n, Lk), (0, Lp - Lk), value=-math.inf)
    yt = torch.where(incl & ~torch.isnan(y), y, -math.inf).reshape(n, nk, Bc)
    rmax = yt.amax(dim=2)  # (n, nk)
    upd = rmax != -math.inf  # rows a tile updates
    mrun = torch.cummax(rmax, dim=1).values
    ninf = torch.full((n, 1), -math.inf, dtype=torch.float32, device=dev)
    mprev = torch.cat([ninf, mrun[:, :-1]], dim=1)
    use = incl.reshape(n, nk, Bc) & upd[:, :, None]
    p = torch.where(use, exp2_f32(y.reshape(n, nk, Bc) - mrun[:, :, None]), 0.0)
    lt = seq_rowsum(p.reshape(n * nk, Bc)).reshape(n, nk)
    alpha = exp2_f32(mprev - mrun)
    resc = upd & (mprev != -math.inf) & (mrun != mprev)

    # tiles that a row of the chunk updates (causal: the last row's limit bounds them)
    t_end = nk if not dp.causal else max(0, min(nk, (r1 - 1 + Lk - dp.Lq) // Bc + 1))
    vt = qi.v_tiles(g0, g1, Lp)
    lsum = torch.ones(n, dtype=torch.float32, device=dev)
    acc = torch.zeros((n, dv), dtype=torch.float32, device=dev)
    f127 = _const(float(INT8_QMAX), torch.float32, dev)
    sv = qi.sv[g0:g1, None, None]
    if qi.half:
        ph = p.to(torch.float16).to(torch.float32).reshape(gh, rows, nk, Bc)
    else:
        P8 = _p8(p, p8tab).reshape(gh, rows, nk, Bc)
    for t in range(t_end):
        j0 = t * Bc
        if qi.half:  # sum_j fp32(f16(p_j) v_j) left to right; the products are exact
            prod = ph[:, :, t, None, :] * vt[:, None, :, j0:j0 + Bc]  # (gh, rows, dv, Bc)
            T = seq_rowsum(prod.reshape(-1, Bc)).reshape(n, dv)
        else:
            T = torch.matmul(P8[:, :, t], vt[:, j0:j0 + Bc])  # exact integers
            T = ((T.to(torch.float32) * sv) / f127).reshape(n, dv)
        u = upd[:, t]
        a = alpha[:, t]
        lsum = torch.where(u, (lsum * a) + lt[:, t], lsum)
        acc = torch.where(u[:, None], (acc * a[:, None]) + T, acc)
    o = acc / lsum[:, None]
    oh = o.to(torch.float16).to(torch.float32)
    oh = torch.where(o == 0, 0.0, oh)  # the CPU's round_f16(-0.0) is +0.0 (its sign: x < 0)
    never = (mrun[:, -1] == -math.inf)[:, None]
    ovf = torch.isinf(oh) & ~torch.isinf(o) & ~never
    out[g0:g1, r0:r1] = torch.where(never, math.nan, oh).reshape(gh, rows, dv)

    # statistics: a (query tile, key tile) pair counts when one of its rows sees a key of it
    seen = incl if vis is None else incl & torch.nn.functional.pad(vis, (0, Lp - Lk))
    blk = seen.reshape(gh, rows, nk, Bc).any(dim=3)
    nqt = -(-rows // Br)
    if nqt * Br > rows:
        blk = torch.nn.functional.pad(blk, (0, 0, 0, nqt * Br - rows))
    tiles = blk.reshape(gh, nqt, Br, nk).any(dim=2).sum(dim=(1, 2))
    c = torch.zeros((gh, _NCOUNT), dtype=torch.int64, device=dev)
    c[:, _C_TILES] = tiles
    c[:, _C_SKIPPED] = nqt * nk - tiles
    c[:, _C_RESCALES] = resc.reshape(gh, -1).sum(dim=1)
    c[:, _C_F16_OVF] = ovf.reshape(gh, -1).sum(dim=1)
    cnt[g0:g1] += c


def intflash(dp: DeviceProblem, return_stats: bool, block_q: int = BLOCK_Q_DEFAULT,
             block_k: int = BLOCK_K_DEFAULT, variant: str = "full",
             scale_dtype: str = "float32", scale_scope: str = "visible"):
    """Scheme ``intflash`` on the device (``intflash._intflash``'s options, checks, messages
    and statistics; the module docstring gives the steps)."""
    import torch

    Br, Bc, scope = intflash_options(dp, block_q, block_k, variant, scale_dtype, scale_scope)
    half = variant == "half"
    dev = dp.device
    if _fused_ok(dp):
        return _fused(dp, return_stats, Br, Bc, half, scale_dtype)
    qi = _Inputs(dp, scope, half, scale_dtype)
    c32 = _const(float(score_unit(dp.scale)), torch.float32, dev)
    p8tab = torch.from_numpy(_P8.astype(np.float64)).to(dev)
    out = torch.empty((dp.B, dp.Lq, dp.dv), dtype=torch.float32, device=dev)
    cnt = torch.zeros((dp.B, _NCOUNT), dtype=torch.int64, device=dev)
    Lp = -(-dp.Lk // Bc) * Bc
    width = max(Lp, dp.dv * Bc) if half else Lp
    for g0, g1, r0, r1 in chunks(dp, align=Br, width=width):
        _chunk(dp, qi, g0, g1, r0, r1, Br, Bc, c32, p8tab, cnt, out)
    if not return_stats:
        return out, None
    return out, _stats(cnt.cpu().numpy(), qi.saturated)


def _fused_ok(dp: DeviceProblem) -> bool:
    """Whether the fused Triton kernel (:mod:`lowprec.gpu.intflash_kernel`) computes the call:
    no mask, a non-empty call (:func:`~.device_rows.fused_kernels`)."""
    return dp.mask is None and dp.B * dp.Lq * dp.Lk > 0 and fused_kernels(dp)


def tile_counts(Lq: int, Lk: int, Br: int, Bc: int, causal: bool) -> tuple[int, int]:
    """``(tiles, skipped)`` of one entry without a mask: the (query tile, key tile) pairs the
    CPU's loop computes and those its causal break skips (a key tile counts when its first
    key is visible to the query tile's last row)."""
    nq, nk = -(-Lq // Br), -(-Lk // Bc)
    if not causal:
        return nq * nk, 0
    last = np.minimum(np.arange(1, nq + 1) * Br, Lq) - 1 + (Lk - Lq)
    tiles = int(np.where(last < 0, 0, np.minimum(nk, last // Bc + 1)).sum())
    return tiles, nq * nk - tiles


def _codes_i8(x, scale_dtype: str, stats: bool, per_entry: bool = False, amax=None,
              subnormal: bool = True):
    """:func:`quantize_rows` of ``x (N, L, D)`` with int8 codes: ``(codes int8 (N, L, D),
    scales float32, saturated int64 or None)``, one scale per row ``(N, L)`` or, with
    ``per_entry``, per entry ``(N,)`` (v's).  float32 scales: from the row maxima ``amax``
    (:func:`~.device_rows.row_amax` of ``x``; None: computed here), the codes in one pass
    (:func:`~.device_rows.int8_codes`: the same ``clamp(RNE(fl64(x) / s))``; a zero scale,
    whose row's values round to 0, divides by 1), the saturations only with ``stats``, and
    counted only when ``subnormal`` (some nonzero scale below ``2**-126``; otherwise there
    are none: a normal ``s = fl32(amax / 127)`` has ``127.5 s > amax``)."""
    import torch

    from .device_rows import int8_codes

    N = x.shape[0]
    if scale_dtype == "float16":
        c, s, sat = quantize_rows(x.reshape(N, -1) if per_entry else x, scale_dtype)
        return c.reshape(x.shape).to(torch.int8), s, sat
    if amax is None:
        amax = row_amax(x)
    if per_entry:
        amax = amax.amax(dim=1)
    s = (amax / _const(INT8_QMAX, torch.float64, x.device)).float()
    zero = s == 0
    c = int8_codes(x, torch.where(zero, 1.0, s))
    if not stats:
        return c, s, None
    if not subnormal:
        return c, s, torch.zeros(s.shape, dtype=torch.int64, device=x.device)
    return c, s, _saturated(x, s, zero, 2 if per_entry else 1)


def _fused(dp: DeviceProblem, return_stats: bool, Br: int, Bc: int, half: bool,
           scale_dtype: str):
    """A call without a mask in one kernel (:func:`lowprec.gpu.intflash_kernel.intflash_rows`):
    the checks and quantization of :class:`_Inputs` with int8 codes, v's once per stored
    head (every key takes part, so each entry's v scale is its stored head's); the tile
    counts from the shape; with float32 scales one pass over each of q, k, v for its row
    maxima (the finiteness check and the scales) and one for its codes, one read-back before
    the kernel (the check; with statistics also whether a scale is subnormal) and one after
    it, with the statistics only."""
    import torch

    from ..gpu.intflash_kernel import intflash_rows

    st = return_stats
    if scale_dtype == "float16":
        _check_inputs(dp, None, scale_dtype)
        q8, sq, satq = _codes_i8(dp.q, scale_dtype, st)
        k8, sk, satk = _codes_i8(dp.k, scale_dtype, st)  # per stored head
        v, svh, sath = (None, None, None) if half else \
            _codes_i8(dp.v, scale_dtype, st, per_entry=True)
    else:
        amax = [row_amax(x) for x in (dp.q_in, dp.k_in, dp.v_in)]
        sub = _check_amax(amax, st)
        q8, sq, satq = _codes_i8(dp.q_in, scale_dtype, st, amax=amax[0], subnormal=sub[0])
        k8, sk, satk = _codes_i8(dp.k_in, scale_dtype, st, amax=amax[1], subnormal=sub[1])
        v, svh, sath = (None, None, None) if half else \
            _codes_i8(dp.v_in, scale_dtype, st, per_entry=True, amax=amax[2],
                      subnormal=sub[2])
    if half:
        v, satv = _half_v(dp).contiguous(), None
        sv = torch.zeros(dp.B, dtype=torch.float32, device=dp.device)
    else:
        sv = svh[dp.kv]
        satv = None if sath is None else sath[dp.kv].sum()
    out, rc = intflash_rows(q8, sq.contiguous(), k8, sk.contiguous(), v, sv.contiguous(),
                            dp.kv.contiguous(), float(score_unit(dp.scale)), causal=dp.causal,
                            block_k=Bc, half=half)
    if not return_stats:
        return out, None
    zero = torch.zeros((), dtype=torch.int64, device=dp.device)
    sat = torch.stack([satq.sum(), satk.sum(dim=1)[dp.kv].sum(), zero if half else satv])
    host = torch.cat([rc.sum(dim=1, dtype=torch.int64).reshape(-1), sat]).cpu().numpy()
    cnt = np.zeros((dp.B, _NCOUNT), dtype=np.int64)
    cnt[:, _C_TILES], cnt[:, _C_SKIPPED] = tile_counts(dp.Lq, dp.Lk, Br, Bc, dp.causal)
    cnt[:, [_C_RESCALES, _C_F16_OVF]] = host[:-3].reshape(dp.B, 2)
    return out, _stats(cnt, tuple(int(x) for x in host[-3:]))


__all__ = ["intflash", "quantize_rows", "IntFlashStats", "tile_counts"]
