"""Rows read through the machine's gatherer (``Plan.gather_in`` machine-reads).

Why: the host memory a GPU reads fastest (managed memory kept in host memory, on the machines
measured) is private to the process that made it, so several processes of a machine cannot
share one such table; and one process that samples and gathers for every trainer
(``machine``, :mod:`.machine`) issues every trainer's samples from one interpreter. Here each
trainer keeps a producer process of its own, which samples and fills its ring as ``producer``
does, and only the reads of the table's rows go to the machine's gatherer, which holds the one
table (and each GPU's cache of hot rows) and issues each read as one op on a stream of that
GPU.

Shape. A producer's :class:`MachineRows` is its :class:`~pytorch_zerocopy.feature_table.FeatureReader`:
it connects to the gatherer's socket (:func:`.machine.open_link`) and sends a
:class:`~.messages.ReadRequest`; the gatherer serves it in a thread (:func:`serve_reads`). A
read names its ids and its output by storage and offset (:class:`~.messages.ReadRows`): each
storage of the producer's is sent once (:class:`~.messages.ReadShare`, by CUDA IPC or shared
memory) and kept alive by the producer while the connection is open, so a request carries no
tensor. The ids are first copied into a staging buffer of the producer's.

Ordering (GPU). Two interprocess events: the producer records ``requested`` on its stream once
the ids are staged, and sends the request; the gatherer's stream waits for it, reads, and
records ``done``, then answers; the producer's stream waits for ``done``. A request is
answered before the next is sent, so each event has one record in flight: a read costs one
message each way and no host synchronisation. On the CPU the gatherer reads before it answers.

Lifetime. The gatherer drops a producer's storages when the connection ends, after its own
reads into them are complete; a producer that dies ends its connection (on one machine the job
then restarts whole: :func:`pytorch_zerocopy.train.train_data_parallel`).
"""

from __future__ import annotations

import contextlib
import threading
from typing import Dict, Optional, Tuple

import torch

from ..datasets.base import shared_host_tensor
from ..feature_table import CachedTable, FeatureReader
from .gather import gather_into, table_ready
from .messages import (READ_COUNTS, ROWS_READ, CacheCounts, GathererFailed, ReadRequest, ReadRows, ReadShare,
                       ReadsOpen, TableReady)
from .process import trainer_device


class MachineRows:
    """A producer's reader of the machine's table (module docstring): ``read`` writes
    ``rows[ids]`` into ``out`` on :attr:`device` through the gatherer at ``address``.

    Thread-safety: one caller at a time. Reads on one stream are ordered like any op on it;
    reads issued on different streams are each ordered after the previous read.
    """

    def __init__(self, address: str, plan, device: torch.device):
        from .machine import open_link

        self.device = device
        self.on_gpu = device.type == "cuda"
        self._requested = None
        if self.on_gpu:
            self._requested = torch.cuda.Event(interprocess=True)
            self._requested.record(torch.cuda.current_stream(device))  # an IPC handle needs a created event
            torch.cuda.current_stream(device).synchronize()
        self.link = open_link(address, "the machine's gatherer")
        self.link.put(ReadRequest(plan, self._requested))
        opened = self.link.get()
        if isinstance(opened, GathererFailed):
            raise RuntimeError(f"the machine's gatherer failed:\n{opened.remote_traceback}")
        if not isinstance(opened, ReadsOpen):
            raise RuntimeError(f"producer: expected the gatherer's ReadsOpen first, got {opened!r}")
        self.table: Optional[TableReady] = opened.table
        self._shape = torch.Size(opened.shape)
        self._dtype = opened.dtype
        self._done = opened.done
        self.cached = opened.cached
        # Every storage the gatherer holds, by (address, bytes, dtype): its key and a tensor over
        # it that keeps it alive until it is forgotten.
        self._shared: Dict[Tuple[int, int, torch.dtype], Tuple[int, torch.Tensor]] = {}
        self._next_key = 0
        self._ids: Optional[torch.Tensor] = None

    @property
    def shape(self) -> torch.Size:
        return self._shape

    @property
    def dtype(self) -> torch.dtype:
        return self._dtype

    def _key(self, t: torch.Tensor) -> int:
        """The key the gatherer knows ``t``'s storage by, sending it first if new."""
        storage = t.untyped_storage()
        if not self.on_gpu and not storage.is_shared():
            storage.share_memory_()  # moved once, in place: the key names the shared copy
        k = (storage.data_ptr(), storage.nbytes(), t.dtype)
        if k not in self._shared:
            base = torch.empty(0, dtype=t.dtype, device=t.device).set_(
                storage, 0, (storage.nbytes() // t.element_size(),))
            self._shared[k] = (self._next_key, base)
            self._next_key += 1
            self.link.put(ReadShare(self._shared[k][0], base))
        return self._shared[k][0]

    def _forget(self, t: torch.Tensor) -> None:
        """Tells the gatherer to drop ``t``'s storage (after the reads sent before), and drops
        it here."""
        storage = t.untyped_storage()
        shared = self._shared.pop((storage.data_ptr(), storage.nbytes(), t.dtype), None)
        if shared is not None:
            self.link.put(ReadShare(shared[0], None))

    def _staged(self, n: int) -> torch.Tensor:
        if self._ids is None or self._ids.numel() < n:
            grown = max(n, (self._ids.numel() * 5 // 4) if self._ids is not None else n)
            if self._ids is not None:
                self._forget(self._ids)
            self._ids = (torch.empty(grown, dtype=torch.int64, device=self.device) if self.on_gpu
                         else shared_host_tensor((grown,), torch.int64))
        return self._ids[:n]

    def _check(self, ids: torch.Tensor, out: Optional[torch.Tensor], check_bounds: bool) -> torch.Tensor:
        if ids.dim() != 1 or ids.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"MachineRows.read: ids must be a 1-D int32/int64 tensor, got {ids.dtype} of shape "
                            f"{tuple(ids.shape)}")
        if ids.device.type != "cpu" and ids.device != self.device:
            raise ValueError(f"MachineRows.read: ids must be on the CPU or {self.device}, got {ids.device}")
        rows = self._shape[0]
        if check_bounds and ids.numel():
            lo, hi = int(ids.min()), int(ids.max())
            if lo < 0 or hi >= rows:
                raise IndexError(f"MachineRows.read: index {lo if lo < 0 else hi} is out of bounds for a table with "
                                 f"{rows} rows")
        want = (ids.numel(), self._shape[1])
        if out is None:
            return torch.empty(want, dtype=self._dtype, device=self.device)
        if tuple(out.shape) != want or out.dtype != self._dtype or out.device != self.device or not out.is_contiguous():
            raise ValueError(f"MachineRows.read: out must be a contiguous {self._dtype} tensor of shape {list(want)} "
                             f"on {self.device}, got {out.dtype} of shape {list(out.shape)} on {out.device}")
        return out

    def read(self, ids: torch.Tensor, out: Optional[torch.Tensor] = None, *,
             check_bounds: bool = True) -> torch.Tensor:
        """``rows[ids]`` in ids order into ``out`` (or a new tensor) on :attr:`device`; on a GPU
        complete on the current stream (queued), on the CPU on return. Raises what the
        gatherer raised, as RuntimeError."""
        given = out is not None
        out = self._check(ids, out, check_bounds)
        n = ids.numel()
        if n == 0:
            return out
        stream = torch.cuda.current_stream(self.device) if self.on_gpu else None
        if stream is not None:
            stream.wait_event(self._done)  # the staging buffer is free once the last read is done
        staged = self._staged(n)
        staged.copy_(ids, non_blocking=self.on_gpu)
        if stream is not None:
            self._requested.record(stream)
        request = ReadRows(self._key(staged), staged.storage_offset(), self._key(out), out.storage_offset(), n)
        self.link.put(request)
        reply = self.link.get()
        if isinstance(reply, GathererFailed):
            raise RuntimeError(f"the machine's gatherer failed:\n{reply.remote_traceback}")
        if reply != ROWS_READ:
            raise RuntimeError(f"producer: expected the gatherer's answer to a read, got {reply!r}")
        if stream is not None:
            stream.wait_event(self._done)
        if not given:
            self._forget(out)  # the caller's now: the gatherer holds no storage per call
        return out

    def cache_counts(self) -> CacheCounts:
        """The gatherer's cache's counts over the rows read since the last call (waits for the
        gatherer's reads to complete: call it once per phase, not per read)."""
        self.link.put(READ_COUNTS)
        reply = self.link.get()
        if isinstance(reply, GathererFailed):
            raise RuntimeError(f"the machine's gatherer failed:\n{reply.remote_traceback}")
        if not isinstance(reply, CacheCounts):
            raise RuntimeError(f"producer: expected the gatherer's cache counts, got {reply!r}")
        return reply

    def close(self) -> None:
        """Ends the connection (once this process's GPU work is done, the caller's concern) and
        lets go of the storages the gatherer held."""
        self.link.close()
        self._shared, self._ids = {}, None


def serve_reads(link, request: ReadRequest, table: FeatureReader, cached_rows: Optional[torch.Tensor],
                setup: threading.Lock) -> None:
    """Serves one producer's reads (module docstring) until its connection ends (raising
    :class:`~.machine.LinkClosed`): ``table`` viewed for the producer's GPU behind that GPU's
    own cache of ``cached_rows``, on a stream of its own."""
    plan = request.plan
    on_gpu = not plan.host_slots
    device = trainer_device(plan) if on_gpu else torch.device("cpu")
    with setup:  # one producer's GPU state is made at a time
        reader = table.for_device(device) if on_gpu else table
        if cached_rows is not None:
            reader = CachedTable(reader, cached_rows)
        stream = torch.cuda.Stream(device) if on_gpu else None
        done = None
        if on_gpu:
            done = torch.cuda.Event(interprocess=True)
            done.record(stream)
            stream.synchronize()
    width = reader.shape[1]
    shared: Dict[int, torch.Tensor] = {}
    cache = reader if isinstance(reader, CachedTable) and reader.cache_rows else None
    hits: Optional[torch.Tensor] = None  # on the reader's device: counting never synchronises
    lookups = 0
    link.put(ReadsOpen(table_ready(table), tuple(reader.shape), reader.dtype, done, cache is not None))
    try:
        while True:
            msg = link.get()
            if msg == READ_COUNTS:
                if stream is not None:
                    stream.synchronize()
                link.put(CacheCounts(0 if hits is None else int(hits), lookups))
                hits, lookups = None, 0
                continue
            if isinstance(msg, ReadShare):
                if msg.base is None:
                    if stream is not None:
                        stream.synchronize()  # our reads into it are done before its mapping goes
                    shared.pop(msg.key, None)
                else:
                    shared[msg.key] = msg.base
                continue
            if not isinstance(msg, ReadRows):
                raise RuntimeError(f"the machine's gatherer: expected a read, got {msg!r}")
            ids = shared[msg.ids_key][msg.ids_offset:msg.ids_offset + msg.rows]
            out = shared[msg.out_key][msg.out_offset:msg.out_offset + msg.rows * width]
            if ids.numel() != msg.rows or out.numel() != msg.rows * width:
                raise RuntimeError(f"the machine's gatherer: a read of {msg.rows} rows names ids or an output outside "
                                   f"the storages shared with it ({msg!r})")
            out = out.view(msg.rows, width)
            with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
                if stream is not None:
                    stream.wait_event(request.requested)
                gather_into(reader, ids, out)
                if cache is not None:  # before "done": the producer may restage the ids then
                    found = cache.count_hits(ids)
                    hits = found if hits is None else hits + found
                if stream is not None:
                    done.record(stream)
            lookups += msg.rows
            link.put(ROWS_READ)
    finally:
        if stream is not None:
            stream.synchronize()  # no read of ours may outlive its producer's storages here
        shared.clear()
