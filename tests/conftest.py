"""Shared test helpers: tests run against the installed package `fleetrl`."""

import os
import sys

import pytest
import torch

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(autouse=True)
def _small_torch():
    torch.set_num_threads(1)
    yield


@pytest.fixture
def python() -> str:
    return sys.executable
