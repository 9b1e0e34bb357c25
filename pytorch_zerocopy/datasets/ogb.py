"""Loads OGB node-property datasets from a local directory, in OGB's own file layout.

Two layouts are read (those of the archives OGB distributes, unzipped):

* CSV (e.g. ``ogbn-products``): ``raw/edge.csv.gz`` (one ``src,dst`` pair per line),
  ``raw/node-feat.csv.gz`` (one row of floats per node), ``raw/node-label.csv.gz`` (one label
  per line), optionally ``raw/num-node-list.csv.gz``.
* binary (e.g. ``ogbn-papers100M``): ``raw/data.npz`` with ``edge_index`` (2 x E),
  ``node_feat`` (N x D) and ``num_nodes_list``; ``raw/node-label.npz`` with ``node_label``
  (N x 1, float, NaN for unlabelled nodes; those get label -1 and appear in no split).

Splits: ``split/<scheme>/{train,valid,test}.csv.gz`` (or ``.csv``; one node id per line); the scheme is the
only sub-directory of ``split/`` or is given. Undirected datasets (``ogbn-products``) store each
edge once; ``add_reverse`` (default: True except for papers100M, which is directed) adds the
reverse edges, as OGB's ``add_inverse_edge`` does. Features are copied into shared memory.
"""

from __future__ import annotations

import gzip
import os
import zipfile
import zlib
from dataclasses import replace
from typing import Optional, Union

import numpy as np
import torch

from .base import NodeDataset, in_neighbour_graph, shared_host_tensor
from .features import NpyFeatures
from .synthetic import _csr_from_edges

PathLike = Union[str, os.PathLike]


def _read_csv(path: str, dtype) -> np.ndarray:
    """The rows of a CSV file (gzip-compressed when it ends in .gz) as a 2-D ``dtype`` array.

    For an integer ``dtype`` every value must be an integer: ``1.5`` or ``abc`` raise
    ``ValueError`` naming the file, rather than being truncated."""
    try:
        try:
            import pandas as pd  # much faster on large files when present

            values = pd.read_csv(path, header=None, compression="gzip" if path.endswith(".gz") else None).values
        except ImportError:
            with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
                values = np.loadtxt(f, delimiter=",", dtype=np.float64 if np.dtype(dtype).kind in "iu" else dtype,
                                    ndmin=2)
        if np.dtype(dtype).kind in "iu" and values.dtype.kind not in "iu":
            values = values.astype(np.float64)
            bad = ~np.isfinite(values) | (np.floor(values) != values) | (np.abs(values) >= 2.0**63)
            if bad.any():
                row, col = (int(i) for i in np.argwhere(bad)[0])
                raise ValueError(f"expected integers, got {values[row, col]!r} at row {row}, column {col}")
        return values.astype(dtype)
    except (ValueError, TypeError, EOFError, OSError, UnicodeDecodeError) as e:
        if isinstance(e, FileNotFoundError):
            raise
        raise ValueError(f"load_ogb: cannot read {path}: {e}") from None


def _npz_has(path: str, key: str) -> bool:
    return _npz_member(path, key, load=False) is not None


def _npz_member(path: str, key: str, load: bool = True):
    """Array ``key`` of the archive ``path`` (None when ``load`` is False: whether it exists).
    A truncated or corrupt archive raises ValueError naming the file."""
    try:
        with np.load(path, allow_pickle=False) as archive:
            if key not in archive:
                if not load:
                    return None
                raise ValueError(f"load_ogb: {path} has no array {key!r}")
            return archive[key] if load else True
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError, AttributeError) as e:
        if isinstance(e, FileNotFoundError):
            raise
        raise ValueError(f"load_ogb: {path} is not a readable .npz archive ({type(e).__name__}: {e})") from None


def _integers(values: np.ndarray, what: str) -> np.ndarray:
    """``values`` as int64; ValueError naming ``what`` for a fractional or non-finite value."""
    values = np.asarray(values)
    if values.dtype.kind in "iu":
        return values.astype(np.int64)
    if values.dtype.kind != "f":
        raise ValueError(f"load_ogb: {what} must hold integers, got dtype {values.dtype}")
    bad = ~np.isfinite(values) | (np.floor(values) != values) | (np.abs(values) >= 2.0**63)
    if bad.any():
        raise ValueError(f"load_ogb: {what} must hold integers, got {values[bad].reshape(-1)[0]!r}")
    return values.astype(np.int64)


def _labels(values: np.ndarray, path: str) -> torch.Tensor:
    """Class ids, int64, -1 where the file has NaN (unlabelled)."""
    values = np.asarray(values, dtype=np.float64).reshape(-1)
    known = ~np.isnan(values)
    ids = _integers(values[known], f"the labels in {path}")
    if ids.size and int(ids.min()) < 0:
        raise ValueError(f"load_ogb: labels in {path} must be class ids >= 0 (NaN: unlabelled), got {int(ids.min())}")
    out = np.full(values.shape, -1, dtype=np.int64)
    out[known] = ids
    return torch.from_numpy(out)


def _check_ids(ids: torch.Tensor, num_nodes: int, what: str) -> None:
    """Raises ValueError naming ``what`` when an id lies outside [0, num_nodes)."""
    if ids.numel() == 0:
        return
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0 or hi >= num_nodes:
        bad = int(ids.reshape(-1)[(ids.reshape(-1) < 0) | (ids.reshape(-1) >= num_nodes)][0])
        raise ValueError(f"load_ogb: {what} holds node id {bad}, outside [0, {num_nodes}) "
                         f"(the dataset has {num_nodes} nodes)")


def _read_split(root: str, scheme: Optional[str]) -> dict:
    split_dir = os.path.join(root, "split")
    if scheme is None:
        schemes = sorted(os.listdir(split_dir)) if os.path.isdir(split_dir) else []
        if len(schemes) != 1:
            raise FileNotFoundError(
                f"load_ogb: expected one split scheme under {split_dir}, found {schemes}; pass split=")
        scheme = schemes[0]
    out = {}
    for part in ("train", "valid", "test"):
        path = os.path.join(split_dir, scheme, f"{part}.csv.gz")
        if not os.path.exists(path) and os.path.exists(path[:-3]):
            path = path[:-3]  # OGB's format description also allows plain .csv
        if not os.path.exists(path):
            raise FileNotFoundError(f"load_ogb: missing split file {path}")
        out[part] = torch.from_numpy(_read_csv(path, np.int64).reshape(-1))
    return out


def _torch_feature_dtype(dtype: np.dtype) -> torch.dtype:
    return torch.float16 if np.dtype(dtype) == np.float16 else torch.float32


def _npz_features(npz_path: str) -> NpyFeatures:
    """The ``node_feat`` array of an ``.npz`` (compressed or not) as a feature source: its header
    is read and checked now; its rows are streamed later, ``chunk_bytes`` at a time, into the
    table of the process that reads them (``np.load`` would decompress the whole member into
    private memory: papers100M's features are 57 GB). A corrupt or truncated archive raises
    ValueError naming the file (the rows' part, when they are read)."""
    try:
        source = NpyFeatures.open(npz_path, member="node_feat")
    except (zipfile.BadZipFile, zlib.error, EOFError) as e:
        raise ValueError(f"load_ogb: {npz_path} is not a readable .npz archive ({type(e).__name__}: {e})") from None
    except KeyError:
        raise ValueError(f"load_ogb: {npz_path} has no array 'node_feat'") from None
    except ValueError as e:
        raise ValueError(f"load_ogb: node_feat: {e}") from None
    return replace(source, dtype=torch.float16 if source.dtype == torch.float16 else torch.float32)


def _shared_features(array: np.ndarray) -> torch.Tensor:
    array = np.asarray(array)
    out = shared_host_tensor(array.shape, _torch_feature_dtype(array.dtype))
    step = max(1, (256 << 20) // max(1, array[0].nbytes if len(array) else 1))
    for a in range(0, array.shape[0], step):
        out[a:a + step].copy_(torch.from_numpy(np.ascontiguousarray(array[a:a + step])).to(out.dtype))
    return out


def load_ogb(root: PathLike, name: Optional[str] = None, split: Optional[str] = None,
             add_reverse: Optional[bool] = None) -> NodeDataset:
    """Reads an OGB node-property dataset from ``root`` (the directory holding ``raw/``)."""
    root = os.fspath(root)
    raw = os.path.join(root, "raw")
    if not os.path.isdir(raw):
        raise FileNotFoundError(f"load_ogb: {root} has no raw/ directory (expected OGB's layout)")
    name = name or os.path.basename(os.path.normpath(root))
    if add_reverse is None:
        add_reverse = "papers100m" not in name.lower().replace("_", "")

    if os.path.exists(os.path.join(raw, "data.npz")):
        npz = os.path.join(raw, "data.npz")
        edge_source = npz
        edge_index = _integers(_npz_member(npz, "edge_index"), f"edge_index in {npz}")
        num_nodes = (int(_integers(_npz_member(npz, "num_nodes_list"), f"num_nodes_list in {npz}").sum())
                     if _npz_has(npz, "num_nodes_list") else None)
        features = _npz_features(npz)
        label_path = os.path.join(raw, "node-label.npz")
        if not os.path.exists(label_path):
            raise FileNotFoundError(f"load_ogb: missing {label_path}")
        labels = _labels(_npz_member(label_path, "node_label"), label_path)
    else:
        edge_path = os.path.join(raw, "edge.csv.gz")
        if not os.path.exists(edge_path):
            raise FileNotFoundError(f"load_ogb: neither raw/data.npz nor raw/edge.csv.gz in {root}")
        edge_index = _read_csv(edge_path, np.int64).T
        edge_source = edge_path
        features = _shared_features(_read_csv(os.path.join(raw, "node-feat.csv.gz"), np.float32))
        label_path = os.path.join(raw, "node-label.csv.gz")
        labels = _labels(_read_csv(label_path, np.float64), label_path)
        count_path = os.path.join(raw, "num-node-list.csv.gz")
        num_nodes = int(_read_csv(count_path, np.int64).sum()) if os.path.exists(count_path) else None

    num_nodes = num_nodes if num_nodes is not None else features.shape[0]
    if features.shape[0] != num_nodes or labels.numel() != num_nodes:
        raise ValueError(f"load_ogb: {num_nodes} nodes but {features.shape[0]} feature rows and "
                         f"{labels.numel()} labels")
    edges = torch.from_numpy(np.ascontiguousarray(edge_index))
    if edges.dim() != 2 or edges.shape[0] != 2:
        raise ValueError(f"load_ogb: edge_index must be 2 x E, got {tuple(edges.shape)}")
    _check_ids(edges, num_nodes, f"the edge list of {edge_source}")
    src, dst = edges[0], edges[1]
    if add_reverse:
        src, dst = torch.cat([src, dst]), torch.cat([dst, src])
    # Messages flow along edges: a node's in-neighbours are the sources of edges into it.
    indptr, indices = _csr_from_edges(src, dst, num_nodes)

    parts = _read_split(root, split)
    for part, ids in parts.items():
        _check_ids(ids, num_nodes, f"the {part} split")
    num_classes = int(labels.max()) + 1
    return NodeDataset(name, in_neighbour_graph(indptr, indices, symmetric=add_reverse), features, labels,
                       parts["train"], parts["valid"], parts["test"], num_classes).share_memory_()
