"""Where a dataset's node-feature rows come from, so that the process that reads them can load
them straight into the placement it reads fastest, with no second copy of the table.

A :class:`FeatureSource` knows the table's shape and dtype and can write every row into a table
someone else allocated (:meth:`FeatureSource.fill`), chunk by chunk, never holding a full
temporary copy: rows that already exist as a host tensor (:class:`TensorFeatures`), a
generator (:class:`GeneratedFeatures`, :func:`~pytorch_zerocopy.datasets.papers_like`'s
features), or a NumPy array stored in a file (:class:`NpyFeatures`, an ``.npy`` file or a member
of an ``.npz`` archive: OGB's ``node_feat``). :func:`load_table` allocates a table in a
:class:`~pytorch_zerocopy.placement.Placement` and fills it; a host tensor asked for in a
placement that can map it in place (``CPU``, ``MAPPED``) is used as it is.

Determinism: a source writes the same bytes into every table it fills, whatever the placement
or process (a generator draws on the device it names, with fixed chunks).
"""

from __future__ import annotations

import abc
import os
import zipfile
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

import numpy as np
import torch

from ..feature_table import RowShape
from ..placement import Placement
from ..placement import empty as _empty
from ..placement import place as _place

__all__ = ["FeatureSource", "GeneratedFeatures", "NpyFeatures", "TensorFeatures", "load_table"]


class FeatureSource(RowShape, abc.ABC):
    """The rows of a ``[rows, width]`` feature table (see the module docstring)."""

    shape: Tuple[int, int]
    dtype: torch.dtype

    @property
    def needs_gpu(self) -> bool:
        """Filling a table needs a CUDA context in the filling process."""
        return False

    @abc.abstractmethod
    def fill(self, table: torch.Tensor) -> None:
        """Writes every row into ``table``: ``[rows, width]`` of this dtype, a CPU tensor or a
        CUDA tensor (GPU or managed memory). Synchronous: the rows are in place on return."""

    def host_tensor(self) -> Optional[torch.Tensor]:
        """The rows as a host tensor already in memory, or None when they must be produced."""
        return None

    def describe(self) -> str:
        return f"{self.num_rows:,} x {self.width} {str(self.dtype).replace('torch.', '')}"


@dataclass(frozen=True, eq=False)
class TensorFeatures(FeatureSource):
    """Rows already in a CPU tensor (in shared memory when sent to other processes)."""

    tensor: torch.Tensor

    def __post_init__(self) -> None:
        if not isinstance(self.tensor, torch.Tensor) or self.tensor.dim() != 2:
            raise ValueError(f"features must be a 2-D tensor [rows, width], got "
                             f"{getattr(self.tensor, 'shape', type(self.tensor).__name__)}")
        if self.tensor.device.type != "cpu":
            raise ValueError(f"features must be a host (CPU) tensor, got one on {self.tensor.device}")

    @property
    def shape(self) -> Tuple[int, int]:  # type: ignore[override]
        return (int(self.tensor.shape[0]), int(self.tensor.shape[1]))

    @property
    def dtype(self) -> torch.dtype:  # type: ignore[override]
        return self.tensor.dtype

    def fill(self, table: torch.Tensor) -> None:
        table.copy_(self.tensor)
        if table.is_cuda:
            torch.cuda.synchronize(table.device)

    def host_tensor(self) -> Optional[torch.Tensor]:
        return self.tensor


@dataclass(frozen=True)
class GeneratedFeatures(FeatureSource):
    """papers-like features: node ``v`` gets the mean of its class ``v % num_classes`` (drawn
    from ``N(0, mean_scale^2)`` per dimension) plus ``N(0, 1)`` noise, drawn on ``device``
    (``"cuda"``: the filling process's current GPU, much faster for tables of tens of GiB) in
    chunks of ``chunk_bytes``. The same ``(seed, device, chunk_bytes)`` give the same rows."""

    shape: Tuple[int, int]
    dtype: torch.dtype
    num_classes: int
    mean_scale: float
    seed: int
    device: str = "cpu"
    chunk_bytes: int = 512 << 20

    @property
    def needs_gpu(self) -> bool:
        return torch.device(self.device).type == "cuda"

    def fill(self, table: torch.Tensor) -> None:
        device = torch.device(self.device)
        if device.type == "cuda":
            device = table.device if table.is_cuda else torch.device("cuda", torch.cuda.current_device())
        gen = torch.Generator(device=device).manual_seed(self.seed)
        rows, width = self.shape
        means = torch.randn(self.num_classes, width, generator=gen, device=device) * self.mean_scale
        step = max(1, self.chunk_bytes // (width * 4))
        for a in range(0, rows, step):
            b = min(rows, a + step)
            cls = torch.arange(a, b, device=device) % self.num_classes
            chunk = torch.randn(b - a, width, generator=gen, device=device).add_(means[cls])
            table[a:b].copy_(chunk.to(self.dtype))
        if device.type == "cuda" or table.is_cuda:
            torch.cuda.synchronize(table.device if table.is_cuda else device)


@dataclass(frozen=True)
class NpyFeatures(FeatureSource):
    """A 2-D C-ordered NumPy array stored in ``path``: an ``.npy`` file, or member ``member``
    (``"node_feat"``) of an ``.npz`` archive (stored or deflated). Rows are read
    ``chunk_bytes`` at a time and converted to ``dtype``. Build one with :meth:`open`, which
    reads the header only."""

    path: str
    shape: Tuple[int, int]
    dtype: torch.dtype
    member: Optional[str] = None
    chunk_bytes: int = 256 << 20

    @classmethod
    def open(cls, path: str, member: Optional[str] = None, dtype: Optional[torch.dtype] = None) -> "NpyFeatures":
        """The source over ``path`` (and ``member`` of an ``.npz``): checks the header (a 2-D,
        C-ordered numeric array) without reading the rows. ``dtype``: convert to (default: the
        stored dtype)."""
        path = os.fspath(path)
        with _open_array(path, member) as f:
            stored, shape = _read_header(f, path)
        if len(shape) != 2:
            raise ValueError(f"{_name(path, member)} holds an array of shape {shape}; node features must be 2-D "
                             "[nodes, width]")
        return cls(path, (int(shape[0]), int(shape[1])), dtype or _torch_dtype(stored, path), member)

    def fill(self, table: torch.Tensor) -> None:
        rows, width = self.shape
        with _open_array(self.path, self.member) as f:
            stored, _ = _read_header(f, self.path)
            step = max(1, self.chunk_bytes // max(1, width * stored.itemsize))
            buffer = bytearray(min(rows, step) * width * stored.itemsize)
            for a in range(0, rows, step):
                b = min(rows, a + step)
                view = memoryview(buffer)[: (b - a) * width * stored.itemsize]
                got = 0
                while got < len(view):
                    n = f.readinto(view[got:])
                    if not n:
                        raise ValueError(f"{_name(self.path, self.member)} is truncated: rows {a} to {b} of {rows} "
                                         "are missing")
                    got += n
                chunk = torch.from_numpy(np.frombuffer(view, dtype=stored).reshape(b - a, width))
                table[a:b].copy_(chunk.to(self.dtype))
        if table.is_cuda:
            torch.cuda.synchronize(table.device)


def _name(path: str, member: Optional[str]) -> str:
    return path if member is None else f"{path}[{member}]"


class _open_array:
    """The byte stream of an ``.npy`` file, or of member ``member`` (``member.npy``) of an ``.npz``."""

    def __init__(self, path: str, member: Optional[str]):
        self.path, self.member = path, member
        self._zip = None

    def __enter__(self):
        if self.member is None:
            self._file = open(self.path, "rb")
            return self._file
        self._zip = zipfile.ZipFile(self.path)
        try:
            self._file = self._zip.open(self.member + ".npy")
        except KeyError:
            self._zip.close()
            raise KeyError(f"{self.path} has no member {self.member!r}") from None
        return self._file

    def __exit__(self, *exc) -> None:
        self._file.close()
        if self._zip is not None:
            self._zip.close()


def _read_header(f, path: str) -> Tuple[np.dtype, Tuple[int, ...]]:
    fmt = np.lib.format
    try:
        version = fmt.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = fmt.read_array_header_1_0(f)
        elif version == (2, 0):
            shape, fortran, dtype = fmt.read_array_header_2_0(f)
        else:
            shape, fortran, dtype = fmt._read_array_header(f, version)
    except ValueError as e:
        raise ValueError(f"{path} is not a NumPy .npy array ({e})") from None
    if fortran:
        raise ValueError(f"{path} is stored in Fortran order; save it C-contiguous")
    if dtype.hasobject:
        raise ValueError(f"{path} holds Python objects; node features must be a numeric array")
    return dtype, shape


def _torch_dtype(dtype: np.dtype, path: str) -> torch.dtype:
    try:
        return torch.from_numpy(np.empty(0, dtype=dtype)).dtype
    except TypeError:
        raise ValueError(f"{path} holds {dtype}, which torch has no dtype for") from None


def load_table(source: FeatureSource, placement: Placement, device=None) -> torch.Tensor:
    """The rows of ``source`` as a table in ``placement`` (on ``device``'s GPU where the
    placement has one): a host tensor source in ``CPU``/``MAPPED`` is used in place (mapped, not
    copied); anything else is allocated there and filled, with no other copy of the table."""
    placement = Placement.parse(placement)
    host = source.host_tensor()
    if host is not None and placement in (Placement.CPU, Placement.MAPPED):
        return _place(host, placement, device)
    table = _empty(source.shape, source.dtype, placement, device)
    source.fill(table.cpu() if placement is Placement.MAPPED else table)
    return table


def shared_rows(source: FeatureSource, numa_nodes: Sequence[int] = ()) -> torch.Tensor:
    """``source``'s rows in a new shared-memory CPU tensor, its pages interleaved over
    ``numa_nodes`` (:func:`pytorch_zerocopy.numa.interleave`; placed before they are filled). A
    source that draws on a GPU is filled by a short-lived child process, so this process never
    creates a CUDA context (an MPS partition started later then has the GPU to itself)."""
    from ..numa import interleave

    host = source.host_tensor()
    if host is not None:
        host = host if host.is_shared() else host.share_memory_()
        interleave(host, numa_nodes)
        return host
    table = _empty(source.shape, source.dtype, Placement.CPU)
    interleave(table, numa_nodes)
    if not source.needs_gpu:
        source.fill(table)
        return table
    import torch.multiprocessing as mp

    child = mp.get_context("spawn").Process(target=source.fill, args=(table,), name="zerocopy-features")
    child.start()
    child.join()
    if child.exitcode != 0:
        raise RuntimeError(f"filling the feature table ({source.describe()}) failed in its child process "
                           f"(exit code {child.exitcode})")
    return table
