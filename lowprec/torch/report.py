"""The report model of :func:`lowprec.torch.emulate` (no torch dependency): one record per
intercepted attention call (:class:`CallRecord`), statistics per module (:class:`ModuleStats`)
and per context (:class:`EmulationStats`: ``summary()``, ``to_dict()``, ``to_json()``).

Every JSON value goes through :func:`lowprec.stats.to_jsonable` (strict: non-finite floats
become null) and every SQNR through :func:`lowprec.stats.sqnr_db`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np

from ..stats import BapsStats, Stats, sqnr_db, to_jsonable
from .hooks import QuantStats


@dataclass
class CallRecord:
    """One intercepted attention call.

    Attributes:
        index: position of the call in the context (0, 1, ...).
        module: qualified name of the module it is attributed to.
        q_shape, k_shape, v_shape: the shapes given to SDPA (k/v before GQA repetition).
        dtype: q's dtype as a string (``"torch.float32"``).
        causal, masked, gqa: the SDPA flags of the call.
        seconds: wall time of the emulated attention (``lowprec.attention``).
        sqnr_db: SQNR of the output against float32 SDPA (``reference=True``), else None.
        empty_rows: query rows without a visible key (zeroed or NaN, see ``empty_rows=``).
        stats: the scheme's statistics object of this call (None for ``reference``).
    """

    index: int
    module: str
    q_shape: tuple
    k_shape: tuple
    v_shape: tuple
    dtype: str
    causal: bool
    masked: bool
    gqa: bool
    seconds: float
    sqnr_db: float | None = None
    empty_rows: int = 0
    stats: Stats | None = None

    def to_dict(self) -> dict:
        """JSON-ready dict (the scheme stats' scalar entries under ``"stats"``)."""
        d = {k: to_jsonable(getattr(self, k)) for k in (
            "index", "module", "q_shape", "k_shape", "v_shape", "dtype", "causal", "masked",
            "gqa", "seconds", "sqnr_db", "empty_rows")}
        d["q_shape"], d["k_shape"], d["v_shape"] = (list(self.q_shape), list(self.k_shape),
                                                    list(self.v_shape))
        d["stats"] = _scalar_dict(self.stats) if self.stats is not None else None
        return d


@dataclass
class ModuleStats(Stats):
    """Statistics of one module (qualified name) over a context.

    Attributes:
        calls: intercepted attention calls attributed to the module.
        seconds: their total emulation time.
        empty_rows: query rows without a visible key.
        scheme_stats: the scheme's statistics merged over the calls with ``+`` (``BapsStats``
            for ``baps``/``flash``, ``IntAttentionStats``, ...; None for ``reference``).
        sqnr_db: per call, SQNR (dB) against float32 SDPA (``reference=True`` only).
        signal, noise: sums of ``ref**2`` and ``(out - ref)**2`` over those calls (pooled SQNR).
        quant: :class:`~lowprec.torch.hooks.QuantStats` of the module's Linear hooks, or None.

    Derived: ``restart_rate`` / ``peak_restart_rate`` (ARR/PRR, None unless the scheme records
    :class:`~lowprec.stats.BapsStats`), ``sqnr_db_mean``, ``sqnr_db_min``, ``sqnr_db_pooled``.
    """

    calls: int = 0
    seconds: float = 0.0
    empty_rows: int = 0
    scheme_stats: Stats | None = None
    sqnr_db: list = field(default_factory=list)
    signal: float = 0.0
    noise: float = 0.0
    quant: QuantStats | None = None

    @property
    def restart_rate(self) -> float | None:
        """ARR of the module's BAPS calls (None when the scheme records no BapsStats)."""
        s = self.scheme_stats
        return s.restart_rate if isinstance(s, BapsStats) else None

    @property
    def peak_restart_rate(self) -> float | None:
        """PRR of the module's BAPS calls (None when the scheme records no BapsStats)."""
        s = self.scheme_stats
        return s.peak_restart_rate if isinstance(s, BapsStats) else None

    @property
    def sqnr_db_mean(self) -> float | None:
        """Mean of the per-call SQNRs in dB (None without ``reference=True``)."""
        return float(np.mean(self.sqnr_db)) if self.sqnr_db else None

    @property
    def sqnr_db_min(self) -> float | None:
        """Smallest per-call SQNR in dB (None without ``reference=True``)."""
        return float(np.min(self.sqnr_db)) if self.sqnr_db else None

    @property
    def sqnr_db_pooled(self) -> float | None:
        """SQNR of all the module's outputs together, ``10 log10(signal / noise)``."""
        if not self.sqnr_db:
            return None
        return sqnr_db(self.signal, self.noise)

    def to_dict(self, full: bool = False) -> dict:
        """JSON-ready ``{stat: value}``: calls, seconds, empty_rows, restart_rate,
        peak_restart_rate, sqnr_db_mean/min/pooled, the Linear hook counts and fractions
        (``act_*``, ``w_*``) and the scheme statistics' scalar entries (prefixed ``scheme.``);
        ``full=True`` adds the per-call SQNR list and the scheme statistics' lists.
        Non-finite floats become None (strict JSON)."""
        d = {"calls": self.calls, "seconds": self.seconds, "empty_rows": self.empty_rows,
             "restart_rate": self.restart_rate, "peak_restart_rate": self.peak_restart_rate,
             "sqnr_db_mean": self.sqnr_db_mean, "sqnr_db_min": self.sqnr_db_min,
             "sqnr_db_pooled": self.sqnr_db_pooled}
        if self.quant is not None:
            d.update(self.quant.to_dict())
        if self.scheme_stats is not None:
            src = self.scheme_stats.to_dict() if full else _scalar_dict(self.scheme_stats)
            for k, val in src.items():
                d[f"scheme.{k}"] = val
        if full:
            d["sqnr_db"] = list(self.sqnr_db)
        return {k: to_jsonable(val) for k, val in d.items()}


class EmulationStats:
    """Statistics of one :func:`emulate` context: per module and per call.

    Attributes:
        modules: ``{qualified name: ModuleStats}`` in order of first appearance.
        calls: list of :class:`CallRecord`, one per intercepted attention call.
        scheme, options: what the context emulates.
    """

    def __init__(self, scheme: str = "", options: dict | None = None):
        self.scheme = scheme
        self.options = dict(options or {})
        self.modules: dict[str, ModuleStats] = {}
        self.calls: list[CallRecord] = []

    def module(self, name: str) -> ModuleStats:
        """The :class:`ModuleStats` of ``name`` (created empty if new)."""
        m = self.modules.get(name)
        if m is None:
            m = self.modules[name] = ModuleStats()
        return m

    def record(self, rec: CallRecord, signal: float = 0.0, noise: float = 0.0) -> None:
        """Add one call (used by the context)."""
        self.calls.append(rec)
        m = self.module(rec.module)
        m.calls += 1
        m.seconds += rec.seconds
        m.empty_rows += rec.empty_rows
        if rec.stats is not None:
            m.scheme_stats = rec.stats if m.scheme_stats is None else m.scheme_stats + rec.stats
        if rec.sqnr_db is not None:
            m.sqnr_db.append(rec.sqnr_db)
            m.signal += signal
            m.noise += noise

    def total(self) -> ModuleStats:
        """Every module merged into one :class:`ModuleStats`."""
        out = ModuleStats()
        for m in self.modules.values():
            out = out.merge(m)
        return out

    @property
    def restart_rate(self) -> float | None:
        """ARR over every call (restarted / non-critical tiles); None unless BAPS-family."""
        return self.total().restart_rate

    @property
    def peak_restart_rate(self) -> float | None:
        """PRR: the largest per-(call, batch, head) restart rate; None unless BAPS-family."""
        return self.total().peak_restart_rate

    def to_dict(self, full: bool = False) -> dict:
        """``{module: {stat: value}}`` (see :meth:`ModuleStats.to_dict`), JSON-ready."""
        return {name: m.to_dict(full) for name, m in self.modules.items()}

    def to_json(self, path=None, *, full: bool = False, calls: bool = True) -> str:
        """Write (when ``path`` is given) and return a JSON report: ``scheme``, ``options``,
        ``totals``, ``modules`` (:meth:`to_dict`) and, with ``calls``, the per-call records.
        Strict JSON: non-finite floats are written as null."""
        doc = {"scheme": self.scheme, "options": {k: to_jsonable(v) for k, v in
                                                  self.options.items()},
               "totals": self.total().to_dict(full=False), "modules": self.to_dict(full)}
        if calls:
            doc["calls"] = [c.to_dict() for c in self.calls]
        text = json.dumps(doc, indent=1, allow_nan=False, default=str)
        if path is not None:
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(text)
        return text

    def summary(self) -> str:
        """A per-module table: calls, ARR, PRR, SQNR (mean/min dB), Linear saturation and
        underflow (percent of elements), emulation time; a total line last."""
        head = ("module", "calls", "ARR", "PRR", "SQNR dB", "SQNR min", "act sat%", "act uf%",
                "w sat%", "w uf%", "time s")
        rows = [head]
        items = list(self.modules.items()) + [("TOTAL", self.total())]
        for name, m in items:
            q = m.quant
            rows.append((
                name, str(m.calls), _fmt(m.restart_rate, ".4f"), _fmt(m.peak_restart_rate, ".4f"),
                _fmt(m.sqnr_db_mean, ".1f"), _fmt(m.sqnr_db_min, ".1f"),
                _fmt(None if q is None else 100 * q.act_saturation, ".3f"),
                _fmt(None if q is None else 100 * q.act_underflow_rate, ".3f"),
                _fmt(None if q is None else 100 * q.w_saturation, ".3f"),
                _fmt(None if q is None else 100 * q.w_underflow_rate, ".3f"),
                _fmt(m.seconds, ".3f")))
        widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
        lines = [f"lowprec.emulate scheme={self.scheme} options={self.options}"]
        for j, r in enumerate(rows):
            lines.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                                   for i, (c, w) in enumerate(zip(r, widths, strict=True))))
            if j == 0 or j == len(rows) - 2:
                lines.append("  ".join("-" * w for w in widths))
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (f"EmulationStats(scheme={self.scheme!r}, modules={len(self.modules)}, "
                f"calls={len(self.calls)})")


def _fmt(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def _scalar_dict(st: Stats) -> dict:
    return {k: to_jsonable(v) for k, v in st.to_dict().items()
            if isinstance(v, (int, float, bool, str)) or v is None}


__all__ = ["CallRecord", "ModuleStats", "EmulationStats"]
