"""Triton twin of :func:`lowprec.formats._arrays.float_bits`: the float32 bits of an input
element, float16/bfloat16 widened exactly with integer operations.

Kernels take 16-bit inputs as their raw ``int16`` bits (a view, no copy) rather than casting in
the kernel: Triton's interpreter converts bfloat16 subnormals wrongly, and bit operations are
the same on both devices (gpu.md section 2).
"""

from __future__ import annotations

import triton
import triton.language as tl

# input kinds (a kernel's IN_KIND constexpr); float16 and bfloat16 share one compiled kernel
# and are told apart by a run-time flag (fewer variants to compile, a few operations per element)
IN_F32 = 0
IN_F64 = 1
IN_16 = 2


@triton.jit
def float_bits32(x, IN_KIND: tl.constexpr, bf16):
    """uint32 float32 bits of ``x``: float32 values, or the int16 bits of bfloat16
    (``bf16 != 0``) or float16."""
    if IN_KIND == 0:
        r = x.to(tl.uint32, bitcast=True)
    else:
        h = x.to(tl.uint16, bitcast=True).to(tl.uint32)
        e = (h >> 10) & 0x1F
        m = h & 0x3FF
        normal = ((e + (127 - 15)) << 23) | (m << 13)
        # subnormal: m * 2**-24, exact (a small integer times a power of two, a normal float32)
        sub = (m.to(tl.int32).to(tl.float32) * 5.9604644775390625e-08).to(tl.uint32,
                                                                            bitcast=True)
        r = tl.where(e == 0, sub, normal)
        r = tl.where(e == 0x1F, 0x7F800000 | (m << 13), r)
        r = r | ((h & 0x8000) << 16)
        r = tl.where(bf16 != 0, h << 16, r)  # bfloat16: the top half of a float32
    return r
