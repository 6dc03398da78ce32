"""Shared pytest configuration: markers `slow`, `exhaustive`, `gpu`; the Triton interpreter.

`exhaustive` and `slow` tests are deselected by default (pyproject addopts); run them with
`pytest -m exhaustive` or `pytest -m slow`.  `gpu` tests skip when no CUDA device is present.

Triton interpreter (issue 14): on a machine without a CUDA GPU this file sets
``TRITON_INTERPRET=1`` before any test module is imported.  ``triton.jit`` reads that variable
when a kernel is *decorated*, i.e. when ``lowprec.gpu``'s Triton modules are first imported,
which happens only inside tests (``import lowprec`` never imports them); from then on the GPU
kernels run in Triton's interpreter on CPU tensors (``tests/test_gpu_interpreter.py``).  With a
GPU present the variable is left alone, so the ``gpu`` tests run the compiled kernels and the
interpreter tests skip.  The ahead-of-time PTX check (``tests/test_gpu_ptx.py``) runs in a
subprocess without the variable.
"""

import os

import pytest


def _has_gpu() -> bool:
    if not os.path.exists("/dev/nvidiactl"):  # no NVIDIA driver: no need to import torch
        return False
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # torch missing or broken: no GPU
        return False


HAS_GPU = _has_gpu()
if not HAS_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    if HAS_GPU:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
