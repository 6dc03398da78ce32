"""Launch plumbing shared by the GPU codecs: device guard, 64-bit scalars as two int32 halves,
chunking, block sizes, per-device constant tables.  Imports torch (the caller has a tensor)."""

from __future__ import annotations

import contextlib
import os

import numpy as np
import torch

# Compile options of every launch (gpu.md section 2): no a*b+c -> fma contraction.
LAUNCH_OPTS = {"enable_fp_fusion": False}
# Elements per launch: keeps every in-kernel index (pid * BLOCK + lane) in int32.
CHUNK = 1 << 30


def interpreting() -> bool:
    """True under ``TRITON_INTERPRET=1`` (kernels run on CPU tensors in Triton's interpreter)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def block(gpu_block: int) -> int:
    """Elements per program: ``gpu_block`` on a GPU, 64Ki in the interpreter (each program
    instance costs ~3 ms there, so fewer, larger ones; gpu.md section 4)."""
    return (1 << 16) if interpreting() else gpu_block


def device_guard(t: torch.Tensor):
    """``torch.cuda.device(t.device)`` for CUDA tensors (models split over GPUs launch on each
    tensor's own device); nothing for CPU tensors (the interpreter)."""
    return torch.cuda.device(t.device) if t.is_cuda else contextlib.nullcontext()


def halves(v: int) -> tuple[int, int]:
    """A 64-bit value (signed or unsigned int) as two signed int32 (low, high) kernel arguments,
    so that neither the argument types nor the specialisation depend on the value."""
    u = int(v) & 0xFFFFFFFFFFFFFFFF
    lo, hi = u & 0xFFFFFFFF, u >> 32
    return (lo - (1 << 32) if lo >= 1 << 31 else lo), (hi - (1 << 32) if hi >= 1 << 31 else hi)


_TABLES: dict = {}


def table(arr: np.ndarray, device: torch.device, dtype=None) -> torch.Tensor:
    """A CPU constant array (a FloatSpec table, a format's 256 values) as a tensor on
    ``device``, built once per (array, device) and kept (the arrays are module constants)."""
    key = (id(arr), str(device), str(dtype))
    t = _TABLES.get(key)
    if t is None:
        t = torch.from_numpy(np.array(arr, copy=True))  # (the tables are read-only arrays)
        if dtype is not None:
            t = t.to(dtype)
        t = host_to_device(t, device)
        _TABLES[key] = (t, arr)  # keep arr alive so that its id stays unique
        return t
    return t[0]


def host_to_device(t: torch.Tensor, device) -> torch.Tensor:
    """A CPU tensor on ``device`` without synchronising the host with the device: through
    pinned memory, non-blocking (torch's caching host allocator keeps the pinned buffer until
    the copy is done).  CPU targets (the interpreter) get the tensor itself."""
    device = torch.device(device)
    if device.type != "cuda":
        return t
    return t.pin_memory().to(device, non_blocking=True)


def chunks(n: int):
    """``(start, stop)`` ranges of at most :data:`CHUNK` elements covering ``range(n)``."""
    for s in range(0, n, CHUNK):
        yield s, min(n, s + CHUNK)
