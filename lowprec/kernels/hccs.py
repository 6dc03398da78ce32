"""HCCS: head-calibrated clipped-linear softmax (specs/attention.md section 5; seed ``hccs.txt``,
equations 1 to 11 and Algorithm 1).

Integer core (:func:`hccs_core`), per row of int8 logits ``x`` and per-head integers
``(B, S, Dmax)``::

    m = max x                     delta = min(m - x, Dmax)          (eq. 1, 2)
    s = B - S * delta   (int32)   Z = sum s   (int32)               (eq. 3, 5)

and one of three output paths:

* ``"i16_div"`` (eq. 6, 7; T = 32767): ``rho = floor(32767 / Z)``, ``p = s * rho``; int16
  output, one unit = 1/32767.
* ``"i8_div"`` (eq. 8; T = 255, R = INV_SHIFT = 15): ``rho = floor(255 * 2**15 / Z)``,
  ``p = (s * rho) >> (15 + out_shift)``; uint8 output, one unit = ``2**out_shift / 255``.
* ``"i8_clb"`` (eq. 9): ``k = floor(log2 Z)`` (leading-bit detection), ``p = (s * T) >> k``
  with ``T = clb_T``, default 255 (the int8 target scale the paper gives for eq. 9), saturated
  to 255 (uint8, as the AI Engine's shift-round-saturate store does); one unit = 1/T.  Since
  ``2**k <= Z < 2**(k+1)`` the row sums to about T to 2T: the reciprocal overestimates by
  up to a factor of two and the result is not renormalised (as on the hardware); with T = 255
  a dominant entry saturates (counted).  ``clb_T=128`` never saturates.

Constraints (eq. 4, 11 and section IV-C), checked by :func:`check_params` for the row length
``n``: ``0 <= Dmax <= 127``, ``S >= 0``, ``B - S * Dmax >= 0`` and
``S * Dmax + ceil(256 / n) <= B <= floor(32767 / n)``.  They keep every ``s`` in int16,
``Z <= 32767`` (so the int16 reciprocal is >= 1), ``Z >= 256`` (so the int8 reciprocal fits
int16) and every product in int32; :func:`hccs_core` therefore never wraps.  With masked keys a
row has fewer than ``n`` terms and ``Z`` may fall below 256; the int8 reciprocal then exceeds the
int16 range of the AI Engine broadcast: we compute it exactly in int32 and count the row
(``rho_int16_overflow``) instead of wrapping.

Calibration (:func:`calibrate`, section III-C, eq. 10): per head, logits are quantised to int8
with the head's scale ``s_x = max|logit| / 127`` (or a given one), and an integer grid search
over ``(B, S, Dmax)`` inside the constraints minimises the mean over rows of
``KL(softmax(x8 * s_x) || p_i16 / sum p_i16)`` (the paper minimises in the int16 space).  Since
``p_i16 = s * rho`` with one ``rho`` per row, ``p_i16 / sum = s / Z`` exactly and the objective
is evaluated from per-row histograms of ``delta``; it depends on ``(B, S)`` only through the
ratio ``S / B``.  Search (``exhaustive=False``): for every ``Dmax`` the best real ratio (grid of
48 points, then golden section), then, for the ``refine`` best ``Dmax``, every ``B`` with the
four integers ``S`` around ``ratio * B`` scored exactly; ``exhaustive=True`` scans the whole
constrained grid (slow for short rows).  Option ``objective="scale"`` scores the
unnormalised ``p_i16 / 32767`` instead (penalising the Q0 reciprocal's truncation, which for
``Z`` near 32767 makes the int16 row sum as small as one half); the fast search ranks ``Dmax``
and places ``S`` with the ``"sum"`` objective, so use ``exhaustive=True`` with ``"scale"``.

Pipeline (scheme ``hccs``): per-tensor symmetric int8 q, k, v (``s = max|x| / 127``, RNE),
``S = q8 k8^T`` exact int32, logits ``t = (S * s_q s_k scale + mask) / s_x`` in float64 and
``x8 = clamp(RNE(t), -127, 127)`` with the head's ``s_x``, HCCS probabilities, ``O = P v8``
exact int32, output ``O * s_v * unit`` (``unit`` of the path; the i16 rows sum to
``rho Z / 32767``, between 1/2 and 1, so outputs shrink by that factor; option
``dequant="rowsum"`` divides by the row's ``sum P`` instead, as a float epilogue would).  Heads are
the last leading dim of q (``(..., H, L, d)``); ``params=None`` calibrates every head on the
call's own logits (all batch entries of that head, ``n = Lk``) and reports the parameters in the
statistics.  Masked keys take no part (their probability is 0); a query row without visible
key gives NaN.  The score matrix is materialised per call (untiled; for study sizes).

Softmax surrogate ``hccs`` (``lp.softmax``): scores (natural-log units, ``-inf`` masked) are
quantised to int8 with ``params.x_scale`` (or calibrated on the call's scores as one head) and
the result is ``p * unit`` as float32 (unit 1/32767, ``2**out_shift/255`` or ``1/clb_T``; rows
sum to ``rho Z / 32767`` in (1/2, 1] for ``i16_div`` (the Q0 reciprocal truncates), to a little
under 1 for ``i8_div`` and to about 1 to 2 for ``i8_clb``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from numba import prange

from ..formats._arrays import to_numpy
from ..formats._jit import for_size, jit
from ..stats import Stats
from . import Scheme, register
from ._check import bool_mask, check_bool, check_choice, check_int, int_input
from ._hccs_search import (
    DELTA_BINS,
    DMAX_MAX,
    I16_T,
    INT16_MAX,
    OBJECTIVES,
    X8_MAX,
    Z_MIN,
    _calibrate_rows,
    _head_scales,
    calibrate_span,
    code_histograms,
)
from ._int8 import check_positive_scale, quantize_problem, unnormalized
from ._surrogate import NO_VIS, exact_attend, fill_logits, row_block, vis_block, visibility
from .problem import MASK_FLOOR, SCALE_SCOPES, Problem, rows2d, sized, softmax_rows

# --------------------------------------------------------------------------------------------
# Constants (seed hccs.txt)

PATHS = ("i16_div", "i8_div", "i8_clb")
_PATH_CODE = {"i16_div": 0, "i8_div": 1, "i8_clb": 2}
I8_T = 255  # eq. 8: int8 output target scale
INV_SHIFT = 15  # eq. 8: R = INV_SHIFT of the reference implementation
CLB_T_DEFAULT = 255  # eq. 9 with the int8 target scale T = 255
U8_MAX = 255  # uint8 output saturation
#: HCCS's floor reciprocals (``rho = floor(32767 / Z)``, ``Z <= 32767``) keep each row's sum
#: in (1/2, 1] by design; only a row outside that is unnormalized (a hazard)
HCCS_NORM_TOL = 0.5
OUT_SHIFT_MAX = 7  # s * rho <= 255 * 2**15: from out_shift 8 on every i8_div output is 0
REFINE_DEFAULT = 4  # Dmax values refined over every B
ROW_BLOCKS = 64  # row blocks of the parallel core (each with its own counters)
DEQUANTS = ("scale", "rowsum")
_NO_LOGITS = np.zeros((1, 1))  # the logits argument of _quantized_logits when not kept

# count slots of the core kernel
_C_EMPTY, _C_CLIP, _C_SAT, _C_RHO = range(4)


@dataclass
class HccsStats(Stats):
    """Counts of the HCCS core and pipeline (specs/attention.md sections 5 and 8).

    Attributes:
        calls: core evaluations merged.
        rows: rows processed.
        empty_rows: rows with no visible entry (all-zero core output; NaN in the pipeline).
        clipped: visible entries whose distance ``m - x`` exceeded ``Dmax`` and was clamped.
        out_saturated: ``i8_clb`` outputs above 255 saturated to 255.
        rho_int16_overflow: ``i8_div`` rows whose reciprocal exceeded 32767 (possible only
            with masked keys, ``Z < 256``); computed exactly, counted as a hazard.
        logit_saturated: pipeline logits clamped to [-127, 127] (a given ``x_scale`` too
            small for the call's logits).
        params: per call, the :class:`HccsParams` used (calibrated on the fly or given), as
            plain dicts.
        unnormalized_rows: pipeline rows (``dequant="scale"``) that see a key and whose
            probabilities sum more than 50 % away from 1 (the floor reciprocals keep a row's
            sum in (1/2, 1] by design: ``HCCS_NORM_TOL``), a hazard.
    """

    calls: int = 0
    rows: int = 0
    empty_rows: int = 0
    clipped: int = 0
    out_saturated: int = 0
    rho_int16_overflow: int = 0
    logit_saturated: int = 0
    params: list = field(default_factory=list)
    unnormalized_rows: int = 0

    _hazards = ("out_saturated", "rho_int16_overflow", "logit_saturated", "unnormalized_rows")
    _key = ("clipped",)



# --------------------------------------------------------------------------------------------
# Parameters


def _int_array(v, name: str) -> np.ndarray:
    arr, _ = to_numpy(v, name)
    arr = np.asarray(arr)
    if arr.dtype == np.bool_ or arr.dtype.kind not in "iuf":
        raise TypeError(f"{name} must be integer(s), got dtype {arr.dtype}")
    if arr.dtype.kind == "f":
        if not np.all(np.isfinite(arr)) or not np.all(arr == np.round(arr)):
            raise TypeError(f"{name} must be integer(s), got non-integer values")
    if arr.size and (arr.max() > 2**40 or arr.min() < -(2**40)):
        raise ValueError(f"{name} is out of range: |{name}| must be below 2**40")
    return arr.astype(np.int64)


def _check_n(n) -> int:
    return check_int(n, "row length n", 1, INT16_MAX)


def check_params(B, S, Dmax, n: int):
    """Validate HCCS parameters for rows of length ``n`` (eq. 4 and 11, section IV-C).

    Args:
        B, S, Dmax: integers or integer arrays (broadcast together; one entry per head).
        n: row length (number of keys), 1 <= n <= 32767.

    Returns:
        ``(B, S, Dmax)`` as broadcast int64 arrays.

    Raises:
        TypeError: non-integer values.
        ValueError: the first entry violating ``0 <= Dmax <= 127``, ``S >= 0``,
            ``B - S * Dmax >= 0`` or ``S * Dmax + ceil(256 / n) <= B <= floor(32767 / n)``,
            naming the entry and the allowed range of ``B``.

    Example::

        >>> check_params(500, 3, 20, 64)        # 3*20 + 4 <= 500 <= 511
        (array(500), array(3), array(20))
    """
    n = _check_n(n)
    b, s, d = (_int_array(v, nm) for v, nm in ((B, "B"), (S, "S"), (Dmax, "Dmax")))
    try:
        b, s, d = np.broadcast_arrays(b, s, d)
    except ValueError:
        raise ValueError(
            f"B, S, Dmax shapes {b.shape}, {s.shape}, {d.shape} do not broadcast"
        ) from None
    lo_add = -(-Z_MIN // n)
    hi = INT16_MAX // n

    def where(mask):
        idx = np.argwhere(mask)[0]
        at = f" at index {tuple(int(i) for i in idx)}" if b.ndim else ""
        t = tuple(idx)
        return at, int(b[t]), int(s[t]), int(d[t])

    checks = (
        ((d < 0) | (d > DMAX_MAX), f"0 <= Dmax <= {DMAX_MAX}"),
        (s < 0, "S >= 0"),
        (b - s * d < 0, "B - S * Dmax >= 0 (eq. 4)"),
        ((b < s * d + lo_add) | (b > hi),
         f"S * Dmax + ceil(256 / n) <= B <= floor(32767 / n) (eq. 11, n = {n})"),
    )
    for bad, rule in checks:
        if bad.any():
            at, bb, ss, dd = where(bad)
            lo = ss * max(dd, 0) + lo_add
            raise ValueError(
                f"HCCS parameters{at} violate {rule}: B={bb}, S={ss}, Dmax={dd}; for these S "
                f"and Dmax B must lie in [{lo}, {hi}]"
                + ("" if lo <= hi else " (empty: lower S or Dmax, or use shorter rows)")
            )
    return b, s, d


@dataclass
class HccsParams:
    """Per-head HCCS parameters (plain data; JSON via :meth:`save` / :meth:`load`).

    Attributes:
        B, S, Dmax: int64 arrays ``(H,)``: the surrogate ``s = B - S * min(m - x, Dmax)``.
        x_scale: float64 ``(H,)``: the head's int8 logit scale (logit = ``x8 * x_scale``).
        n: the row length the parameters were checked for (deployment ``Lk``).
        kl: optional float64 ``(H,)``: mean calibration KL (objective value) per head.

    Example::

        >>> p = HccsParams(B=[500], S=[3], Dmax=[20], x_scale=[0.05], n=64)
        >>> HccsParams.from_dict(p.to_dict()) == p
        True
    """

    B: np.ndarray
    S: np.ndarray
    Dmax: np.ndarray
    x_scale: np.ndarray
    n: int
    kl: np.ndarray | None = None

    def __post_init__(self):
        b, s, d = check_params(np.atleast_1d(self.B), np.atleast_1d(self.S),
                               np.atleast_1d(self.Dmax), self.n)
        if b.ndim != 1:
            raise ValueError(f"B, S, Dmax must be 1-D (one entry per head), got shape {b.shape}")
        xs = np.atleast_1d(np.asarray(self.x_scale, dtype=np.float64))
        if xs.shape != b.shape and xs.size == 1:
            xs = np.broadcast_to(xs, b.shape).copy()
        if xs.shape != b.shape:
            raise ValueError(f"x_scale has shape {xs.shape}; expected {b.shape} (one per head)")
        if not np.all(np.isfinite(xs) & (xs > 0)):
            raise ValueError("x_scale must be finite and > 0")
        self.B, self.S, self.Dmax, self.x_scale = b.copy(), s.copy(), d.copy(), xs
        self.n = int(self.n)
        if self.kl is not None:
            kl = np.atleast_1d(np.asarray(self.kl, dtype=np.float64))
            if kl.shape != b.shape:
                raise ValueError(f"kl has shape {kl.shape}; expected {b.shape}")
            self.kl = kl

    @property
    def heads(self) -> int:
        """Number of heads H."""
        return int(self.B.shape[0])

    def __eq__(self, other) -> bool:
        if not isinstance(other, HccsParams):
            return NotImplemented
        same_kl = (self.kl is None and other.kl is None) or (
            self.kl is not None and other.kl is not None and np.array_equal(self.kl, other.kl))
        return (self.n == other.n and same_kl and all(
            np.array_equal(getattr(self, f), getattr(other, f))
            for f in ("B", "S", "Dmax", "x_scale")))

    def to_dict(self) -> dict:
        """JSON-ready dict (lists of Python ints and floats)."""
        return {"B": [int(v) for v in self.B], "S": [int(v) for v in self.S],
                "Dmax": [int(v) for v in self.Dmax],
                "x_scale": [float(v) for v in self.x_scale], "n": self.n,
                "kl": None if self.kl is None else [float(v) for v in self.kl]}

    @classmethod
    def from_dict(cls, d: dict) -> HccsParams:
        """Inverse of :meth:`to_dict` (validates; ValueError names missing keys)."""
        if not isinstance(d, dict):
            raise TypeError(f"expected a dict, got {type(d).__name__}")
        need = ("B", "S", "Dmax", "x_scale", "n")
        miss = [k for k in need if k not in d]
        if miss:
            raise ValueError(f"HCCS parameter dict lacks {', '.join(miss)}")
        return cls(B=d["B"], S=d["S"], Dmax=d["Dmax"], x_scale=d["x_scale"], n=d["n"],
                   kl=d.get("kl"))

    def save(self, path) -> None:
        """Write the parameters as JSON to ``path``."""
        Path(path).write_text(json.dumps(self.to_dict(), indent=1))

    @classmethod
    def load(cls, path) -> HccsParams:
        """Read parameters written by :meth:`save`."""
        return cls.from_dict(json.loads(Path(path).read_text()))


# --------------------------------------------------------------------------------------------
# Core


@jit(inline="always")
def _hccs_out(out, r, sbuf, n, path, out_shift, clb_t, z, counts):
    """Output row ``r`` from the surrogate values ``sbuf`` (-1 = masked: output 0) and their
    sum ``z`` along ``path``."""
    if path == 0:
        rho = np.int32(I16_T // z)
        for j in range(n):
            sc = sbuf[j]
            out[r, j] = 0 if sc < 0 else np.int32(sc * rho)
    elif path == 1:
        rho = np.int32((I8_T << INV_SHIFT) // z)
        if rho > INT16_MAX:
            counts[_C_RHO] += 1
        sh = INV_SHIFT + out_shift
        for j in range(n):
            sc = sbuf[j]
            out[r, j] = 0 if sc < 0 else np.int32(np.int32(sc * rho) >> sh)
    else:
        k = 0
        t = z
        while t > 1:
            t >>= 1
            k += 1
        sat = 0
        for j in range(n):
            sc = sbuf[j]
            p = np.int32(np.int32(sc * clb_t) >> k)
            sat += (p > U8_MAX) & (sc >= 0)
            out[r, j] = 0 if sc < 0 else min(p, U8_MAX)
        counts[_C_SAT] += sat


@jit
def _hccs_rows(x, vis, Bv, Sv, Dv, path, out_shift, clb_t, out, counts):
    """Rows of int8 logits ``x (R, n)`` -> ``out`` (int32, or float32 holding the integers);
    per-row int32 parameters.  Rows without a mask run branch-free (LLVM vectorizes them;
    int32 sums wrap alike in any order)."""
    R, n = x.shape
    use_vis = vis.shape[0] > 0
    sbuf = np.empty(n, np.int32)  # s of each entry, -1 where masked
    for r in range(R):
        b = np.int32(Bv[r])
        sl = np.int32(Sv[r])
        dm = np.int32(Dv[r])
        m = np.int32(-129)
        cnt = 0
        if use_vis:
            for j in range(n):
                if not vis[r, j]:
                    continue
                xv = np.int32(x[r, j])
                if xv > m:
                    m = xv
                cnt += 1
        else:
            for j in range(n):
                m = max(m, np.int32(x[r, j]))
            cnt = n
        if cnt == 0:
            counts[_C_EMPTY] += 1
            for j in range(n):
                out[r, j] = 0
            continue
        z = np.int32(0)
        clip = 0
        if use_vis:
            for j in range(n):
                if not vis[r, j]:
                    sbuf[j] = -1
                    continue
                d = np.int32(m - np.int32(x[r, j]))
                if d > dm:
                    d = dm
                    clip += 1
                sc = np.int32(b - np.int32(sl * d))
                sbuf[j] = sc
                z = np.int32(z + sc)
        else:
            for j in range(n):
                d = np.int32(m - np.int32(x[r, j]))
                clip += d > dm
                sc = np.int32(b - np.int32(sl * min(d, dm)))
                sbuf[j] = sc
                z = np.int32(z + sc)
        counts[_C_CLIP] += clip
        _hccs_out(out, r, sbuf, n, path, out_shift, clb_t, z, counts)


def _check_path(path: str) -> int:
    return _PATH_CODE[check_choice(path, "path", PATHS)]


def _check_out_shift(out_shift, path: str) -> int:
    osh = check_int(out_shift, "out_shift", 0, OUT_SHIFT_MAX)
    if osh and path != "i8_div":
        raise ValueError(f"out_shift applies only to path 'i8_div', not {path!r}")
    return osh


def _check_clb_t(t) -> int:
    return check_int(t, "clb_T", 1, U8_MAX)


def output_scale(path: str = "i16_div", out_shift: int = 0, clb_T: int = CLB_T_DEFAULT) -> float:
    """Probability value of one output unit of ``path``: ``1/32767`` (``i16_div``),
    ``2**out_shift / 255`` (``i8_div``), ``1/clb_T`` (``i8_clb``)."""
    _check_path(path)
    if path == "i16_div":
        return 1.0 / I16_T
    if path == "i8_div":
        return 2.0 ** _check_out_shift(out_shift, path) / I8_T
    return 1.0 / _check_clb_t(clb_T)


def _int8_logits(x8) -> tuple[np.ndarray, bool]:
    arr = int_input(x8, "x8", -128, 127,
                    allowed="int8 (or an integer dtype with values in [-128, 127])",
                    range_name="the int8 range")
    if arr.ndim < 1:
        raise ValueError("x8 must have at least one dim (rows along the last axis)")
    return np.ascontiguousarray(arr, dtype=np.int8), not isinstance(x8, np.ndarray) and \
        hasattr(x8, "numpy")


def _row_params(v: np.ndarray, lead: tuple, name: str) -> np.ndarray:
    try:
        return np.ascontiguousarray(np.broadcast_to(v, lead), dtype=np.int32).reshape(-1)
    except ValueError:
        raise ValueError(
            f"{name} of shape {v.shape} does not broadcast to the rows' leading shape {lead}"
        ) from None


def hccs_core(x8, B, S, Dmax, path: str = "i16_div", out_shift: int = 0, *,
              clb_T: int = CLB_T_DEFAULT, mask=None, return_stats: bool = False):
    """HCCS integer softmax surrogate on int8 logits, rows along the last axis (section 5).

    Args:
        x8: int8 logits ``(..., n)`` (numpy or CPU torch; other integer dtypes with values in
            [-128, 127] are accepted).
        B, S, Dmax: integer parameters, scalars or arrays broadcastable to ``x8.shape[:-1]``
            (e.g. ``(H, 1)`` for ``x8`` of shape ``(H, L, n)``: one set per head); checked
            with :func:`check_params` for ``n = x8.shape[-1]``.
        path: ``"i16_div"`` (int16, unit 1/32767), ``"i8_div"`` (uint8, unit
            ``2**out_shift/255``) or ``"i8_clb"`` (uint8, unit ``1/clb_T``, saturating).
        out_shift: extra right shift of the ``i8_div`` output (0..7; from 8 on every output
            would be 0, since ``s * rho <= 255 * 2**15``).
        clb_T: ``i8_clb`` target scale T (1..255, default 255).
        mask: optional bool array broadcastable to ``x8`` (True = take part); masked entries
            give 0, a row with no visible entry gives all zeros (counted as empty).
        return_stats: also return a :class:`HccsStats`.

    Returns:
        int16 (``i16_div``) or uint8 array of ``x8``'s shape (numpy or torch as ``x8``); with
        ``return_stats`` a tuple ``(p, stats)``.

    Raises:
        TypeError: non-integer ``x8`` or parameters, non-bool mask.
        ValueError: parameters violating the constraints, bad path/out_shift/clb_T, shapes.

    Example::

        >>> x8 = np.array([[10, 8, -20, 3]], np.int8)
        >>> hccs_core(x8, B=4000, S=100, Dmax=20)   # s = 4000, 3800, 2000, 3300; rho = 2
        array([[8000, 7600, 4000, 6600]], dtype=int16)
    """
    code = _check_path(path)
    osh = _check_out_shift(out_shift, path)
    ct = _check_clb_t(clb_T)
    check_bool(return_stats, "return_stats")
    x, was_torch = _int8_logits(x8)
    n = x.shape[-1]
    lead = x.shape[:-1]
    rows = rows2d(x)
    R = rows.shape[0]
    if n == 0:
        out = np.zeros(x.shape, dtype=np.int16 if code == 0 else np.uint8)
        st = HccsStats(calls=1, rows=R, empty_rows=R)
        return _wrap(out, was_torch, st, return_stats)
    b, s, d = check_params(B, S, Dmax, n)
    Bv, Sv, Dv = (_row_params(v, lead, nm) for v, nm in ((b, "B"), (s, "S"), (d, "Dmax")))
    vis = np.zeros((0, 0), dtype=np.bool_) if mask is None else \
        bool_mask(mask, x.shape).reshape(rows.shape)
    out32 = np.empty(rows.shape, dtype=np.int32)
    counts = _core(rows, vis, Bv, Sv, Dv, code, osh, ct, out32)
    out = out32.astype(np.int16 if code == 0 else np.uint8).reshape(x.shape)
    return _wrap(out, was_torch, _core_stats(counts, R), return_stats)


@jit(parallel=True)
def _hccs_rows_par(x, vis, Bv, Sv, Dv, path, out_shift, clb_t, out, counts):
    for t in prange(counts.shape[0]):
        r0, r1 = row_block(t, x.shape[0], counts.shape[0])
        _hccs_rows(x[r0:r1], vis_block(vis, r0, r1), Bv[r0:r1], Sv[r0:r1], Dv[r0:r1], path,
                   out_shift, clb_t, out[r0:r1], counts[t])


def _core(rows, vis, Bv, Sv, Dv, code, osh, ct, out32) -> np.ndarray:
    """The HCCS core on validated int8 rows (in row blocks, in parallel): counters (4,)."""
    counts = np.zeros((ROW_BLOCKS, 4), dtype=np.int64)
    for_size(_hccs_rows_par, rows.size)(rows, vis, Bv, Sv, Dv, code, osh, ct, out32, counts)
    return counts.sum(axis=0)


def _core_stats(counts: np.ndarray, rows: int) -> HccsStats:
    return HccsStats(calls=1, rows=rows, empty_rows=int(counts[_C_EMPTY]),
                     clipped=int(counts[_C_CLIP]), out_saturated=int(counts[_C_SAT]),
                     rho_int16_overflow=int(counts[_C_RHO]))


def _wrap(out, was_torch, st, return_stats):
    if was_torch:
        import torch

        out = torch.from_numpy(out)
    return (out, st) if return_stats else out


# --------------------------------------------------------------------------------------------
# Calibration


def _head_rows(h, what: str) -> np.ndarray:
    arr, _ = to_numpy(h, what)
    arr = np.asarray(arr)
    if arr.dtype.kind != "f" and arr.dtype.name != "bfloat16":
        raise TypeError(f"{what} has dtype {arr.dtype}; allowed: float logits")
    if arr.ndim < 1:
        raise ValueError(f"{what} must have at least one dim (rows along the last axis)")
    a = np.asarray(arr, dtype=np.float64)
    if np.isnan(a).any():
        raise ValueError(f"{what} contains NaN (use -inf to mask an entry)")
    if (a == np.inf).any():
        raise ValueError(f"{what} contains +inf")
    return rows2d(a)


def calibrate(logits_per_head, *, n: int | None = None, x_scales=None,
              objective: str = "sum", reference: str = "quantized", exhaustive: bool = False,
              refine: int = REFINE_DEFAULT) -> HccsParams:
    """Per-head grid search of ``(B, S, Dmax)`` minimising the mean KL (section III-C, eq. 10).

    For each head: ``s_x = max|logit| / 127`` over its calibration logits (or
    ``x_scales[h]``), ``x8 = clamp(RNE(logit / s_x), -127, 127)``, then the integer
    ``(B, S, Dmax)`` inside the constraints of :func:`check_params` minimising the mean over
    rows of ``KL(softmax(x8 * s_x) || p_i16 / sum p_i16)`` (see the module docstring for the
    search and the ``objective="scale"`` variant).  Ties keep the first candidate found.

    Args:
        logits_per_head: a sequence of H float arrays ``(..., n)`` (one per head; rows along
            the last axis) or one array ``(H, ..., n)``; ``-inf`` entries are masked keys.
        n: deployment row length for the constraints (default: the logits' last dim).
        x_scales: optional per-head logit scales (scalar or ``(H,)``).
        objective: ``"sum"`` (spec: ``p_i16 / sum``) or ``"scale"`` (``p_i16 / 32767``).
        reference: ``"quantized"`` (softmax of ``x8 * s_x``, the spec) or ``"float"``
            (softmax of the float logits).
        exhaustive: scan the whole constrained grid instead of the coarse-then-refine search.
        refine: number of best ``Dmax`` values refined over every ``B`` (default 4).

    Returns:
        :class:`HccsParams` with ``kl`` = the mean KL reached per head.

    Raises:
        TypeError, ValueError: non-float logits, NaN or +inf, rows of different lengths,
        no visible entry, bad options, ``n`` outside [1, 32767].

    Example::

        >>> heads = [rng.normal(size=(256, 64)) for _ in range(2)]
        >>> p = calibrate(heads)
        >>> p.B, p.S, p.Dmax, p.kl
    """
    check_choice(objective, "objective", OBJECTIVES)
    check_choice(reference, "reference", ("quantized", "float"))
    check_bool(exhaustive, "exhaustive")
    check_int(refine, "refine", 1, what="a positive int")
    if isinstance(logits_per_head, (list, tuple)):
        heads = [_head_rows(h, f"logits_per_head[{i}]") for i, h in enumerate(logits_per_head)]
    else:
        arr, _ = to_numpy(logits_per_head, "logits_per_head")
        if np.ndim(arr) < 2:
            raise ValueError("logits_per_head must be (H, ..., n) or a list of (..., n) arrays")
        heads = [_head_rows(arr[h], f"logits_per_head[{h}]") for h in range(arr.shape[0])]
    if not heads:
        raise ValueError("logits_per_head is empty")
    widths = {h.shape[1] for h in heads}
    if len(widths) != 1:
        raise ValueError(f"every head must have the same row length, got {sorted(widths)}")
    nn = _check_n(widths.pop() if n is None else n)
    if x_scales is None:
        scales = [None] * len(heads)
    else:
        xs = np.broadcast_to(np.asarray(x_scales, dtype=np.float64), (len(heads),))
        if not np.all(np.isfinite(xs) & (xs > 0)):
            raise ValueError("x_scales must be finite and > 0")
        scales = [float(v) for v in xs]
    res = [_calibrate_rows(h, int(nn), sc, bool(exhaustive), int(refine), objective, reference)
           for h, sc in zip(heads, scales, strict=True)]
    return HccsParams(B=[r[0] for r in res], S=[r[1] for r in res], Dmax=[r[2] for r in res],
                      x_scale=[r[3] for r in res], n=int(nn), kl=[r[4] for r in res])


# --------------------------------------------------------------------------------------------
# Pipeline and softmax surrogate


def _check_params_obj(params) -> HccsParams | None:
    if params is None or isinstance(params, HccsParams):
        return params
    if isinstance(params, dict):
        return HccsParams.from_dict(params)
    raise TypeError(f"params must be HccsParams, a dict of them or None, got "
                    f"{type(params).__name__}")


@jit(parallel=True)
def _quantized_logits(S, c, add, has_add, xs, vis, x8, logits, keep):
    """Per row ``r`` (logit unit ``c[r]``, head scale ``xs[r]``): ``t = RNE(fl64(S c (+ add)) /
    xs)`` clamped to [-127, 127] into int8 ``x8``; with ``keep`` the float64 logits go to
    ``logits`` too.  Returns how many visible logits (``vis``; ``(0, 0)`` = all) were clamped.
    The loops are branch-free (LLVM vectorizes them)."""
    n, L = S.shape
    use_vis = vis.shape[0] > 0
    sat = np.zeros(n, dtype=np.int64)
    for r in prange(n):
        d = xs[r]
        cr = c[r]
        cnt = 0
        for j in range(L):
            lg = np.float64(S[r, j]) * cr
            if has_add:
                lg = lg + np.float64(add[r, j])
            if keep:
                logits[r, j] = lg
            t = np.rint(lg / d)
            tc = min(max(t, -X8_MAX), X8_MAX)
            if use_vis:
                cnt += (tc != t) & vis[r, j]
            else:
                cnt += tc != t
            x8[r, j] = np.int8(tc)
        sat[r] = cnt
    return sat.sum()


def hccs_options(lead: tuple, Lk: int, params, path: str, out_shift: int, clb_T: int,
                 dequant: str, scale_scope: str):
    """The checks of the ``hccs`` scheme's options against a call of leading dims ``lead`` and
    ``Lk`` keys, shared by the CPU pipeline and its device path: returns ``(params, scope,
    unit, H)`` (the :class:`HccsParams` or None, the scale scope, the output unit of ``path``,
    the number of heads)."""
    params = _check_params_obj(params)
    scope = check_choice(scale_scope, "scale_scope", SCALE_SCOPES)
    unit = output_scale(path, out_shift, clb_T)
    check_choice(dequant, "dequant", DEQUANTS)
    H = lead[-1] if lead else 1
    if params is not None and params.heads not in (1, H):
        raise ValueError(
            f"params has {params.heads} heads; the inputs have {H} (the last leading dim of q)"
        )
    if Lk > INT16_MAX:
        raise ValueError(f"HCCS needs rows of at most {INT16_MAX} keys, got Lk = {Lk}")
    if params is not None and Lk and params.n != Lk:
        check_params(params.B, params.S, params.Dmax, Lk)  # raises if invalid for this Lk
    return params, scope, unit, H


def _hccs_attention(prob: Problem, return_stats: bool, params=None, path: str = "i16_div",
                    out_shift: int = 0, clb_T: int = CLB_T_DEFAULT, dequant: str = "scale",
                    scale_scope: str = "visible"):
    params, scope, unit, H = hccs_options(prob.lead, prob.Lk, params, path, out_shift, clb_T,
                                          dequant, scale_scope)
    Bn, Lq, Lk = prob.B, prob.Lq, prob.Lk
    if Bn == 0 or Lq == 0 or Lk == 0:
        out = np.zeros((Bn, Lq, prob.dv), dtype=np.float32)
        st = HccsStats(calls=1, rows=Bn * Lq, empty_rows=Bn * Lq)
        return out, (st if return_stats else None)
    check_positive_scale(prob.scale, "hccs", "its int8 logits x = S * c / x_scale clip at the "
                         "row max")
    qz = quantize_problem(prob, scope=scope)
    c_row = np.repeat(qz.sq_row[:, 0].astype(np.float64) * qz.sk.astype(np.float64)
                      * prob.scale, Lq)  # the logit unit of each flat row
    head = np.repeat(np.arange(Bn) % H, Lq)  # the head of each flat row
    vis = visibility(prob)
    x8 = np.empty((Bn * Lq, Lk), dtype=np.int8)
    # calibration groups: each sequence alone ("visible") or the whole call ("tensor")
    group = prob.sequences() if scope == "visible" else np.zeros(Bn, dtype=np.int64)
    bounds = np.flatnonzero(np.diff(group)) + 1
    spans = list(zip(np.r_[0, bounds].tolist(), np.r_[bounds, Bn].tolist(), strict=True))
    sats = []

    def quantise(rows, S, add):
        kernel = sized(_quantized_logits, S.size)
        return int(kernel(S, c_row[rows], S if add is None else add, add is not None, xs[rows],
                          vis[rows] if vis.shape[0] else NO_VIS, x8[rows], _NO_LOGITS, False))

    if params is None:  # calibrate every head on the call's logits (calibrate's rules)
        seen, s_x = _head_scales(prob, qz, c_row, vis, spans, H, scope)
        span = np.repeat(np.arange(len(spans)), [e1 - e0 for e0, e1 in spans])
        xs = np.repeat(s_x[span, np.arange(Bn) % H], Lq)  # each flat row's (span, head)
        fill_logits(prob, qz, quantise, sats.append)
        hist = np.zeros((Bn * Lq, DELTA_BINS), dtype=np.int32)
        sized(code_histograms, x8.size)(x8, vis, hist)
        fitted = [HccsParams(**calibrate_span(hist, seen, s_x[i], e0, e1, H, Lq, Lk, scope))
                  for i, (e0, e1) in enumerate(spans)]
    else:
        fitted = [params] * len(spans)
    per_row = {n: np.empty(Bn * Lq, dtype=np.float64 if n == "x_scale" else np.int32)
               for n in ("B", "S", "Dmax", "x_scale")}
    for (e0, e1), pg in zip(spans, fitted, strict=True):
        rs = slice(e0 * Lq, e1 * Lq)
        for n in per_row:
            per_row[n][rs] = np.broadcast_to(getattr(pg, n), (H,))[head[rs]]
    if params is not None:
        xs = per_row["x_scale"]
        fill_logits(prob, qz, quantise, sats.append)
    sat = sum(sats)
    Bv, Sv, Dv = (np.ascontiguousarray(per_row[n]) for n in ("B", "S", "Dmax"))
    P = np.empty(x8.shape, dtype=np.float32)  # the integer probabilities (exact in float32)
    counts = _core(x8, vis, Bv, Sv, Dv, _check_path(path), _check_out_shift(out_shift, path),
                   _check_clb_t(clb_T), P)
    O, rowsum = exact_attend(P, prob, qz.v8)
    s_v = qz.sv.astype(np.float64)[:, None, None]
    if dequant == "scale":
        out = O * (s_v * unit)
    else:
        with np.errstate(invalid="ignore", divide="ignore"):
            out = O * s_v / rowsum[..., None]
    out = out.astype(np.float32)
    if not return_stats:
        return out, None
    st = _core_stats(counts, Bn * Lq)
    st.logit_saturated = sat
    st.params = [pg.to_dict() for pg in fitted] if len(spans) > 1 else [fitted[0].to_dict()]
    if dequant == "scale":  # with "rowsum" the output is normalised by the sum itself
        seen = rowsum > 0 if not vis.shape[0] else vis.reshape(Bn, Lq, Lk).any(axis=2)
        st.unnormalized_rows = unnormalized(rowsum, 1.0 / unit, seen, HCCS_NORM_TOL)
    return out, st


def hccs_softmax(scores, axis: int = -1, *, params: HccsParams | None = None,
                 path: str = "i16_div", out_shift: int = 0, clb_T: int = CLB_T_DEFAULT,
                 return_stats: bool = False):
    """HCCS as a softmax surrogate on float scores (natural-log units, ``-inf`` masked).

    The scores are quantised to int8 with ``params.x_scale`` (``params=None``: calibrated on
    these scores as one head with :func:`calibrate`); a ``params`` with H > 1 heads needs
    ``axis`` to be the last axis and ``scores.shape[-3] == H``.

    Returns:
        float32 ``p * unit`` of the scores' shape and kind (see :func:`output_scale`); masked
        entries 0, rows without a visible entry NaN; with ``return_stats``, ``(p, stats)``
        (:class:`HccsStats`, ``logit_saturated`` counting scores clamped to [-127, 127] by a
        given ``params.x_scale``).

    Raises:
        ValueError: NaN or +inf scores, head mismatch, parameters invalid for the row length.

    Example::

        >>> lp.softmax(np.array([[0.0, 1.0, 2.0, -1.0]]), scheme="hccs")
    """
    params = _check_params_obj(params)
    unit = output_scale(path, out_shift, clb_T)
    check_bool(return_stats, "return_stats")
    rows, restore = softmax_rows(scores, axis)
    n = rows.shape[1]
    if np.isnan(rows).any() or (rows == np.inf).any():
        raise ValueError("scores contain NaN or +inf (HCCS quantises them to int8)")
    if params is None:
        params = calibrate([rows], n=n) if n and np.isfinite(rows).any() else None
    if params is None:
        res = restore(np.full(rows.shape, np.nan, dtype=np.float32))
        R = rows.shape[0]
        return (res, HccsStats(calls=1, rows=R, empty_rows=R)) if return_stats else res
    H = params.heads
    if H == 1:
        head = np.zeros(rows.shape[0], dtype=np.int64)
    else:
        shape = np.shape(to_numpy(scores, "scores")[0])
        ax = axis + len(shape) if axis < 0 else axis
        if ax != len(shape) - 1 or len(shape) < 3 or shape[-3] != H:
            raise ValueError(
                f"params has {H} heads: scores must be (..., {H}, Lq, n) with axis = -1"
            )
        head = (np.arange(rows.shape[0]) // shape[-2]) % H
    vis = np.isfinite(rows)
    with np.errstate(invalid="ignore"):
        t = np.rint(np.where(vis, rows.astype(np.float64), 0.0) / params.x_scale[head][:, None])
    sat = int(np.count_nonzero(vis & ((t > X8_MAX) | (t < -X8_MAX))))
    x8 = np.clip(t, -X8_MAX, X8_MAX).astype(np.int8)
    p, st = hccs_core(x8, params.B[head], params.S[head], params.Dmax[head], path, out_shift,
                      clb_T=clb_T, mask=vis, return_stats=True)
    out = (p.astype(np.float64) * unit).astype(np.float32)
    out[~vis.any(axis=1)] = np.nan
    if not return_stats:
        return restore(out)
    st.logit_saturated = sat
    return restore(out), st


def _hccs_softmax_scheme(scores, axis, return_stats, **opts):
    return hccs_softmax(scores, axis, return_stats=True, **opts)


register(Scheme("hccs", "int8 q k v, HCCS clipped-linear integer softmax (per-head calibrated)",
                _hccs_attention, options=("params", "path", "out_shift", "clb_T", "dequant",
                                          "scale_scope"),
                shape_dependent=("params",), stats=HccsStats, order=80, error_bound=0.6,
                mask_floor=MASK_FLOOR,
                noise=lambda o: "int8_tensor", device="hccs_device:hccs"))
register(Scheme("hccs", "HCCS clipped-linear integer softmax surrogate on int8 scores",
                _hccs_softmax_scheme, options=("params", "path", "out_shift", "clb_T"),
                kind="softmax", stats=HccsStats,
                mask_floor=MASK_FLOOR))

__all__ = ["hccs_core", "check_params", "calibrate", "HccsParams", "HccsStats", "hccs_softmax",
           "output_scale", "PATHS"]
