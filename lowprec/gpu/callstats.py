"""The statistics of one GPU-engine call (``flash``, ``baps``) in one kernel: the packed int64
vector that :func:`lowprec.kernels.device.attention_device` copies to the host once, built on
the device without the ~20 small torch operations (and their host time: about 0.9 ms of a
1.7 ms call in an ``lp.emulate`` forward on the H100, docs/design.md "Host time of an emulated
call") that assembled it before.

Each batch entry ``b`` (a query head) has its rows split between a few programs
(:func:`_row_splits`); together they write, for calls without a mask:

* the engine's tile flags widened to int64 (``flags[b]``, ``nq * nk`` values);
* its restarted rows: the sum of the entry's per-row-block counters;
* three counters: rows whose output holds a NaN or an infinity among the rows that see a key
  (``nonfinite_rows``), rows whose estimated logit noise exceeds ``NOISE_NATS``
  (``noisy_rows``, model ``"bfloat16"``), rows that see no key.

Every counter is an integer count of comparisons, exact in any order.  The noise estimate is
:func:`lowprec.kernels.problem.logit_noise`'s float64 ``"bfloat16"`` formula, ``sqrt(step2 * 2
* sum_d q_id**2 E_j[k_jd**2]) * |scale|``, with every square exact (float32 values squared in
float64) but its two sums in the kernel's order, not NumPy's: as with the torch operations it
replaces, a row whose estimate lies within a few float64 ulps of the threshold could count
differently from the CPU (module docstring of :mod:`lowprec.kernels.device`).  The non-finite
test is two comparisons per value (``|x| < inf``), so a NaN cannot be lost to a reduction
(specs/gpu.md section 2).
"""

from __future__ import annotations

import struct

import triton
import triton.language as tl

from ._launch import LAUNCH_OPTS, device_guard, halves, interpreting

_INF = tl.constexpr(float("inf"))
_LOW32 = tl.constexpr(0xFFFFFFFF)


@triton.jit
def _f64(lo, hi):
    """The float64 whose bit pattern has the int32 halves ``lo``, ``hi`` (``_launch.halves``:
    Triton passes a Python float as float32)."""
    return ((hi.to(tl.int64) << 32) | (lo.to(tl.int64) & _LOW32)).to(tl.float64, bitcast=True)


@triton.jit
def _row_block(ob, i, Lq, dv, shift, causal, offs_v):
    """Rows ``i < Lq`` of an entry's output ``ob`` (float32 ``(rows, dv)``; ``Lq`` the end of
    the program's rows): ``(in range, sees a key, no-key count, non-finite count)``; a row is
    non-finite when some ``|x| < inf`` fails (NaN included: comparisons, no reduction that
    could drop it)."""
    iok = i < Lq
    if causal != 0:
        sees = iok & (i + shift >= 0)
    else:
        sees = iok
    o = tl.load(ob + i[:, None].to(tl.int64) * dv + offs_v[None, :],
                mask=iok[:, None] & (offs_v[None, :] < dv), other=0.0)
    bad = tl.sum((~(tl.abs(o) < _INF)).to(tl.int32), axis=1)
    return iok, sees, (iok & ~sees).to(tl.int32), (sees & (bad > 0)).to(tl.int32)


@triton.jit
def _split_rows(split, rb, Lq, BM: tl.constexpr):
    """The rows ``[r0, rend)`` of an entry's split ``split`` (``rb`` rows each) and its three
    zeroed row-block counters (non-finite, noisy, no key)."""
    r0 = split * rb
    z = tl.zeros([BM], dtype=tl.int32)
    return r0, tl.minimum(r0 + rb, Lq), z, z, z


@triton.jit
def _store_counts(PACK, o_cnt, B, b, nonfin, noisy, nokey):
    """``PACK[o_cnt + c * B + b] +=`` this program's part of the entry's counters ``c`` = 0
    non-finite, 1 noisy, 2 no key (int64 atomic adds of integer counts: exact in any order;
    the launcher zeroes ``PACK``)."""
    tl.atomic_add(PACK + o_cnt + b, tl.sum(nonfin, axis=0).to(tl.int64))
    tl.atomic_add(PACK + o_cnt + B + b, tl.sum(noisy, axis=0).to(tl.int64))
    tl.atomic_add(PACK + o_cnt + 2 * B + b, tl.sum(nokey, axis=0).to(tl.int64))


_SHAPES = ["Hq", "G", "Lq", "Lk", "d", "dv", "nflag", "nrr", "shift", "causal", "o_rr", "o_cnt",
           "B", "c_lo", "c_hi", "s_lo", "s_hi", "n_lo", "n_hi", "rb"]


@triton.jit(do_not_specialize=_SHAPES)
def _call_stats_kernel(Q, K, OUT, FLAGS, RR, PACK, sqz, sqh, sqm, sqd, skz, skh, skn, skd,
                       Hq, G, Lq, Lk, d, dv, nflag, nrr, shift, causal, o_rr, o_cnt, B,
                       c_lo, c_hi, s_lo, s_hi, n_lo, n_hi, rb, NOISE: tl.constexpr,
                       BM: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr,
                       BF: tl.constexpr):
    """Entry ``b = program_id(0)``, its rows ``[s rb, (s + 1) rb)`` for ``s = program_id(1)``:
    ``PACK[o_cnt + c * B + b] +=`` their counters ``c`` = 0 non-finite, 1 noisy, 2 no key
    (module docstring); the first split also writes ``PACK[b * nflag + i] = FLAGS[b * nflag +
    i]`` and ``PACK[o_rr + b] = sum RR[b * nrr:(b + 1) * nrr]``.  The float64 constants ``2
    step2``, ``|scale|`` and ``NOISE_NATS`` come as int32 halves."""
    step2x2 = _f64(c_lo, c_hi)
    scale_abs = _f64(s_lo, s_hi)
    noise_nats = _f64(n_lo, n_hi)
    b = tl.program_id(0)
    split = tl.program_id(1)
    b64 = b.to(tl.int64)
    z = b // Hq
    h = b % Hq
    kh = h // G
    if split == 0:
        offs_f = tl.arange(0, BF)
        for i0 in range(0, nflag, BF):
            i = i0 + offs_f
            fl = tl.load(FLAGS + b64 * nflag + i, mask=i < nflag, other=0)
            tl.store(PACK + b64 * nflag + i, fl.to(tl.int64), mask=i < nflag)
        rr = tl.zeros([BF], dtype=tl.int64)
        for i0 in range(0, nrr, BF):
            i = i0 + offs_f
            rr += tl.load(RR + b64 * nrr + i, mask=i < nrr, other=0).to(tl.int64)
        tl.store(PACK + o_rr + b, tl.sum(rr, axis=0))

    offs_m = tl.arange(0, BM)
    offs_d = tl.arange(0, BD)
    dok = offs_d < d
    # E_j[k_jd**2] over every key (a call without a mask: every key takes part)
    k2 = tl.zeros([BD], dtype=tl.float64)
    if NOISE:
        kb = K + z.to(tl.int64) * skz + kh.to(tl.int64) * skh
        for j0 in range(0, Lk, BM):
            j = j0 + offs_m
            kt = tl.load(kb + j[:, None].to(tl.int64) * skn + offs_d[None, :] * skd,
                         mask=(j[:, None] < Lk) & dok[None, :], other=0.0)
            kf = kt.to(tl.float32).to(tl.float64)
            k2 += tl.sum(kf * kf, axis=0)
        k2 = k2 / Lk
    offs_v = tl.arange(0, BDV)
    qb = Q + z.to(tl.int64) * sqz + h.to(tl.int64) * sqh
    ob = OUT + b64 * Lq * dv
    r0, rend, nonfin, noisy, nokey = _split_rows(split, rb, Lq, BM)
    for i0 in range(r0, rend, BM):
        i = i0 + offs_m
        iok, sees, nk, nf = _row_block(ob, i, rend, dv, shift, causal, offs_v)
        nokey += nk
        nonfin += nf
        if NOISE:
            qt = tl.load(qb + i[:, None].to(tl.int64) * sqm + offs_d[None, :] * sqd,
                         mask=iok[:, None] & dok[None, :], other=0.0)
            qf = qt.to(tl.float32).to(tl.float64)
            var = step2x2 * tl.sum((qf * qf) * k2[None, :], axis=1)
            est = tl.sqrt(var) * scale_abs  # float64: sqrt.rn.f64 (the PTX test)
            noisy += (sees & ~(est <= noise_nats)).to(tl.int32)
    _store_counts(PACK, o_cnt, B, b, nonfin, noisy, nokey)


_ROWS_SHAPES = ["B", "Lq", "Lk", "d", "dv", "shift", "causal", "part_rows", "o_cnt", "s_lo",
                "s_hi", "n_lo", "n_hi", "rb"]


@triton.jit(do_not_specialize=_ROWS_SHAPES)
def _rows_counts_kernel(Q, K, KV, TOP, OUT, PACK, B, Lq, Lk, d, dv, shift, causal, part_rows,
                        o_cnt, s_lo, s_hi, n_lo, n_hi, rb, NOISE: tl.constexpr,
                        TENSOR: tl.constexpr, BM: tl.constexpr, BD: tl.constexpr,
                        BDV: tl.constexpr):
    """Entry ``b = program_id(0)`` of a row-wise scheme's call without a mask, its rows ``[s
    rb, (s + 1) rb)`` for ``s = program_id(1)``: ``PACK[o_cnt + c * B + b] +=`` their
    counters ``c`` = 0 non-finite, 1 noisy, 2 no key.  ``Q``
    ``(B, Lq, d)``, ``K`` ``(Bk, Lk, d)`` C-contiguous in their stored dtype, ``KV`` int64
    ``(B,)`` each entry's key entry, ``TOP`` float64 ``(2,)`` the largest ``|q|`` and ``|k|``
    the ``"int8_tensor"`` model's scales come from (read for ``TENSOR``; else the entry's own
    maxima, the ``"int8_entry"`` model's, over the rows that see a key when ``part_rows``);
    ``OUT`` float32 ``(B, Lq, dv)``."""
    scale_abs = _f64(s_lo, s_hi)
    noise_nats = _f64(n_lo, n_hi)
    b = tl.program_id(0)
    split = tl.program_id(1)
    b64 = b.to(tl.int64)
    offs_m = tl.arange(0, BM)
    offs_d = tl.arange(0, BD)
    dok = offs_d < d
    qb = Q + b64 * Lq * d
    kb = K + tl.load(KV + b) * Lk * d
    k2sum = 0.0
    sq = 0.0
    sk = 0.0
    if NOISE:
        # E_j[k_jd**2] per d (every key takes part), then their sum; the entry's max |k|
        k2 = tl.zeros([BD], dtype=tl.float64)
        ak = tl.zeros([BM, BD], dtype=tl.float64)
        for j0 in range(0, Lk, BM):
            j = j0 + offs_m
            kt = tl.load(kb + j[:, None].to(tl.int64) * d + offs_d[None, :],
                         mask=(j[:, None] < Lk) & dok[None, :], other=0.0).to(tl.float64)
            k2 += tl.sum(kt * kt, axis=0)
            ak = tl.maximum(ak, tl.abs(kt))
        k2sum = tl.sum(k2 / Lk, axis=0)
        if TENSOR:
            sq = tl.load(TOP) / 127.0
            sk = tl.load(TOP + 1) / 127.0
        else:
            aq = tl.zeros([BM, BD], dtype=tl.float64)
            for i0 in range(0, Lq, BM):
                i = i0 + offs_m
                rin = (i < Lq) & ((part_rows == 0) | (i + shift >= 0))
                qt = tl.load(qb + i[:, None].to(tl.int64) * d + offs_d[None, :],
                             mask=rin[:, None] & dok[None, :], other=0.0).to(tl.float64)
                aq = tl.maximum(aq, tl.abs(qt))
            sq = tl.max(tl.max(aq, axis=1), axis=0) / 127.0
            sk = tl.max(tl.max(ak, axis=1), axis=0) / 127.0
    offs_v = tl.arange(0, BDV)
    ob = OUT + b64 * Lq * dv
    r0, rend, nonfin, noisy, nokey = _split_rows(split, rb, Lq, BM)
    for i0 in range(r0, rend, BM):
        i = i0 + offs_m
        iok, sees, nk, nf = _row_block(ob, i, rend, dv, shift, causal, offs_v)
        nokey += nk
        nonfin += nf
        if NOISE:
            qt = tl.load(qb + i[:, None].to(tl.int64) * d + offs_d[None, :],
                         mask=iok[:, None] & dok[None, :], other=0.0).to(tl.float64)
            qsq = tl.sum(qt * qt, axis=1)
            var = (qsq * sk * sk + k2sum * sq * sq) / 12.0
            est = tl.sqrt(var) * scale_abs  # float64: sqrt.rn.f64 (the PTX test)
            noisy += (sees & ~(est <= noise_nats)).to(tl.int32)
    _store_counts(PACK, o_cnt, B, b, nonfin, noisy, nokey)


def rows_counts(q_in, k_in, kv, top, out, *, scale: float, causal: bool, model,
                part_rows: bool, noise_nats: float):
    """The counters every row-wise scheme shares, for a call without a mask
    (:func:`lowprec.kernels.device._rows_counts`): int64 ``(3 * B,)`` on the device, per
    entry the non-finite rows (among those that see a key), the noisy rows (``model``
    ``"int8_tensor"`` or ``"int8_entry"`` of :func:`lowprec.kernels.problem.logit_noise`, or
    None: 0) and the rows that see no key.

    Args:
        q_in: ``(B, Lq, d)``, k_in: ``(Bk, Lk, d)`` in their stored dtype (bfloat16, float16,
            float32, float64), contiguous; kv: int64 ``(B,)``; top: float64 ``(2,)`` or more,
            the largest ``|q|`` and ``|k|`` of ``"int8_tensor"``'s scales (over the rows that
            take part); out: float32 ``(B, Lq, dv)`` contiguous.
        part_rows: the estimate leaves the rows that see no key out (its ``parts``: causal
            with ``Lq > Lk``, scales of the visible rows): ``"int8_entry"``'s maxima are taken
            over the other rows (their own estimate is never counted either way).
    """
    import torch

    B, Lq, d = q_in.shape
    Lk, dv = k_in.shape[1], out.shape[2]
    pack = torch.zeros(3 * B, dtype=torch.int64, device=out.device)
    if B == 0:
        return pack
    if model not in (None, "int8_tensor", "int8_entry"):  # pragma: no cover - caller checks
        raise ValueError(f"noise model {model!r}: not in the fused counters")
    bd = max(16, triton.next_power_of_2(d))
    bdv = max(16, triton.next_power_of_2(dv))
    bm = 64 if not interpreting() else max(16, min(1024, triton.next_power_of_2(max(Lq, Lk))))
    splits, rb = _row_splits(B, Lq, bm)
    with device_guard(out):
        _rows_counts_kernel[(B, splits)](
            q_in, k_in, kv, top, out, pack, B, Lq, Lk, d, dv, Lk - Lq, int(bool(causal)),
            int(bool(part_rows)), 0,
            *_bits64(abs(float(scale))), *_bits64(float(noise_nats)), rb,
            NOISE=model is not None, TENSOR=model == "int8_tensor", BM=bm, BD=bd, BDV=bdv,
            num_warps=4, **LAUNCH_OPTS)
    return pack


#: programs a call's statistics aim for (each entry's rows split between several programs so
#: that the GPU's multiprocessors share the work: one program per entry left most of an H100
#: idle; ``rows_counts`` at (32 entries, 2048 rows, d = 64), ``"int8_tensor"``: 0.46 -> 0.15
#: ms, docs/design.md "Session 8"); a split recomputes what the entry's rows share (the key
#: moments, the entry's largest ``|q|``), so a split keeps at least :data:`_SPLIT_ROWS` rows
_SPLIT_TARGET = 512
_SPLIT_ROWS = 128


def _row_splits(B: int, Lq: int, bm: int, moments: bool = False) -> tuple[int, int]:
    """``(splits, rows per split)`` of each entry's ``Lq`` rows (rows per split a multiple of
    the row block ``bm``, though the kernels mask each split's end; under the interpreter's
    single row block, one split).  ``moments``: each split would recompute a pass over the
    entry's keys that costs as much as its rows (the engine's noise estimate): one split
    (measured on the H100: 0.37 ms against 0.60 ms split at (32, 4096, 128))."""
    if Lq == 0 or moments:
        return 1, max(bm, -(-Lq // bm) * bm)
    splits = max(1, min(-(-Lq // _SPLIT_ROWS), _SPLIT_TARGET // max(B, 1)))
    per = -(-Lq // splits)  # rows per split, rounded up to whole row blocks
    rb = -(-per // bm) * bm
    return -(-Lq // rb), rb


def _bits64(x: float) -> tuple[int, int]:
    """A float64 as the int32 halves of its bit pattern (:func:`_f64` joins them)."""
    return halves(struct.unpack("<q", struct.pack("<d", x))[0])


def call_stats(q4, k4, out, flags, rr, *, scale: float, causal: bool, noise: bool,
               step2: float, noise_nats: float):
    """The packed statistics of an engine call without a mask (module docstring).

    Args:
        q4: ``(Z, Hq, Lq, d)`` the engine's query (float32, float16 or bfloat16, any strides);
            k4: ``(Z, Hkv, Lk, d)`` its keys (``Hq % Hkv == 0``: GQA by index).
        out: float32 ``(B, Lq, dv)`` contiguous, ``B = Z * Hq``, the engine's output.
        flags: int8 ``(B, nq, nk)`` contiguous; rr: int32 ``(B, n)`` contiguous restarted rows
            per row block.
        scale: the softmax scale; causal: bottom-right aligned (row ``i`` sees no key when
            ``i + Lk - Lq < 0``).
        noise: count ``noisy_rows`` (model ``"bfloat16"``); else that counter is 0.
        step2, noise_nats: ``problem._BF16_STEP2`` and ``problem.NOISE_NATS``.

    Returns:
        int64 ``(B * nq * nk + B + 3 * B,)`` on the device: flags, restarted rows per entry,
        then the three counters per entry (non-finite, noisy, no key).
    """
    import torch

    Z, Hq, Lq, d = q4.shape
    Hkv, Lk = k4.shape[1], k4.shape[2]
    B, dv = out.shape[0], out.shape[2]
    nflag = flags.shape[1] * flags.shape[2]
    nrr = rr.shape[1]
    o_rr = B * nflag
    pack = torch.zeros(o_rr + 4 * B, dtype=torch.int64, device=out.device)
    if B == 0:
        return pack
    bd = max(16, triton.next_power_of_2(d))
    bdv = max(16, triton.next_power_of_2(dv))
    bm = 64 if not interpreting() else max(16, min(1024, triton.next_power_of_2(max(Lq, Lk))))
    splits, rb = _row_splits(B, Lq, bm, moments=bool(noise))
    with device_guard(out):
        _call_stats_kernel[(B, splits)](
            q4, k4, out, flags, rr, pack, *q4.stride(), *k4.stride(), Hq, Hq // Hkv, Lq, Lk,
            d, dv, nflag, nrr, Lk - Lq, int(bool(causal)), o_rr, o_rr + B, B,
            *_bits64(float(step2) * 2.0), *_bits64(abs(float(scale))),
            *_bits64(float(noise_nats)), rb, NOISE=bool(noise),
            BM=bm, BD=bd, BDV=bdv, BF=256, num_warps=4, **LAUNCH_OPTS)
    return pack


__all__ = ["call_stats", "rows_counts"]
