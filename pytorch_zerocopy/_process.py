"""Child processes that leave nothing behind: bound to their parent's life, temp files in a
directory their parent owns.

Every process this package starts (pipeline roles, launcher workers) calls :func:`enter_child`
first thing. Two contracts follow from it:

* The child dies (SIGKILL) when the parent process that started it dies, whatever the cause
  (SIGKILL of ``zerocopy train`` included), so it never outlives the run holding shared
  memory, semaphores or a GPU context. Linux only (``PR_SET_PDEATHSIG``); the signal is tied
  to the thread that started the child, so a parent must keep that thread alive until it has
  joined its children (``Supervisor.run`` and ``launch`` do).
* ``multiprocessing``'s per-process temp directory (``pymp-*``, holding the ``listener-*``
  socket through which shared-memory file descriptors are handed to other processes) is
  ``tempdir``, a directory the parent created and removes after the children are gone.
  multiprocessing would otherwise create its own and remove it in an exit handler that a
  child leaving through ``os._exit``, a signal or a crash never runs. Parents name that
  directory short (``zc-*`` under ``$TMPDIR``, as short as multiprocessing's ``pymp-*``): the
  sockets inside must fit the 108-byte limit of a Unix socket path.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from multiprocessing import process as mp_process
from typing import Optional

_PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int) -> None:
    """Makes the kernel SIGKILL this process when its parent dies; exits at once if the
    parent (``parent_pid``, read by the parent before it started this process) is already
    gone, which closes the race between the fork and the ``prctl``."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_PDEATHSIG) failed: {os.strerror(err)}")
    if os.getppid() != parent_pid:
        os._exit(1)


def enter_child(parent_pid: int, tempdir: Optional[str]) -> None:
    """First call of a child process: see the module docstring."""
    die_with_parent(parent_pid)
    if tempdir is not None:
        mp_process.current_process()._config["tempdir"] = tempdir


def release_free_memory() -> None:
    """Hands the C heap's free pages back to the kernel (glibc's ``malloc_trim``). A long run's
    minibatches differ in size, so freed blocks between live ones would otherwise stay
    resident and a process's memory would creep up epoch after epoch. It walks the heap's free
    lists: call it at coarse points (an epoch's end), never per minibatch. A no-op where the C
    library has no ``malloc_trim``."""
    trim = getattr(_libc(), "malloc_trim", None)
    if trim is not None:
        trim(0)


def _libc():
    global _LIBC
    if _LIBC is None:
        _LIBC = ctypes.CDLL(None)
    return _LIBC


_LIBC = None
