"""Triton kernels for the codecs on CUDA tensors, bit-identical to the Numba path (gpu.md).

Modules, one per family, each mirroring its CPU module function by function:
``rounding`` (``formats/rounding.py``), ``minifloat`` and ``hif8`` (the float codecs), ``mx``,
``integer``; ``codecs`` holds the device-side glue and ``ops`` the ``torch.library`` custom
operators every torch tensor goes through.  Nothing is imported here: ``import lowprec`` never
imports Triton; ``lowprec.gpu.ops`` imports torch only, and the Triton modules are imported on
the first CUDA tensor (or by the interpreter tests).
"""
