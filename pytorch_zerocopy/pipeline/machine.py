"""The machine's gatherer (``Plan.gather_in`` machine): one process of the machine holds the
feature table and samples and gathers for every trainer of the machine.

Why one: the host memory a GPU reads fastest on the machines measured, managed memory kept in
host memory, is private to the process that made it (CUDA cannot share it between processes),
and a copy per trainer would not fit a large table even twice. So one process loads the table,
once, straight from the dataset's feature source into the plan's ``table_in``, and every GPU of
the machine reads that one copy in place (:meth:`~pytorch_zerocopy.FeatureTable.for_device`).

Shape. The parent binds a Unix socket (:func:`listen`) before any trainer starts and starts
:func:`gatherer_main` with it. A trainer connects (:func:`connect`) and sends a
:class:`~.messages.GatherRequest` with its rank's plan; the gatherer serves it in a thread of
its own, with that trainer's GPU current: a sampler of the rank's minibatches
(:func:`~.producer.sample_source`), the table viewed for that GPU behind that GPU's own cache of
the chosen rows, and the producer's loop (:func:`~.producer.produce`) into a ring whose two
queues are the two directions of the connection (:class:`Link`). A trainer that connects before
the table is loaded waits in the socket's backlog: nothing polls.

Lifetime. With ``serve`` given the process ends once it has served that many trainers (one
pipeline's); without, it serves until it is stopped, so the trainers of an elastic restart
connect again and find the table loaded. A connection that ends (its trainer died) ends its
thread; its ring's GPU buffers wait in a pool for the next trainer of that GPU and plan
(:class:`~.ring.SlotBuffers` says why they are not freed). A failure while serving is sent to the trainer as
:class:`~.messages.GathererFailed`, which its run raises, and, with ``serve``, fails this role.

Reads. A producer of gather_in ``machine-reads`` connects instead, with a
:class:`~.messages.ReadRequest`: it samples and fills its ring itself, and this process only
reads the table's rows for it (:mod:`.machine_reads`), in a thread of its own likewise.

Threads. Each trainer served costs one Python thread of this process; torch's ops run without
the GIL, and the host work of a minibatch is issuing its sample and its share of a gather.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import traceback
from multiprocessing.connection import Connection
from typing import Dict, List, Optional

import torch

from ..datasets.base import NodeDataset
from ..feature_table import CachedTable, FeatureReader
from .gather import feature_reader, table_ready
from .machine_reads import serve_reads
from .messages import GatherRequest, GathererFailed, ReadRequest
from .minibatches import SampleStage
from .plan import Plan
from .process import set_threads, trainer_device
from .producer import produce, sample_source
from .ring import RingWriter, SlotBuffers
from .trace import ProducerTrace

SOCKET_NAME = "gatherer.sock"


class LinkClosed(ConnectionError):
    """The other end of a :class:`Link` has gone (its process ended or closed it)."""


class Link:
    """One end of a connection carrying a ring's two queues: :meth:`put` sends, :meth:`get`
    receives (the ring's writer and reader each pass it as both their ``ready`` and ``free``
    queue). ``peer`` names the other end in :class:`LinkClosed`'s message."""

    def __init__(self, conn: Connection, peer: str):
        self.conn, self.peer = conn, peer

    def put(self, item) -> None:
        try:
            self.conn.send(item)
        except (BrokenPipeError, ConnectionResetError, OSError) as e:
            raise LinkClosed(f"{self.peer} closed the connection ({e})") from None

    def get(self):
        try:
            return self.conn.recv()
        except (EOFError, ConnectionResetError, OSError) as e:
            raise LinkClosed(f"{self.peer} closed the connection"
                             + (f" ({e})" if str(e) else ": it ended or was stopped")) from None

    def close(self) -> None:
        self.conn.close()


def listen(directory: str) -> socket.socket:
    """A Unix socket bound in ``directory`` (the run's private temp directory), listening: made
    by the parent before the gatherer or any trainer starts, so a trainer can connect at once."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(os.path.join(directory, SOCKET_NAME))
    sock.listen(64)
    return sock


def open_link(address: str, peer: str = "the machine's gatherer") -> Link:
    """A link to the gatherer listening at ``address``."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(address)
    except OSError as e:
        sock.close()
        raise LinkClosed(f"cannot reach {peer} at {address}: {e}") from None
    return Link(Connection(sock.detach()), peer)


def connect(address: str, plan: Plan) -> Link:
    """A trainer's link to the gatherer listening at ``address``, its request (``plan``) sent."""
    link = open_link(address)
    link.put(GatherRequest(plan))
    return link


class SlotPool:
    """Ring buffers left by trainers that are done or gone, per GPU, for the next trainer there
    (thread-safe: the serving threads share one)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._free: Dict[torch.device, List[SlotBuffers]] = {}

    def take(self, plan: Plan, ds: NodeDataset, device: torch.device) -> Optional[SlotBuffers]:
        """A set that fits a ring of ``plan`` on ``device``, no longer in the pool; else None."""
        with self._lock:
            sets = self._free.get(device, [])
            for i, buffers in enumerate(sets):
                if buffers.fits(plan, ds, device):
                    return sets.pop(i)
        return None

    def give(self, device: torch.device, buffers: Optional[SlotBuffers]) -> None:
        if buffers is not None:
            with self._lock:
                self._free.setdefault(device, []).append(buffers)

    def held(self, device: torch.device) -> int:
        """How many sets wait for a trainer of ``device``."""
        with self._lock:
            return len(self._free.get(device, []))


def gatherer_main(plan: Plan, ds: NodeDataset, cached_rows: Optional[torch.Tensor], sock: socket.socket,
                  serve: Optional[int] = None, stage: SampleStage = SampleStage()) -> None:
    """Loads the table (``plan.table_in``), then serves every trainer that connects to ``sock``
    (at most ``serve`` of them, then returns once they are done; None: until stopped). See the
    module docstring."""
    set_threads(plan.producer_threads)
    device = torch.device("cpu") if plan.host_slots else trainer_device(plan)
    table = feature_reader(plan, ds, device)
    setup = threading.Lock()  # one trainer's GPU state is made at a time
    pool = SlotPool()
    failures: List[str] = []
    threads: List[threading.Thread] = []
    while serve is None or len(threads) < serve:
        conn, _ = sock.accept()
        link = Link(Connection(conn.detach()), "a trainer")
        thread = threading.Thread(target=_serve, args=(link, table, ds, cached_rows, stage, setup, pool, failures),
                                  name=f"zerocopy-gather-{len(threads)}", daemon=True)
        thread.start()
        threads.append(thread)
    sock.close()
    for thread in threads:
        thread.join()
    if failures:
        raise RuntimeError(f"serving a trainer failed:\n{failures[0]}")


def _serve(link: Link, table: FeatureReader, ds: NodeDataset, cached_rows: Optional[torch.Tensor],
           stage: SampleStage, setup: threading.Lock, pool: SlotPool, failures: List[str]) -> None:
    """Serves one trainer until its run ends, or until it goes; its ring's GPU buffers come
    from ``pool`` where a set fits and go back to it at the end."""
    ring: Optional[RingWriter] = None
    reuse: Optional[SlotBuffers] = None
    device = torch.device("cpu")
    try:
        request = link.get()
        if isinstance(request, ReadRequest):  # a producer's reads (gather_in machine-reads)
            serve_reads(link, request, table, cached_rows, setup)
            return
        if not isinstance(request, GatherRequest):
            raise RuntimeError(f"the machine's gatherer: expected a GatherRequest or a ReadRequest, got {request!r}")
        plan = request.plan
        on_gpu = not plan.host_slots
        device = trainer_device(plan) if on_gpu else torch.device("cpu")
        with setup:
            reader = table.for_device(device) if on_gpu else table
            if cached_rows is not None:
                reader = CachedTable(reader, cached_rows)
            tracer = ProducerTrace(on_gpu) if plan.trace else None
            source = sample_source(plan, ds, None, device, tracer, stage)
        reuse = pool.take(plan, ds, device) if on_gpu else None
        ring = RingWriter(plan, ds, device, link, link, reuse=reuse, table=table_ready(table))
        produce(plan, source, reader, ring, tracer)
    except LinkClosed:
        pass  # the trainer went: what it was sent dies with this thread
    except BaseException:  # noqa: BLE001 - the trainer must hear of it, whatever it is
        remote = traceback.format_exc()
        failures.append(remote)
        print(f"zerocopy gatherer: serving a trainer failed:\n{remote}", file=sys.stderr, flush=True)
        try:
            link.put(GathererFailed(remote))
        except LinkClosed:
            pass
    finally:
        link.close()
        try:
            if ring is not None:
                pool.give(device, ring.buffers_for_reuse())
            else:  # the ring was never made (its trainer went during the handshake)
                pool.give(device, reuse)
        except Exception as e:  # noqa: BLE001 - a GPU that fails here fails the next trainer's run too
            print(f"zerocopy gatherer: a ring's buffers could not be kept for reuse: {e}", file=sys.stderr, flush=True)
