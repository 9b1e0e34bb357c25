"""The gather kernels' launch tuning (:class:`pytorch_zerocopy.GatherTuning`, op arguments the
plan passes) changes only the speed: every setting returns the reference rows, for the plain and
the cached gather, on every device, and a bad value is one clear ValueError at the op."""

from __future__ import annotations

import pytest
import torch

import pytorch_zerocopy as zc
from pytorch_zerocopy import CachedTable, FeatureTable, GatherTuning

SETTINGS = [GatherTuning(unroll=4), GatherTuning(unroll=16), GatherTuning(blocks_per_sm=1),
            GatherTuning(blocks_per_sm=4, unroll=16), GatherTuning(blocks_per_sm=32, unroll=8)]
KINDS = [pytest.param("cpu", id="cpu"), pytest.param("unified", id="unified", marks=pytest.mark.cuda),
         pytest.param("managed", id="managed", marks=pytest.mark.cuda)]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("tuning", SETTINGS, ids=lambda t: f"bps{t.blocks_per_sm}-u{t.unroll}")
def test_tuning_keeps_results(kind, tuning, gen):
    for width, dtype in ((128, torch.float32), (33, torch.float16), (7, torch.int8)):
        host = (torch.rand(6000, width, generator=gen) * 100 + 1).to(dtype)
        table = FeatureTable(host.clone(), kind, tuning=tuning)
        idx = torch.randint(0, 6000, (5000,), generator=gen)
        out = torch.full((5000, width), -7, dtype=dtype, device=table.device)
        assert table.read(idx, out) is out
        torch.testing.assert_close(out.cpu(), host[idx], rtol=0, atol=0)
        cached = CachedTable(table, torch.randperm(6000, generator=gen)[:1500])
        torch.testing.assert_close(cached.read(idx).cpu(), host[idx], rtol=0, atol=0)
        bad = idx.clone()
        bad[4321] = 6000
        with pytest.raises(IndexError, match="index 6000 at position 4321"):
            table.read(bad)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("tuning,word", [(GatherTuning(unroll=5), "unroll"), (GatherTuning(blocks_per_sm=33), "blocks_per_sm"),
                                         (GatherTuning(blocks_per_sm=-1), "blocks_per_sm")])
def test_bad_tuning_is_a_clear_error(kind, tuning, word):
    table = FeatureTable(torch.randn(3000, 8), kind)
    with pytest.raises(ValueError, match=f"gather_rows: {word} must be"):
        zc.gather_rows(table.source, torch.randint(0, 3000, (2000,)), tuning=tuning)
    with pytest.raises(ValueError, match=f"gather_rows_cached: {word} must be"):
        zc.gather_rows_cached(table.source, torch.zeros(0, 8, device=table.device),
                              torch.full((3000,), -1, dtype=torch.int32, device=table.device),
                              torch.randint(0, 3000, (20,)), tuning=tuning)
