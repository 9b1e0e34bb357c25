"""Unified tensors: host memory that GPU ops read in place (zero-copy).

Mechanism. Unified tensors live on torch's PrivateUse1 dispatch key (device type
``privateuseone``); ``t.to("unified")`` (the paper's Listing 1) dispatches like any device
transfer. A unified tensor's storage is the host memory of the CPU tensor it came from,
page-locked and mapped for every GPU with ``cudaHostRegister(Mapped | Portable)``; no byte is
copied. Ops on a unified tensor reach a boxed fallback that swaps each unified argument for a
CUDA tensor over the mapped address and runs the ordinary CUDA kernel, so every torch op works
and results land on the GPU (the device of a CUDA argument, else the unified tensor's own
index, which is the current GPU when it was made). Row gathers (``u[idx]``, ``index_select``,
``embedding``) are routed to :func:`pytorch_zerocopy.gather_rows`, which visits rows in
address order to keep PCIe reads efficient. Each keeps its torch semantics: ``u[idx]`` counts a
negative index from the end (``-1``: the last row), while ``index_select``, ``embedding`` and
``gather_rows`` itself take indices in ``[0, rows)`` and raise ``IndexError`` for any other.

Device indices. ``"unified:N"`` is the unified device of GPU ``N`` and must name a GPU that
exists; without a GPU serving unified tensors there is one unified device, ``unified:0``
(``"unified"``), and any other index is a ``ValueError``.

The key keeps torch's name ``privateuseone``: renaming it ``unified`` would make it torch's
"accelerator", which from torch 2.8 on breaks every backward pass over CUDA tensors
(pytorch/pytorch#161129). So ``torch.device("unified")`` is not a valid device; the string
``"unified"`` is accepted by ``Tensor.to`` and by this package's functions, and
:func:`unified_device` gives the torch.device.

Why this mechanism rather than a CUDA-typed tensor over host memory: a distinct device keeps
the distinction visible to users (``u.device``, ``u.is_unified``), lets ``u.cpu()`` return the
host tensor without a copy, and gives one place, the fallback, to route gathers to the aligned
kernel. The cost is a few microseconds of dispatch per op on a unified tensor.

Without a GPU (a CPU-only build, or no device visible) unified tensors are host tensors in
shared memory whose ops run on the CPU: the same code runs, slower, and tests can exercise it.

Ordering. Ops on unified tensors are queued on the current CUDA stream like any CUDA op.
``u.cpu()`` (the host bytes themselves, no copy) first waits for the work queued on the current
stream of ``u``'s GPU, as a CUDA tensor's ``.cpu()`` does; ``u.to("cpu", non_blocking=True)``
does not wait. Work queued on other streams, and host reads through another alias of the bytes
(a CPU tensor the unified one was made from), need their own synchronisation.

Lifetime. The mapping is released when the last tensor over the storage dies (views and the
aliases handed to ops count), after queued GPU work has finished. The same memory can be
mapped again afterwards, and overlapping tensors (views of one storage, small tensors that
share a page) share one registration.

Copies and files. ``copy.deepcopy(u)``, ``u.clone()`` and ``u.untyped_storage().clone()``
give a new unified tensor (storage) over new shared host memory, mapped like the original;
``torch.UntypedStorage(n, device=unified_device())`` allocates one. ``pickle`` and
``torch.save`` write the bytes; loading in a process that has imported this package gives a
unified tensor again (new host memory, mapped on the current GPU). A process without the
package cannot make unified tensors: ``torch.load`` there says so, and
``torch.load(..., map_location="cpu")`` gives CPU tensors of the same values. Unified storages
never grow: resizing one is an error.

Sizes. A shape whose byte count does not fit 63 bits is a ``ValueError``; an allocation larger
than ``/dev/shm``'s free space or the memory the machine can still give raises
``torch.OutOfMemoryError`` before anything is allocated, saying how many bytes were asked and
how many are available.

Sharing across processes (paper Listing 3). A CPU tensor in shared memory
(``share_memory_()``, :func:`empty_unified`, :func:`load_unified`) passed to
``torch.multiprocessing`` children and converted there with ``.to("unified")`` maps the same
bytes in every child on the child's current GPU. A unified tensor can itself be sent to a
child: it arrives mapped on the child's current GPU. Contract: do not call ``share_memory_()``
on a CPU tensor after converting it, since that moves its bytes and the unified tensor would
keep the old ones.
"""

from __future__ import annotations

import contextlib
import math
import os

import functools
import types
from typing import Optional, Sequence, Union

import numpy as np
import torch

from . import _build

_C = _build.load_extension()

# Unified tensors live on torch's PrivateUse1 dispatch key, whose device type prints as
# "privateuseone". The key is deliberately NOT renamed to "unified": from torch 2.8 on, a
# renamed PrivateUse1 backend becomes torch's one "accelerator" (at::getAccelerator), and the
# autograd engine then fails every backward over CUDA tensors (the internal assert
# `opt_ready_stream && opt_parent_stream`, pytorch/pytorch#161129), so a GNN could no longer
# train on the GPU in a process that imported this package. Instead the name "unified" is
# accepted by Tensor.to (below), which is what the paper's listings use.
DEVICE_TYPE = "privateuseone"
UNIFIED_NAME = "unified"
DeviceLike = Union[str, int, torch.device, None]


def unified_device(index: Optional[int] = None) -> torch.device:
    """The torch.device of unified tensors (``privateuseone[:index]``)."""
    return torch.device(DEVICE_TYPE) if index is None else torch.device(DEVICE_TYPE, index)


def _translate_device(device):
    """'unified' / 'unified:N' -> the unified torch.device; anything else unchanged."""
    if isinstance(device, str) and (device == UNIFIED_NAME or device.startswith(UNIFIED_NAME + ":")):
        _, _, index = device.partition(":")
        if index and not index.isdigit():
            raise ValueError(f"invalid unified device {device!r}: expected 'unified' or 'unified:<gpu index>'")
        return unified_device(int(index) if index else None)
    return device


def _device_module() -> types.ModuleType:
    """The ``torch.privateuseone`` module torch's Python side looks up for this device."""
    mod = types.ModuleType("torch.privateuseone")
    mod.__doc__ = "Device module of pytorch_zerocopy's unified (host-resident, GPU-mapped) tensors."
    mod.is_available = lambda: True
    mod.device_count = lambda: torch.cuda.device_count() if _C.gpu_backed() else 1
    mod.current_device = lambda: torch.cuda.current_device() if _C.gpu_backed() else 0
    mod.is_initialized = lambda: True
    mod.set_device = lambda device: torch.cuda.set_device(device) if _C.gpu_backed() else None
    mod.synchronize = lambda device=None: torch.cuda.synchronize() if _C.gpu_backed() else None
    mod.device = _device_context
    mod._is_in_bad_fork = lambda: False
    mod.manual_seed_all = lambda seed: None
    mod.get_rng_state = lambda device=None: torch.empty(0, dtype=torch.uint8)
    mod.set_rng_state = lambda state, device=None: None
    return mod


def _device_context(device) -> contextlib.AbstractContextManager:
    """``with torch.privateuseone.device(d):`` (torch's storage moves use it): the GPU behind
    unified device ``d`` is current inside; without a GPU, nothing changes."""
    index = torch.device(device).index if isinstance(device, (str, torch.device)) else device
    if not _C.gpu_backed() or index is None or index < 0:
        return contextlib.nullcontext()
    return torch.cuda.device(index)


def _install_to() -> None:
    """Makes ``tensor.to("unified")`` / ``tensor.to(device="unified:1")`` work.

    Only a string naming the unified device is rewritten; every other call reaches torch's
    own ``Tensor.to`` unchanged.
    """
    original = torch.Tensor.to
    if getattr(original, "_zerocopy_wrapped", False):
        return

    @functools.wraps(original)
    def to(self, *args, **kwargs):
        if args and isinstance(args[0], str):
            args = (_translate_device(args[0]),) + args[1:]
        device = kwargs.get("device")
        if isinstance(device, str):
            kwargs["device"] = _translate_device(device)
        return original(self, *args, **kwargs)

    if not hasattr(torch, DEVICE_TYPE):
        torch._register_device_module(DEVICE_TYPE, _device_module())
    to._zerocopy_wrapped = True
    torch.Tensor.to = to
    torch.Tensor.is_unified = property(lambda self: self.device.type == DEVICE_TYPE,
                                       doc="True for a unified (host-resident, GPU-mapped) tensor")


_install_to()


def gpu_backed() -> bool:
    """True when unified tensors are read by a GPU (CUDA build, GPU visible)."""
    return bool(_C.gpu_backed())


def is_unified(t: torch.Tensor) -> bool:
    return isinstance(t, torch.Tensor) and t.device.type == DEVICE_TYPE


def _unified_index(device: DeviceLike) -> int:
    if device is None:
        return -1
    if isinstance(device, int):
        return device
    device = torch.device(_translate_device(device))
    if device.type != DEVICE_TYPE:
        raise ValueError(f"expected a unified device, got {device}")
    return -1 if device.index is None else device.index


def to_unified(t: torch.Tensor, device: DeviceLike = None) -> torch.Tensor:
    """``t.to("unified")`` for a CPU tensor: maps its bytes in place (no copy)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"to_unified expects a tensor, got {type(t).__name__}")
    if is_unified(t):
        return t
    if t.device.type != "cpu":
        return t.to(unified_device() if device is None else torch.device(_translate_device(device)))
    return _C.unified_from_cpu(t, _unified_index(device))


def empty_unified(
    shape: Union[int, Sequence[int]],
    dtype: torch.dtype = torch.float32,
    device: DeviceLike = None,
) -> torch.Tensor:
    """A new, uninitialised unified tensor in shared host memory, with no temporary copy.

    The memory is an unlinked ``/dev/shm`` segment, reserved up front (a too-small /dev/shm is
    an error here, not a crash later) and released when the last reference, in any process,
    dies. Sending it, or its ``.cpu()`` view, to ``torch.multiprocessing`` children shares it.
    """
    if isinstance(shape, int):
        shape = (shape,)
    shape = [int(s) for s in shape]
    if any(s < 0 for s in shape):
        raise ValueError(f"empty_unified: negative dimension in shape {tuple(shape)}")
    return _C.empty_unified(shape, dtype, _unified_index(device))


def empty_shared(shape: Union[int, Sequence[int]], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A CPU tensor in shared memory (the host side of :func:`empty_unified`), not yet mapped."""
    return empty_unified(shape, dtype).cpu()


_NUMPY_TO_TORCH = {
    np.dtype(np.float32): torch.float32,
    np.dtype(np.float16): torch.float16,
    np.dtype(np.float64): torch.float64,
    np.dtype(np.int8): torch.int8,
    np.dtype(np.uint8): torch.uint8,
    np.dtype(np.int16): torch.int16,
    np.dtype(np.int32): torch.int32,
    np.dtype(np.int64): torch.int64,
    np.dtype(np.bool_): torch.bool,
}


def load_unified(
    path: Union[str, os.PathLike],
    device: DeviceLike = None,
    chunk_bytes: int = 256 << 20,
    progress: bool = False,
) -> torch.Tensor:
    """Loads a NumPy ``.npy`` file into a unified tensor without a second full copy.

    The file is memory-mapped and streamed into shared memory ``chunk_bytes`` at a time, so
    peak memory is the table plus one chunk of page cache, whatever the table's size. Its header
    is checked first: a file that is not a ``.npy`` file (a CSV, an ``.npz`` archive), a dtype
    torch cannot hold (objects, strings, complex) or Fortran order raise an error naming the file.
    """
    p = os.fspath(path)
    with open(p, "rb") as f:
        start = f.read(len(np.lib.format.MAGIC_PREFIX))
        if start != np.lib.format.MAGIC_PREFIX:
            found = ("is an .npz archive, not a NumPy .npy file" if start.startswith(b"PK\x03\x04")
                     else "is not a NumPy .npy file (it does not start with the .npy header)")
            raise ValueError(f"load_unified: {p} {found}; expected one array written by numpy.save(path, array)")
        f.seek(0)
        major, _ = np.lib.format.read_magic(f)
        read_header = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
        _, fortran_order, dtype = read_header(f)
    if dtype not in _NUMPY_TO_TORCH:
        supported = ", ".join(str(d) for d in _NUMPY_TO_TORCH)
        raise TypeError(f"load_unified: {p} has unsupported dtype {dtype}; expected one of {supported}")
    if fortran_order:
        raise ValueError(f"load_unified: {p} is stored in Fortran order; save it C-contiguous")
    src = np.load(p, mmap_mode="r")
    dst = empty_unified(src.shape, _NUMPY_TO_TORCH[src.dtype], device)
    host = dst.cpu().reshape(-1)
    flat = src.reshape(-1)
    step = max(1, chunk_bytes // max(1, src.dtype.itemsize))
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=flat.size * src.dtype.itemsize, unit="B", unit_scale=True, desc="load")
    for start in range(0, flat.size, step):
        stop = min(flat.size, start + step)
        host[start:stop].copy_(torch.from_numpy(np.array(flat[start:stop], copy=True)))
        if bar is not None:
            bar.update((stop - start) * src.dtype.itemsize)
    if bar is not None:
        bar.close()
    return dst


def require_host_memory(nbytes: int, what: str, hint: str = "") -> None:
    """Raises ``torch.OutOfMemoryError`` naming ``what``, the bytes it needs and the bytes the
    machine can still give (RAM and swap, within the memory cgroup) when ``nbytes`` exceed the
    latter: the check every unified allocation makes before allocating."""
    _C.require_host_memory(min(max(int(nbytes), 0), 2**64 - 1), what, hint)


def available_host_memory() -> Optional[int]:
    """Bytes of host memory a new allocation may still use (the figure
    :func:`require_host_memory` checks against), or None where the machine does not say."""
    nbytes, _ = _C.available_host_memory()
    return None if nbytes >= 2**64 - 1 else int(nbytes)


def free_shared_memory() -> Optional[int]:
    """Free bytes of ``/dev/shm``, where shared tables live; None where there is no /dev/shm."""
    try:
        st = os.statvfs("/dev/shm")
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def require_shared_memory(nbytes: int, what: str, hint: str = "") -> None:
    """Raises ``torch.OutOfMemoryError``, in one line naming ``what`` and both figures in GiB,
    when ``nbytes`` exceed the free space of ``/dev/shm``; then checks host memory as
    :func:`require_host_memory` does. The checks every shared-memory allocation makes, for a
    caller that sizes all of its tables before allocating any of them."""
    free = free_shared_memory()
    if free is not None and nbytes > free:
        raise torch.OutOfMemoryError(
            f"{what} needs {format_bytes(nbytes, 'GiB')} of shared memory, but /dev/shm has "
            f"{format_bytes(free, 'GiB')} free: enlarge it (mount -o remount,size=<N>G /dev/shm, or docker run "
            f"--shm-size=<N>g)" + (f" or {hint}" if hint else ""))
    require_host_memory(nbytes, what, hint)


def registration_stats() -> dict:
    """Live host registrations of this process: for leak checks."""
    pieces, nbytes, total = _C.registration_stats()
    return {"live_pieces": pieces, "live_bytes": nbytes, "total_registrations": total}


# --- torch.multiprocessing --------------------------------------------------------------


def _rebuild_unified(host: torch.Tensor) -> torch.Tensor:
    return _C.unified_from_cpu(host, -1)


def _install_reducer() -> None:
    """Lets unified tensors travel to torch.multiprocessing children as shared memory."""
    from multiprocessing.reduction import ForkingPickler

    import torch.multiprocessing.reductions as reductions

    original = reductions.reduce_tensor

    def reduce_tensor(t: torch.Tensor):
        if t.device.type != DEVICE_TYPE:
            return original(t)
        host = t.cpu()
        if not host.is_shared():
            raise RuntimeError(
                "a unified tensor sent to another process must live in shared memory; this one "
                "maps private memory. Create it with pytorch_zerocopy.empty_unified / "
                "load_unified, or call .share_memory_() on the CPU tensor before .to('unified')."
            )
        return (_rebuild_unified, (host,))

    ForkingPickler.register(torch.Tensor, reduce_tensor)


_install_reducer()


_BYTE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def format_bytes(n: float, unit: Optional[str] = None) -> str:
    """``n`` bytes in the largest binary unit below it (``'1.5 GiB'``), or in ``unit`` (one of
    B, KiB, MiB, GiB, TiB) when given, so that the figures of one message compare at a glance
    (``'1,200.0 GiB'``)."""
    if unit is not None:
        k = _BYTE_UNITS.index(unit)
        return f"{n / 1024 ** k:,.1f} {unit}"
    if n <= 0:
        return "0 B"
    k = min(len(_BYTE_UNITS) - 1, int(math.log(n, 1024)))
    return f"{n / 1024 ** k:.1f} {_BYTE_UNITS[k]}"


__all__ = [
    "DEVICE_TYPE",
    "UNIFIED_NAME",
    "available_host_memory",
    "empty_shared",
    "empty_unified",
    "format_bytes",
    "free_shared_memory",
    "gpu_backed",
    "is_unified",
    "load_unified",
    "registration_stats",
    "require_host_memory",
    "require_shared_memory",
    "to_unified",
    "unified_device",
]

