"""``zerocopy doctor``'s build lines: the build it reports is the one installed, and a
benchmark-only build without the traversal guards is flagged."""

from pytorch_zerocopy import build_info, doctor


def test_build_info_records_the_guards():
    info = build_info()
    assert info["unguarded_traversal"] in (True, False)
    if not info["with_cuda"]:
        assert info["unguarded_traversal"] is False  # the flag only changes the CUDA kernels


def test_doctor_warns_about_an_unguarded_build(monkeypatch):
    real = build_info()
    if not real["unguarded_traversal"]:
        assert not any("ZEROCOPY_UNGUARDED_TRAVERSAL" in c.detail for c in doctor.check_build())
    monkeypatch.setattr(doctor, "build_info", lambda: dict(real, unguarded_traversal=True))
    warned = [c for c in doctor.check_build() if "ZEROCOPY_UNGUARDED_TRAVERSAL" in c.detail]
    assert len(warned) == 1 and warned[0].status == "WARN"


def test_guard_overhead_builds_this_tree_with_setup_pys_switch():
    """benchmarks/guard_overhead.py copies what setup.py builds from and sets setup.py's own
    switch: a renamed source folder or flag would leave it building a tree that is not this one."""
    import os
    import re

    from benchmarks import guard_overhead

    root = guard_overhead.ROOT
    assert all(os.path.exists(os.path.join(root, name)) for name in guard_overhead.SOURCES)
    with open(os.path.join(root, "setup.py")) as f:
        setup = f.read()
    assert re.search(rf'UNGUARDED_FLAG = "{guard_overhead.UNGUARDED_FLAG}"', setup)
    with open(os.path.join(root, "csrc", "cuda", "traversal_common.cuh")) as f:
        assert f"#ifdef {guard_overhead.UNGUARDED_FLAG}" in f.read()
