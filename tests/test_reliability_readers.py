"""Graph and dataset readers on malformed, truncated and out-of-proportion files: a clear error
naming the file, never a silently different graph, never an allocation the machine cannot make."""

import gzip
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from pytorch_zerocopy.datasets import load_ogb
from pytorch_zerocopy.graph import CSRGraph, load_bel, load_edge_list, load_npz, save_bel, save_npz


def write(path, text):
    path.write_text(text)
    return path


# --- text edge lists ----------------------------------------------------------------------------


@pytest.mark.parametrize("text,match", [
    ("0.7 1.9\n", "line 1, column 1: vertex id '0.7' is not an integer"),
    ("0 1\n1 2.0\n", "line 2, column 2: vertex id '2.0' is not an integer"),
    ("0 1\nx y\n", "line 2, column 1: vertex id 'x' is not an integer"),
    ("0 1\n2\n", "line 2: 1 column"),
    ("0 1\n1 2 3\n", "line 2: 3 column"),
    ("7\n", "line 1: lines must hold 'src dst'"),
    ("0 1\n-1 2\n", "line 2: vertex ids must be >= 0"),
    ("0 99999999999999999999\n", "line 1, column 2: vertex id 99999999999999999999 does not fit int64"),
])
def test_malformed_edge_lists_are_refused(tmp_path, text, match):
    path = write(tmp_path / "g.el", text)
    with pytest.raises(ValueError, match=match) as info:
        load_edge_list(path)
    assert str(path) in str(info.value) and "count from 1" in str(info.value)


def test_weights_that_do_not_fit_int32_are_not_wrapped(tmp_path):
    path = write(tmp_path / "g.wel", "0 1 1e10\n1 0 -3\n")
    g = load_edge_list(path)
    assert g.weights.dtype == torch.float32
    assert g.weights.tolist() == [1e10, -3.0]
    with pytest.raises(ValueError, match="do not fit int32"):
        load_edge_list(path, weight_dtype=torch.int32)
    ints = load_edge_list(write(tmp_path / "i.wel", "0 1 2147483647\n1 0 -2147483648\n"))
    assert ints.weights.dtype == torch.int32 and ints.weights.tolist() == [2147483647, -2147483648]


@pytest.mark.parametrize("weight", ["nan", "inf", "-inf", "1e39"])
def test_weights_must_be_finite_float32(tmp_path, weight):
    with pytest.raises(ValueError, match="weight"):
        load_edge_list(write(tmp_path / "g.wel", f"0 1 2\n1 0 {weight}\n"))


def test_fractional_weights_refused_as_int32(tmp_path):
    with pytest.raises(ValueError, match="fractional"):
        load_edge_list(write(tmp_path / "g.wel", "0 1 2.5\n"), weight_dtype=torch.int32)


OUT_OF_PROPORTION = textwrap.dedent("""
    import resource, sys, torch
    # An address-space cap: an allocation of gigabytes fails here instead of waking the OOM killer.
    resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))
    from pytorch_zerocopy.graph import load_edge_list
    path = sys.argv[1]
    try:
        load_edge_list(path)
        sys.exit("a 13-byte file was read as a graph of 3 billion vertices")
    except ValueError as e:
        msg = str(e)
        assert "num_nodes=3000000001" in msg and "GiB" in msg and path in msg, msg
    try:
        load_edge_list(path, num_nodes=2**40)  # stated, but far beyond this machine
        sys.exit("a graph of 2^40 vertices was allocated")
    except torch.OutOfMemoryError as e:
        assert "available" in str(e) and "bytes" in str(e), e
    print("ok")
""")


def test_an_edge_list_out_of_proportion_to_its_file(tmp_path):
    path = write(tmp_path / "tiny.el", "0 3000000000")
    assert path.stat().st_size == 12
    out = subprocess.run([sys.executable, "-c", OUT_OF_PROPORTION, str(path)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stdout + out.stderr


def test_sparse_ids_are_read_when_num_nodes_is_stated(tmp_path):
    path = write(tmp_path / "sparse.el", "0 20000000\n20000000 5\n")
    with pytest.raises(ValueError, match="num_nodes=20000001"):
        load_edge_list(path)
    g = load_edge_list(path, num_nodes=20_000_001)
    assert g.num_nodes == 20_000_001 and g.num_edges == 2 and g.indices.tolist() == [20000000, 5]


def test_comments_blank_lines_and_tabs_still_read(tmp_path):
    g = load_edge_list(write(tmp_path / "g.txt", "# c\n% c\n\n0\t1\n  1 2  \n"))
    assert g.num_nodes == 3 and g.indices.tolist() == [1, 2]


# --- binary files --------------------------------------------------------------------------------


def small_graph():
    return CSRGraph.from_coo([0, 1, 2, 2], [1, 2, 0, 1], 3, torch.tensor([4, 5, 6, 7], dtype=torch.int32))


@pytest.mark.parametrize("part", [".col", ".dst", ".val"])
@pytest.mark.parametrize("cut", [1, 8, 17])
def test_truncated_bel_files(tmp_path, part, cut):
    save_bel(small_graph(), tmp_path / "g.bel")
    f = tmp_path / f"g.bel{part}"
    data = f.read_bytes()
    f.write_bytes(data[:-cut] if cut < len(data) else b"")
    with pytest.raises(ValueError, match=re.escape(str(f))):
        load_bel(tmp_path / "g.bel")


def test_bel_with_inconsistent_offsets(tmp_path):
    save_bel(small_graph(), tmp_path / "g.bel")
    col = tmp_path / "g.bel.col"
    header = col.read_bytes()[:16]
    col.write_bytes(header + np.array([0, 3, 1, 4], dtype="<u8").tobytes())  # decreasing
    with pytest.raises(ValueError, match="non-decreasing"):
        load_bel(tmp_path / "g.bel")
    col.write_bytes(header + np.array([0, 1, 2, 2**63 + 5], dtype="<u8").tobytes())  # past int64
    with pytest.raises(ValueError, match="indptr"):
        load_bel(tmp_path / "g.bel")


@pytest.mark.parametrize("cut", [1, 30, 100, 200])
def test_truncated_npz(tmp_path, cut):
    save_npz(small_graph(), tmp_path / "g.npz")
    data = (tmp_path / "g.npz").read_bytes()
    (tmp_path / "g.npz").write_bytes(data[:-cut])
    with pytest.raises(ValueError, match="g.npz"):
        load_npz(tmp_path / "g.npz")


def test_npz_with_wrong_arrays(tmp_path):
    np.savez(tmp_path / "a.npz", indptr=np.array([0.0, 1.0]), indices=np.array([0]))
    with pytest.raises(TypeError, match="indptr must be int64"):
        load_npz(tmp_path / "a.npz")
    np.savez(tmp_path / "b.npz", indptr=np.array([0, 1]), indices=np.array(["x"]))
    with pytest.raises(TypeError, match="indices"):
        load_npz(tmp_path / "b.npz")
    np.savez(tmp_path / "c.npz", indptr=np.array([0, 1]), indices=np.array([[0]]))
    with pytest.raises(ValueError, match="1-D"):
        load_npz(tmp_path / "c.npz")
    np.save(tmp_path / "d.npy", np.arange(3))
    with pytest.raises(ValueError, match="not an .npz archive"):
        load_npz(tmp_path / "d.npy")
    (tmp_path / "e.npz").write_bytes(os.urandom(64))
    with pytest.raises(ValueError, match="e.npz"):
        load_npz(tmp_path / "e.npz")


# --- OGB layout ------------------------------------------------------------------------------------


def _csv_gz(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        f.write("".join(",".join(str(v) for v in row) + "\n" for row in rows))


def _ogb_csv(root, edges, n=4, labels=None, train=(0, 1)):
    _csv_gz(root / "raw" / "edge.csv.gz", edges)
    _csv_gz(root / "raw" / "node-feat.csv.gz", [[float(i), 1.0] for i in range(n)])
    _csv_gz(root / "raw" / "node-label.csv.gz", [[v] for v in (labels or [i % 2 for i in range(n)])])
    _csv_gz(root / "raw" / "num-node-list.csv.gz", [[n]])
    for part, ids in (("train", train), ("valid", (2,)), ("test", (3,))):
        _csv_gz(root / "split" / "s" / f"{part}.csv.gz", [[i] for i in ids])
    return root


def test_ogb_edge_ids_beyond_the_nodes_are_refused(tmp_path):
    ds = load_ogb(_ogb_csv(tmp_path / "ok", [(0, 1), (1, 2), (2, 3)]))
    assert int(ds.graph.indptr[-1]) == ds.graph.indices.numel() == 6
    with pytest.raises(ValueError, match="node id 4, outside \\[0, 4\\)"):
        load_ogb(_ogb_csv(tmp_path / "big", [(0, 1), (1, 4)]))
    with pytest.raises(ValueError, match="node id -1"):
        load_ogb(_ogb_csv(tmp_path / "neg", [(0, 1), (-1, 2)]))


def test_ogb_fractional_and_garbage_values_are_refused(tmp_path):
    with pytest.raises(ValueError, match="integers"):
        load_ogb(_ogb_csv(tmp_path / "frac", [(0, 1), (1, 2.5)]))
    with pytest.raises(ValueError, match="train"):
        load_ogb(_ogb_csv(tmp_path / "split", [(0, 1)], train=(0, 9)))
    with pytest.raises(ValueError, match="labels"):
        load_ogb(_ogb_csv(tmp_path / "lab", [(0, 1)], labels=[0, 1.5, 0, 1]))
    with pytest.raises(ValueError, match="labels"):
        load_ogb(_ogb_csv(tmp_path / "neg", [(0, 1)], labels=[0, -3, 0, 1]))


def test_ogb_binary_layout_with_bad_edges_or_a_truncated_archive(tmp_path):
    root = tmp_path / "ogbn_papers100M"
    (root / "raw").mkdir(parents=True)
    feats = np.ones((4, 2), dtype=np.float32)
    np.savez(root / "raw" / "data.npz", edge_index=np.array([[0, 1], [1, 7]]), node_feat=feats,
             num_nodes_list=np.array([4]))
    np.savez(root / "raw" / "node-label.npz", node_label=np.array([[0.0], [1.0], [np.nan], [0.0]]))
    for part, ids in (("train", (0, 1)), ("valid", (2,)), ("test", (3,))):
        _csv_gz(root / "split" / "time" / f"{part}.csv.gz", [[i] for i in ids])
    with pytest.raises(ValueError, match="node id 7"):
        load_ogb(root)
    np.savez(root / "raw" / "data.npz", edge_index=np.array([[0.0, 1.5], [1.0, 2.0]]), node_feat=feats,
             num_nodes_list=np.array([4]))
    with pytest.raises(ValueError, match="integers"):
        load_ogb(root)
    data = (root / "raw" / "data.npz").read_bytes()
    (root / "raw" / "data.npz").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="data.npz"):
        load_ogb(root)
