"""GraphSAGE node classification written against DGL's own API (dgl.graph, dgl.nn.SAGEConv,
dgl.dataloading.DataLoader / NeighborSampler). The loader comes from the single import line
marked LOADER below; the tests run this file once as written and once with that line replaced
by ``from pytorch_zerocopy.dgl import DataLoader, NeighborSampler``.

Usage: python sage_node_classification.py SEED EPOCHS [uva]   (prints one JSON line)
"""

import json
import sys

import dgl
import dgl.nn as dglnn
import torch
import torch.nn.functional as F
from dgl.dataloading import DataLoader, NeighborSampler  # LOADER

from pytorch_zerocopy.datasets import community_graph


class SAGE(torch.nn.Module):
    def __init__(self, in_feats, hidden, classes):
        super().__init__()
        self.layers = torch.nn.ModuleList([dglnn.SAGEConv(in_feats, hidden, "mean"),
                                           dglnn.SAGEConv(hidden, classes, "mean")])

    def forward(self, blocks, x):
        h = x
        for i, (layer, block) in enumerate(zip(self.layers, blocks)):
            h = layer(block, h)
            if i < len(self.layers) - 1:
                h = F.relu(h)
        return h


def main(seed: int, epochs: int, use_uva: bool) -> dict:
    torch.manual_seed(seed)
    data = community_graph(num_nodes=3000, num_classes=4, feature_dim=16, mean_scale=0.35, seed=seed,
                           splits=(0.6, 0.0, 0.4))
    g = dgl.graph(data.edges(), num_nodes=data.num_nodes)
    g.ndata["feat"] = data.features
    g.ndata["label"] = data.labels
    device = torch.device("cuda" if use_uva and torch.cuda.is_available() else "cpu")
    model = SAGE(data.feature_dim, 32, 4).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    sampler = NeighborSampler([10, 10], prefetch_node_feats=["feat"], prefetch_labels=["label"])
    kwargs = {"use_uva": True, "device": device} if use_uva else {}
    train_loader = DataLoader(g, data.train_idx, sampler, batch_size=256, shuffle=True,
                              drop_last=False, num_workers=0, **kwargs)
    losses = []
    for _ in range(epochs):
        model.train()
        total = 0.0
        for input_nodes, output_nodes, blocks in train_loader:
            x = blocks[0].srcdata["feat"]
            y = blocks[-1].dstdata["label"]
            loss = F.cross_entropy(model(blocks, x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += float(loss)
        losses.append(total / len(train_loader))
    model.eval()
    test_sampler = NeighborSampler([-1, -1], prefetch_node_feats=["feat"], prefetch_labels=["label"])
    test_loader = DataLoader(g, data.test_idx, test_sampler, batch_size=1024, **kwargs)
    correct = 0
    with torch.no_grad():
        for input_nodes, output_nodes, blocks in test_loader:
            pred = model(blocks, blocks[0].srcdata["feat"]).argmax(1)
            correct += int((pred == blocks[-1].dstdata["label"]).sum())
    return {"loader": DataLoader.__module__, "test_acc": correct / data.test_idx.numel(),
            "losses": losses}


if __name__ == "__main__":
    result = main(int(sys.argv[1]), int(sys.argv[2]), len(sys.argv) > 3 and sys.argv[3] == "uva")
    print(json.dumps(result))
