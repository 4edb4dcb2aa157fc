"""Padded rows of a replayed graph point at request row 0; a replay without padding launches
nothing (this runs before every decode replay)."""

import sys
from types import SimpleNamespace

import pytest
import torch

from sglang.srt.kv_canary.runner.graph_padding import point_padded_rows_at_row_zero
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=1, suite="kv-canary-cpu")


class _WatchedIndices:
    """Records the slices taken of it (a padded replay zeroes one)."""

    def __init__(self, values: list[int]) -> None:
        self.tensor = torch.tensor(values)
        self.slices: list[slice] = []

    def __getitem__(self, index: slice) -> torch.Tensor:
        self.slices.append(index)
        return self.tensor[index]


def test_padded_rows_are_zeroed_and_live_rows_kept() -> None:
    indices = _WatchedIndices([4, 7, 9, 3])
    point_padded_rows_at_row_zero(buffers=SimpleNamespace(req_pool_indices=indices),
                                  raw_bs=2, bs=4)
    assert indices.tensor.tolist() == [4, 7, 0, 0]


@pytest.mark.parametrize("bs", [1, 4])
def test_a_replay_without_padded_rows_touches_nothing(bs: int) -> None:
    indices = _WatchedIndices([4, 7, 9, 3])
    point_padded_rows_at_row_zero(buffers=SimpleNamespace(req_pool_indices=indices),
                                  raw_bs=bs, bs=bs)
    assert indices.slices == [] and indices.tensor.tolist() == [4, 7, 9, 3]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
