"""Shared fixtures. CUDA is queried when tests are collected, never when a module is imported,
and CUDA cases are skipped cleanly on a machine without a GPU."""

import pytest
import torch

from skip_summary import pytest_terminal_summary  # noqa: F401  (a count of skip reasons)


def cuda_available() -> bool:
    return torch.cuda.is_available()


def pytest_generate_tests(metafunc):
    # A test that takes `device` runs on the CPU and, where a GPU exists, on CUDA.
    if "device" in metafunc.fixturenames:
        params = [pytest.param("cpu", id="cpu"),
                  pytest.param("cuda", id="cuda", marks=pytest.mark.cuda)]
        metafunc.parametrize("device", params)


def pytest_collection_modifyitems(config, items):
    if cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def gen():
    """A fresh, randomly seeded CPU generator per test; gen.initial_seed() reproduces a failure."""
    g = torch.Generator()
    g.seed()
    return g
