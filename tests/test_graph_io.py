"""Round trips through every file format, and malformed files."""

import numpy as np
import pytest
import torch

from pytorch_zerocopy.graph import (CSRGraph, load_bel, load_edge_list, load_npz, save_bel, save_edge_list,
                                    save_npz)


@pytest.fixture
def seed():
    from graph_reference import fresh_seed

    return fresh_seed()


def random_graph(seed, weights=None, index_dtype=None):
    rng = np.random.default_rng(seed)
    s, d = rng.integers(0, 70, 300), rng.integers(0, 70, 300)
    w = None
    if weights == "int":
        w = torch.from_numpy(rng.integers(1, 100, 300).astype(np.int32))
    elif weights == "float":
        w = torch.from_numpy(rng.uniform(0.1, 3.0, 300).astype(np.float32))
    return CSRGraph.from_coo(s, d, 75, w, index_dtype=index_dtype)


def assert_same(a, b):
    assert a.num_nodes == b.num_nodes
    assert torch.equal(a.indptr, b.indptr)
    assert torch.equal(a.indices.long(), b.indices.long())
    if a.weights is None:
        assert b.weights is None
    else:
        assert torch.equal(a.weights, b.weights)


@pytest.mark.parametrize("weights", [None, "int", "float"])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_bel_round_trip(tmp_path, seed, weights, index_dtype):
    g = random_graph(seed, weights, index_dtype)
    save_bel(g, tmp_path / "g.bel")
    assert (tmp_path / "g.bel.col").stat().st_size == 16 + 8 * 76
    assert (tmp_path / "g.bel.dst").stat().st_size == 16 + 8 * g.num_edges
    header = np.fromfile(tmp_path / "g.bel.dst", dtype="<u8", count=2)
    assert header[0] == g.num_edges
    wdt = torch.float32 if weights == "float" else torch.int32
    back = load_bel(tmp_path / "g.bel", weight_dtype=wdt, index_dtype=index_dtype)
    assert back.indices.dtype == index_dtype
    assert_same(g, back)


def test_bel_written_by_hand(tmp_path):
    # Two vertices, edges 0->1 and 1->0, uint32 weights 7 and 9.
    with open(tmp_path / "h.bel.col", "wb") as f:
        f.write(np.array([3, 0, 0, 1, 2], dtype="<u8").tobytes())
    with open(tmp_path / "h.bel.dst", "wb") as f:
        f.write(np.array([2, 0, 1, 0], dtype="<u8").tobytes())
    with open(tmp_path / "h.bel.val", "wb") as f:
        f.write(np.array([2, 0], dtype="<u8").tobytes() + np.array([7, 9], dtype="<u4").tobytes())
    g = load_bel(tmp_path / "h.bel", symmetric=True)
    assert g.indptr.tolist() == [0, 1, 2] and g.indices.tolist() == [1, 0] and g.weights.tolist() == [7, 9]
    assert g.symmetric


def test_bel_truncated(tmp_path):
    g = random_graph(1)
    save_bel(g, tmp_path / "g.bel")
    data = (tmp_path / "g.bel.dst").read_bytes()
    (tmp_path / "g.bel.dst").write_bytes(data[:-8])
    with pytest.raises(ValueError, match="header says"):
        load_bel(tmp_path / "g.bel")
    with pytest.raises(FileNotFoundError):
        load_bel(tmp_path / "missing.bel")


@pytest.mark.parametrize("weights", [None, "int", "float"])
def test_edge_list_round_trip(tmp_path, seed, weights):
    g = random_graph(seed, weights)
    path = tmp_path / ("g.wel" if weights else "g.el")
    save_edge_list(g, path)
    back = load_edge_list(path, num_nodes=g.num_nodes)
    if weights == "float":
        assert back.weights.dtype == torch.float32
        np.testing.assert_allclose(back.weights.numpy(), g.weights.numpy(), rtol=1e-6)
        back.weights = g.weights
    assert_same(g, back)


def test_snap_text_with_comments(tmp_path):
    path = tmp_path / "snap.txt"
    path.write_text("# Directed graph\n# Nodes: 4 Edges: 3\n# FromNodeId\tToNodeId\n0\t1\n1\t2\n\n3\t0\n")
    g = load_edge_list(path)
    assert g.num_nodes == 4 and g.indptr.tolist() == [0, 1, 2, 2, 3] and g.indices.tolist() == [1, 2, 0]
    sym = load_edge_list(path, symmetrize=True)
    assert sym.symmetric and sym.num_edges == 6


@pytest.mark.parametrize("weights", [None, "float"])
def test_npz_round_trip(tmp_path, seed, weights):
    g = random_graph(seed, weights)
    g.symmetric = True
    save_npz(g, tmp_path / "g.npz")
    back = load_npz(tmp_path / "g.npz")
    assert back.symmetric
    assert_same(g, back)


def test_npz_validates(tmp_path):
    np.savez(tmp_path / "bad.npz", indptr=np.array([0, 3, 2], dtype=np.int64), indices=np.array([0, 1], dtype=np.int32))
    with pytest.raises(ValueError, match="indptr"):
        load_npz(tmp_path / "bad.npz")
