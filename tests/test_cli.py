"""The ``zerocopy`` command itself: what it says without a command, and what its help costs.
(``zerocopy train`` and its options: test_train.py.)"""

import subprocess
import sys
import textwrap

import pytest

from pytorch_zerocopy.cli import COMMANDS, main


def test_without_a_command_it_lists_the_commands_one_line_each(capsys):
    assert main([]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.splitlines()
    assert lines[0].startswith("usage: zerocopy") and lines[1] == "zerocopy: choose a command:"
    assert [line.split()[0] for line in lines[2:5]] == ["train", "doctor", "mps"] == list(COMMANDS)
    assert "train GraphSAGE" in lines[2] and "check this machine" in lines[3] and "MPS daemon" in lines[4]
    assert "the following arguments are required" not in err and "--help" in lines[5]


def test_mps_without_a_command_or_mps_says_what_to_do(capsys, monkeypatch):
    assert main(["mps"]) == 2
    assert "give the command to run after --" in capsys.readouterr().err
    monkeypatch.setenv("PATH", "/nonexistent")
    assert main(["mps", "--", "true"]) == 1
    assert "needs CUDA MPS" in capsys.readouterr().err


HELP_IMPORTS = textwrap.dedent("""
    import contextlib, io, sys
    import pytorch_zerocopy.cli as cli
    before = set(sys.modules)
    for argv in ([], ["--help"], ["demo"]):
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            try:
                cli.main(argv)
            except SystemExit:
                pass
    print(" ".join(sorted(set(sys.modules) - before)))
""")


def test_help_and_a_bare_command_import_no_command_module():
    """'zerocopy', 'zerocopy --help' and a mistyped command import nothing of train, the
    pipeline or doctor (nor anything they import): only 'zerocopy train ...' does."""
    out = subprocess.run([sys.executable, "-c", HELP_IMPORTS], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    imported = out.stdout.split()
    assert not [m for m in imported if m.startswith(("pytorch_zerocopy.", "torch_geometric"))], imported


def test_a_command_help_completes_its_options_on_demand(capsys):
    with pytest.raises(SystemExit) as info:
        main(["doctor", "--help"])
    assert info.value.code == 0 and "--seconds SECONDS" in capsys.readouterr().out
    with pytest.raises(SystemExit) as info:
        main(["train", "--help"])
    assert info.value.code == 0 and "--batch-size" in capsys.readouterr().out


def test_train_help_explains_the_modes_and_where_the_cache_lives(capsys):
    from pytorch_zerocopy.pipeline.plan import gpu_available

    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split("options:", 1)[1].split())
    assert "zerocopy-naive (the trainer's GPU reads its rows in place with index_select" in text
    cache = text.split("--cache SIZE", 1)[1].split("--cache-policy", 1)[0]
    where = "GPU memory:" if gpu_available() else "host memory (no GPU here; GPU memory on a GPU):"
    assert f"keep the hottest feature rows in {where}" in cache, cache
    assert "(default: )" not in text and "--rdzv-id RDZV_ID job id shared by the machines' launchers --seed" in text
