"""Checks that the compiled extension matches the installed torch, then loads it."""

from __future__ import annotations

import importlib

import torch

REINSTALL = (
    "Rebuild pytorch_zerocopy against the installed torch:\n"
    "    pip uninstall -y pytorch_zerocopy && pip install --no-build-isolation --force-reinstall "
    "--no-deps <path to pytorch_zerocopy>"
)


def build_info() -> dict:
    try:
        from ._build_info import BUILD_INFO
    except ImportError as e:  # an uninstalled source tree
        raise ImportError(
            "pytorch_zerocopy is not built: its compiled extension is missing.\n"
            "Install it with: pip install --no-build-isolation -e <path to pytorch_zerocopy>"
        ) from e
    return dict(BUILD_INFO)


def _release(version: str) -> str:
    return version.split("+")[0]


def check_build(info: dict) -> None:
    """Raises ImportError, saying how to reinstall, when the build does not fit this torch."""
    built, running = info["torch_version"], torch.__version__
    if _release(built) != _release(running):
        raise ImportError(
            f"pytorch_zerocopy was built against torch {built}, but torch {running} is installed; "
            f"the compiled extension is not compatible across torch versions.\n{REINSTALL}"
        )
    if info["with_cuda"]:
        if torch.version.cuda is None:
            raise ImportError(
                f"pytorch_zerocopy was built with CUDA {info['cuda_version']}, but the installed "
                f"torch {running} is a CPU-only build.\n{REINSTALL}"
            )
        built_major = str(info["cuda_version"]).split(".")[0]
        running_major = str(torch.version.cuda).split(".")[0]
        if built_major != running_major:
            raise ImportError(
                f"pytorch_zerocopy was built with CUDA {info['cuda_version']}, but torch uses CUDA "
                f"{torch.version.cuda}.\n{REINSTALL}"
            )


def load_extension():
    info = build_info()
    check_build(info)
    return importlib.import_module("pytorch_zerocopy._C")
