"""The codecs as ``torch.library`` custom operators on CPU tensors (no GPU needed): every op
passes ``torch.library.opcheck``, and ``torch.compile(fullgraph=True)`` of functions calling
``lp.quantize`` / ``lp.encode`` / ``lp.decode`` gives the eager result (issue 14, item 4).  The
CUDA twins of these checks are in ``tests/test_gpu_cuda.py``.
"""

from __future__ import annotations

import numpy as np
import pytest

import lowprec as lp

torch = pytest.importorskip("torch")

from lowprec.gpu import ops as _ops  # noqa: E402,F401  (registers torch.ops.lowprec)

OPS = torch.ops.lowprec


def _x(*shape):
    return torch.from_numpy(np.random.default_rng(0).standard_normal(shape).astype(np.float32))


def _opcheck_cases():
    x = _x(4, 40)
    no_nan = torch.tensor([c for c in range(256) if c not in (0x7F, 0xFF, 0x80)],
                          dtype=torch.int32).to(torch.uint8)
    return [
        ("float_codec", (x, "e4m3", 0, False, 0, 32, 0, True)),
        ("float_codec", (x, "hif8", 5, True, -5, 7, 3, False)),
        ("float_codec", (x.double(), "e5m2", 3, False, 0, 32, 0, True)),
        ("float_codec", (x.to(torch.bfloat16), "hif8", 6, False, 0, 32, 0, False)),
        ("float_codec_out", (x, torch.empty(4, 40), "e5m2", 1, False, 0, 32, 0)),
        ("float_decode", (no_nan, "e4m3")),
        ("float_decode_out", (no_nan, torch.empty(no_nan.shape), "hif8")),
        ("mx_encode", (x, "mxfp8_e4m3", 1, 32, 0, False, 0, 0, 32, 0)),
        ("mx_quantize", (x, "mxfp8_e5m2", 0, 3, 1, True, 5, 9, 8, 0)),
        ("mx_decode", (torch.randint(0, 120, (4, 40), dtype=torch.uint8),
                       torch.randint(100, 140, (4, 2), dtype=torch.uint8), "mxfp8_e4m3", 1, 32)),
        ("int_encode", (x, "int8", "per_channel", 1, None, False, None, None, None, 0, 0, 32, 0)),
        ("int_quantize", (x, "uint8", "per_block", 1, 7, True, None, None, None, 5, 3, 9, 0)),
        ("int_quantize", (x, "int8", "per_tensor", None, None, True, None,
                          torch.tensor([[0.1]]), None, 0, 0, 32, 0)),
        ("int_decode", (torch.randint(-100, 100, (4, 40), dtype=torch.int8),
                        torch.rand(4, 1) + 0.1, None, "int8", "per_token", None, None)),
        ("nvfp4_encode", (x, 1, 16, "torchao", "amax", 0.0, 0, 0, 32, 0)),
        ("nvfp4_quantize", (x, 0, 3, "te", "value", 0.25, 5, 9, 8, 0)),
        ("nvfp4_decode", (torch.randint(0, 16, (4, 40), dtype=torch.uint8),
                          torch.randint(0, 127, (4, 3), dtype=torch.uint8), torch.tensor(0.5),
                          1, 16)),
        # sub-byte codes: the implementations check them (tests/test_decode_invalid_codes.py)
        ("float_decode", (torch.randint(0, 64, (4, 40), dtype=torch.uint8), "e3m2")),
        ("float_decode_out", (torch.randint(0, 16, (4, 40), dtype=torch.uint8),
                              torch.empty(4, 40), "e2m1")),
        ("mx_decode", (torch.randint(0, 16, (4, 40), dtype=torch.uint8),
                       torch.randint(100, 140, (4, 2), dtype=torch.uint8), "mxfp4", 1, 32)),
        ("int_decode", (torch.randint(-8, 8, (4, 40), dtype=torch.int8),
                        torch.rand(4, 1) + 0.1, None, "int4", "per_token", None, None)),
    ]


@pytest.mark.parametrize("name,args", _opcheck_cases(), ids=lambda v: v if isinstance(v, str)
                         else "")
def test_opcheck(name, args):
    torch.library.opcheck(getattr(OPS, name).default, args)


@pytest.mark.parametrize("fmt,kw", [
    ("hif8", {}), ("e4m3", dict(rounding="stochastic", seed=3, sr_bits=8, offset=5)),
    ("e5m2", dict(saturate=True, rounding="up")), ("mxfp8_e4m3", dict(axis=0)),
    ("mxfp8_e5m2", dict(block_size=7, scale_mode="rceil")),
    ("int8", dict(granularity="per_channel", axis=1)), ("uint8", dict(symmetric=False))])
def test_compile_fullgraph_quantize(fmt, kw):
    def f(x):
        return lp.quantize(x * 2, fmt, **kw) + 1

    x = _x(8, 64)
    assert torch.equal(torch.compile(f, fullgraph=True)(x), f(x))


def test_compile_fullgraph_quantize_nvfp4():
    def f(x):
        return (lp.quantize(x * 2, "nvfp4", tensor_scale="amax")
                + lp.quantize(x, "nvfp4", recipe="te", tensor_scale=0.5, rounding="stochastic",
                              seed=2))

    x = _x(8, 64)
    assert torch.equal(torch.compile(f, fullgraph=True)(x), f(x))


def test_compile_fullgraph_encode_decode_and_out():
    def f(x, out):
        c = lp.encode(x, "hif8")
        lp.quantize(x, "e4m3", out=out)
        return lp.decode(c, "hif8") + out

    x = _x(8, 64)
    o1, o2 = torch.empty(8, 64), torch.empty(8, 64)
    assert torch.equal(torch.compile(f, fullgraph=True)(x, o1), f(x, o2))
    assert torch.equal(o1, o2)
