"""Deterministic identities for Numba objects, so that closure-built kernels hit the disk cache.

Numba keys a cached function on its bytecode and the pickled contents of its closure.  Our
kernels are closures (format constants are baked in), and pickling reaches the Numba dispatchers
and intrinsics they call; each of those pickles with a UUID that Numba draws at random per
process.  The key then changes every run and the cache never hits (every fresh process
recompiled, ~2 s per first call).  Giving those objects fixed UUIDs, derived from their module
and name (or from the kernel's parameters), makes the key reproducible.
"""

from __future__ import annotations


def stable_uuid(obj, name: str):
    """Give a Numba dispatcher/intrinsic the fixed UUID ``"lowprec:" + name`` (idempotent).

    Returns ``obj``.
    """
    set_uuid = getattr(obj, "_set_uuid", None)
    if set_uuid is None:
        return obj
    want = "lowprec:" + name
    current = getattr(obj, "_MemoMixin__uuid", None)
    if current is None:
        set_uuid(want)
    return obj


def jit(fn=None, *, parallel: bool = False, inline: str = "never", fastmath=False):
    """The project's Numba decorator: ``@njit(cache=True, nogil=True, ...)`` plus a fixed UUID.

    Every compiled function of lowprec is cached on disk and releases the GIL; the dispatcher
    gets the UUID ``"lowprec:<module>.<name>"`` (:func:`stable_uuid`), which keeps cache keys of
    the closure-built kernels that call it reproducible (the module docstring says why).  Numba
    objects made otherwise (intrinsics, closures) call :func:`stable_uuid` themselves.

    Args:
        fn: the function (``@jit``) or None (``@jit(parallel=True)``).
        parallel: Numba's ``parallel=True`` (``prange`` loops run on threads); the serial
            compilation of the same function is then ``.serial`` (``prange`` runs as ``range``),
            for inputs too small to pay for waking the threads (:func:`for_size`).
        inline: Numba's ``inline`` (``"always"`` for tiny scalar helpers).
        fastmath: Numba's ``fastmath`` (False, True or a set of LLVM flags).

    Returns:
        The Numba dispatcher (or a decorator, when ``fn`` is None).

    Example::

        >>> @jit
        ... def twice(x):
        ...     return 2 * x
    """
    from numba import njit

    def wrap(f):
        name = f"{f.__module__}.{f.__name__}"
        disp = njit(cache=True, nogil=True, parallel=parallel, inline=inline,
                    fastmath=fastmath)(f)
        if parallel:
            disp.serial = stable_uuid(njit(cache=True, nogil=True, fastmath=fastmath,
                                           error_model="numpy")(_renamed(f, "_serial")),
                                      name + ".serial")
        return stable_uuid(disp, name)

    return wrap if fn is None else wrap(fn)


def _renamed(f, suffix: str):
    """A copy of function ``f`` whose (qual)name ends in ``suffix``: Numba names a function's
    disk cache after its qualified name and line and does not key it on ``parallel``, so the
    serial compilation needs its own name.  (The NumPy error model is what Numba's parallel
    backend uses: integer division by zero gives 0 in both compilations.)"""
    import types

    g = types.FunctionType(f.__code__, f.__globals__, f.__name__ + suffix, f.__defaults__,
                           f.__closure__)
    g.__qualname__ = f.__qualname__ + suffix
    g.__module__ = f.__module__
    g.__doc__ = f.__doc__
    return g


PARALLEL_MIN = 1 << 17  # elements below which a parallel kernel runs its serial compilation


def start_threads_passive() -> str | None:
    """Start Numba's thread pool now, its OpenMP runtime reading ``OMP_WAIT_POLICY=PASSIVE``
    (unless the environment sets a policy); the environment is restored afterwards.  Called
    once when lowprec is imported; returns the threading layer's name (None if it failed).

    By default GNU OpenMP workers spin for a while after each parallel region, waiting for
    the next one; the schemes alternate parallel row kernels with NumPy work, so on a busy
    machine (2 cores, one other busy process) the spinning workers took the core the caller
    needed: ``intattention``, ``ivit`` and ``quant_only`` at (1, 12, 197, 64) ran up to 10x
    slower than with the passive policy, which makes idle workers sleep at once (and costs
    nothing measurable on an idle machine, see docs/design.md).  libgomp reads the variable
    once, when it is loaded, so it is set only for that moment: the process environment,
    subprocesses and torch's own OpenMP runtime (a separate copy) are left as they were.  A
    runtime already loaded by another library keeps its settings.
    """
    import os

    key = "OMP_WAIT_POLICY"
    had = os.environ.get(key)
    try:
        if had is None:
            os.environ[key] = "PASSIVE"
        import numba
        from numba.np.ufunc import parallel

        parallel._launch_threads()
        return numba.threading_layer()
    except Exception:  # pragma: no cover - a Numba without a threading layer: serial kernels
        return None
    finally:
        if had is None:
            os.environ.pop(key, None)


THREADING_LAYER = start_threads_passive()


def for_size(kernel, n: int):
    """``kernel`` (a ``@jit(parallel=True)`` dispatcher) for work of ``n`` elements: itself, or
    its ``.serial`` compilation below :data:`PARALLEL_MIN` elements (waking the threads costs
    more than small inputs save, and far more on a busy machine)."""
    return kernel if n >= PARALLEL_MIN else kernel.serial
