"""Unified tensors as storage: deepcopy, clones, pickle and torch.save round trips; in-place view
ops; gathers into an overlapping output; sizes whose byte count overflows or exceeds memory."""

import copy
import io
import os
import pickle
import subprocess
import sys
import textwrap

import pytest
import torch

import pytorch_zerocopy as zc
from pytorch_zerocopy.unified import require_host_memory


def random_unified(shape, gen, dtype=torch.float32):
    host = torch.randn(shape, generator=gen).to(dtype) if dtype.is_floating_point else \
        torch.randint(-1000, 1000, shape, generator=gen, dtype=dtype)
    return host.to("unified"), host


def assert_own_bytes(a, b):
    """a and b are distinct unified tensors over distinct host bytes."""
    assert a.is_unified and b.is_unified
    assert a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr()


# --- storage on the unified device ------------------------------------------------------------


def test_untyped_storage_on_the_unified_device():
    s = torch.UntypedStorage(16, device=zc.unified_device())
    assert s.device.type == zc.DEVICE_TYPE and s.nbytes() == 16
    t = torch.empty(0, dtype=torch.int32, device=zc.unified_device()).set_(s)
    assert t.is_unified and t.shape == (4,)
    t.copy_(torch.tensor([3, 1, 4, 1], dtype=torch.int32))
    assert t.cpu().tolist() == [3, 1, 4, 1]
    with pytest.raises(RuntimeError, match="cannot be resized"):
        s.resize_(64)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bfloat16], ids=str)
def test_storage_clone_is_a_new_unified_allocation(dtype, gen, host_bytes):
    u, host = random_unified((7, 5), gen, dtype)
    clone = u.untyped_storage().clone()
    assert clone.device.type == zc.DEVICE_TYPE and clone.nbytes() == u.untyped_storage().nbytes()
    assert clone.data_ptr() != u.untyped_storage().data_ptr()
    back = torch.empty(0, dtype=dtype, device=zc.unified_device()).set_(clone, 0, (7, 5), (5, 1))
    assert torch.equal(host_bytes(back), host)


def test_deepcopy_gives_a_unified_tensor_with_its_own_bytes(gen, host_bytes):
    u, host = random_unified((9, 4), gen)
    expect = host.clone()
    v = copy.deepcopy(u)
    assert_own_bytes(u, v)
    assert v.shape == u.shape and v.stride() == u.stride() and v.dtype == u.dtype
    assert torch.equal(host_bytes(v), expect)
    v.add_(1.0)  # writes v's bytes (on the GPU, asynchronously), not u's
    assert torch.equal(host_bytes(v), expect + 1) and torch.equal(host_bytes(u), expect)


def test_deepcopy_keeps_views_and_sharing(gen, host_bytes):
    u, host = random_unified((6, 8), gen)
    view = u[1:5, ::2]
    a, b = copy.deepcopy([u, view])
    assert torch.equal(host_bytes(b), host[1:5, ::2]) and b.stride() == view.stride()
    assert a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()  # one storage, as before
    assert a.untyped_storage().data_ptr() != u.untyped_storage().data_ptr()


def test_deepcopy_of_a_module_with_a_unified_buffer(gen, host_bytes):
    m = torch.nn.Module()
    u, host = random_unified((5, 3), gen)
    m.register_buffer("table", u)
    m2 = copy.deepcopy(m)
    assert_own_bytes(m.table, m2.table)
    assert torch.equal(host_bytes(m2.table), host)


def test_pickle_round_trip(gen):
    u, host = random_unified((5, 6), gen)
    for t, ref in ((u, host), (u[1:4, 2:], host[1:4, 2:]), (u.t(), host.t())):
        back = pickle.loads(pickle.dumps(t))
        assert back.is_unified and back.shape == t.shape and back.stride() == t.stride()
        assert torch.equal(back.cpu(), ref)
        assert_own_bytes(back, t)


@pytest.mark.parametrize("weights_only", [True, False])
def test_torch_save_and_load_give_a_unified_tensor(weights_only, gen):
    u, host = random_unified((11, 3), gen)
    buf = io.BytesIO()
    torch.save({"table": u, "view": u[2:7], "plain": host.clone()}, buf)
    buf.seek(0)
    back = torch.load(buf, weights_only=weights_only)
    assert back["table"].is_unified and torch.equal(back["table"].cpu(), host)
    assert back["view"].is_unified and torch.equal(back["view"].cpu(), host[2:7])
    assert back["table"].untyped_storage().data_ptr() == back["view"].untyped_storage().data_ptr()
    assert_own_bytes(back["table"], u)
    assert back["plain"].device.type == "cpu"


def test_torch_load_onto_the_cpu(tmp_path, gen):
    u, host = random_unified((4, 4), gen)
    torch.save(u, tmp_path / "u.pt")
    back = torch.load(tmp_path / "u.pt", map_location="cpu")
    assert back.device.type == "cpu" and torch.equal(back, host)


def test_torch_load_without_the_package_says_how(tmp_path, gen):
    u, host = random_unified((3, 2), gen)
    torch.save(u, tmp_path / "u.pt")
    torch.save(host, tmp_path / "host.pt")
    script = textwrap.dedent(f"""
        import sys, torch
        path = {str(tmp_path / "u.pt")!r}
        try:
            torch.load(path)
            sys.exit("loaded a unified tensor without pytorch_zerocopy")
        except RuntimeError as e:
            assert "map_location" in str(e), e
        t = torch.load(path, map_location="cpu")
        assert torch.equal(t, torch.load({str(tmp_path / "host.pt")!r}))
        assert "pytorch_zerocopy" not in sys.modules
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


# --- in-place view ops ------------------------------------------------------------------------

IN_PLACE_VIEWS = {
    "t_": lambda t: t.t_(),
    "transpose_": lambda t: t.transpose_(0, 1),
    "swapdims_": lambda t: t.swapdims_(0, 1),
    "unsqueeze_": lambda t: t.unsqueeze_(1),
    "squeeze_": lambda t: t.unsqueeze(0).squeeze_(0),
    "as_strided_": lambda t: t.as_strided_((3, 2), (1, 3), 1),
    "resize_": lambda t: t.resize_(2, 2),
}


@pytest.mark.parametrize("op", list(IN_PLACE_VIEWS))
def test_in_place_view_ops_change_the_unified_tensor(op, gen):
    u, host = random_unified((3, 3), gen)
    ref = IN_PLACE_VIEWS[op](host.clone())
    got = IN_PLACE_VIEWS[op](u)
    assert got.is_unified
    assert (got.shape, got.stride(), got.storage_offset()) == (ref.shape, ref.stride(), ref.storage_offset())
    assert torch.equal(got.cpu(), ref)


def test_set_to_empty_and_to_another_unified_tensor(gen):
    u, host = random_unified((4, 2), gen)
    other, other_host = random_unified((3, 5), gen)
    u.set_(other)
    assert u.shape == (3, 5) and torch.equal(u.cpu(), other_host)
    u.set_()
    assert u.is_unified and u.numel() == 0
    with pytest.raises(ValueError, match="unified device"):
        u.set_(torch.empty(4).untyped_storage())
    with pytest.raises(ValueError, match="bytes"):
        torch.empty(0, device=zc.unified_device()).set_(other.untyped_storage(), 0, (100,), (1,))


# --- gather_rows into an output that overlaps its inputs ----------------------------------------


@pytest.mark.parametrize("where", ["cpu", "unified"])
def test_gather_rows_refuses_out_overlapping_the_table(where, gen):
    table = torch.randn(6, 4, generator=gen)
    table = table.to("unified") if where == "unified" else table
    idx = torch.tensor([1, 0])
    before = table.cpu().clone()
    with pytest.raises(ValueError, match="out overlaps table"):
        zc.gather_rows(table, idx, out=table[0:2])
    with pytest.raises(ValueError, match="out overlaps table"):
        zc.gather_rows(table, idx, out=table[4:6])  # the rows read are elsewhere; still refused
    assert torch.equal(table.cpu(), before)
    with pytest.raises(ValueError, match="out overlaps table"):
        torch.ops.zerocopy.gather_rows.out(table, idx, out=table[2:4])


def test_gather_rows_refuses_out_overlapping_the_index():
    buf = torch.tensor([[1], [0]], dtype=torch.int64)
    table = torch.arange(5, dtype=torch.int64).reshape(5, 1) * 7
    with pytest.raises(ValueError, match="out overlaps index"):
        zc.gather_rows(table, buf.view(-1), out=buf)


def test_gather_rows_into_a_separate_part_of_the_same_allocation(gen):
    # Out and table carved from one buffer without overlapping: allowed, and exact.
    whole = torch.randn(10, 3, generator=gen).to("unified")
    table, out = whole[:6], whole[6:9]
    out.fill_(float("nan"))
    idx = torch.tensor([5, 0, 3])
    zc.gather_rows(table, idx, out=out)
    assert torch.equal(out.cpu(), table.cpu()[idx])


# --- sizes: overflow, and more than the machine has ---------------------------------------------


@pytest.mark.parametrize("shape,dtype", [((2**61,), torch.float64), ((2**31, 2**31), torch.float32),
                                         ((2**62, 4), torch.uint8), ((3, 2**62), torch.int16),
                                         ((0, 2, 2**62), torch.float32), ((3, 2**63 - 1, 0), torch.int8)])
def test_sizes_whose_byte_count_overflows_are_refused(shape, dtype):
    with pytest.raises(ValueError, match="more than 2\\^63"):
        zc.empty_unified(shape, dtype)
    with pytest.raises(ValueError, match="more than 2\\^63"):
        torch.empty(shape, dtype=dtype, device=zc.unified_device())


def test_resize_whose_byte_count_overflows_is_refused():
    u = torch.zeros(4).to("unified")
    with pytest.raises(ValueError, match="more than 2\\^63"):
        u.resize_(2**62, 4)
    assert u.shape == (4,)


def test_more_than_the_machine_has_is_refused_before_allocating():
    free_shm = os.statvfs("/dev/shm").f_bavail * os.statvfs("/dev/shm").f_frsize
    nbytes = 1 << 62  # fits 63 bits; no machine has it
    with pytest.raises(torch.OutOfMemoryError, match=f"{nbytes} bytes") as info:
        zc.empty_unified((nbytes,), torch.uint8)
    assert "/dev/shm" in str(info.value) or "available" in str(info.value)
    assert free_shm < nbytes
    with pytest.raises(torch.OutOfMemoryError, match="available"):
        require_host_memory(1 << 62, "a test request")
    require_host_memory(4096, "a test request")  # a small request passes
