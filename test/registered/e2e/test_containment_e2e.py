"""End-to-end on a GPU: abort mode (``SGLANG_KV_CANARY_ON_VIOLATION=abort``) contains faults.

An abort-mode server (token oracle, partial real data, report file, ``--enable-metrics``) takes
``req_to_token`` and ``real_kv_used`` faults under concurrent traffic on ``/generate`` (streaming
and not) and ``/v1/chat/completions`` (streaming and not), every prompt distinct. Once every
forward is polled:

1. every fault's request is aborted (an ``abort`` object with cause ``violation``), and the
   requests the file says were aborted are exactly the ones whose client saw the canary's error
   (HTTP 500 / an abort or error chunk naming the KV canary); the server serves on;
2. the bound: a streamed aborted request received exactly ``tokens_delivered`` tokens, all the
   oracle's (nothing of the faulted forward);
3. every other ``/generate`` request completed with the oracle's tokens (what a clean run gives);
4. after the run, each aborted ``/generate`` prompt served again is clean: the oracle's tokens,
   no violation row, and no cached prefix past the reported position (the node was evicted);
5. ``/metrics``: ``kv_canary_requests_aborted_total`` and ``kv_canary_cache_nodes_evicted_total``
   equal the file's abort objects and evicted nodes.

A log-mode server with the same faults aborts nothing.
"""

import concurrent.futures
import json
import random
import re
import sys
import urllib.error
import urllib.request

import pytest
from _workloads import PERTURB, faults_and_rows, polled_log, tokens

from sglang.srt.kv_canary.token_oracle.oracle import hash_oracle_token_scalar
from sglang.srt.kv_canary.token_oracle.request_ids import generalized_req_id
from sglang.test.ci.ci_register import register_cuda_ci

register_cuda_ci(est_time=190, suite="kv-canary-gpu")

_ARGS = ("--enable-metrics", "--sampling-backend", "token_oracle", "--page-size", "1",
         "--chunked-prefill-size", "256",
         "--max-total-tokens", "6144", "--cuda-graph-max-bs", "16")
_FAULTS = {**PERTURB, "SGLANG_KV_CANARY_ENABLE_TOKEN_ORACLE": "1",
           "SGLANG_KV_CANARY_REAL_DATA": "partial",
           "SGLANG_KV_CANARY_PERTURB_REQ_TO_TOKEN_PROB": "0.08",
           "SGLANG_KV_CANARY_PERTURB_REAL_KV_USED_PROB": "0.08"}
_NEW_TOKENS = 24
_SAMPLE = re.compile(r"^(?P<name>[a-z_]+)\{(?P<labels>[^}]*)\} (?P<value>[0-9.e+]+)$")


def _post(server, path: str, payload: dict, *, stream: bool) -> tuple[int, list[dict] | dict]:
    """(status, the JSON body, or every ``data:`` chunk of a stream)."""
    request = urllib.request.Request(server.base_url + path, data=json.dumps(payload).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            body = response.read().decode()
            status = response.status
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")
    if not stream:
        return status, json.loads(body)
    chunks = [json.loads(line[6:]) for line in body.splitlines()
              if line.startswith("data: ") and line != "data: [DONE]"]
    return status, chunks


def _oracle(rid: str, prompt_len: int, count: int, vocab: int) -> list[int]:
    gid = generalized_req_id(rid=rid, bootstrap_room=None)
    return [hash_oracle_token_scalar(generalized_req_id=gid, position=prompt_len + k,
                                     vocab_size=vocab) for k in range(count)]


def _outcome(kind: str, status: int, body) -> tuple[bool, list[int] | None, str]:
    """(aborted by the canary, output ids when known, error text)."""
    if kind == "generate":
        if status != 200:
            return True, None, json.dumps(body)
        return False, body["output_ids"], ""
    if kind == "generate_stream":
        last = body[-1]
        reason = (last.get("meta_info") or {}).get("finish_reason") or {}
        if "error" in last or reason.get("type") == "abort":
            return True, last.get("output_ids"), json.dumps(reason or last)
        return False, last.get("output_ids"), ""
    if kind == "chat":
        if status != 200:
            return True, None, json.dumps(body)
        return False, None, ""
    errors = [chunk for chunk in body if chunk.get("object") == "error" or "error" in chunk]
    return bool(errors), None, json.dumps(errors[:1])


def _traffic(server, *, rounds: int, vocab: int, seed: int = 3) -> dict[str, dict]:
    """Concurrent requests of the four kinds; per rid: kind, prompt, outcome."""
    rng = random.Random(seed)
    sent: dict[str, dict] = {}

    def one(rid: str, kind: str, ids: list[int]) -> None:
        sampling = {"max_new_tokens": _NEW_TOKENS, "temperature": 0.0, "ignore_eos": True}
        if kind.startswith("generate"):
            payload = {"rid": rid, "input_ids": ids, "sampling_params": sampling,
                       "stream": kind == "generate_stream"}
            status, body = _post(server, "/generate", payload, stream=payload["stream"])
        else:
            payload = {"rid": rid, "model": "default", "max_tokens": _NEW_TOKENS,
                       "temperature": 0.0, "ignore_eos": True, "stream": kind == "chat_stream",
                       "messages": [{"role": "user", "content": " ".join(map(str, ids))}]}
            status, body = _post(server, "/v1/chat/completions", payload,
                                 stream=payload["stream"])
        aborted, output, error = _outcome(kind, status, body)
        sent[rid] = {"kind": kind, "ids": ids, "aborted": aborted, "output": output,
                     "error": error}

    kinds = ("generate", "generate_stream", "chat", "chat_stream")
    for round_index in range(rounds):
        jobs = [(f"c{round_index}-{i}", kinds[i % 4], tokens(rng, rng.randrange(40, 160)))
                for i in range(8)]
        with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(lambda job: one(*job), jobs))
    return sent


def _metric_sum(server, name: str) -> float:
    with urllib.request.urlopen(server.base_url + "/metrics", timeout=30) as response:
        page = response.read().decode()
    return sum(float(m["value"]) for m in map(_SAMPLE.match, page.splitlines())
               if m and m["name"] == name)


def _vocab(tiny_model_dir) -> int:
    return json.loads((tiny_model_dir / "config.json").read_text())["vocab_size"]


@pytest.mark.gpu
def test_abort_mode_aborts_exactly_the_faulted_requests_and_heals_the_cache(
        canary_server, tiny_model_dir, tmp_path) -> None:
    report = tmp_path / "containment.jsonl"
    server = canary_server(env={**_FAULTS, "SGLANG_KV_CANARY_ON_VIOLATION": "abort",
                                "SGLANG_KV_CANARY_REPORT_PATH": str(report)}, args=_ARGS)
    vocab = _vocab(tiny_model_dir)
    sent = _traffic(server, rounds=5, vocab=vocab)
    log = polled_log(server)
    faults, _ = faults_and_rows(log)
    assert faults, log[-3000:]
    objects = [json.loads(line) for line in report.read_text().splitlines()]
    assert objects[0]["config"]["mode"] == "abort"
    aborts = {o["rid"]: o for o in objects if o["type"] == "abort"}
    evictions = [o for o in objects if o["type"] == "cache_eviction"]
    violations = [o for o in objects if o["type"] == "violation"]
    # 1. every fault's request aborted; the file's aborts are the clients' errors
    for fault in faults:
        assert fault["rid"] in aborts, fault.group(0)
    assert all(o["cause"] in ("violation", "cache") for o in aborts.values()), aborts
    client_aborted = {rid for rid, r in sent.items() if r["aborted"]}
    assert client_aborted == set(aborts) & set(sent), (client_aborted, set(aborts))
    for rid in client_aborted:
        assert "KV canary" in sent[rid]["error"], sent[rid]["error"]
    # 2. the bound, and 3. the others are the oracle's
    for rid, r in sent.items():
        if not r["kind"].startswith("generate") or r["output"] is None:
            continue
        expected = _oracle(rid, len(r["ids"]), _NEW_TOKENS, vocab)
        if r["aborted"]:
            assert len(r["output"]) == aborts[rid]["tokens_delivered"], (rid, r["output"])
            assert r["output"] == expected[:len(r["output"])], rid
        else:
            assert r["output"] == expected, rid
    # 4. each aborted prompt again: clean, recomputed from the reported position on
    first_position = {}
    for v in violations:
        if v["rid"] in aborts and v["rid"] not in first_position:
            first_position[v["rid"]] = v["position"]
    retried = [rid for rid in aborts if rid in sent and sent[rid]["kind"].startswith("generate")]
    assert retried, "no /generate request was aborted"
    outcomes = {}
    for rid in retried:  # (the faults go on: a retry may be faulted and aborted in its turn)
        outcomes[rid] = _post(server, "/generate", {
            "rid": f"retry-{rid}", "input_ids": sent[rid]["ids"],
            "sampling_params": {"max_new_tokens": 4, "temperature": 0.0, "ignore_eos": True}},
            stream=False)
    polled_log(server)
    final = [json.loads(line) for line in report.read_text().splitlines()]
    retry_aborts = {o["rid"] for o in final if o["type"] == "abort"
                    and o["rid"].startswith("retry-")}
    clean_retries = 0
    for rid, (status, body) in outcomes.items():
        if status != 200:
            assert f"retry-{rid}" in retry_aborts, (rid, body)
            assert "KV canary" in json.dumps(body), body
            continue
        clean_retries += 1
        ids = sent[rid]["ids"]
        assert body["output_ids"] == _oracle(f"retry-{rid}", len(ids), 4, vocab), rid
        position = first_position.get(rid)
        if position is not None and 0 <= position < len(ids):
            assert body["meta_info"]["cached_tokens"] <= position, (rid, body["meta_info"])
    assert clean_retries >= len(retried) // 2, (clean_retries, len(retried))
    retry_rows = [o for o in final if o["type"] == "violation"
                  and str(o["rid"]).startswith("retry-")]
    assert all(o["rid"] in retry_aborts for o in retry_rows), retry_rows[:3]
    # 5. metrics equal the file
    final_aborts = [o for o in final if o["type"] == "abort"]
    final_nodes = sum(o["nodes"] for o in final if o["type"] == "cache_eviction")
    assert _metric_sum(server, "kv_canary_requests_aborted_total") == len(final_aborts)
    assert _metric_sum(server, "kv_canary_cache_nodes_evicted_total") == final_nodes
    assert final_nodes >= sum(o["nodes"] for o in evictions) > 0
    assert server.returncode is None


@pytest.mark.gpu
def test_log_mode_aborts_nothing(canary_server, tiny_model_dir, tmp_path) -> None:
    report = tmp_path / "log-mode.jsonl"
    server = canary_server(env={**_FAULTS, "SGLANG_KV_CANARY_ON_VIOLATION": "log",
                                "SGLANG_KV_CANARY_REPORT_PATH": str(report)}, args=_ARGS)
    sent = _traffic(server, rounds=3, vocab=_vocab(tiny_model_dir))
    log = polled_log(server)
    faults, rows = faults_and_rows(log)
    assert faults and rows, log[-3000:]
    assert not any(r["aborted"] for r in sent.values()), [
        (rid, r["error"]) for rid, r in sent.items() if r["aborted"]][:3]
    types = {json.loads(line)["type"] for line in report.read_text().splitlines()}
    assert "abort" not in types and "cache_eviction" not in types
    assert "kv_canary abort:" not in log
    assert _metric_sum(server, "kv_canary_requests_aborted_total") == 0


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
