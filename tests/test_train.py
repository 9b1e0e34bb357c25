"""``zerocopy train``: mode configuration, argument errors, and a short CPU run through the CLI."""

import re
import subprocess
import sys

import pytest
import torch  # noqa: F401 - used by the skipif condition strings

from pytorch_zerocopy.cli import main
from pytorch_zerocopy.pipeline import GatherIn, Mode, PlanError, SampleOn, make_plan
from pytorch_zerocopy.pipeline.plan import gpu_available
from pytorch_zerocopy.train import MODES

# A string condition is evaluated when tests are collected, not when this module is imported.
needs_no_gpu = pytest.mark.skipif("torch.cuda.is_available()", reason="checks the no-GPU behaviour")


def test_mode_configurations_on_this_machine():
    cpu = make_plan("cpu")
    assert (cpu.device, cpu.mode, cpu.gather_in, cpu.sample_on) == ("cpu", Mode.CPU, GatherIn.TRAINER, SampleOn.CPU)
    zc = make_plan("zerocopy", fanouts=(3,))
    assert zc.mode is Mode.ZEROCOPY and zc.gather_in is GatherIn.PRODUCER and zc.fanouts == (3,)
    assert zc.device == ("cuda:0" if gpu_available() else "cpu")
    assert zc.sample_on is (SampleOn.GPU if gpu_available() else SampleOn.CPU)
    with pytest.raises(PlanError, match="mode must be one of"):
        make_plan("warp-drive")
    with pytest.raises(PlanError, match="partition must be one of"):
        make_plan("zerocopy", partition="halves")


@needs_no_gpu
@pytest.mark.parametrize("mode", ["dma", "zerocopy-naive", "gpu"])
def test_gpu_modes_explain_themselves_without_a_gpu(mode, capsys):
    with pytest.raises(PlanError, match="needs a CUDA GPU"):
        make_plan(mode)
    assert main(["train", "--mode", mode, "--dataset", "papers-like:1k", "--epochs", "1"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


@needs_no_gpu
def test_partitions_need_a_gpu():
    for partition in ("mps", "green"):
        with pytest.raises(PlanError, match="needs a CUDA GPU"):
            make_plan("zerocopy", partition=partition)


BAD_SETTINGS = [
    (["--batch-size", "0"], "--batch-size must be >= 1, got 0"),
    (["--batch-size", "-4"], "--batch-size must be >= 1"),
    (["--hidden", "0"], "--hidden must be >= 1, got 0"),
    (["--hidden", "-5"], "--hidden must be >= 1, got -5"),
    (["--feature-dim", "0"], "--feature-dim must be a positive int, got 0"),
    (["--feature-dim", "-1", "--dataset", "papers-like:1k"], "--feature-dim must be a positive int"),
    (["--dataset", "no-such-dataset"], "unknown dataset 'no-such-dataset'"),
    (["--dataset", "papers-like:lots"], "NODES must be a positive whole number"),
    (["--dataset", "papers-like"], "papers-like:NODES[:DEGREE]"),
    (["--dataset", "papers-like:1000B"], "GiB of shared memory, but /dev/shm has"),
    (["--epochs", "0"], "--epochs must be >= 1"),
    (["--max-batches", "0"], "--max-batches must be None or >= 1"),
    (["--samplers", "0", "--sample-on", "cpu"], "--samplers must be >= 1"),
    (["--producer-share", "100"], "--producer-share must be in (0, 100)"),
    (["--producer-share", "0"], "--producer-share must be in (0, 100)"),
    (["--producer-sms", "0"], "--producer-sms must be >= 1"),
    (["--gather-batches", "0"], "--gather-batches must be >= 1"),
    (["--fanouts", "ten,5"], "--fanouts must be comma-separated integers"),
    (["--fanouts", "0,5"], "--fanouts must be one positive fanout"),
    (["--fanouts", ","], "--fanouts must be one positive fanout"),
    (["--seed", "-1"], "--seed must be >= 0"),
    (["--gpus", "0"], "--gpus must be >= 1, got 0"),
    (["--cache", "lots"], "--cache must be a share of the table ('10%'), a size"),
    (["--cache", "150%"], "--cache must be a share in (0%, 100%]"),
    (["--cache", "0"], "--cache must be a share of the table"),
    (["--cache", "10%", "--mode", "cpu"], "--cache applies to mode 'zerocopy' only"),
    (["--cache-policy", "degree"], "--cache-policy applies to a cache: give --cache SIZE too"),
    (["--host-memory", "managed", "--mode", "cpu"], "--host-memory must be 'cpu' for mode 'cpu'"),
    (["--cache", "none", "--cache-policy", "degree"], "--cache-policy applies to a cache, not to --cache none"),
    (["--gather-in", "machine-reads", "--mode", "cpu"], "--gather-in 'machine-reads' (one process of the machine"),
]


@pytest.mark.parametrize("argv, message", BAD_SETTINGS, ids=[" ".join(a) for a, _ in BAD_SETTINGS])
def test_bad_settings_get_one_line_and_status_2(argv, message, capsys):
    """Every bad setting ends ``zerocopy train`` with one line naming the flag and status 2,
    before any dataset is loaded or process started."""
    assert main(["train"] + argv) == 2
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and err.startswith("zerocopy train: ") and message in err, err
    assert "Traceback" not in err and "dataset " not in out


def test_bad_arguments(capsys):
    assert main(["train", "--nnodes", "2", "--max-batches", "1", "--epochs", "1"]) == 2
    assert "rdzv-endpoint" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["train", "--mode", "bogus"])


def test_train_cli_runs_the_cpu_path():
    """A short run through ``python -m pytorch_zerocopy train``: what trains where, per-epoch
    lines with loss and validation accuracy (and the trace with ``--trace``), test accuracy at
    the end, and the CPU path announced when there is no GPU."""
    cmd = [sys.executable, "-m", "pytorch_zerocopy", "train", "--mode", "cpu", "--dataset", "papers-like:4k:6",
           "--feature-dim", "32", "--epochs", "2", "--batch-size", "16", "--fanouts", "4,4", "--hidden", "32",
           "--trace"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    stdout = out.stdout
    assert "training GraphSAGE (2 layers, hidden 32) on papers-like" in stdout
    assert "mode cpu: sampling on the CPU in 1 sampler process, gathering on the CPU in the trainer process, " \
           "training on cpu" in stdout
    assert "feature rows were read" in stdout  # the legend of the epoch lines
    # papers-like:4k:6 with 32 float32 features: 4,000 x 128 B, in the CPU path's host memory
    (table,) = [l for l in stdout.splitlines() if l.startswith("feature table: ")]
    assert re.fullmatch(r"feature table: 500\.0 KiB in host memory read by the CPU, ready in \d+\.\d s", table), table
    lines = [l for l in stdout.splitlines() if l.startswith("epoch ")]
    assert len(lines) == 2
    for line in lines:
        assert "training minibatches in" in line and "feature rows read at" in line and "GB/s" in line
        assert "loss" in line and "val acc" in line and "cache" not in line
    traces = [l for l in stdout.splitlines() if l.startswith("  trace: ms per minibatch, p50/p90: ")]
    assert len(traces) == 2 and all("host issue" in t and "sample" in t and "gather" in t for t in traces)
    test_lines = [l for l in stdout.splitlines() if l.startswith("test accuracy ")]
    assert len(test_lines) == 1 and test_lines[0].endswith(" test nodes")
    assert 0.0 <= float(test_lines[0].split()[2]) <= 1.0
    if not gpu_available():
        assert "No CUDA GPU available" in stdout
    assert set(MODES) == {"cpu", "dma", "zerocopy-naive", "zerocopy", "gpu"}


def test_train_cli_reads_rows_through_the_machines_gatherer():
    """``--gather-in machine-reads``: the producer samples and fills the ring, the machine's
    gatherer process reads its rows; the run trains and says where each stage runs."""
    cmd = [sys.executable, "-m", "pytorch_zerocopy", "train", "--dataset", "papers-like:4k:6", "--feature-dim", "16",
           "--epochs", "1", "--batch-size", "16", "--fanouts", "4,4", "--hidden", "16", "--gather-in", "machine-reads",
           "--partition", "none"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "its rows read by the machine's gatherer process" in out.stdout
    assert len([l for l in out.stdout.splitlines() if l.startswith("epoch ")]) == 1
    assert "test accuracy " in out.stdout


def test_train_cli_with_a_cache_reports_its_hits():
    """``--cache 20%`` on the zerocopy pipeline (a host-memory cache without a GPU, the same
    code path): the rows chosen are announced, and each epoch line gives the share of input
    rows the cache held."""
    cmd = [sys.executable, "-m", "pytorch_zerocopy", "train", "--dataset", "papers-like:4k:6", "--feature-dim", "16",
           "--epochs", "1", "--batch-size", "16", "--fanouts", "4,4", "--hidden", "16", "--cache", "20%",
           "--cache-policy", "degree", "--partition", "none"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "cache: 800 of 4,000 rows" in out.stdout and "chosen by degree" in out.stdout
    assert "cache of 20% of the rows (degree)" in out.stdout
    (line,) = [l for l in out.stdout.splitlines() if l.startswith("epoch ")]
    share = float(line.split("cache held ")[1].split("%")[0])
    assert 20 < share < 100


def test_help_shows_every_default_and_no_markup():
    from pytorch_zerocopy.cli import build_parser

    parser = build_parser()
    top = parser.format_help()
    assert "``" not in top and "train GraphSAGE" in top and "doctor" in top and "demo" not in top
    train = parser._subparsers._group_actions[0].choices["train"]
    text = train.format_help()
    for action in train._actions:
        if action.dest == "help":
            continue
        assert action.help, f"{action.option_strings} has no help"
    shown = [a for a in train._actions if a.dest != "help" and (a.default not in (None, "") or "(default" in a.help)]
    assert text.count("(default:") == len(shown)  # every flag with a default, once
    assert "(default: )" not in text and "(default: None)" not in text
    assert "(default: 1024)" in text and "--cache SIZE" in text and "--trace" in text
    with pytest.raises(SystemExit):
        main(["demo"])


def _is_role(child) -> bool:
    """A live pipeline process (not multiprocessing's resource tracker, nor a short-lived
    helper that has already exited)."""
    import psutil

    try:
        return child.status() != psutil.STATUS_ZOMBIE and "resource_tracker" not in " ".join(child.cmdline())
    except psutil.Error:
        return False


def test_ctrl_c_stops_every_process():
    """SIGINT to ``zerocopy train`` (what Ctrl-C sends) ends it with status 130 within seconds,
    and no pipeline process survives."""
    import signal
    import time

    import psutil

    cmd = [sys.executable, "-m", "pytorch_zerocopy", "train", "--dataset", "papers-like:20k:6", "--feature-dim", "16",
           "--epochs", "1000", "--batch-size", "64", "--fanouts", "3,3", "--hidden", "16"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        parent = psutil.Process(proc.pid)
        deadline = time.monotonic() + 90
        # A producer and a trainer, and a sampler process unless the producer samples on the GPU.
        wanted = 2 if gpu_available() else 3
        roles = []
        while time.monotonic() < deadline and proc.poll() is None:
            roles = [c for c in parent.children() if _is_role(c)]
            if len(roles) >= wanted:
                break
            time.sleep(0.2)
        assert len(roles) >= wanted, "the pipeline did not start"
        time.sleep(1.0)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "interrupted" in err
    _, alive = psutil.wait_procs(roles, timeout=5)
    assert alive == []


def test_gather_batches_bring_their_ring_slots():
    """Asking for N minibatches per gather gives the ring 2N slots (unless num_slots is given),
    and the epochs say how many per gather were configured."""
    from pytorch_zerocopy.datasets import community_graph
    from pytorch_zerocopy.train import train

    ds = community_graph(num_nodes=4000, feature_dim=16, seed=1)
    epochs = train(ds, "zerocopy", epochs=1, max_batches=2, batch_size=256, quiet=True, gather_batches=3)
    assert epochs[-1].gather_batches == 3
    with pytest.raises(PlanError, match="num_slots"):
        train(ds, "zerocopy", epochs=1, max_batches=2, batch_size=256, quiet=True, gather_batches=3, num_slots=4)
