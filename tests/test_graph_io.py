"""Round trips through every file format, and malformed files."""

import numpy as np
import pytest
import torch

from pytorch_zerocopy.graph import (CSRGraph, grid_graph, kronecker_graph, load_bel, load_edge_list, load_npz,
                                    road_graph, save_bel, save_edge_list, save_npz, uniform_random_graph)


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



def test_bel_unit_weights_for_a_graph_without_weights(tmp_path, seed, monkeypatch):
    from pytorch_zerocopy.graph import io

    monkeypatch.setattr(io, "_CHUNK", 64)  # several chunks of the broadcast ones
    g = random_graph(seed)
    save_bel(g, tmp_path / "u.bel")
    assert not (tmp_path / "u.bel.val").exists()
    save_bel(g, tmp_path / "u.bel", unit_weights=True)
    back = load_bel(tmp_path / "u.bel")
    assert back.weights.dtype == torch.int32 and back.weights.tolist() == [1] * g.num_edges
    assert torch.equal(back.indices.long(), g.indices.long())


@pytest.mark.parametrize("family", ["urand", "kron", "grid", "road"])
def test_bel_round_trip_of_every_benchmark_family(tmp_path, family):
    g = {"urand": lambda: uniform_random_graph(8, 8, seed=2, device="cpu"),
         "kron": lambda: kronecker_graph(8, 16, seed=2, drop_duplicates=True, device="cpu"),
         "grid": lambda: grid_graph(9, 13, weights="int"),
         "road": lambda: road_graph(9, 13, seed=2, weights="int", device="cpu")}[family]()
    save_bel(g, tmp_path / f"{family}.bel", unit_weights=True)
    back = load_bel(tmp_path / f"{family}.bel", symmetric=True)
    assert torch.equal(back.indptr, g.indptr) and torch.equal(back.indices.long(), g.indices.long())
    assert back.weights.tolist() == ([1] * g.num_edges if g.weights is None else g.weights.tolist())

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


def test_edge_list_errors_count_lines_and_columns_from_1_in_the_package_words(tmp_path):
    """A bad line is named by its line and column as an editor counts them (comments and blank
    lines included), in one line that says so, without numpy's wording."""
    cases = {"# header\n\n0 1\n1 2 3\n": "line 4: 3 column(s), but line 3 has 2",
             "0 1\n% comment\n1 x\n": "line 3, column 2: vertex id 'x' is not an integer",
             "0 1 0.5\n1 2 heavy\n": "line 2, column 3: weight 'heavy' is not a number",
             "# c\n0 1 2\n1 2 inf\n": "line 3: weight inf is not a finite number",
             "0 1\n\n1 -2\n5 -9\n": "line 3: vertex ids must be >= 0, got -2"}
    for i, (text, expected) in enumerate(cases.items()):
        path = tmp_path / f"g{i}.el"
        path.write_text(text)
        with pytest.raises(ValueError) as info:
            load_edge_list(path)
        message = str(info.value).replace(str(path), "<path>")
        assert message.startswith("<path>, line ") and expected in message, message
        assert message.endswith("(lines and columns count from 1)"), message
        assert "\n" not in message and "usecols" not in message and "row" not in message, message


@pytest.mark.parametrize("name, text", [("empty.el", ""), ("comments.el", "# no edges yet\n\n"),
                                        ("empty.wel", "")])
def test_an_edge_list_without_edges_is_a_graph_without_edges(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    g = load_edge_list(path)
    assert (g.num_nodes, g.num_edges, g.indptr.tolist()) == (0, 0, [0])
    if name.endswith(".wel"):  # weighted by its name: float32, as nothing says the weights are integers
        assert g.weights is not None and g.weights.dtype == torch.float32 and g.weights.numel() == 0
    else:
        assert g.weights is None and "weights=none" in repr(g)
    sized = load_edge_list(path, num_nodes=4, weighted=True, weight_dtype=torch.int32)
    assert sized.num_nodes == 4 and sized.indptr.tolist() == [0] * 5 and sized.weights.dtype == torch.int32


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
