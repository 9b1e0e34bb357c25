"""Datasets: the embedded default, a papers100M-like generator, and OGB files on disk.

``load_dataset(spec)`` understands:

* ``"community"`` (default): :func:`embedded_default`, generated in seconds, no download.
* ``"papers-like:NODES[:DEGREE]"``: :func:`papers_like` with that many nodes (``k``/``M``/``B``
  suffixes accepted) and the requested feature width.
* a directory in OGB's layout: :func:`load_ogb`.

:func:`parse_dataset` checks a spec without loading anything (what a command line does first).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Optional

import torch

from .base import NodeDataset, in_neighbour_graph, shared_host_tensor
from .features import FeatureSource, GeneratedFeatures, NpyFeatures, TensorFeatures, load_table
from .ogb import load_ogb
from .synthetic import community_graph, embedded_default, papers_like

_SPEC_HELP = "use 'community', 'papers-like:NODES[:DEGREE]' or a directory in OGB's layout"


def _parse_count(text: str, what: str, spec: str) -> int:
    t = text.strip().lower()
    scale = {"k": 10**3, "m": 10**6, "b": 10**9}.get(t[-1:], 1)
    try:
        value = float(t[:-1] if scale > 1 else t) * scale
    except ValueError:
        value = float("nan")
    if not math.isfinite(value) or value != int(value) or value < 1:
        raise ValueError(f"dataset {spec!r}: {what} must be a positive whole number (k/M/B suffixes allowed), "
                         f"got {text!r}")
    return int(value)


@dataclass(frozen=True)
class DatasetSpec:
    """A parsed, checked dataset spec: ``kind`` is ``"community"``, ``"papers-like"`` or
    ``"ogb"``. For OGB, ``feature_dim``, ``nodes`` and ``dtype`` come from the feature file's
    header where it has one (``raw/data.npz``), else the width from the first row of
    ``node-feat.csv.gz`` and ``nodes`` stays None."""

    kind: str
    feature_dim: Optional[int] = None
    nodes: Optional[int] = None
    degree: Optional[int] = None
    path: Optional[str] = None
    dtype: torch.dtype = torch.float32
    seed: int = 0

    @property
    def row_bytes(self) -> Optional[int]:
        """Bytes of one feature row, when known before loading."""
        if self.feature_dim is None:
            return None
        return self.feature_dim * torch.empty(0, dtype=self.dtype).element_size()

    @property
    def table_bytes(self) -> Optional[int]:
        """Bytes of the feature table, when known before loading."""
        if self.row_bytes is None or self.nodes is None:
            return None
        return self.nodes * self.row_bytes

    def load(self) -> NodeDataset:
        if self.kind == "community":
            return embedded_default(self.feature_dim)
        if self.kind == "papers-like":
            return papers_like(self.nodes, avg_degree=self.degree, feature_dim=self.feature_dim, dtype=self.dtype,
                               seed=self.seed)
        return load_ogb(self.path)


def parse_dataset(spec: str = "community", feature_dim: Optional[int] = None, dtype: torch.dtype = torch.float32,
                  seed: int = 0) -> DatasetSpec:
    """Checks ``spec`` (see the module docstring) and the feature width; raises ``ValueError``
    with one line saying what is wrong. Loads nothing."""
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"unknown dataset {spec!r}: {_SPEC_HELP}")
    if feature_dim is not None and (isinstance(feature_dim, bool) or not isinstance(feature_dim, int)
                                    or feature_dim < 1):
        raise ValueError(f"feature_dim must be a positive int, got {feature_dim!r}")
    if spec in ("community", "default"):
        return DatasetSpec("community", feature_dim or 64, dtype=dtype, seed=seed)
    if spec.split(":")[0] == "papers-like":
        parts = spec.split(":")
        if len(parts) < 2 or len(parts) > 3:
            raise ValueError(f"dataset {spec!r}: papers-like datasets are 'papers-like:NODES[:DEGREE]'")
        nodes = _parse_count(parts[1], "NODES", spec)
        degree = _parse_count(parts[2], "DEGREE", spec) if len(parts) > 2 else 15
        if nodes < 172:
            raise ValueError(f"dataset {spec!r}: papers-like needs at least 172 nodes (one per class), got {nodes}")
        return DatasetSpec("papers-like", feature_dim or 128, nodes, degree, dtype=dtype, seed=seed)
    if os.path.isdir(spec):
        if feature_dim is not None:
            raise ValueError("feature_dim applies to generated datasets; an OGB directory's files fix the width")
        return _ogb_spec(spec, seed)
    raise ValueError(f"unknown dataset {spec!r}: {_SPEC_HELP}")


def _ogb_spec(root: str, seed: int) -> DatasetSpec:
    """An OGB directory's spec, with the feature table's shape read from its header (or first row)."""
    import gzip

    from .features import NpyFeatures

    npz = os.path.join(root, "raw", "data.npz")
    csv = os.path.join(root, "raw", "node-feat.csv.gz")
    try:
        if os.path.exists(npz):
            src = NpyFeatures.open(npz, member="node_feat")
            dtype = torch.float16 if src.dtype == torch.float16 else torch.float32
            return DatasetSpec("ogb", src.width, src.num_rows, path=root, dtype=dtype, seed=seed)
        if os.path.exists(csv):
            with gzip.open(csv, "rt") as f:
                width = len(f.readline().split(","))
            return DatasetSpec("ogb", width, path=root, seed=seed)
    except (OSError, ValueError, KeyError, EOFError) as e:
        raise ValueError(f"dataset {root!r}: cannot read its node features' shape ({e})") from None
    return DatasetSpec("ogb", path=root, seed=seed)


def load_dataset(spec: str = "community", feature_dim: Optional[int] = None,
                 dtype: torch.dtype = torch.float32, seed: int = 0) -> NodeDataset:
    """Returns the dataset named by ``spec`` (see the module docstring)."""
    return parse_dataset(spec, feature_dim, dtype, seed).load()


__all__ = ["DatasetSpec", "FeatureSource", "GeneratedFeatures", "NodeDataset", "NpyFeatures", "TensorFeatures",
           "community_graph", "embedded_default", "in_neighbour_graph", "load_dataset", "load_ogb", "load_table",
           "papers_like", "parse_dataset", "shared_host_tensor"]
