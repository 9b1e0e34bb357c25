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
