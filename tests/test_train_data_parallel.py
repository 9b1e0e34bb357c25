"""Data-parallel training through the launcher: 2 real ranks, each a full pipeline, over gloo
on the CPU everywhere; on a machine with 2 GPUs also over NCCL, one pipeline per GPU, under one
shared MPS daemon."""

import shutil

import pytest
import torch

from pytorch_zerocopy.datasets import load_dataset
from pytorch_zerocopy.launch import WorkerFailed
from pytorch_zerocopy.pipeline import Partition, PartitionInfo, PlanError
from pytorch_zerocopy.pipeline.plan import InjectedFailure
from pytorch_zerocopy.train import train_data_parallel
from test_pipeline_gpu import _mps_daemons

needs_two_gpus = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                                    reason="needs 2 GPUs")
needs_mps = pytest.mark.skipif(shutil.which("nvidia-cuda-mps-control") is None,
                               reason="nvidia-cuda-mps-control not installed")


@pytest.fixture(scope="module")
def dataset():
    return load_dataset("community")


def _check_same_model(results):
    assert sorted(results) == [0, 1]
    last = [results[r][-1] for r in (0, 1)]
    for stats in last:
        assert stats.train_batches == 4
        assert stats.val_acc > 1 / 16  # above chance for 16 classes
    # The all-reduce (DDP's, or the one captured in the step's graph) averaged the gradients:
    # both ranks end with identical parameters.
    assert last[0].param_checksum == pytest.approx(last[1].param_checksum, rel=1e-6)
    # ... and they trained: the parameters moved between the epochs.
    assert results[0][0].param_checksum != pytest.approx(last[0].param_checksum, rel=1e-9)


def test_two_ranks_train_the_same_model(dataset):
    results = train_data_parallel(dataset, 2, "zerocopy", fanouts=(5, 5), batch_size=512, epochs=2, max_batches=4,
                                  hidden=32, use_gpu=False, quiet=True)
    _check_same_model(results)
    assert all(results[r][-1].train_step == {"kind": "eager"} for r in (0, 1))  # DDP over gloo
    assert all(results[r][-1].partition == PartitionInfo(Partition.NONE) for r in (0, 1))


@pytest.mark.cuda
@needs_two_gpus
@needs_mps
def test_two_gpus_share_one_mps_daemon(dataset):
    results = train_data_parallel(dataset, 2, "zerocopy", "mps", fanouts=(5, 5), batch_size=512, epochs=2,
                                  max_batches=4, hidden=32, quiet=True)
    _check_same_model(results)
    for r in (0, 1):
        info = results[r][-1].partition
        assert (info.kind, info.shared_daemon) == (Partition.MPS, True)
        assert info.producer_share + info.consumer_share == 100.0
        # Three eager warm-up steps, then every step replayed from the graphs (NCCL captured).
        step = results[r][-1].train_step
        assert step["kind"] == "cuda-graph" and step["steps"] == 8 and step["fallbacks"] == 0
    assert _mps_daemons() == []


@pytest.mark.cuda
@needs_two_gpus
def test_two_gpus_train_eagerly_with_ddp(dataset):
    results = train_data_parallel(dataset, 2, "zerocopy", "none", fanouts=(5, 5), batch_size=512, epochs=2,
                                  max_batches=4, hidden=32, quiet=True, cuda_graph=False)
    _check_same_model(results)
    assert all(results[r][-1].train_step == {"kind": "eager"} for r in (0, 1))


@pytest.mark.cuda
@needs_two_gpus
def test_rank_failing_after_capture_ends_the_job(dataset):
    """A rank dies while its peer waits in a captured all-reduce: the job still ends, with the
    dead rank's error."""
    with pytest.raises(WorkerFailed, match="injected failure in the consumer"):
        train_data_parallel(dataset, 2, "zerocopy", "none", fanouts=(5, 5), batch_size=512, epochs=1,
                            max_batches=8, hidden=32, quiet=True, inject_failure=InjectedFailure("consumer", "raise", 6, 1))


@pytest.mark.cuda
@needs_two_gpus
@needs_mps
def test_failing_rank_on_two_gpus_stops_the_shared_daemon(dataset):
    with pytest.raises(WorkerFailed, match="injected failure in the producer"):
        train_data_parallel(dataset, 2, "zerocopy", "mps", fanouts=(5, 5), batch_size=512, epochs=1, max_batches=4,
                            hidden=32, quiet=True, inject_failure=InjectedFailure("producer", "raise", 1))
    assert _mps_daemons() == []


@pytest.mark.cuda
@needs_two_gpus
@pytest.mark.parametrize("mode", ["dma", "gpu"])
def test_two_gpus_train_other_modes(dataset, mode):
    results = train_data_parallel(dataset, 2, mode, fanouts=(5, 5), batch_size=512, epochs=2, max_batches=4,
                                  hidden=32, quiet=True)
    _check_same_model(results)


@pytest.mark.parametrize("rank", [None, 1], ids=["every-rank", "one-rank"])
def test_a_failing_rank_pipeline_ends_the_job(dataset, rank):
    failure = InjectedFailure("consumer", "raise", 1, rank)
    with pytest.raises(WorkerFailed, match="injected failure in the consumer"):
        train_data_parallel(dataset, 2, "zerocopy", fanouts=(5, 5), batch_size=512, epochs=1, max_batches=4,
                            hidden=32, use_gpu=False, quiet=True, inject_failure=failure)


def test_bad_worker_count(dataset):
    with pytest.raises(PlanError, match="nproc"):
        train_data_parallel(dataset, 0)


def test_cpu_pipelines_refuse_gpu_settings(dataset):
    """The plan is made once, in the parent: a bad setting fails there, before any worker starts."""
    with pytest.raises(PlanError, match="mode 'dma' needs a CUDA GPU"):
        train_data_parallel(dataset, 2, "dma", use_gpu=False)
    with pytest.raises(PlanError, match="partition 'mps' needs a CUDA GPU"):
        train_data_parallel(dataset, 2, "zerocopy", "mps", use_gpu=False)
    with pytest.raises(PlanError, match="batch_size"):
        train_data_parallel(dataset, 2, "zerocopy", batch_size=0, use_gpu=False)
