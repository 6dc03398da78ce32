"""Slow, obviously correct twins of lowprec's fast code (stumpy's ``naive.py``, one module per
family): every fast function is tested against its twin here.

* :mod:`naive.formats` - exact references of the float formats (Python ``fractions``);
* :mod:`naive.integer` - INT8 / UINT8 quantization;
* :mod:`naive.attention` - float64 attention and the NumPy twin of the tiled engine (flash,
  BAPS), bit for bit;
* one module per integer scheme: :mod:`naive.intattention`, :mod:`naive.qflash`,
  :mod:`naive.intflash`, :mod:`naive.hccs`, :mod:`naive.baselines` (I-ViT, I-BERT), and
  :mod:`naive.exaq`.

They import nothing from ``lowprec.kernels`` except where a twin reuses a format codec.
"""
