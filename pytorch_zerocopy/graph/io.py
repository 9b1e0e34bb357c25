"""Reading and writing graphs: EMOGI's binary CSR files, text edge lists, NumPy archives.

EMOGI ``.bel`` (three files beside each other, named ``<name>.bel.col``, ``.bel.dst`` and
``.bel.val``). Each file starts with a 16-byte header of two little-endian uint64: the number
of elements that follow, and a field EMOGI ignores (written here as the element size in
bytes). ``.col`` holds the ``num_nodes + 1`` row offsets as uint64, ``.dst`` the column ids as
uint64, ``.val`` one 4-byte weight per edge (EMOGI's SSSP reads uint32; float32 is also
accepted on load via ``weight_dtype``). Large files are streamed in chunks through a memory map,
so loading holds the graph once plus one chunk.

Text edge lists: one edge per line, ``src dst`` (``.el``) or ``src dst weight`` (``.wel``),
separated by spaces or tabs; lines starting with ``#`` or ``%`` are comments (SNAP files).

NumPy: ``.npz`` archives with arrays ``indptr``, ``indices``, optional ``weights`` and a
``symmetric`` flag.
"""

from __future__ import annotations

import os
import zipfile
import zlib
from typing import Iterator, List, Optional, Tuple, Union

import numpy as np
import torch

from .csr import CSRGraph, _index_dtype

PathLike = Union[str, os.PathLike]
_CHUNK = 1 << 24  # elements per streamed chunk


def _bel_paths(path: PathLike):
    p = os.fspath(path)
    return p + ".col", p + ".dst", p + ".val"


def _write_array(f, arr: torch.Tensor, dtype: np.dtype, progress) -> None:
    f.write(np.array([arr.numel(), np.dtype(dtype).itemsize], dtype="<u8").tobytes())
    flat = arr.reshape(-1)
    for start in range(0, flat.numel(), _CHUNK):
        piece = flat[start:start + _CHUNK].numpy()
        f.write(piece.astype(dtype, copy=False).tobytes())
        if progress is not None:
            progress.update(piece.size)


def save_bel(graph: CSRGraph, path: PathLike, *, unit_weights: bool = False, progress: bool = False) -> None:
    """Writes ``<path>.col``, ``<path>.dst`` and, with weights, ``<path>.val``. A graph without
    weights gets a ``.val`` of int32 ones with ``unit_weights`` (the unit weights its sssp uses,
    for readers such as EMOGI's SSSP that need the file)."""
    col, dst, val = _bel_paths(path)
    g = graph.cpu()
    weights = g.weights
    if weights is None and unit_weights:
        weights = torch.ones(1, dtype=torch.int32).expand(g.num_edges)  # written chunk by chunk
    bar = _bar(progress, g.num_nodes + 1 + g.num_edges * (2 if weights is not None else 1), "save_bel")
    with open(col, "wb") as f:
        _write_array(f, g.indptr, np.dtype("<u8"), bar)
    with open(dst, "wb") as f:
        _write_array(f, g.indices, np.dtype("<u8"), bar)
    if weights is not None:
        wdt = np.dtype("<f4") if weights.dtype == torch.float32 else np.dtype("<i4")
        with open(val, "wb") as f:
            _write_array(f, weights, wdt, bar)
    if bar is not None:
        bar.close()


def _read_array(path: str, dtype: np.dtype) -> np.ndarray:
    size = os.path.getsize(path)
    if size < 16:
        raise ValueError(f"{path}: too short for the 16-byte .bel header ({size} bytes)")
    count = int(np.fromfile(path, dtype="<u8", count=1)[0])
    want = 16 + count * np.dtype(dtype).itemsize
    if size != want:
        raise ValueError(f"{path}: the header says {count} elements of {np.dtype(dtype).itemsize} bytes "
                         f"({want} bytes with the header), but the file has {size} bytes")
    return np.memmap(path, dtype=dtype, mode="r", offset=16, shape=(count,))


def _stream(src: np.ndarray, dtype: torch.dtype, progress) -> torch.Tensor:
    out = torch.empty(src.shape[0], dtype=dtype)
    for start in range(0, src.shape[0], _CHUNK):
        piece = np.asarray(src[start:start + _CHUNK])
        out[start:start + piece.shape[0]].copy_(torch.from_numpy(piece.astype(piece.dtype.newbyteorder("="))))
        if progress is not None:
            progress.update(piece.shape[0])
    return out


def load_bel(
    path: PathLike,
    *,
    weight_dtype: torch.dtype = torch.int32,
    symmetric: bool = False,
    index_dtype: Optional[torch.dtype] = None,
    weights: bool = True,
    progress: bool = False,
) -> CSRGraph:
    """Reads an EMOGI graph ``<path>.col`` / ``.dst`` (and ``.val`` when present and ``weights``).

    Ids are stored as int32 when every id fits (or as ``index_dtype`` says); ``weight_dtype``
    says how to read the 4-byte weights (int32, EMOGI's default, or float32). EMOGI files
    do not record whether the graph is undirected: pass ``symmetric=True`` when it is.
    """
    if weight_dtype not in (torch.int32, torch.float32):
        raise TypeError(f"weight_dtype must be torch.int32 or torch.float32, got {weight_dtype}")
    col, dst, val = _bel_paths(path)
    for p in (col, dst):
        if not os.path.exists(p):
            raise FileNotFoundError(f"load_bel: {p} does not exist (expected {os.fspath(path)}.col and .dst)")
    offsets = _read_array(col, np.dtype("<u8"))
    ids = _read_array(dst, np.dtype("<u8"))
    if offsets.shape[0] < 1:
        raise ValueError(f"{col}: needs at least one offset")
    num_nodes = offsets.shape[0] - 1
    has_val = weights and os.path.exists(val)
    bar = _bar(progress, offsets.shape[0] + ids.shape[0] * (2 if has_val else 1), "load_bel")
    indptr = _stream(offsets.view("<i8"), torch.int64, bar)
    indices = _stream(ids.view("<i8"), torch.int64, None if bar is None else bar)
    idx_dtype = _index_dtype(num_nodes, index_dtype)
    if idx_dtype == torch.int32:
        if indices.numel() and (int(indices.min()) < 0 or int(indices.max()) >= num_nodes):
            raise ValueError(f"{dst}: column ids must be in [0, {num_nodes})")
        indices = indices.to(torch.int32)
    w = None
    if has_val:
        raw = _read_array(val, np.dtype("<f4") if weight_dtype == torch.float32 else np.dtype("<i4"))
        if raw.shape[0] != ids.shape[0]:
            raise ValueError(f"{val}: {raw.shape[0]} weights for {ids.shape[0]} edges")
        w = _stream(raw, weight_dtype, bar)
    if bar is not None:
        bar.close()
    return CSRGraph(indptr, indices, w, symmetric=symmetric)


def save_edge_list(graph: CSRGraph, path: PathLike, *, weighted: Optional[bool] = None) -> None:
    """Writes one ``src dst`` (or ``src dst weight``) line per CSR entry. ``weighted`` defaults
    to whether the graph has weights."""
    g = graph.cpu()
    if weighted is None:
        weighted = g.weights is not None
    if weighted and g.weights is None:
        raise ValueError("save_edge_list: weighted=True, but the graph has no weights")
    deg = g.indptr[1:] - g.indptr[:-1]
    with open(os.fspath(path), "w") as f:
        for start in range(0, g.num_nodes, _CHUNK):
            stop = min(g.num_nodes, start + _CHUNK)
            lo, hi = int(g.indptr[start]), int(g.indptr[stop])
            src = torch.arange(start, stop, dtype=torch.int64).repeat_interleave(deg[start:stop]).numpy()
            dst = g.indices[lo:hi].numpy()
            if weighted:
                w = g.weights[lo:hi].numpy()
                fmt = "%d %d %.9g" if w.dtype == np.float32 else "%d %d %d"
                np.savetxt(f, np.rec.fromarrays([src, dst, w]), fmt=fmt)
            else:
                np.savetxt(f, np.stack([src, dst], axis=1), fmt="%d %d")


# An edge list whose largest id implies more vertices than this, and more than this many per
# edge, is out of proportion to the file: its offsets alone would dwarf the edges. Such a file is
# read only when the caller states num_nodes (ids are usually dense; sparse ids are usually a
# mistake, or a file that is not an edge list).
_IMPLIED_NODES_FREE = 1 << 24
_IMPLIED_NODES_PER_EDGE = 1024

_INT32_RANGE = (-(2**31), 2**31 - 1)


_COMMENTS = (b"#", b"%")
_COUNTING = "(lines and columns count from 1)"


def _data_lines(path: str) -> Iterator[Tuple[int, List[bytes]]]:
    """``(line number counting from 1, fields)`` of each line of a text edge list that holds
    data: comments (from ``#`` or ``%`` to the end of the line) and blank lines are skipped."""
    with open(path, "rb") as f:
        for number, line in enumerate(f, 1):
            for mark in _COMMENTS:
                line = line.split(mark, 1)[0]
            fields = line.split()
            if fields:
                yield number, fields


def _line_of_edge(path: str, edge: int) -> int:
    """The line (counting from 1) that holds edge ``edge`` (counting from 0) of a text edge list."""
    for i, (number, _) in enumerate(_data_lines(path)):
        if i == edge:
            return number
    raise IndexError(f"{path} has fewer than {edge + 1} edges")


def _describe_bad_line(path: str, ncols: int) -> str:
    """Why ``path`` is not a text edge list of ``ncols`` columns: where its first wrong line is
    (``"line 7, column 2: ..."``) and what is wrong with it."""
    first = None
    for number, fields in _data_lines(path):
        if first is None:
            first = number
        if len(fields) != ncols:
            return (f"line {number}: {len(fields)} column(s), but line {first} has {ncols}; every line must hold "
                    f"the same columns, 'src dst' or 'src dst weight' {_COUNTING}")
        for column, text in enumerate(fields, 1):
            token = text.decode(errors="replace")
            try:
                value = int(token) if column <= 2 else float(token)
            except ValueError:
                what = "vertex id" if column <= 2 else "weight"
                kind = "an integer" if column <= 2 else "a number"
                return f"line {number}, column {column}: {what} {token!r} is not {kind} {_COUNTING}"
            if column <= 2 and not -(2**63) <= value < 2**63:
                return f"line {number}, column {column}: vertex id {token} does not fit int64 {_COUNTING}"
    return f"not a text edge list of {ncols}-column lines 'src dst{' weight' if ncols > 2 else ''}'"


def _read_text_columns(path: str, ncols: int) -> np.ndarray:
    """The rows of a whitespace-separated text file as a structured array: two int64 id columns,
    then float64 columns. Every row must have ``ncols`` columns and integer ids; a file that
    breaks this raises ``ValueError`` naming its first wrong line and column."""
    fields = [("src", np.int64), ("dst", np.int64)] + [(f"c{i}", np.float64) for i in range(2, ncols)]
    try:
        return np.loadtxt(path, comments=("#", "%"), dtype=fields, ndmin=1)
    except ValueError:
        raise ValueError(f"{path}, {_describe_bad_line(path, ncols)}") from None


def _edge_weights(path: str, raw: np.ndarray, weight_dtype: Optional[torch.dtype]) -> torch.Tensor:
    """Weights as int32 (every weight integral and in int32's range) or float32, checked."""
    if weight_dtype not in (None, torch.int32, torch.float32):
        raise TypeError(f"weight_dtype must be torch.int32 or torch.float32, got {weight_dtype}")
    finite = np.isfinite(raw)
    if not finite.all():
        row = int(np.flatnonzero(~finite)[0])
        raise ValueError(f"{path}, line {_line_of_edge(path, row)}: weight {raw[row]} is not a finite number "
                         f"{_COUNTING}")
    integral = bool(np.all(np.floor(raw) == raw))
    in_int32 = raw.size == 0 or (raw.min() >= _INT32_RANGE[0] and raw.max() <= _INT32_RANGE[1])
    if weight_dtype is None:
        weight_dtype = torch.int32 if integral and in_int32 else torch.float32
    if weight_dtype == torch.int32:
        if not integral:
            raise ValueError(f"{path}: weight_dtype=torch.int32, but some weights are fractional")
        if not in_int32:
            raise ValueError(f"{path}: weights in [{raw.min():g}, {raw.max():g}] do not fit int32; "
                             "read them as weight_dtype=torch.float32")
        return torch.from_numpy(raw.astype(np.int32))
    if raw.size and np.abs(raw).max() > np.finfo(np.float32).max:
        raise ValueError(f"{path}: weight {np.abs(raw).max():g} does not fit float32")
    return torch.from_numpy(raw.astype(np.float32))


def load_edge_list(
    path: PathLike,
    *,
    weighted: Optional[bool] = None,
    weight_dtype: Optional[torch.dtype] = None,
    num_nodes: Optional[int] = None,
    symmetrize: bool = False,
    drop_self_loops: bool = False,
    drop_duplicates: bool = False,
    index_dtype: Optional[torch.dtype] = None,
) -> CSRGraph:
    """Reads a ``.el`` / ``.wel`` / SNAP text edge list into a CPU graph.

    Every line holds the same number of columns: two integer vertex ids, then (``.wel``) a
    weight; further columns are ignored. ``weighted`` defaults to True for ``.wel`` files and
    otherwise to whether lines have a third column. Weights are int32 when every weight is
    integral and fits int32, else float32 (or ``weight_dtype``); they must be finite.

    ``num_nodes`` defaults to the largest id + 1. A file whose largest id implies far more
    vertices than its edges could touch (more than 2^24, and over 1024 per edge) is refused
    unless ``num_nodes`` is given, with what its offsets would cost; either way a graph larger
    than the memory available raises ``torch.OutOfMemoryError`` before anything is allocated.
    Malformed lines (fractional, non-numeric or missing ids, a changing column count) raise
    ``ValueError`` naming the file, the line and the column, both counted from 1 as an editor
    counts them. A file without edges (empty, or only comments) gives a graph of ``num_nodes``
    (default 0) vertices and no edges, without weights unless ``weighted`` is True or the file is
    a ``.wel`` (float32 then, or ``weight_dtype``). The remaining options are those of
    :meth:`CSRGraph.from_coo`.
    """
    p = os.fspath(path)
    first = next(_data_lines(p), None)
    if first is None:  # no edges: nothing to infer weights or columns from
        if weighted is None:
            weighted = p.endswith(".wel")
        src = dst = np.zeros(0, dtype=np.int64)
        raw = np.zeros(0, dtype=np.float64) if weighted else None
        if weighted and weight_dtype is None:
            weight_dtype = torch.float32
    else:
        number, fields = first
        ncols = len(fields)
        if ncols < 2:
            raise ValueError(f"{p}, line {number}: lines must hold 'src dst' or 'src dst weight', got {ncols} "
                             f"column(s) {_COUNTING}")
        if weighted is None:
            weighted = p.endswith(".wel") or ncols >= 3
        if weighted and ncols < 3:
            raise ValueError(f"{p}: weighted=True, but line {number} has {ncols} columns, no weight {_COUNTING}")
        data = _read_text_columns(p, ncols)
        src, dst = data["src"], data["dst"]
        raw = data["c2"] if weighted else None
    if src.size:
        lo = min(int(src.min()), int(dst.min()))
        if lo < 0:
            row = int(np.flatnonzero((src < 0) | (dst < 0))[0])
            bad = int(src[row]) if src[row] < 0 else int(dst[row])
            raise ValueError(f"{p}, line {_line_of_edge(p, row)}: vertex ids must be >= 0, got {bad} {_COUNTING}")
    if num_nodes is None and src.size:
        implied = max(int(src.max()), int(dst.max())) + 1
        if implied > _IMPLIED_NODES_FREE and implied > _IMPLIED_NODES_PER_EDGE * src.size:
            from ..unified import format_bytes

            raise ValueError(
                f"{p}: vertex id {implied - 1} implies {implied:,} vertices for {src.size:,} edge(s); their "
                f"offsets alone would take {format_bytes(8 * (implied + 1))}. Pass num_nodes={implied} if that "
                "is intended, or renumber the ids densely.")
    w = None if raw is None else _edge_weights(p, raw, weight_dtype)
    try:
        return CSRGraph.from_coo(torch.from_numpy(np.ascontiguousarray(src)), torch.from_numpy(np.ascontiguousarray(dst)),
                                 num_nodes, w, symmetrize=symmetrize, drop_self_loops=drop_self_loops,
                                 drop_duplicates=drop_duplicates, index_dtype=index_dtype)
    except ValueError as e:
        raise ValueError(f"{p}: {e}") from None


def save_npz(graph: CSRGraph, path: PathLike) -> None:
    """Writes ``indptr``, ``indices``, ``weights`` (when present) and ``symmetric``."""
    g = graph.cpu()
    arrays = {"indptr": g.indptr.numpy(), "indices": g.indices.numpy(), "symmetric": np.array(g.symmetric)}
    if g.weights is not None:
        arrays["weights"] = g.weights.numpy()
    np.savez(os.fspath(path), **arrays)


def load_npz(path: PathLike, *, validate: bool = True) -> CSRGraph:
    """Reads a graph written by :func:`save_npz` (or any archive with the same array names).

    A file that is not a readable ``.npz`` archive (truncated, corrupt, pickled objects) raises
    ``ValueError``; arrays of the wrong dtype or shape raise ``TypeError`` / ``ValueError``."""
    p = os.fspath(path)
    try:
        archive = np.load(p, allow_pickle=False)
        if not isinstance(archive, np.lib.npyio.NpzFile):
            raise ValueError("a single .npy array, not an .npz archive")
        with archive as z:
            for name in ("indptr", "indices"):
                if name not in z:
                    raise ValueError(f"missing array {name!r}")
            indptr, indices = z["indptr"], z["indices"]
            weights = z["weights"] if "weights" in z else None
            symmetric = z["symmetric"] if "symmetric" in z else np.array(False)
    except FileNotFoundError:
        raise
    except (zipfile.BadZipFile, zlib.error, EOFError, UnicodeDecodeError, OSError, ValueError) as e:
        raise ValueError(f"{p}: not a readable .npz archive of a graph ({type(e).__name__}: {e})") from None
    if symmetric.shape != () or symmetric.dtype != np.bool_:
        raise ValueError(f"{p}: 'symmetric' must be a boolean scalar, got {symmetric.dtype} of shape {symmetric.shape}")
    for name, arr in (("indptr", indptr), ("indices", indices), ("weights", weights)):
        if arr is not None and arr.dtype.kind not in "iuf":
            raise TypeError(f"{p}: array {name!r} has dtype {arr.dtype}, not a numeric one")
    return CSRGraph.from_csr(indptr, indices, weights, symmetric=bool(symmetric), validate=validate)


def _bar(progress: bool, total: int, desc: str):
    if not progress:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="elem", unit_scale=True)
