"""Input/output plumbing shared by every codec: numpy and CPU torch inputs, dtype checks, the
flat contiguous views the kernels take, and ``out=`` validation (the codecs send torch tensors
to ``_torch_route`` first; the attention kernels use :func:`to_numpy` directly)."""

from __future__ import annotations

import sys

import ml_dtypes
import numpy as np
from numba import prange

from ._jit import jit

BF16 = np.dtype(ml_dtypes.bfloat16)
FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.float16), BF16)
_ALLOWED = "float32, float64, float16, bfloat16"
PARALLEL_MIN = 1 << 17


def _torch():
    return sys.modules.get("torch")


def is_torch(x) -> bool:
    """True if ``x`` is a torch.Tensor (without importing torch)."""
    t = _torch()
    return t is not None and isinstance(x, t.Tensor)


def to_numpy(x, what: str = "x"):
    """Return ``(array, was_torch)`` for a numpy array, a CPU torch tensor or an array-like.

    Torch tensors are detached (codecs are not differentiable) and must be on the CPU;
    bfloat16 tensors become ml_dtypes.bfloat16 arrays without a copy of the values' meaning.
    """
    if is_torch(x):
        torch = _torch()
        if x.device.type != "cpu":
            raise ValueError(
                f"{what} is a torch tensor on {x.device}; this function runs on the CPU "
                f"(the codecs and the attention schemes flash and baps take CUDA tensors, "
                f"this function does not): pass "
                f"{what}.cpu()"
            )
        t = x.detach()
        if t.dtype == torch.bfloat16:
            return t.contiguous().view(torch.int16).numpy().view(BF16), True
        if t.is_complex() or t.dtype == torch.bool:
            raise TypeError(f"{what} has dtype {t.dtype}; allowed: {_ALLOWED}")
        return t.contiguous().numpy(), True
    if isinstance(x, np.ndarray):
        return x, False
    if isinstance(x, (list, tuple, float, int, np.generic)):
        return np.asarray(x), False
    raise TypeError(
        f"{what} must be a numpy array or a CPU torch tensor, got {type(x).__name__}"
    )


def check_float(arr: np.ndarray, what: str = "x") -> np.ndarray:
    """Return ``arr`` in native byte order, or raise TypeError unless its dtype is one of the
    supported float types (byte-swapped float arrays, e.g. ``'>f4'`` from file data, are
    converted, never read as raw bits)."""
    if arr.dtype.kind == "f" and not arr.dtype.isnative:
        arr = arr.astype(arr.dtype.newbyteorder("="))
    if arr.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{what} has dtype {arr.dtype}; allowed: {_ALLOWED}")
    return arr


def float_bits(arr: np.ndarray) -> np.ndarray:
    """Flat contiguous uint32 (float32, float16, bfloat16 -- the 16-bit types are widened to
    float32 exactly) or uint64 (float64) bit view of ``arr`` in C order."""
    if arr.dtype == np.float64:
        return np.ascontiguousarray(arr).reshape(-1).view(np.uint64)
    if arr.dtype != np.float32:
        arr = arr.astype(np.float32)  # exact for float16 and bfloat16
    return np.ascontiguousarray(arr).reshape(-1).view(np.uint32)


def into_out(y, out):
    """``y`` (a float32 result, numpy or CPU torch) itself when ``out`` is None, else ``y``
    copied into ``out`` (validated by :func:`make_out`) and ``out`` returned: the ``out=`` of
    the block formats' fake-quantization."""
    if out is None:
        return y
    arr = y.numpy() if is_torch(y) else y
    np.copyto(make_out(out, arr.shape, np.float32), arr)
    return out


def make_out(out, shape, dtype, what="out") -> np.ndarray:
    """Allocate, or validate a caller-provided, C-contiguous numpy ``out`` array."""
    if out is None:
        return np.empty(shape, dtype=dtype)
    if is_torch(out):
        o = out.numpy() if out.device.type == "cpu" else None
        if o is None:
            raise ValueError(f"{what} must be a CPU tensor")
        out = o
    if not isinstance(out, np.ndarray):
        raise TypeError(f"{what} must be a numpy array, got {type(out).__name__}")
    if out.dtype != np.dtype(dtype) or out.shape != tuple(shape):
        raise ValueError(
            f"{what} must have dtype {np.dtype(dtype)} and shape {tuple(shape)}, "
            f"got {out.dtype} {out.shape}"
        )
    if not out.flags.c_contiguous or not out.flags.writeable:
        raise ValueError(f"{what} must be C-contiguous and writeable")
    return out


def overlaps(src: np.ndarray, dst: np.ndarray) -> bool:
    """True if an element-wise kernel reading ``src`` and writing ``dst`` could read a value it
    already overwrote: the two share memory and are not the very same elements (an ``out=``
    that *is* the input, same start, item size and strides, is safe in place)."""
    if not np.may_share_memory(src, dst):
        return False
    same = (src.__array_interface__["data"][0] == dst.__array_interface__["data"][0]
            and src.itemsize == dst.itemsize and src.shape == dst.shape
            and src.strides == dst.strides)
    return not same


def scratch_if_overlap(out: np.ndarray, *inputs: np.ndarray) -> np.ndarray:
    """``out`` itself, or a fresh array like it when it overlaps one of ``inputs`` (issue 12:
    ``quantize(buf[:-1], out=buf[1:])``); the caller copies the scratch into ``out`` after."""
    if any(overlaps(x, out) for x in inputs):
        return np.empty_like(out)
    return out


def wrap(result: np.ndarray, as_torch: bool):
    """Return ``result`` as a torch tensor when the input was one (sharing memory)."""
    if not as_torch:
        return result
    torch = _torch()
    return torch.from_numpy(result)


def codes_array(codes, what="codes") -> tuple[np.ndarray, bool]:
    """Validate an array of 8-bit codes (uint8, or int8 for the int8 format)."""
    arr, was_torch = to_numpy(codes, what)
    if arr.dtype not in (np.dtype(np.uint8), np.dtype(np.int8), np.dtype(np.uint16)):
        raise TypeError(f"{what} must have dtype uint8 (int8 for the int8 format, uint16 for "
                        f"16-bit formats), got {arr.dtype}")
    return arr, was_torch


@jit
def _lookup_serial(codes, table, out):
    for i in range(codes.shape[0]):
        out[i] = table[codes[i]]


@jit(parallel=True)
def _lookup_parallel(codes, table, out):
    for i in prange(codes.shape[0]):
        out[i] = table[codes[i]]


_FULL_TABLES: dict = {}


def full_table(table: np.ndarray, storage_bits: int = 8) -> np.ndarray:
    """``table`` (float32) extended with NaN to all ``2**storage_bits`` values of the codes'
    storage dtype, so that a Numba kernel indexing it with any uint8 (uint16) code stays in
    bounds (Numba does not check bounds).  Tables of sub-byte formats (16 or 64 entries, or
    ``2**bits`` of a 9-15 bit user format) are the ones extended; the callers check the codes
    first (:func:`check_codes`), so the NaN entries are never read through the public API.
    Built once per table (the tables are module or format constants)."""
    n = 1 << storage_bits
    if table.shape[0] >= n:
        return table
    key = (id(table), n)
    hit = _FULL_TABLES.get(key)
    if hit is None:
        full = np.full(n, np.nan, np.float32)
        full[: table.shape[0]] = table
        full.setflags(write=False)
        hit = _FULL_TABLES[key] = (full, table)  # keep table alive so that its id stays unique
    return hit[0]


def lookup(codes: np.ndarray, table: np.ndarray, out: np.ndarray) -> None:
    """``out.flat[i] = table[codes.flat[i]]`` for uint8 (int8 read as uint8) or uint16 codes;
    a table shorter than the codes' range (sub-byte formats) gives NaN beyond its end
    (:func:`full_table`: memory-safe whatever the codes)."""
    c = np.ascontiguousarray(codes).reshape(-1)
    if c.dtype != np.uint16:
        c = c.view(np.uint8)
    o = out.reshape(-1)
    t = full_table(table, 8 * c.dtype.itemsize)
    (_lookup_parallel if c.shape[0] >= PARALLEL_MIN else _lookup_serial)(c, t, o)


def code_range(f) -> tuple[int, int] | None:
    """``(lo, hi)``: the smallest and largest code of the format ``f`` when its codes are
    narrower than the integers that hold them -- 4- and 6-bit codes stored one per byte
    (``0 .. 2**bits - 1``; int4: ``-8 .. 7`` as int8), 9-15 bit user formats in uint16 -- or
    None when every value of the storage dtype is a code (8- and 16-bit formats)."""
    bits = f.info.bits
    if bits in (8, 16):
        return None
    if f.info.kind == "int" and f.info.qmin < 0:  # int4: two's complement, int8 storage
        return -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    return 0, (1 << bits) - 1


def check_codes(codes, f) -> None:
    """Raise ValueError if an element of ``codes`` (a numpy array or a torch tensor on any
    device, already of the format's code dtype) is not a code of the format ``f``
    (:func:`code_range`); nothing to check for 8- and 16-bit formats.

    The same error on every device: the message names the first invalid code in flat C order
    of ``codes`` and its index.  On a CUDA tensor this costs one reduction read back on the
    host (one synchronisation; the index, on failure only, a second one).  While the current
    CUDA stream is capturing a CUDA graph nothing can be read back: the check is skipped, and
    the decode kernels give NaN for an invalid code (they mask their table reads and code
    ranges: memory-safe whatever the codes).
    """
    rng = code_range(f)
    if rng is None:
        return
    lo, hi = rng
    if is_torch(codes):
        torch = _torch()
        if codes.numel() == 0:
            return
        if codes.is_cuda and torch.cuda.is_current_stream_capturing():
            return
        flat = codes.reshape(-1)
        if flat.dtype == torch.uint16:  # (torch has no uint16 reductions): codes of <= 15 bits
            flat = flat.view(torch.int16)  # are the non-negative int16 <= hi
        if flat.dtype == torch.uint8:  # unsigned storage: the max alone
            ok = int(flat.max()) <= hi
        else:
            mn, mx = torch.aminmax(flat)
            cmin, cmax = torch.stack((mn, mx)).tolist()  # one read-back
            ok = lo <= cmin and cmax <= hi
        if ok:
            return
        i = int(((flat < lo) | (flat > hi)).to(torch.uint8).argmax())  # first invalid one
        v = int(flat[i]) & (0xFFFF if codes.dtype == torch.uint16 else -1)
    else:
        flat = np.asarray(codes).reshape(-1)
        if flat.size == 0 or (flat.min() >= lo and flat.max() <= hi):
            return
        i = int(np.argmax((flat < lo) | (flat > hi)))
        v = int(flat[i])
    hint = (" (codes packed two per byte need packed=True)" if f.info.bits == 4 else "")
    raise ValueError(f"{f.name} code {v} at flat index {i} is out of range: {f.name} codes "
                     f"are {f.info.bits}-bit, {lo}..{hi}{hint}")


def check_packable(bits: int) -> None:
    """ValueError unless codes of ``bits`` bits can be packed two per byte (4-bit formats)."""
    if bits > 4:
        raise ValueError(f"packed=True packs 4-bit codes two per byte; this format has {bits}-bit "
                         "codes (stored one per byte)")


def pack_codes(codes, bits: int):
    """Pack 4-bit codes two per byte along the last axis: code ``2i`` in the low nibble and code
    ``2i + 1`` in the high nibble of byte ``i`` (the layout of torchao's ``pack_uint4`` and of
    ``torch.float4_e2m1fn_x2``; ml_dtypes keeps one code per byte).  The last axis must have even
    length.  Returns a uint8 array (a tensor for tensor input) with the last axis halved.

    Raises:
        ValueError: codes wider than 4 bits, or an odd last axis.
    """
    check_packable(bits)
    if is_torch(codes):
        if codes.ndim == 0 or codes.shape[-1] % 2:
            raise ValueError(f"packed=True needs an even last axis, got shape {tuple(codes.shape)}")
        torch = _torch()
        c = codes.contiguous().view(torch.uint8) & 0x0F
        return (c[..., 0::2] | (c[..., 1::2] << 4)).contiguous()
    c = np.asarray(codes)
    if c.ndim == 0 or c.shape[-1] % 2:
        raise ValueError(f"packed=True needs an even last axis, got shape {c.shape}")
    c = c.view(np.uint8) & 0x0F  # int4: the two's complement nibble
    return np.ascontiguousarray(c[..., 0::2] | (c[..., 1::2] << 4))


def unpack_codes(packed, signed: bool = False):
    """Inverse of :func:`pack_codes`: uint8 bytes to 4-bit codes, one per byte, the last axis
    doubled (``signed``: int8 codes -8..7, the nibbles sign-extended, for int4)."""
    if is_torch(packed):
        torch = _torch()
        if packed.dtype != torch.uint8:
            raise TypeError("packed codes must have dtype uint8, got "
                            f"{str(packed.dtype).removeprefix('torch.')}")
        if packed.ndim == 0:
            raise ValueError("packed codes need at least one axis")
        p = packed.contiguous()
        c = torch.stack([p & 0x0F, p >> 4], dim=-1).reshape(*p.shape[:-1], 2 * p.shape[-1])
        return ((c ^ 8).to(torch.int8) - 8) if signed else c
    p = np.asarray(packed)
    if p.dtype != np.uint8:
        raise TypeError(f"packed codes must have dtype uint8, got {p.dtype}")
    if p.ndim == 0:
        raise ValueError("packed codes need at least one axis")
    c = np.stack([p & 0x0F, p >> 4], axis=-1).reshape(p.shape[:-1] + (2 * p.shape[-1],))
    return ((c ^ 8).astype(np.int8) - np.int8(8)) if signed else c
