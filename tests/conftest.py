"""Shared fixtures. CUDA is queried when tests are collected, never when a module is imported,
and CUDA cases are skipped cleanly on a machine without a GPU.

GPU memory: every test gives back what it allocated. After each test the fixture below drops
what a failure keeps alive (the traceback's frames), collects garbage, and empties torch's
caching allocator, so later tests, and the child processes they start, find the GPU free
(on an 80 GB GPU, one test's cached blocks left later tests' children unable to map even a
few pages of host memory). A test that leaves more than ``LEAK_TOLERANCE_BYTES`` allocated, or
mapped as unified memory, fails at teardown, named. Memory held by module- or session-scoped
fixtures is not counted: they are set up before the snapshot and torn down after it.
"""

import gc
import os
import sys

import pytest
import torch

from skip_summary import pytest_terminal_summary  # noqa: F401  (a count of skip reasons)

# Allocations a test may leave behind: caches torch keeps on purpose (cuBLAS handles, kernel
# images, compiled graphs) stay well below this; a leaked table or batch does not.
LEAK_TOLERANCE_BYTES = 64 << 20


def cuda_available() -> bool:
    return torch.cuda.is_available()


def pytest_generate_tests(metafunc):
    # A test that takes `device` runs on the CPU and, where a GPU exists, on CUDA.
    if "device" in metafunc.fixturenames:
        params = [pytest.param("cpu", id="cpu"),
                  pytest.param("cuda", id="cuda", marks=pytest.mark.cuda)]
        metafunc.parametrize("device", params)


def _parallel_workers() -> int:
    """How many pytest-xdist workers run this session's tests (1 without xdist)."""
    return int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)


def pytest_collection_modifyitems(config, items):
    if cuda_available():
        # A test that takes (almost) all of the GPU's memory must not run beside others: under
        # xdist the other workers' allocations fail, or managed memory asked for meanwhile
        # can hang the GPU. It runs in a session of its own: pytest -m whole_gpu (no -n).
        if _parallel_workers() > 1:
            alone = pytest.mark.skip(reason="takes the whole GPU: run it alone (pytest -m whole_gpu, without -n)")
            for item in items:
                if "whole_gpu" in item.keywords:
                    item.add_marker(alone)
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def gen():
    """A fresh, randomly seeded CPU generator per test; gen.initial_seed() reproduces a failure."""
    g = torch.Generator()
    g.seed()
    return g


@pytest.fixture
def host_bytes():
    """``host_bytes(u)``: the host tensor over unified tensor ``u``'s bytes (``u.cpu()``, no copy)
    once the GPU work queued so far has finished. Ops on unified tensors run on the GPU
    asynchronously, like any CUDA op, and ``u.cpu()`` does not wait for them: a test that reads
    bytes a GPU op wrote reads them through this."""
    from pytorch_zerocopy.unified import gpu_backed

    def settled(u: torch.Tensor) -> torch.Tensor:
        assert u.is_unified, f"host_bytes takes a unified tensor, got one on {u.device}"
        if gpu_backed():
            torch.cuda.synchronize()
        return u.cpu()
    return settled


def _gpu_bytes_held() -> dict:
    """Bytes torch's allocator has handed out per GPU (where this process has initialised
    CUDA; nothing is initialised here), and bytes of host memory unified tensors keep mapped
    for the GPUs (always 0 without a GPU)."""
    held = {}
    if torch.cuda.is_initialized():
        held = {f"cuda:{d}": torch.cuda.memory_allocated(d) for d in range(torch.cuda.device_count())}
    unified = sys.modules.get("pytorch_zerocopy.unified")
    if unified is not None:
        held["unified mappings"] = unified.registration_stats()["live_bytes"]
    return held


def _release_gpu_memory() -> None:
    # A failed test's frames (and so its tensors) live on in sys.last_traceback.
    sys.last_type = sys.last_value = sys.last_traceback = None
    if hasattr(sys, "last_exc"):
        sys.last_exc = None
    gc.collect()
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()
        clear_workspaces = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
        if clear_workspaces is not None:
            clear_workspaces()
        torch.cuda.empty_cache()


@pytest.fixture(autouse=True)
def gpu_memory_released(request):
    """After each test: frees torch's GPU cache and fails a test that leaked GPU memory."""
    before = _gpu_bytes_held()
    yield
    if not torch.cuda.is_initialized() and not any(_gpu_bytes_held().values()):
        return  # nothing on a GPU (always so on a machine without one)
    _release_gpu_memory()
    after = _gpu_bytes_held()
    leaked = {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0) > LEAK_TOLERANCE_BYTES}
    if leaked:
        detail = ", ".join(f"{k}: {v / 2**20:.0f} MiB" for k, v in leaked.items())
        pytest.fail(f"{request.node.nodeid} left GPU memory allocated after it finished ({detail}); "
                    "free what the test allocates (del the tensors, or run it in a subprocess)", pytrace=False)
