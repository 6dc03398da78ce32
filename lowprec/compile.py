"""Compile lowprec's Numba kernels ahead of time, and say so when a first use compiles them.

lowprec's kernels are Numba functions compiled on first use and cached on disk (``cache=True``;
Numba writes an index ``.nbi`` and the machine code ``.nbc`` next to each module, in its
``__pycache__`` folder, or under ``NUMBA_CACHE_DIR``).  In a fresh installation, or after an
update, the first call of each scheme therefore stalls for 2-12 s (on 2 cores) while Numba
compiles; later processes load the cached code in milliseconds.

* :func:`watch_compilation` (installed by ``lowprec.<function>`` on first use, by
  :func:`lowprec.emulate` and by the ``lowprec`` command) detects a cold cache exactly and for
  free: it listens to Numba's ``"numba:compile"`` event, which Numba fires only when a kernel
  is really compiled (a disk-cache hit fires nothing).  The first compilation of a lowprec
  kernel in the process logs one INFO line through ``logging.getLogger("lowprec")``
  (:data:`NOTICE`); the ``lowprec`` command shows that logger's INFO lines on stderr.
* :func:`compile_kernels` (``lowprec compile``) fills the cache ahead of time: it runs every
  attention scheme (each variant: BAPS configurations, INT-FlashAttention full/half) and every
  softmax surrogate on small float32 inputs, without and with a causal flag, a boolean and an
  additive mask, once below and once above the size where the kernels switch to their
  parallel compilation (``PARALLEL_MIN`` elements), and every format's encode / decode /
  quantize on float32 and float64 inputs of both sizes.  Kernels other calls need (other
  rounding modes, float16 scores, ...) still compile on their first use, with the notice.
  ``lowprec study`` runs it first, with a progress bar.
"""

from __future__ import annotations

import logging
import time

import numpy as np

LOGGER = logging.getLogger("lowprec")
NOTICE = ("compiling Numba kernels ({what}): the first use of a scheme or format after "
          "installing or updating lowprec takes 2-12 s per scheme, then the code is cached on "
          "disk; `lowprec compile` (lowprec.compile.compile_kernels) compiles everything ahead "
          "of time")
#: sizes of the attention inputs (batch, heads, L, head dim): a small problem, and one whose
#: B * H * Lq * Lk = 131072 scores reach the parallel kernels (formats._jit.PARALLEL_MIN)
ATTENTION_SHAPES = ((1, 2, 24, 16), (1, 2, 256, 16))
FORMAT_SIZES = (96, 1 << 17)  # elements: serial and parallel codec kernels
MASKS = ("none", "causal", "bool", "additive")

_STATE = {"watching": False, "noticed": False, "quiet": 0, "compiled": 0}


def watch_compilation() -> None:
    """Log (once per process, INFO, logger ``"lowprec"``) when a lowprec kernel is compiled.

    Idempotent; imports Numba.  Every later compilation is counted (:func:`compiled_count`).

    Example::

        >>> import logging; logging.basicConfig(level=logging.INFO)
        >>> watch_compilation()
        >>> lp.attention(q, k, v, "qflash")   # cold cache: "compiling Numba kernels (...)"
    """
    if _STATE["watching"]:
        return
    from numba.core import event

    class _Listener(event.Listener):
        def on_start(self, ev):
            disp = (ev.data or {}).get("dispatcher")
            fn = getattr(disp, "py_func", None)
            mod = getattr(fn, "__module__", "") or ""
            if not mod.startswith("lowprec"):
                return
            _STATE["compiled"] += 1
            if not _STATE["noticed"] and not _STATE["quiet"]:
                _STATE["noticed"] = True
                LOGGER.info(NOTICE.format(what=f"first: {mod}.{fn.__name__}"))

        def on_end(self, ev):
            return None

    event.register("numba:compile", _Listener())
    _STATE["watching"] = True


def compiled_count() -> int:
    """How many lowprec kernels Numba has compiled (not loaded from its cache) in this process
    since :func:`watch_compilation` was first called."""
    return _STATE["compiled"]


def _attention_inputs(shape, mask: str, rng):
    B, H, L, d = shape
    q, k, v = (rng.standard_normal((B, H, L, d)).astype(np.float32) for _ in range(3))
    kw: dict = {}
    if mask == "causal":
        kw["causal"] = True
    elif mask in ("bool", "additive"):
        keep = rng.random((B, 1, L, L)) < 0.8
        keep[..., 0] = True
        kw["attn_mask"] = keep if mask == "bool" else np.where(keep, 0.0, -np.inf).astype(
            np.float32)
    return q, k, v, kw


def compile_tasks(schemes=None, formats=None) -> list[tuple[str, object]]:
    """The work of :func:`compile_kernels`: ``[(label, thunk)]``, one per scheme run, softmax
    surrogate and format.

    Args:
        schemes: None (every attention scheme and softmax surrogate), or attention scheme
            names / study labels (``"baps/e2e_hif8"``, :func:`lowprec.studies.main.scheme_runs`)
            and softmax scheme names; ``[]`` for none.
        formats: None (every format of :func:`lowprec.available_formats`) or format names;
            ``[]`` for none.

    Raises:
        ValueError: an unknown scheme or format (listing the valid ones).
    """
    from .formats import available_formats, get_format
    from .kernels import attention, scheme_records, softmax
    from .studies.main import scheme_runs

    soft_names = [r.name for r in scheme_records("softmax")]
    if schemes is None:
        runs, soft = scheme_runs(), soft_names
    else:
        wanted = [s.strip() for s in ([schemes] if isinstance(schemes, str) else schemes)]
        wanted = [s for w in wanted for s in w.split(",") if s.strip()]
        every = scheme_runs()
        attention_names = set(every) | {s for s, _ in every.values()}
        soft = [s for s in wanted if s in soft_names]  # hccs, exaq, ...: both kinds
        rest = [s for s in wanted if s in attention_names or s not in soft_names]
        runs = scheme_runs(rest) if rest else {}
    fmts = available_formats() if formats is None else list(formats)
    for f in fmts:
        get_format(f)  # ValueError listing the formats
    tasks: list[tuple[str, object]] = []
    for label, (scheme, opts) in runs.items():
        def run_scheme(scheme=scheme, opts=opts):
            rng = np.random.default_rng(0)
            for shape in ATTENTION_SHAPES:
                for mask in MASKS:
                    q, k, v, kw = _attention_inputs(shape, mask, rng)
                    attention(q, k, v, scheme, return_stats=True, **kw, **opts)
        tasks.append((f"attention {label}", run_scheme))
    for name in soft:
        def run_softmax(name=name):
            rng = np.random.default_rng(0)
            for n in FORMAT_SIZES:
                x = rng.standard_normal((n // 64, 64)).astype(np.float32)
                softmax(x, name)
        tasks.append((f"softmax {name}", run_softmax))
    for f in fmts:
        tasks.append((f"format {f}", lambda f=f: _run_format(f)))
    return tasks


def _run_format(name: str) -> None:
    from .formats import decode, encode, get_format, quantize

    kind = get_format(name).info.kind
    rng = np.random.default_rng(0)
    for n in FORMAT_SIZES:
        for dtype in (np.float32, np.float64):
            x = rng.standard_normal((n // 64, 64)).astype(dtype)
            kw = {"axis": -1} if kind == "mx" else {}
            decode(encode(x, name, **kw)) if kind in ("mx", "int") else \
                decode(encode(x, name), name)
            quantize(x, name, **kw)


def compile_kernels(schemes=None, formats=None, *, progress: bool = False) -> dict:
    """Compile (or load from Numba's disk cache) the kernels of the given schemes and formats
    by running each once on small inputs (see the module docstring for what is covered).

    Args:
        schemes: None for every scheme; see :func:`compile_tasks`.
        formats: None for every format; see :func:`compile_tasks`.
        progress: a tqdm progress bar on stderr (a plain line per item without tqdm).

    Returns:
        ``{"items": {label: {"seconds": s, "compiled": n} or {"error": message}},
        "compiled": kernels compiled now (0: everything came from the cache),
        "seconds": total}``.

    Raises:
        ValueError: an unknown scheme or format.

    Example:
        >>> compile_kernels(["flash"], [])["items"]["attention flash"]["seconds"] < 60
        True
    """
    watch_compilation()
    tasks = compile_tasks(schemes, formats)
    bar = _bar(len(tasks), "compiling Numba kernels", progress)
    items: dict = {}
    t_all = time.perf_counter()
    c_all = compiled_count()
    _STATE["quiet"] += 1  # the progress bar says it; no notice line
    try:
        for label, thunk in tasks:
            bar.set_postfix_str(label)
            t0, c0 = time.perf_counter(), compiled_count()
            try:
                thunk()
                items[label] = {"seconds": time.perf_counter() - t0,
                                "compiled": compiled_count() - c0}
            except (ValueError, TypeError, FloatingPointError) as e:
                items[label] = {"error": f"{type(e).__name__}: {e}"}
            bar.update()
    finally:
        _STATE["quiet"] -= 1
        bar.close()
    return {"items": items, "compiled": compiled_count() - c_all,
            "seconds": time.perf_counter() - t_all}


def cache_location() -> str:
    """Where Numba keeps lowprec's compiled kernels (``NUMBA_CACHE_DIR`` or the
    ``__pycache__`` folders of the package)."""
    import os

    from numba.core import config

    if config.CACHE_DIR:
        return str(config.CACHE_DIR)
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "*", "__pycache__")


def _bar(total: int, desc: str, enabled: bool):
    from .studies.main import _bar as bar

    return bar(total, desc, enabled)


__all__ = ["watch_compilation", "compiled_count", "compile_tasks", "compile_kernels",
           "cache_location", "LOGGER", "NOTICE"]
