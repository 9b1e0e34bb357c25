"""Datasets: the embedded default, a papers100M-like generator, and OGB files on disk.

``load_dataset(spec)`` understands:

* ``"community"`` (default): :func:`embedded_default`, generated in seconds, no download.
* ``"papers-like:NODES[:DEGREE]"``: :func:`papers_like` with that many nodes (``k``/``M``
  suffixes accepted) and the requested feature width.
* a directory in OGB's layout: :func:`load_ogb`.
"""

from __future__ import annotations

import os
from typing import Optional

import torch

from .base import NodeDataset, shared_host_tensor
from .ogb import load_ogb
from .synthetic import community_graph, embedded_default, papers_like


def _parse_count(text: str) -> int:
    text = text.strip().lower()
    scale = {"k": 10**3, "m": 10**6, "b": 10**9}.get(text[-1:], 1)
    return int(float(text[:-1] if scale > 1 else text) * scale)


def load_dataset(spec: str = "community", feature_dim: Optional[int] = None,
                 dtype: torch.dtype = torch.float32, seed: int = 0) -> NodeDataset:
    """Returns the dataset named by ``spec`` (see the module docstring)."""
    if spec in ("community", "default"):
        return embedded_default(feature_dim or 64)
    if spec.startswith("papers-like"):
        parts = spec.split(":")
        if len(parts) < 2:
            raise ValueError("papers-like datasets need a node count: papers-like:NODES[:DEGREE]")
        degree = int(parts[2]) if len(parts) > 2 else 15
        return papers_like(_parse_count(parts[1]), avg_degree=degree, feature_dim=feature_dim or 128,
                           dtype=dtype, seed=seed)
    if os.path.isdir(spec):
        return load_ogb(spec)
    raise ValueError(f"unknown dataset {spec!r}: use 'community', 'papers-like:NODES[:DEGREE]' "
                     "or a directory in OGB's layout")


__all__ = ["NodeDataset", "shared_host_tensor", "community_graph", "embedded_default", "load_dataset", "load_ogb", "papers_like"]
