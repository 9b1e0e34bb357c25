"""The unified device: creation in place, ops through the mapping, views, copies, lifetime."""

import pytest
import torch
import torch.nn.functional as F

import pytorch_zerocopy as zc

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.int8, torch.int64]


def compute_device() -> torch.device:
    """Where ops on unified tensors run on this machine."""
    return torch.device("cuda", torch.cuda.current_device()) if zc.gpu_backed() else torch.device("cpu")


def random_tensor(shape, dtype, gen):
    if dtype.is_floating_point:
        return torch.randn(shape, generator=gen).to(dtype)
    info = torch.iinfo(dtype)
    return torch.randint(max(info.min, -100), min(info.max, 100), shape, generator=gen, dtype=dtype)


def test_unified_device_names():
    assert zc.unified_device().type == zc.DEVICE_TYPE
    assert zc.unified_device(0).index == 0
    u = torch.randn(3).to("unified:0")
    assert u.is_unified and u.device.index == 0
    with pytest.raises(ValueError, match="invalid unified device"):
        torch.randn(3).to("unified:x")


def test_cuda_autograd_is_not_disturbed_by_the_unified_device():
    # A renamed PrivateUse1 backend becomes torch's accelerator and breaks CUDA backward
    # (pytorch/pytorch#161129): the unified device must leave torch's accelerator alone.
    acc = torch.accelerator.current_accelerator()
    assert acc is None or acc.type == "cuda"
    dev = compute_device()
    w = torch.randn(4, 4, device=dev, requires_grad=True)
    u = torch.randn(4, 4).to("unified")
    (w * u).sum().backward()
    torch.testing.assert_close(w.grad.cpu(), u.cpu())


def test_to_unified_maps_in_place(gen):
    x = torch.randn(64, 33, generator=gen)
    u = x.to("unified")
    assert u.device.type == zc.DEVICE_TYPE and u.is_unified
    assert u.shape == x.shape and u.stride() == x.stride() and u.dtype == x.dtype
    assert u.data_ptr() == x.data_ptr(), "to('unified') must not copy"
    host = u.cpu()
    assert host.data_ptr() == x.data_ptr(), "cpu() of a unified tensor must not copy"
    assert torch.equal(host, x)


def test_to_unified_keeps_views_in_place(gen):
    base = torch.randn(10, 8, generator=gen)
    view = base[2:7, 1::2]
    u = view.to("unified")
    assert u.data_ptr() == view.data_ptr()
    assert u.stride() == view.stride() and u.storage_offset() == view.storage_offset()
    assert torch.equal(u.cpu(), view)


def test_paper_listing_1(gen):
    input_tensor = torch.randn([100], device="cpu", generator=gen)
    device = compute_device()
    gpu_tensor = input_tensor.to(device=device)
    unified_tensor = input_tensor.to(device="unified")
    output = gpu_tensor + unified_tensor
    assert output.device == device
    torch.testing.assert_close(output.cpu(), input_tensor * 2)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_ops_match_the_compute_device(dtype, gen):
    dev = compute_device()
    x = random_tensor((50, 24), dtype, gen)
    u = x.to("unified")
    ref = x.to(dev)
    idx = torch.randint(0, 50, (37,), generator=gen).to(dev)
    other = random_tensor((50, 24), dtype, gen).to(dev)

    cases = {
        "add": (lambda t: other + t),
        "index": (lambda t: t[idx]),
        "index_select": (lambda t: torch.index_select(t, 0, idx)),
        "slice_then_mul": (lambda t: t[3:40:3] * 2),
        "transpose_sum": (lambda t: t.t().sum(dim=1)),
        "view_then_mul": (lambda t: t.reshape(24, 50)[5] * 3),
        "non_contiguous_add": (lambda t: t[:, ::2] + t[:, 1::2]),
        "max": (lambda t: t.max(dim=0).values),
    }
    if dtype.is_floating_point:
        cases["embedding"] = lambda t: F.embedding(idx, t)
    for name, fn in cases.items():
        got, want = fn(u), fn(ref)
        assert got.device == dev, f"{name}: result on {got.device}, expected {dev}"
        torch.testing.assert_close(got, want, rtol=0, atol=0, msg=lambda m: f"{name}: {m}")


def test_views_stay_unified(gen):
    u = torch.randn(6, 10, generator=gen).to("unified")
    for view in (u[1:4], u[2], u.t(), u.view(60), u.reshape(3, 20), u.narrow(1, 2, 5),
                 u.unsqueeze(0), u.expand(2, 6, 10), u.permute(1, 0), u.unfold(1, 2, 2)):
        assert view.device.type == zc.DEVICE_TYPE, view.shape
        assert view.cpu().data_ptr() == u.cpu().data_ptr() + view.storage_offset() * 4 - u.storage_offset() * 4


def test_in_place_ops_write_host_memory(gen, host_bytes):
    # host_bytes(u) waits for the GPU's writes and is x itself.
    x = torch.randn(5, 7, generator=gen)
    expect = x + 1.5
    u = x.to("unified")
    r = u.add_(1.5)
    assert r is u, "an in-place op must return the unified tensor itself"
    assert host_bytes(u).data_ptr() == x.data_ptr()
    torch.testing.assert_close(x, expect)
    u[2].fill_(-3.0)
    assert torch.all(host_bytes(u)[2] == -3.0) and torch.all(x[2] == -3.0)
    src = torch.randn(5, 7, generator=gen).to(compute_device())
    u.copy_(src)
    torch.testing.assert_close(host_bytes(u), src.cpu())


def test_out_variant_into_unified(gen, host_bytes):
    x = torch.full((4, 4), float("nan"))
    u = x.to("unified")
    a = torch.randn(4, 4, generator=gen).to(compute_device())
    r = torch.mul(a, 2, out=u)
    assert r is u
    assert host_bytes(u).data_ptr() == x.data_ptr()
    torch.testing.assert_close(x, a.cpu() * 2)


def test_to_cuda_copies_and_to_cpu_aliases(gen, host_bytes):
    x = torch.randn(8, 3, generator=gen)
    u = x.to("unified")
    assert u.to("cpu").data_ptr() == x.data_ptr()
    converted = u.to(torch.float64)
    assert converted.device.type == zc.DEVICE_TYPE and converted.dtype == torch.float64
    torch.testing.assert_close(host_bytes(converted), x.double())
    assert converted.cpu().data_ptr() != x.data_ptr()


@pytest.mark.cuda
def test_to_cuda_is_a_device_copy(gen):
    x = torch.randn(8, 3, generator=gen)
    u = x.to("unified")
    c = u.to("cuda")
    assert c.device.type == "cuda"
    x.add_(100)  # the GPU copy must not see later host writes
    torch.testing.assert_close(c.cpu(), x - 100)


def test_factories_on_the_unified_device(gen, host_bytes):
    z = torch.zeros(3, 5, device=zc.unified_device())
    assert z.device.type == zc.DEVICE_TYPE and torch.equal(host_bytes(z), torch.zeros(3, 5))
    assert z.cpu().is_shared(), "new unified tensors live in shared memory"
    e = zc.empty_unified((7, 2), torch.int32)
    assert e.dtype == torch.int32 and e.shape == (7, 2) and e.is_unified
    e.cpu().copy_(torch.arange(14, dtype=torch.int32).view(7, 2))
    assert int(e.sum()) == sum(range(14))
    assert zc.empty_unified(0).numel() == 0


def test_clone_and_like_stay_on_the_unified_device(gen, host_bytes):
    u = torch.randn(4, 3, generator=gen).to("unified")
    c = u.clone()
    assert c.device.type == zc.DEVICE_TYPE and c.cpu().data_ptr() != u.cpu().data_ptr()
    torch.testing.assert_close(host_bytes(c), u.cpu())
    assert torch.zeros_like(u).device.type == zc.DEVICE_TYPE


def test_printing_and_item(gen):
    u = torch.tensor([1.5, -2.0]).to("unified")
    assert zc.DEVICE_TYPE in repr(u)
    assert u[0].item() == 1.5


def test_load_unified_from_npy(tmp_path, gen):
    np = pytest.importorskip("numpy")
    data = torch.randn(1000, 17, generator=gen).numpy()
    path = tmp_path / "features.npy"
    np.save(path, data)
    u = zc.load_unified(path, chunk_bytes=4096)  # many chunks
    assert u.is_unified and u.shape == (1000, 17) and u.dtype == torch.float32
    assert torch.equal(u.cpu(), torch.from_numpy(data))
    assert u.cpu().is_shared()


def test_load_unified_rejects_unsupported_dtype(tmp_path):
    np = pytest.importorskip("numpy")
    path = tmp_path / "c.npy"
    np.save(path, np.zeros(4, dtype=np.complex64) + 1j)
    with pytest.raises(TypeError, match="unsupported dtype"):
        zc.load_unified(path)


@pytest.mark.parametrize("name, content, says", [
    ("table.csv", b"a,b\n1,2\n", "is not a NumPy .npy file (it does not start with the .npy header)"),
    ("table.npy", b"\x00" * 64, "is not a NumPy .npy file"),
    ("table.npz", None, "is an .npz archive, not a NumPy .npy file"),
    ("objects.npy", None, "unsupported dtype object"),
])
def test_load_unified_says_what_a_file_is_not_and_what_it_expects(tmp_path, name, content, says):
    np = pytest.importorskip("numpy")
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    elif name.endswith(".npz"):
        np.savez(path, features=np.ones((2, 3), dtype=np.float32))
    else:
        np.save(path, np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    with pytest.raises((ValueError, TypeError)) as info:
        zc.load_unified(path)
    message = str(info.value)
    assert message.startswith(f"load_unified: {path}") and says in message, message
    assert "expected" in message and "pickle" not in message and "\n" not in message, message


def test_bad_inputs_give_clear_errors():
    with pytest.raises(ValueError, match="negative dimension"):
        zc.empty_unified((3, -1))
    u = torch.randn(4).to("unified")
    with pytest.raises(RuntimeError, match="cannot grow"):
        u.resize_(100)
    with pytest.raises(TypeError):
        zc.to_unified([1, 2, 3])


def test_too_large_for_dev_shm_is_an_error_not_a_crash():
    import os

    st = os.statvfs("/dev/shm")
    too_big = (st.f_blocks * st.f_frsize) * 2 // 1 + (1 << 30)
    with pytest.raises(RuntimeError, match="/dev/shm"):
        zc.empty_unified(too_big, torch.uint8)


def test_a_unified_index_past_the_devices_is_an_error_on_every_path():
    """'unified:N' names GPU N; without a GPU serving unified tensors the one unified device is
    unified:0. Any other index is refused, naming the index and how many devices there are,
    however the tensor is made (not made silently as privateuseone:N)."""
    count = torch.cuda.device_count() if zc.gpu_backed() else 1
    bad = count + 4
    makers = {"Tensor.to('unified:N')": lambda: torch.randn(3).to(f"unified:{bad}"),
              "Tensor.to(device)": lambda: torch.randn(3).to(zc.unified_device(bad)),
              "torch.empty": lambda: torch.empty(3, device=zc.unified_device(bad)),
              "to_unified": lambda: zc.to_unified(torch.randn(3), bad),
              "empty_unified": lambda: zc.empty_unified(3, device=bad),
              "unified -> unified:N": lambda: torch.randn(3).to("unified").to(f"unified:{bad}")}
    if zc.gpu_backed():  # a factory on a missing GPU may meet CUDA's own device check first
        del makers["torch.empty"], makers["unified -> unified:N"]
    for name, make in makers.items():
        with pytest.raises(ValueError) as info:
            make()
        message = str(info.value).splitlines()[0]
        if zc.gpu_backed():
            assert message == f"unified:{bad} names a GPU that does not exist: this machine has {count} GPU(s)", name
        else:
            assert message == (f"unified:{bad} does not exist: no GPU serves unified tensors here, so there is 1 "
                               "unified device, unified:0 ('unified')"), (name, message)
    for good in ("unified", "unified:0", f"unified:{count - 1}"):
        assert torch.randn(3).to(good).is_unified


def test_negative_indices_count_from_the_end_in_u_idx_only(gen):
    """One rule, torch's: tensor indexing ``u[idx]`` counts a negative index from the end;
    gather_rows (the raw op), index_select and embedding take indices in [0, rows) only."""
    table = torch.randn(6, 4, generator=gen)
    u = table.to("unified")
    idx = torch.tensor([-1, 2, -6])
    assert torch.equal(u[idx].cpu(), table[idx]) and torch.equal(u[idx].cpu()[0], table[5])
    with pytest.raises(IndexError, match="-7"):
        u[torch.tensor([-7])]
    refusals = {"gather_rows(unified)": lambda: zc.gather_rows(u, idx),
                "gather_rows(cpu)": lambda: zc.gather_rows(table, idx),
                "index_select": lambda: torch.index_select(u, 0, idx),
                "embedding": lambda: F.embedding(idx, u)}
    for name, op in refusals.items():
        with pytest.raises(IndexError, match=r"index -1 at position 0 is out of bounds for a table with 6 rows"):
            op()
    with pytest.raises(IndexError):  # torch's own CPU index_select: the same rule
        torch.index_select(table, 0, idx)


def test_registration_released_and_reacquired_100_times(gen):
    x = torch.randn(1 << 16, generator=gen)
    base = zc.registration_stats()["live_pieces"]
    expect = float(x.sum())
    for _ in range(100):
        u = x.to("unified")
        assert abs(float(u.sum()) - expect) < 1e-2
        if zc.gpu_backed():
            assert zc.registration_stats()["live_pieces"] > base
        del u
        assert zc.registration_stats()["live_pieces"] == base


def test_overlapping_tensors_share_one_registration(gen):
    base = zc.registration_stats()["live_pieces"]
    x = torch.randn(4096, generator=gen)
    a = x[:100].to("unified")
    b = x[50:].to("unified")
    c = x.to("unified")
    torch.testing.assert_close((a.sum() + b.sum()).cpu(), (x[:100].sum() + x[50:].sum()))
    assert torch.equal(c.cpu(), x)
    if zc.gpu_backed():
        assert zc.registration_stats()["live_pieces"] >= base + 1
    del a, b, c
    assert zc.registration_stats()["live_pieces"] == base


def test_views_keep_the_registration_alive(gen):
    x = torch.randn(100, generator=gen)
    u = x.to("unified")
    v = u[10:20]
    del u
    torch.testing.assert_close(v.cpu(), x[10:20])
    torch.testing.assert_close((v * 1).cpu(), x[10:20])


@pytest.mark.cuda
def test_memory_not_released_under_a_running_kernel(gen):
    x = zc.empty_shared((1 << 22,), torch.float32)
    x.copy_(torch.randn(1 << 22, generator=gen))
    expect = float(x.double().sum())
    u = x.to("unified")
    torch.cuda._sleep(200_000_000)  # keep the stream busy well past the release below
    total = u.double().sum()
    base = zc.registration_stats()["live_pieces"] - 1
    del u, x  # last references: the release must wait for the queued sum
    torch.cuda.synchronize()
    assert abs(float(total) - expect) < 1e-3 * max(1.0, abs(expect))
    assert zc.registration_stats()["live_pieces"] == base


@pytest.mark.cuda
def test_pin_memory_still_works_after_import(gen):
    x = torch.randn(16, generator=gen)
    p = x.pin_memory()
    assert p.is_pinned() and torch.equal(p, x)


def test_sparse_to_unified_is_an_error_not_a_crash():
    import subprocess
    import sys

    script = (
        "import torch, pytorch_zerocopy\n"
        "try:\n"
        "    torch.eye(3).to_sparse().to('unified')\n"
        "except (RuntimeError, ValueError, NotImplementedError) as e:\n"
        "    print('error:', str(e).splitlines()[0])\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"crashed with {proc.returncode}: {proc.stderr[-2000:]}"
    assert proc.stdout.startswith("error:"), proc.stdout


def test_small_neighbouring_tensors_and_pageable_copies(gen):
    # Small tensors from the CPU allocator share pages; each maps on its own, and pageable
    # memory next to a mapped range still copies to the GPU as usual.
    tensors = [torch.randn(100, generator=gen) for _ in range(8)]
    unified = [t.to("unified") for t in tensors]
    neighbours = [torch.randn(300, generator=gen) for _ in range(8)]
    dev = compute_device()
    for t, u, n in zip(tensors, unified, neighbours):
        torch.testing.assert_close((u * 2).cpu(), t * 2)
        torch.testing.assert_close(n.to(dev).cpu(), n)


@pytest.mark.cuda
def test_cpu_waits_for_queued_writes():
    """u.cpu() returns the host bytes after the writes queued on the current stream, as a CUDA
    tensor's .cpu() does; non_blocking=True does not wait."""
    u = zc.empty_unified((64 << 20,), torch.float32)  # 256 MiB: several ms of writes over PCIe
    try:
        for value in (1.0, 2.0, 3.0):
            u.fill_(value)
            host = u.cpu()
            assert host.data_ptr() == u.data_ptr()
            # The last bytes first: the fill reaches them last.
            assert float(host[-1]) == value, "u.cpu() read bytes before the queued fill finished"
            assert bool((host == value).all())
        u.fill_(4.0)
        early = u.to("cpu", non_blocking=True)
        assert early.data_ptr() == u.data_ptr()
        torch.cuda.synchronize()
        assert bool((early == 4.0).all())
    finally:
        torch.cuda.synchronize()
        del u
