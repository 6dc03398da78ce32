"""Triton kernels for CUDA tensors, bit-identical to the Numba CPU path (specs/gpu.md).

Modules are imported only when a CUDA tensor (or the Triton interpreter) needs them; importing
:mod:`lowprec` never imports Triton.

* :mod:`lowprec.gpu.engine`: the tiled online-softmax engine of ``flash`` and every ``baps``
  configuration (the twin of :mod:`lowprec.kernels.online`).
"""
