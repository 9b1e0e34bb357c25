"""A small learnable node-classification graph: communities per class, class-dependent features.

Each node has ``intra_degree`` in-edges from random nodes of its own class and
``inter_degree`` from random nodes of any class; its features are its class's centre times
``signal`` plus unit Gaussian noise. Features alone classify poorly when ``signal`` is small;
averaging over neighbours (mostly of the same class) recovers the class, so a GNN beats an MLP.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class CommunityGraph(NamedTuple):
    src: torch.Tensor  # int64 edge sources
    dst: torch.Tensor  # int64 edge destinations
    feat: torch.Tensor  # float32 (num_nodes, feat_dim)
    label: torch.Tensor  # int64 (num_nodes,)
    train_idx: torch.Tensor
    test_idx: torch.Tensor

    @property
    def num_nodes(self) -> int:
        return self.label.numel()

    def csr(self):
        """``(indptr, indices)`` with edges sorted by source (edge id = position in this order);
        and the permutation from the original edge order."""
        order = torch.argsort(self.src * self.num_nodes + self.dst)
        counts = torch.bincount(self.src, minlength=self.num_nodes)
        indptr = torch.zeros(self.num_nodes + 1, dtype=torch.int64)
        torch.cumsum(counts, 0, out=indptr[1:])
        return indptr, self.dst[order], order


def community_graph(num_nodes: int = 3000, num_classes: int = 4, feat_dim: int = 16,
                    intra_degree: int = 8, inter_degree: int = 3, signal: float = 0.35,
                    train_fraction: float = 0.6, seed: int = 0) -> CommunityGraph:
    gen = torch.Generator().manual_seed(seed)
    label = torch.randint(0, num_classes, (num_nodes,), generator=gen)
    by_class = torch.argsort(label)
    counts = torch.bincount(label, minlength=num_classes)
    starts = torch.cumsum(counts, 0) - counts
    # Intra-class in-edges: a random member of the destination's class.
    dst_intra = torch.arange(num_nodes).repeat_interleave(intra_degree)
    cls = label[dst_intra]
    pick = (torch.rand(dst_intra.numel(), generator=gen) * counts[cls]).long()
    src_intra = by_class[starts[cls] + pick]
    dst_inter = torch.arange(num_nodes).repeat_interleave(inter_degree)
    src_inter = torch.randint(0, num_nodes, (dst_inter.numel(),), generator=gen)
    src = torch.cat([src_intra, src_inter])
    dst = torch.cat([dst_intra, dst_inter])
    centres = torch.randn(num_classes, feat_dim, generator=gen)
    feat = centres[label] * signal + torch.randn(num_nodes, feat_dim, generator=gen)
    perm = torch.randperm(num_nodes, generator=gen)
    cut = int(num_nodes * train_fraction)
    return CommunityGraph(src, dst, feat.float(), label, perm[:cut].sort().values, perm[cut:].sort().values)
