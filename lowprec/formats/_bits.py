"""Scalar bit casts for Numba kernels (LLVM ``bitcast``; free at run time)."""

from __future__ import annotations

from numba import types
from numba.extending import intrinsic


@intrinsic
def f32_as_u32(typingctx, x):
    """Reinterpret a float32 scalar as uint32 (inside Numba code only)."""
    if x != types.float32:
        return None
    sig = types.uint32(types.float32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], context.get_value_type(types.uint32))

    return sig, codegen


@intrinsic
def u32_as_f32(typingctx, x):
    """Reinterpret a uint32 scalar as float32 (inside Numba code only)."""
    if x != types.uint32:
        return None
    sig = types.float32(types.uint32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], context.get_value_type(types.float32))

    return sig, codegen


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


@intrinsic
def f64_as_u64(typingctx, x):
    """Reinterpret a float64 scalar as uint64 (inside Numba code only)."""
    if x != types.float64:
        return None
    sig = types.uint64(types.float64)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], context.get_value_type(types.uint64))

    return sig, codegen


from ._jit import stabilize_module  # noqa: E402

stabilize_module(globals(), __name__)
