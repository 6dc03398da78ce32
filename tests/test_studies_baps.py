"""lowprec.studies.baps at small sizes: the qualitative claims of the BAPS paper hold on our
synthetic workloads (Figure 2: non-integer rescaling accumulates error, integer powers of two do
not; Table 4: restart rate falls with tau)."""

from __future__ import annotations

import json

import numpy as np

from lowprec.studies import baps as sb


def test_error_accumulation_grows_only_for_non_integer_rescale():
    res = sb.error_accumulation(lengths=(256, 8192), heads=1, Lq=16)
    e = res["errors"]
    # float32 softmax is the floor
    assert max(e["default"]) < 1e-5
    # exp2 in HiF8 with a non-integer max: error grows with length (here by > 3x)
    assert e["exp2_hif8"][1] > 3 * e["exp2_hif8"][0]
    # integer powers of two: bounded (no more than 1.5x from 256 to 8192) and far below
    assert e["e2e_hif8"][1] < 1.5 * e["e2e_hif8"][0]
    assert e["e2e_hif8"][1] < 0.5 * e["exp2_hif8"][1]
    text = sb.format_error_accumulation(res)
    assert "exp2_hif8" in text and "8192" in text


def test_restart_rate_falls_with_tau():
    res = sb.restart_vs_tau(L=512, heads=8, seeds=(0,), block_q=64, block_k=64)
    arr = res["arr"]
    assert all(a >= b for a, b in zip(arr, arr[1:], strict=False))
    assert arr[0] > arr[2]
    assert all(0.0 <= p <= 1.0 for p in res["prr"])
    assert all(p >= a for p, a in zip(res["prr"], arr, strict=True))
    assert res["naive_error"] > 1.5 * max(res["error"].values())
    counts, edges = sb.rate_histogram(res["per_head"][0])
    assert counts.sum() == len(res["per_head"][0]) and edges[0] == 0.0 and edges[-1] == 1.0
    json.dumps({k: (v.tolist() if isinstance(v, np.ndarray) else v)
                for k, v in res.items() if k != "per_head"})
    assert "tau" in sb.format_restart_vs_tau(res)


def test_workloads_are_reproducible_and_shaped():
    q, k, v = sb.growing_max_inputs(300, Lq=5, d=16, heads=2, seed=3)
    q2, k2, v2 = sb.growing_max_inputs(300, Lq=5, d=16, heads=2, seed=3)
    assert q.shape == (2, 5, 16) and k.shape == (2, 300, 16) and v.shape == (2, 300, 16)
    assert np.array_equal(k, k2) and q.dtype == np.float32
    q, k, v, params = sb.sink_recency_inputs(128, heads=3, d=32, seed=1)
    assert q.shape == (3, 128, 32) and params.shape == (3, 2)
    # the sink: key 0 scores highest for the first queries of every head
    s = np.einsum("hid,hjd->hij", q[:, :8], k)
    assert (s.argmax(axis=-1)[:, :4] == 0).mean() > 0.5
