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
from .problem import check_options, finish, floor_rows, one_blas_thread, prepare

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
        mask_floor: additive mask values at or below it are made ``-inf`` before the scheme
            runs (:data:`lowprec.kernels.problem.MASK_FLOOR` for the integer schemes, whose
            logit scales a finite stand-in for -inf would wreck); None: added as they are.
        noise: ``noise(options) -> model`` of how the scheme rounds q and k (a model of
            :func:`lowprec.kernels.problem.logit_noise`, or None when it keeps them exact);
            :func:`attention` counts the rows it makes noisy (``Stats.noisy_rows``).
        error_bound: the documented bound on :func:`attention_error` against ``reference``
            for calls whose statistics report no hazard (no ``noisy_rows`` either), with the
            scheme's default options; measured, not derived: the largest error of the property
            test's cases (tests/test_robustness.py: random shapes up to 70 tokens, masks,
            amplitudes 1e-30 .. 1e20, block sizes up to 2**64) with a margin of about 1.7.
        engine: for the schemes of the tiled engine (``flash``, ``baps``):
            ``engine(Lq, Lk, **options) -> (EngineConfig, block_q, block_k,
            round_inputs_bf16)``, the options validated and turned into the engine's
            arguments; :func:`attention` runs such a scheme on a CUDA tensor's own device
            through the GPU engine (:mod:`lowprec.kernels.device`).  None: CPU only.
        device: for the row-wise schemes with a device implementation: ``"module:function"``
            of it (module relative to ``lowprec.kernels``, imported on first use), called as
            ``function(dprob, return_stats, **options) -> (out, stats)`` with a
            :class:`~lowprec.kernels.device_rows.DeviceProblem`, the twin of ``run``;
            :func:`attention` runs such a scheme on a CUDA tensor's own device
            (:mod:`lowprec.kernels.device`).  None (and no ``engine``): CPU only.
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
    mask_floor: float | None = None
    noise: Callable[[dict], str | None] | None = None
    error_bound: float | None = None
    engine: Callable[..., Any] | None = None
    device: str | None = None


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
        q, k, v: numpy arrays or torch tensors (float32, float16, bfloat16; float64 is
            rounded to float32 by every scheme but ``reference``), shapes ``(..., Lq, d)``,
            ``(..., Lk, d)``, ``(..., Lk, dv)``; leading (batch, head) dims broadcast.
            Every registered scheme has a device path (``flash``, ``baps`` through the GPU
            engine, the others through :mod:`lowprec.kernels.device_rows`): CUDA tensors run
            on their own device (same bits and statistics as the CPU, where float64 GEMMs
            decide the last bits as measured: :mod:`lowprec.kernels.device`) and return a
            tensor there; a scheme registered without one takes CPU tensors only.
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
    from .device import attention_device, wants_device

    if wants_device(s, q):  # a CUDA tensor and a scheme of the GPU engine: on its device
        return attention_device(s, q, k, v, scale=scale, causal=causal, attn_mask=attn_mask,
                                return_stats=return_stats, options=options)
    prob, as_torch = prepare(q, k, v, scale=scale, causal=causal, attn_mask=attn_mask,
                             keep_float64=s.float64)
    floored = 0
    if s.mask_floor is not None:
        prob, floored = prob.floored(s.mask_floor)
    if prob.B == 0 or prob.Lq == 0 or prob.Lk == 0 or prob.dv == 0:
        # nothing to compute (every row sees no key when Lk == 0: NaN below); the scheme's
        # options are still validated by a run on a one-element problem
        _validate_options(s, prob, options)
        out = np.zeros((prob.B, prob.Lq, prob.dv), dtype=np.float32)
        stats = _empty_stats(s) if return_stats else None
    else:
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
        stats.mask_floored = floored
        if s.noise is not None:
            stats.noisy_rows = _noisy_rows(prob, s.noise(options), none,
                                           options.get("scale_scope") == "tensor")
    res = finish(out, prob, as_torch)
    return (res, stats) if return_stats else res


def _noisy_rows(prob, model, none, whole_tensor: bool) -> int:
    """Rows taking part (padding rows are not counted) whose estimated logit noise exceeds
    NOISE_NATS; the estimate ignores padding content unless the scheme's scales see the whole
    tensor (``scale_scope="tensor"``)."""
    from .problem import NOISE_NATS, logit_noise

    if model is None:
        return 0
    parts = prob.taking_part() if prob.mask is not None or prob.causal else None
    est = logit_noise(prob, model, None if whole_tensor else parts)
    if est is None:
        return 0
    noisy = ~(est <= NOISE_NATS)  # NaN (overflowing inputs) counts as noisy
    if parts is not None:
        noisy &= parts[0]
    elif none is not None:
        noisy &= ~none
    return int(np.count_nonzero(noisy))


def attention_error(out, ref, v) -> float:
    """The error measure of :attr:`Scheme.error_bound`: the RMS over the rows that see a key
    (rows where ``ref`` is finite) of ``rms_c(out_ic - ref_ic) / rms_jc(v_jc)``, each row's
    error divided by the RMS of its own value tensor (its leading index's ``v``).

    Dividing by ``v`` rather than by ``ref`` keeps the measure meaningful where the output
    cancels (a flat softmax over many keys averages ``v`` to near 0): an output row equal to a
    different key's value row scores about 1.4, a perfect one 0.  A non-finite output row
    where ``ref`` is finite scores ``inf``; 0.0 when no row sees a key.

    Args:
        out: the scheme's output ``(..., Lq, dv)`` (NumPy or torch).
        ref: the ``reference`` output of the same call, same shape.
        v: the call's values ``(..., Lk, dv)``, broadcastable to ``out``'s leading dims.
    """
    from ..formats._arrays import to_numpy

    o = np.asarray(to_numpy(out, "out")[0], dtype=np.float64)
    r = np.asarray(to_numpy(ref, "ref")[0], dtype=np.float64)
    w = np.asarray(to_numpy(v, "v")[0], dtype=np.float64)
    if o.shape != r.shape:
        raise ValueError(f"out and ref differ in shape: {o.shape} vs {r.shape}")
    if o.size == 0:
        return 0.0
    seen = np.isfinite(r).all(axis=-1)
    if not seen.any():
        return 0.0
    with np.errstate(invalid="ignore", over="ignore"):
        vr = np.sqrt(np.mean(w * w, axis=(-2, -1)))[..., None]
        row = np.sqrt(np.mean((o - r) ** 2, axis=-1)) / np.maximum(vr, np.finfo(float).tiny)
    row = np.broadcast_to(row, seen.shape)[seen]
    if not np.isfinite(row).all():
        return float("inf")
    return float(np.sqrt(np.mean(row * row)))


def _empty_stats(s: Scheme):
    """The statistics of a call with nothing to compute: the scheme's class, one call."""
    if s.stats is None:
        return None
    st = s.stats()
    if hasattr(st, "calls"):
        st.calls = 1
    return st


def _validate_options(s: Scheme, prob, options: dict) -> None:
    """Run ``s`` on a 1 x 1 x 1 problem with the same options (but the shape-dependent ones),
    so that an empty call rejects the option values a non-empty one would (result dropped)."""
    from .problem import Problem

    one = np.ones((1, 1, max(prob.d, 1)), dtype=prob.q.dtype)
    v1 = np.ones((1, 1, 1), dtype=prob.q.dtype)
    tiny = Problem(q=one, k=one, v=v1, scale=prob.scale, causal=False, mask=None,
                   mask_map=np.zeros(1, np.int64), lead=(1,), in_dtype=prob.in_dtype)
    s.run(tiny, False, **{k: v for k, v in options.items() if k not in s.shape_dependent})


def softmax(scores, scheme: str, axis: int = -1, *, return_stats: bool = False, **options):
    """Softmax surrogate ``scheme`` (``lp.schemes("softmax")``) along ``axis`` of ``scores``.

    Scores of ``-inf`` are masked entries (probability 0); for the integer surrogates so are
    finite scores at or below :data:`~lowprec.kernels.problem.MASK_FLOOR` (-65504: the
    ``torch.finfo(dtype).min`` padding of transformers), which would otherwise set their
    quantisation scale.  A row with no unmasked entry gives NaN.

    Args:
        scores: float array or CPU tensor, any shape.
        scheme: a name from ``lp.schemes("softmax")``.
        axis: the softmax axis.
        return_stats: also return the surrogate's statistics (``None`` for ``hif8_exp2``,
            which has no counters): e.g. I-ViT's ``sum_clamped`` says that rows were clamped
            and no longer sum to 1; ``hazards`` lists what went wrong, all zero when nothing
            did.
        **options: the surrogate's options (unknown ones raise ValueError listing them).

    Returns:
        Probabilities of the scores' shape and kind, or ``(p, stats)`` with ``return_stats``.

    Example::

        >>> p, st = lp.softmax(np.array([[0.0, 1e-4, 2e-4]]), scheme="ivit", return_stats=True)
        >>> st.hazards
    """
    s = get_scheme(scheme, kind="softmax")
    check_options(options, scheme, s.options)
    check_bool(return_stats, "return_stats")
    if s.mask_floor is not None:
        scores = _floor_scores(scores, s.mask_floor, axis)
    p, stats = s.run(scores, axis, return_stats, **options)
    if stats is not None:
        stats.nonfinite_rows = _nonfinite_softmax_rows(scores, p, axis)
    return (p, stats) if return_stats else p


def _nonfinite_softmax_rows(scores, p, axis: int) -> int:
    """Rows with an unmasked entry (finite or +inf... any entry not -inf) whose output has a
    NaN or Inf: the softmax analogue of :attr:`Stats.nonfinite_rows`."""
    from ..formats._arrays import to_numpy

    x, _ = to_numpy(scores, "scores")
    y, _ = to_numpy(p, "p")
    if x.size == 0:
        return 0
    x = np.moveaxis(np.asarray(x, dtype=np.float32), axis, -1)
    y = np.moveaxis(np.asarray(y, dtype=np.float32), axis, -1)
    seen = (x != -np.inf).any(axis=-1)
    return int(np.count_nonzero(seen & ~np.isfinite(y).all(axis=-1)))


def _floor_scores(scores, floor: float, axis: int = -1):
    """``scores`` with finite values ``<= floor`` made ``-inf`` (a copy only when one is).

    A row (along ``axis``) whose every finite score lies at or below the floor is first shifted
    by its maximum (the softmax is shift invariant), so it keeps its keys (as
    :meth:`Problem.floored <lowprec.kernels.problem.Problem.floored>` does for masks)."""
    from ..formats._arrays import to_numpy

    arr, was_torch = to_numpy(scores, "scores")
    if arr.dtype.kind != "f" or arr.dtype.itemsize < 2 or arr.size == 0:
        return scores  # bfloat16 and non-float inputs: the surrogate validates them
    if not ((arr <= floor) & np.isfinite(arr)).any():
        return scores
    top = np.max(np.where(np.isnan(arr), -np.inf, arr), axis=axis, keepdims=True)
    out, _ = floor_rows(arr, top, floor)
    if was_torch:
        import torch

        return torch.from_numpy(out)
    return out


__all__ = ["attention", "attention_error", "schemes", "softmax", "register", "get_scheme", "Scheme",
           "scheme_records", "stats_classes", "SCHEME_MODULES"]
