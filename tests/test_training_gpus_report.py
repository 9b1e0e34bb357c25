"""benchmarks/training_gpus.py's report (``benchmarks/training.py --gpus 1,2``), on the CPU: the
records of synthetic runs, as the launcher returns them, become the Markdown tables, the bars and
a JSON file that holds plain values only."""

import json

import pytest

from benchmarks.pipeline_common import write_report
from benchmarks.training_gpus import report_lines, run_record, summarise
from pytorch_zerocopy.pipeline import EpochStats, Partition, PartitionInfo


def _ranks(gpus: int, seconds_per_minibatch: float, partition: PartitionInfo):
    """Each rank's epochs as train_data_parallel returns them: 48 minibatches split between the
    ranks, the last epoch timed."""
    per_rank = 48 // gpus
    results = {}
    for rank in range(gpus):
        last = EpochStats(epoch=1, train_batches=per_rank, loss=1.5, val_acc=0.8 + 0.01 * rank,
                          steady_batches=per_rank - 1, steady_seconds=seconds_per_minibatch * (per_rank - 1),
                          steady_bytes=(per_rank - 1) * 10_000_000, steady_wait_seconds=0.001 * per_rank,
                          train_step={"kind": "cuda-graph", "steps": 2 * per_rank, "fallbacks": rank},
                          param_checksum=123.0, partition=partition)
        results[rank] = [EpochStats(epoch=0), last]
    return results


def test_the_report_of_a_scaling_run_is_written(tmp_path):
    mps = PartitionInfo(Partition.MPS, producer_share=10.0, consumer_share=90.0, shared_daemon=True)
    none = PartitionInfo(Partition.NONE)
    runs = []
    for repeat in range(2):
        for gpus in (1, 2):
            for mode, seconds, partition in (("dma", 0.004, none), ("zerocopy", 0.002, mps)):
                record = run_record(gpus, mode, _ranks(gpus, seconds * (1 + 0.1 * repeat), partition), wall=9.0)
                record["repeat"] = repeat
                runs.append(record)
    runs.append({"gpus": 2, "mode": "gpu", "error": "CUDA out of memory", "repeat": 1})

    assert runs[1]["partition"] == {**{k: None for k in runs[1]["partition"]}, "kind": "mps", "producer_share": 10.0,
                                    "consumer_share": 90.0, "shared_daemon": True}
    summary = summarise(runs, [1, 2], ["dma", "zerocopy", "gpu"])
    # 1 GPU trains 48 minibatches per epoch, each of 2 GPUs 24, at the same rate per minibatch.
    assert summary.medians[(1, "zerocopy")] == pytest.approx(48 * 0.0021)
    assert summary.bars["zerocopy_2gpu_over_1gpu"] == pytest.approx(2.0)
    assert summary.bars["zerocopy_over_dma_2gpu"] == pytest.approx(2.0)
    assert summary.bars["zerocopy_2gpu_at_least_1.7x_1gpu"] is True
    assert (2, "gpu") not in summary.medians

    lines = report_lines(runs, summary, repeats=2, trace=False)
    rows = [line for line in lines if line.startswith("| 1 | 2 | zerocopy |")]
    assert len(rows) == 1 and "| mps (one shared daemon) |" in rows[0] and "| graph, 1 eager |" in rows[0]
    assert any(line.startswith("| 1 | 2 | dma |") and "| none |" in line for line in lines)
    assert "| 1 | 2 | gpu | failed: CUDA out of memory |" in "\n".join(lines)
    assert lines[-1].startswith("Bars: ") and "zerocopy_2gpu_over_1gpu = 2.0" in lines[-1]

    result = {"runs": runs, "bars": summary.bars}
    write_report(str(tmp_path), "training_gpus_test", result, lines)
    written = json.loads((tmp_path / "training_gpus_test.json").read_text())
    assert written["runs"][1]["partition"]["kind"] == "mps"  # a name, not "Partition.MPS"
    assert json.loads(json.dumps(result)) == written  # plain values: nothing needed default=str
    assert (tmp_path / "training_gpus_test.md").read_text().splitlines() == lines
