"""Host tables on huge pages (host_pages): what the machine allows, clear fallbacks, sharing."""

from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp

import pytorch_zerocopy as zc
from pytorch_zerocopy import host_pages
from pytorch_zerocopy.host_pages import HostPages, HugePageSupport, empty_host, huge_bytes, huge_page_support

NOTHING = HugePageSupport(thp_private="never", thp_shared="never", hugetlb_free_pages=0, hugetlb_page_bytes=2 << 20)


def test_small_pages_shared_table():
    t = empty_host((1000, 7), torch.float16, pages=HostPages.SMALL)
    assert t.shape == (1000, 7) and t.dtype == torch.float16 and t.is_shared()
    t.fill_(3)
    assert float(t.float().sum()) == 21000
    private = empty_host(10, pages=HostPages.SMALL, shared=False)
    assert not private.is_shared() and private.numel() == 10


@pytest.mark.skipif(huge_page_support().unavailable(HostPages.THP, False, 1) is not None,
                    reason="transparent huge pages are off on this machine")
def test_private_thp_gets_huge_pages():
    t = empty_host((16 << 20) // 4, pages=HostPages.THP, shared=False)
    assert t.data_ptr() % (2 << 20) == 0
    t.fill_(1.0)  # first touch: the kernel allocates huge pages now
    assert huge_bytes(t) >= (2 << 20)
    assert huge_bytes(empty_host(1 << 20, pages=HostPages.SMALL)) == 0


def test_unavailable_kinds_fall_back_or_raise(monkeypatch):
    monkeypatch.setattr(host_pages, "huge_page_support", lambda: NOTHING)
    with pytest.warns(RuntimeWarning, match=r"THP pages unavailable: .*shmem_enabled = never.*Using 4 KiB pages"):
        t = empty_host(100, pages=HostPages.THP)
    assert t.is_shared() and t.numel() == 100
    with pytest.raises(RuntimeError, match=r"THP pages unavailable: .*enabled = never"):
        empty_host(100, pages=HostPages.THP, shared=False, strict=True)
    with pytest.raises(RuntimeError, match=r"hugetlbfs pool has 0 free 2 MiB pages, the table needs 3"):
        empty_host((5 << 20) // 4, pages=HostPages.HUGETLB, strict=True)


def test_bad_arguments():
    with pytest.raises(TypeError, match="HostPages"):
        empty_host(10, pages="thp")
    with pytest.raises(ValueError, match="negative dimension"):
        empty_host((3, -1), pages=HostPages.SMALL)


def _child_writes(t, results):
    t[3] = 42.0
    results.put(float(t[:3].sum()))


def test_shared_table_crosses_processes_and_maps_unified():
    t = empty_host((64, 4), pages=HostPages.SMALL)
    t.copy_(torch.arange(256, dtype=torch.float32).view(64, 4))
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    child = ctx.Process(target=_child_writes, args=(t, results))
    child.start()
    assert results.get(timeout=120) == float(torch.arange(12).sum())
    child.join(60)
    assert child.exitcode == 0
    assert (t[3] == 42.0).all()  # the child wrote the same pages
    u = zc.to_unified(t)
    torch.testing.assert_close(zc.gather_rows(u, torch.tensor([3, 0])).cpu(), t[[3, 0]])
