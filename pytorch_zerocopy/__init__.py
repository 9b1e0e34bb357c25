"""pytorch_zerocopy: GPUs reading graph data straight out of host memory.

``import pytorch_zerocopy`` loads the compiled ops and registers the ``unified`` device, after
which ``cpu_tensor.to("unified")`` maps a host tensor for every GPU without copying it.
"""

from .unified import (
    DEVICE_TYPE,
    UNIFIED_NAME,
    empty_shared,
    empty_unified,
    gpu_backed,
    is_unified,
    load_unified,
    registration_stats,
    to_unified,
    unified_device,
)
from ._build import build_info
from .ops import GatherTuning, block_mean, gather_rows
from .placement import Placement
from .feature_table import CacheConfig, CachePolicy, CachedTable, FeatureReader, FeatureTable, gather_rows_cached
from .host_pages import HostPages, empty_host

__version__ = build_info()["version"]

__all__ = [
    "DEVICE_TYPE",
    "UNIFIED_NAME",
    "CacheConfig",
    "CachePolicy",
    "CachedTable",
    "FeatureReader",
    "FeatureTable",
    "GatherTuning",
    "HostPages",
    "Placement",
    "block_mean",
    "build_info",
    "empty_host",
    "empty_shared",
    "empty_unified",
    "gather_rows",
    "gather_rows_cached",
    "gpu_backed",
    "is_unified",
    "load_unified",
    "registration_stats",
    "to_unified",
    "unified_device",
]
