"""The fused device kernels of ``ivit`` (I-ViT Shiftmax) and ``ibert`` (I-BERT's integer
softmax) on int8 q, k, v, the float32-order variant (``exact=False``), for calls without a
mask: one program per block of query rows of one entry, three passes over the keys, no ``L x
L`` plane in memory (docs/design.md "Fused Triton kernels of the row-wise schemes").  One
kernel, :func:`_rows_kernel`, serves both (the constexpr ``IBERT`` picks the surrogate);
I-BERT has a first kernel, :func:`_ibert_emax_kernel`, for its group's ``max(e)``.

They compute what :func:`lowprec.kernels.baselines_device._f32_rows` (with ``_ivit_rows``, or
``_ibert_e`` and ``_ibert_norm``, and ``_finish``) computes in torch operations and the CPU's
``_baselines_f32._ivit_f32`` / ``_ibert_exp_f32`` and ``_ibert_norm_f32`` in Numba, row by
row, the same IEEE operations in the same order (every float32 step one rounding)::

    S   = q8 k8^T                          int8 tl.dot into int32 (exact in any order)
    x   = fp32(fp64(S) s_ent)              float64 product, rounded to float32
          (logit_bits: x = fp32(fp64(c) s_x), c = clamp(RNE(fp64(x) / s_x), -qmax, qmax),
           a float64 IEEE division; a zero code keeps the quotient's sign, as torch's round)
    used: visible (causal: j <= i + Lk - Lq) and x != -inf; a row with a used NaN / +inf is
          bad (NaN out), a row with none is empty (NaN out)
    xs  = fp32(x / s)                      tl.math.div_rn
    m   = max xs over the used keys        (order-free)
  I-ViT (n = 15):
    t   = xs - m;  t = (t + floor(t 0.5)) - floor(t 0.0625)      (products exact: powers of 2)
    t   = max(t, n x0)  (a clamp: counted)
    q   = floor(fp32(t / x0));  r = t - fp32(x0 q);  u = fp32(r 0.5) - x0
    e   = floor(fp32(u 2**(n - q))), 0 if negative, 0 where not used
    z   = sum_j e_j, j ascending           float32, one add at a time (_tiles.seq_cols);
                                           keys not used add +0.0, which changes no sum
    z   = min(z, 2**31) (counted);  f = floor(fp32(2**31 / z))
    y   = floor(fp32(fp32(e f) 2**-(32 - out_bits)))
    out = fp32(fp64(y v8) fp64(s_v 2**-(out_bits - 1)))
  I-BERT (n = 30; x0i, bi, ci, m31, shift per group):
    t   = max(xs - m, n x0i)  (a clamp: counted)
    q   = floor(fp32(t / x0i));  r = t - fp32(x0i q)
    e   = floor(fp32(fp32(fp32(r fp32(r + bi)) + ci) 2**(n - q))), 0 if negative or not used
    (first kernel: the row's largest e; the host takes the group's and derives m31, shift)
    v   = RNE(fp64(fp64(e) m31) 2**-shift) two float64 roundings, half to even
    e16 = min(v, 32767) (v > 32767 counted) as float32 (exact: an integer)
    z   = sum_j e16_j, j ascending         float32, one add at a time
    f   = floor(fp32(2**32 / z))
    y   = floor(fp32(fp32(e16 f) 2**-(32 - out_bits)))
    out = fp32(fp64(y v8) fp64(s_v 2**-out_bits)); rows of a group with m31 = 0 NaN
    (live rows: good and m31 > 0; the requantisation clamps and zero outputs count there)

``/ 2**k`` of the torch path is taken as ``* 2**-k`` here: both are the correctly rounded
value of the same real number, so the same float32 (the products are normal numbers).
Pass 1 takes the used count, the bad flag and ``m`` over key tiles of ``BN`` keys, pass 2 the
sum's terms (``e``, or ``e16``), ``z``, the clamps and each row's largest term over sub-tiles
of ``SUB`` keys (the left-to-right chain of :func:`~._tiles.seq_cols`, not a tree), pass 3
``y``, its row sum, the zero outputs and ``y v8`` over tiles of ``BN3`` keys; each pass
recomputes the scores and the chain (int8 GEMMs are cheap; ``z`` needs every term before any
``y``).  I-BERT's first kernel is pass 1 and ``e``'s maximum over tiles of ``BN`` keys (its
value is ``ci 2**30`` in every good row, at ``t = 0``, but it is computed as the torch path
does).

**RNE in float64.**  ``v >= 0`` lies below about ``2**16`` (``e <= max(e)``, ``m31
2**-shift ~ 32767 / max(e)``): ``floor`` of a float64 (``cvt.rmi.f64``, no flushing in
float64) is exact, ``v - floor(v)`` is exact, and one is added above a half or at a half from
an odd floor: torch's ``round``.

**``y v8`` exactly.**  ``y`` is a non-negative integer (float32).  I-ViT: a row whose sum did
not clamp has ``fp32(e f) <= 2**31`` (``e f <= z floor(2**31 / z)``), so ``y <= 2**(out_bits -
1)``; a clamped row (``f = 1``) may go up to ``e / 2**(32 - out_bits) < 2**40`` (``e <= -x0
2**15``, ``-x0 <= 2**40``).  I-BERT: ``z >= e16`` (a float32 sum of non-negative terms), so
``e16 f <= 2**32`` up to ``f``'s rounding (``<= 2**32 + 2**8``, which rounds to ``2**32``) and
``y <= 2**out_bits``.  The products take ``y`` apart in 7-bit digits ``y = sum_k d_k 2**(7
k)``, ``0 <= d_k <= 127``, each an int8 ``tl.dot`` with ``v8`` into int32 (exact in any order
while ``127 * 127 * Lk < 2**31``), recombined in int64.  The kernel bounds the block's
largest ``y`` from pass 2 (``floor(fp32(fp32(max term f) 2**-k))``: every step monotone);
when it is below ``2**(7 ND)`` (``ND``, a constexpr: ``ceil(out_bits / 7)`` for I-ViT,
``ceil((out_bits + 1) / 7)`` for I-BERT; 3 digits for 16 bits, 2 for 8) and ``Lk <= 133143``,
``ND`` int32 accumulators run over the tiles; otherwise (I-ViT's clamped sums with large
``e``, very long rows) six digits per tile are added into an int64 accumulator.
``fp64(acc)`` is exact below ``2**53``, where the torch path's float64 GEMM is exact too.

``floor`` of a float32 is :func:`_floor` (integer conversions: ``tl.floor`` of a float32 is
libdevice's ``floorf``, which flushes subnormals); it gives ``+0.0`` where IEEE gives ``-0.0``
(for ``-0.0``), which reaches no result.  I-ViT: ``(t + floor(t / 2)) - floor(t / 16)`` is
``+0.0`` for ``t = +-0`` either way, ``q`` enters through ``n - q`` and ``t - x0 q`` (``x0 <
0``, the same value for ``q = +-0``), and ``e``, ``f``, ``y`` are floors of positive values.
I-BERT: ``q = +-0`` only for ``t = +-0``, where ``r = +0`` either way, so ``e = floor(ci
2**n)``; ``zz = fp32(. + ci)`` with ``ci >= 1`` is never ``-0.0``, a negative ``e`` becomes
``+0.0``, and ``f``, ``y`` are floors of values ``>= +0``.

Exact: every step is an integer operation, a comparison, ``floor``, or a correctly rounded
float32/float64 operation, launched with ``enable_fp_fusion=False`` (no product contracts into
an FMA; checked with the other forbidden instructions by ``tests/test_device_rows_ptx.py``):
bit-identical by construction, no transcendental function.

Per row the kernel writes (int64) its state (no used key, live, bad, I-BERT's good row of a
group with ``m31 = 0``), its floor clamps, I-ViT's sum clamp or I-BERT's requantisation
clamps, its zero outputs and ``sum y``, from which the caller counts the statistics on the
device (no read-back in the call).  With ``logit_bits`` the group's requantisation range comes
first from :func:`row_absmax` (per row the largest ``|S|`` over the visible keys: ``|x|`` is
monotone in ``|S|``, so the entry's ``max |x| = fp32(fp64(max |S|) s_ent)``).  Under
``TRITON_INTERPRET=1`` they run on CPU tensors (CI).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._launch import LAUNCH_OPTS, device_guard
from ._tiles import grid_entries, kv_tile, pow2, q_tile, row_range, scores, seq_cols

_HALF = tl.constexpr(0.5)
_SIXTEENTH = tl.constexpr(0.0625)
_TWO31 = tl.constexpr(2147483648.0)
_TWO32 = tl.constexpr(4294967296.0)
_N = tl.constexpr(15)  # I-ViT's shift exponent n (baselines.IVIT_N)
_NB = tl.constexpr(30)  # I-BERT's shift exponent n (baselines.IBERT_N)
#: pass 1's row states as :func:`_ibert_emax_kernel` hands them to the row kernel
_ST_EMPTY, _ST_GOOD, _ST_BAD = tl.constexpr(0), tl.constexpr(1), tl.constexpr(2)
_E16_MAX = tl.constexpr(32767.0)  # I-BERT's 16-bit requantisation bound (IBERT_E16_MAX)
#: the longest rows whose 7-bit digit products sum in int32 (``127 * 127 * Lk < 2**31``);
#: longer rows take the int64 accumulator (a module attribute: tests lower it)
ACC32_MAX_KEYS = (2**31 - 1) // (127 * 127)
#: the row states of the kernel's first counter column
STATE_EMPTY, STATE_ROW, STATE_BAD = 0, 1, 2
#: a good I-BERT row of a group whose multiplier is 0 (no positive ``e``): NaN, not counted
STATE_DEAD = 3
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
def _rne(v, WIDE: tl.constexpr):
    """Round half to even of float64 values (torch's ``round``): ``floor`` (``cvt.rmi.f64``,
    no flush in float64), the exact fraction, one up where above a half or at a half from an
    odd floor (NaN stays NaN).  The parity is taken in int32 (``|v| < 2**31``: the logit
    codes) or, with ``WIDE``, in int64 (``|v| < 2**62``: I-BERT's 16-bit requantisation,
    whose argument is unbounded when a caller hands the kernel its own multiplier)."""
    r = tl.floor(v)
    fr = v - r  # exact
    if WIDE:
        odd = (r.to(tl.int64) & 1) != 0
    else:
        odd = (r.to(tl.int32) & 1) != 0
    return r + tl.where((fr > 0.5) | ((fr == 0.5) & odd), 1.0, 0.0)


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
        r = _rne(v, False)  # |v| <= qmax + 1
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
def _reduce(t, ok, x0, nx0):
    """The shared range reduction of Shiftmax and i-exp: ``t`` clamped at ``n x0`` (the
    clamps counted on ``ok`` lanes), ``q = floor(fp32(t / x0))`` and ``r = t - fp32(x0 q)``."""
    cl = t < nx0
    t = tl.where(cl, nx0, t)
    q = _floor(tl.math.div_rn(t, tl.zeros_like(t) + x0))
    return q, t - x0 * q, cl & ok


@triton.jit
def _shift_floor(u, q, N: tl.constexpr, ok):
    """``floor(fp32(u 2**(N - q)))`` (``0 <= q <= N``; the power of two from its bits),
    negative values and lanes not ``ok`` 0."""
    k = N - tl.minimum(tl.maximum(q, 0.0), N * 1.0).to(tl.int32)
    p2 = ((k + 127) << 23).to(tl.float32, bitcast=True)
    ev = _floor(u * p2)
    ev = tl.where(ev < 0, 0.0, ev)
    return tl.where(ok, ev, 0.0)


@triton.jit
def _e(xs, m, ok, x0, nx0):
    """Shiftmax's ``e`` (float32, 0 where not ``ok``) and the floor clamps (``ok`` lanes)."""
    t = tl.where(ok, xs, m[:, None]) - m[:, None]  # t = 0 where not used
    t = (t + _floor(t * _HALF)) - _floor(t * _SIXTEENTH)
    q, rr, cl = _reduce(t, ok, x0, nx0)
    return _shift_floor(rr * _HALF - x0, q, _N, ok), cl


@triton.jit
def _e_ibert(xs, m, ok, x0, nx0, bi, ci):
    """I-BERT's i-exp ``e`` (float32, 0 where not ``ok``) and the floor clamps (``ok`` lanes):
    ``_baselines_f32._ibert_exp_f32`` / ``baselines_device._ibert_e``."""
    t = tl.where(ok, xs, m[:, None]) - m[:, None]  # t = 0 where not used
    q, rr, cl = _reduce(t, ok, x0, nx0)
    return _shift_floor(rr * (rr + bi) + ci, q, _NB, ok), cl


@triton.jit
def _terms(xs, m, use, good, live, x0, nx0, bi, ci, m31, inv, IBERT: tl.constexpr):
    """The row sum's terms of a key tile (I-ViT: ``e``; I-BERT: ``e16``, its 16-bit
    requantisation), the floor clamps, the requantisation clamps (I-BERT) and the lanes
    whose ``y`` takes part (``ok``): used keys of good rows (I-BERT: of live rows)."""
    ok = use & good[:, None]
    if IBERT:
        e, cl = _e_ibert(xs, m, ok, x0, nx0, bi, ci)
        okl = use & live[:, None]
        v = _rne((e.to(tl.float64) * m31) * inv, True)  # two float64 roundings, as torch
        rq = okl & (v > _E16_MAX)
        t = tl.where(okl, tl.minimum(v, _E16_MAX).to(tl.float32), 0.0)  # exact: an integer
    else:
        t, cl = _e(xs, m, ok, x0, nx0)
        okl = ok
        rq = tl.zeros_like(cl)
    return t, cl, rq, okl


@triton.jit
def _scan(q, K8, b, Lk, D, offs_d, s64, sx64, qm, s32, lim, n_end, REQ: tl.constexpr,
          BM: tl.constexpr, BN: tl.constexpr):
    """Pass 1 over key tiles of ``BN``: ``(used count, good rows, m)``: a row with a used
    NaN / ``+inf`` is bad, one with no used key empty; ``m`` the row max of ``xs`` over the
    used keys (order-free), 0 for rows not good."""
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
    return cnt, good, tl.where(good, m, 0.0)


@triton.jit
def _entry(S64, SX64, CST, qmax, b):
    """Entry ``b``'s constants: ``(s_ent, s_x, s, x0, n x0, bi, ci, qmax)`` (the kernels'
    ``S64``, ``SX64``, ``CST`` rows and ``qmax`` as float64)."""
    c = CST + b * 5
    return (tl.load(S64 + b), tl.load(SX64 + b), tl.load(c), tl.load(c + 1), tl.load(c + 2),
            tl.load(c + 3), tl.load(c + 4), qmax.to(tl.float64))


@triton.jit
def _y_tile(q, K8, b, Lk, D, n0, offs_d, s64, sx64, qm, s32, lim, m, good, live, x0, nx0, bi,
            ci, m31, inv, f, osc, REQ: tl.constexpr, IBERT: tl.constexpr, BN3: tl.constexpr):
    """Pass 3 on the key tile from ``n0``: ``(y, zero outputs per row)``, ``y =
    floor(fp32(fp32(t f) osc))`` on the lanes that take part, 0 elsewhere (the caller loads
    the v8 tile after its row sums: loaded here, the tile stays live longer, and the kernel
    with requantised logits measured 11 % slower on the H100)."""
    cols = n0 + tl.arange(0, BN3)
    x, xs, use = _xs(q, K8, b, Lk, D, cols, offs_d, s64, sx64, qm, s32, lim, REQ)
    t, cl, rq, ok = _terms(xs, m, use, good, live, x0, nx0, bi, ci, m31, inv, IBERT)
    y = tl.where(ok, _floor((t * f[:, None]) * osc), 0.0)
    return y, tl.sum((ok & (y == 0.0)).to(tl.int32), axis=1)


@triton.jit(do_not_specialize=("qmax", "kmax32"))
def _rows_kernel(Q8, K8, V8, S64, SX64, CST, MUL, SVU, MROW, SROW, OUT, INFO, b0, Lq, Lk, D,
                 DV, shift, qmax, kmax32,
                 IBERT: tl.constexpr, PRE: tl.constexpr, CAUSAL: tl.constexpr, REQ: tl.constexpr,
                 OUT_BITS: tl.constexpr, ND: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                 SUB: tl.constexpr, BN3: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr):
    """Rows ``BM`` of entry ``b = b0 + program_id(1)``: ``OUT[b, rows]`` float32 and
    ``INFO[b, rows, 0:5]`` int64 (state, floor clamps, I-ViT's sum clamp or I-BERT's
    requantisation clamps, zero outputs, ``sum y``).  q8 ``(B, Lq, D)``, k8 ``(B, Lk, D)``,
    v8 ``(B, Lk, DV)`` (one per query entry); per entry: ``S64`` the logit unit ``s_ent``,
    ``SX64`` the requantisation scale (float64 ``(B,)``), ``CST`` float32 ``(B, 5)`` (I-ViT
    ``(s, x0, n x0, -, -)``, I-BERT ``(s, x0i, n x0i, bi, ci)``), ``MUL`` float64 ``(B, 2)``
    I-BERT's ``(m31, 2**-shift)`` (read with ``IBERT``), ``SVU`` float64 ``s_v unit``;
    ``qmax`` the largest logit code (``REQ``); rows of at most ``kmax32`` keys may sum their
    digit products in int32.  ``PRE``: pass 1's row max and state come from ``MROW``,
    ``SROW`` (float32 / int32 ``(B, Lq)``, written by :func:`_ibert_emax_kernel`, which ran
    the same pass) instead of being computed again."""
    b = b0 + tl.program_id(1)
    r0 = tl.program_id(0) * BM
    offs_m, rok, lim, n_end = row_range(r0, Lq, Lk, shift, CAUSAL, BM)
    offs_d = tl.arange(0, BD)
    offs_v = tl.arange(0, BDV)
    q = q_tile(Q8, b, offs_m, rok, Lq, D, offs_d)
    s64, sx64, s32, x0, nx0, bi, ci, qm = _entry(S64, SX64, CST, qmax, b)

    # pass 1: used keys, bad rows and the row max of xs
    if PRE:
        rw = b.to(tl.int64) * Lq + offs_m
        m = tl.load(MROW + rw, mask=rok, other=0.0)
        st = tl.load(SROW + rw, mask=rok, other=0)
        cnt = (st != _ST_EMPTY).to(tl.int32)
        good = st == _ST_GOOD
    else:
        cnt, good, m = _scan(q, K8, b, Lk, D, offs_d, s64, sx64, qm, s32, lim, n_end, REQ, BM,
                             BN)
    if IBERT:
        m31 = tl.load(MUL + b * 2)
        inv = tl.load(MUL + b * 2 + 1)
        # m31 = 0: the group has no positive e, its rows are NaN
        live = good & ((tl.zeros([BM], dtype=tl.float64) + m31) > 0.0)
    else:
        m31 = s64
        inv = s64
        live = good

    # pass 2: the terms, z left to right in float32, the clamps, the row's largest term
    z = tl.zeros([BM], dtype=tl.float32)
    tmax = tl.zeros([BM], dtype=tl.float32)
    nfl = tl.zeros([BM], dtype=tl.int32)
    nrq = tl.zeros([BM], dtype=tl.int32)
    for n0 in range(0, n_end, SUB):
        cols = n0 + tl.arange(0, SUB)
        x, xs, use = _xs(q, K8, b, Lk, D, cols, offs_d, s64, sx64, qm, s32, lim, REQ)
        t, cl, rq, okl = _terms(xs, m, use, good, live, x0, nx0, bi, ci, m31, inv, IBERT)
        nfl += tl.sum(cl.to(tl.int32), axis=1)
        nrq += tl.sum(rq.to(tl.int32), axis=1)
        tmax = tl.maximum(tmax, tl.max(t, axis=1))
        z = seq_cols(z, t, BM, SUB)
    if IBERT:
        zs = tl.where(live, z, 1.0)
        f = _floor(tl.math.div_rn(tl.zeros_like(zs) + _TWO32, zs))
        col2 = nrq
    else:
        sc = z >= _TWO31
        z = tl.where(sc, _TWO31, z)
        zs = tl.where(good, z, 1.0)
        f = _floor(tl.math.div_rn(tl.zeros_like(zs) + _TWO31, zs))
        col2 = (sc & good).to(tl.int32)
    osc = 1.0 / (1 << (32 - OUT_BITS))  # 2**-(32 - out_bits), exact
    ytop = tl.max(tl.where(live, _floor((tmax * f) * osc), 0.0), axis=0)

    # pass 3: y, its row sums, the zero outputs and y v8 in 7-bit digits
    nzero = tl.zeros([BM], dtype=tl.int32)
    ysum = tl.zeros([BM], dtype=tl.int64)
    if (ytop < (1 << (7 * ND))) & (Lk <= kmax32):  # ND int32 accumulators
        a0 = tl.zeros([BM, BDV], dtype=tl.int32)
        a1 = tl.zeros([BM, BDV], dtype=tl.int32)
        a2 = tl.zeros([BM, BDV], dtype=tl.int32)
        for n0 in range(0, n_end, BN3):
            y, nz = _y_tile(q, K8, b, Lk, D, n0, offs_d, s64, sx64, qm, s32, lim, m, good, live,
                            x0, nx0, bi, ci, m31, inv, f, osc, REQ, IBERT, BN3)
            nzero += nz
            yi = y.to(tl.int32)  # y < 2**21
            ysum += tl.sum(yi, axis=1).to(tl.int64)
            cols = n0 + tl.arange(0, BN3)
            v = kv_tile(V8, b, Lk, DV, cols, cols < Lk, offs_v)
            a0 = tl.dot((yi & 127).to(tl.int8), v, a0, out_dtype=tl.int32)
            if ND >= 2:
                a1 = tl.dot(((yi >> 7) & 127).to(tl.int8), v, a1, out_dtype=tl.int32)
            if ND >= 3:
                a2 = tl.dot((yi >> 14).to(tl.int8), v, a2, out_dtype=tl.int32)
        acc = a0.to(tl.int64) + (a1.to(tl.int64) << 7) + (a2.to(tl.int64) << 14)
    else:  # large y (I-ViT's clamped sums) or long rows: six digits a tile into int64
        acc = tl.zeros([BM, BDV], dtype=tl.int64)
        for n0 in range(0, n_end, BN3):
            y, nz = _y_tile(q, K8, b, Lk, D, n0, offs_d, s64, sx64, qm, s32, lim, m, good, live,
                            x0, nx0, bi, ci, m31, inv, f, osc, REQ, IBERT, BN3)
            nzero += nz
            yl = y.to(tl.int64)  # y < 2**40
            ysum += tl.sum(yl, axis=1)
            cols = n0 + tl.arange(0, BN3)
            v = kv_tile(V8, b, Lk, DV, cols, cols < Lk, offs_v)
            for k in tl.static_range(6):
                dg = ((yl >> (7 * k)) & 127).to(tl.int8)
                acc += tl.dot(dg, v, out_dtype=tl.int32).to(tl.int64) << (7 * k)

    svu = tl.load(SVU + b)
    o = (acc.to(tl.float64) * svu).to(tl.float32)
    o = tl.where(live[:, None], o, float("nan"))
    ob = b.to(tl.int64) * Lq * DV
    tl.store(OUT + ob + offs_m[:, None].to(tl.int64) * DV + offs_v[None, :], o,
             mask=rok[:, None] & (offs_v[None, :] < DV))
    # STATE_EMPTY / _ROW / _BAD / _DEAD
    state = tl.where(cnt > 0, tl.where(good, tl.where(live, 1, 3), 2), 0)
    ib = INFO + (b.to(tl.int64) * Lq + offs_m) * 5
    tl.store(ib, state.to(tl.int64), mask=rok)
    tl.store(ib + 1, nfl.to(tl.int64), mask=rok)
    tl.store(ib + 2, col2.to(tl.int64), mask=rok)
    tl.store(ib + 3, nzero.to(tl.int64), mask=rok)
    tl.store(ib + 4, ysum, mask=rok)


@triton.jit(do_not_specialize=("qmax",))
def _ibert_emax_kernel(Q8, K8, S64, SX64, CST, OUT, MROW, SROW, b0, Lq, Lk, D, shift, qmax,
                       CAUSAL: tl.constexpr, REQ: tl.constexpr, BM: tl.constexpr,
                       BN: tl.constexpr, BD: tl.constexpr):
    """``OUT[b, i]`` (float32 ``(B, Lq)``): the largest I-BERT ``e`` of row ``i`` of entry
    ``b = b0 + program_id(1)`` over its used keys, ``-1`` for a row that is not good (the
    torch path's ``where(ok, e, -1).amax``); arguments as :func:`_rows_kernel`'s.  Pass 1,
    whose row max and state (``_ST_*``) it writes to ``MROW``, ``SROW`` for the row kernel,
    then ``e`` over key tiles of ``BN`` (a maximum: any order)."""
    b = b0 + tl.program_id(1)
    r0 = tl.program_id(0) * BM
    offs_m, rok, lim, n_end = row_range(r0, Lq, Lk, shift, CAUSAL, BM)
    offs_d = tl.arange(0, BD)
    q = q_tile(Q8, b, offs_m, rok, Lq, D, offs_d)
    s64, sx64, s32, x0, nx0, bi, ci, qm = _entry(S64, SX64, CST, qmax, b)
    cnt, good, m = _scan(q, K8, b, Lk, D, offs_d, s64, sx64, qm, s32, lim, n_end, REQ, BM, BN)
    rw = b.to(tl.int64) * Lq + offs_m
    tl.store(MROW + rw, m, mask=rok)
    tl.store(SROW + rw, tl.where(cnt > 0, tl.where(good, _ST_GOOD, _ST_BAD), _ST_EMPTY),
             mask=rok)
    em = tl.full([BM], -1.0, tl.float32)
    for n0 in range(0, n_end, BN):
        cols = n0 + tl.arange(0, BN)
        x, xs, use = _xs(q, K8, b, Lk, D, cols, offs_d, s64, sx64, qm, s32, lim, REQ)
        ok = use & good[:, None]
        e, cl = _e_ibert(xs, m, ok, x0, nx0, bi, ci)
        em = tl.maximum(em, tl.max(tl.where(ok, e, -1.0), axis=1))
    tl.store(OUT + b.to(tl.int64) * Lq + offs_m, em, mask=rok)


@triton.jit
def _row_absmax_kernel(Q8, K8, OUT, b0, Lq, Lk, D, shift, CAUSAL: tl.constexpr,
                       BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr):
    """``OUT[b, i] = max |S[i, j]|`` over the keys row ``i`` of entry ``b = b0 +
    program_id(1)`` sees (0 for a row that sees none); int32 ``(B, Lq)``."""
    b = b0 + tl.program_id(1)
    r0 = tl.program_id(0) * BM
    offs_m, rok, lim, n_end = row_range(r0, Lq, Lk, shift, CAUSAL, BM)
    offs_d = tl.arange(0, BD)
    q = q_tile(Q8, b, offs_m, rok, Lq, D, offs_d)
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
        for b0, nb in grid_entries(B):
            _row_absmax_kernel[(triton.cdiv(Lq, bm), nb)](
                q8, k8, out, b0, Lq, Lk, d, Lk - Lq, CAUSAL=bool(causal), BM=bm, BN=bn,
                BD=pow2(d, 32), num_warps=warps, num_stages=stages, **LAUNCH_OPTS)
    return out


def _launch_rows(ibert: bool, q8, k8, v8, s64, sx64, cst, mul, svu, qmax, out_bits, causal,
                 requant, launch, scan=None):
    import torch

    B, Lq, d = q8.shape
    Lk, dv = k8.shape[1], v8.shape[2]
    out = torch.empty((B, Lq, dv), dtype=torch.float32, device=q8.device)
    info = torch.zeros((B, Lq, N_INFO), dtype=torch.int64, device=q8.device)
    if B == 0 or Lq == 0:
        return out, info
    bm, bn, sub, bn3, warps, stages = LAUNCH if launch is None else launch
    nd = -(-(int(out_bits) + int(ibert)) // 7)  # digits of y <= 2**(out_bits - 1) / 2**out_bits
    mrow, srow = (out, info) if scan is None else scan  # (not read without a scan)
    with device_guard(q8):
        for b0, nb in grid_entries(B):
            _rows_kernel[(triton.cdiv(Lq, bm), nb)](
                q8, k8, v8, s64, sx64, cst, mul, svu, mrow, srow, out, info, b0, Lq, Lk, d, dv,
                Lk - Lq, int(qmax), int(ACC32_MAX_KEYS), IBERT=bool(ibert),
                PRE=scan is not None, CAUSAL=bool(causal),
                REQ=bool(requant), OUT_BITS=int(out_bits), ND=nd, BM=bm, BN=bn, SUB=sub,
                BN3=bn3, BD=pow2(d, 32), BDV=pow2(dv, 16), num_warps=warps, num_stages=stages,
                **LAUNCH_OPTS)
    return out, info


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

    c5 = torch.zeros((cst.shape[0], 5), dtype=torch.float32, device=cst.device)
    c5[:, :3] = cst
    return _launch_rows(False, q8, k8, v8, s64, sx64, c5, s64, svu, qmax, out_bits, causal,
                        requant, launch)


def ibert_emax(q8, k8, s64, sx64, cst, *, qmax: int, causal: bool, requant: bool,
               launch: tuple | None = None, with_scan: bool = False):
    """Per row the largest I-BERT ``e`` over its used keys, float32 ``(B, Lq)``, ``-1`` for
    rows that are empty or bad (the earlier pass of the torch path; arguments as
    :func:`ibert_rows`').  ``with_scan``: returns ``(e max, scan)``, ``scan`` the rows' max
    of ``xs`` and state from the kernel's first pass, for :func:`ibert_rows`' ``scan=``
    (which then does not compute that pass again)."""
    import torch

    B, Lq, d = q8.shape
    Lk = k8.shape[1]
    out = torch.full((B, Lq), -1.0, dtype=torch.float32, device=q8.device)
    mrow = torch.zeros((B, Lq), dtype=torch.float32, device=q8.device)
    srow = torch.zeros((B, Lq), dtype=torch.int32, device=q8.device)
    if B == 0 or Lq == 0:
        return (out, (mrow, srow)) if with_scan else out
    bm, bn, _, _, warps, stages = LAUNCH if launch is None else launch
    with device_guard(q8):
        for b0, nb in grid_entries(B):
            _ibert_emax_kernel[(triton.cdiv(Lq, bm), nb)](
                q8, k8, s64, sx64, cst, out, mrow, srow, b0, Lq, Lk, d, Lk - Lq, int(qmax),
                CAUSAL=bool(causal), REQ=bool(requant), BM=bm, BN=bn, BD=pow2(d, 32),
                num_warps=warps, num_stages=stages, **LAUNCH_OPTS)
    return (out, (mrow, srow)) if with_scan else out


def ibert_rows(q8, k8, v8, s64, sx64, cst, mul, svu, *, qmax: int, out_bits: int,
               causal: bool, requant: bool, launch: tuple | None = None, scan=None):
    """Run the fused ``ibert`` kernel (module docstring).

    Args:
        q8, k8, v8, s64, sx64: as :func:`ivit_rows`'.
        cst: float32 ``(B, 5)`` ``(s, x0i, n x0i, bi, ci)`` of each entry's group
            (``_ibert_consts``); mul: float64 ``(B, 2)`` the group's ``(m31, 2**-shift)``
            (``m31 = 0``: the group has no positive ``e``, its rows are NaN); svu: float64
            ``(B,)`` ``s_v 2**-out_bits``.
        qmax, out_bits, causal, requant, launch: as :func:`ivit_rows`'.
        scan: the ``scan`` of :func:`ibert_emax` (``with_scan=True``) on the same inputs, or
            None (the kernel's first pass runs again).

    Returns:
        ``(out float32 (B, Lq, dv), info int64 (B, Lq, 5))``: per row its state
        (:data:`STATE_EMPTY`, :data:`STATE_ROW`, :data:`STATE_BAD`, :data:`STATE_DEAD`), floor
        clamps, requantisation clamps, zero outputs and the sum of its ``y``.
    """
    return _launch_rows(True, q8, k8, v8, s64, sx64, cst, mul, svu, qmax, out_bits, causal,
                        requant, launch, scan)


__all__ = ["ivit_rows", "ibert_rows", "ibert_emax", "row_absmax", "LAUNCH", "STATE_EMPTY",
           "STATE_ROW", "STATE_BAD", "STATE_DEAD", "N_INFO", "ACC32_MAX_KEYS"]
