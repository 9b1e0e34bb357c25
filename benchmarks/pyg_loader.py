"""PyG NeighborLoader epoch time: pytorch_zerocopy.pyg's loader against PyG's own.

Dataset: ``papers_like`` (a papers100M-like graph, generated on the GPU) as a PyG ``Data``
whose feature table stays in host memory. Workload: PyG's GraphSAGE example, fanouts [15, 10],
batches of 1024 training seeds, shuffled; every minibatch freshly sampled. Per loader, the
median over ``--epochs`` timed epochs (after one warm-up epoch) of

* the loader alone: iterate, ``batch.to(device)``, synchronise at the end of the epoch;
* training: the same plus PyG's ``GraphSAGE`` forward (trimmed per layer), backward, Adam step.

Loaders:

* ``zerocopy``: ``pytorch_zerocopy.pyg.NeighborLoader(data, ...)``: the GPU samples the
  host-resident CSC and gathers the feature rows from host memory in place.
* ``pyg``: ``torch_geometric.loader.NeighborLoader(data, ...)``: CPU sampling (pyg-lib or
  torch-sparse), CPU ``index_select`` of the rows, then a copy to the GPU. Measured only where
  PyG can sample; otherwise the result says so.
* ``cpu_dma`` (the DMA path, always measured): this package's loader with the graph and table
  on the CPU (``stores_from_data(data, placement="cpu")``): CPU sampling, CPU gather, copy to
  the GPU: what PyG's own loader does, with this package's CPU sampler.

Also in the same run: the pinned cudaMemcpy H2D ceiling, and each loader's feature rate (bytes
of ``x`` delivered per second of the loader-only epoch) as a fraction of it.

    python benchmarks/pyg_loader.py            # ~1 min on a 16-core host + one H100/H200
    python benchmarks/pyg_loader.py --quick    # seconds; tiny graph, works without a GPU

Writes pyg_loader.json and pyg_loader.md under --out (default benchmarks/results).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Dict, List

import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch_geometric.typing  # noqa: E402
from torch_geometric.nn import GraphSAGE  # noqa: E402

from benchmarks.common import environment, pinned_memcpy_gbs  # noqa: E402
from pytorch_zerocopy.datasets import papers_like  # noqa: E402
from pytorch_zerocopy.pyg import NeighborLoader, data_from_dataset, stores_from_data  # noqa: E402

FANOUTS = [15, 10]
BATCH = 1024


def run_epoch(loader, device, model, opt, train: bool, max_batches: int) -> Dict:
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    batches = feature_bytes = nodes = edges = 0
    for batch in loader:
        batch = batch.to(device, non_blocking=True)
        if train:
            opt.zero_grad()
            out = model(batch.x, batch.edge_index, num_sampled_nodes_per_hop=batch.num_sampled_nodes,
                        num_sampled_edges_per_hop=batch.num_sampled_edges)[:batch.batch_size]
            F.cross_entropy(out, batch.y[:batch.batch_size]).backward()
            opt.step()
        batches += 1
        feature_bytes += batch.x.numel() * batch.x.element_size()
        nodes += batch.num_nodes
        edges += batch.edge_index.shape[1]
        if batches == max_batches:
            break
    sync()
    seconds = time.perf_counter() - start
    return dict(seconds=seconds, batches=batches, feature_bytes=feature_bytes, nodes=nodes, edges=edges)


def measure(name: str, make_loader, device, num_features: int, num_classes: int, epochs: int,
            max_batches: int) -> Dict:
    torch.manual_seed(0)
    start = time.perf_counter()
    loader = make_loader()
    setup_s = time.perf_counter() - start
    model = GraphSAGE(num_features, 256, num_layers=len(FANOUTS), out_channels=num_classes).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=0.003)
    result = {"setup_s": setup_s}
    for kind, train in (("loader_only", False), ("train", True)):
        run_epoch(loader, device, model, opt, train, max_batches)  # warm-up
        runs: List[Dict] = [run_epoch(loader, device, model, opt, train, max_batches) for _ in range(epochs)]
        secs = [r["seconds"] for r in runs]
        med = statistics.median(secs)
        r0 = runs[0]
        result[kind] = dict(epoch_s=med, epoch_s_all=secs, batches=r0["batches"], ms_per_batch=med / r0["batches"] * 1e3,
                            feature_gbs=r0["feature_bytes"] / med / 1e9, nodes_per_batch=r0["nodes"] / r0["batches"],
                            edges_per_batch=r0["edges"] / r0["batches"])
        print(f"{name:>9} {kind:<11} epoch {med:7.3f} s ({r0['batches']} minibatches, "
              f"{result[kind]['ms_per_batch']:.2f} ms each, x at {result[kind]['feature_gbs']:.2f} GB/s)", flush=True)
    del loader
    return result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny graph, 1 timed epoch: a smoke test")
    p.add_argument("--nodes", type=int, default=1 << 23, help="papers_like nodes (default 2^23)")
    p.add_argument("--feature-dim", type=int, default=128)
    p.add_argument("--epochs", type=int, default=3, help="timed epochs per loader and kind (median)")
    p.add_argument("--max-batches", type=int, default=100, help="minibatches per epoch at most")
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"))
    p.add_argument("--name", default="pyg_loader", help="output file name stem")
    args = p.parse_args(argv)
    if args.quick:
        args.nodes, args.epochs, args.max_batches = 1 << 14, 1, 5
    wall0 = time.perf_counter()
    gpu = torch.cuda.is_available()
    device = torch.device("cuda" if gpu else "cpu")
    result: Dict = {"environment": environment(), "fanouts": FANOUTS, "batch_size": BATCH, "quick": args.quick}
    if gpu:
        result["pinned_h2d_gbs"] = pinned_memcpy_gbs()
        print(f"pinned memcpy H2D ceiling: {result['pinned_h2d_gbs']:.1f} GB/s", flush=True)

    start = time.perf_counter()
    ds = papers_like(args.nodes, feature_dim=args.feature_dim, train_fraction=0.012 if not args.quick else 0.1)
    data = data_from_dataset(ds)
    result["dataset"] = dict(name=ds.name, num_nodes=ds.num_nodes, num_edges=ds.num_edges,
                             feature_gib=ds.features.numel() * ds.features.element_size() / 2**30,
                             train_nodes=int(ds.train_idx.numel()), generate_s=time.perf_counter() - start)
    print(f"dataset {ds.describe()} in {result['dataset']['generate_s']:.1f} s", flush=True)

    common = dict(num_neighbors=FANOUTS, batch_size=BATCH, input_nodes=data.train_mask, shuffle=True)
    loaders = {
        "zerocopy": lambda: NeighborLoader(data, **common),
        "cpu_dma": lambda: NeighborLoader(stores_from_data(data, placement="cpu")[:2], **common),
    }
    pyg_can_sample = bool(torch_geometric.typing.WITH_PYG_LIB or torch_geometric.typing.WITH_TORCH_SPARSE)
    result["pyg_can_sample"] = pyg_can_sample
    if pyg_can_sample:
        from torch_geometric.loader import NeighborLoader as PygNeighborLoader

        loaders["pyg"] = lambda: PygNeighborLoader(data, **common)
    else:
        result["pyg_not_measured"] = ("PyG's own NeighborLoader cannot sample here: it needs pyg-lib or "
                                      "torch-sparse, and neither is installed")
        print(result["pyg_not_measured"], flush=True)

    modes = {}
    for name, make in loaders.items():
        modes[name] = measure(name, make, device, data.num_features, ds.num_classes, args.epochs, args.max_batches)
    result["modes"] = modes

    zc_train, zc_load = modes["zerocopy"]["train"]["epoch_s"], modes["zerocopy"]["loader_only"]["epoch_s"]
    bars: Dict = {
        "epoch_s_zerocopy": zc_train,
        "epoch_s_cpu_dma": modes["cpu_dma"]["train"]["epoch_s"],
        "speedup_vs_cpu_dma": modes["cpu_dma"]["train"]["epoch_s"] / zc_train,
        "loader_speedup_vs_cpu_dma": modes["cpu_dma"]["loader_only"]["epoch_s"] / zc_load,
        "pyg_own_loader_measured": pyg_can_sample,
    }
    if pyg_can_sample:
        bars["epoch_s_pyg"] = modes["pyg"]["train"]["epoch_s"]
        bars["speedup_vs_pyg"] = modes["pyg"]["train"]["epoch_s"] / zc_train
        bars["loader_speedup_vs_pyg"] = modes["pyg"]["loader_only"]["epoch_s"] / zc_load
    if gpu:
        bars["zerocopy_feature_gbs_over_memcpy"] = modes["zerocopy"]["loader_only"]["feature_gbs"] / result["pinned_h2d_gbs"]
    result["bars"] = bars
    result["wall_s"] = time.perf_counter() - wall0

    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"{args.name}.json"), "w") as f:
        json.dump(result, f, indent=2)
    write_markdown(result, os.path.join(args.out, f"{args.name}.md"))
    print(f"wrote {args.out}/{args.name}.{{json,md}} in {result['wall_s']:.0f} s", flush=True)
    return 0


def write_markdown(r: Dict, path: str) -> None:
    env, d = r["environment"], r["dataset"]
    lines = [
        "# PyG NeighborLoader epoch time",
        "",
        f"{env['date']} · {env.get('gpu') or 'no GPU'} (driver {env.get('driver')}) · torch {env['torch']} · "
        f"{env['cpus']} CPUs" + (" · --quick" if r["quick"] else ""),
        "",
        f"Dataset {d['name']}: {d['num_nodes']:,} nodes, {d['num_edges']:,} edges, features "
        f"{d['feature_gib']:.2f} GiB in host memory, {d['train_nodes']:,} training seeds; fanouts {r['fanouts']}, "
        f"batch {r['batch_size']}, shuffled, every minibatch freshly sampled. Epoch = median of timed epochs "
        "after a warm-up (at most the minibatches shown).",
        "",
    ]
    if "pinned_h2d_gbs" in r:
        lines += [f"Pinned cudaMemcpy H2D ceiling (same run): {r['pinned_h2d_gbs']:.1f} GB/s", ""]
    lines += ["| loader | minibatches | loader-only epoch s | ms/minibatch | x GB/s | training epoch s | setup s |",
              "|---|---|---|---|---|---|---|"]
    for name, m in r["modes"].items():
        lo, tr = m["loader_only"], m["train"]
        lines.append(f"| {name} | {lo['batches']} | {lo['epoch_s']:.3f} | {lo['ms_per_batch']:.2f} | "
                     f"{lo['feature_gbs']:.2f} | {tr['epoch_s']:.3f} | {m['setup_s']:.1f} |")
    if r.get("pyg_not_measured"):
        lines += ["", f"`pyg` not measured: {r['pyg_not_measured']}. `cpu_dma` stands in for its data path "
                  "(CPU sampling, CPU gather, copy to the GPU)."]
    lines += ["", "| bar | value |", "|---|---|"]
    for k, v in r["bars"].items():
        lines.append(f"| {k} | {v if isinstance(v, bool) else f'{v:.3f}'} |")
    lines += ["", f"Wall time {r['wall_s']:.0f} s (dataset {d['generate_s']:.1f} s)."]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
