"""The node-classification dataset container shared by generators and loaders."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Sequence, Union

import torch


def shared_host_tensor(shape: Union[int, Sequence[int]], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised CPU tensor allocated directly in shared memory (no copy).

    Unlike :func:`pytorch_zerocopy.empty_shared` it never touches the GPU: no CUDA context is
    created and nothing is registered, so a process that only prepares data stays GPU-free
    (an MPS partition started later then owns the GPU). Children that receive the tensor map
    the same bytes and register them themselves when they make them unified.
    """
    shape = (shape,) if isinstance(shape, int) else tuple(int(d) for d in shape)
    if any(d < 0 for d in shape):
        raise ValueError(f"negative dimension in shape {shape}")
    nbytes = math.prod(shape) * torch.empty(0, dtype=dtype).element_size()
    try:
        fs = os.statvfs("/dev/shm")
        free = fs.f_bavail * fs.f_frsize
    except OSError:
        free = None
    if free is not None and nbytes > free:
        raise RuntimeError(f"cannot allocate {nbytes} bytes of shared memory: /dev/shm has only {free} bytes "
                           "free. Enlarge it (mount -o remount,size=<N>G /dev/shm, or docker run "
                           "--shm-size=<N>g) or free space in it.")
    storage = torch.UntypedStorage._new_shared(max(1, nbytes))
    return torch.empty(0, dtype=dtype).set_(storage, 0, shape)


@dataclass
class NodeDataset:
    """A graph in CSR form with node features, labels and splits.

    ``indptr`` (int64, ``num_nodes + 1``) and ``indices`` (int64) give each node's in-neighbours.
    ``features`` is a ``[num_nodes, dim]`` host tensor in shared memory (a child process that
    receives it maps the same bytes; convert it there with ``.to("unified")``). ``labels`` are
    int64 in ``[0, num_classes)``. Splits hold node ids. All tensors live on the CPU; the graph
    and labels are moved into shared memory by :meth:`share_memory_` so that sending the
    dataset to ``torch.multiprocessing`` children costs no copy.
    """

    name: str
    indptr: torch.Tensor
    indices: torch.Tensor
    features: torch.Tensor
    labels: torch.Tensor
    train_idx: torch.Tensor
    val_idx: torch.Tensor
    test_idx: torch.Tensor
    num_classes: int

    @property
    def num_nodes(self) -> int:
        return self.indptr.numel() - 1

    @property
    def num_edges(self) -> int:
        return self.indices.numel()

    @property
    def feature_dim(self) -> int:
        return int(self.features.shape[1])

    def share_memory_(self) -> "NodeDataset":
        for name in ("indptr", "indices", "labels", "train_idx", "val_idx", "test_idx"):
            getattr(self, name).share_memory_()
        if not self.features.is_shared():
            self.features.share_memory_()
        return self

    def describe(self) -> str:
        gib = self.features.numel() * self.features.element_size() / 2**30
        return (f"{self.name}: {self.num_nodes:,} nodes, {self.num_edges:,} edges, "
                f"{self.feature_dim} x {str(self.features.dtype).replace('torch.', '')} features "
                f"({gib:.2f} GiB), {self.num_classes} classes, train/val/test "
                f"{self.train_idx.numel():,}/{self.val_idx.numel():,}/{self.test_idx.numel():,}")
