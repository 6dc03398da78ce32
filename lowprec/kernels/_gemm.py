"""Deterministic float32 tile products for the tiled attention kernels.

Both products accumulate every output element sequentially over the reduction index, starting
from 0, one correctly rounded multiply and one correctly rounded add per term (no FMA), so the
result does not depend on vectorization, threads or CPU (docs/design.md, "Exact float32
semantics").  The loops are written out for 8 rows and 4 reduction steps at a time
(LLVM vectorizes the innermost loop over columns); callers pad rows to a multiple of 8 and the
reduction dimension to a multiple of 4 with zeros (adding ``0 * b`` leaves a sum unchanged).

Generated once by hand-written code; edit both functions alike.
"""

from ..formats._jit import jit

ROWS = 8  # rows per step: callers pad row counts to a multiple of this
RED = 4  # reduction steps per pass: callers pad reduction lengths to a multiple of this


@jit
def qk_tile(q, kt, s, i0, j0, nrows, ncols, d):
    """``s[i, j] = sum_kk q[i0 + i, kk] * kt[kk, j0 + j]`` for ``i < nrows`` (a multiple of
    ROWS), ``j < ncols``, ``kk < d`` (a multiple of RED), in sequential float32."""
    for i in range(0, nrows, 8):
        for j in range(ncols):
            s[i + 0, j] = 0.0
            s[i + 1, j] = 0.0
            s[i + 2, j] = 0.0
            s[i + 3, j] = 0.0
            s[i + 4, j] = 0.0
            s[i + 5, j] = 0.0
            s[i + 6, j] = 0.0
            s[i + 7, j] = 0.0
        for kk in range(0, d, 4):
            x00 = q[i0 + i + 0, kk + 0]
            x01 = q[i0 + i + 0, kk + 1]
            x02 = q[i0 + i + 0, kk + 2]
            x03 = q[i0 + i + 0, kk + 3]
            x10 = q[i0 + i + 1, kk + 0]
            x11 = q[i0 + i + 1, kk + 1]
            x12 = q[i0 + i + 1, kk + 2]
            x13 = q[i0 + i + 1, kk + 3]
            x20 = q[i0 + i + 2, kk + 0]
            x21 = q[i0 + i + 2, kk + 1]
            x22 = q[i0 + i + 2, kk + 2]
            x23 = q[i0 + i + 2, kk + 3]
            x30 = q[i0 + i + 3, kk + 0]
            x31 = q[i0 + i + 3, kk + 1]
            x32 = q[i0 + i + 3, kk + 2]
            x33 = q[i0 + i + 3, kk + 3]
            x40 = q[i0 + i + 4, kk + 0]
            x41 = q[i0 + i + 4, kk + 1]
            x42 = q[i0 + i + 4, kk + 2]
            x43 = q[i0 + i + 4, kk + 3]
            x50 = q[i0 + i + 5, kk + 0]
            x51 = q[i0 + i + 5, kk + 1]
            x52 = q[i0 + i + 5, kk + 2]
            x53 = q[i0 + i + 5, kk + 3]
            x60 = q[i0 + i + 6, kk + 0]
            x61 = q[i0 + i + 6, kk + 1]
            x62 = q[i0 + i + 6, kk + 2]
            x63 = q[i0 + i + 6, kk + 3]
            x70 = q[i0 + i + 7, kk + 0]
            x71 = q[i0 + i + 7, kk + 1]
            x72 = q[i0 + i + 7, kk + 2]
            x73 = q[i0 + i + 7, kk + 3]
            for j in range(ncols):
                b0 = kt[kk + 0, j0 + j]
                b1 = kt[kk + 1, j0 + j]
                b2 = kt[kk + 2, j0 + j]
                b3 = kt[kk + 3, j0 + j]
                t = s[i + 0, j]
                t += x00 * b0
                t += x01 * b1
                t += x02 * b2
                t += x03 * b3
                s[i + 0, j] = t
                t = s[i + 1, j]
                t += x10 * b0
                t += x11 * b1
                t += x12 * b2
                t += x13 * b3
                s[i + 1, j] = t
                t = s[i + 2, j]
                t += x20 * b0
                t += x21 * b1
                t += x22 * b2
                t += x23 * b3
                s[i + 2, j] = t
                t = s[i + 3, j]
                t += x30 * b0
                t += x31 * b1
                t += x32 * b2
                t += x33 * b3
                s[i + 3, j] = t
                t = s[i + 4, j]
                t += x40 * b0
                t += x41 * b1
                t += x42 * b2
                t += x43 * b3
                s[i + 4, j] = t
                t = s[i + 5, j]
                t += x50 * b0
                t += x51 * b1
                t += x52 * b2
                t += x53 * b3
                s[i + 5, j] = t
                t = s[i + 6, j]
                t += x60 * b0
                t += x61 * b1
                t += x62 * b2
                t += x63 * b3
                s[i + 6, j] = t
                t = s[i + 7, j]
                t += x70 * b0
                t += x71 * b1
                t += x72 * b2
                t += x73 * b3
                s[i + 7, j] = t


@jit
def pv_tile(p, v, o, j0, nrows, nkeys, dv):
    """``o[i, c] = sum_j p[i, j] * v[j0 + j, c]`` for ``i < nrows`` (a multiple of ROWS),
    ``j < nkeys`` (a multiple of RED), ``c < dv``, in sequential float32."""
    for i in range(0, nrows, 8):
        for j in range(dv):
            o[i + 0, j] = 0.0
            o[i + 1, j] = 0.0
            o[i + 2, j] = 0.0
            o[i + 3, j] = 0.0
            o[i + 4, j] = 0.0
            o[i + 5, j] = 0.0
            o[i + 6, j] = 0.0
            o[i + 7, j] = 0.0
        for kk in range(0, nkeys, 4):
            x00 = p[i + 0, kk + 0]
            x01 = p[i + 0, kk + 1]
            x02 = p[i + 0, kk + 2]
            x03 = p[i + 0, kk + 3]
            x10 = p[i + 1, kk + 0]
            x11 = p[i + 1, kk + 1]
            x12 = p[i + 1, kk + 2]
            x13 = p[i + 1, kk + 3]
            x20 = p[i + 2, kk + 0]
            x21 = p[i + 2, kk + 1]
            x22 = p[i + 2, kk + 2]
            x23 = p[i + 2, kk + 3]
            x30 = p[i + 3, kk + 0]
            x31 = p[i + 3, kk + 1]
            x32 = p[i + 3, kk + 2]
            x33 = p[i + 3, kk + 3]
            x40 = p[i + 4, kk + 0]
            x41 = p[i + 4, kk + 1]
            x42 = p[i + 4, kk + 2]
            x43 = p[i + 4, kk + 3]
            x50 = p[i + 5, kk + 0]
            x51 = p[i + 5, kk + 1]
            x52 = p[i + 5, kk + 2]
            x53 = p[i + 5, kk + 3]
            x60 = p[i + 6, kk + 0]
            x61 = p[i + 6, kk + 1]
            x62 = p[i + 6, kk + 2]
            x63 = p[i + 6, kk + 3]
            x70 = p[i + 7, kk + 0]
            x71 = p[i + 7, kk + 1]
            x72 = p[i + 7, kk + 2]
            x73 = p[i + 7, kk + 3]
            for j in range(dv):
                b0 = v[j0 + kk + 0, j]
                b1 = v[j0 + kk + 1, j]
                b2 = v[j0 + kk + 2, j]
                b3 = v[j0 + kk + 3, j]
                t = o[i + 0, j]
                t += x00 * b0
                t += x01 * b1
                t += x02 * b2
                t += x03 * b3
                o[i + 0, j] = t
                t = o[i + 1, j]
                t += x10 * b0
                t += x11 * b1
                t += x12 * b2
                t += x13 * b3
                o[i + 1, j] = t
                t = o[i + 2, j]
                t += x20 * b0
                t += x21 * b1
                t += x22 * b2
                t += x23 * b3
                o[i + 2, j] = t
                t = o[i + 3, j]
                t += x30 * b0
                t += x31 * b1
                t += x32 * b2
                t += x33 * b3
                o[i + 3, j] = t
                t = o[i + 4, j]
                t += x40 * b0
                t += x41 * b1
                t += x42 * b2
                t += x43 * b3
                o[i + 4, j] = t
                t = o[i + 5, j]
                t += x50 * b0
                t += x51 * b1
                t += x52 * b2
                t += x53 * b3
                o[i + 5, j] = t
                t = o[i + 6, j]
                t += x60 * b0
                t += x61 * b1
                t += x62 * b2
                t += x63 * b3
                o[i + 6, j] = t
                t = o[i + 7, j]
                t += x70 * b0
                t += x71 * b1
                t += x72 * b2
                t += x73 * b3
                o[i + 7, j] = t

