"""The CUDA gather kernels' per-call tuning knobs (PYTORCH_ZEROCOPY_GATHER_*, measured by
benchmarks/gather_sweep.py) change only the speed: every setting returns the reference rows,
for the plain and the cached gather, and a bad value is a clear error."""

from __future__ import annotations

import pytest
import torch

import pytorch_zerocopy as zc

SETTINGS = [
    {"UNROLL": "4"}, {"UNROLL": "16"}, {"STEPS": "1"}, {"STEPS": "256"}, {"GRID_BLOCKS": "1"},
    {"GRID_BLOCKS": "264"}, {"BLOCKS_PER_SM": "1"}, {"BLOCKS_PER_SM": "4", "UNROLL": "16"}, {"LOAD": "nc"}, {"LOAD": "l2_128"}, {"LOAD": "l2_256"}, {"SPLIT": "3"},
    {"SPLIT": "16", "UNROLL": "16", "LOAD": "l2_256"},
]


@pytest.mark.cuda
@pytest.mark.parametrize("knobs", SETTINGS, ids=lambda k: ",".join(f"{a}={b}" for a, b in k.items()))
def test_knobs_keep_results(knobs, gen, monkeypatch):
    for name, value in knobs.items():
        monkeypatch.setenv(f"PYTORCH_ZEROCOPY_GATHER_{name}", value)
    for width, dtype in ((128, torch.float32), (33, torch.float16), (7, torch.int8)):
        host = (torch.rand(6000, width, generator=gen) * 100 + 1).to(dtype)
        table = zc.to_unified(host.clone())
        idx = torch.randint(0, 6000, (5000,), generator=gen)
        out = torch.full((5000, width), -7, dtype=dtype, device="cuda")
        zc.gather_rows(table, idx.cuda(), out)
        torch.testing.assert_close(out.cpu(), host[idx], rtol=0, atol=0)
        ft = zc.FeatureTable(host, torch.randperm(6000, generator=gen)[:1500])
        torch.testing.assert_close(ft[idx].cpu(), host[idx], rtol=0, atol=0)
        bad = idx.clone()
        bad[4321] = 6000
        with pytest.raises(IndexError, match="index 6000 at position 4321"):
            zc.gather_rows(table, bad.cuda())


@pytest.mark.cuda
@pytest.mark.parametrize("name,value", [("UNROLL", "5"), ("STEPS", "0"), ("LOAD", "fast"), ("SPLIT", "x"),
                                        ("BLOCKS_PER_SM", "33")])
def test_bad_knob_is_a_clear_error(name, value, monkeypatch):
    monkeypatch.setenv(f"PYTORCH_ZEROCOPY_GATHER_{name}", value)
    table = zc.to_unified(torch.randn(3000, 8))
    with pytest.raises(ValueError, match=f"PYTORCH_ZEROCOPY_GATHER_{name}"):
        zc.gather_rows(table, torch.randint(0, 3000, (2000,), device="cuda"))
