"""GraphSAGE node classification written against PyG (torch_geometric.nn.GraphSAGE,
NeighborLoader). Only the loader's import line decides who samples:

    from pytorch_zerocopy.pyg import NeighborLoader        # zero-copy: GPU sampling and gathers
    from torch_geometric.loader import NeighborLoader      # PyG's own (needs pyg-lib or torch-sparse)

    python examples/pyg_graphsage.py                      # the embedded 120k-node dataset
    python examples/pyg_graphsage.py --nodes 3000 --epochs 1   # seconds on any machine
    python examples/pyg_graphsage.py --loader pyg         # the same script with PyG's loader
    python examples/pyg_graphsage.py --pipeline           # training minibatches loaded by the
                                                          # pipeline's processes (pipeline=True)

Needs torch_geometric (pip install torch-geometric). On a GPU the features stay in host memory
and the GPU reads the sampled rows in place; without one everything runs on the CPU.
"""

import argparse
import time

import torch
import torch.nn.functional as F
from torch_geometric.nn import GraphSAGE
from tqdm import tqdm

from pytorch_zerocopy.datasets import community_graph
from pytorch_zerocopy.pyg import data_from_dataset


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--loader", choices=["zerocopy", "pyg"], default="zerocopy")
    p.add_argument("--nodes", type=int, default=120_000)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--fanouts", default="10,10", help="neighbours per hop, seeds' hop first")
    p.add_argument("--pipeline", action="store_true",
                   help="load training minibatches in the pipeline's processes (this package's loader only)")
    args = p.parse_args(argv)
    if args.pipeline and args.loader != "zerocopy":
        p.error("--pipeline is an option of pytorch_zerocopy.pyg.NeighborLoader (--loader zerocopy)")
    return args


def main(argv=None) -> float:
    args = parse(argv)
    if args.loader == "zerocopy":
        from pytorch_zerocopy.pyg import NeighborLoader
    else:
        import torch_geometric.typing

        from torch_geometric.loader import NeighborLoader
        if not (torch_geometric.typing.WITH_PYG_LIB or torch_geometric.typing.WITH_TORCH_SPARSE):
            raise SystemExit("PyG's own NeighborLoader cannot sample here: it needs pyg-lib or torch-sparse")

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    print(f"generating the community dataset ({args.nodes:,} nodes)", flush=True)
    data = data_from_dataset(community_graph(num_nodes=args.nodes, seed=0))
    fanouts = [int(f) for f in args.fanouts.split(",")]

    # The one line that differs with --pipeline: sampling and gathers run in processes of their
    # own, the next minibatches in flight while the model trains on this one.
    extra = {"pipeline": True} if args.pipeline else {}

    # --- from here on: PyG's GraphSAGE example, unchanged ---------------------------------
    train_loader = NeighborLoader(data, num_neighbors=fanouts, batch_size=args.batch_size,
                                  input_nodes=data.train_mask, shuffle=True, **extra)
    test_loader = NeighborLoader(data, num_neighbors=fanouts, batch_size=args.batch_size,
                                 input_nodes=data.test_mask)
    model = GraphSAGE(data.num_features, 128, num_layers=len(fanouts), out_channels=data.num_classes).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)

    def train():
        model.train()
        total_loss = total = 0
        for batch in tqdm(train_loader, desc="training", unit="minibatch", leave=False):
            batch = batch.to(device)
            optimizer.zero_grad()
            out = model(batch.x, batch.edge_index, num_sampled_nodes_per_hop=batch.num_sampled_nodes,
                        num_sampled_edges_per_hop=batch.num_sampled_edges)[:batch.batch_size]
            loss = F.cross_entropy(out, batch.y[:batch.batch_size])
            loss.backward()
            optimizer.step()
            total_loss += loss.item() * batch.batch_size
            total += batch.batch_size
        return total_loss / total

    @torch.no_grad()
    def test():
        model.eval()
        correct = total = 0
        for batch in test_loader:
            batch = batch.to(device)
            pred = model(batch.x, batch.edge_index)[:batch.batch_size].argmax(dim=-1)
            correct += int((pred == batch.y[:batch.batch_size]).sum())
            total += batch.batch_size
        return correct / total

    print(f"training {args.epochs} epoch(s) of {len(train_loader)} minibatches on {data.num_nodes:,} nodes and "
          f"{data.num_edges:,} edges, then testing on {len(test_loader)} minibatches", flush=True)
    acc = 0.0
    for epoch in range(1, args.epochs + 1):
        start = time.perf_counter()
        loss = train()
        seconds = time.perf_counter() - start
        acc = test()
        print(f"epoch {epoch}: loss {loss:.4f}, test acc {acc:.4f}, {seconds:.2f} s "
              f"({NeighborLoader.__module__}.NeighborLoader on {device})")
    return acc


if __name__ == "__main__":
    main()
