"""What every role process does with the plan before its work: threads, its device, and the
failures a test injects (:func:`failing`, a wrapper of the role's stream of minibatches).

:func:`failing`: the decision is taken once, where a role assembles its stages: a plan that
injects no failure into this role gets ``items`` back unwrapped, with nothing to check per
minibatch."""

from __future__ import annotations

import os
import signal
from typing import Callable, Iterable, Iterator, TypeVar

import torch

from .messages import EpochMark
from .plan import InjectedFailure, Plan

T = TypeVar("T")


def set_threads(n: int) -> None:
    """This process's torch (and OpenMP) threads."""
    torch.set_num_threads(max(1, n))


def trainer_device(plan: Plan) -> torch.device:
    """The plan's device, made current in this process when it is a GPU."""
    device = torch.device(plan.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return device


def _is_minibatch(item) -> bool:
    return not isinstance(item, EpochMark)


def failing(items: Iterable[T], plan: Plan, role: str,
            is_minibatch: Callable[[T], bool] = _is_minibatch) -> Iterable[T]:
    """``items``, failing the way ``plan.inject_failure`` asks when ``role`` reaches the
    minibatch it names (counted from 0 over the items ``is_minibatch`` accepts; the failure
    happens as that item is taken, before the role works on it). ``items`` itself, unwrapped,
    when the failure is not for this role, rank and attempt of an elastic job."""
    from ..launch import restart_count

    f = plan.inject_failure
    if f is None or f.role != role or (f.rank is not None and f.rank != plan.rank):
        return items
    if f.attempt is not None and f.attempt != restart_count():
        return items
    return _failing(iter(items), f, role, is_minibatch)


def _failing(items: Iterator[T], failure: InjectedFailure, role: str, is_minibatch: Callable[[T], bool]) -> Iterator[T]:
    step = 0
    for item in items:
        if is_minibatch(item):
            maybe_fail(failure, role, step)
            step += 1
        yield item


def maybe_fail(failure: InjectedFailure, role: str, step: int) -> None:
    """Fails as ``failure`` asks if ``step`` is its minibatch."""
    if step != failure.at:
        return
    if failure.how == "raise":
        raise RuntimeError(f"injected failure in the {role} at minibatch {step}")
    if failure.how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    os._exit(3)
