"""CUDA tensors inside ``lp.emulate``: ``flash``/``baps`` and the row-wise schemes on the device
(no warning), a scheme without a device path moved to the CPU with one warning, result moved
back.

design.md "PyTorch integration" ("CUDA models"): schemes with a GPU engine or a device function
compute on the device; the others (none is registered any more: the tests make one up) move CUDA
tensors to the CPU, emulate there and move the result back, with one ``UserWarning`` per
context.  Marked ``gpu``: skipped without CUDA (the device paths themselves are tested on the
CPU by tests/test_attention_device.py and tests/test_attention_device_rows.py).
"""

import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

import lowprec as lp  # noqa: E402

pytestmark = pytest.mark.gpu


def _qkv(seed, shape=(2, 4, 24, 16)):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(shape, generator=g) for _ in range(3))


def test_cuda_inputs_are_emulated_on_cpu_and_moved_back(cpu_only_scheme):
    """A scheme without a device path (every registered scheme has one: a test-registered
    copy of ``intflash`` without it): CPU fallback, one warning."""
    q, k, v = _qkv(0)
    mask = torch.rand(24, 24, generator=torch.Generator().manual_seed(1)) > 0.2
    mask |= torch.eye(24, dtype=torch.bool)
    with lp.emulate(cpu_only_scheme) as run:
        want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        with lp.emulate(cpu_only_scheme) as run_gpu:
            got = F.scaled_dot_product_attention(q.cuda(), k.cuda(), v.cuda(),
                                                 attn_mask=mask.cuda())
            got2 = F.scaled_dot_product_attention(q.cuda(), k.cuda(), v.cuda(), is_causal=True)
    moved = [x for x in w if issubclass(x.category, UserWarning) and "CPU" in str(x.message)]
    assert len(moved) == 1  # one warning per context, not per call
    assert got.device.type == "cuda" and got2.device.type == "cuda"
    np.testing.assert_array_equal(got.cpu().numpy(), want.numpy())
    assert run_gpu.stats.total().calls == len(run_gpu.stats.calls) == 2
    assert str(run.stats.calls[0].stats.to_dict()) == str(run_gpu.stats.calls[0].stats.to_dict())
    assert run_gpu.stats.calls[1].causal


@pytest.mark.parametrize("scheme,opts", [
    ("baps", dict(config="e2e_hif8", tau=0, block_q=8, block_k=8)),
    ("intflash", {}), ("exaq", {}), ("reference", {}),
])
def test_cuda_inputs_on_the_device(scheme, opts):
    """``baps`` (the GPU engine) and the row-wise ``intflash``, ``exaq``, ``reference``:
    computed on the GPU (no warning), bit-identical to the CPU, same statistics."""
    q, k, v = _qkv(0)
    mask = torch.rand(24, 24, generator=torch.Generator().manual_seed(1)) > 0.2
    mask |= torch.eye(24, dtype=torch.bool)
    with lp.emulate(scheme, **opts) as run:
        want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        with lp.emulate(scheme, **opts) as run_gpu:
            got = F.scaled_dot_product_attention(q.cuda(), k.cuda(), v.cuda(),
                                                 attn_mask=mask.cuda())
    assert not [x for x in w if "moved to the CPU" in str(x.message)]
    assert got.device.type == "cuda"
    np.testing.assert_array_equal(got.cpu().numpy(), want.numpy())
    cpu_st, gpu_st = run.stats.calls[0].stats, run_gpu.stats.calls[0].stats
    if scheme == "reference":  # no statistics
        assert cpu_st is None and gpu_st is None
    else:
        assert str(cpu_st.to_dict()) == str(gpu_st.to_dict())
    if scheme == "baps":
        assert gpu_st.total_tiles > 0


def test_cuda_sdpa_outside_context_untouched():
    q, k, v = (t.cuda() for t in _qkv(2))
    with lp.emulate("flash"):
        pass
    out = F.scaled_dot_product_attention(q, k, v)
    ref = F.scaled_dot_product_attention(q.cpu().double(), k.cpu().double(), v.cpu().double())
    assert out.device.type == "cuda"
    np.testing.assert_allclose(out.cpu().double().numpy(), ref.numpy(), rtol=1e-2, atol=1e-3)
