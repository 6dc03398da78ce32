"""Scalar bit casts for Numba kernels (LLVM ``bitcast``; free at run time)."""

from __future__ import annotations

from numba import types
from numba.extending import intrinsic


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
f32_as_u32 = intrinsic(_bitcast(types.float32, types.uint32))
u32_as_f32 = intrinsic(_bitcast(types.uint32, types.float32))
f64_as_u64 = intrinsic(_bitcast(types.float64, types.uint64))


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
shr32 = intrinsic(_shift32("lshr"))
shl32 = intrinsic(_shift32("shl"))



from ._jit import stabilize_module  # noqa: E402

stabilize_module(globals(), __name__)
