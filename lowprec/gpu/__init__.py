"""Triton kernels for CUDA tensors, bit-identical to the Numba CPU path (specs/gpu.md).

Modules are imported only when a CUDA tensor (or the Triton interpreter) needs them; importing
:mod:`lowprec` never imports Triton (``ops`` imports torch only, and only for torch input).

* :mod:`lowprec.gpu.engine`: the tiled online-softmax engine of ``flash`` and every ``baps``
  configuration (the twin of :mod:`lowprec.kernels.online`).
* the codecs, one module per family, each mirroring its CPU module function by function:
  :mod:`~lowprec.gpu.rounding` (``formats/rounding.py``), :mod:`~lowprec.gpu.minifloat` and
  :mod:`~lowprec.gpu.hif8` (the float codecs), :mod:`~lowprec.gpu.mx`,
  :mod:`~lowprec.gpu.integer`, :mod:`~lowprec.gpu.nvfp4` (torch steps around the float codecs);
  :mod:`~lowprec.gpu.codecs` is the device-side glue and
  :mod:`~lowprec.gpu.ops` the ``torch.library`` custom operators every torch tensor goes
  through (docs/design.md "GPU codecs").
"""
