"""PyG and DGL users at the pipeline's speed: this package's PyG ``NeighborLoader`` and DGL
``DataLoader``, in-process and with ``pipeline=True``, against the pipeline itself
(``zerocopy train``'s default plan) and the CPU loaders PyG users tune, on one dataset, in one
run.

Dataset: ``papers_like`` (a papers100M-like graph) as a PyG ``Data`` whose feature table stays
in host memory. Workload: batches of 1024 shuffled training seeds, PyG fanouts [15, 10] (the
first applies to the seeds; DGL's order, input side first, is (10, 15)), hidden 256, every
minibatch freshly sampled. An epoch is whole, as a user's is: each loader's input nodes are
``--epoch-batches`` batches' worth of the training nodes (a fixed random subset), so no epoch
is left early (leaving early makes the ``pipeline=True`` loaders drain the minibatches in
flight, a cost a whole epoch does not have). Per row, the median over ``--epochs`` timed epochs
(after a warm-up epoch) of

* the loader alone: iterate, move the minibatch to the device, synchronise at the end;
* training: the same plus a GraphSAGE forward, backward and Adam step per minibatch (PyG rows:
  PyG's ``GraphSAGE``, trimmed per layer; DGL rows: the pipeline's own ``GraphSAGE`` on blocks).

Rows:

* ``pipeline``: ``make_plan('zerocopy')`` + ``run_plan`` with DGL fanouts (10, 15): what
  ``zerocopy train`` does with no flags, on this dataset; its steady-state ms per minibatch is
  the denominator of the ``*_over_pipeline`` bars.
* ``pyg`` / ``pyg_pipeline``: ``pytorch_zerocopy.pyg.NeighborLoader(data, ...)``, in-process
  with its defaults (what a user gets: on a GPU ``x`` read from the host memory kind the plan
  chooses, behind the plan's default cache, samples queued two minibatches ahead and minibatches
  built one ahead, on side streams) and with
  ``pipeline=True`` (sampling and the gather of ``x`` in the pipeline's processes).
* ``pyg_pipeline_normal`` (diagnostic, GPU runs under MPS only): ``pyg_pipeline`` with its
  producer at MPS's normal client priority (``producer_yields=False`` in the loader's plan),
  the setting its default (below normal) is measured against.
* ``pyg_mapped`` / ``dgl_mapped``: the in-process loaders reading the mapped table without a
  cache (``feature_placement='unified', gpu_cache=None``), the earlier default; GPU runs only.
* ``dgl`` / ``dgl_pipeline``: ``pytorch_zerocopy.dgl.DataLoader`` over the same graph
  (``use_uva`` on a GPU), prefetching ``feat`` and ``label``, in-process (its defaults) and
  ``pipeline=True``.
* ``cpu_dma``: the PyG loader over CPU stores (``stores_from_data(data, placement='cpu')``):
  CPU sampling, CPU gather, copy to the GPU, in the training process.
* ``tuned_cpu``: what a PyG user tunes on the CPU: PyG's ``NodeLoader`` over the CPU stores with
  this package's sampler, ``--workers`` worker processes sampling and gathering
  (``filter_per_worker=True``, ``persistent_workers=True``) and ``pin_memory=True`` on a GPU.
* ``pyg_own``: PyG's own ``NeighborLoader`` with the same workers and pinned memory, where
  pyg-lib or torch-sparse is installed (over torch-sparse alone it gives no per-hop counts, so
  the model is not trimmed per layer). The package index this benchmark was written with has no
  pyg-lib distribution and torch-sparse (0.6.18) and torch-scatter (2.1.2) as source only; both
  build for the CPU against the installed torch with ``FORCE_ONLY_CPU=1 pip wheel
  --no-build-isolation`` (torch-scatter first: torch-sparse imports it). The result says when
  the row was not measured. On a machine without a GPU every row runs on the CPU (``on_gpu``
  false in the bars, whose targets are for a GPU machine): ``--name pyg_loader_cpu`` keeps such
  a run beside the GPU machine's.

Stage timings (``StageTimes``: sample, gather, build, deliver; ms per minibatch, p50 and mean),
apart from the timed epochs (which run untimed, as a user's loader does): for the
``pipeline=True`` rows over one training epoch of a second loader whose processes trace from
their start (sample and gather measured in the producer process, build and deliver in the
training process; each minibatch's deliver time, in the epoch's order, as ``deliver_ms_all``:
where in an epoch the loop waits for the producer), for the in-process rows over one extra
training epoch with a GPU synchronisation around each stage.

Bars: ``pyg_loader_over_pipeline`` and ``dgl_loader_over_pipeline`` (the in-process loader
alone, ms per minibatch, over the pipeline's; the same ratios of the ``pipeline=True`` rows and
of their training beside them); ``pyg_train_over_max_stage`` (a ``pyg_pipeline`` training
epoch, ms per minibatch, over the larger of its loader alone and the PyG model step alone,
the step timed on minibatches held from the start, as many steps as an epoch has minibatches,
right before and right after each training epoch (their mean is that epoch's): 1.0 means loading
is wholly hidden behind the step; the median of the epochs' ratios, their range beside it as
``_min`` and ``_max``);
``pyg_speedup_over_tuned_cpu_loader`` (the fastest of ``tuned_cpu`` and ``pyg_own`` over ``pyg_pipeline``, training).

Where a training epoch's host time goes: each row's ``host_loader_ms`` (in the loader's
``next()`` and the move to the device) and ``host_step_ms`` (in the step) per minibatch, of
which ``gc_ms`` in Python's cyclic garbage collector (``gc_collections_all``: per epoch, its
collections by generation), and the step alone's host share (``step_alone_host_ms_all``): a
step whose host share is its time is bound by the host thread, which the loader's work in the
training process then adds to.
``--variants`` (diagnostic) adds ``pyg_pipeline`` rows with other settings of the loader's plan.

Diagnostic: ``--profile N`` adds, for the in-process ``pyg`` and ``dgl`` rows among those run,
where the host time of N loader-only minibatches goes, and for ``pyg_pipeline`` that of N
training minibatches in the training process (after a warm-up): ``cProfile``'s
functions by own time and ``torch.profiler``'s ops by self CPU time, and on a GPU by self CUDA
time (``host_profiles`` in the JSON, one section each in the report). It times nothing that a bar reads.

    python benchmarks/pyg_loader.py            # a few minutes on a 16-core host + one H100/H200
    python benchmarks/pyg_loader.py --quick    # a tiny graph; runs without a GPU

Writes pyg_loader.json and pyg_loader.md under --out (default benchmarks/results).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import sys
import time
from dataclasses import fields, replace
from typing import Callable, Dict, Optional, Tuple

import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch_geometric.typing  # noqa: E402
from torch_geometric.loader import NodeLoader  # noqa: E402
from torch_geometric.nn import GraphSAGE as PygGraphSAGE  # noqa: E402

from benchmarks.common import environment, pinned_memcpy_gbs  # noqa: E402
from pytorch_zerocopy.datasets import papers_like  # noqa: E402
from pytorch_zerocopy.dgl import DataLoader, NeighborSampler as DglNeighborSampler  # noqa: E402
from pytorch_zerocopy.graph import CSRGraph  # noqa: E402
from pytorch_zerocopy.nn import GraphSAGE  # noqa: E402
from pytorch_zerocopy.ops import GatherTuning  # noqa: E402
from pytorch_zerocopy.pipeline import Plan, make_plan  # noqa: E402
from pytorch_zerocopy.pipeline.loader import loader_plan  # noqa: E402
from pytorch_zerocopy.pipeline.partition import MPS_CONTROL, run_as_client, this_process_client_env  # noqa: E402
from pytorch_zerocopy.pipeline.plan import available_cores  # noqa: E402
from pytorch_zerocopy.pipeline.trace import Stage, StageTimes  # noqa: E402
from pytorch_zerocopy.pyg import NeighborLoader, NeighborSampler, data_from_dataset, stores_from_data  # noqa: E402
from pytorch_zerocopy.train import run_plan  # noqa: E402

FANOUTS = [15, 10]  # PyG's order: the first applies to the seeds
DGL_FANOUTS = tuple(reversed(FANOUTS))  # DGL's and the pipeline's order: input side first
HELD_BATCHES = 8  # minibatches held to time the model step alone
STEP_ALONE_ROWS = ("pyg_pipeline", "pyg_pipeline_normal")  # rows whose training is compared with the step alone
PLAN_SETTINGS = {f.name for f in fields(Plan)}
VARIANT_PREFIX = "pyg_pipeline_v_"  # --variants rows: also compared with the step alone
PYG_OWN_NOTE = ("PyG's own NeighborLoader cannot sample here: it needs pyg-lib or torch-sparse, and neither is "
                "installed. The package index has no pyg-lib distribution; torch-sparse 0.6.18 and torch-scatter "
                "2.1.2 come as source and build for the CPU (FORCE_ONLY_CPU=1 pip wheel --no-build-isolation).")


class Family:
    """How a row's minibatches are trained on and measured: PyG ``Data`` or DGL blocks."""

    def __init__(self, kind: str, num_features: int, num_classes: int, hidden: int, device: torch.device):
        self.kind, self.device = kind, device
        torch.manual_seed(0)
        if kind == "pyg":
            self.model = PygGraphSAGE(num_features, hidden, num_layers=len(FANOUTS), out_channels=num_classes)
        else:
            self.model = GraphSAGE(num_features, hidden, num_classes, len(DGL_FANOUTS))
        self.model = self.model.to(device)
        self.opt = torch.optim.Adam(self.model.parameters(), lr=0.003)

    def to_device(self, batch):
        if self.kind == "pyg":
            return batch.to(self.device, non_blocking=True)
        _, output_nodes, blocks = batch
        return output_nodes, [b.to(self.device, non_blocking=True) for b in blocks]

    def step(self, batch) -> None:
        self.opt.zero_grad()
        if self.kind == "pyg":
            # Trimmed per layer where the loader gives per-hop counts (PyG's over torch-sparse alone does not).
            hops = {"num_sampled_nodes_per_hop": batch.num_sampled_nodes,
                    "num_sampled_edges_per_hop": batch.num_sampled_edges} if "num_sampled_nodes" in batch else {}
            out = self.model(batch.x, batch.edge_index, **hops)[:batch.batch_size]
            loss = F.cross_entropy(out, batch.y[:batch.batch_size])
        else:
            _, blocks = batch
            loss = F.cross_entropy(self.model(blocks, blocks[0].srcdata["feat"].float()), blocks[-1].dstdata["label"])
        loss.backward()
        self.opt.step()

    def sizes(self, batch) -> tuple:
        """(feature bytes, nodes, edges) of a minibatch on the device."""
        if self.kind == "pyg":
            return batch.x.numel() * batch.x.element_size(), batch.num_nodes, batch.edge_index.shape[1]
        _, blocks = batch
        x = blocks[0].srcdata["feat"]
        return x.numel() * x.element_size(), blocks[0].num_src_nodes(), sum(b.num_edges() for b in blocks)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


class GcClock:
    """Host time in Python's cyclic garbage collector (``gc.callbacks``), and its collections
    by generation, since :meth:`reset`: a training loop's host time that neither the loader's
    code nor the step's own accounts for."""

    def __init__(self):
        self.seconds, self.collections, self._began = 0.0, [0, 0, 0], 0.0

    def reset(self) -> None:
        self.seconds, self.collections = 0.0, [0, 0, 0]

    def __call__(self, phase: str, info: Dict) -> None:
        if phase == "start":
            self._began = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._began
            self.collections[info["generation"]] += 1


GC_CLOCK = GcClock()


def run_epoch(loader, family: Family, train: bool, max_batches: Optional[int] = None) -> Dict:
    """One epoch of ``loader``, whole (or its first ``max_batches``: a diagnostic's). A
    loader-only epoch also adds up its minibatches' sizes; a training epoch does not (a user's
    loop has no such work, and the step alone it is compared with does none)."""
    sync(family.device)
    GC_CLOCK.reset()
    start = time.perf_counter()
    batches = feature_bytes = nodes = edges = 0
    host_loader = host_step = 0.0  # host seconds in the loader's next() and in the step
    it = iter(loader)
    while True:
        began = time.perf_counter()
        batch = next(it, None)
        if batch is None:
            break
        batch = family.to_device(batch)
        stepped = time.perf_counter()
        host_loader += stepped - began
        if train:
            family.step(batch)
            host_step += time.perf_counter() - stepped
        else:
            sizes = family.sizes(batch)
            feature_bytes, nodes, edges = feature_bytes + sizes[0], nodes + sizes[1], edges + sizes[2]
        batches += 1
        if batches == max_batches:
            break
    sync(family.device)
    return dict(seconds=time.perf_counter() - start, batches=batches, feature_bytes=feature_bytes, nodes=nodes,
                edges=edges, host_loader_s=host_loader, host_step_s=host_step, gc_s=GC_CLOCK.seconds,
                gc_collections=list(GC_CLOCK.collections))


def hold_batches(loader, family: Family) -> list:
    """``HELD_BATCHES`` minibatches of ``loader``, on the device (an epoch left early)."""
    held = []
    for batch in loader:
        held.append(family.to_device(batch))
        if len(held) == HELD_BATCHES:
            break
    family.step(held[0])
    sync(family.device)
    return held


def step_alone_ms(held: list, family: Family, steps: int) -> Tuple[float, float]:
    """The model step alone, ``steps`` times over the ``held`` minibatches in turn (as many
    steps as an epoch has minibatches: as long as an epoch, so that the host's drift weighs on
    both alike): ms per step, and the host's share of it (ms per step until the last step is
    queued, before the final wait)."""
    sync(family.device)
    start = time.perf_counter()
    for i in range(steps):
        family.step(held[i % len(held)])
    queued = time.perf_counter()
    sync(family.device)
    return (time.perf_counter() - start) / steps * 1e3, (queued - start) / steps * 1e3


def stage_stat(times: StageTimes, stat: str) -> Dict[str, float]:
    """``stat`` (``p50``, ``mean``) of each stage's times that has any, ms."""
    return {stage: s[stat] for stage, s in times.summary().items() if s.get("n")}


def measure(name: str, make_loader: Callable, family: Family, args, processes: bool) -> Dict:
    """One loader row: setup, loader-only and training epochs; stage timings of our loaders."""
    torch.manual_seed(0)
    start = time.perf_counter()
    loader = make_loader()
    result: Dict = {"setup_s": time.perf_counter() - start}
    ours = hasattr(loader, "stage_times")
    # The model step alone is timed right before and right after each training epoch, as many
    # steps as the epoch has minibatches, on minibatches held from the start: each epoch's ratio
    # to the larger stage compares it with the mean of the two, times of one stretch of the run.
    held = hold_batches(loader, family) if name in STEP_ALONE_ROWS or name.startswith(VARIANT_PREFIX) else None
    steps, steps_host, before, after = [], [], [], []
    for kind, train in (("loader_only", False), ("train", True)):
        run_epoch(loader, family, train)  # warm-up (starts the processes of the process way)
        runs = []
        for _ in range(args.epochs):
            if train and held:
                before.append(step_alone_ms(held, family, len(loader)))
            runs.append(run_epoch(loader, family, train))
            if train and held:
                after.append(step_alone_ms(held, family, len(loader)))
                steps.append((before[-1][0] + after[-1][0]) / 2)
                steps_host.append((before[-1][1] + after[-1][1]) / 2)
        if any(r["batches"] != len(loader) for r in runs):  # every epoch whole
            raise RuntimeError(f"an epoch gave {[r['batches'] for r in runs]} minibatches, not {len(loader)}")
        med = statistics.median(r["seconds"] for r in runs)
        r0 = runs[0]
        per_batch = 1e3 / r0["batches"]
        sizes = {} if train else dict(feature_gbs=r0["feature_bytes"] / med / 1e9,
                                      nodes_per_batch=r0["nodes"] / r0["batches"],
                                      edges_per_batch=r0["edges"] / r0["batches"])
        result[kind] = dict(epoch_s=med, epoch_s_all=[r["seconds"] for r in runs], batches=r0["batches"],
                            ms_per_batch=med * per_batch, **sizes,
                            host_loader_ms=statistics.median(r["host_loader_s"] for r in runs) * per_batch,
                            host_step_ms=statistics.median(r["host_step_s"] for r in runs) * per_batch,
                            gc_ms=statistics.median(r["gc_s"] for r in runs) * per_batch,
                            gc_collections_all=[r["gc_collections"] for r in runs])
        rate = "" if train else f", x at {result[kind]['feature_gbs']:.2f} GB/s"
        print(f"{name:>13} {kind:<11} epoch {med:7.3f} s ({r0['batches']} minibatches, "
              f"{result[kind]['ms_per_batch']:.2f} ms each{rate}; host in the loader "
              f"{result[kind]['host_loader_ms']:.2f} ms, in the step {result[kind]['host_step_ms']:.2f} ms, in gc "
              f"{result[kind]['gc_ms']:.3f} ms)", flush=True)
    if processes:
        result["plan"] = loader.processes.plan.describe()
    if ours:
        # Timed by stage apart from the epochs above, as a user's loader runs untimed. The
        # process way's producer traces from its start (event pairs, no synchronisation): a
        # second loader, one warm-up and one traced training epoch.
        if processes:
            loader.close()
            loader = make_loader()
            loader.stage_times = StageTimes()
            run_epoch(loader, family, True)
            loader.stage_times.clear()
        else:
            loader.stage_times = StageTimes(synchronize=family.device.type == "cuda")
        run_epoch(loader, family, True)
        # Means beside medians: a producer that gathers several minibatches at once delivers
        # them in bursts, so most deliveries wait for nothing and the median hides the waits.
        result["stages_ms"] = stage_stat(loader.stage_times, "p50")
        result["stages_mean_ms"] = stage_stat(loader.stage_times, "mean")
        if processes:  # in the epoch's order: where in an epoch the loop waits for the producer
            result["deliver_ms_all"] = [round(ms, 4) for ms in loader.stage_times.values[Stage.DELIVER]]
        loader.stage_times = None
        print(f"{name:>13} stages (ms p50): {result['stages_ms']}; mean: {result['stages_mean_ms']}", flush=True)
    if steps:
        result["step_alone_ms"], result["step_alone_ms_all"] = statistics.median(steps), steps
        result["step_alone_host_ms_all"] = steps_host
        result["step_alone_before_ms_all"] = [wall for wall, _ in before]
        result["step_alone_after_ms_all"] = [wall for wall, _ in after]
        print(f"{name:>13} model step alone {result['step_alone_ms']:.2f} ms (each training epoch's, the mean of "
              f"before and after it: {', '.join(f'{t:.2f}' for t in steps)})", flush=True)
    del held
    if hasattr(loader, "close"):
        loader.close()
    del loader
    gc.collect()
    return result


# The rows whose host work --profile reports, and whether it profiles their training epochs
# (the process way: the training process's side of loading hidden behind the step) or the
# loader alone.
PROFILED_ROWS = {"pyg": False, "dgl": False, "pyg_pipeline": True}
PROFILE_ROWS = 25  # lines of each profile table


def host_profile(make_loader: Callable, family: Family, batches: int, train: bool = False) -> Dict:
    """Where the host time of ``batches`` minibatches goes (diagnostic, see the module
    docstring), loader alone or with the training step (``train``): cProfile's functions by own
    time, torch.profiler's ops by self CPU time (and by self CUDA time on a GPU)."""
    import cProfile
    import io
    import pstats

    from torch.profiler import ProfilerActivity, profile

    torch.manual_seed(0)
    loader = make_loader()
    run_epoch(loader, family, train)  # warm-up (starts the processes of the process way)
    calls = cProfile.Profile()
    calls.enable()
    r = run_epoch(loader, family, train, batches)
    calls.disable()
    text = io.StringIO()
    pstats.Stats(calls, stream=text).strip_dirs().sort_stats("tottime").print_stats(PROFILE_ROWS)
    on_gpu = torch.cuda.is_available()
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])) as ops:
        run_epoch(loader, family, train, batches)
    averages = ops.key_averages()
    table = averages.table(sort_by="self_cpu_time_total", row_limit=PROFILE_ROWS)
    if on_gpu:  # the GPU's side of the same minibatches: kernels and copies by their own time
        table += "\n" + averages.table(sort_by="self_cuda_time_total", row_limit=PROFILE_ROWS)
    if hasattr(loader, "close"):
        loader.close()
    del loader
    gc.collect()
    return {"batches": r["batches"], "train": train, "ms_per_batch_under_cprofile": r["seconds"] / max(r["batches"], 1) * 1e3,
            "cprofile": text.getvalue().strip(), "torch_profiler": table}


def attempt(name: str, fn: Callable[[], Dict]) -> Dict:
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - report the row and go on with the others
        print(f"{name:>13} FAILED: {e}", flush=True)
        return {"error": str(e).strip().splitlines()[-1][:500]}


def pipeline_row(ds, args) -> Dict:
    """``zerocopy train``'s default plan on the dataset: its last epoch's steady-state rate."""
    plan = make_plan("zerocopy", row_bytes=ds.row_bytes, table_bytes=ds.feature_source.nbytes, fanouts=DGL_FANOUTS,
                     batch_size=args.batch_size, epochs=2, max_batches=args.epoch_batches, val_batches=1, hidden=args.hidden,
                     trace=True)
    start = time.perf_counter()
    last = run_plan(plan, ds, mps_fallback=True, quiet=True)[-1]
    producer = last.trace.producer if last.trace else {}
    row = {"plan": plan.describe(), "ms_per_batch": last.steady_ms_per_minibatch, "wall_s": time.perf_counter() - start,
           "stages_ms": {k.replace("_ms", ""): v["p50"] for k, v in producer.items()
                         if k in ("sample_ms", "gather_ms") and v.get("n")}}
    print(f"{'pipeline':>13} {row['ms_per_batch']:.2f} ms per minibatch ({row['plan']})", flush=True)
    return row


def epoch_nodes(train_idx: torch.Tensor, count: int) -> torch.Tensor:
    """The loaders' input nodes: ``count`` of the training nodes, a fixed random subset (all of
    them where there are fewer)."""
    pick = torch.randperm(train_idx.numel(), generator=torch.Generator().manual_seed(0))[:count]
    return train_idx[pick.sort().values]


def loaders(data, ds, args, gpu: bool) -> Dict[str, tuple]:
    """name -> (family kind, make_loader, runs in processes)."""
    batch = args.batch_size
    seeds = epoch_nodes(ds.train_idx, args.epoch_batches * batch)
    common = dict(num_neighbors=FANOUTS, batch_size=batch, input_nodes=seeds, shuffle=True)
    workers = dict(num_workers=args.workers, pin_memory=gpu, persistent_workers=True)
    graph = CSRGraph(ds.graph.indptr, ds.graph.indices, validate=False, ndata={"feat": ds.features, "label": ds.labels})
    # ds.graph's rows are in-neighbour lists: DGL's "in" sampling reads them as stored ("out").
    sampler = DglNeighborSampler(list(DGL_FANOUTS), edge_dir="out", prefetch_node_feats=["feat"],
                                 prefetch_labels=["label"])
    device = torch.device("cuda" if gpu else "cpu")
    dgl = dict(batch_size=batch, shuffle=True, device=device, use_uva=gpu)

    def tuned_cpu():
        stores = stores_from_data(data, placement="cpu")[:2]
        return NodeLoader(stores, NeighborSampler(stores, FANOUTS), input_nodes=seeds, batch_size=batch,
                          shuffle=True, filter_per_worker=True, **workers)

    def variant(settings: Dict) -> Callable:
        """The process way with ``settings`` of the loader's plan replaced."""
        def make():
            plan = loader_plan(list(reversed(FANOUTS)), batch, ds.row_bytes, ds.feature_source.nbytes)
            return NeighborLoader(data, pipeline=replace(plan, **settings), **common)
        return make

    rows = {VARIANT_PREFIX + name: ("pyg", variant(settings), True) for name, settings in args.variants.items()}
    rows.update({
        "pyg": ("pyg", lambda: NeighborLoader(data, **common), False),
        "pyg_mapped": ("pyg", lambda: NeighborLoader(data, feature_placement="unified", gpu_cache=None, **common),
                       False),
        "dgl_mapped": ("dgl", lambda: DataLoader(graph, seeds, sampler, feature_placement="unified",
                                                 gpu_cache=None, **dgl), False),
        "pyg_pipeline": ("pyg", lambda: NeighborLoader(data, pipeline=True, **common), True),
        "pyg_pipeline_normal": ("pyg", variant({"producer_yields": False}), True),
        "dgl": ("dgl", lambda: DataLoader(graph, seeds, sampler, **dgl), False),
        "dgl_pipeline": ("dgl", lambda: DataLoader(graph, seeds, sampler, pipeline=True, **dgl), True),
        "cpu_dma": ("pyg", lambda: NeighborLoader(stores_from_data(data, placement="cpu")[:2], **common), False),
        "tuned_cpu": ("pyg", tuned_cpu, False),
    })
    if not gpu:  # the placements are where a GPU reads x from
        del rows["pyg_mapped"], rows["dgl_mapped"]
    if this_process_client_env(100.0) is None:  # no MPS: no client priority to compare
        del rows["pyg_pipeline_normal"]
    if torch_geometric.typing.WITH_PYG_LIB or torch_geometric.typing.WITH_TORCH_SPARSE:
        from torch_geometric.loader import NeighborLoader as PygNeighborLoader

        rows["pyg_own"] = ("pyg", lambda: PygNeighborLoader(data, filter_per_worker=True, **common, **workers), False)
    return rows


def train_ms(modes: Dict, name: str) -> Optional[float]:
    row = modes.get(name) or {}
    return row["train"]["ms_per_batch"] if "train" in row else None


def loader_ms(modes: Dict, name: str) -> Optional[float]:
    row = modes.get(name) or {}
    return row["loader_only"]["ms_per_batch"] if "loader_only" in row else None


def over_max_stage(row: Dict) -> Optional[Dict[str, float]]:
    """A process-way row's training epochs over the larger of its loader alone (the median of
    its loader-only epochs, ms per minibatch) and the model step alone (timed around the same
    epoch): the issue's ratio, 1.0 when loading is wholly hidden behind the step. The median over
    the epochs (the bar), their range, and the larger stage at the median step; None without
    the timings."""
    steps = row.get("step_alone_ms_all")
    if not steps or "train" not in row or "loader_only" not in row:
        return None
    train, loading = row["train"], row["loader_only"]["ms_per_batch"]
    ratios = [epoch / train["batches"] * 1e3 / max(loading, step) for epoch, step in zip(train["epoch_s_all"], steps)]
    return {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios),
            "max_stage_ms": max(loading, statistics.median(steps))}


def compute_bars(modes: Dict, pipeline: Dict, on_gpu: bool) -> Dict:
    """The issue's bars (its targets are for a GPU machine; ``on_gpu``, whether the rows ran on
    one): ``pyg_loader_over_pipeline`` / ``dgl_loader_over_pipeline`` (the
    in-process loader alone over the pipeline's ms per minibatch), ``pyg_train_over_max_stage``
    (a ``pipeline=True`` PyG training epoch over the larger of its loader alone and the step
    alone) and
    ``pyg_speedup_over_tuned_cpu_loader``; beside them the same ratios for the other rows."""
    pipe = pipeline.get("ms_per_batch")
    bars: Dict = {"on_gpu": on_gpu, "pipeline_ms_per_minibatch": pipe,
                  "pyg_own_loader_measured": "pyg_own" in modes}
    for name in ("pyg_pipeline", "dgl_pipeline", "pyg", "dgl"):
        bars[f"{name}_loader_ms_per_minibatch"] = loader_ms(modes, name)
        bars[f"{name}_train_ms_per_minibatch"] = train_ms(modes, name)
    ratio = lambda a, b: a / b if a and b else None  # noqa: E731
    bars["pyg_loader_over_pipeline"] = ratio(loader_ms(modes, "pyg"), pipe)
    bars["dgl_loader_over_pipeline"] = ratio(loader_ms(modes, "dgl"), pipe)
    bars["pyg_mapped_loader_over_pipeline"] = ratio(loader_ms(modes, "pyg_mapped"), pipe)
    bars["dgl_mapped_loader_over_pipeline"] = ratio(loader_ms(modes, "dgl_mapped"), pipe)
    bars["pyg_pipeline_loader_over_pipeline"] = ratio(loader_ms(modes, "pyg_pipeline"), pipe)
    bars["dgl_pipeline_loader_over_pipeline"] = ratio(loader_ms(modes, "dgl_pipeline"), pipe)
    bars["pyg_pipeline_train_over_pipeline"] = ratio(train_ms(modes, "pyg_pipeline"), pipe)
    bars["pyg_in_process_train_over_pipeline"] = ratio(train_ms(modes, "pyg"), pipe)
    compared = [("pyg_pipeline", "pyg_train_over_max_stage"),
                ("pyg_pipeline_normal", "pyg_normal_priority_train_over_max_stage")]
    compared += [(name, f"{name}_train_over_max_stage") for name in modes if name.startswith(VARIANT_PREFIX)]
    for name, bar in compared:
        over = over_max_stage(modes.get(name) or {})
        if over is not None:
            if name == "pyg_pipeline":
                bars["pyg_max_stage_ms"] = over["max_stage_ms"]
            bars[bar], bars[f"{bar}_min"], bars[f"{bar}_max"] = over["median"], over["min"], over["max"]
    tuned = {n: train_ms(modes, n) for n in ("tuned_cpu", "pyg_own") if train_ms(modes, n)}
    if tuned:
        best = min(tuned, key=tuned.get)
        bars["tuned_cpu_loader"] = best
        bars["pyg_speedup_over_tuned_cpu_loader"] = ratio(tuned[best], train_ms(modes, "pyg_pipeline"))
    return bars


def parse_variants(text: str) -> Dict[str, Dict]:
    """``--variants``: ``{name: {plan setting: value}}``."""
    variants: Dict[str, Dict] = {}
    for spec in filter(None, (v.strip() for v in text.split(";"))):
        name, _, settings = spec.partition(":")
        parsed: Dict = {}
        for item in filter(None, settings.split(",")):
            key, eq, value = item.partition("=")
            if not name or not eq or key not in PLAN_SETTINGS:
                raise argparse.ArgumentTypeError(f"--variants: {spec!r}: want NAME:SETTING=VALUE,... with settings of "
                                                 f"the loader's plan ({', '.join(sorted(PLAN_SETTINGS))})")
            if key == "gather_tuning":
                blocks, _, unroll = value.partition("/")
                parsed[key] = GatherTuning(int(blocks), int(unroll or 0))
            elif value in ("True", "False"):
                parsed[key] = value == "True"
            else:
                parsed[key] = float(value) if "." in value else int(value)
        variants[name] = parsed
    return variants


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny graph, 1 timed epoch: a smoke test")
    p.add_argument("--nodes", type=int, default=1 << 25, help="papers_like nodes (default 2^25: a 16 GiB table)")
    p.add_argument("--feature-dim", type=int, default=128)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=1024)
    # Nine: the host's speed drifts between epochs, and the bars are medians of per-epoch
    # figures; a median of fewer follows the drift more.
    p.add_argument("--epochs", type=int, default=9, help="timed epochs per loader and kind (median)")
    p.add_argument("--epoch-batches", type=int, default=100,
                   help="minibatches per epoch: the loaders' input nodes are that many batches' worth of the "
                        "training nodes, so every epoch runs whole")
    p.add_argument("--workers", type=int, default=None, help="tuned CPU loaders' worker processes "
                                                             "(default: the cores less two, at most 8)")
    p.add_argument("--rows", default=None, help="loader rows to run, comma-separated (default: all); the pipeline "
                                                "row always runs (its rate is every bar's denominator), and so "
                                                "do the --variants rows")
    p.add_argument("--profile", type=int, default=0, metavar="N",
                   help="diagnostic: profile the host work of N minibatches of the pyg and dgl rows (loader alone) "
                        "and of the pyg_pipeline row (training)")
    p.add_argument("--profile-rows", default=None,
                   help=f"with --profile, the rows to profile, comma-separated (default: those of "
                        f"{sorted(PROFILED_ROWS)} that run)")
    p.add_argument("--variants", type=parse_variants, default={},
                   help="diagnostic rows: 'NAME:SETTING=VALUE,...;...' runs pyg_pipeline with those settings of the "
                        "loader's plan as row pyg_pipeline_v_NAME (gather_tuning=BLOCKS/UNROLL); no bar reads them")
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"))
    p.add_argument("--name", default="pyg_loader", help="output file name stem")
    p.add_argument("--mps", choices=("auto", "off"), default="auto",
                   help="auto: on a GPU, run as a client of a private MPS daemon (as 'zerocopy mps -- python "
                        "...' runs a user's script), so the pipeline=True rows share the GPU with their producer; "
                        "off: run as started")
    args = p.parse_args(argv)
    if args.mps == "auto" and torch.cuda.is_available() and this_process_client_env(100.0) is None \
            and shutil.which(MPS_CONTROL):
        print("running under a private MPS daemon (zerocopy mps)", flush=True)
        return run_as_client([sys.executable, os.path.abspath(__file__), *(sys.argv[1:] if argv is None else argv)])
    if args.epoch_batches < 1 or args.epochs < 1:
        p.error(f"--epoch-batches and --epochs must be >= 1, got {args.epoch_batches} and {args.epochs}")
    profiled = [r.strip() for r in args.profile_rows.split(",")] if args.profile_rows else list(PROFILED_ROWS)
    unknown = [r for r in profiled if r not in PROFILED_ROWS]
    if unknown:
        p.error(f"--profile-rows: rows {unknown} are not profiled; choose from {sorted(PROFILED_ROWS)}")
    if args.quick:
        args.nodes, args.epochs, args.epoch_batches, args.hidden, args.batch_size = 1 << 14, 1, 5, 64, 256
    args.workers = args.workers or max(1, min(8, available_cores() - 2))
    gc.callbacks.append(GC_CLOCK)
    wall0 = time.perf_counter()
    gpu = torch.cuda.is_available()
    device = torch.device("cuda" if gpu else "cpu")
    result: Dict = {"environment": environment(), "mps_client": this_process_client_env(100.0) is not None,
                    "fanouts": FANOUTS, "batch_size": args.batch_size, "hidden": args.hidden,
                    "workers": args.workers, "quick": args.quick}
    if gpu:
        result["pinned_h2d_gbs"] = pinned_memcpy_gbs()
        print(f"pinned memcpy H2D ceiling: {result['pinned_h2d_gbs']:.1f} GB/s", flush=True)

    start = time.perf_counter()
    ds = papers_like(args.nodes, feature_dim=args.feature_dim, train_fraction=0.012 if not args.quick else 0.1)
    data = data_from_dataset(ds)
    result["dataset"] = dict(name=ds.name, num_nodes=ds.num_nodes, num_edges=ds.num_edges,
                             feature_gib=ds.features.numel() * ds.features.element_size() / 2**30,
                             train_nodes=int(ds.train_idx.numel()), generate_s=time.perf_counter() - start)
    result["epoch_batches"] = args.epoch_batches
    print(f"dataset {ds.describe()} in {result['dataset']['generate_s']:.1f} s", flush=True)

    result["pipeline"] = attempt("pipeline", lambda: pipeline_row(ds, args))
    rows = loaders(data, ds, args, gpu)
    wanted = [r.strip() for r in (args.rows.split(",") if args.rows else rows) if r.strip()]
    wanted += [r for r in rows if r.startswith(VARIANT_PREFIX) and r not in wanted]  # asked for by --variants
    if "pipeline" in wanted:
        print("--rows: 'pipeline' always runs (it is every bar's denominator); nothing to add", flush=True)
        wanted = [r for r in wanted if r != "pipeline"]
    unknown = [r for r in wanted if r not in rows]
    if unknown:
        p.error(f"--rows: unknown rows {unknown}; choose from {sorted(rows)} (the pipeline row always runs)")
    if "pyg_own" not in rows:
        result["pyg_not_measured"] = PYG_OWN_NOTE
        print(PYG_OWN_NOTE, flush=True)
    modes = {}
    for name in wanted:
        kind, make, processes = rows[name]
        family = Family(kind, ds.feature_dim, ds.num_classes, args.hidden, device)
        modes[name] = attempt(name, lambda: measure(name, make, family, args, processes))
    result["modes"] = modes
    if args.profile:
        result["host_profiles"] = {}
        for name, train in PROFILED_ROWS.items():
            if name not in wanted or name not in profiled:
                continue
            kind, make, _ = rows[name]
            family = Family(kind, ds.feature_dim, ds.num_classes, args.hidden, device)
            result["host_profiles"][name] = attempt(f"{name} profile",
                                                    lambda: host_profile(make, family, args.profile, train))
    result["bars"] = compute_bars(modes, result["pipeline"], gpu)
    result["wall_s"] = time.perf_counter() - wall0

    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"{args.name}.json"), "w") as f:
        json.dump(result, f, indent=2)
    write_markdown(result, os.path.join(args.out, f"{args.name}.md"))
    print(f"wrote {args.out}/{args.name}.{{json,md}} in {result['wall_s']:.0f} s", flush=True)
    return 0


def _fmt(v) -> str:
    if v is None:
        return "n/a"
    return str(v) if isinstance(v, (bool, str)) else f"{v:.3f}"


def _range_ms(kind: Dict) -> str:
    per = [e / kind["batches"] * 1e3 for e in kind["epoch_s_all"]]
    return f"{min(per):.2f}–{max(per):.2f}"


def write_markdown(r: Dict, path: str) -> None:
    env, d, pipe = r["environment"], r["dataset"], r["pipeline"]
    lines = [
        "# PyG and DGL loaders against the pipeline",
        "",
        f"{env['date']} · {env.get('gpu') or 'no GPU'} (driver {env.get('driver')}) · torch {env['torch']} · "
        f"{env['cpus']} CPUs" + (" · --quick" if r["quick"] else ""),
        "",
        *([f"Host: {env.get('cpu_model') or 'CPU model unknown'}; one thread runs the reference Python loop in "
           f"{env['host_speed']['python_loop_ms']:.1f} ms and a small torch op in "
           f"{env['host_speed']['torch_op_us']:.1f} µs (the loaders are host-bound: runs on other hosts compare "
           "by these)", ""] if env.get("host_speed") else []),
        f"Dataset {d['name']}: {d['num_nodes']:,} nodes, {d['num_edges']:,} edges, features "
        f"{d['feature_gib']:.2f} GiB in host memory, {d['train_nodes']:,} training seeds, of which each loader's epoch takes a fixed "
        f"{r.get('epoch_batches', '?')} batches' worth, whole; PyG fanouts {r['fanouts']} "
        f"(DGL order {list(DGL_FANOUTS)}), batch {r['batch_size']}, hidden {r['hidden']}, shuffled, every minibatch "
        f"freshly sampled; tuned CPU loaders with {r['workers']} worker process{'es' if r['workers'] != 1 else ''}. "
        "Epoch = median of timed epochs after a warm-up.",
        "",
    ]
    if "pinned_h2d_gbs" in r:
        lines += [f"Pinned cudaMemcpy H2D ceiling (same run): {r['pinned_h2d_gbs']:.1f} GB/s", ""]
    if "error" in pipe:
        lines += [f"Pipeline (`zerocopy train`'s default plan): failed: {pipe['error']}", ""]
    else:
        stages = ", ".join(f"{k} {v:.2f}" for k, v in pipe["stages_ms"].items())
        lines += [f"Pipeline (`zerocopy train`'s default plan, same dataset): {pipe['ms_per_batch']:.2f} ms per "
                  f"minibatch, ms p50: {stages or 'no trace'} ({pipe['plan']}).", ""]
    if r["bars"].get("on_gpu"):
        lines += [f"The training process {'was' if r.get('mps_client') else 'was not'} an MPS client "
                  "(`zerocopy mps`): the `pipeline=True` rows' producers "
                  f"{'shared the GPU with it through MPS' if r.get('mps_client') else 'took turns with it on the GPU'}.",
                  ""]
    lines += ["| loader | minibatches | loader-only ms/minibatch (epochs' range) | x GB/s | training ms/minibatch "
              "(epochs' range) | setup s | stages ms p50 / mean (sample, gather, build, deliver) |",
              "|---|---|---|---|---|---|---|"]
    for name, m in r["modes"].items():
        if "error" in m:
            lines.append(f"| {name} | failed: {m['error']} |" + " |" * 5)
            continue
        lo, tr, st, mean = m["loader_only"], m["train"], m.get("stages_ms", {}), m.get("stages_mean_ms", {})
        stages = ", ".join(f"{st[s]:.2f} / {mean[s]:.2f}" if s in st and s in mean else f"{st[s]:.2f}" if s in st
                           else "-" for s in ("sample", "gather", "build", "deliver"))
        lines.append(f"| {name} | {lo['batches']} | {lo['ms_per_batch']:.2f} ({_range_ms(lo)}) | "
                     f"{lo['feature_gbs']:.2f} | {tr['ms_per_batch']:.2f} ({_range_ms(tr)}) | {m['setup_s']:.1f} | "
                     f"{stages if st else '-'} |")
    lines += ["", "Where a training epoch's host time goes, ms per minibatch (medians over the epochs):", "",
              "| loader | in the loader | in the step | of both, in gc |", "|---|---|---|---|"]
    for name, m in r["modes"].items():
        if "error" not in m:
            tr = m["train"]
            lines.append(f"| {name} | {tr['host_loader_ms']:.2f} | {tr['host_step_ms']:.2f} | "
                         f"{tr['gc_ms']:.3f} |" if "gc_ms" in tr else f"| {name} | {tr['host_loader_ms']:.2f} | "
                         f"{tr['host_step_ms']:.2f} | - |")
    for name, m in r["modes"].items():
        if m.get("plan"):
            lines += ["", f"`{name}`'s processes: {m['plan']}."]
        if m.get("step_alone_ms_all"):
            lines += ["", f"`{name}`'s model step alone, ms per minibatch, each training epoch's (the mean of before "
                          f"and after it): {', '.join(f'{t:.2f}' for t in m['step_alone_ms_all'])}."]
            if m.get("step_alone_before_ms_all"):
                lines[-1] += (f" Before: {', '.join(f'{t:.2f}' for t in m['step_alone_before_ms_all'])}; after: "
                              f"{', '.join(f'{t:.2f}' for t in m['step_alone_after_ms_all'])}.")
    if r.get("pyg_not_measured"):
        lines += ["", f"`pyg_own` not measured: {r['pyg_not_measured']}"]
    lines += ["", "| bar | value |", "|---|---|"] + [f"| {k} | {_fmt(v)} |" for k, v in r["bars"].items()]
    for name, prof in r.get("host_profiles", {}).items():
        what = "with the training step" if prof.get("train") else "loader alone"
        lines += ["", f"Host profile of `{name}` (diagnostic, {what}, {prof.get('batches', '?')} minibatches):"]
        if "error" in prof:
            lines += ["", f"failed: {prof['error']}"]
            continue
        lines += ["", f"Under cProfile: {prof['ms_per_batch_under_cprofile']:.2f} ms per minibatch.", "", "```",
                  prof["cprofile"], "```", "", "```", prof["torch_profiler"], "```"]
    lines += ["", f"Wall time {r['wall_s']:.0f} s (dataset {d['generate_s']:.1f} s)."]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
