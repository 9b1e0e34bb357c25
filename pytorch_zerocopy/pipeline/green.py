"""Two green contexts over disjoint SM sets, from the CUDA driver API (through ctypes).

``torch.cuda.green_contexts.GreenContext.create(num_sms=n)`` splits the device's SMs anew for
each context and keeps the first group, so two contexts made that way share SMs. Disjoint sets
need one split that returns both the group and the remainder, which is what this module does:
``cuDevSmResourceSplitByCount(group, 1, device_sms, remainder, 0, n)``, one green context on
each, and a stream created inside each (``cuGreenCtxStreamCreate``) wrapped as a
``torch.cuda.ExternalStream``: torch kernels launched on such a stream run only on that
context's SMs, while memory stays the primary context's (green contexts share its address
space).

Lifetime: the contexts and streams live until the process exits (they are referenced from
this module); nothing here is meant to be created more than a few times per process.
"""

from __future__ import annotations

import ctypes
from typing import Tuple

import torch

CU_DEV_RESOURCE_TYPE_SM = 1
CU_GREEN_CTX_DEFAULT_STREAM = 0x1
CU_STREAM_NON_BLOCKING = 0x1
# CUdevResource (cuda.h, CUDA 12.4+): int type; unsigned char pad[92]; union {sm; char[48]}.
RESOURCE_BYTES = 4 + 92 + 48
SM_COUNT_OFFSET = 4 + 92

_LIVE: list = []


class GreenContextError(RuntimeError):
    pass


class _Resource(ctypes.Structure):
    _fields_ = [("raw", ctypes.c_ubyte * 256)]  # larger than any CUdevResource so far

    @property
    def sm_count(self) -> int:
        return int.from_bytes(bytes(self.raw[SM_COUNT_OFFSET:SM_COUNT_OFFSET + 4]), "little")


def _driver():
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        raise GreenContextError(f"cannot load the CUDA driver library: {e}") from None
    for name in ("cuDeviceGetDevResource", "cuDevSmResourceSplitByCount", "cuDevResourceGenerateDesc",
                 "cuGreenCtxCreate", "cuGreenCtxStreamCreate", "cuDeviceGet"):
        if not hasattr(lib, name):
            raise GreenContextError(f"the CUDA driver lacks {name} (green contexts need driver >= 550 / CUDA 12.4)")
    return lib


def _check(result: int, what: str) -> None:
    if result != 0:
        raise GreenContextError(f"{what} failed with CUresult {result}")


def disjoint_green_streams(device_index: int, producer_sms: int) -> Tuple["torch.cuda.ExternalStream",
                                                                        "torch.cuda.ExternalStream", int, int]:
    """(producer stream, consumer stream, producer SMs, consumer SMs) on disjoint SM sets.

    ``producer_sms`` must already be a multiple of the hardware granularity; the consumer gets
    every remaining SM. Raises :class:`GreenContextError` when the driver cannot do it.
    """
    torch.cuda.init()  # the primary context must exist (cuGreenCtxCreate retains it)
    torch.cuda.synchronize(device_index)
    lib = _driver()
    dev = ctypes.c_int()
    _check(lib.cuDeviceGet(ctypes.byref(dev), ctypes.c_int(device_index)), "cuDeviceGet")
    whole, group, rest = _Resource(), _Resource(), _Resource()
    _check(lib.cuDeviceGetDevResource(dev, ctypes.byref(whole), ctypes.c_int(CU_DEV_RESOURCE_TYPE_SM)),
           "cuDeviceGetDevResource")
    groups = ctypes.c_uint(1)
    _check(lib.cuDevSmResourceSplitByCount(ctypes.byref(group), ctypes.byref(groups), ctypes.byref(whole),
                                           ctypes.byref(rest), ctypes.c_uint(0), ctypes.c_uint(producer_sms)),
           "cuDevSmResourceSplitByCount")
    if groups.value != 1 or group.sm_count == 0 or rest.sm_count == 0:
        raise GreenContextError(f"splitting {whole.sm_count} SMs for {producer_sms} producer SMs gave "
                                f"{groups.value} group(s) of {group.sm_count} and {rest.sm_count} left")
    streams = []
    for res in (group, rest):
        desc = ctypes.c_void_p()
        _check(lib.cuDevResourceGenerateDesc(ctypes.byref(desc), ctypes.byref(res), ctypes.c_uint(1)),
               "cuDevResourceGenerateDesc")
        ctx = ctypes.c_void_p()
        _check(lib.cuGreenCtxCreate(ctypes.byref(ctx), desc, dev, ctypes.c_uint(CU_GREEN_CTX_DEFAULT_STREAM)),
               "cuGreenCtxCreate")
        stream = ctypes.c_void_p()
        _check(lib.cuGreenCtxStreamCreate(ctypes.byref(stream), ctx, ctypes.c_uint(CU_STREAM_NON_BLOCKING),
                                          ctypes.c_int(0)), "cuGreenCtxStreamCreate")
        _LIVE.append((ctx, stream))
        streams.append(torch.cuda.ExternalStream(stream.value, device=torch.device("cuda", device_index)))
    return streams[0], streams[1], group.sm_count, rest.sm_count
