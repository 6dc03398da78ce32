"""The report model of :func:`lowprec.torch.emulate` (no torch dependency): one record per
intercepted attention call (:class:`CallRecord`), statistics per module (:class:`ModuleStats`)
and per context (:class:`EmulationStats`: ``summary()``, ``to_dict()``, ``to_json()``).

Every JSON value goes through :func:`lowprec.stats.to_jsonable` (strict: non-finite floats
become null) and every SQNR through :func:`lowprec.stats.sqnr_db`.  A statistic that does not
apply is None (``-`` in ``summary()``, null in JSON), never 0: the restart rates of a scheme or
call without a restart test, SQNR without ``reference=True``, Linear counts without hooks.

The scheme's own counters (``Stats.key_counts()``: its key counters and its hazards, such as
QFlash's output wraps) are columns of ``summary()``; a hazard that occurred is listed under the
table with its meaning (:func:`counter_meaning`, taken from the statistics class's docstring).
"""

from __future__ import annotations

import functools
import inspect
import json
import re
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
        seconds: time of the emulated attention: wall time on the CPU, device time between
            two CUDA events for a scheme of the GPU engine on a CUDA tensor.
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
            d["hazards"] = dict(self.scheme_stats.hazards)
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

    def rename(self, renames: dict) -> None:
        """Rename modules (``{old: new}``; used by a context without ``model=`` when a larger
        model absorbs one met before, :mod:`lowprec.torch.naming`): their records move to the
        new name, merged with what it already has."""
        if not renames:
            return
        for c in self.calls:
            c.module = renames.get(c.module, c.module)
        modules: dict[str, ModuleStats] = {}
        for name, m in self.modules.items():
            new = renames.get(name, name)
            modules[new] = m if new not in modules else modules[new].merge(m)
        self.modules = modules

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
        """A per-module table and a total line: calls; ARR and PRR (BAPS-family schemes, ``-``
        where no restart test ran); SQNR mean/min in dB (``reference=True``); Linear
        saturation and underflow in percent of elements (``activations=``/``weights=``); the
        scheme's key counters (``Stats.key_counts()``; rates as fractions) and those of its
        hazard counters that are not 0; empty rows; emulation time.  Columns that do not apply
        to the context are left out.  Under the table: each hazard that occurred, with its
        meaning, or one line saying that none did."""
        total = self.total()
        items = list(self.modules.items()) + [("TOTAL", total)]
        st = total.scheme_stats
        keys = list(st.key_counts()) if st is not None else []
        cols = [("calls", lambda m: str(m.calls), True)]
        if isinstance(st, BapsStats):
            cols += [("ARR", lambda m: _fmt(m.restart_rate, ".4f"), True),
                     ("PRR", lambda m: _fmt(m.peak_restart_rate, ".4f"), True)]
        cols += [("SQNR dB", lambda m: _fmt(m.sqnr_db_mean, ".1f"), False),
                 ("SQNR min", lambda m: _fmt(m.sqnr_db_min, ".1f"), False)]
        for head, attr in (("act sat%", "act_saturation"), ("act uf%", "act_underflow_rate"),
                           ("w sat%", "w_saturation"), ("w uf%", "w_underflow_rate")):
            cols.append((head, functools.partial(_quant_pct, attr=attr), False))
        hazards = list(st.hazards) if st is not None else []
        for k in keys:  # the key counters always; a hazard column only where one occurred
            cols.append((k.removeprefix("total_"), functools.partial(_count, key=k),
                         k not in hazards))
        cols += [("empty rows", lambda m: str(m.empty_rows), False),
                 ("time s", lambda m: _fmt(m.seconds, ".3f"), True)]
        cells = [[fn(m) for _, fn, _ in cols] for _, m in items]
        keep = [i for i, (_, _, always) in enumerate(cols)
                if always or any(r[i] not in ("-", "0") for r in cells)]
        rows = [("module",) + tuple(cols[i][0] for i in keep)]
        rows += [(name,) + tuple(r[i] for i in keep) for (name, _), r in zip(items, cells,
                                                                             strict=True)]
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = [f"lowprec.emulate scheme={self.scheme} options={self.options}"]
        for j, r in enumerate(rows):
            lines.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                                   for i, (c, w) in enumerate(zip(r, widths, strict=True))))
            if j == 0 or j == len(rows) - 2:
                lines.append("  ".join("-" * w for w in widths))
        if hazards and not any(st.hazards.values()):
            lines.append(f"hazards: none ({', '.join(hazards)} all 0)")
        if st is not None:
            for k, n in st.hazards.items():
                if n:
                    where = [name for name, m in self.modules.items()
                             if m.scheme_stats is not None and m.scheme_stats.hazards.get(k)]
                    lines.append(f"! hazard {k} = {n} in {len(where)} module(s) "
                                 f"({', '.join(where[:3])}{', ...' if len(where) > 3 else ''}):"
                                 f" {counter_meaning(type(st), k)}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (f"EmulationStats(scheme={self.scheme!r}, modules={len(self.modules)}, "
                f"calls={len(self.calls)})")


def _fmt(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def _quant_pct(m: ModuleStats, attr: str) -> str:
    return "-" if m.quant is None else format(100 * getattr(m.quant, attr), ".3f")


def _count(m: ModuleStats, key: str) -> str:
    if m.scheme_stats is None:
        return "-"
    v = m.scheme_stats.key_counts().get(key)
    if isinstance(v, float):
        return format(v, ".4f")
    return "-" if v is None else str(v)


#: counters documented outside a statistics class's ``Attributes:`` section
_MEANINGS = {"nonfinite_rows": "rows that see a key but whose output is NaN or +-Inf (a float32 "
                               "overflow, Inf or NaN inputs, ...; counted by lowprec.attention "
                               "for every scheme)"}


def counter_meaning(cls: type, name: str) -> str:
    """What counter ``name`` of statistics class ``cls`` counts: its entry in the
    ``Attributes:`` section of the class's (or a base class's) docstring, ``total_`` prefix
    ignored; a pointer to the class when it is not documented there.

    Example:
        >>> counter_meaning(BapsStats, "restarts")
        'per call, int64 array ``(B,)`` of those that restarted.'
    """
    docs = _attribute_docs(cls)
    for key in (name, name.removeprefix("total_")):
        if key in _MEANINGS:
            return _MEANINGS[key]
        if key in docs:
            return docs[key]
    return f"a counter of {cls.__name__} (see its documentation)"


@functools.cache
def _attribute_docs(cls: type) -> dict:
    """``{attribute: description}`` from the ``Attributes:`` sections of ``cls``'s MRO."""
    out: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        doc = klass.__dict__.get("__doc__")
        if not doc:
            continue
        indent, current = None, []
        in_attrs = False
        for line in inspect.cleandoc(doc).splitlines():
            stripped = line.strip()
            if stripped == "Attributes:":
                in_attrs, indent, current = True, None, []
                continue
            if not in_attrs:
                continue
            ind = len(line) - len(line.lstrip())
            if not stripped:
                current = []
                continue
            if ind == 0:  # the next section
                in_attrs = False
                continue
            indent = ind if indent is None else indent
            m = re.match(r"([\w, ]+):\s*(.*)$", stripped)
            if ind == indent and m:
                current = [n.strip() for n in m.group(1).split(",") if n.strip()]
                for n in current:
                    out[n] = m.group(2)
            elif ind > indent:
                for n in current:
                    out[n] += " " + stripped
    return out


def _scalar_dict(st: Stats) -> dict:
    return {k: to_jsonable(v) for k, v in st.to_dict().items()
            if isinstance(v, (int, float, bool, str)) or v is None}


__all__ = ["CallRecord", "ModuleStats", "EmulationStats", "counter_meaning"]
