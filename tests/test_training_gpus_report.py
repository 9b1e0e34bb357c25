"""benchmarks/training_gpus.py's report (``benchmarks/training.py --gpus 1,2,4``), on the CPU: the
records of synthetic runs, as the launcher returns them, become the Markdown tables, the bars and
a JSON file that holds plain values only."""

import json

import pytest

from benchmarks.pipeline_common import write_report
from benchmarks.training_gpus import report_lines, run_record, summarise
from pytorch_zerocopy.pipeline import EpochStats, Partition, PartitionInfo
from pytorch_zerocopy.pipeline.trace import TraceSummary

GLOBAL = 480


def _ranks(gpus: int, seconds_per_minibatch: float, partition: PartitionInfo, busy: float = 0.5):
    """Each rank's epochs as train_data_parallel returns them: GLOBAL minibatches split between
    the ranks, the last epoch timed, its GPU steps ``busy`` of the steady time."""
    per_rank = GLOBAL // gpus
    results = {}
    for rank in range(gpus):
        steady = seconds_per_minibatch * (per_rank - 1)
        trace = TraceSummary(per_step={"gpu_train_ms": [busy * seconds_per_minibatch * 1e3] * (per_rank - 1)})
        last = EpochStats(epoch=1, train_batches=per_rank, loss=1.5, val_acc=0.8 + 0.01 * rank,
                          steady_batches=per_rank - 1, steady_seconds=steady,
                          steady_bytes=(per_rank - 1) * 10_000_000, steady_wait_seconds=0.1 * rank * steady,
                          train_step={"kind": "cuda-graph", "steps": 2 * per_rank, "fallbacks": rank},
                          param_checksum=123.0, partition=partition, trace=trace)
        results[rank] = [EpochStats(epoch=0), last]
    return results


def test_the_report_of_a_scaling_run_is_written(tmp_path):
    mps = PartitionInfo(Partition.MPS, producer_share=10.0, consumer_share=90.0, shared_daemon=True)
    none = PartitionInfo(Partition.NONE)
    runs = []
    # default scales 1.9x on 2 GPUs and 3.0x on 4; dma is 5x slower than default on 4 GPUs.
    per_mb = {("default", 1): 0.002, ("default", 2): 0.002 / 1.9 * 2, ("default", 4): 0.002 / 3.0 * 4,
              ("dma", 4): 0.002 / 3.0 * 4 * 5, ("uva_naive", 4): 0.002 / 3.0 * 4 * 3}
    for repeat in range(3):
        for (row, gpus), seconds in per_mb.items():
            part = mps if row == "default" else none
            slow = 1 + 0.1 * repeat  # the rounds' spread: min round 0, median round 1, max round 2
            record = run_record(gpus, row, _ranks(gpus, seconds * slow, part), wall=9.0,
                                peak_host_bytes=int(11e9 if gpus == 4 else 9e9), plan="p")
            record["repeat"] = repeat
            runs.append(record)
    runs.append({"gpus": 4, "mode": "gpu_sampling_dma", "error": "CUDA out of memory", "repeat": 2})

    four = runs[2]
    assert four["gpus"] == 4 and four["mode"] == "default" and len(four["ranks"]) == 4
    assert four["input_wait_share"] == pytest.approx(0.3)  # rank 3 waited 30 % of its steady time
    assert four["gpu_busy_share"] == pytest.approx(0.5)
    assert four["partition"]["kind"] == "mps"

    cells, bars, ranges = summarise(runs, data_size=10_000_000_000, table_bytes=40 * 2**30)
    assert cells[(1, "default")]["median"] == pytest.approx(GLOBAL * 0.002 * 1.1)
    assert bars["default_2gpu_over_1gpu"] == pytest.approx(1.9)
    assert bars["default_2gpu_over_1gpu_at_least_1.85x"] is True
    assert bars["default_4gpu_over_1gpu"] == pytest.approx(3.0)
    assert bars["default_4gpu_over_1gpu_at_least_3.5x"] is False
    assert ranges["default_4gpu_over_1gpu"]["min"] == pytest.approx(3.0 * 1.0 / 1.2)
    assert bars["best_baseline_4gpu"] == "uva_naive"
    assert bars["default_over_best_baseline_4gpu"] == pytest.approx(3.0)
    assert bars["host_bytes_over_data_4gpu"] == pytest.approx(1.1)
    assert bars["table_gib"] == 40 and bars["fresh_sampling"] is True
    assert (4, "gpu_sampling_dma") not in cells

    lines = report_lines(runs, cells, bars, ranges)
    text = "\n".join(lines)
    assert "| 2 | 4 | gpu_sampling_dma | failed: CUDA out of memory |" in text
    row = next(line for line in lines if line.startswith("| 0 | 4 | default |"))
    assert "| 0% / 10% / 20% / 30% |" in row and "| 11.0 |" not in row and "| 10.2 |" in row
    assert any(line.startswith("| 4 | default |") and "| 3.00x |" in line for line in lines)
    assert "default_4gpu_over_1gpu = 3" in text

    result = {"runs": runs, "bars": bars, "spread": ranges}
    write_report(str(tmp_path), "training_gpus_test", result, lines)
    written = json.loads((tmp_path / "training_gpus_test.json").read_text())
    assert written["runs"][2]["partition"]["kind"] == "mps"  # a name, not "Partition.MPS"
    assert json.loads(json.dumps(result)) == written  # plain values: nothing needed default=str
