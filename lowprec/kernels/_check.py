"""The validation toolkit of the kernels: one checker per kind of argument.

Public functions validate their arguments with these and then call private cores that take
plain arrays and ints (the pipelines call the cores directly, never a public function that would
validate and broadcast again).  Every error names the argument, what was wrong and what is
allowed (style.md), e.g. ``ValueError("bits must be an int in [1, 8], got 9")``.
"""

from __future__ import annotations

import math

import numpy as np

from ..formats._arrays import to_numpy

_REAL = (int, float, np.integer, np.floating)
FLOAT_DTYPES = "float32, float16, bfloat16, float64"


def check_bool(value, name: str) -> bool:
    """``value`` as a bool; TypeError unless it is a Python or NumPy bool."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return bool(value)


def _range_text(lo, hi) -> str:
    if lo is not None and hi is not None:
        return f" in [{lo}, {hi}]"
    if lo is not None:
        return f" >= {lo}"
    if hi is not None:
        return f" <= {hi}"
    return ""


def check_int(value, name: str, lo: int | None = None, hi: int | None = None,
              what: str | None = None, *, type_error: bool = False) -> int:
    """``value`` as an int within ``[lo, hi]`` (either bound may be None); bools are refused.

    ValueError names the range (``what`` replaces the generic wording, e.g. ``"a positive
    int"``); with ``type_error`` a value that is not an int at all raises TypeError instead.
    """
    ok = not isinstance(value, bool) and isinstance(value, (int, np.integer))
    if type_error and not ok:
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if ok and ((lo is not None and value < lo) or (hi is not None and value > hi)):
        ok = False
    if not ok:
        desc = what or f"an int{_range_text(lo, hi)}"
        raise ValueError(f"{name} must be {desc}, got {value!r}")
    return int(value)


def check_real(value, name: str, *, positive: bool = False, lo: float | None = None,
               finite: bool = True) -> float:
    """``value`` as a finite float (TypeError for a non-number or bool; ValueError for NaN/Inf,
    a value <= 0 with ``positive``, or below ``lo``)."""
    if isinstance(value, bool) or not isinstance(value, _REAL):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    v = float(value)
    if finite and not math.isfinite(v):
        raise ValueError(f"{name} must be finite, got {value!r}")
    if positive and not v > 0:
        raise ValueError(f"{name} must be finite and > 0, got {value!r}")
    if lo is not None and not v >= lo:
        raise ValueError(f"{name} must be >= {lo}, got {value!r}")
    return v


def check_choice(value, name: str, allowed) -> str:
    """``value`` if it is one of the strings ``allowed``; ValueError lists them."""
    if not isinstance(value, str) or value not in allowed:
        raise ValueError(f"{name} {value!r} is not one of {', '.join(allowed)}")
    return value


def float_input(x, what: str, *, min_ndim: int = 0, finite: bool = False,
                why: str = "") -> np.ndarray:
    """A float array (numpy or CPU torch; float32/float16/bfloat16/float64) in native byte
    order.  TypeError for other dtypes; ValueError for fewer than ``min_ndim`` dims or, with
    ``finite``, NaN/Inf (``why`` completes the message: ``"{what} contains NaN or Inf; {why}"``).
    """
    arr, _ = to_numpy(x, what)
    if arr.dtype.kind != "f" and arr.dtype.name != "bfloat16":
        raise TypeError(f"{what} has dtype {arr.dtype}; allowed: {FLOAT_DTYPES}")
    if arr.dtype.kind == "f" and not arr.dtype.isnative:
        arr = arr.astype(arr.dtype.newbyteorder("="))
    if arr.ndim < min_ndim:
        raise ValueError(f"{what} must have shape (..., L, d), got {arr.shape}")
    if finite and arr.size and not np.isfinite(np.asarray(arr, dtype=np.float32)).all():
        raise ValueError(f"{what} contains NaN or Inf" + (f"; {why}" if why else ""))
    return arr


def int_input(x, what: str, lo: int, hi: int, *, allowed: str | None = None,
              range_name: str = "") -> np.ndarray:
    """An integer array (numpy or CPU torch) whose values lie in ``[lo, hi]``; bool refused.

    TypeError names ``allowed`` (default: integer dtypes within the range); ValueError the
    range (called ``range_name``, e.g. ``"int32"``, when given).
    """
    arr, _ = to_numpy(x, what)
    if arr.dtype == np.bool_ or arr.dtype.kind not in "iu":
        raise TypeError(f"{what} has dtype {arr.dtype}; allowed: "
                        f"{allowed or f'integer dtypes with values in [{lo}, {hi}]'}")
    if arr.size and (int(arr.min()) < lo or int(arr.max()) > hi):
        name = f"{range_name} " if range_name else ""
        raise ValueError(f"{what} has values in [{int(arr.min())}, {int(arr.max())}], "
                         f"outside {name}[{lo}, {hi}]")
    return arr


def bool_mask(mask, shape: tuple, what: str = "mask") -> np.ndarray:
    """A boolean mask (True = take part) broadcast to ``shape``, C-contiguous; TypeError for
    another dtype, ValueError when it does not broadcast."""
    arr, _ = to_numpy(mask, what)
    if arr.dtype != np.bool_:
        raise TypeError(f"{what} has dtype {arr.dtype}; allowed: bool (True = take part)")
    try:
        return np.ascontiguousarray(np.broadcast_to(arr, shape))
    except ValueError:
        raise ValueError(f"{what} of shape {arr.shape} does not broadcast to {shape}") from None


__all__ = ["check_bool", "check_int", "check_real", "check_choice", "float_input", "int_input",
           "bool_mask", "FLOAT_DTYPES"]
