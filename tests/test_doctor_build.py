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
