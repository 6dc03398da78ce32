"""CUDA tensors inside ``lp.emulate``: moved to the CPU with one warning, result moved back.

design.md "PyTorch integration": CUDA tensors are moved to the CPU, emulated there and the
result moved back, with one ``UserWarning`` per context.  Marked ``gpu``: skipped without CUDA.
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


def test_cuda_inputs_are_emulated_on_cpu_and_moved_back():
    q, k, v = _qkv(0)
    mask = torch.rand(24, 24, generator=torch.Generator().manual_seed(1)) > 0.2
    mask |= torch.eye(24, dtype=torch.bool)
    with lp.emulate("baps", config="e2e_hif8", tau=0, block_q=8, block_k=8) as run:
        want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        with lp.emulate("baps", config="e2e_hif8", tau=0, block_q=8, block_k=8) as run_gpu:
            got = F.scaled_dot_product_attention(q.cuda(), k.cuda(), v.cuda(),
                                                 attn_mask=mask.cuda())
            got2 = F.scaled_dot_product_attention(q.cuda(), k.cuda(), v.cuda(), is_causal=True)
    moved = [x for x in w if issubclass(x.category, UserWarning) and "CPU" in str(x.message)]
    assert len(moved) == 1  # one warning per context, not per call
    assert got.device.type == "cuda" and got2.device.type == "cuda"
    # the emulation itself ran on the CPU: bit-identical to the CPU call
    np.testing.assert_array_equal(got.cpu().numpy(), want.numpy())
    assert run_gpu.stats.total().calls == len(run_gpu.stats.calls) == 2
    # the first call's statistics equal those of the same call made on the CPU
    cpu_st, gpu_st = run.stats.calls[0].stats, run_gpu.stats.calls[0].stats
    assert gpu_st.total_tiles == cpu_st.total_tiles
    assert gpu_st.total_restarts == cpu_st.total_restarts
    assert gpu_st.total_tiles > 0
    assert run_gpu.stats.calls[1].causal


def test_cuda_sdpa_outside_context_untouched():
    q, k, v = (t.cuda() for t in _qkv(2))
    with lp.emulate("flash"):
        pass
    out = F.scaled_dot_product_attention(q, k, v)
    ref = F.scaled_dot_product_attention(q.cpu().double(), k.cpu().double(), v.cpu().double())
    assert out.device.type == "cuda"
    np.testing.assert_allclose(out.cpu().double().numpy(), ref.numpy(), rtol=1e-2, atol=1e-3)
