"""Whether a real DGL is importable, imported lazily (importing DGL takes seconds and needs a
torch it was built for, 2.0-2.2 for DGL 2.1)."""

from __future__ import annotations

import os
from typing import Any, Optional

_DGL: Any = None
_TRIED = False


def real_dgl() -> Optional[Any]:
    """The ``dgl`` module, or None when it is not installed or does not import here."""
    global _DGL, _TRIED
    if not _TRIED:
        _TRIED = True
        os.environ.setdefault("DGLBACKEND", "pytorch")
        try:
            import dgl  # noqa: WPS433

            _DGL = dgl
        except Exception:  # DGL wheels fail with ImportError or OSError on an unsupported torch
            _DGL = None
    return _DGL


def is_dgl_graph(g: Any) -> bool:
    dgl = real_dgl() if type(g).__module__.startswith("dgl") else None
    return dgl is not None and isinstance(g, dgl.DGLGraph)
