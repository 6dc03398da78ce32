"""HiF8's code map exists in three forms; they must agree (formats.md 1.1)."""

import numpy as np
from numba import njit

from lowprec.formats.hif8 import HIF8_SPEC, HIF8_VALUES, _binade_code32, binade_code


@njit
def _code32(e):
    return _binade_code32(np.int32(e))


def test_vectorized_code_map_equals_table_and_values():
    for e in range(-22, 16):
        c = binade_code(e)
        assert int(_code32(e)) == c
        assert HIF8_SPEC.base_tab[e + 22] == c
        assert HIF8_VALUES[c] == np.float32(2.0**e)
