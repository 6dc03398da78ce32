"""Format descriptors, rounding modes and the format registry.

Every format lowprec knows is described by one immutable :class:`FormatInfo` (bit width, range,
special values, rounding convention), wrapped in a :class:`Format` that also knows how to list its
256 code values. ``get_format(name)`` and ``available_formats()`` are the registry.

The codecs themselves live in ``minifloat.py`` (E4M3, E5M2), ``hif8.py``, ``mx.py`` and
``integer.py``; this module only holds what they share.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import numpy as np

__all__ = [
    "QuantizedArray",
    "FormatInfo",
    "Format",
    "Rounding",
    "get_format",
    "available_formats",
    "parse_rounding",
]


class Rounding(enum.IntEnum):
    """Rounding modes. Strings with the lower-case member name are accepted everywhere.

    ``NEAREST_EVEN``   round to nearest, ties to the even code (IEEE roundTiesToEven)
    ``NEAREST_AWAY``   round to nearest, ties away from zero (HiF8 "TA")
    ``TOWARD_ZERO``    truncate the magnitude
    ``UP``             toward +infinity
    ``DOWN``           toward -infinity
    ``STOCHASTIC``     round up with probability equal to the discarded fraction, truncated to
                       ``sr_bits`` bits; random bits come from a counter-based hash of
                       ``(seed, flat index)``
    ``HYBRID``         HiF8 only, provisional (formats.md 1.6)

    The integer values are the codes the Numba kernels use.
    """

    NEAREST_EVEN = 0
    NEAREST_AWAY = 1
    TOWARD_ZERO = 2
    UP = 3
    DOWN = 4
    STOCHASTIC = 5
    HYBRID = 6


_ROUNDING_NAMES = ", ".join(r.name.lower() for r in Rounding)


def parse_rounding(rounding: str | Rounding, fmt: str | None = None) -> Rounding:
    """Turn a string or :class:`Rounding` into a :class:`Rounding`, with a clear error.

    ``hybrid`` is accepted only for ``fmt == "hif8"``.
    """
    if isinstance(rounding, Rounding):
        r = rounding
    elif isinstance(rounding, str):
        try:
            r = Rounding[rounding.strip().upper()]
        except KeyError:
            raise ValueError(
                f"rounding {rounding!r} is not one of {_ROUNDING_NAMES}"
            ) from None
    else:
        raise TypeError(
            f"rounding must be a string or lowprec.Rounding, got {type(rounding).__name__}"
        )
    if r == Rounding.HYBRID and fmt is not None and fmt != "hif8":
        raise ValueError(
            f"rounding 'hybrid' exists only for hif8, not {fmt!r}; use one of "
            "nearest_even, nearest_away, toward_zero, up, down, stochastic"
        )
    return r


@dataclass(frozen=True)
class FormatInfo:
    """Everything about one number format.

    Attributes:
        name: registry name (``"hif8"``, ``"e4m3"``, ...).
        bits: width of one code.
        kind: ``"float"`` (self-contained 8-bit float), ``"mx"`` (block-scaled float elements)
            or ``"int"`` (affine integer with scales).
        max: largest finite value of one code (for ``mx``/``int``: of an unscaled element).
        min_normal: smallest positive normal value (0.0 for integers: not applicable).
        min_subnormal: smallest positive value (1.0 for integers).
        has_inf, has_nan, has_neg_zero: special values present in the code space.
        nan_codes: every code that decodes to NaN.
        inf_codes: ``(+inf code, -inf code)`` or ``()``.
        nan_code: the NaN code the encoder writes for a positive NaN.
        max_code: code of ``+max``.
        default_rounding: the format's own convention.
        scaled: True for formats whose codes need scales (``mx``, ``int``).
        element: for ``mx``: the element format name.
        block_size: for ``mx``: the default block size.
        qmin, qmax: for ``int``: the code range of the default (symmetric) mode.
        doc: one-line description with the spec section.
    """

    name: str
    bits: int
    kind: str
    max: float
    min_normal: float
    min_subnormal: float
    has_inf: bool
    has_nan: bool
    has_neg_zero: bool
    nan_codes: tuple[int, ...]
    inf_codes: tuple[int, ...]
    nan_code: int | None
    max_code: int
    default_rounding: Rounding
    scaled: bool = False
    element: str | None = None
    block_size: int | None = None
    qmin: int | None = None
    qmax: int | None = None
    doc: str = ""
    extra: dict = field(default_factory=dict, compare=False, hash=False, repr=False)


class Format:
    """An immutable handle on a registered format: ``info`` plus its code table.

    Example:
        >>> f = get_format("e4m3")
        >>> f.info.max
        448.0
        >>> f.values()[0x38]
        np.float32(1.0)
    """

    __slots__ = ("info", "_values", "spec")

    def __init__(self, info: FormatInfo, values: np.ndarray, spec=None):
        self.info = info
        self.spec = spec  # float formats: the kernel constants (minifloat.FloatSpec / Pow2Spec)
        v = np.asarray(values, dtype=np.float32).copy()
        v.setflags(write=False)
        self._values = v

    @property
    def name(self) -> str:
        """The registry name of the format."""
        return self.info.name

    def values(self) -> np.ndarray:
        """Float32 value of each of the ``2**bits`` codes, indexed by code (NaN where NaN).
        (8-bit scaled formats with sub-byte elements list the ``2**element_bits`` codes.)

        For ``mx`` formats these are the unscaled element values; for ``int`` formats the integer
        value of each code (int8 codes are two's complement: code 0xFF is -1).
        The returned array is read-only.
        """
        return self._values

    def __repr__(self) -> str:
        return f"Format({self.info.name!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Format) and other.info.name == self.info.name

    def __hash__(self) -> int:
        return hash(self.info.name)


_REGISTRY: dict[str, Format] = {}
# the element formats of issue 17 (one FloatDesc literal each in minifloat.py)
_FLOATS_II = ["e2m1", "e2m3", "e3m2", "e8m0", "e4m3fnuz", "e5m2fnuz", "e4m3_ieee", "e3m4",
              *(f"binary8p{p}" for p in range(1, 8)), "bfloat16", "float16"]
_MX_II = ["mxfp4", "mxfp6_e2m3", "mxfp6_e3m2", "mxint8", "nvfp4"]
_INT_II = ["int4", "uint4"]
_ORDER = ["hif8", "e4m3", "e5m2", "mxfp8_e4m3", "mxfp8_e5m2", "int8", "uint8", *_FLOATS_II,
          *_MX_II, *_INT_II]
_USER: list[str] = []  # formats made by lowprec.float_format, in creation order
_ALIASES = {
    "hifloat8": "hif8",
    "float8_e4m3fn": "e4m3",
    "e4m3fn": "e4m3",
    "float8_e5m2": "e5m2",
    "mxfp8": "mxfp8_e4m3",
    "float4_e2m1fn": "e2m1", "fp4": "e2m1", "float6_e2m3fn": "e2m3", "float6_e3m2fn": "e3m2",
    "float8_e8m0fnu": "e8m0", "float8_e4m3fnuz": "e4m3fnuz", "float8_e5m2fnuz": "e5m2fnuz",
    "float8_e4m3": "e4m3_ieee", "float8_e3m4": "e3m4", "bf16": "bfloat16", "fp16": "float16",
    "half": "float16", **{f"p3109_k8p{p}se": f"binary8p{p}" for p in range(1, 8)},
    "mxfp6": "mxfp6_e2m3",
}


def _register(fmt: Format) -> None:
    _REGISTRY[fmt.info.name] = fmt


# the family module that registers each format (imported on first use of one of its formats)
_FAMILY = {"nvfp4": "nvfp4", "hif8": "hif8", "e4m3": "minifloat", "e5m2": "minifloat",
           "mxfp8_e4m3": "mx",
           "mxfp8_e5m2": "mx", "int8": "integer", "uint8": "integer",
           **{n: "minifloat" for n in _FLOATS_II}, **{n: "mx" for n in _MX_II if n != "nvfp4"},
           **{n: "integer" for n in _INT_II}}


def _ensure_registry() -> None:
    # Import every family for the side effect of registration (each module registers its
    # formats on import).  Not conditional on an empty registry: importing one family module
    # directly (e.g. minifloat) must not hide the others.
    if any(n not in _REGISTRY for n in _ORDER):
        from . import hif8, integer, minifloat, mx, nvfp4  # noqa: F401


def _ensure_family(key: str) -> None:
    # Import only the family of one format: a first ``encode(x, "e4m3")`` then does not pay
    # for importing the MX and integer codecs.
    # (import statements, not importlib: TorchDynamo runs these while tracing a first call
    # inside torch.compile, but cannot trace importlib.import_module)
    if key not in _REGISTRY:
        family = _FAMILY[key]
        if family == "hif8":
            from . import hif8  # noqa: F401
        elif family == "minifloat":
            from . import minifloat  # noqa: F401
        elif family == "mx":
            from . import mx  # noqa: F401
        elif family == "nvfp4":
            from . import nvfp4  # noqa: F401
        else:
            from . import integer  # noqa: F401


def available_formats() -> list[str]:
    """Names of every registered format, in a stable order.

    The seven formats of the design come first, then those of issue 17 ("Formats II"), then
    the formats made by :func:`lowprec.float_format`, in creation order.

    Example:
        >>> available_formats()[:7]
        ['hif8', 'e4m3', 'e5m2', 'mxfp8_e4m3', 'mxfp8_e5m2', 'int8', 'uint8']
    """
    _ensure_registry()
    return [n for n in _ORDER if n in _REGISTRY] + list(_USER)


def get_format(name: str | Format) -> Format:
    """Look up a format by name (aliases such as ``float8_e4m3fn`` are accepted).

    Raises:
        ValueError: unknown name; the message lists the available formats.
        TypeError: ``name`` is not a string.
    """
    if isinstance(name, Format):
        return name
    if not isinstance(name, str):
        raise TypeError(f"format name must be a string, got {type(name).__name__}")
    key = name.strip().lower()
    key = _ALIASES.get(key, key)
    if key in _FAMILY:
        _ensure_family(key)
    try:
        return _REGISTRY[key]
    except KeyError:
        raise ValueError(
            f"format {name!r} is not one of {', '.join(available_formats())}"
        ) from None


@dataclass(frozen=True, eq=False)
class QuantizedArray:
    """Codes of a scaled format together with the scales needed to decode them.

    Returned by :func:`lowprec.encode` for ``mxfp8_*``, ``int8`` and ``uint8``; accepted by
    :func:`lowprec.decode`.

    Attributes:
        codes: uint8 codes (int8 for ``int8``), same shape as the input.
        scales: MX: uint8 E8M0 scale codes, shape of the input with ``axis`` replaced by the
            number of blocks. INT: float32 scales broadcastable against ``codes``.
        format: the format name.
        axis: the blocked/channel axis (normalised to be non-negative), or None (per tensor).
        block_size: MX and INT ``per_block``: elements per block along ``axis``; else None.
        zero_points: INT asymmetric: int32 zero points shaped like ``scales``; else None.
        granularity: INT: ``per_tensor``, ``per_channel``, ``per_token`` or ``per_block``.
        tensor_scale: NVFP4: the float32 per-tensor scale (1.0 single level), a float, or for a
            CUDA tensor encoded with ``tensor_scale="amax"`` a 0-dim float32 tensor on its
            device; else None.
        packed: ``codes`` hold two 4-bit codes per byte (``encode(..., packed=True)``).
    """

    codes: np.ndarray
    scales: np.ndarray
    format: str
    axis: int | None = None
    block_size: int | None = None
    zero_points: np.ndarray | None = None
    granularity: str | None = None
    tensor_scale: float | None = None
    packed: bool = False

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape of the encoded tensor."""
        return tuple(self.codes.shape)
