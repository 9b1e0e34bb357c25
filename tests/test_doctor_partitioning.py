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
