"""``zerocopy doctor``'s GPU-partitioning lines recommend only what this machine can use."""

import torch

from pytorch_zerocopy import doctor


def test_no_partitioning_advice_without_a_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    checks = doctor.check_partitioning()
    assert [c.status for c in checks] == ["OK"]
    text = " ".join(c.detail for c in checks)
    assert "green" not in text and "mps" not in text.lower()
    assert "no CUDA GPU" in text


def test_green_contexts_recommended_only_where_torch_has_them(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(doctor.shutil, "which", lambda name: None)  # no MPS binaries
    green_module = getattr(torch.cuda, "green_contexts", None)
    if green_module is not None:
        monkeypatch.delattr(green_module, "GreenContext", raising=False)
    mps = next(c for c in doctor.check_partitioning() if c.name == "CUDA MPS")
    assert mps.status == "WARN" and "green" not in mps.detail


def test_numa_lines_name_each_gpus_node(monkeypatch, tmp_path):
    """Each GPU's NUMA node is read from sysfs through its PCI address; GPUs on different nodes
    of a multi-node host get the placement a job makes of them."""
    from pytorch_zerocopy import doctor, numa

    assert numa.pci_sysfs_address("00000000:1B:00.0") == "0000:1b:00.0"
    for address, node in (("0000:1b:00.0", "0"), ("0000:9c:00.0", "1")):
        (tmp_path / address).mkdir()
        (tmp_path / address / "numa_node").write_text(node + "\n")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(numa, "nvidia_smi", lambda args: "0, GPU-aaaa, 00000000:1B:00.0\n1, GPU-bbbb, 00000000:9C:00.0")
    monkeypatch.setattr(numa, "memory_nodes", lambda root=None: [0, 1])
    lines = [c.line() for c in doctor.check_numa(str(tmp_path))]
    assert any("NUMA GPU 0" in line and "node 0" in line for line in lines)
    assert any("NUMA GPU 1" in line and "node 1" in line for line in lines)
    assert any(line.startswith("OK") and "interleaves" in line and "nodes 0, 1" in line for line in lines)
    monkeypatch.setattr(numa, "memory_nodes", lambda root=None: [0])
    assert not any("interleaves" in c.line() for c in doctor.check_numa(str(tmp_path)))
    monkeypatch.setattr(numa, "nvidia_smi", lambda args: "")
    assert doctor.check_numa(str(tmp_path)) == []
