"""The fused device kernel of ``ivit`` (I-ViT Shiftmax on int8 q, k, v, the float32-order
variant, ``exact=False``) for calls without a mask: one program per block of query rows of one
entry, three passes over the keys, no ``L x L`` plane in memory (docs/design.md "Fused Triton
kernels of the row-wise schemes").

It computes what :func:`lowprec.kernels.baselines_device._f32_rows` (with ``_ivit_rows`` and
``_finish``) computes in torch operations and the CPU's ``_baselines_f32._ivit_f32`` in Numba,
row by row, the same IEEE operations in the same order (every float32 step one rounding)::

    S   = q8 k8^T                          int8 tl.dot into int32 (exact in any order)
    x   = fp32(fp64(S) s_ent)              float64 product, rounded to float32
          (logit_bits: x = fp32(fp64(c) s_x), c = clamp(RNE(fp64(x) / s_x), -qmax, qmax),
           a float64 IEEE division; a zero code keeps the quotient's sign, as torch's round)
    used: visible (causal: j <= i + Lk - Lq) and x != -inf; a row with a used NaN / +inf is
          bad (NaN out), a row with none is empty (NaN out)
    xs  = fp32(x / s)                      tl.math.div_rn
    m   = max xs over the used keys        (order-free)
    t   = xs - m;  t = (t + floor(t 0.5)) - floor(t 0.0625)      (products exact: powers of 2)
    t   = max(t, n x0)  (a clamp: counted)
    q   = floor(fp32(t / x0));  r = t - fp32(x0 q);  u = fp32(r 0.5) - x0
    e   = floor(fp32(u 2**(n - q))), 0 if negative, 0 where not used
    z   = sum_j e_j, j ascending           float32, one add at a time (_tiles.seq_cols);
                                           keys not used add +0.0, which changes no sum
    z   = min(z, 2**31) (counted);  f = floor(fp32(2**31 / z))
    y   = floor(fp32(fp32(e f) 2**-(32 - out_bits)))
    acc = y v8                             int8 tl.dots of y's 7-bit digits into int32
    out = fp32(fp64(acc) fp64(s_v 2**-(out_bits - 1)))

``/ 2**k`` of the torch path is taken as ``* 2**-k`` here: both are the correctly rounded
value of the same real number, so the same float32.  Pass 1 takes the used count, the bad
flag and ``m`` over key tiles of ``BN`` keys, pass 2 ``e``, ``z``, the floor clamps and each
row's largest ``e`` over sub-tiles of ``SUB`` keys (the left-to-right chain of
:func:`~._tiles.seq_cols`, not a tree), pass 3 ``y``, its row sum, the zero outputs and
``y v8`` over tiles of ``BN3`` keys; each pass recomputes the scores and the chain (int8
GEMMs are cheap; ``z`` needs every ``e`` before any ``y``).

**``y v8`` exactly.**  ``y`` is a non-negative integer (float32).  A row whose sum did not
clamp has ``fp32(e f) <= 2**31`` (``e f <= z floor(2**31 / z)``), so ``y <= 2**(out_bits -
1)``; a clamped row (``f = 1``) may go up to ``e / 2**(32 - out_bits) < 2**40`` (``e <= -x0
2**15``, ``-x0 <= 2**40``).  The products take ``y`` apart in 7-bit digits ``y = sum_k d_k
2**(7 k)``, ``0 <= d_k <= 127``, each an int8 ``tl.dot`` with ``v8`` into int32 (exact in any
order while ``127 * 127 * Lk < 2**31``), recombined in int64.  The kernel bounds the block's
largest ``y`` from pass 2 (``floor(fp32(fp32(max e f) 2**-k))``: every step monotone); when it
is below ``2**(7 ND)`` (``ND = ceil(out_bits / 7)``, a constexpr: 3 digits for the default 16
bits, 2 for 8) and ``Lk <= 133143``, ``ND`` int32 accumulators run over the tiles; otherwise
(clamped sums with large ``e``, very long rows) six digits per tile are added into an int64
accumulator.  ``fp64(acc)`` is exact below ``2**53``, where the torch path's float64 GEMM is
exact too.

``floor`` of a float32 is :func:`_floor` (integer conversions: ``tl.floor`` of a float32 is
libdevice's ``floorf``, which flushes subnormals); it gives ``+0.0`` where IEEE gives ``-0.0``
(for ``-0.0``), which reaches no result: ``(t + floor(t / 2)) - floor(t / 16)`` is ``+0.0``
for ``t = +-0`` either way, ``q`` enters through ``n - q`` and ``t - x0 q`` (``x0 < 0``, the
same value for ``q = +-0``), and ``e``, ``f``, ``y`` are floors of positive values.

Exact: every step is an integer operation, a comparison, ``floor``, or a correctly rounded
float32/float64 operation, launched with ``enable_fp_fusion=False`` (no product contracts into
an FMA; checked with the other forbidden instructions by ``tests/test_device_rows_ptx.py``):
bit-identical by construction, no transcendental function.

Per row the kernel writes (int64) its state (no used key, normal, bad), its floor clamps, its
sum clamp, its zero outputs and ``sum y``, from which the caller counts the statistics on the
device (no read-back in the call).  With ``logit_bits`` the group's requantisation range comes
first from :func:`row_absmax` (per row the largest ``|S|`` over the visible keys: ``|x|`` is
monotone in ``|S|``, so the entry's ``max |x| = fp32(fp64(max |S|) s_ent)``).  Under
``TRITON_INTERPRET=1`` both run on CPU tensors (CI).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._launch import LAUNCH_OPTS, device_guard
from ._tiles import kv_tile, pow2, q_tile, scores, seq_cols

_HALF = tl.constexpr(0.5)
_SIXTEENTH = tl.constexpr(0.0625)
_TWO31 = tl.constexpr(2147483648.0)
_N = tl.constexpr(15)  # I-ViT's shift exponent n (baselines.IVIT_N)
_GRID_Y_MAX = 65535
#: the longest rows whose 7-bit digit products sum in int32 (``127 * 127 * Lk < 2**31``);
#: longer rows take the int64 accumulator (a module attribute: tests lower it)
ACC32_MAX_KEYS = (2**31 - 1) // (127 * 127)
#: the row states of the kernel's first counter column
STATE_EMPTY, STATE_ROW, STATE_BAD = 0, 1, 2
#: the per-row counter columns of ``info``
N_INFO = 5


@triton.jit
def _floor(x):
    """``floor`` of float32 values without ``tl.floor`` (libdevice's ``floorf``, which
    compiles to ``cvt.rmi.ftz.f32.f32`` and flushes subnormals): below ``2**23`` in
    magnitude the truncation to int32 (``cvt.rzi.s32.f32``, exact) less one where it lies
    above ``x``, converted back (exact); larger values, infinities and NaN are their own
    floor.  A zero result is ``+0.0`` where IEEE's floor of ``-0.0`` is ``-0.0``: no zero's
    sign reaches a result here (module docstring)."""
    small = (x < 8388608.0) & (x > -8388608.0)
    xi = tl.where(small, x, 0.0).to(tl.int32)
    xi = xi - (xi.to(tl.float32) > x).to(tl.int32)
    return tl.where(small, xi.to(tl.float32), x)


@triton.jit
def _x(q, K8, b, Lk, D, cols, offs_d, s64, sx64, qmax, REQ: tl.constexpr):
    """The logits ``(BM, N)`` of the rows ``q`` against keys ``cols`` (keys past ``Lk`` score
    0; the caller masks them): ``fp32(fp64(S) s_ent)``, requantised with ``REQ``."""
    s = scores(q, K8, b, Lk, D, cols, cols < Lk, offs_d)
    x = (s.to(tl.float64) * s64).to(tl.float32)
    if REQ:
        v = x.to(tl.float64) / sx64  # IEEE float64 division
        nan = v != v
        lo = -qmax - 1.0
        hi = qmax + 1.0
        v = tl.where(v < lo, lo, tl.where(v > hi, hi, v))  # (rounding is monotone)
        r = tl.floor(v)
        fr = v - r  # exact
        odd = (r.to(tl.int32) & 1) != 0
        r = r + tl.where((fr > 0.5) | ((fr == 0.5) & odd), 1.0, 0.0)
        r = tl.where(r < -qmax, -qmax, tl.where(r > qmax, qmax, r))
        r = tl.where(r == 0.0, v * 0.0, r)  # a zero code keeps v's sign (torch's round)
        x = (r * sx64).to(tl.float32)
        x = tl.where(nan, float("nan"), x)
    return x


@triton.jit
def _xs(q, K8, b, Lk, D, cols, offs_d, s64, sx64, qmax, s32, lim, REQ: tl.constexpr):
    """``(x, xs = fp32(x / s), used)`` of a key tile."""
    x = _x(q, K8, b, Lk, D, cols, offs_d, s64, sx64, qmax, REQ)
    use = (cols[None, :] <= lim[:, None]) & (x != float("-inf"))
    xs = tl.math.div_rn(x, tl.zeros_like(x) + s32)
    return x, xs, use


@triton.jit
def _e(xs, m, ok, x0, nx0):
    """Shiftmax's ``e`` (float32, 0 where not ``ok``) and the floor clamps (``ok`` lanes)."""
    t = tl.where(ok, xs, m[:, None]) - m[:, None]  # t = 0 where not used
    t = (t + _floor(t * _HALF)) - _floor(t * _SIXTEENTH)
    cl = t < nx0
    t = tl.where(cl, nx0, t)
    q = _floor(tl.math.div_rn(t, tl.zeros_like(t) + x0))
    rr = t - x0 * q
    u = rr * _HALF - x0
    k = _N - tl.minimum(tl.maximum(q, 0.0), 15.0).to(tl.int32)  # 0 <= n - q <= n
    p2 = ((k + 127) << 23).to(tl.float32, bitcast=True)  # 2**k from its bits
    ev = _floor(u * p2)
    ev = tl.where(ev < 0, 0.0, ev)
    return tl.where(ok, ev, 0.0), cl & ok


@triton.jit(do_not_specialize=("qmax", "kmax32"))
def _ivit_kernel(Q8, K8, V8, S64, SX64, CST, SVU, OUT, INFO, b0, Lq, Lk, D, DV, shift, qmax,
                 kmax32,
                 CAUSAL: tl.constexpr, REQ: tl.constexpr, OUT_BITS: tl.constexpr,
                 ND: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, SUB: tl.constexpr,
                 BN3: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr):
    """Rows ``BM`` of entry ``b = b0 + program_id(1)``: ``OUT[b, rows]`` float32 and
    ``INFO[b, rows, 0:5]`` int64 (state, floor clamps, sum clamp, zero outputs, ``sum y``).
    q8 ``(B, Lq, D)``, k8 ``(B, Lk, D)``, v8 ``(B, Lk, DV)`` (one per query entry); per entry:
    ``S64`` the logit unit ``s_ent``, ``SX64`` the requantisation scale (float64 ``(B,)``),
    ``CST`` float32 ``(B, 3)`` ``(s, x0, n x0)``, ``SVU`` float64 ``s_v 2**-(out_bits - 1)``;
    ``qmax`` the largest logit code (``REQ``); rows of at most ``kmax32`` keys may sum their
    digit products in int32."""
    b = b0 + tl.program_id(1)
    r0 = tl.program_id(0) * BM
    offs_m = r0 + tl.arange(0, BM)
    offs_d = tl.arange(0, BD)
    offs_v = tl.arange(0, BDV)
    rok = offs_m < Lq
    q = q_tile(Q8, b, offs_m, rok, Lq, D, offs_d)
    s64 = tl.load(S64 + b)
    sx64 = tl.load(SX64 + b)
    s32 = tl.load(CST + b * 3)
    x0 = tl.load(CST + b * 3 + 1)
    nx0 = tl.load(CST + b * 3 + 2)
    qm = qmax.to(tl.float64)
    if CAUSAL:
        lim = offs_m + shift  # the last key each row sees (<= Lk - 1)
        n_end = tl.minimum(Lk, r0 + BM + shift)
    else:
        lim = tl.zeros([BM], dtype=tl.int32) + (Lk - 1)
        n_end = Lk
    lim = tl.where(rok, lim, -1)

    # pass 1: used keys, bad rows (a used NaN / +inf) and the row max of xs (order-free)
    cnt = tl.zeros([BM], dtype=tl.int32)
    bad = tl.zeros([BM], dtype=tl.int32)
    m = tl.full([BM], float("-inf"), tl.float32)
    for n0 in range(0, n_end, BN):
        cols = n0 + tl.arange(0, BN)
        x, xs, use = _xs(q, K8, b, Lk, D, cols, offs_d, s64, sx64, qm, s32, lim, REQ)
        fin = x < float("inf")
        cnt += tl.sum(use.to(tl.int32), axis=1)
        bad = tl.maximum(bad, tl.max((use & ~fin).to(tl.int32), axis=1))
        m = tl.maximum(m, tl.max(tl.where(use & fin, xs, float("-inf")), axis=1))
    good = (cnt > 0) & (bad == 0)
    m = tl.where(good, m, 0.0)

    # pass 2: e, z left to right in float32, the floor clamps, the row's largest e
    z = tl.zeros([BM], dtype=tl.float32)
    emax = tl.zeros([BM], dtype=tl.float32)
    nfl = tl.zeros([BM], dtype=tl.int32)
    for n0 in range(0, n_end, SUB):
        cols = n0 + tl.arange(0, SUB)
        x, xs, use = _xs(q, K8, b, Lk, D, cols, offs_d, s64, sx64, qm, s32, lim, REQ)
        e, cl = _e(xs, m, use & good[:, None], x0, nx0)
        nfl += tl.sum(cl.to(tl.int32), axis=1)
        emax = tl.maximum(emax, tl.max(e, axis=1))
        z = seq_cols(z, e, BM, SUB)
    sc = z >= _TWO31
    z = tl.where(sc, _TWO31, z)
    zs = tl.where(good, z, 1.0)
    f = _floor(tl.math.div_rn(tl.zeros_like(zs) + _TWO31, zs))
    inv = 1.0 / (1 << (32 - OUT_BITS))  # 2**-(32 - out_bits), exact
    ytop = tl.max(tl.where(good, _floor((emax * f) * inv), 0.0), axis=0)

    # pass 3: y, its row sums, the zero outputs and y v8 in 7-bit digits
    nzero = tl.zeros([BM], dtype=tl.int32)
    ysum = tl.zeros([BM], dtype=tl.int64)
    if (ytop < (1 << (7 * ND))) & (Lk <= kmax32):  # ND int32 accumulators
        a0 = tl.zeros([BM, BDV], dtype=tl.int32)
        a1 = tl.zeros([BM, BDV], dtype=tl.int32)
        a2 = tl.zeros([BM, BDV], dtype=tl.int32)
        for n0 in range(0, n_end, BN3):
            cols = n0 + tl.arange(0, BN3)
            x, xs, use = _xs(q, K8, b, Lk, D, cols, offs_d, s64, sx64, qm, s32, lim, REQ)
            ok = use & good[:, None]
            e, cl = _e(xs, m, ok, x0, nx0)
            y = tl.where(ok, _floor((e * f[:, None]) * inv), 0.0)
            nzero += tl.sum((ok & (y == 0.0)).to(tl.int32), axis=1)
            yi = y.to(tl.int32)  # y < 2**21
            ysum += tl.sum(yi, axis=1).to(tl.int64)
            v = kv_tile(V8, b, Lk, DV, cols, cols < Lk, offs_v)
            a0 = tl.dot((yi & 127).to(tl.int8), v, a0, out_dtype=tl.int32)
            if ND >= 2:
                a1 = tl.dot(((yi >> 7) & 127).to(tl.int8), v, a1, out_dtype=tl.int32)
            if ND >= 3:
                a2 = tl.dot((yi >> 14).to(tl.int8), v, a2, out_dtype=tl.int32)
        acc = a0.to(tl.int64) + (a1.to(tl.int64) << 7) + (a2.to(tl.int64) << 14)
    else:  # large y (clamped sums) or long rows: six digits a tile into int64
        acc = tl.zeros([BM, BDV], dtype=tl.int64)
        for n0 in range(0, n_end, BN3):
            cols = n0 + tl.arange(0, BN3)
            x, xs, use = _xs(q, K8, b, Lk, D, cols, offs_d, s64, sx64, qm, s32, lim, REQ)
            ok = use & good[:, None]
            e, cl = _e(xs, m, ok, x0, nx0)
            y = tl.where(ok, _floor((e * f[:, None]) * inv), 0.0)
            nzero += tl.sum((ok & (y == 0.0)).to(tl.int32), axis=1)
            yl = y.to(tl.int64)  # y < 2**40
            ysum += tl.sum(yl, axis=1)
            v = kv_tile(V8, b, Lk, DV, cols, cols < Lk, offs_v)
            for k in tl.static_range(6):
                dg = ((yl >> (7 * k)) & 127).to(tl.int8)
                acc += tl.dot(dg, v, out_dtype=tl.int32).to(tl.int64) << (7 * k)

    svu = tl.load(SVU + b)
    o = (acc.to(tl.float64) * svu).to(tl.float32)
    o = tl.where(good[:, None], o, float("nan"))
    ob = b.to(tl.int64) * Lq * DV
    tl.store(OUT + ob + offs_m[:, None].to(tl.int64) * DV + offs_v[None, :], o,
             mask=rok[:, None] & (offs_v[None, :] < DV))
    state = tl.where(cnt > 0, tl.where(good, 1, 2), 0)  # STATE_EMPTY / _ROW / _BAD
    ib = INFO + (b.to(tl.int64) * Lq + offs_m) * 5
    tl.store(ib, state.to(tl.int64), mask=rok)
    tl.store(ib + 1, nfl.to(tl.int64), mask=rok)
    tl.store(ib + 2, (sc & good).to(tl.int64), mask=rok)
    tl.store(ib + 3, nzero.to(tl.int64), mask=rok)
    tl.store(ib + 4, ysum, mask=rok)


@triton.jit
def _row_absmax_kernel(Q8, K8, OUT, b0, Lq, Lk, D, shift, CAUSAL: tl.constexpr,
                       BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr):
    """``OUT[b, i] = max |S[i, j]|`` over the keys row ``i`` of entry ``b = b0 +
    program_id(1)`` sees (0 for a row that sees none); int32 ``(B, Lq)``."""
    b = b0 + tl.program_id(1)
    r0 = tl.program_id(0) * BM
    offs_m = r0 + tl.arange(0, BM)
    offs_d = tl.arange(0, BD)
    rok = offs_m < Lq
    q = q_tile(Q8, b, offs_m, rok, Lq, D, offs_d)
    if CAUSAL:
        lim = offs_m + shift
        n_end = tl.minimum(Lk, r0 + BM + shift)
    else:
        lim = tl.zeros([BM], dtype=tl.int32) + (Lk - 1)
        n_end = Lk
    lim = tl.where(rok, lim, -1)
    a = tl.zeros([BM], dtype=tl.int32)
    for n0 in range(0, n_end, BN):
        cols = n0 + tl.arange(0, BN)
        s = scores(q, K8, b, Lk, D, cols, cols < Lk, offs_d)
        vis = cols[None, :] <= lim[:, None]
        a = tl.maximum(a, tl.max(tl.where(vis, tl.abs(s), 0), axis=1))
    tl.store(OUT + b.to(tl.int64) * Lq + offs_m, a, mask=rok)


#: ``(BM, BN, SUB, BN3, num_warps, num_stages)``: 64 query rows a program; key tiles of 64
#: for pass 1, sub-tiles of 16 for the float32 chain of ``z``, tiles of 32 for ``y`` and its
#: digit dots (the int8 dot needs K >= 32); 4 warps; 3 stages: ``quant_only``'s measured
#: setting, not yet timed for this kernel.  Every setting gives the same bits.
LAUNCH = (64, 64, 16, 32, 4, 3)


def _grid_entries(B: int):
    for b0 in range(0, B, _GRID_Y_MAX):  # CUDA's grid y dimension
        yield b0, min(B - b0, _GRID_Y_MAX)


def row_absmax(q8, k8, *, causal: bool, launch: tuple | None = None):
    """Per row the largest ``|S|`` of the visible keys, int32 ``(B, Lq)`` (q8 ``(B, Lq, d)``,
    k8 ``(B, Lk, d)`` int8, contiguous; causal: key ``j`` visible to row ``i`` iff ``j <= i +
    Lk - Lq``)."""
    import torch

    B, Lq, d = q8.shape
    Lk = k8.shape[1]
    out = torch.zeros((B, Lq), dtype=torch.int32, device=q8.device)
    if B == 0 or Lq == 0 or Lk == 0:
        return out
    bm, bn, _, _, warps, stages = LAUNCH if launch is None else launch
    with device_guard(q8):
        for b0, nb in _grid_entries(B):
            _row_absmax_kernel[(triton.cdiv(Lq, bm), nb)](
                q8, k8, out, b0, Lq, Lk, d, Lk - Lq, CAUSAL=bool(causal), BM=bm, BN=bn,
                BD=pow2(d, 32), num_warps=warps, num_stages=stages, **LAUNCH_OPTS)
    return out


def ivit_rows(q8, k8, v8, s64, sx64, cst, svu, *, qmax: int, out_bits: int, causal: bool,
              requant: bool, launch: tuple | None = None):
    """Run the fused ``ivit`` kernel (module docstring).

    Args:
        q8: int8 ``(B, Lq, d)``; k8, v8: int8 ``(B, Lk, d)``, ``(B, Lk, dv)`` (one per query
            entry), contiguous, on one device.
        s64: float64 ``(B,)`` the logit unit ``s_ent`` of each entry; sx64: float64 ``(B,)``
            the requantisation scale ``s_x`` (read with ``requant``); cst: float32 ``(B, 3)``
            ``(s, x0, n x0)`` of the surrogate; svu: float64 ``(B,)`` ``s_v 2**-(out_bits -
            1)``.
        qmax: the largest logit code; out_bits: 2..16; causal: key ``j`` visible to row
            ``i`` iff ``j <= i + Lk - Lq``; requant: requantise the logits (``logit_bits``).
        launch: ``(BM, BN, SUB, BN3, num_warps, num_stages)`` in place of :data:`LAUNCH`
            (``BN3 >= 32``, ``SUB`` 16 or 32).

    Returns:
        ``(out float32 (B, Lq, dv), info int64 (B, Lq, 5))``: per row its state
        (:data:`STATE_EMPTY`, :data:`STATE_ROW`, :data:`STATE_BAD`), floor clamps, sum clamp
        (0/1), zero outputs and the sum of its ``y``.
    """
    import torch

    B, Lq, d = q8.shape
    Lk, dv = k8.shape[1], v8.shape[2]
    out = torch.empty((B, Lq, dv), dtype=torch.float32, device=q8.device)
    info = torch.zeros((B, Lq, N_INFO), dtype=torch.int64, device=q8.device)
    if B == 0 or Lq == 0:
        return out, info
    bm, bn, sub, bn3, warps, stages = LAUNCH if launch is None else launch
    nd = -(-int(out_bits) // 7)
    with device_guard(q8):
        for b0, nb in _grid_entries(B):
            _ivit_kernel[(triton.cdiv(Lq, bm), nb)](
                q8, k8, v8, s64, sx64, cst, svu, out, info, b0, Lq, Lk, d, dv, Lk - Lq,
                int(qmax), int(ACC32_MAX_KEYS), CAUSAL=bool(causal), REQ=bool(requant),
                OUT_BITS=int(out_bits), ND=nd, BM=bm, BN=bn, SUB=sub, BN3=bn3,
                BD=pow2(d, 32), BDV=pow2(dv, 16), num_warps=warps, num_stages=stages, **LAUNCH_OPTS)
    return out, info


__all__ = ["ivit_rows", "row_absmax", "LAUNCH", "STATE_EMPTY", "STATE_ROW", "STATE_BAD",
           "N_INFO", "ACC32_MAX_KEYS"]
