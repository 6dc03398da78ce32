"""Scalar bit casts for Numba kernels (LLVM ``bitcast``; free at run time) and the float32 bit
masks every kernel uses, named once."""

from __future__ import annotations

from numba import types
from numba.extending import intrinsic

from ._jit import stable_uuid

# float32 bit fields (IEEE 754 binary32: 1 sign, 8 exponent, 23 fraction bits)
F32_SIGN = 0x80000000  # the sign bit
F32_ABS = 0x7FFFFFFF  # everything but the sign: |x| as bits
F32_EXP = 0x7F800000  # the exponent field; also the bits of +inf (|x| above it is NaN)
F32_FRAC_BITS = 23  # fraction bits
F16_MIN_NORMAL = 0x38800000  # bits of 2**-14, float16's smallest normal
F16_MAX = 0x477FE000  # bits of 65504, float16's largest finite value
F16_DROP = 13  # float32 fraction bits float16 drops (23 - 10)
F16_KEEP = 0xFFFFE000  # float32 bits float16 keeps
BF16_DROP = 16  # float32 fraction bits bfloat16 drops (23 - 7)
BF16_KEEP = 0xFFFF0000  # float32 bits bfloat16 keeps


def _bitcast(src, dst):
    def impl(typingctx, x):
        if x != src:
            return None
        sig = dst(src)

        def codegen(context, builder, signature, args):
            return builder.bitcast(args[0], context.get_value_type(dst))

        return sig, codegen

    return impl


# Reinterpret a scalar's bits as another type of the same width (inside Numba code only).
f32_as_u32 = stable_uuid(intrinsic(_bitcast(types.float32, types.uint32)), f"{__name__}.f32_as_u32")
u32_as_f32 = stable_uuid(intrinsic(_bitcast(types.uint32, types.float32)), f"{__name__}.u32_as_f32")
f64_as_u64 = stable_uuid(intrinsic(_bitcast(types.float64, types.uint64)), f"{__name__}.f64_as_u64")
u64_as_f64 = stable_uuid(intrinsic(_bitcast(types.uint64, types.float64)), f"{__name__}.u64_as_f64")


def _shift32(op):
    def impl(typingctx, x, s):
        if x != types.uint32 or s != types.uint32:
            return None
        sig = types.uint32(types.uint32, types.uint32)

        def codegen(context, builder, signature, args):
            return getattr(builder, op)(args[0], args[1])

        return sig, codegen

    return impl


# 32-bit shifts that stay 32-bit (Numba widens `>>` and `<<` to 64 bits, which halves the
# vector width).  The shift count must be < 32 (LLVM semantics); callers guarantee it.
shr32 = stable_uuid(intrinsic(_shift32("lshr")), f"{__name__}.shr32")
shl32 = stable_uuid(intrinsic(_shift32("shl")), f"{__name__}.shl32")
