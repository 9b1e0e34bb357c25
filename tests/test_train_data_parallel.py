"""Data-parallel training through the launcher: 2 real ranks, each a full pipeline, over gloo
on the CPU (one per GPU where GPUs exist)."""

import pytest

from pytorch_zerocopy.datasets import load_dataset
from pytorch_zerocopy.launch import WorkerFailed
from pytorch_zerocopy.train import train_data_parallel


@pytest.fixture(scope="module")
def dataset():
    return load_dataset("community")


def test_two_ranks_train_the_same_model(dataset):
    results = train_data_parallel(dataset, 2, "zerocopy", fanouts=(5, 5), batch_size=512, epochs=2, max_batches=4,
                                  hidden=32)
    assert sorted(results) == [0, 1]
    last = [results[r][-1] for r in (0, 1)]
    for stats in last:
        assert stats["train_batches"] == 4
        assert stats["val_acc"] > 1 / 16  # above chance for 16 classes
    # DDP averaged the gradients: both ranks end with identical parameters.
    assert last[0]["param_checksum"] == pytest.approx(last[1]["param_checksum"], rel=1e-6)
    # ... and they trained: the parameters moved between the epochs.
    assert results[0][0]["param_checksum"] != pytest.approx(last[0]["param_checksum"], rel=1e-9)


def test_a_failing_rank_pipeline_ends_the_job(dataset):
    with pytest.raises(WorkerFailed, match="injected failure in the consumer"):
        train_data_parallel(dataset, 2, "zerocopy", fanouts=(5, 5), batch_size=512, epochs=1, max_batches=4,
                            hidden=32, inject_failure=("consumer", "raise", 1))


def test_bad_worker_count(dataset):
    with pytest.raises(ValueError, match="nproc"):
        train_data_parallel(dataset, 0)
