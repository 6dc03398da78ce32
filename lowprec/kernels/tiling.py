"""Deprecated alias of :mod:`lowprec.kernels.problem`, the module's name since issue 13 (it held
no tile loop: it defines the attention problem, its masks and its visibility).  Kept because
code outside the kernels imports it (``from lowprec.kernels.tiling import prepare``)."""

from .problem import *  # noqa: F403
from .problem import __all__  # noqa: F401
