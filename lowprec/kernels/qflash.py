"""QFlash: integer-only FlashAttention (specs/attention.md section 4; seed ``qflash.txt``,
Algorithm 1, Algorithm 2, equations 5-10 and 13-16, appendix B).

Everything between the int8 inputs and the int8 output is integer arithmetic:

* host constants (:func:`host_constants`, per-tensor scales only, one scale for every batch
  entry and head): ``s_x = max|x| / 127``; ``s = scale * log2(e) * s_q * s_k`` (the value of one
  score unit in base 2); ``R = round(1 / s)`` (the integer "1.0", eq. 7);
  ``exp_M = round(-s * 2**16)`` (eq. 16); ``req_M = round(127 * s * 2**16)`` (eq. 10);
  ``l_M = acc_M = round(2**30 / R)`` (ScaleRelease, eq. 14); ``x8 = clamp(RNE(x / s_x), -128,
  127)`` (eq. 2);
* :func:`shift_exp2` (Algorithm 2): ``q = (x * exp_M) >> 16``, ``r = x + q * R``,
  ``y = ((r >> 1) + R) >> q``, i.e. ``R * 2**(s x)`` with the linear fractional part of eq. 7;
* :func:`requant` (eq. 10): ``int8_wrap((p * req_M + 2**15) >> 16)``: ``R`` becomes ``127``;
* :func:`scale_release` (eq. 14): ``int32((int64(x) * alpha * M + 2**29) >> 30)``;
* :func:`qflash_core`: Algorithm 1 per query row over key tiles of ``block_k``.

Integer semantics: every int32 step wraps (two's complement) like the GPU kernel, ScaleRelease
is int64 inside, ``>>`` is arithmetic, and a shift by a count outside ``[0, 31]`` gives what
the GPU's clamped shift gives (``0`` for a non-negative operand, ``-1`` for a negative one).
Hazards are counted rather than hidden (:class:`QFlashStats`): ``exp_M == 0`` (``s < 2**-17``:
no range reduction, accuracy collapses), int32 overflow of ``x * exp_M``, ``requant`` of a
value that leaves int8 (``p = R`` can give 128 and wrap to -128), any other int32 wrap, int8
wrap of the output, a zero denominator, and negative weights (a ShiftExp2 result made negative
by the multiply-shift quotient falling short for large ``|x|``, when it reaches ``l`` or
``acc``).  ``on_hazard="raise"`` turns any of them into :class:`QFlashHazardError`.

Choices (spec section 4 and the authors' published kernel; every one a parameter where a user
could want the other): ``m_init = -2**20`` (the code; the paper's Algorithm 1 says ``-2**21``);
``l`` starts at 1 (the code; the paper says 0); the key tile is ``block_k = 32`` (the authors'
fixed configuration); every key tile is visited for every query row, fully masked ones
included (the authors' masked kernel), so the result does not depend on a query tile size and
there is no ``block_q``; padded keys of a partial last tile score ``-2**20`` and their ``P8``
counts in ``l`` (as in the authors' kernel); masks are the int32 additive ``bias`` of the
authors' masked kernel, ``-2**20`` (:data:`MASK_BIAS`) for a masked key; the final division is
``trunc(fp32(acc) / fp32(l))`` with the GPU's saturating float-to-int conversion (NaN -> 0),
then int8 wrap.  A query row that sees no key has no meaningful integer output; the float
pipeline returns NaN for it.

The running ``l`` and ``acc`` take ``alpha`` by ScaleRelease (eq. 14, Algorithm 1 lines 14-15,
the authors' kernel): option ``scale_update="release"``.  ``scale_update="accumulate"`` is the
alternative of the paper's appendix B.1.1 (eq. 13, "Scale Accumulation", compared in its
Figure 5; not in the authors' code): no release, so each tile multiplies the running sums'
scale by ``alpha``'s ``1 / R`` and the new tile's ``rowsum(P8)`` and ``P8 v8`` enter at that
accumulated scale, multiplied by ``R**t`` at key tile ``t``.  Eq. 13 writes the new term as
``floor(P8 V8 / s_alpha)`` with one ``s_alpha``; only the accumulated ``s_alpha**t`` keeps the
sum's units consistent, so that is our reading (no floor is left: ``R**t`` is an integer).  In
exact arithmetic it equals ScaleRelease without its rounding; in int32 it wraps once
``R**t`` times a tile's sum leaves int32 (``R = 5590`` at U(-4, 4), d = 64: at the third tile).

Host arithmetic differs from the authors' torch code in one documented way: scales and
``x / s_x`` are computed in float64 from the float32 inputs (the authors use the input dtype,
e.g. float16); constants use Python's ``round`` (ties to even) on float64, as theirs does.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np

from ..stats import Stats
from . import Scheme, register
from ._check import check_bool, check_choice, check_int, check_real, float_input, int_input
from ._gemm import RED
from ._int8 import (
    FINITE_WHY,
    quantize_int8,
    row_scales,
    scoped_amax,
    score_chunks,
)
from ._qflash_rows import (
    _NCOUNT,
    INT32_MAX,
    INT32_MIN,
    MASK_BIAS,
    SHIFT_EXP,
    SHIFT_RELEASE,
    _qflash_kernel,
    _release_arr,
    _requant_arr,
    _shift_exp2_arr,
)
from .problem import (
    INT8_D_MAX,
    LOG2E,
    MASK_FLOOR,
    SCALE_SCOPES,
    Problem,
    check_block,
    core_lead,
    flat_lead,
    int8_input,
    kernel_array,
    mask_planes,
    sized,
)

BLOCK_K_DEFAULT = 32  # attention.md 4: the authors' fixed key tile (BLOCK_N = 32)
M_INIT_DEFAULT = -(1 << 20)  # attention.md 4: the authors' code (Alg. 1 line 6 says -2**21)
INT8_QMAX = 127  # eq. 2: 2**(b-1) - 1 for b = 8
D_MAX = INT8_D_MAX  # largest d whose int8 dot products cannot wrap int32
HAZARD_POLICIES = ("count", "raise")
#: how the running l and acc take alpha (appendix B.1.1): ScaleRelease (eq. 14, the default)
#: or Scale Accumulation (eq. 13)
SCALE_UPDATES = ("release", "accumulate")


class QFlashHazardError(ValueError, ArithmeticError):
    """Raised by the ``qflash`` scheme with ``on_hazard="raise"`` when an integer hazard of
    specs/attention.md section 4 occurred (the message lists the counts)."""


# ------------------------------------------------------------------------------------------
# host constants


@dataclass(frozen=True)
class QFlashConstants:
    """The host-side constants of one QFlash call (spec section 4).

    Attributes:
        s_q, s_k, s_v: per-tensor scales ``max|x| / 127`` (1.0 for an all-zero tensor, whose
            codes are 0 whatever the scale).
        scale: the softmax scale.
        s: ``scale * log2(e) * s_q * s_k``, one score unit in base-2 exponent units.
        R: ``round(1 / s)``, the integer that represents 1.0 (eq. 7).
        exp_M: ``round(-s * 2**16)`` (eq. 16); 0 is a hazard (no range reduction).
        req_M: ``round(127 * s * 2**16)`` (eq. 10).
        l_M, acc_M: ``round(2**30 / R)`` (ScaleRelease multipliers, eq. 14).
    """

    s_q: float
    s_k: float
    s_v: float
    scale: float
    s: float
    R: int
    exp_M: int
    req_M: int
    l_M: int
    acc_M: int

    @classmethod
    def from_scales(cls, s_q: float, s_k: float, s_v: float, scale: float) -> QFlashConstants:
        """Constants from given scales (float64 arithmetic, Python ``round`` = ties to even).

        Raises ValueError when a scale is not finite and positive, or when ``R`` does not fit
        ``[1, 2**31 - 1]`` (``s >= 2`` or ``s < 2**-31``: the int32 hazards of the spec).

        Example::

            >>> c = QFlashConstants.from_scales(4 / 127, 4 / 127, 4 / 127, 0.125)
            >>> c.R, c.exp_M
            (5590, -12)
        """
        vals = {"s_q": s_q, "s_k": s_k, "s_v": s_v, "scale": scale}
        for name, val in vals.items():
            check_real(val, name, positive=True)
        s = float(scale) * LOG2E * (float(s_q) * float(s_k))
        inv = 1.0 / s
        # round(0.5) = 0 (ties to even): s = 2 exactly also gives R = 0, so test R itself
        if not math.isfinite(inv) or round(inv) < 1:
            raise ValueError(
                f"score unit s = {s:.6g} >= 2 gives R = round(1/s) = 0; QFlash needs "
                "s < 2 (smaller q/k magnitudes or scale)")
        R = round(inv)
        if R > INT32_MAX:
            raise ValueError(
                f"score unit s = {s:.6g} < 2**-31 gives R = round(1/s) = {R}, which does not "
                "fit int32")
        exp_M = round(-s * (1 << SHIFT_EXP))
        req_M = round(INT8_QMAX * s * (1 << SHIFT_EXP))
        l_M = round((1 << SHIFT_RELEASE) / R)
        return cls(float(s_q), float(s_k), float(s_v), float(scale), s, int(R), int(exp_M),
                   int(req_M), int(l_M), int(l_M))

    @property
    def exp_M_zero(self) -> bool:
        """True when ``exp_M == 0`` (``s < 2**-17``): ShiftExp2 does no range reduction."""
        return self.exp_M == 0

    def to_dict(self) -> dict:
        """The constants as a JSON-ready dict."""
        return asdict(self)


def _float_array(x, what: str) -> np.ndarray:
    return np.asarray(float_input(x, what, finite=True, why=FINITE_WHY),
                      dtype=np.float64)


def _tensor_scale(a: np.ndarray) -> float:
    return float(row_scales(a.reshape((1, -1)))[0])


def host_constants(q, k, v, scale: float | None = None) -> QFlashConstants:
    """Per-tensor scales and integer constants of a QFlash call (spec section 4, eq. 2).

    Args:
        q, k, v: float arrays (numpy or CPU torch) ``(..., Lq, d)``, ``(..., Lk, d)``,
            ``(..., Lk, dv)``; one scale per tensor over every batch entry and head.
        scale: softmax scale, default ``1 / sqrt(d)``.

    Returns:
        :class:`QFlashConstants`.

    Raises:
        TypeError for non-float inputs; ValueError for NaN/Inf inputs or when ``R`` does not
        fit int32 (see :meth:`QFlashConstants.from_scales`).

    Example::

        >>> c = host_constants(q, k, v)
        >>> q8 = quantize_int8(q, c.s_q)
    """
    qa = _float_array(q, "q")
    ka = _float_array(k, "k")
    va = _float_array(v, "v")
    if qa.ndim < 2 or ka.ndim < 2:
        raise ValueError(f"q and k must have shape (..., L, d), got {qa.shape} and {ka.shape}")
    if scale is None:
        d = qa.shape[-1]
        if d == 0:
            raise ValueError("head dimension d is 0: give an explicit scale")
        scale = 1.0 / math.sqrt(d)
    return QFlashConstants.from_scales(_tensor_scale(qa), _tensor_scale(ka), _tensor_scale(va),
                                       scale)


# ------------------------------------------------------------------------------------------
# the integer primitives (their Numba kernels: _qflash_rows.py)


def _int32_array(x, what: str) -> np.ndarray:
    arr = int_input(x, what, INT32_MIN, INT32_MAX, allowed="integer dtypes holding int32 values",
                    range_name="int32")
    return np.ascontiguousarray(arr, dtype=np.int64)


def _int32_scalar(x, what: str, lo: int = INT32_MIN) -> int:
    return check_int(x, what, lo, INT32_MAX, type_error=True)


def shift_exp2(x, R: int, exp_M: int, division: bool = False) -> np.ndarray:
    """Integer base-2 exponential of Algorithm 2: ``y ~ R * 2**(s * x)`` for ``x <= 0``.

    ``q = (x * exp_M) >> 16`` (or ``q = (-x) // R`` with ``division=True``, eq. 15, C
    truncation), ``r = x + q * R``, ``y = ((r >> 1) + R) >> q``; int32 wrapping throughout,
    arithmetic shifts, a shift count outside ``[0, 31]`` gives 0 (or -1 for a negative operand).
    Positive ``x`` goes through the same integer formula (it is meant for ``x <= 0``).

    Args:
        x: integer array (values in int32).
        R: ``round(1 / s)``, 1 <= R < 2**31.
        exp_M: ``round(-s * 2**16)``, int32.
        division: compute ``q`` by integer division instead of the multiply-shift.

    Returns:
        int32 array of ``x``'s shape.

    Example::

        >>> shift_exp2(np.array([0, -100, -5590]), 5590, -12)
        array([5590, 5540, 2795], dtype=int32)
    """
    xa = _int32_array(x, "x")
    R = _int32_scalar(R, "R", lo=1)
    exp_M = _int32_scalar(exp_M, "exp_M")
    division = check_bool(division, "division")
    out = np.empty(xa.shape, dtype=np.int32)
    _shift_exp2_arr(xa.reshape(-1), R, exp_M, division, out.reshape(-1))
    return out


def requant(p, req_M: int) -> np.ndarray:
    """Requantization of eq. 10: ``int8_wrap((p * req_M + 2**15) >> 16)`` (int32 wrapping).

    Args:
        p: integer array (values in int32), e.g. :func:`shift_exp2` outputs in ``[0, R]``.
        req_M: ``round(127 * s * 2**16)``, int32.

    Returns:
        int8 array of ``p``'s shape (a value above 127 wraps, as the GPU's int8 cast does).

    Example::

        >>> requant(np.array([5590, 2795]), 1489)
        array([127,  64], dtype=int8)
    """
    pa = _int32_array(p, "p")
    req_M = _int32_scalar(req_M, "req_M")
    out = np.empty(pa.shape, dtype=np.int8)
    _requant_arr(pa.reshape(-1), req_M, out.reshape(-1))
    return out


def scale_release(x, alpha, M: int) -> np.ndarray:
    """ScaleRelease of eq. 14: ``int32((int64(x) * alpha * M + 2**29) >> 30)``.

    The product is int64 (wrapping on int64 overflow), the result wraps to int32.

    Args:
        x: integer array (int32 values), the running ``l`` or ``acc``.
        alpha: integer array broadcastable to ``x`` (int32 values), ``shift_exp2(m - m_new)``.
        M: ``l_M`` or ``acc_M`` (``round(2**30 / R)``), int32.

    Returns:
        int32 array of the broadcast shape.

    Example::

        >>> scale_release(np.array([1000]), np.array([5590]), 192083)
        array([1000], dtype=int32)
    """
    xa = _int32_array(x, "x")
    aa = _int32_array(alpha, "alpha")
    M = _int32_scalar(M, "M")
    try:
        shape = np.broadcast_shapes(xa.shape, aa.shape)
    except ValueError:
        raise ValueError(f"x {xa.shape} and alpha {aa.shape} do not broadcast") from None
    xb = np.ascontiguousarray(np.broadcast_to(xa, shape)).reshape(-1)
    ab = np.ascontiguousarray(np.broadcast_to(aa, shape)).reshape(-1)
    out = np.empty(shape, dtype=np.int32)
    _release_arr(xb, ab, M, out.reshape(-1))
    return out


# ------------------------------------------------------------------------------------------
# statistics


@dataclass
class QFlashStats(Stats):
    """Tile and hazard statistics of QFlash (specs/attention.md sections 4 and 8).

    Per call, one int64 array ``(B,)`` per counter (leading dims flattened into ``B``):

    Attributes:
        tiles: (query row, key tile) steps (every key tile is visited for every row).
        rescales: steps after a row's first tile in which its running max grew.
        exp_overflows: ShiftExp2 evaluations whose ``x * exp_M`` overflowed int32.
        requant_wraps: ``requant`` results that left int8 and wrapped (``p = R`` -> 128).
        int32_wraps: every other int32 wrap (scores + bias, ``S - m``, ``q * R``, ``r``,
            requant product, ScaleRelease result, ``l``/``acc`` updates; with
            ``scale_update="accumulate"`` the products ``l * alpha``, ``acc * alpha``, the
            tile terms times ``R**t`` and ``R**t`` itself, once per row and tile).
        output_wraps: output elements whose ``trunc(acc / l)`` left int8 and wrapped.
        zero_denominators: rows that ended with ``l == 0``.
        negative_weights: negative ``P8`` (not from an int8 wrap) and negative ``alpha``
            after a row's first tile.  The multiply-shift quotient ``q`` falls short of
            ``-x / R`` for large ``|x|`` (``exp_M`` is rounded), then ``r < -2 R``,
            ``(r >> 1) + R < 0`` and ShiftExp2 is negative (-1 after the clamped shift).
            Usually ``requant`` maps that to 0 and it is harmless (masked keys, far keys);
            counted here are the cases where it reaches ``l`` and ``acc`` (large
            amplitudes).
        m_init_rows: rows that see a key but whose every score (plus bias) lies below
            ``m_init``: the running max never leaves ``m_init``, every weight ShiftExp2 gives
            is 0 and the row's output is 0 (issue 12 item 4; e.g. q = 1, k = -1 at d = 128).
        exp_M_zero: calls whose ``exp_M`` was 0 (``s < 2**-17``).
        constants: the host constants, one dict per call and sequence (``scale_scope=
            "visible"``: each batch element has its own scales and constants; ``"tensor"``: one
            per call; an empty dict for core calls).
        calls: number of calls merged.
    """

    tiles: list = field(default_factory=list)
    rescales: list = field(default_factory=list)
    exp_overflows: list = field(default_factory=list)
    requant_wraps: list = field(default_factory=list)
    int32_wraps: list = field(default_factory=list)
    output_wraps: list = field(default_factory=list)
    zero_denominators: list = field(default_factory=list)
    negative_weights: list = field(default_factory=list)
    m_init_rows: list = field(default_factory=list)
    exp_M_zero: int = 0
    constants: list = field(default_factory=list)
    calls: int = 0

    _COUNTERS = ("tiles", "rescales", "exp_overflows", "requant_wraps", "int32_wraps",
                 "output_wraps", "zero_denominators", "negative_weights",
                 "m_init_rows")  # kernel columns
    _totals = _COUNTERS
    _hazards = ("exp_M_zero", "total_exp_overflows", "total_requant_wraps", "total_int32_wraps",
                "total_output_wraps", "total_zero_denominators", "total_negative_weights",
                "total_m_init_rows")
    _key = ("total_rescales",)


def _stats_from_counts(cnt: np.ndarray, exp_M_zero: bool, consts: dict | None) -> QFlashStats:
    return QFlashStats.from_columns(cnt, QFlashStats._COUNTERS, exp_M_zero=int(bool(exp_M_zero)),
                                    constants=[consts] if consts is not None else [{}])


# ------------------------------------------------------------------------------------------
# the integer core


def _bias_planes(bias, lead: tuple, Lq: int, Lk: int):
    """int64 ``(M, Lq, Lk)`` planes and the per-entry map from an int32 bias broadcastable to
    ``lead + (Lq, Lk)``."""
    B = int(np.prod(lead, dtype=np.int64))
    if bias is None:
        return np.zeros((1, 0, 0), dtype=np.int64), np.zeros(B, dtype=np.int64), False
    arr = int_input(bias, "bias", INT32_MIN, INT32_MAX, range_name="int32",
                    allowed=f"integer dtypes holding int32 values (e.g. 0 and {MASK_BIAS} for "
                    "a masked key)")
    planes, bmap = mask_planes(arr, lead, Lq, Lk, "bias", np.int64)
    return planes, bmap, True


def _run_core(q8, k8, v8, R, exp_M, req_M, l_M, acc_M, block_k, bias_planes, bmap, has_bias,
              causal, m_init, division, accumulate=False):
    """Validated arrays ``(B, L, d)`` -> (o8 (B, Lq, dv), counters (B, _NCOUNT)): the scores
    by the int8 plumbing's exact GEMM in row chunks, Algorithm 1 by the kernel."""
    B, Lq, _ = q8.shape
    Lk = k8.shape[1]
    # v's codes (exact in float32) with zero keys up to whole tiles and a pv_tile step
    vi = np.zeros((v8.shape[0], -(-Lk // block_k) * block_k + RED, v8.shape[2]), np.float32)
    vi[:, :Lk] = v8
    out = np.empty((B, Lq, v8.shape[2]), dtype=np.int8)
    counts = np.zeros((B, _NCOUNT), dtype=np.int64)
    bias_planes = kernel_array(bias_planes, np.int64)
    bmap = kernel_array(bmap, np.int64)

    def work(g0, r0, S):
        return sized(_qflash_kernel, S.size)(S, vi, bias_planes, bmap, has_bias, causal, g0, r0,
                                             Lq, R, exp_M, req_M, l_M, acc_M, block_k, m_init,
                                             division, accumulate, out)

    score_chunks(q8, k8, work, counts)
    return out, counts


def qflash_core(q8, k8, v8, R: int, exp_M: int, req_M: int, l_M: int, acc_M: int,
                block_k: int = BLOCK_K_DEFAULT, bias=None, m_init: int = M_INIT_DEFAULT,
                division: bool = False, *, causal: bool = False, return_stats: bool = False,
                scale_update: str = "release"):
    """QFlash Algorithm 1 on int8 inputs -> int8 output ``o8`` (spec section 4).

    Per (batch, head) and query row ``i``: ``m = m_init``, ``l = 1``, ``acc = 0``; for each key
    tile of ``block_k`` keys: ``S = q8 k8^T + bias`` (int32; padded keys ``-2**20``),
    ``m_new = max(m, rowmax S)``, ``P8 = requant(shift_exp2(S - m_new))``,
    ``alpha = shift_exp2(m - m_new)``, ``l = scale_release(l, alpha, l_M) + rowsum(P8)``,
    ``acc = scale_release(acc, alpha, acc_M) + P8 v8``, ``m = m_new``; finally
    ``o8 = int8_wrap(trunc(fp32(acc) / fp32(l)))``.  Dequantize with ``o8 * s_v``.
    ``scale_update="accumulate"`` replaces both ScaleReleases by Scale Accumulation (eq. 13,
    appendix B.1.1): ``l = int32(l * alpha) + int32(rowsum(P8) * R**t)`` and ``acc =
    int32(acc * alpha) + int32(P8 v8 * R**t)`` at key tile ``t`` (0-based; ``R**t`` computed
    in int32 as ``int32(R**(t-1) * R)``): the running sums keep the scale ``alpha`` adds
    (``1 / R`` per tile), so a new tile enters at the accumulated scale, ``l`` and ``acc``
    grow by about ``R`` per tile and wrap int32 after a few tiles (counted in
    ``int32_wraps``); the final ratio cancels the common scale.

    Args:
        q8, k8, v8: int8 arrays ``(..., Lq, d)``, ``(..., Lk, d)``, ``(..., Lk, dv)``; leading
            (batch, head) dims broadcast.
        R, exp_M, req_M, l_M, acc_M: the constants of :class:`QFlashConstants`.
        block_k: key tile size (the authors' 32).
        bias: None or int32 additive bias broadcastable to ``(..., Lq, Lk)`` in score units;
            :data:`MASK_BIAS` (``-2**20``) masks a key.  Added with int32 wrapping.
        m_init: initial running max (``-2**20``; the paper's ``-2**21`` is the other choice).
        division: ShiftExp2 with integer division instead of multiply-shift (eq. 15).
        scale_update: ``"release"`` (ScaleRelease, eq. 14) or ``"accumulate"`` (eq. 13).
        causal: mask key ``j > i + Lk - Lq`` (bottom-right) with the bias ``-2**20``
            (replacing ``bias`` there), as the authors' masked kernel does.
        return_stats: also return a :class:`QFlashStats` (without host constants).

    Returns:
        int8 ``(..., Lq, dv)`` (and the stats).  A row that sees no key gets the integer
        result of attending over its masked keys (meaningless; the float pipeline gives NaN).

    Raises:
        TypeError for non-int8 inputs or bad option types, ValueError for shape mismatches,
        ``d > 131071`` (int32 products could wrap), constants outside int32 or ``R < 1``.

    Example::

        >>> c = host_constants(q, k, v)
        >>> q8, k8, v8 = (quantize_int8(x, s) for x, s in ((q, c.s_q), (k, c.s_k), (v, c.s_v)))
        >>> o = qflash_core(q8, k8, v8, c.R, c.exp_M, c.req_M, c.l_M, c.acc_M) * c.s_v
    """
    qa = int8_input(q8, "q8")
    ka = int8_input(k8, "k8")
    va = int8_input(v8, "v8")
    lead = core_lead(qa, ka, va)
    R = _int32_scalar(R, "R", lo=1)
    exp_M = _int32_scalar(exp_M, "exp_M")
    req_M = _int32_scalar(req_M, "req_M")
    l_M = _int32_scalar(l_M, "l_M")
    acc_M = _int32_scalar(acc_M, "acc_M")
    m_init = _int32_scalar(m_init, "m_init")
    bk = check_block(block_k, "block_k", ka.shape[-2])
    division = check_bool(division, "division")
    accumulate = check_choice(scale_update, "scale_update", SCALE_UPDATES) == "accumulate"
    causal = check_bool(causal, "causal")
    check_bool(return_stats, "return_stats")
    Lq, d = qa.shape[-2:]
    Lk, dv = va.shape[-2:]

    planes, bmap, has_bias = _bias_planes(bias, lead, Lq, Lk)
    o8, cnt = _run_core(flat_lead(qa, lead, Lq, d), flat_lead(ka, lead, Lk, d),
                        flat_lead(va, lead, Lk, dv), R, exp_M, req_M,
                        l_M, acc_M, bk, planes, bmap, has_bias, causal, m_init, division,
                        accumulate)
    o8 = o8.reshape(lead + (Lq, dv))
    if return_stats:
        return o8, _stats_from_counts(cnt, exp_M == 0, None)
    return o8


# ------------------------------------------------------------------------------------------
# the float pipeline (scheme "qflash")


def _mask_bias(prob: Problem, s: float, e0: int = 0, e1: int | None = None):
    """int64 bias planes of entries ``e0 .. e1 - 1`` from the additive float mask: -inf ->
    MASK_BIAS, finite values in score units (``mask * log2(e) / s``, RNE) clipped to
    ``[-2**20, 2**20]``; with the per-entry plane map of those entries."""
    e1 = prob.B if e1 is None else e1
    if prob.mask is None:
        return np.zeros((1, 0, 0), dtype=np.int64), prob.mask_map[e0:e1] * 0, False
    used, mmap = np.unique(prob.mask_map[e0:e1], return_inverse=True)
    m = prob.mask[used].astype(np.float64)
    masked = np.isneginf(m)
    with np.errstate(invalid="ignore", over="ignore"):
        units = np.rint(np.where(masked, 0.0, m) * LOG2E / s)
    units = np.clip(units, MASK_BIAS, -MASK_BIAS)
    planes = np.where(masked, MASK_BIAS, units).astype(np.int64)
    return planes, mmap.astype(np.int64), True


def no_key_rows(prob: Problem) -> np.ndarray | None:
    """Boolean ``(B, Lq)``: query rows that see no key, or None (kept for compatibility:
    :meth:`Problem.no_key_rows`, which :func:`lowprec.attention` applies to every scheme)."""
    return prob.no_key_rows()


def qflash_options(Lk: int, d: int, block_k, m_init, division, on_hazard, scale_scope,
                   scale_update="release"):
    """The checks of the ``qflash`` scheme's options for a call with ``Lk`` keys of head dim
    ``d``, shared by the CPU pipeline and its device path: returns ``(scope, block_k, m_init,
    division, accumulate)`` as the pipeline uses them (``accumulate``: ``scale_update ==
    "accumulate"``)."""
    check_choice(on_hazard, "on_hazard", HAZARD_POLICIES)
    scope = check_choice(scale_scope, "scale_scope", SCALE_SCOPES)
    bk = check_block(block_k, "block_k", Lk)
    m_init = _int32_scalar(m_init, "m_init")
    division = check_bool(division, "division")
    accumulate = check_choice(scale_update, "scale_update", SCALE_UPDATES) == "accumulate"
    if d > D_MAX:
        raise ValueError(f"d = {d} > {D_MAX}: int8 dot products could wrap int32")
    return scope, bk, m_init, division, accumulate


def _qflash(prob: Problem, return_stats: bool, block_k: int = BLOCK_K_DEFAULT,
            m_init: int = M_INIT_DEFAULT, division: bool = False, on_hazard: str = "count",
            scale_scope: str = "visible", scale_update: str = "release"):
    scope, bk, m_init, division, acc_mode = qflash_options(
        prob.Lk, prob.d, block_k, m_init, division, on_hazard, scale_scope, scale_update)
    for name, x in (("q", prob.q), ("k", prob.k), ("v", prob.v)):
        float_input(x, name, finite=True, why=FINITE_WHY)
    # the per-tensor scales: of each sequence over its rows and keys that take part
    # ("visible"), or of the whole tensor ("tensor", the authors'); one constant set each
    B = prob.B
    if scope == "visible":
        rows, keys = prob.taking_part()
        group = prob.sequences()
        amax = [scoped_amax(x, seen, group) for x, seen in
                ((prob.q, rows), (prob.k, keys), (prob.v, keys))]
    else:
        group = np.zeros(B, dtype=np.int64)
        amax = [np.full(B, float(np.max(np.abs(x), initial=0.0)), dtype=np.float64)
                for x in (prob.q, prob.k, prob.v)]
    s_ent = [np.where(a > 0, a / 127.0, 1.0) for a in amax]  # QFlash's float64 scales
    bounds = np.flatnonzero(np.diff(group)) + 1
    out = np.empty((B, prob.Lq, prob.dv), dtype=np.float32)
    cnt = np.zeros((B, _NCOUNT), dtype=np.int64)
    consts, zero = [], False
    for e0, e1 in zip(np.r_[0, bounds].tolist(), np.r_[bounds, B].tolist(), strict=True):
        sq, sk, sv = (float(s[e0]) for s in s_ent)
        c = QFlashConstants.from_scales(sq, sk, sv, prob.scale)
        check_exp_M(c, on_hazard)
        q8, k8, v8 = (quantize_int8(x[e0:e1], s_) for x, s_ in
                      ((prob.q, sq), (prob.k, sk), (prob.v, sv)))
        planes, bmap, has_bias = _mask_bias(prob, c.s, e0, e1)
        o8, cg = _run_core(q8, k8, v8, c.R, c.exp_M, c.req_M, c.l_M, c.acc_M, bk, planes,
                           bmap, has_bias, prob.causal, m_init, division, acc_mode)
        out[e0:e1] = (o8.astype(np.float64) * c.s_v).astype(np.float32)
        cnt[e0:e1] = cg
        consts.append(c.to_dict())
        zero = zero or c.exp_M_zero
    st = pipeline_stats(cnt, zero, consts, on_hazard)
    return out, (st if return_stats else None)


def check_exp_M(c: QFlashConstants, on_hazard: str) -> None:
    """``on_hazard="raise"``: QFlashHazardError when ``exp_M == 0`` (before the call runs)."""
    if on_hazard == "raise" and c.exp_M_zero:
        raise QFlashHazardError(
            f"exp_M = round(-s * 2**16) = 0 for score unit s = {c.s:.3g} < 2**-17: "
            "ShiftExp2 does no range reduction (inputs too small for per-tensor int8 "
            "QFlash)")


def pipeline_stats(cnt: np.ndarray, zero: bool, consts: list, on_hazard: str) -> QFlashStats:
    """The pipeline's statistics from the per-entry counters ``(B, _NCOUNT)`` and the
    constants of each group; with ``on_hazard="raise"`` QFlashHazardError lists any hazard."""
    st = _stats_from_counts(cnt, zero, None)
    st.constants = consts
    if on_hazard == "raise":
        bad = {k: n for k, n in st.hazards.items() if n}
        if bad:
            raise QFlashHazardError(
                "QFlash integer hazards (attention.md 4): "
                + ", ".join(f"{k}={n}" for k, n in bad.items())
                + "; constants " + "; ".join(f"R={d['R']}, exp_M={d['exp_M']}, "
                                              f"req_M={d['req_M']}" for d in consts))
    return st


register(Scheme(
    "qflash",
    "QFlash integer-only flash attention (per-tensor int8, ShiftExp2, ScaleRelease)",
    _qflash,
    options=("block_k", "m_init", "division", "on_hazard", "scale_scope", "scale_update"),
    stats=QFlashStats,
    order=40, error_bound=0.2,
    mask_floor=MASK_FLOOR, noise=lambda o: "int8_tensor", device="qflash_device:qflash",
))

__all__ = ["QFlashConstants", "QFlashStats", "QFlashHazardError", "host_constants",
           "quantize_int8", "shift_exp2", "requant", "scale_release", "qflash_core",
           "no_key_rows", "BLOCK_K_DEFAULT", "M_INIT_DEFAULT", "MASK_BIAS", "SHIFT_EXP",
           "SHIFT_RELEASE", "SCALE_UPDATES"]
