"""End-to-end on a GPU: the canary core inside a real ``python -m sglang.launch_server`` on the
tiny dummy-weight model (fixtures from ``e2e_fixtures.py``: ``canary_server(env=, args=)``, and
``shared_servers``: the canary-on server of 1 and 4 is one server, 4 running first).

1. A clean mixed workload of 200+ requests (prompt lengths at page and chunk boundaries +-1,
   shared prefixes requested A -> B -> A, chunked prefill, padded CUDA-graph batch sizes, radix
   eviction under a small ``--max-total-tokens``, requests aborted mid-decode), once with CUDA
   graphs and ``--page-size 16``, once without graphs with mixed chunks: zero violations, health
   checks passing, protected tokens > 0.
2. ``req_to_token`` perturbation: every fault is reported with ``verify_position`` (chain/position
   reasons only); ``log`` mode keeps serving, ``raise`` mode stops the scheduler with the lines.
3. ``real_kv_used`` perturbation: ``verify_real_kv_hash`` with ``REAL_DATA=partial``, silent with
   ``none``; with ``REAL_DATA_STRIDE=4`` caught exactly at the positions due in the fault's step.
4. Canary on and off generate identical tokens.
5. Piecewise CUDA graph (SGLang 0.5.12's default) is refused at start-up, naming the flag.
"""

import random
import sys
import threading
import time

import pytest

from _workloads import (
    PERTURB,
    assert_clean_canary_log,
    assert_every_fault_caught,
    concurrent_traffic,
    faults_and_rows,
    every_fault_reported,
    log_when,
    polled_log,
    request,
    tokens,
)

from sglang.jit_kernel.kv_canary.consts import CheckKind, Reason
from sglang.test.ci.ci_register import register_cuda_ci

register_cuda_ci(est_time=900, suite="kv-canary-gpu")

_PAGE = 16
_CHUNK = 256
_GRAPH_ARGS = ("--page-size", str(_PAGE), "--chunked-prefill-size", str(_CHUNK),
               "--max-total-tokens", "6144")
_NO_GRAPH_ARGS = ("--disable-cuda-graph", "--chunked-prefill-size", "128",
                  "--enable-mixed-chunk", "--max-total-tokens", "6144")
_CANARY = {
    "SGLANG_KV_CANARY_MODE": "raise",
    "SGLANG_KV_CANARY_REAL_DATA": "partial",
    "SGLANG_KV_CANARY_STATS_PRINT_EVERY_N_STEPS": "25",
    "SGLANG_KV_CANARY_HEALTH_CHECK_EVERY_N_STEPS": "25",
}
# A redirected prefix entry: its slot's record describes another position and history; at the
# row's last prefix position the ownership check sees it too.
_POSITION_CHAIN_OR_OWNER = int(Reason.VERIFY_POSITION | Reason.VERIFY_CHAIN | Reason.VERIFY_OWNER)
_tokens = tokens
_request = request


def _boundary_lengths(*, page: int, chunk: int) -> list[int]:
    lengths = {k * page + d for k in (1, 2, 3) for d in (-1, 0, 1)}
    lengths |= {k * chunk + d for k in (1, 2) for d in (-1, 0, 1)}
    return sorted(n for n in lengths if n >= 1)


def _run_mixed_workload(server, *, page: int, chunk: int, seed: int = 0) -> int:
    """Send the clean mixed workload; return how many requests were sent."""
    rng = random.Random(seed)
    sent = 0
    # prompt lengths at page and chunk boundaries +-1, concurrently (padded decode batches)
    boundary = [_request(f"boundary-{i}", _tokens(rng, n), rng.randrange(4, 24))
                for i, n in enumerate(_boundary_lengths(page=page, chunk=chunk))]
    outputs = server.generate_many(boundary, concurrency=16)
    sent += len(boundary)
    # shared prefixes requested A -> B -> A, sequentially so the radix cache serves the reuse
    for group in range(12):
        shared = _tokens(rng, rng.choice([max(1, page - 1), page, 3 * page + 5, chunk + 1]))
        a = shared + _tokens(rng, rng.randrange(1, 2 * page))
        b = shared + _tokens(rng, rng.randrange(1, 2 * page))
        for name, prompt in (("a", a), ("b", b), ("a2", a)):
            outputs.append(server.generate(_request(f"aba-{group}-{name}", prompt, 8)))
            sent += 1
    # explicit odd batch sizes: CUDA-graph replays padded to the next captured size
    for size in (3, 5, 7, 13):
        batch = server.generate({
            "input_ids": [_tokens(rng, rng.randrange(10, 80)) for _ in range(size)],
            "sampling_params": {"max_new_tokens": 12, "temperature": 0.0, "ignore_eos": True},
        })
        outputs.extend(batch)
        sent += size
    # aborted mid-decode (1200 new tokens take a few seconds; the abort comes after 0.5 s)
    aborted = [f"abort-{i}" for i in range(4)]
    threads = [threading.Thread(target=_ignore_errors, args=(
        server.generate, _request(rid, _tokens(rng, rng.randrange(20, 100)), 1200)))
        for rid in aborted]
    for thread in threads:
        thread.start()
    time.sleep(0.5)
    for rid in aborted:
        server.abort(rid)
    for thread in threads:
        thread.join(timeout=120)
    sent += len(aborted)
    # bulk traffic: long and short prompts, eviction under the small KV pool
    bulk = [_request(f"bulk-{i}", _tokens(rng, rng.choice([5, 40, chunk - 1, 2 * chunk + 7, 600])),
                     rng.randrange(2, 40)) for i in range(150)]
    outputs += server.generate_many(bulk, concurrency=24)
    sent += len(bulk)
    for output in outputs:
        assert output["meta_info"]["finish_reason"]["type"] == "length", output["meta_info"]
    return sent


def _ignore_errors(call, payload) -> None:
    try:
        call(payload)
    except Exception:  # noqa: BLE001 - aborted requests may end with an error status
        pass


def _sequential_tokens(server, *, seed: int) -> list:
    rng = random.Random(seed)
    prompts = [_tokens(rng, n) for n in (1, 15, 16, 17, 100, 255, 256, 257, 600)]
    outputs = [server.generate(_request(f"same-{i}", p, 24)) for i, p in enumerate(prompts)]
    return [o.get("output_ids", o["text"]) for o in outputs]


@pytest.mark.gpu
def test_canary_on_and_off_generate_identical_tokens(canary_server, shared_servers) -> None:
    """The canary-on side runs on the graph server the clean mixed workload shares (this test
    first, on the fresh server; the prompts share no prefix with that workload's)."""
    on = shared_servers.get(env=_CANARY, args=_GRAPH_ARGS)
    with_canary = _sequential_tokens(on, seed=11)
    off = canary_server(args=_GRAPH_ARGS)
    assert _sequential_tokens(off, seed=11) == with_canary


@pytest.mark.gpu
def test_clean_mixed_workload_with_cuda_graphs_has_no_violation(shared_servers) -> None:
    server = shared_servers.get(env=_CANARY, args=_GRAPH_ARGS)
    assert _run_mixed_workload(server, page=_PAGE, chunk=_CHUNK) >= 200
    assert server.returncode is None
    _assert_clean_canary_log(polled_log(server))


@pytest.mark.gpu
def test_clean_mixed_workload_without_cuda_graphs_has_no_violation(canary_server) -> None:
    server = canary_server(env=_CANARY, args=_NO_GRAPH_ARGS)
    assert _run_mixed_workload(server, page=1, chunk=128, seed=3) >= 200
    assert server.returncode is None
    _assert_clean_canary_log(polled_log(server))


@pytest.mark.gpu
def test_clean_mixed_workload_without_overlap_scheduling_has_no_violation(canary_server) -> None:
    """Without overlap scheduling SGLang runs the forwards on the default CUDA stream: the
    canary's counter copies and upload buffers follow their events there too."""
    server = canary_server(env=_CANARY, args=(*_GRAPH_ARGS, "--disable-overlap-schedule"))
    assert _run_mixed_workload(server, page=_PAGE, chunk=_CHUNK, seed=5) >= 200
    assert server.returncode is None
    _assert_clean_canary_log(polled_log(server))


_perturbation_traffic = concurrent_traffic
_faults_and_rows = faults_and_rows
_assert_clean_canary_log = assert_clean_canary_log


@pytest.mark.gpu
def test_req_to_token_fault_is_logged_and_serving_goes_on(canary_server) -> None:
    env = {**_CANARY, **PERTURB, "SGLANG_KV_CANARY_MODE": "log",
           "SGLANG_KV_CANARY_PERTURB_REQ_TO_TOKEN_PROB": "0.2"}
    server = canary_server(env=env, args=_GRAPH_ARGS)
    _perturbation_traffic(server, rounds=6)
    outputs = server.generate_many([_request(f"after-{i}", _tokens(random.Random(i), 50), 16)
                                    for i in range(4)], concurrency=4)
    assert all(o["meta_info"]["completion_tokens"] == 16 for o in outputs)
    assert server.returncode is None
    faults, rows = _faults_and_rows(log_when(server, every_fault_reported))
    assert_every_fault_caught(faults, rows, reason=Reason.VERIFY_POSITION,
                              allowed=_POSITION_CHAIN_OR_OWNER)


@pytest.mark.gpu
def test_req_to_token_fault_stops_the_scheduler_in_raise_mode(canary_server) -> None:
    env = {**_CANARY, **PERTURB, "SGLANG_KV_CANARY_PERTURB_REQ_TO_TOKEN_PROB": "0.5"}
    server = canary_server(env=env, args=_GRAPH_ARGS)
    try:
        _perturbation_traffic(server, rounds=6)
    except Exception:  # noqa: BLE001 - requests fail once the scheduler is gone
        pass
    assert server.wait_exit(180) != 0
    log = server.log_text()
    assert "CanaryViolationError" in log
    faults, rows = _faults_and_rows(log)
    assert rows, log[-4000:]
    first = int(faults[0]["step"])
    assert any(r.step == first and r.reasons & int(Reason.VERIFY_POSITION) for r in rows)
    assert all(r.reasons & ~_POSITION_CHAIN_OR_OWNER == 0 for r in rows)


@pytest.mark.gpu
def test_real_kv_used_fault_is_caught_by_the_real_data_check(canary_server) -> None:
    env = {**_CANARY, **PERTURB, "SGLANG_KV_CANARY_MODE": "log",
           "SGLANG_KV_CANARY_PERTURB_REAL_KV_USED_PROB": "0.2"}
    server = canary_server(env=env, args=_GRAPH_ARGS)
    _perturbation_traffic(server, rounds=6)
    server.generate(_request("last", _tokens(random.Random(1), 30), 8))
    faults, rows = _faults_and_rows(log_when(server, every_fault_reported))
    assert_every_fault_caught(faults, rows, reason=Reason.VERIFY_REAL_KV,
                              allowed=int(Reason.VERIFY_REAL_KV))


@pytest.mark.gpu
def test_a_lost_kv_write_is_caught_by_the_landing_check(canary_server) -> None:
    """The model's K/V write of one new token of an eager forward (a prefill chunk) goes to
    slot 0: the intended slot keeps the pre launch's poison, and the post launch of that very
    forward reports it (``verify_not_landed``), nothing else."""
    env = {**_CANARY, **PERTURB, "SGLANG_KV_CANARY_MODE": "log",
           "SGLANG_KV_CANARY_PERTURB_LOST_WRITE_PROB": "0.2"}
    server = canary_server(env=env, args=_GRAPH_ARGS)
    _perturbation_traffic(server, rounds=6)
    faults, rows = _faults_and_rows(log_when(server, every_fault_reported))
    assert_every_fault_caught(faults, rows, reason=Reason.VERIFY_NOT_LANDED,
                              allowed=int(Reason.VERIFY_NOT_LANDED),
                              checks=(CheckKind.POST_VERIFY,))


@pytest.mark.gpu
def test_a_real_data_stride_catches_the_faults_at_positions_due_in_their_forward(
    canary_server,
) -> None:
    """With ``REAL_DATA_STRIDE=4`` a byte flipped for one forward (the perturbation restores it
    after that forward) is caught exactly when its position is due in that forward's step
    (``(position + step) % 4 == 0``); the others go unseen: the price of the stride."""
    stride = 4
    env = {**_CANARY, **PERTURB, "SGLANG_KV_CANARY_MODE": "log",
           "SGLANG_KV_CANARY_REAL_DATA_STRIDE": str(stride),
           "SGLANG_KV_CANARY_PERTURB_REAL_KV_USED_PROB": "0.3"}
    server = canary_server(env=env, args=_GRAPH_ARGS)
    _perturbation_traffic(server, rounds=6)
    server.generate(_request("last", _tokens(random.Random(1), 30), 8))

    def due_faults_reported(log: str) -> bool:
        faults, rows = _faults_and_rows(log)
        reported = {(r.step, r.position) for r in rows}
        return all((int(f["step"]), int(f["position"])) in reported for f in faults
                   if (int(f["position"]) + int(f["step"])) % stride == 0)

    # (the "last" request's own faults are reported at the poll after its response)
    log = log_when(server, due_faults_reported)
    assert f"real_data_stride={stride}" in log
    faults, rows = _faults_and_rows(log)
    assert all(r.reasons == int(Reason.VERIFY_REAL_KV) for r in rows)
    reported = {(r.step, r.position) for r in rows}
    due = [f for f in faults if (int(f["position"]) + int(f["step"])) % stride == 0]
    not_due = [f for f in faults if f not in due]
    assert due and not_due, f"{len(due)} due and {len(not_due)} other faults: draw more"
    missed = [f.group(0) for f in due
              if (int(f["step"]), int(f["position"])) not in reported]
    assert not missed, "\n".join(missed[:10])
    assert not [f.group(0) for f in not_due
                if (int(f["step"]), int(f["position"])) in reported]


@pytest.mark.gpu
def test_real_kv_used_fault_is_silent_without_real_data(canary_server) -> None:
    env = {**_CANARY, **PERTURB, "SGLANG_KV_CANARY_REAL_DATA": "none",
           "SGLANG_KV_CANARY_PERTURB_REAL_KV_USED_PROB": "0.2"}
    server = canary_server(env=env, args=_GRAPH_ARGS)
    _perturbation_traffic(server, rounds=6)
    server.generate(_request("last", _tokens(random.Random(1), 30), 8))
    assert server.returncode is None
    faults, rows = _faults_and_rows(server.log_text())
    assert faults and rows == []


@pytest.mark.gpu
def test_piecewise_cuda_graph_is_refused_at_start_up(expect_launch_failure) -> None:
    outcome = expect_launch_failure(env={"SGLANG_KV_CANARY_MODE": "log"},
                                    args=["--enforce-piecewise-cuda-graph"], timeout_s=180)
    assert "CanaryUnsupportedError" in outcome.output, outcome.output[-3000:]
    assert "pass --disable-piecewise-cuda-graph" in outcome.output


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
