"""Data files shipped with lowprec (package data, read with :mod:`importlib.resources`).

* ``sample_text.txt``: a few KB of original plain English prose written for this project and
  dedicated to the public domain (CC0); the short text of the embedding studies and examples
  (:func:`lowprec.torch.models.sample_text`).
* ``alice29.txt.xz``: Lewis Carroll, *Alice's Adventures in Wonderland* (1865; public domain),
  the Project Gutenberg "Millennium Fulcrum Edition 2.9" as the ``alice29.txt`` file of the
  Canterbury corpus, xz-compressed (about 48 KB; 152,089 bytes and about 39,000 SmolLM2 tokens
  unpacked); the long evaluation text of the perplexity and restart studies
  (:func:`lowprec.torch.models.eval_text`).  Where it comes from: ``PROVENANCE.md``.
"""
