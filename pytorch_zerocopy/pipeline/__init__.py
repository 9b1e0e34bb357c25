"""The sampler -> producer -> trainer training pipeline (the paper's Figure 6).

:func:`make_plan` resolves a run once into a frozen :class:`Plan`; :func:`run_pipeline` runs it.

Modules, in the order a minibatch meets them: :mod:`.plan` (every choice, validated once),
:mod:`.minibatches` (seeds and sampling, CPU or GPU), :mod:`.sampler` (the CPU sampler role),
:mod:`.producer` (gathers into the ring), :mod:`.ring` (slots shared by producer and trainer),
:mod:`.gather` (one gather per mode), :mod:`.consumer` (the trainer), :mod:`.train_step`
(eager or CUDA-graph steps), :mod:`.stats` and :mod:`.trace` (what a run reports),
:mod:`.messages` (what travels between processes), :mod:`.runner` (process supervision),
:mod:`.partition` and :mod:`.green` (MPS and green-context GPU partitions), :mod:`.machine` (one
process of the machine sampling and gathering for every local trainer), :mod:`.loader` (the
same roles running the stages of the PyG and DGL loaders, ``pipeline=True``, for a training
loop of the user's), :mod:`.ahead` (the in-process loaders' next minibatch built on side
streams).

A role's stages (seeds -> sample -> gather -> deliver -> train) hold no diagnostic branches:
where a role assembles them it wraps those the plan asks for, once: the replay diagnostic
(:func:`~.minibatches.replayed`) and tracing (:mod:`.trace`) wrap the sampling and gathering
stages, an injected failure (:func:`~.process.failing`) wraps a role's stream of minibatches.
"""

from ..block import Block
from ..nn import GraphSAGE, SAGEConv
from .messages import PartitionInfo, StepDone
from .plan import GatherIn, Mode, Partition, Phase, Plan, PlanError, SampleOn, make_plan
from .runner import PipelineError, run_pipeline
from .stats import EpochStats

__all__ = ["Block", "EpochStats", "GatherIn", "GraphSAGE", "Mode", "Partition", "PartitionInfo", "Phase", "PipelineError",
           "Plan", "PlanError", "SAGEConv", "SampleOn", "StepDone", "make_plan", "run_pipeline"]
