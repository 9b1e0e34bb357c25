"""Unified tensors across processes (paper Listing 3) and the host-memory bound."""

import subprocess
import sys
import textwrap

import pytest
import torch
import torch.multiprocessing as mp

import pytorch_zerocopy as zc


def rss_anon_bytes() -> int:
    """Private (anonymous) resident memory of this process: a copy of a table shows up here."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("RssAnon not in /proc/self/status")


def _child_maps_and_writes(table, rank, results):
    import pytorch_zerocopy  # noqa: F401  registers the unified device in this process

    if torch.cuda.is_available():
        torch.cuda.set_device(rank % torch.cuda.device_count())
    # The same ops once on a small tensor first: the GPU context and the kernels' code are
    # loaded into host memory then, not during the measurement.
    warm = torch.randn(4, table.shape[1]).to("unified")
    float(warm[2:].double().sum())
    warm[0].fill_(1.0)
    before = rss_anon_bytes()
    u = table.to("unified")
    checksum = float(u[2:].double().sum())  # rows 0 and 1 are written by the children
    u[rank].fill_(float(rank + 10))  # written through this process's mapping
    after = rss_anon_bytes()
    results.put((rank, checksum, after - before, u.cpu().data_ptr() == table.data_ptr(), str(u.device)))


def _child_receives_unified(u, rank, results):
    import pytorch_zerocopy  # noqa: F401

    results.put((rank, u.device.type, float(u[2:].double().sum())))
    u[rank].fill_(-float(rank + 1))


def _run(target, args_per_rank, timeout=120):
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=target, args=(*args, results)) for args in args_per_rank]
    for p in procs:
        p.start()
    out = [results.get(timeout=timeout) for _ in procs]
    for p in procs:
        p.join(timeout)
        assert p.exitcode == 0, f"child exited with {p.exitcode}"
    return sorted(out)


def test_two_processes_map_one_shared_table(gen):
    rows, dim = 65536, 256  # 64 MiB
    table = torch.randn(rows, dim, generator=gen)
    table = table.share_memory_()  # as in the paper's Listing 3
    expect = float(table[2:].double().sum())
    out = _run(_child_maps_and_writes, [(table, 0), (table, 1)])
    table_bytes = table.numel() * 4
    for rank, checksum, anon_growth, same_ptr, device in out:
        assert device.startswith(zc.DEVICE_TYPE)
        assert abs(checksum - expect) < 1e-6 * max(1.0, abs(expect)) + 1e-3
        # No private copy: anonymous memory grows by far less than the table.
        assert anon_growth < table_bytes // 4, f"rank {rank} grew its private memory by {anon_growth} bytes"
    # Both children wrote through their own mappings into the parent's bytes.
    assert torch.all(table[0] == 10.0) and torch.all(table[1] == 11.0)


def test_unified_tensor_sent_to_children(gen):
    u = zc.empty_unified((8, 64), torch.float32)
    u.cpu().copy_(torch.randn(8, 64, generator=gen))
    expect = float(u.cpu()[2:].double().sum())
    out = _run(_child_receives_unified, [(u, 0), (u, 1)])
    for rank, device_type, checksum in out:
        assert device_type == zc.DEVICE_TYPE
        assert abs(checksum - expect) < 1e-3 * max(1.0, abs(expect))
    assert torch.all(u.cpu()[0] == -1.0) and torch.all(u.cpu()[1] == -2.0)


def test_private_unified_tensor_cannot_be_sent():
    u = torch.randn(4, 4).to("unified")  # private memory, not shared
    ctx = mp.get_context("spawn")
    p = ctx.Process(target=_child_receives_unified, args=(u, 0, ctx.Queue()))
    with pytest.raises(RuntimeError, match="shared memory"):
        p.start()


RSS_SCRIPT = textwrap.dedent(
    """
    import resource, torch, pytorch_zerocopy as zc
    w = torch.randn(8192).to("unified")   # the same ops once first: context and kernels load now
    float(w[:: 4096].sum())
    del w
    x = torch.empty(NBYTES // 4, dtype=torch.float32)
    x.uniform_()  # resident before measuring
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    u = x.to("unified")
    s = float(u[:: 4096].sum())  # used by an op through the mapping
    peak_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(peak_after - peak_before)
    """
)


def test_peak_rss_does_not_grow_when_mapping():
    nbytes = 512 << 20
    script = RSS_SCRIPT.replace("NBYTES", str(nbytes))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    growth = int(proc.stdout.strip().splitlines()[-1])
    assert growth <= nbytes // 100, f"peak RSS grew by {growth} bytes (> 1% of {nbytes})"
