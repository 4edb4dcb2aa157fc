"""The forward history behind the report file's ``rid``, ``forward_mode`` and ``batch_size``:
steps in a bounded ring, each request row's owner changes as intervals, unknown as None."""

import sys

import pytest

from sglang.srt.kv_canary.monitor.forward_history import (
    HISTORY_STEPS,
    ForwardContext,
    ForwardHistory,
)
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=2, suite="kv-canary-cpu")


def test_a_row_keeps_its_owner_through_decode_steps_until_another_is_admitted() -> None:
    history = ForwardHistory()
    assert history.latest_step is None
    history.record_forward(step=0, mode=ForwardMode.EXTEND, batch_size=2,
                           owners=[(1, "a"), (2, "b")])
    history.record_forward(step=1, mode=ForwardMode.DECODE, batch_size=2, owners=None)
    history.record_forward(step=2, mode=ForwardMode.MIXED, batch_size=3,
                           owners=[(1, "c"), (2, "b"), (5, "d")])
    history.record_forward(step=3, mode=ForwardMode.DECODE, batch_size=3, owners=None)
    assert history.latest_step == 3
    assert history.context(step=1, req_pool_idx=1) == ForwardContext(
        rid="a", forward_mode="DECODE", batch_size=2)
    assert history.context(step=2, req_pool_idx=1) == ForwardContext(
        rid="c", forward_mode="MIXED", batch_size=3)
    assert history.context(step=3, req_pool_idx=2).rid == "b"
    assert history.context(step=1, req_pool_idx=5).rid is None  # admitted later
    assert history.context(step=3, req_pool_idx=0).rid is None  # padding row: never owned


def test_steps_older_than_the_ring_or_never_run_are_unknown() -> None:
    history = ForwardHistory(steps=4)
    history.record_forward(step=0, mode=ForwardMode.EXTEND, batch_size=1, owners=[(1, "a")])
    for step in range(1, 6):
        history.record_forward(step=step, mode=ForwardMode.DECODE, batch_size=1, owners=None)
    old = history.context(step=0, req_pool_idx=1)
    assert (old.forward_mode, old.batch_size, old.rid) == (None, None, "a")  # owner still known
    assert history.context(step=2, req_pool_idx=1).forward_mode == "DECODE"
    assert history.context(step=9, req_pool_idx=1).forward_mode is None  # not run yet
    assert history.context(step=-1, req_pool_idx=1) == ForwardContext(
        rid=None, forward_mode=None, batch_size=None)


def test_a_row_reowned_more_often_than_kept_is_unknown_before_its_oldest_kept_owner() -> None:
    history = ForwardHistory(owners_per_row=2)
    for step, rid in enumerate(["a", "b", "c"]):
        history.record_forward(step=step, mode=ForwardMode.EXTEND, batch_size=1,
                               owners=[(7, rid)])
    assert [history.context(step=s, req_pool_idx=7).rid for s in range(3)] == [None, "b", "c"]


def test_the_same_owner_again_is_not_a_change() -> None:
    history = ForwardHistory(owners_per_row=1)
    history.record_forward(step=0, mode=ForwardMode.EXTEND, batch_size=1, owners=[(3, "a")])
    history.record_forward(step=1, mode=ForwardMode.EXTEND, batch_size=1, owners=[(3, "a")])
    assert history.context(step=0, req_pool_idx=3).rid == "a"  # the first interval is kept


def test_the_default_history_covers_the_reporting_delay() -> None:
    from sglang.srt.kv_canary.monitor.counter_mailbox import MAX_LABELS
    from sglang.srt.kv_canary.monitor.health import MAX_SNAPSHOT_LAG_STEPS

    assert HISTORY_STEPS >= max(MAX_LABELS, MAX_SNAPSHOT_LAG_STEPS)


def test_sizes_must_be_positive() -> None:
    with pytest.raises(ValueError):
        ForwardHistory(steps=0)
    with pytest.raises(ValueError):
        ForwardHistory(owners_per_row=0)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
