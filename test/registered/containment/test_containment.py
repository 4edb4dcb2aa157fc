"""Abort mode on the CPU: SGLang's own RadixCache healed by the quarantine (unlocked nodes freed
at once, locked ones unmatchable until their requests finish, sizes consistent), the controller
aborting exactly the requests its rows name (and those whose cached prefix runs through an
evicted node), the client-visible finish reason, the config knob, the hooks and the records."""

import sys
from http import HTTPStatus

import pytest
import torch

from sglang.jit_kernel.kv_canary.consts import CheckKind, Reason
from sglang.srt.kv_canary.config import CanaryConfigError, CanaryMode, parse_config
from sglang.srt.kv_canary.containment.controller import Containment
from sglang.srt.kv_canary.containment.inbox import ContainmentInbox
from sglang.srt.kv_canary.containment.quarantine import RadixQuarantine, supports_quarantine
from sglang.srt.kv_canary.monitor.containment_records import AbortCause
from sglang.srt.kv_canary.containment.requests import KV_CANARY_ERROR_TYPE
from sglang.srt.kv_canary.hook_targets import select_hook_specs
from sglang.srt.kv_canary.hooks.containment import stash_chunked_request
from sglang.srt.kv_canary.monitor.forward_history import ForwardHistory
from sglang.srt.kv_canary.monitor.violations import ViolationRow
from sglang.srt.managers.schedule_batch import FINISH_ABORT
from sglang.srt.mem_cache.base_prefix_cache import InsertParams, MatchPrefixParams
from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="kv-canary-cpu")


class _Allocator:
    device = "cpu"

    def __init__(self) -> None:
        self.freed: list[int] = []

    def free(self, indices: torch.Tensor) -> None:
        self.freed += indices.tolist()


class _Req:
    """The fields of SGLang's Req that abort mode reads and writes."""

    def __init__(self, rid: str, *, last_node=None, output_ids=(5, 6)) -> None:
        self.rid = rid
        self.last_node = last_node
        self.output_ids = list(output_ids)
        self.to_finish = None
        self.finished_reason = None
        self.finished_len = None
        self.skip_radix_cache_insert = False

    def finished(self) -> bool:
        return self.finished_reason is not None


def _tree(page_size: int = 1) -> tuple[RadixCache, _Allocator]:
    allocator = _Allocator()
    return RadixCache.create_simulated(mock_allocator=allocator, page_size=page_size), allocator


def _insert(tree: RadixCache, tokens: list[int], slots: list[int]) -> None:
    tree.insert(InsertParams(key=RadixKey(token_ids=tokens, extra_key=None),
                             value=torch.tensor(slots, dtype=torch.int64)))


def _match(tree: RadixCache, tokens: list[int]):
    return tree.match_prefix(MatchPrefixParams(key=RadixKey(token_ids=tokens, extra_key=None)))


def _sizes_consistent(tree: RadixCache) -> None:
    assert tree.evictable_size() + tree.protected_size() == tree.total_size()


def _row(*, reasons: Reason, slot: int, position: int, step: int = 3, row: int = 1,
         check: CheckKind = CheckKind.POST_VERIFY) -> ViolationRow:
    return ViolationRow(check=check, reasons=int(reasons), req_pool_idx=row, slot=slot,
                        position=position, stored_token=1, expected_token=-1, stored_chain=0,
                        expected_chain=0, input_position=None, expected_position=None, step=step)


def test_plain_radix_cache_is_supported() -> None:
    assert supports_quarantine(_tree()[0])


def test_an_unlocked_node_holding_a_slot_is_cut_at_its_position_and_freed() -> None:
    tree, allocator = _tree()
    _insert(tree, [1, 2, 3, 4, 5, 6], [10, 11, 12, 13, 14, 15])
    _insert(tree, [1, 2, 3, 7, 8], [10, 11, 12, 20, 21])
    quarantine = RadixQuarantine(tree_cache=tree)
    detached = quarantine.detach(quarantine.cut(quarantine.targets_for_slots({14})))
    assert (detached.nodes, detached.tokens, detached.locked_nodes) == (1, 2, 0)
    assert sorted(allocator.freed) == [14, 15]
    assert _match(tree, [1, 2, 3, 4, 5, 6]).device_indices.tolist() == [10, 11, 12, 13]
    assert _match(tree, [1, 2, 3, 7, 8]).device_indices.tolist() == [10, 11, 12, 20, 21]
    _sizes_consistent(tree)
    assert quarantine.pending_nodes == 0


def test_a_cut_is_page_aligned_and_takes_the_subtree() -> None:
    tree, allocator = _tree(page_size=2)
    _insert(tree, [1, 2, 3, 4, 5, 6], [10, 11, 12, 13, 14, 15])
    _insert(tree, [1, 2, 3, 4, 5, 6, 7, 8], [10, 11, 12, 13, 14, 15, 16, 17])
    quarantine = RadixQuarantine(tree_cache=tree)
    detached = quarantine.detach(quarantine.cut(quarantine.targets_for_slots({13})))
    assert detached.tokens == 6  # positions 2.. of both keys: the page of slot 13 on
    assert sorted(allocator.freed) == [12, 13, 14, 15, 16, 17]
    assert _match(tree, [1, 2, 3, 4, 5, 6, 7, 8]).device_indices.tolist() == [10, 11]
    _sizes_consistent(tree)


def test_a_locked_node_is_unmatchable_at_once_and_freed_when_its_request_finishes() -> None:
    tree, allocator = _tree()
    _insert(tree, [1, 2, 3, 4], [10, 11, 12, 13])
    holder = _match(tree, [1, 2, 3, 4]).last_device_node
    tree.inc_lock_ref(holder)
    quarantine = RadixQuarantine(tree_cache=tree)
    detached = quarantine.detach(quarantine.cut(quarantine.targets_for_slots({12})))
    assert (detached.nodes, detached.locked_nodes) == (1, 1)
    assert allocator.freed == []  # still read by its (aborted) request
    assert _match(tree, [1, 2, 3, 4]).device_indices.tolist() == [10, 11]
    assert quarantine.holds(last_node=holder, tops=[])
    _sizes_consistent(tree)
    # a new request with the same prefix recomputes and inserts fresh slots beside it
    _insert(tree, [1, 2, 3, 4], [10, 11, 30, 31])
    assert _match(tree, [1, 2, 3, 4]).device_indices.tolist() == [10, 11, 30, 31]
    tree.dec_lock_ref(holder)  # the aborted request finishes
    _sizes_consistent(tree)
    assert allocator.freed == []
    quarantine.release()
    assert sorted(allocator.freed) == [12, 13] and quarantine.pending_nodes == 0
    _sizes_consistent(tree)


def test_a_request_path_is_cut_from_the_reported_position() -> None:
    tree, _ = _tree()
    _insert(tree, [1, 2, 3, 4, 5], [10, 11, 12, 13, 14])
    last = _match(tree, [1, 2, 3, 4, 5]).last_device_node
    quarantine = RadixQuarantine(tree_cache=tree)
    assert quarantine.target_for_position(last_node=last, position=7) is None  # not cached
    target = quarantine.target_for_position(last_node=last, position=3)
    quarantine.detach(quarantine.cut([target]))
    assert _match(tree, [1, 2, 3, 4, 5]).device_indices.tolist() == [10, 11, 12]


def _containment(tree: RadixCache | None) -> tuple[Containment, ContainmentInbox, list]:
    inbox = ContainmentInbox()
    history = ForwardHistory()
    history.record_forward(step=3, mode=ForwardMode.EXTEND, batch_size=3,
                           owners=[(1, "bad"), (2, "good"), (4, "sharer")])
    recorded: list = []

    class _Sink:
        def record_containment(self, *, aborts, evictions) -> None:
            recorded.append((list(aborts), list(evictions)))

    containment = Containment(
        inbox=inbox, history=history, poll=lambda: True,
        quarantine=None if tree is None else RadixQuarantine(tree_cache=tree), sinks=[_Sink()],
    )
    return containment, inbox, recorded


def _report(inbox: ContainmentInbox, rows, dropped: int = 0) -> None:
    inbox.record(rows=rows, repeats=[False] * len(rows), dropped=dropped, dropped_total=dropped,
                 first_index=0, end_index=len(rows) + dropped)


def test_only_the_named_request_is_aborted_with_a_500_and_its_token_withheld() -> None:
    containment, inbox, recorded = _containment(None)
    bad, good = _Req("bad"), _Req("good")
    _report(inbox, [_row(reasons=Reason.VERIFY_POSITION, slot=40, position=2)])
    aborts, evictions = containment.contain(live=[bad, good])
    assert [record.rid for record in aborts] == ["bad"] and evictions == []
    assert good.to_finish is None and not good.skip_radix_cache_insert
    reason = bad.to_finish
    assert isinstance(reason, FINISH_ABORT)
    payload = reason.to_json()
    assert payload["type"] == "abort" and payload["err_type"] == KV_CANARY_ERROR_TYPE
    assert payload["status_code"] == HTTPStatus.INTERNAL_SERVER_ERROR
    assert "KV canary" in payload["message"] and "verify_position" in payload["message"]
    assert bad.finished_len == 2 and bad.skip_radix_cache_insert  # this result's token withheld
    assert aborts[0].tokens_delivered == 2 and aborts[0].cause is AbortCause.VIOLATION
    assert recorded and containment.requests_aborted == 1
    assert containment.contain(live=[bad, good]) == ([], [])  # nothing new


def test_a_request_aborted_mid_chunked_prefill_keeps_its_chunk_without_inserting_it() -> None:
    """SGLang stashes a chunked request with ``cache_unfinished_req`` (insert, then move
    ``prefix_indices`` past the chunk); the aborted request skips the insert but must still move
    on, or its next chunk recomputes the chunk into new slots and leaks the old ones."""
    containment, inbox, _ = _containment(None)
    req = _Req("bad")  # the row names request row 1, "bad" at step 3
    req.req_pool_idx, req.fill_ids = 1, list(range(6))
    req.prefix_indices = torch.tensor([11, 12], dtype=torch.int64)
    req_to_token = torch.zeros((2, 8), dtype=torch.int32)
    req_to_token[1, :6] = torch.tensor([11, 12, 13, 14, 15, 16], dtype=torch.int32)
    scheduler = type("Scheduler", (), {})()
    scheduler.req_to_token_pool = type("Pool", (), {"req_to_token": req_to_token})()
    stashed = []

    def original(scheduler_arg, req_arg):
        stashed.append(req_arg.rid)

    stash_chunked_request(original, scheduler, _Req("other"))
    assert stashed == ["other"]  # any other request: SGLang's own stash
    _report(inbox, [_row(reasons=Reason.VERIFY_POSITION, slot=40, position=2)])
    containment.contain(live=[req])
    stash_chunked_request(original, scheduler, req)
    assert stashed == ["other"] and req.skip_radix_cache_insert
    assert req.prefix_indices.tolist() == [11, 12, 13, 14, 15, 16]
    assert req.prefix_indices.dtype == torch.int64


def test_content_rows_evict_the_slot_and_abort_every_request_reading_it() -> None:
    tree, allocator = _tree()
    _insert(tree, [1, 2, 3, 4], [10, 11, 12, 13])
    _insert(tree, [9, 9], [50, 51])
    shared = _match(tree, [1, 2, 3, 4]).last_device_node
    other = _match(tree, [9, 9]).last_device_node
    for node in (shared, shared, other):
        tree.inc_lock_ref(node)
    containment, inbox, recorded = _containment(tree)
    bad, sharer, good = (_Req("bad", last_node=shared), _Req("sharer", last_node=shared),
                         _Req("good", last_node=other))
    _report(inbox, [_row(reasons=Reason.VERIFY_REAL_KV, slot=12, position=2)])
    aborts, evictions = containment.contain(live=[bad, sharer, good])
    assert {(r.rid, r.cause) for r in aborts} == {("bad", AbortCause.VIOLATION),
                                                  ("sharer", AbortCause.CACHE)}
    assert good.to_finish is None
    assert evictions[0].nodes == 1 and evictions[0].slots == (12,)
    assert evictions[0].rids == ("bad",)
    assert _match(tree, [1, 2, 3, 4]).device_indices.tolist() == [10, 11]
    tree.dec_lock_ref(shared)
    containment.release()
    assert allocator.freed == []  # the sharer still holds it
    tree.dec_lock_ref(shared)
    containment.release()
    assert sorted(allocator.freed) == [12, 13]
    _sizes_consistent(tree)


def test_dropped_rows_abort_every_live_request_and_evict_the_tree() -> None:
    tree, _ = _tree()
    _insert(tree, [1, 2], [10, 11])
    containment, inbox, _ = _containment(tree)
    reqs = [_Req("a"), _Req("b")]
    _report(inbox, [], dropped=3)
    aborts, evictions = containment.contain(live=reqs)
    assert {r.cause for r in aborts} == {AbortCause.RING_OVERFLOW} and len(aborts) == 2
    assert evictions[0].nodes == 1 and len(_match(tree, [1, 2]).device_indices) == 0


def test_sweep_rows_heal_without_aborting() -> None:
    tree, allocator = _tree()
    _insert(tree, [1, 2], [10, 11])
    containment, inbox, _ = _containment(tree)
    running = _Req("good")
    _report(inbox, [_row(reasons=Reason.VERIFY_REAL_KV, slot=11, position=1, row=0,
                         check=CheckKind.SWEEP)])
    aborts, evictions = containment.contain(live=[running])
    assert aborts == [] and evictions[0].nodes == 1 and allocator.freed == [11]


# ----------------------------------------------------------------------------- configuration


@pytest.mark.parametrize("environ,argv", [
    ({"SGLANG_KV_CANARY_ON_VIOLATION": "abort"}, []),
    ({"SGLANG_KV_CANARY_MODE": "ABORT"}, []),
    ({"SGLANG_KV_CANARY_ON_VIOLATION": "abort", "SGLANG_KV_CANARY_MODE": "abort"}, []),
    ({}, ["--kv-canary-on-violation", "abort"]),
    ({"SGLANG_KV_CANARY_MODE": "abort"}, ["--kv-canary-on-violation=abort"]),
])
def test_abort_mode_is_named_by_either_variable_or_the_flag(environ, argv) -> None:
    config = parse_config(environ, argv=argv)
    assert config.mode is CanaryMode.ABORT and config.canary_enabled
    assert "mode=abort" in config.describe()


def test_on_violation_log_and_raise_turn_the_canary_on() -> None:
    assert parse_config({"SGLANG_KV_CANARY_ON_VIOLATION": "log"}).mode is CanaryMode.LOG
    assert parse_config({"SGLANG_KV_CANARY_ON_VIOLATION": "Raise"}).mode is CanaryMode.RAISE


@pytest.mark.parametrize("environ,needles", [
    ({"SGLANG_KV_CANARY_ON_VIOLATION": "none"},
     ("SGLANG_KV_CANARY_ON_VIOLATION='none'", "log, abort, raise")),
    ({"SGLANG_KV_CANARY_ON_VIOLATION": "kill"}, ("'kill'", "log, abort, raise")),
    ({"SGLANG_KV_CANARY_ON_VIOLATION": "abort", "SGLANG_KV_CANARY_MODE": "log"},
     ("SGLANG_KV_CANARY_ON_VIOLATION='abort'", "SGLANG_KV_CANARY_MODE='log'", "disagree")),
    ({"SGLANG_KV_CANARY_ON_VIOLATION": "abort", "SGLANG_KV_CANARY_MODE": "none"},
     ("disagree",)),
])
def test_bad_on_violation_settings_name_variable_value_and_allowed(environ, needles) -> None:
    with pytest.raises(CanaryConfigError) as info:
        parse_config(environ)
    for needle in needles:
        assert needle in str(info.value)


def test_abort_hooks_are_registered_in_abort_mode_only() -> None:
    def adapters(environ):
        return {spec.adapter for spec in select_hook_specs(parse_config(environ))}

    abort_only = {a for a in adapters({"SGLANG_KV_CANARY_ON_VIOLATION": "abort"})
                  if ".containment:" in a}
    assert abort_only == {f"sglang.srt.kv_canary.hooks.containment:{name}" for name in (
        "attach_containment", "before_batch_result", "after_batch_result", "before_idle",
        "stash_chunked_request")}
    for mode in ("log", "raise"):
        assert not any(".containment:" in a for a in adapters({"SGLANG_KV_CANARY_MODE": mode}))


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
