"""A data-parallel training job run as its own program, as a user runs one (tests/test_checkpoint.py):
``python checkpoint_job.py SETTINGS_JSON`` trains a small community graph on 2 ranks through
:func:`pytorch_zerocopy.train.train_data_parallel` and prints each rank's epochs as one JSON line.
SETTINGS_JSON holds Plan settings, plus ``kill`` ([rank, minibatch]: that rank's trainer is killed
at that minibatch of the first attempt), ``max_restarts`` and ``use_gpu``."""

import json
import sys

from pytorch_zerocopy.datasets import community_graph
from pytorch_zerocopy.launch import LaunchOptions
from pytorch_zerocopy.pipeline.plan import InjectedFailure
from pytorch_zerocopy.train import train_data_parallel


def main(settings: dict) -> None:
    kill = settings.pop("kill", None)
    if kill is not None:
        settings["inject_failure"] = InjectedFailure("consumer", "kill", kill[1], rank=kill[0])
    options = LaunchOptions(max_restarts=settings.pop("max_restarts", 0))
    settings["fanouts"] = tuple(settings["fanouts"])
    ds = community_graph(num_nodes=3000, feature_dim=16, seed=2)
    results = train_data_parallel(ds, 2, "zerocopy", launch_options=options, quiet=True, **settings)
    print(json.dumps({rank: [[e.epoch, e.train_batches, e.loss, e.val_acc, e.test_acc, e.test_nodes, e.param_checksum]
                             for e in epochs] for rank, epochs in results.items()}))


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
