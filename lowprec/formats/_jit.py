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


def stabilize_module(namespace: dict, module: str) -> None:
    """Apply :func:`stable_uuid` to every Numba object defined at module level."""
    for key, value in list(namespace.items()):
        if hasattr(value, "_set_uuid") and getattr(value, "__module__", module) == module:
            stable_uuid(value, f"{module}.{key}")


def jit(fn=None, *, parallel: bool = False, inline: str = "never", fastmath=False):
    """The project's Numba decorator: ``@njit(cache=True, nogil=True, ...)`` plus a fixed UUID.

    Every compiled function of lowprec is cached on disk and releases the GIL; the dispatcher
    gets the UUID ``"lowprec:<module>.<name>"`` (:func:`stable_uuid`), which keeps cache keys of
    the closure-built kernels that call it reproducible (the module docstring says why).  This
    replaces the ``stabilize_module(globals(), __name__)`` footer of the kernel modules.

    Args:
        fn: the function (``@jit``) or None (``@jit(parallel=True)``).
        parallel: Numba's ``parallel=True`` (``prange`` loops run on threads).
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
        disp = njit(cache=True, nogil=True, parallel=parallel, inline=inline,
                    fastmath=fastmath)(f)
        return stable_uuid(disp, f"{f.__module__}.{f.__name__}")

    return wrap if fn is None else wrap(fn)
