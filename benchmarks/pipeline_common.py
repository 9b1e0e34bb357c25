"""Shared pieces of the pipeline benchmarks: machine facts, ceilings, child runs, reports.

Every GPU measurement runs in a spawned child process, so the benchmark's own process never
holds a CUDA context (an MPS partition then owns the GPU, and each measurement starts clean).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.multiprocessing as mp

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks.common import environment, pinned_memcpy_gbs  # noqa: E402
from pytorch_zerocopy.pipeline.runner import environment_added  # noqa: E402


def _child_entry(conn, fn, args, env):
    os.environ.update(env or {})
    try:
        conn.send(("ok", fn(*args)))
    except BaseException:  # noqa: BLE001
        conn.send(("error", traceback.format_exc()))
    finally:
        conn.close()


# The training benchmarks' rows: label -> (mode, Plan settings).
CORE_ROWS = {
    "default": ("zerocopy", {}),
    "gpu": ("gpu", {}),
    "dma": ("dma", {}),
    "gpu_sampling_dma": ("dma", {"sample_on": "gpu"}),
    "uva_naive": ("zerocopy-naive", {}),
}
BASELINES = ("dma", "gpu_sampling_dma", "uva_naive")


def used_host_bytes() -> int:
    """``MemTotal - MemAvailable``: host memory in use by everything (shared memory included)."""
    values = {}
    with open("/proc/meminfo") as f:
        for line in f:
            name, value = line.split(":", 1)
            values[name] = int(value.split()[0]) * 1024
    return values["MemTotal"] - values["MemAvailable"]


class PeakHostMemory:
    """Samples :func:`used_host_bytes` every ``period`` seconds on a thread while in a ``with``."""

    def __init__(self, period: float = 0.05):
        self.period, self.peak = period, 0
        self._stop = threading.Event()

    def __enter__(self) -> "PeakHostMemory":
        self.peak = used_host_bytes()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def _watch(self) -> None:
        while not self._stop.wait(self.period):
            self.peak = max(self.peak, used_host_bytes())

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, used_host_bytes())


def papers_dataset(table_gib: float, width: int, degree: int, train_fraction: float = 0.01):
    """The training benchmarks' papers100M-like graph (skew 2) whose float32 feature table holds
    ``table_gib`` GiB of ``width``-wide rows; its features are made by each job that reads them."""
    from pytorch_zerocopy.datasets import papers_like

    nodes = max(10_000, int(table_gib * 2**30 // (width * 4)))
    t = time.perf_counter()
    ds = papers_like(nodes, avg_degree=degree, feature_dim=width, train_fraction=train_fraction)
    print(f"  {ds.describe()}: graph generated in {time.perf_counter() - t:.1f} s (features: by each job)", flush=True)
    return ds


class CacheRowChoices:
    """The rows each cache setting keeps for one dataset, chosen once per benchmark run and
    handed to every job with that setting. A choice depends only on the dataset and the plan's
    ``cache`` (which carries the fanouts, batch size and seed it pre-samples with), not on the
    GPU count or the row, so the jobs of a run would otherwise each repeat the same pre-sampling
    epoch over the whole graph before their first minibatch."""

    def __init__(self, ds):
        self.ds = ds
        self._rows: Dict[Any, torch.Tensor] = {}

    def __call__(self, plan) -> Optional[torch.Tensor]:
        """The rows of ``plan.cache`` (None without a cache), in shared memory."""
        from pytorch_zerocopy.pipeline.gather import choose_cached_rows

        if plan.cache is None:
            return None
        if plan.cache not in self._rows:
            self._rows[plan.cache] = choose_cached_rows(
                plan, self.ds, lambda c: print(f"  cache rows chosen once for every job with this cache: "
                                               f"{c.describe()}", flush=True))
        return self._rows[plan.cache]


def trace_mean(summary: Optional[Dict[str, float]]) -> float:
    """The mean of one timing of a trace summary (nan where it has no values)."""
    return summary["mean"] if summary and summary.get("n") else float("nan")


def data_bytes(ds) -> int:
    """The bytes a training job must hold: features, graph and labels."""
    return ds.feature_source.nbytes + ds.graph_bytes + ds.labels.numel() * ds.labels.element_size()


def run_children(jobs: List[Tuple[Callable, tuple, Optional[Dict[str, str]]]], timeout: float = 600) -> List[Any]:
    """Runs each ``(fn, args, env)`` in its own spawned process, all at once; returns their
    results in order, or raises with the first failure's traceback."""
    ctx = mp.get_context("spawn")
    running = []
    try:
        for fn, args, env in jobs:
            recv, send = ctx.Pipe(duplex=False)
            with environment_added(env or {}):
                proc = ctx.Process(target=_child_entry, args=(send, fn, args, env), daemon=True)
                proc.start()
            send.close()
            running.append((fn, proc, recv))
        results = []
        deadline = time.monotonic() + timeout
        for fn, proc, recv in running:
            name = getattr(fn, "__name__", str(fn))
            try:
                if not recv.poll(max(0.0, deadline - time.monotonic())):
                    raise TimeoutError(f"{name} did not finish within {timeout} s")
                status, value = recv.recv()
            except EOFError:
                status, value = "error", f"the process died (exit code {proc.exitcode})"
            if status != "ok":
                raise RuntimeError(f"{name} failed in a child process:\n{value}")
            results.append(value)
        return results
    finally:
        for _, proc, recv in running:
            proc.join(10)
            if proc.is_alive():
                proc.kill()
                proc.join()
            recv.close()


def run_in_child(fn: Callable, *args, env: Optional[Dict[str, str]] = None, timeout: float = 600) -> Any:
    """``fn(*args)`` in a spawned process with ``env`` added; returns its result or raises."""
    return run_children([(fn, args, env)], timeout)[0]


def machine_info() -> Dict[str, Any]:
    """Device name, driver, torch version and date (nvidia-smi: no GPU context here)."""
    env = environment()
    info: Dict[str, Any] = {"date": env["date"], "torch": env["torch"], "python": env["python"],
                            "host": env["host"], "cpu_count": env["cpus"], "device": env["gpu"] or "cpu (no GPU)",
                            "driver": env["driver"], "cpu_model": env["cpu_model"], "host_speed": env["host_speed"]}
    if env["gpu_memory"]:
        info["gpu_memory"] = env["gpu_memory"]
    return info


def _pinned_memcpy_gbs(nbytes: int = 1 << 30, reps: int = 10) -> float:
    return pinned_memcpy_gbs(nbytes, reps)


def _dma_gather_gbs(features: torch.Tensor, rows: int, reps: int = 5) -> float:
    """CPU index_select (all threads) of random rows into a pinned buffer, then H2D copy."""
    torch.set_num_threads(os.cpu_count() or 1)
    idx = torch.randint(0, features.shape[0], (rows,))
    pinned = torch.empty(rows, features.shape[1], dtype=features.dtype, pin_memory=True)
    dst = torch.empty_like(pinned, device="cuda")
    times = []
    for i in range(reps + 1):
        t = time.perf_counter()
        torch.index_select(features, 0, idx, out=pinned)
        dst.copy_(pinned, non_blocking=True)
        torch.cuda.synchronize()
        if i:
            times.append(time.perf_counter() - t)
    times.sort()
    return pinned.numel() * pinned.element_size() / times[len(times) // 2] / 1e9


def zerocopy_gather(table: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """The library's routed gather without a bounds check (where ``gather_rows`` exists)."""
    import pytorch_zerocopy as zc

    gather_rows = getattr(zc, "gather_rows", None)
    return gather_rows(table, idx, check_bounds=False) if gather_rows is not None else table[idx]


def _zerocopy_gather_gbs(features: torch.Tensor, rows: int, reps: int = 10) -> float:
    import pytorch_zerocopy as zc

    table = zc.to_unified(features)
    idx = torch.randint(0, features.shape[0], (rows,), device="cuda")
    out = zerocopy_gather(table, idx)
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        out = zerocopy_gather(table, idx)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    times.sort()
    return out.numel() * out.element_size() / times[len(times) // 2] / 1e9


def _pinned_memcpy_gbs_at(device: int, start_at: float, nbytes: int = 1 << 30, reps: int = 15) -> float:
    """:func:`pinned_memcpy_gbs` on GPU ``device``, its timed copies starting at the wall-clock
    time ``start_at`` (so that the copies of several GPUs overlap)."""
    torch.cuda.set_device(device)
    torch.empty(1, device="cuda")
    time.sleep(max(0.0, start_at - time.time()))
    return pinned_memcpy_gbs(nbytes, reps)


def concurrent_memcpy_gbs(gpus: int) -> List[float]:
    """Each of ``gpus`` GPUs' pinned H2D copy rate while all copy at once (one process each):
    the host side's ceiling for that many links."""
    start_at = time.time() + 10.0 + gpus
    return run_children([(_pinned_memcpy_gbs_at, (d, start_at), None) for d in range(gpus)])


def measure_ceilings(features: Optional[torch.Tensor], rows: int, gpus: int = 1) -> Dict[str, float]:
    """Pinned-memcpy H2D ceiling, the DMA gather baseline and the zero-copy gather, in GB/s;
    with ``gpus`` > 1 also the copy rate of that many GPUs copying at once (their sum)."""
    out = {"pinned_memcpy_gbs": run_in_child(_pinned_memcpy_gbs)}
    if gpus > 1:
        rates = concurrent_memcpy_gbs(gpus)
        out[f"pinned_memcpy_gbs_{gpus}gpus_at_once"] = sum(rates)
        out[f"pinned_memcpy_gbs_{gpus}gpus_slowest"] = min(rates)
    if features is not None:
        out["dma_gather_gbs"] = run_in_child(_dma_gather_gbs, features, rows)
        out["zerocopy_gather_gbs"] = run_in_child(_zerocopy_gather_gbs, features, rows)
    return out


def write_report(out_dir: str, name: str, result: Dict[str, Any], markdown: List[str],
                 plot: Optional[Callable[[Any], None]] = None) -> None:
    """``<name>.json``, ``<name>.md`` and, when matplotlib is present, ``<name>.png``."""
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, f"{name}.json"), "w") as f:
        json.dump(result, f, indent=2, default=str)
    with open(os.path.join(out_dir, f"{name}.md"), "w") as f:
        f.write("\n".join(markdown) + "\n")
    if plot is not None:
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            print("matplotlib not installed: no plot written")
            return
        try:
            plot(plt)
            plt.tight_layout()
            plt.savefig(os.path.join(out_dir, f"{name}.png"), dpi=120)
        except Exception as e:  # noqa: BLE001 - the numbers are already written
            print(f"plot failed ({e}); JSON and Markdown are written")
        finally:
            plt.close("all")
    print(f"wrote {os.path.join(out_dir, name)}.{{json,md{',png' if plot else ''}}}")


def header_lines(title: str, info: Dict[str, Any], ceilings: Dict[str, float]) -> List[str]:
    lines = [f"# {title}", "",
             f"{info['device']}, driver {info.get('driver')}, torch {info['torch']}, {info['date']}, "
             f"{info['cpu_count']} CPU cores", ""]
    speed = info.get("host_speed")
    if speed:
        lines[-1:-1] = ["", f"Host: {info.get('cpu_model') or 'CPU model unknown'}; one thread runs the reference "
                            f"Python loop in {speed['python_loop_ms']:.1f} ms and a small torch op in "
                            f"{speed['torch_op_us']:.1f} µs (host-bound rows compare across hosts by these)"]
    if ceilings:
        lines.append("| ceiling / baseline | GB/s |")
        lines.append("|---|---|")
        for k, v in ceilings.items():
            lines.append(f"| {k} | {v:.1f} |")
        lines.append("")
    return lines


def _fmt(summary: Optional[Dict[str, float]], *keys: str) -> str:
    if not summary or not summary.get("n"):
        return "-"
    return " / ".join(f"{summary[k]:.2f}" for k in keys)


def trace_lines(rows: List[Tuple[str, Optional[Dict[str, Any]]]]) -> List[str]:
    """A Markdown table of per-minibatch pipeline timings (``Plan.trace``; a
    :class:`~pytorch_zerocopy.pipeline.trace.TraceSummary` as a dict), one row per
    ``(label, trace)``; milliseconds, ``p50 / p90`` unless the header says otherwise."""
    lines = ["Per-minibatch timings (ms, p50 / p90 over the timed epoch's steady-state minibatches). "
             "GPU gap: the trainer's stream idle between two steps, waiting for its input or for its host; "
             "blocks copy: the minibatch's blocks and labels reaching the trainer's stream; GPU train: forward, "
             "backward, gradient all-reduce (several GPUs) and optimiser step; host issue: the trainer's CPU time "
             "to issue a step; input wait: its host blocked on the next minibatch (mean); sample: the GPU "
             "sampler's time from issue to blocks ready (or a CPU sampler's host time); gather: GPU time of a "
             "gather (host time on the CPU); producer waits: for a sampled minibatch / a free slot.", "",
             "| run | GPU gap | blocks copy | GPU train | host issue | input wait (mean) | sample | gather | "
             "producer batch wait | producer slot wait |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for label, tr in rows:
        if not tr:
            continue
        c, p = tr.get("consumer", {}), tr.get("producer", {})
        lines.append(f"| {label} | {_fmt(c.get('gpu_gap_ms'), 'p50', 'p90')} | "
                     f"{_fmt(c.get('gpu_copy_ms'), 'p50', 'p90')} | {_fmt(c.get('gpu_train_ms'), 'p50', 'p90')} | "
                     f"{_fmt(c.get('issue_ms'), 'p50', 'p90')} | {_fmt(c.get('input_wait_ms'), 'mean')} | "
                     f"{_fmt(p.get('sample_ms'), 'p50', 'p90')} | {_fmt(p.get('gather_ms'), 'p50', 'p90')} | "
                     f"{_fmt(p.get('batch_wait_ms'), 'p50', 'p90')} | {_fmt(p.get('slot_wait_ms'), 'p50', 'p90')} |")
    return lines + [""]
