"""HiF8's code map exists in three forms; they must agree (formats.md 1.1)."""

import numpy as np
from numba import njit

from lowprec.formats.hif8 import (
    HIF8_SPEC,
    HIF8_VALUES,
    _code_of_bits32,
    binade_code,
    mantissa_bits,
)


@njit
def _codes32(bits):
    out = np.empty(bits.shape[0], dtype=np.uint32)
    for i in range(bits.shape[0]):
        out[i] = _code_of_bits32(bits[i])
    return out


def test_binade_codes_equal_table_and_values():
    for e in range(-22, 16):
        c = binade_code(e)
        assert HIF8_SPEC.base_tab[e + 22] == c
        assert HIF8_VALUES[c] == np.float32(2.0**e)


def test_vectorized_code_map_equals_values_on_every_grid_point():
    # every finite positive HiF8 value, from its float32 bits, with and without junk in the
    # bits below the binade's mantissa width (the map truncates them)
    for e in range(-22, 16):
        w = mantissa_bits(e)
        for f in range(1 if e == 15 else 1 << w):  # 1.5 * 2**15 is the Inf code
            v = np.float32(2.0**e * (1 + f / (1 << w)))
            b = int(v.view(np.uint32))
            junk = (1 << (23 - w)) - 1
            got = _codes32(np.array([b, b | junk, b | (junk >> 1) + 1], dtype=np.uint32))
            want = binade_code(e) + f
            assert HIF8_VALUES[want] == v
            assert [int(g) for g in got] == [want] * 3, (e, f)


def test_code_of_bits_decodes_to_truncated_value():
    # random magnitudes in range: the code's value is the input truncated to the HiF8 grid
    rng = np.random.default_rng(1)
    x = np.exp2(rng.uniform(-22, 16, 20000)).astype(np.float32)
    x = x[x < 1.5 * 2.0**15]  # from there on the map gives the Inf code
    codes = _codes32(x.view(np.uint32))
    vals = HIF8_VALUES[codes.astype(np.int64)].astype(np.float64)
    e = np.floor(np.log2(x.astype(np.float64)))
    w = np.array([mantissa_bits(int(k)) for k in e])
    step = np.exp2(e - w)
    assert np.array_equal(vals, np.floor(x / step) * step)
