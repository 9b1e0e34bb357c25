"""What every role process does with the plan before its work: threads, its device, and the
failures a test injects."""

from __future__ import annotations

import os
import signal

import torch

from .plan import Plan


def set_threads(n: int) -> None:
    """This process's torch (and OpenMP) threads."""
    torch.set_num_threads(max(1, n))


def trainer_device(plan: Plan) -> torch.device:
    """The plan's device, made current in this process when it is a GPU."""
    device = torch.device(plan.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return device


def maybe_fail(plan: Plan, role: str, step: int) -> None:
    """Fails the way ``plan.inject_failure`` asks, if it names this role and minibatch (and
    this rank and this attempt of an elastic job, when it names them)."""
    from ..launch import restart_count

    f = plan.inject_failure
    if f is None or f.role != role or f.at != step or (f.rank is not None and f.rank != plan.rank):
        return
    if f.attempt is not None and f.attempt != restart_count():
        return
    if f.how == "raise":
        raise RuntimeError(f"injected failure in the {role} at minibatch {step}")
    if f.how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    os._exit(3)
