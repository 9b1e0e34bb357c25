"""Differences between the torch versions this package supports (2.2 to current)."""

from __future__ import annotations

from typing import Callable

import torch


def register_fake(qualname: str) -> Callable[[Callable], Callable]:
    """``torch.library.register_fake`` (torch >= 2.4), or ``impl_abstract`` before it."""
    if hasattr(torch.library, "register_fake"):
        return torch.library.register_fake(qualname)
    return torch.library.impl_abstract(qualname)


def has_opcheck() -> bool:
    return hasattr(torch.library, "opcheck")


def generate_methods_for_privateuse1_backend(**kwargs) -> None:
    """``torch.utils.generate_methods_for_privateuse1_backend`` with the keyword arguments this
    torch knows (torch 2.2 lacks ``for_packed_sequence``; the methods it would add are then
    simply not generated)."""
    import inspect

    fn = torch.utils.generate_methods_for_privateuse1_backend
    known = inspect.signature(fn).parameters
    fn(**{k: v for k, v in kwargs.items() if k in known})
