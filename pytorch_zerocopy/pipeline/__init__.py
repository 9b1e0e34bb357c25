"""The sampler -> producer -> consumer training pipeline (the paper's Figure 6).

:func:`run_pipeline` runs it; :class:`PipelineConfig` describes a run; roles, ring protocol
and failure handling are documented in :mod:`.roles` and :mod:`.runner`; GPU partitioning
(MPS, green contexts) in :mod:`.partition` and :mod:`.green`; the CPU neighbour-sampling
adapter in :mod:`.sampler` (``sample_blocks``, replaceable by the library's sampling op).
"""

from .messages import PipelineConfig
from .model import GraphSAGE, SAGEConv
from .runner import PipelineError, run_pipeline
from ..block import Block
from .sampler import sample_blocks

__all__ = ["Block", "GraphSAGE", "PipelineConfig", "PipelineError", "SAGEConv", "run_pipeline", "sample_blocks"]
