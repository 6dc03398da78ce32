"""Statistics objects of the attention schemes (specs/attention.md section 8).

One small dataclass per scheme family, mergeable across calls (``a + b``), exportable with
``to_dict()`` (JSON-ready).  No torch dependency.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

import numpy as np


class Stats:
    """Base of every statistics dataclass: counters are declared once, as fields.

    * ``a + b`` (:meth:`merge`) merges two statistics of the same class field by field: numbers
      add, per-call lists concatenate, None is the empty value; ``sum([...])`` works (``0 + s``
      is ``s``).
    * ``_totals`` names list fields of per-call ``(B,)`` arrays (or tuples); each gets a
      ``total_<name>`` property, the sum over everything recorded.
    * ``to_dict()`` gives the fields, then the totals, then the ``_derived`` properties, as
      plain Python numbers and lists (:func:`to_jsonable` with ``strict=False``).
    * :meth:`from_columns` builds one call's statistics from a kernel's counter array.
    """

    _totals: tuple = ()
    _derived: tuple = ()
    #: attribute names (int fields or ``total_*`` properties) whose non-zero value says that
    #: some output may be wrong or degraded beyond the scheme's documented behaviour (an
    #: overflow, a wrap, a saturation, a row that lost all its weight); :meth:`hazards` reads
    #: them, ``lp.emulate`` shows them in its summary and warns once per context
    _hazards: tuple = ()
    #: further counters worth a column in ``lp.emulate``'s summary (informative, not hazards)
    _key: tuple = ()
    #: rows that see a key but whose output is not finite (NaN or +-Inf): set by
    #: :func:`lowprec.attention` for every scheme (a float32 score overflow, Inf inputs, ...);
    #: a hazard of every statistics class
    nonfinite_rows: int = 0
    #: finite additive mask entries (per mask plane) at or below the scheme's ``mask_floor``
    #: that were treated as -inf (``torch.finfo(dtype).min`` padding); set by
    #: :func:`lowprec.attention` for the integer schemes, informative
    mask_floored: int = 0
    #: rows that see a key and whose logits carry an estimated input-rounding noise above
    #: 0.5 nat RMS (:func:`lowprec.kernels.problem.logit_noise`: the rounding of q and k to
    #: the scheme's input format, int8 or bfloat16, against the softmax's sharpness); the
    #: documented error bounds hold for rows below it.  Set by :func:`lowprec.attention`; a
    #: hazard of every statistics class
    noisy_rows: int = 0

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        for name in cls.__dict__.get("_totals", ()):
            setattr(cls, f"total_{name}", property(
                lambda self, n=name: self._total(n),
                doc=f"``{name}`` summed over everything recorded."))

    def _total(self, name: str) -> int:
        return int(sum(int(np.sum(a)) for a in getattr(self, name)))

    @classmethod
    def from_columns(cls, counts: np.ndarray, names: tuple, **fields):
        """One call's statistics: column ``i`` of the int64 ``(B, len(names))`` array
        ``counts`` becomes the per-entry array of field ``names[i]``; ``fields`` sets the rest
        (``calls`` defaults to 1)."""
        kw = {n: [np.ascontiguousarray(counts[:, i])] for i, n in enumerate(names)}
        kw.setdefault("calls", 1)
        kw.update(fields)
        return cls(**kw)

    def merge(self, other: Stats) -> Stats:
        """Field-wise sum: numbers add, per-call lists concatenate, None is empty."""
        res = type(self)(**{f.name: _add(getattr(self, f.name), getattr(other, f.name))
                            for f in fields(self)})
        for name in _FRONT_END:
            n = getattr(self, name) + getattr(other, name)
            if n:
                setattr(res, name, n)
        return res

    @property
    def hazards(self) -> dict:
        """``{counter: count}`` of the hazard counters (``nonfinite_rows``, ``noisy_rows``, the
        class's
        ``_hazards``; a ``total_`` prefix dropped) over everything recorded; all zero when
        nothing went wrong."""
        names = ("nonfinite_rows", "noisy_rows") + tuple(self._hazards)
        return {n.removeprefix("total_"): int(getattr(self, n)) for n in names}

    def key_counts(self) -> dict:
        """``{counter: value}`` of the counters ``lp.emulate``'s summary shows: the class's
        ``_key`` counters, then the hazards."""
        d = {n: to_jsonable(getattr(self, n), strict=False) for n in self._key}
        d.update(self.hazards)
        return d

    def __add__(self, other):
        if isinstance(other, int) and other == 0:
            return self
        if type(other) is not type(self):
            raise TypeError(f"cannot merge {type(self).__name__} with {type(other).__name__}")
        return self.merge(other)

    __radd__ = __add__

    def to_dict(self) -> dict:
        """The fields, totals and derived values as plain Python numbers and lists."""
        out = {f.name: to_jsonable(getattr(self, f.name), strict=False) for f in fields(self)}
        for name in tuple(f"total_{n}" for n in self._totals) + tuple(self._derived):
            out[name] = to_jsonable(getattr(self, name), strict=False)
        for name in _FRONT_END:
            out[name] = int(getattr(self, name))
        if "hazards" not in out:
            out["hazards"] = self.hazards
        return out


# counters lp.attention sets on every class
_FRONT_END = ("nonfinite_rows", "mask_floored", "noisy_rows")


def _has_test(flags: np.ndarray) -> bool:
    """A call of a restart-capable flow marks its critical tiles (-1) or restarts (1); a flow
    without a restart test never writes either."""
    return bool(((flags == -1) | (flags == 1)).any())


def _add(a, b):
    if a is None:
        return b
    if b is None:
        return a
    if isinstance(a, list) or isinstance(b, list):
        return list(a) + list(b)
    return a + b


def to_jsonable(obj, *, strict: bool = True):
    """``obj`` with NumPy scalars and arrays turned into Python numbers and lists: the one JSON
    converter of lowprec (statistics, ``lp.emulate`` reports, study reports).

    ``strict=True`` (JSON files): non-finite floats become None, tuples lists, dict keys
    strings, objects with ``to_dict()`` their dict and anything else its ``str``.
    ``strict=False`` (``Stats.to_dict``): numbers, arrays and lists converted, everything else
    (NaN, tuples, dicts, strings) kept as it is.

    Example:
        >>> to_jsonable({"a": np.float32(1.5), 2: [np.inf]})
        {'a': 1.5, '2': [None]}
    """
    if isinstance(obj, np.ndarray):
        return to_jsonable(obj.tolist(), strict=strict)
    if isinstance(obj, list) or (strict and isinstance(obj, tuple)):
        return [to_jsonable(v, strict=strict) for v in obj]
    if isinstance(obj, (np.bool_, bool)):
        return bool(obj) if strict or isinstance(obj, bool) else obj
    if isinstance(obj, (np.integer, int)):
        return int(obj)
    if isinstance(obj, (np.floating, float)):
        f = float(obj)
        return f if not strict or math.isfinite(f) else None
    if not strict or obj is None or isinstance(obj, str):
        return obj
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if hasattr(obj, "to_dict"):
        return to_jsonable(obj.to_dict())
    return str(obj)


def sqnr_db(signal: float, noise: float) -> float:
    """Signal-to-quantization-noise ratio ``10 log10(signal / noise)`` in dB from the two
    energies (sums of squares): the one SQNR of lowprec.  ``inf`` when ``noise == 0``,
    ``-inf`` when ``signal == 0 < noise``, NaN when either is NaN.

    Example:
        >>> sqnr_db(100.0, 1.0)
        20.0
    """
    if math.isnan(signal) or math.isnan(noise):
        return math.nan
    if noise == 0:
        return math.inf
    if signal == 0:
        return -math.inf
    return 10.0 * math.log10(signal / noise)


def sqnr(out, ref) -> float:
    """:func:`sqnr_db` of ``out`` against ``ref`` (float64 sums over all elements; a
    non-finite output element counts as infinite noise)."""
    o = np.asarray(out, dtype=np.float64)
    r = np.asarray(ref, dtype=np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.where(np.isfinite(o), o - r, np.inf)
        return sqnr_db(float(np.sum(r * r)), float(np.sum(err * err)))


def inner(a, b) -> float:
    """``sum(a * b)`` of two arrays in float64, summed by NumPy's pairwise ``sum``, not BLAS:
    a threaded BLAS splits a long dot product (OpenBLAS above 10,000 elements) between its
    threads, so its bits would depend on the thread count, and a study report on how many
    processes shared the machine (``lowprec.studies.distributed``)."""
    return float(np.sum(np.asarray(a, dtype=np.float64) * np.asarray(b, dtype=np.float64)))


def norm(x) -> float:
    """The Euclidean norm ``sqrt(sum(x**2))`` in float64, summed as :func:`inner` (not
    ``np.linalg.norm``, which calls BLAS)."""
    return math.sqrt(inner(x, x))


@dataclass
class BapsStats(Stats):
    """Restart statistics of BAPS tiled attention (specs/attention.md sections 2 and 8).

    A *call* is one :func:`lowprec.attention` call; each call records, per (batch, head) entry
    ``b`` (leading dims flattened), the number of non-critical tiles visited and how many of
    them restarted, plus the per-tile flags.

    Attributes:
        tiles: per call, int64 array ``(B,)`` of non-critical (query tile, key tile) pairs
            visited (fully masked tiles are skipped and not counted).
        restarts: per call, int64 array ``(B,)`` of those that restarted.
        row_restarts: per call, int64 array ``(B,)`` of restarted rows (row granularity counts
            rows; tile granularity counts every row of a restarted tile).
        flags: per call, int8 array ``(B, n_qtiles, n_ktiles)``: 1 restarted, 0 not,
            -1 critical tile, -2 skipped (fully masked).
        calls: number of calls merged.
        restartable: how many of those calls ran a flow with a restart test (BAPS
            ``e2e_hif8``); ``flash`` and the other BAPS configurations have none, and then
            ``tiles`` counts the tiles visited and the restart rates are None.
    """

    tiles: list = field(default_factory=list)
    restarts: list = field(default_factory=list)
    row_restarts: list = field(default_factory=list)
    flags: list = field(default_factory=list)
    calls: int = 0
    restartable: int = 0

    _totals = ("tiles", "restarts")  # non-critical / restarted tiles over everything recorded
    _derived = ("restart_rate", "peak_restart_rate")
    _key = ("total_tiles", "total_restarts")

    def _restart_tiles(self) -> tuple[np.ndarray, np.ndarray]:
        """Per-(call, entry) non-critical and restarted tiles of the calls with a restart
        test."""
        keep = [i for i, f in enumerate(self.flags)
                if self.restartable == self.calls or _has_test(f)]
        if not keep or not self.restartable:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        return (np.concatenate([self.tiles[i] for i in keep]),
                np.concatenate([self.restarts[i] for i in keep]))

    @property
    def restart_rate(self) -> float | None:
        """Average Restart Rate (ARR): restarted / non-critical tiles over the calls with a
        restart test; None when there is none (no restart mechanism: ``flash`` and the BAPS
        configurations other than ``e2e_hif8``; or no non-critical tile was visited, e.g. a
        sequence of one key tile)."""
        t, r = self._restart_tiles()
        total = int(t.sum())
        return int(r.sum()) / total if total else None

    def rates(self) -> np.ndarray:
        """Per-(call, batch, head) restart rates of the calls with a restart test,
        concatenated over calls (entries without non-critical tiles are left out)."""
        t, r = self._restart_tiles()
        keep = t > 0
        return r[keep] / t[keep]

    @property
    def peak_restart_rate(self) -> float | None:
        """Peak Restart Rate (PRR): the largest per-(call, batch, head) rate (None where
        :attr:`restart_rate` is None)."""
        r = self.rates()
        return float(r.max()) if r.size else None

    def to_dict(self, flags: bool = False) -> dict:
        """JSON-ready summary; per-entry arrays as lists, tile flags only if ``flags``."""
        d = super().to_dict()
        if not flags:
            d.pop("flags")
        d["rates"] = self.rates().tolist()
        return d


@dataclass
class IntAttentionStats(Stats):
    """Statistics of the IntAttention family (specs/attention.md sections 3 and 8).

    Totals are summed over calls; the ``c_int`` and ``head_*`` lists hold one entry per call.
    ``intattention`` and :func:`~lowprec.kernels.intattention.index_softmax` fill every field
    but ``exaq_clip``; ``quant_only`` fills ``calls``, ``rows``, ``empty_rows``, ``quantized``,
    ``saturated``; ``index_softmax_only`` fills ``calls``, ``rows``, ``empty_rows``; ``exaq``
    (:mod:`lowprec.kernels.exaq`, compared with them in the IntAttention paper) also ``logits``
    and ``exaq_clip``.  Shared by those schemes, so it lives here like :class:`BapsStats`.

    Attributes:
        calls: number of calls merged (core or attention calls).
        rows: softmax rows processed.
        empty_rows: rows without a visible key (NaN output rows of the pipelines).
        logits: visible logits processed.
        clipped: visible logits with ``rowmax - S >= c_int`` (eq. 9 saturates them; the LUT gives
            them its last entry, 0): the sparsity of the clipping.
        zero_exp: visible logits whose LUT value is 0 (``clipped`` plus small-table zeros).
        quantized: q, k, v elements quantised to int8 by the pipelines.
        saturated: of those, elements with ``|x / s| > 127.5`` (clamped to +-127; always 0 with
            data-derived scales, kept so every scheme reports it).
        mask_saturated: logits whose sum with the mask bias saturated to ``+-(2**30 - 1)``.
        uint16_wraps: ``deploy=True``: rows whose row sum exceeded 65535 (it wrapped).
        reciprocal_overflows: ``deploy=True``: rows whose wrapped sum was below 255, so the 8-bit
            reciprocal ``ns`` did not fit (see the module docstring).
        diff_overflows: logits whose ``rowmax - S`` exceeded int32 (core on wide-range input;
            computed exactly here, an int32 kernel would wrap).
        c_int: per call, int64 array ``(B, groups)`` of the thresholds used (``T`` in deploy
            mode; groups: 1, or query blocks with ``per_block``); core calls record theirs
            per row group as given (broadcast shape).
        head_logits, head_clipped, head_wraps: per call, int64 ``(B,)`` per (batch, head)
            entry (leading dims flattened; the core flattens all leading dims into one entry).
        exaq_clip: per ``exaq`` call, ``[sigma, C, lo]``: the population std of the max-centred
            scores, EXAQ's ``C = a sigma + b`` and the lower clip ``max(C, min)``.
        unnormalized_rows: ``intattention`` / ``quant_only``: rows that see a key whose
            integer probabilities sum more than 10 % away from full scale (255 or 127): 8-bit P
            on long flat rows (P = 0 everywhere beyond ~510 / ~254 keys), a hazard.
        exaq_merged: ``exaq``: keys more than 1 nat below their row's max that the quantiser
            put within half a nat of it (so they get more than 0.6 of the max's weight where
            softmax gives them less than 1/e of it): EXAQ's sigma-proportional levels are
            coarser than the row's softmax, as for large score amplitudes, or sigma overflowed
            and C fell back to -1e-6; a hazard (issue 12).
    """

    calls: int = 0
    rows: int = 0
    empty_rows: int = 0
    logits: int = 0
    clipped: int = 0
    zero_exp: int = 0
    quantized: int = 0
    saturated: int = 0
    mask_saturated: int = 0
    uint16_wraps: int = 0
    reciprocal_overflows: int = 0
    diff_overflows: int = 0
    c_int: list = field(default_factory=list)
    head_logits: list = field(default_factory=list)
    head_clipped: list = field(default_factory=list)
    head_wraps: list = field(default_factory=list)
    exaq_clip: list = field(default_factory=list)
    exaq_merged: int = 0
    unnormalized_rows: int = 0

    _derived = ("clip_rate", "zero_rate", "saturation_rate", "wrap_rate")
    _key = ("clip_rate", "zero_rate", "mask_saturated")
    _hazards = ("saturated", "uint16_wraps", "reciprocal_overflows", "diff_overflows",
                "exaq_merged", "unnormalized_rows")

    @property
    def clip_rate(self) -> float:
        """``clipped / logits`` (0.0 when nothing was recorded)."""
        return self.clipped / self.logits if self.logits else 0.0

    @property
    def zero_rate(self) -> float:
        """``zero_exp / logits``: the share of visible logits that contribute nothing."""
        return self.zero_exp / self.logits if self.logits else 0.0

    @property
    def saturation_rate(self) -> float:
        """``saturated / quantized`` (0.0 when nothing was quantised)."""
        return self.saturated / self.quantized if self.quantized else 0.0

    @property
    def wrap_rate(self) -> float:
        """``uint16_wraps / rows`` (deploy mode; 0.0 otherwise)."""
        return self.uint16_wraps / self.rows if self.rows else 0.0


def __getattr__(name: str):
    # the schemes' statistics classes, named on their Scheme records (lowprec.kernels), are
    # re-exported here lazily (the kernels import this module, so no import cycle)
    if name.startswith("__"):  # e.g. the import system's __path__ probe
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from .kernels import stats_classes

    cls = stats_classes().get(name)
    if cls is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return cls


__all__ = ["Stats", "BapsStats", "IntAttentionStats", "to_jsonable", "sqnr_db", "sqnr", "inner",
           "norm"]
