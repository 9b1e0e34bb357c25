"""GraphSAGE node classification written against DGL's API (DataLoader, NeighborSampler,
blocks, SAGEConv), with this package's loader: a DGL script changes its import line only,

    from pytorch_zerocopy.dgl import DataLoader, NeighborSampler   # was: from dgl.dataloading import ...

    python examples/dgl_graphsage.py                         # the embedded 120k-node dataset
    python examples/dgl_graphsage.py --nodes 3000 --epochs 1 # seconds on any machine
    python examples/dgl_graphsage.py --pipeline              # training minibatches loaded by the
                                                             # pipeline's processes (pipeline=True)

DGL itself is optional: where it is installed (it supports torch <= 2.2) the graph is a real
``dgl.graph`` and the layers ``dgl.nn.SAGEConv``; elsewhere the graph is this package's
``pytorch_zerocopy.dgl.Graph`` and the layers ``pytorch_zerocopy.dgl.nn.SAGEConv``, which read
the same blocks. On a GPU, neighbours are sampled on it from the host-resident graph
(``use_uva=True``) and feature rows gathered from host memory in place.
"""

import argparse
import time

import torch
import torch.nn.functional as F

from pytorch_zerocopy.datasets import community_graph
from pytorch_zerocopy.dgl import DataLoader, NeighborSampler, real_dgl


def build_graph(ds):
    """The dataset as a DGL graph, or as this package's graph (``pytorch_zerocopy.dgl.graph``,
    DGL's constructor) without DGL."""
    dgl = real_dgl()
    ndata = {"feat": ds.features, "label": ds.labels}
    src, dst = ds.edges()
    if dgl is not None:
        g = dgl.graph((src, dst), num_nodes=ds.num_nodes)
        g.ndata.update(ndata)
        return g, dgl.nn.SAGEConv
    from pytorch_zerocopy.dgl import graph
    from pytorch_zerocopy.dgl.nn import SAGEConv

    return graph((src, dst), num_nodes=ds.num_nodes, ndata=ndata), SAGEConv


class SAGE(torch.nn.Module):
    def __init__(self, conv, in_feats, hidden, classes, layers):
        super().__init__()
        sizes = [in_feats] + [hidden] * (layers - 1) + [classes]
        self.layers = torch.nn.ModuleList(conv(a, b, "mean") for a, b in zip(sizes[:-1], sizes[1:]))

    def forward(self, blocks, x):
        h = x
        for i, (layer, block) in enumerate(zip(self.layers, blocks)):
            h = layer(block, h)
            if i < len(self.layers) - 1:
                h = F.relu(h)
        return h


def main(argv=None) -> float:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=120_000)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--fanouts", default="10,10", help="neighbours per layer, input layer first")
    p.add_argument("--pipeline", action="store_true", help="load training minibatches in the pipeline's processes")
    args = p.parse_args(argv)

    ds = community_graph(num_nodes=args.nodes, seed=0)
    g, conv = build_graph(ds)
    gpu = torch.cuda.is_available()
    device = torch.device("cuda" if gpu else "cpu")
    fanouts = [int(f) for f in args.fanouts.split(",")]
    sampler = NeighborSampler(fanouts, prefetch_node_feats=["feat"], prefetch_labels=["label"])
    # use_uva: the graph and features stay in host memory; the GPU samples and gathers in place.
    kwargs = dict(device=device, use_uva=gpu)
    # pipeline=True: sampling and the gather of "feat" run in processes of their own, the next
    # minibatches in flight while the model trains on this one.
    train_loader = DataLoader(g, ds.train_idx, sampler, batch_size=args.batch_size, shuffle=True,
                              pipeline=args.pipeline, **kwargs)
    test_loader = DataLoader(g, ds.test_idx, sampler, batch_size=args.batch_size, **kwargs)
    model = SAGE(conv, ds.feature_dim, 128, ds.num_classes, len(fanouts)).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)

    acc = 0.0
    for epoch in range(1, args.epochs + 1):
        model.train()
        start = time.perf_counter()
        total_loss = 0.0
        for input_nodes, output_nodes, blocks in train_loader:
            loss = F.cross_entropy(model(blocks, blocks[0].srcdata["feat"]), blocks[-1].dstdata["label"])
            opt.zero_grad()
            loss.backward()
            opt.step()
            total_loss += loss.item()
        seconds = time.perf_counter() - start
        model.eval()
        correct = 0
        with torch.no_grad():
            for input_nodes, output_nodes, blocks in test_loader:
                pred = model(blocks, blocks[0].srcdata["feat"]).argmax(1)
                correct += int((pred == blocks[-1].dstdata["label"]).sum())
        acc = correct / ds.test_idx.numel()
        print(f"epoch {epoch}: loss {total_loss / len(train_loader):.4f}, test acc {acc:.4f}, {seconds:.2f} s "
              f"({'DGL' if real_dgl() else 'no DGL: pytorch_zerocopy.dgl.graph'}, {device})")
    return acc


if __name__ == "__main__":
    main()
