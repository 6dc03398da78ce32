"""Data files shipped with lowprec (package data, read with :mod:`importlib.resources`).

* ``sample_text.txt``: a few KB of original plain English prose written for this project and
  dedicated to the public domain (CC0); the evaluation text of the model studies
  (:func:`lowprec.torch.models.sample_text`).
"""
