"""Shared pytest configuration: markers `slow`, `exhaustive`, `gpu`.

`exhaustive` and `slow` tests are deselected by default (pyproject addopts); run them with
`pytest -m exhaustive` or `pytest -m slow`.  `gpu` tests skip when no CUDA device is present.
"""

import pytest


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except Exception:  # torch missing or broken: no GPU
        has_gpu = False
    if has_gpu:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
