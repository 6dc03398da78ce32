"""Shared pytest configuration: markers `slow`, `exhaustive`, `gpu`, `multigpu`; the Triton
interpreter.

`exhaustive` and `slow` tests are deselected by default (pyproject addopts); run them with
`pytest -m exhaustive` or `pytest -m slow`.  `gpu` tests skip when no CUDA device is present,
`multigpu` tests when fewer than two are (`torch.cuda.device_count() < 2`).

Triton interpreter (issue 14): on a machine without a CUDA GPU this file sets
``TRITON_INTERPRET=1`` before any test module is imported.  ``triton.jit`` reads that variable
when a kernel is *decorated*, i.e. when ``lowprec.gpu``'s Triton modules are first imported
(``import lowprec`` alone never imports them, but a test module that imports every lowprec
submodule does, possibly at collection time); from then on the GPU
kernels run in Triton's interpreter on CPU tensors (``tests/test_gpu_interpreter.py``,
``tests/test_gpu_engine.py``).  With a
GPU present the variable is left alone, so the ``gpu`` tests run the compiled kernels and the
interpreter tests skip.  The ahead-of-time PTX check (``tests/test_gpu_ptx.py``) runs in a
subprocess without the variable.
"""

import os

import pytest


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # torch missing or broken: no GPU
        return False


HAS_CUDA = _has_cuda()
if not HAS_CUDA:
    # Triton kernels run in Triton's interpreter on a CPU-only machine.  Set before any test
    # module imports lowprec (a module importing every lowprec submodule would otherwise build
    # the GPU kernels as compiled functions, which the interpreter cannot call).
    os.environ.setdefault("TRITON_INTERPRET", "1")


def _cuda_devices() -> int:
    if not HAS_CUDA:
        return 0
    import torch

    return torch.cuda.device_count()


def pytest_collection_modifyitems(config, items):
    n = _cuda_devices()
    for item in items:
        if "gpu" in item.keywords and n < 1:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))
        elif "multigpu" in item.keywords and n < 2:
            item.add_marker(pytest.mark.skip(reason=f"needs two CUDA GPUs ({n} present)"))


@pytest.fixture
def cpu_only_scheme():
    """The name of a scheme without a device path, registered for the test and removed after
    it: ``intflash``'s CPU pipeline under the name ``"cpu_only_test"`` (every registered
    scheme has a device path, so the CPU fallback of CUDA tensors needs one made up)."""
    import dataclasses

    from lowprec.kernels import _REGISTRY, get_scheme, register

    name = "cpu_only_test"
    register(dataclasses.replace(get_scheme("intflash"), name=name, device=None, engine=None))
    try:
        yield name
    finally:
        _REGISTRY.pop(("attention", name), None)


# --------------------------------------------------------------------------------------------
# Shared helpers of the test modules (``from conftest import rand_qkv, same_bits, sqnr_db``).
# The slow, obviously correct twins live in tests/naive/.


def rand_qkv(B, Lq, Lk, d, dv, seed=0, amp=1.0, dtype=None):
    """Standard-normal q, k (times ``amp``) and v of shapes ``(B, Lq, d)``, ``(B, Lk, d)``,
    ``(B, Lk, dv)`` (float32 unless ``dtype``)."""
    import numpy as np

    dtype = np.float32 if dtype is None else dtype
    rng = np.random.default_rng(seed)
    q = (rng.standard_normal((B, Lq, d)) * amp).astype(dtype)
    k = (rng.standard_normal((B, Lk, d)) * amp).astype(dtype)
    v = rng.standard_normal((B, Lk, dv)).astype(dtype)
    return q, k, v


def bits(a):
    """The raw bits of a 2-, 4- or 8-byte array (NaN payloads and signs included)."""
    import numpy as np

    a = np.ascontiguousarray(a)
    return a.view({4: np.uint32, 8: np.uint64, 2: np.uint16}[a.dtype.itemsize])


def same_bits(a, b, *, dtype: bool = True) -> bool:
    """Same shape and bit patterns (and dtype, unless ``dtype=False`` compares as float32)."""
    import numpy as np

    if not dtype:
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return a.shape == b.shape and a.dtype == b.dtype and bool(np.array_equal(bits(a), bits(b)))


def sqnr_db(out, ref) -> float:
    """``10 log10(sum ref**2 / sum (out - ref)**2)`` in float64."""
    import math

    import numpy as np

    out = np.asarray(out, np.float64)
    return 10 * math.log10((ref**2).sum() / ((out - ref) ** 2).sum())


def rel_err(out, want) -> float:
    """Relative L2 error of ``out`` against ``want`` (float64)."""
    import numpy as np

    out = np.asarray(out, dtype=np.float64)
    return float(np.linalg.norm(out - want) / np.linalg.norm(want))


def structured_qkv(rng, B, L, d, spread=3.0):
    """Peaky attention inputs: score std about ``spread`` plus an attention sink at key 0."""
    import math

    import numpy as np

    q = rng.standard_normal((B, L, d))
    k = rng.standard_normal((B, L, d))
    k[:, 0] += 2.0 * q.mean(axis=1)  # sink
    q *= math.sqrt(spread)
    k *= math.sqrt(spread)
    v = rng.standard_normal((B, L, d))
    return q.astype(np.float32), k.astype(np.float32), v.astype(np.float32)


def normal_qkv(rng, B, Lq, Lk, d, dv=None, amp=1.0):
    """Standard-normal q, k (times ``amp``) and v from ``rng``: ``(B, Lq, d)``, ``(B, Lk, d)``,
    ``(B, Lk, dv)`` float32 (``dv`` defaults to ``d``)."""
    import numpy as np

    dv = d if dv is None else dv
    q = (rng.standard_normal((B, Lq, d)) * amp).astype(np.float32)
    k = (rng.standard_normal((B, Lk, d)) * amp).astype(np.float32)
    v = rng.standard_normal((B, Lk, dv)).astype(np.float32)
    return q, k, v


def gpu_engine():
    """``(engine module, interpreted, device)`` for the tests of the Triton attention engine:
    on a machine without CUDA the engine runs in Triton's interpreter (``TRITON_INTERPRET=1``
    is set above, before any import) on CPU tensors; skips the calling module when triton is
    missing or the engine was built compiled without a GPU (imported before the variable)."""
    import pytest
    import triton

    from lowprec.gpu import engine

    interpreted = not isinstance(engine._engine, triton.runtime.jit.JITFunction)
    if not HAS_CUDA and not interpreted:
        pytest.skip("lowprec.gpu.engine was imported before TRITON_INTERPRET=1 was set and "
                    "there is no GPU: run this module in a fresh process",
                    allow_module_level=True)
    return engine, interpreted, "cpu" if interpreted else "cuda"
