"""Every script in examples/ runs (at a small size), and the README's unified-tensor snippet runs
as written: on the CPU here, on the GPU where there is one."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def run(args, timeout=300) -> str:
    """The script's stdout and stderr (progress bars go to stderr)."""
    r = subprocess.run([sys.executable] + [str(a) for a in args], cwd=ROOT, capture_output=True, text=True,
                       timeout=timeout)
    assert r.returncode == 0, f"{args} failed:\n{r.stdout}\n{r.stderr}"
    return r.stdout + r.stderr


def readme_snippet(section: str) -> str:
    text = (ROOT / "README.md").read_text()
    body = text.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", body, flags=re.S)
    assert blocks, f"no python block under '## {section}' in README.md"
    return blocks[0]


def test_readme_unified_tensor_snippet_runs_as_written():
    code = readme_snippet("Unified tensors")
    check = ("\nimport torch\n"
             "assert torch.equal(output.cpu(), 2 * input_tensor), 'wrong sum'\n"
             "assert unified_tensor.cpu().data_ptr() == input_tensor.data_ptr(), 'unified must not copy'\n"
             "print(output.device)\n")
    out = run(["-c", code + check], timeout=120)
    assert out.strip().splitlines()[-1] == ("cuda:0" if _cuda() else "cpu")


def test_readme_describes_the_last_lines_of_a_test_run(tmp_path):
    """The README says which line counts the skips: check it against a run with a skip."""
    (tmp_path / "test_one.py").write_text("import pytest\n\ndef test_a():\n    pass\n\n"
                                          "@pytest.mark.skip(reason='needs a CUDA GPU')\ndef test_b():\n    pass\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "skip_summary", "-p", "no:cacheprovider",
                        str(tmp_path / "test_one.py")], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                       env=env)
    last_two = r.stdout.strip().splitlines()[-2:]
    assert last_two[0] == "skipped: 1 needs a CUDA GPU  (pytest -rs lists them)", r.stdout
    assert last_two[1].startswith("1 passed, 1 skipped in "), r.stdout
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert "Its second-to-last line counts the skipped tests by reason" in readme
    assert "the last is pytest's own count" in readme


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def test_every_example_has_a_test():
    tested = {"unified_tensor.py", "graph_analytics.py", "dgl_graphsage.py", "pyg_graphsage.py", "multi_gpu.py",
              "large_table.py"}
    assert {p.name for p in EXAMPLES.glob("*.py")} == tested


def test_unified_tensor():
    out = run([EXAMPLES / "unified_tensor.py", "--size", "100000"])
    assert "Listing 1" in out and "Listing 3: 2 processes" in out


def test_graph_analytics_generated_and_snap(tmp_path):
    out = run([EXAMPLES / "graph_analytics.py", "--scale", "11"])
    assert re.search(r"BFS from \d+ reached [\d,]+ vertices", out)
    # What it does is said before each slow step, and the generation shows a progress bar.
    first = "cuda" if torch.cuda.is_available() else "cpu"  # the example's first placement
    assert out.index("generating a Kronecker graph of 2^11 vertices") < out.index("ready in") \
        < out.index(f"{first}: BFS, connected components and PageRank") < out.index("BFS from")
    assert "kron11: fill" in out
    snap = tmp_path / "tiny.txt"
    snap.write_text("# a SNAP edge list\n0\t1\n1\t2\n3\t4\n")
    out = run([EXAMPLES / "graph_analytics.py", "--graph", snap, "--source", "0"])
    assert "BFS from 0 reached 3 vertices; 2 components" in out


@pytest.mark.parametrize("pipeline", [[], ["--pipeline"]], ids=["in-process", "pipeline"])
def test_dgl_graphsage(pipeline):
    out = run([EXAMPLES / "dgl_graphsage.py", "--nodes", "3000", "--epochs", "2", "--batch-size", "256"] + pipeline)
    acc = float(re.findall(r"test acc ([\d.]+)", out)[-1])
    assert acc > 2 / 16, out  # well above chance (16 classes) after two epochs


@pytest.mark.parametrize("pipeline", [[], ["--pipeline"]], ids=["in-process", "pipeline"])
def test_pyg_graphsage(pipeline):
    if os.environ.get("ZEROCOPY_REQUIRE_PYG") != "1":  # CI installs PyG: fail rather than skip
        pytest.importorskip("torch_geometric", reason="needs torch_geometric (pip install torch-geometric)")
    out = run([EXAMPLES / "pyg_graphsage.py", "--nodes", "3000", "--epochs", "2", "--batch-size", "256"] + pipeline)
    assert "pytorch_zerocopy.pyg" in out
    assert out.index("generating the community dataset (3,000 nodes)") < out.index("training 2 epoch(s) of ") \
        < out.index("epoch 1:")
    assert "training:" in out and "minibatch" in out  # a progress bar over each epoch's minibatches (stderr)
    acc = float(re.findall(r"test acc ([\d.]+)", out)[-1])
    assert acc > 2 / 16, out


def test_multi_gpu_python_api():
    out = run([EXAMPLES / "multi_gpu.py", "--dataset", "papers-like:4000", "--epochs", "1", "--max-batches", "1",
               "--batch-size", "64"] + ([] if _cuda() else ["--gpus", "2"]))
    assert re.search(r"\d+ workers finished", out), out


def test_large_table(tmp_path):
    path = tmp_path / "features.npy"
    out = run([EXAMPLES / "large_table.py", "--gib", "0.02", "--width", "32", "--rows-per-batch", "5000",
               "--reps", "2", "--path", path])
    rows = int(0.02 * 2**30) // (4 * 32)
    assert path.exists() and f"loaded ({rows}, 32)" in out, out
    assert "write:" in out and "load:" in out  # progress shown
    # an existing file is loaded as it is, whatever --gib says
    out = run([EXAMPLES / "large_table.py", "--path", path, "--gib", "5", "--rows-per-batch", "100", "--reps", "1"])
    assert f"loaded ({rows}, 32)" in out and "write:" not in out


def test_large_table_with_no_arguments_runs_here():
    """The default size fits the machine the README's commands run on (1 GiB, less where the
    disk or /dev/shm is short) and says that it is the default."""
    out = run([EXAMPLES / "large_table.py", "--rows-per-batch", "1000", "--reps", "1"])
    size = re.search(r"writing a table of ([\d,]+) x 128 float32 \(([\d.]+) GiB\) to .* \(the default size; "
                     r"--gib sets another\)", out)
    assert size and 0 < float(size.group(2)) <= 1.0, out
    assert f"loaded ({size.group(1).replace(',', '')}, 128)" in out


def test_large_table_checks_room_before_writing(tmp_path):
    """A table larger than the disk or /dev/shm is refused in one line, in GiB, before a byte
    is written."""
    path = tmp_path / "features.npy"
    r = subprocess.run([sys.executable, EXAMPLES / "large_table.py", "--gib", "1000000", "--path", path], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and not path.exists() and r.stdout == "", r.stdout + r.stderr
    line = r.stderr.strip()
    assert "\n" not in line and "Traceback" not in line and "write:" not in line, line
    assert re.match(r"the table needs 1,000,000\.0 GiB (on disk in .*|of shared memory), .* [\d,.]+ GiB free",
                    line), line
    assert line.endswith("pass a smaller --gib") or "pass a smaller --gib or a --path elsewhere" in line, line

