"""The one-pass kernels before the row-wise schemes' fused kernels: per-row ``max |x|``
(``lowprec.gpu.rowstats``) and the int8 codes (``lowprec.gpu.int8codes``) against their torch
twins bit for bit (NaN and Inf in each stored dtype, partial row blocks, head dims that are not
powers of two, strided inputs, near-ties of the codes' quotient for float32 and float64
scales); the NaN / Inf errors of ``qflash``, ``intattention`` and ``intflash`` on the device
equal the CPU's; the fused paths read bfloat16 inputs as stored (no float32 copy of q, k, v).
Without a GPU the kernels run in Triton's interpreter on CPU tensors."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from test_attention_device_rows import DEVICE, both, dev, on_device, qkv  # noqa: E402

import lowprec as lp  # noqa: E402
from lowprec.gpu import rowstats  # noqa: E402
from lowprec.gpu.int8codes import int8_codes  # noqa: E402
from lowprec.kernels import device_rows as drows  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning:triton.runtime.interpreter")

DTYPES = [torch.bfloat16, torch.float16, torch.float32]


def same_f64(a, b):
    """Equal float64 tensors, NaN where the other has NaN."""
    assert a.shape == b.shape and a.dtype == b.dtype == torch.float64
    assert torch.equal(torch.isnan(a), torch.isnan(b))
    assert torch.equal(torch.nan_to_num(a, nan=-1.0), torch.nan_to_num(b, nan=-1.0))


def special_rows(dt, N=3, L=37, D=70, seed=0):
    """``(N, L, D)`` values of ``dt`` over its whole range (subnormals included) with NaN,
    +-Inf, -0.0 and zero rows, NaN beside Inf, and a NaN of either sign."""
    g = torch.Generator().manual_seed(seed)
    fi = torch.finfo(dt)
    mag = torch.exp2(torch.rand(N, L, D, generator=g, dtype=torch.float64)
                     * (math.log2(fi.max) - math.log2(fi.smallest_normal) + 8)
                     + math.log2(fi.smallest_normal) - 8)
    x = (mag * torch.randn(N, L, D, generator=g, dtype=torch.float64).sign()).to(dt)
    x[0, 3, 5] = math.nan
    x[0, 4, 1], x[0, 4, 2] = math.inf, math.nan
    x[1, 2, 0] = math.inf
    x[1, 4, D - 1] = -math.inf
    x[2, 5] = 0.0
    x[2, 6] = -0.0
    x[2, 7] = fi.smallest_normal / 4  # subnormal
    x[2, 8, 9] = -fi.max
    nan_neg = x[2, 9].view(torch.int16 if dt != torch.float32 else torch.int32)
    nan_neg[3] = -1  # all bits set: a NaN with the sign bit
    return x


@pytest.mark.parametrize("dt", DTYPES)
def test_row_amax_equals_torch(dt):
    x = special_rows(dt).to(DEVICE)
    want = x.abs().amax(dim=-1).double()
    got = rowstats.row_amax(x)
    same_f64(got, want)
    assert bool(torch.isnan(got[0, 3])) and bool(torch.isnan(got[0, 4])) and \
        bool(torch.isnan(got[2, 9])) and got[1, 4] == math.inf
    # strided (a transposed copy read through its strides) and a partial row block
    xt = x.transpose(1, 2).contiguous().transpose(1, 2)[:, 1:]
    same_f64(rowstats.row_amax(xt), want[:, 1:])


@pytest.mark.parametrize("shape", [(1, 1, 1), (2, 5, 3), (1, 300, 16), (2, 3, 9000)])
def test_row_amax_shapes(shape):
    """One element; D not a power of two; many partial blocks; rows past MAX_ROW and float64
    on torch's reduction (device_rows.row_amax dispatches)."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(shape, generator=g).to(torch.bfloat16).to(DEVICE)
    want = x.abs().amax(dim=-1).double()
    same_f64(drows.row_amax(x), want)
    same_f64(drows.row_amax(x.double()), want)
    assert drows.row_amax(x[..., :0]).shape == shape[:2]


def near_ties(xdt, sdt, n=3000, seed=2):
    """``x (3, n, 7)`` of ``xdt`` and per-row scales of ``sdt`` making ``x[:, :, 0] / s`` fall
    within float64 rounding of a half-integer (exact ties where representable), beside random
    columns, zeros and values far past the clamp."""
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(3, n, 7, generator=g, dtype=torch.float64) * 50).to(xdt)
    h = torch.randint(-130, 130, (3, n), generator=g).double() + 0.5
    s = (x[:, :, 0].double() / h).abs().to(sdt)
    s = torch.where(s > 0, s, torch.ones_like(s))
    x[:, 1::3, 1] = (h[:, 1::3] * s[:, 1::3].double()).to(xdt)
    x[:, ::5, 2] = 0.0
    x[:, ::7, 3] = (130 * s[:, ::7].double()).clamp(max=torch.finfo(xdt).max).to(xdt)
    return x, s


@pytest.mark.parametrize("xdt", DTYPES)
@pytest.mark.parametrize("sdt", [torch.float32, torch.float64])
def test_int8_codes_near_ties(xdt, sdt):
    """The reciprocal with the IEEE division near ties gives the division's codes: per-row
    and per-entry scales, entries read through an index, both lower clamps."""
    x, s = near_ties(xdt, sdt)
    x, s = x.to(DEVICE), s.to(DEVICE)
    for qmin in (-127, -128):
        got = int8_codes(x, s.contiguous(), qmin=qmin)
        assert torch.equal(got.double(), drows.codes(x, s, qmin))
    src = torch.tensor([2, 0, 2, 1], device=DEVICE)
    se = s[src, 5].contiguous()
    got = int8_codes(x, se, src)
    assert torch.equal(got.double(), drows.codes(x[src], se[:, None].expand(4, x.shape[1])))
    assert int((got == 127).sum()) > 0 and int((got == -127).sum()) > 0


@pytest.mark.parametrize("scheme", ["qflash", "intattention", "intflash"])
@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("where", ["q", "k", "v", "kv"])
def test_nonfinite_inputs_raise_cpu_error(scheme, dt, where):
    """NaN or Inf in q, k or v (in k and v: k's error first) raise the CPU's ValueError."""
    q, k, v = qkv(Z=1, Hq=2, Hkv=2, Lq=8, Lk=12, d=10, dv=6, seed=4, dtype=dt)
    bad = {"q": q, "k": k, "v": v}
    for i, name in enumerate("kv" if where == "kv" else where):
        bad[name][0, 1, 3, 2] = (math.nan, -math.inf)[(i + len(where)) % 2]
    with pytest.raises(ValueError) as e1:
        lp.attention(q, k, v, scheme)
    with on_device(), pytest.raises(ValueError) as e2:
        lp.attention(dev(q), dev(k), dev(v), scheme)
    assert str(e1.value) == str(e2.value)
    assert str(e1.value).startswith(f"{where[0]} contains NaN or Inf")


@pytest.mark.parametrize("scheme,opts", [
    ("qflash", {}), ("qflash", dict(scale_scope="tensor")), ("intattention", {}),
    ("intattention", dict(granularity="per_block", block=16)), ("intflash", {}),
])
def test_fused_reads_inputs_as_stored(scheme, opts, monkeypatch):
    """bfloat16 and float16 calls of the fused paths equal the CPU path without a float32
    copy of q, k or v."""
    copies = []
    real = drows.DeviceProblem._as_float

    def spy(self, name):
        copies.append(name)
        return real(self, name)

    monkeypatch.setattr(drows.DeviceProblem, "_as_float", spy)
    for dt in (torch.bfloat16, torch.float16):
        q, k, v = qkv(Z=1, Hq=4, Hkv=2, Lq=40, Lk=72, d=24, dv=16, seed=6, dtype=dt)
        both(q, k, v, scheme, **opts)
    assert copies == []
