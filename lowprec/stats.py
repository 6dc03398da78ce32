"""Statistics objects of the attention schemes (specs/attention.md section 8).

One small dataclass per scheme family, mergeable across calls (``a + b``), exportable with
``to_dict()`` (JSON-ready).  No torch dependency.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import numpy as np


class Stats:
    """Base: ``a + b`` merges two statistics of the same class, ``sum([...], Empty())`` works
    (``0 + s`` is ``s``), ``to_dict()`` gives plain Python numbers and lists."""

    def merge(self, other: Stats) -> Stats:
        """Field-wise sum: counts add, per-call lists concatenate (every field of a statistics
        dataclass is an int or a list)."""
        return type(self)(**{f.name: _add(getattr(self, f.name), getattr(other, f.name))
                             for f in fields(self)})

    def __add__(self, other):
        if isinstance(other, int) and other == 0:
            return self
        if type(other) is not type(self):
            raise TypeError(f"cannot merge {type(self).__name__} with {type(other).__name__}")
        return self.merge(other)

    __radd__ = __add__

    def to_dict(self) -> dict:
        out = {}
        for f in fields(self):
            out[f.name] = _plain(getattr(self, f.name))
        for name in getattr(self, "_derived", ()):
            out[name] = _plain(getattr(self, name))
        return out


def _add(a, b):
    if isinstance(a, list) or isinstance(b, list):
        return list(a) + list(b)
    return a + b


def _plain(v):
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.floating,)):
        return float(v)
    if isinstance(v, list):
        return [_plain(x) for x in v]
    return v


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
    """

    tiles: list = field(default_factory=list)
    restarts: list = field(default_factory=list)
    row_restarts: list = field(default_factory=list)
    flags: list = field(default_factory=list)
    calls: int = 0

    _derived = ("total_tiles", "total_restarts", "restart_rate", "peak_restart_rate")


    @property
    def total_tiles(self) -> int:
        """Non-critical tiles over everything recorded."""
        return int(sum(int(t.sum()) for t in self.tiles))

    @property
    def total_restarts(self) -> int:
        """Restarted tiles over everything recorded."""
        return int(sum(int(r.sum()) for r in self.restarts))

    @property
    def restart_rate(self) -> float:
        """Average Restart Rate (ARR): restarted / non-critical tiles (0.0 when none)."""
        t = self.total_tiles
        return self.total_restarts / t if t else 0.0

    def rates(self) -> np.ndarray:
        """Per-(call, batch, head) restart rates, concatenated over calls (entries without
        non-critical tiles are left out)."""
        if not self.tiles:
            return np.zeros(0)
        t = np.concatenate(self.tiles)
        r = np.concatenate(self.restarts)
        keep = t > 0
        return r[keep] / t[keep]

    @property
    def peak_restart_rate(self) -> float:
        """Peak Restart Rate (PRR): the largest per-(call, batch, head) rate (0.0 when none)."""
        r = self.rates()
        return float(r.max()) if r.size else 0.0

    def to_dict(self, flags: bool = False) -> dict:
        """JSON-ready summary; per-entry arrays as lists, tile flags only if ``flags``."""
        d = super().to_dict()
        if not flags:
            d.pop("flags")
        d["rates"] = self.rates().tolist()
        return d


# The integer schemes define their statistics next to their kernels (one module per paper);
# they are re-exported here lazily (the kernels import this module, so no import cycle).
_SCHEME_STATS = {
    "IntAttentionStats": "intattention",
    "QFlashStats": "qflash",
    "HccsStats": "hccs",
    "IntFlashStats": "intflash",
    "BaselineStats": "baselines",
}


def __getattr__(name: str):
    mod = _SCHEME_STATS.get(name)
    if mod is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"lowprec.kernels.{mod}"), name)


__all__ = ["Stats", "BapsStats", *_SCHEME_STATS]
