"""The device token history on CUDA: pinned uploads, async copies, and CUDA-graph replay.

``test_graph_replay_sees_histories_refreshed_before_replay`` is the test the first upstream
version would have failed: its valid lengths were filled only on the eager path, so a replayed
graph compared nothing. Here a captured verify-token check must count the positions it checked
and must catch a corrupted token after replays that follow request arrivals, decode steps and
row reuse.
"""

import sys

import pytest
import torch
from _history_schedule import FakeReq, SimulatedSchedule, SyncedHistory

from sglang.test.ci.ci_register import register_cuda_ci

register_cuda_ci(est_time=40, suite="kv-canary-gpu")

_DEVICE = "cuda"


def _synced(*, history_tails: bool, rows: int, width: int) -> SyncedHistory:
    from sglang.jit_kernel.kv_canary.append_history import bind_append_history_tokens
    from sglang.jit_kernel.kv_canary.scatter_req_token_ids import (
        launch_scatter_req_token_ids_kernel,
    )

    return SyncedHistory(history_tails=history_tails, rows=rows, width=width, device=_DEVICE,
                         scatter=launch_scatter_req_token_ids_kernel,
                         bind_append=bind_append_history_tokens)


def _prepare(synced: SyncedHistory, reqs: list[FakeReq]):
    lens = [len(req.history()) for req in reqs]
    return synced.rows.prepare(reqs=reqs, prefix_lens=[0] * len(reqs), seq_lens=lens)


@pytest.mark.gpu
def test_uploads_are_pinned() -> None:
    synced = _synced(history_tails=False, rows=3, width=8)
    req = FakeReq("a", [1, 2, 3])
    req.req_pool_idx = 1
    updates = _prepare(synced, [req])
    assert updates.packed.is_pinned()
    synced.upload(updates)
    torch.cuda.synchronize()
    assert synced.tokens[1, :3].tolist() == [1, 2, 3]


@pytest.mark.gpu
@pytest.mark.parametrize("history_tails", [False, True], ids=["device-appends", "host-tails"])
def test_every_running_history_is_on_the_device_over_a_schedule(history_tails: bool) -> None:
    """No sync between forwards: uploads and appends stay asynchronous on the stream."""
    rows, width = 33, 128
    synced = _synced(history_tails=history_tails, rows=rows, width=width)
    schedule = SimulatedSchedule(seed=5, pool_rows=rows, max_prompt_len=60,
                                 max_history_len=width, multi_token_steps=history_tails)
    for step, batch in enumerate(schedule.forwards(200)):
        synced.forward(batch)
        if step % 10 == 9:
            for row in batch:
                known = row.req.history() + ([] if history_tails else list(row.sampled))
                assert synced.lens[row.req.req_pool_idx].item() == len(known), step
                assert synced.tokens[row.req.req_pool_idx, : len(known)].tolist() == known


class _CapturedTokenCheck:
    """A miniature verify-token check captured in a CUDA graph, like the canary's verify.

    Static inputs (the graph's buffers): ``req_pool_indices`` ``[max_bs]`` (0 = padding) and
    ``stored_tokens`` ``[max_bs, positions]`` (what the slots of each row hold). Outputs:
    ``checked`` (positions compared) and ``mismatches``.
    """

    def __init__(self, history: SyncedHistory, *, max_bs: int, positions: int) -> None:
        self.history = history
        self.req_pool_indices = torch.zeros(max_bs, dtype=torch.int64, device=_DEVICE)
        self.stored_tokens = torch.zeros((max_bs, positions), dtype=torch.int32, device=_DEVICE)
        self.valid_lens = torch.zeros(max_bs, dtype=torch.int64, device=_DEVICE)
        self.checked = torch.zeros((), dtype=torch.int64, device=_DEVICE)
        self.mismatches = torch.zeros((), dtype=torch.int64, device=_DEVICE)
        self._position = torch.arange(positions, device=_DEVICE)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self._check()  # warm-up outside capture
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self._check()

    def _check(self) -> None:
        # What the canary kernels do: read the valid length of each batch row's pool row.
        torch.index_select(self.history.lens, 0, self.req_pool_indices, out=self.valid_lens)
        positions = self._position.numel()
        expected = self.history.tokens.index_select(0, self.req_pool_indices)[:, :positions]
        compared = (self._position[None, :] < self.valid_lens[:, None]) & (
            self.req_pool_indices[:, None] != 0
        )
        self.checked.copy_(compared.sum())
        self.mismatches.copy_((compared & (expected != self.stored_tokens)).sum())

    def replay(self, rows: list[tuple[int, list[int]]]) -> tuple[int, int]:
        """Fill the static buffers with ``(pool row, stored tokens)`` per batch row (padding
        after them), replay, and read ``(checked, mismatches)``."""
        self.req_pool_indices.zero_()
        self.stored_tokens.zero_()
        for b, (row, stored) in enumerate(rows):
            self.req_pool_indices[b] = row
            stored = stored[: self.stored_tokens.shape[1]]
            self.stored_tokens[b, : len(stored)] = torch.tensor(stored, dtype=torch.int32)
        self.graph.replay()
        return int(self.checked), int(self.mismatches)


def _admit(rid: str, prompt: list[int], row: int) -> FakeReq:
    req = FakeReq(rid, prompt)
    req.req_pool_idx = row
    return req


def _as_stored(*reqs: FakeReq) -> list[tuple[int, list[int]]]:
    """Slots that hold exactly each request's history."""
    return [(req.req_pool_idx, req.history()) for req in reqs]


@pytest.mark.gpu
def test_graph_replay_sees_histories_refreshed_before_replay() -> None:
    synced = _synced(history_tails=False, rows=8, width=32)
    check = _CapturedTokenCheck(synced, max_bs=4, positions=24)  # captured before any request
    a = _admit("a", [11, 12, 13, 14], row=3)
    b = _admit("b", [21, 22], row=5)

    synced.upload(_prepare(synced, [a, b]))  # outside the graph, before the replay
    assert check.replay(_as_stored(a, b)) == (6, 0)

    for step in range(3):  # decode: each sampled token appended on the device
        tokens = [100 + step, 200 + step]
        synced.history.append_sampled(
            req_pool_indices=torch.tensor([3, 5], device=_DEVICE),
            seq_lens=torch.tensor([len(a.history()), len(b.history())], device=_DEVICE),
            tokens=torch.tensor(tokens, device=_DEVICE),
        )
        a.output_ids.append(tokens[0])
        b.output_ids.append(tokens[1])
        assert _prepare(synced, [a, b]).empty  # nothing from the host
        assert check.replay(_as_stored(a, b)) == (6 + 2 * (step + 1), 0)

    corrupted = a.history()
    corrupted[-1] += 1  # a slot holding a token the request never had
    assert check.replay([(3, corrupted), (5, b.history())]) == (12, 1)

    c = _admit("c", [31, 32, 33], row=5)  # b finished; c reuses its row
    synced.upload(_prepare(synced, [a, c]))
    assert check.replay(_as_stored(a, c)) == (7 + 3, 0)
    assert check.replay([(3, a.history()), (5, b.history())]) == (10, 3)  # b's stale tokens

    padded = [(3, a.history()), (0, [99] * 24)]  # a padding row is never checked
    assert check.replay(padded) == (7, 0)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
