"""Attention and softmax emulation (specs/attention.md).

Public entry points (re-exported as ``lowprec.attention``, ``lowprec.schemes``,
``lowprec.softmax``)::

    out = lp.attention(q, k, v, scheme="flash", causal=True)
    out, st = lp.attention(q, k, v, scheme="baps", config="e2e_hif8", tau=1, return_stats=True)
    lp.schemes()            # {name: one-line description}

Each scheme lives in its own module and registers itself with :func:`register` (docs/design.md,
"How to add a scheme"); the modules named in :data:`SCHEME_MODULES` are imported on first use of
the registry, and a name there that does not import fails loudly.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._check import check_bool
from .problem import check_options, finish, one_blas_thread, prepare

#: the modules that define schemes, one line each (imported on first use of the registry)
SCHEME_MODULES = (
    "reference",
    "baps",
    "intattention",
    "exaq",
    "baselines",
    "qflash",
    "hccs",
    "intflash",
)


@dataclass(frozen=True)
class Scheme:
    """A registered scheme.

    Attributes:
        name: the ``scheme=`` string.
        description: one line for :func:`schemes`.
        run: ``run(prob, return_stats, **options) -> (out float32 (B, Lq, dv), stats | None)``
            for attention schemes; ``run(x, axis, **options) -> array`` for softmax schemes.
        options: the keyword options ``run`` accepts (checked before the call).
        kind: ``"attention"`` or ``"softmax"``.
        float64: the scheme computes in float64 when all inputs are float64.
        variants: ``(option, values)`` when the scheme is several configurations the studies
            run one by one (``("config", CONFIGS)`` for ``baps``), else None.
        shape_dependent: options whose validity depends on the inputs' shape (``lp.emulate``
            makes no trial call with them).
        stats: the statistics class its calls return (None: no statistics).
        order: display order in studies and tables (ascending; ties keep registry order).
    """

    name: str
    description: str
    run: Callable[..., Any]
    options: tuple = ()
    kind: str = "attention"
    float64: bool = False
    variants: tuple | None = None
    shape_dependent: tuple = ()
    stats: type | None = None
    order: int = 100


_REGISTRY: dict[tuple[str, str], Scheme] = {}
_LOADED = False


def register(scheme: Scheme) -> Scheme:
    """Add a scheme to the registry (called by the scheme modules at import)."""
    _REGISTRY[(scheme.kind, scheme.name)] = scheme
    return scheme


def _ensure() -> None:
    global _LOADED
    if _LOADED:
        return
    for mod in SCHEME_MODULES:
        importlib.import_module(f"{__name__}.{mod}")  # a misspelt name raises here
    _LOADED = True


def scheme_records(kind: str = "attention") -> list[Scheme]:
    """The registered :class:`Scheme` records of ``kind`` in display order (``order``, then
    registry order)."""
    _ensure()
    recs = [s for (k, _), s in _REGISTRY.items() if k == kind]
    return sorted(recs, key=lambda s: s.order)


def stats_classes() -> dict[str, type]:
    """``{class name: class}`` of every scheme's statistics class (``lowprec.stats`` re-exports
    them)."""
    _ensure()
    return {s.stats.__name__: s.stats for s in _REGISTRY.values() if s.stats is not None}


def schemes(kind: str = "attention") -> dict[str, str]:
    """Registered schemes of ``kind`` (``"attention"`` or ``"softmax"``): ``{name: description}``.

    Example::

        >>> "baps" in lp.schemes()
        True
    """
    if kind not in ("attention", "softmax"):
        raise ValueError(f"kind {kind!r} is not one of attention, softmax")
    _ensure()
    return {n: s.description for (k, n), s in sorted(_REGISTRY.items()) if k == kind}


def get_scheme(name: str, kind: str = "attention") -> Scheme:
    """The registered :class:`Scheme` called ``name``; ValueError lists the valid names."""
    _ensure()
    s = _REGISTRY.get((kind, name)) if isinstance(name, str) else None
    if s is None:
        raise ValueError(
            f"{kind} scheme {name!r} is not one of {', '.join(schemes(kind))}"
        )
    return s


def attention(q, k, v, scheme: str = "reference", *, scale: float | None = None,
              causal: bool = False, attn_mask=None, return_stats: bool = False, **options):
    """Emulated attention ``softmax(q k^T * scale + mask) v`` under ``scheme``.

    Args:
        q, k, v: numpy arrays or CPU torch tensors (float32, float16, bfloat16; float64 is
            rounded to float32 by every scheme but ``reference``), shapes ``(..., Lq, d)``,
            ``(..., Lk, d)``, ``(..., Lk, dv)``; leading (batch, head) dims broadcast.
        scheme: a name from :func:`schemes` (``reference``, ``flash``, ``baps``, ...).
        scale: softmax scale, default ``1 / sqrt(d)``.
        causal: mask key ``j > i + (Lk - Lq)`` (bottom-right aligned, torch's
            ``causal_lower_right``).
        attn_mask: boolean (True = attend) or additive float mask broadcastable to
            ``(..., Lq, Lk)``.
        return_stats: also return the scheme's statistics object (specs/attention.md 8).
        **options: scheme options (e.g. ``config``, ``tau``, ``block_q``, ``block_k``); an unknown
            option raises ValueError listing the valid ones.

    Returns:
        ``out`` of shape ``(..., Lq, dv)`` in q's dtype and kind (numpy or torch), or
        ``(out, stats)`` with ``return_stats=True``.  A query row that sees no key gives NaN.

    Example::

        >>> out, st = lp.attention(q, k, v, scheme="baps", config="e2e_hif8", causal=True,
        ...                        return_stats=True)
        >>> st.restart_rate
    """
    s = get_scheme(scheme)
    check_options(options, scheme, s.options)
    check_bool(return_stats, "return_stats")
    prob, as_torch = prepare(q, k, v, scale=scale, causal=causal, attn_mask=attn_mask,
                             keep_float64=s.float64)
    with one_blas_thread():  # NumPy's GEMMs beside the parallel row kernels (problem.py)
        out, stats = s.run(prob, return_stats, **options)
    none = prob.no_key_rows()
    if none is not None:  # the one place rows that see no key become NaN (problem.py)
        rows = out[none]
        rows[~np.isnan(rows)] = np.nan  # a kernel's own NaN (0/0) keeps its bits
        out[none] = rows
    if stats is not None:  # rows that see a key but came out NaN/Inf: a hazard of every scheme
        bad = ~np.isfinite(out).all(axis=-1) if prob.dv else np.zeros(out.shape[:2], bool)
        if none is not None:
            bad &= ~none
        stats.nonfinite_rows = int(np.count_nonzero(bad))
    res = finish(out, prob, as_torch)
    return (res, stats) if return_stats else res


def softmax(scores, scheme: str, axis: int = -1, **options):
    """Softmax surrogate ``scheme`` (``lp.schemes("softmax")``) along ``axis`` of ``scores``."""
    s = get_scheme(scheme, kind="softmax")
    check_options(options, scheme, s.options)
    return s.run(scores, axis, **options)


__all__ = ["attention", "schemes", "softmax", "register", "get_scheme", "Scheme",
           "scheme_records", "stats_classes", "SCHEME_MODULES"]
