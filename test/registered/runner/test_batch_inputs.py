"""The per-batch carrier: a ForwardBatch gets it with the request ids and the token-history
snapshot under their public names, its SamplingBatchInfo with the ids only; a field the runner
needs is read from it, or a batch without it is refused with an error naming what is missing and
the hook that sets it."""

import sys
from types import SimpleNamespace

import pytest

from sglang.srt.kv_canary.batch.carrier import (
    CanaryBatchInputs,
    attach_batch_inputs,
    attach_sampling_inputs,
    carried_field,
    runner_of_batch,
)
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=1, suite="kv-canary-cpu")


def test_a_carried_field_is_returned() -> None:
    batch = SimpleNamespace()
    reqs = ["a", "b"]
    attach_batch_inputs(batch, CanaryBatchInputs(runner=None, extend_reqs=reqs))
    assert carried_field(batch, "extend_reqs", what="requests") is reqs


def test_the_forward_batch_gets_the_public_views_and_its_sampling_info_the_ids() -> None:
    flat, lens, rids, rooms = object(), object(), object(), object()
    updates = SimpleNamespace(history_tokens_and_lens=lambda: (flat, lens))
    inputs = CanaryBatchInputs(runner=None, rids_int=rids, bootstrap_room_ids_int=rooms,
                               row_updates=updates)
    forward_batch, sampling_info = SimpleNamespace(), SimpleNamespace()
    attach_batch_inputs(forward_batch, inputs)
    attach_sampling_inputs(sampling_info, inputs)
    assert vars(forward_batch) == {
        "kv_canary": inputs, "rids_int": rids, "bootstrap_room_ids_int": rooms,
        "req_all_ids_flat": flat, "req_all_ids_lens": lens,
    }
    assert vars(sampling_info) == {
        "kv_canary": inputs, "rids_int": rids, "bootstrap_room_ids_int": rooms,
    }


@pytest.mark.parametrize("carrier", [False, True])
def test_a_missing_carrier_or_field_names_what_and_the_hook(carrier: bool) -> None:
    batch = SimpleNamespace()
    if carrier:  # a carrier without the field
        attach_batch_inputs(batch, CanaryBatchInputs(runner=None))
    with pytest.raises(RuntimeError) as error:
        carried_field(batch, "row_updates", what="request-row updates",
                      consequence=" (the token history would be stale)")
    assert str(error.value) == (
        "KV canary: this SimpleNamespace carries no request-row updates; the "
        "ForwardBatch.init_new hook did not run for it (the token history would be stale)"
    )


def test_the_runner_of_a_batch_comes_from_its_carrier_or_the_same_error() -> None:
    batch, runner = SimpleNamespace(), object()
    attach_batch_inputs(batch, CanaryBatchInputs(runner=runner))
    assert runner_of_batch(batch) is runner
    with pytest.raises(RuntimeError) as error:
        runner_of_batch(SimpleNamespace())
    assert str(error.value) == (
        "KV canary: this SimpleNamespace carries no 'kv_canary' inputs; the "
        "ForwardBatch.init_new hook did not run for it (batches built another way, e.g. "
        "two-batch-overlap children, do not have them)"
    )


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
