"""Shared pytest set-up for the registered tests.

Tests that need CUDA carry ``@pytest.mark.gpu``; they are skipped cleanly, with a reason, where
torch sees no CUDA device.
"""

from __future__ import annotations

import functools

import pytest


@functools.cache
def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _cuda_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU (marker 'gpu'); none is visible here")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


# Shared end-to-end fixtures (real `python -m sglang.launch_server` on a tiny dummy-weight model).
from e2e_fixtures import (  # noqa: E402,F401 - fixtures and their report hook
    canary_server,
    expect_launch_failure,
    keep_log,
    pytest_runtest_makereport,
    shared_servers,
    tiny_deepseek_dir,
    tiny_eagle_draft_dir,
    tiny_gpt_oss_dir,
    tiny_model_dir,
)
