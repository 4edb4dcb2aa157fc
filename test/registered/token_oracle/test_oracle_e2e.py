"""GPU end to end: a real server on the tiny dummy-weight model with ``--sampling-backend
token_oracle``; every generated token must equal the oracle's prediction, computed here.

The expectation is computed in this file with plain Python ints (BLAKE2b-8 of the rid as a
little-endian signed int64, or the bootstrap room when one is given; SplitMix64 finalizer of
``id XOR position`` modulo the vocabulary size), independently of the package. A request with a
prompt of ``L`` tokens emits, as output token ``k``, the oracle's token at position ``L + k``.

Uses the harness fixtures ``canary_server`` (``env=``, ``args=``), ``shared_servers`` (the
EAGLE tests share one server), ``tiny_model_dir``, ``tiny_eagle_draft_dir`` and
``expect_launch_failure`` (``test/registered/e2e_fixtures.py``).
"""

from __future__ import annotations

import hashlib
import json
import pathlib
import random
import re
import sys
from dataclasses import dataclass

import pytest

from sglang.test.ci.ci_register import register_cuda_ci

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "e2e"))
from _workloads import serve_a_batch  # noqa: E402 - the start-up tests' text batch

register_cuda_ci(est_time=900, suite="kv-canary-gpu")

ORACLE_ENV = {"SGLANG_KV_CANARY_ENABLE_TOKEN_ORACLE": "1"}
ORACLE_ARGS = ("--sampling-backend", "token_oracle")
FIRST_ORDINARY_TOKEN = 5  # the tiny model's ids below this are special tokens
_MASK64 = (1 << 64) - 1


# ----------------------------------------------------------------------------- the reference

def _rid_hash(rid: str) -> int:
    digest = hashlib.blake2b(rid.encode("utf-8"), digest_size=8).digest()
    value = sum(byte << (8 * index) for index, byte in enumerate(digest))
    return value - (1 << 64) if value >= (1 << 63) else value


def _mix64(value: int) -> int:
    x = value & _MASK64
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & _MASK64
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & _MASK64
    x ^= x >> 31
    return x


def _generalized_id(rid: str, bootstrap_room: int | None) -> int:
    return bootstrap_room if bootstrap_room is not None and bootstrap_room >= 0 else _rid_hash(rid)


def _oracle(gen_id: int, position: int, vocab_size: int) -> int:
    return _mix64((gen_id & _MASK64) ^ position) % vocab_size


# ----------------------------------------------------------------------------- requests

@dataclass(frozen=True)
class OracleRequest:
    rid: str
    prompt: tuple[int, ...]
    max_new_tokens: int
    bootstrap_room: int | None = None

    def payload(self, *, temperature: float | None = None, **extra: object) -> dict[str, object]:
        sampling_params: dict[str, object] = {"max_new_tokens": self.max_new_tokens,
                                              "ignore_eos": True}
        if temperature is not None:
            sampling_params["temperature"] = temperature
        body: dict[str, object] = {
            "rid": self.rid,
            "input_ids": list(self.prompt),
            "sampling_params": sampling_params,
            **extra,
        }
        if self.bootstrap_room is not None:
            body["bootstrap_room"] = self.bootstrap_room
        return body

    def expected(self, vocab_size: int) -> list[int]:
        gen_id = _generalized_id(self.rid, self.bootstrap_room)
        return [_oracle(gen_id, len(self.prompt) + k, vocab_size)
                for k in range(self.max_new_tokens)]


def _request(rid: str, prompt_len: int, max_new_tokens: int, vocab_size: int, *,
             bootstrap_room: int | None = None) -> OracleRequest:
    rng = random.Random(rid)
    prompt = tuple(rng.randrange(FIRST_ORDINARY_TOKEN, vocab_size) for _ in range(prompt_len))
    return OracleRequest(rid=rid, prompt=prompt, max_new_tokens=max_new_tokens,
                         bootstrap_room=bootstrap_room)


def _batch_payload(requests: list[OracleRequest]) -> dict[str, object]:
    """One /generate call for several prompts: the scheduler receives them together."""
    assert all(r.bootstrap_room is None for r in requests)
    assert len({r.max_new_tokens for r in requests}) == 1
    return {
        "rid": [r.rid for r in requests],
        "input_ids": [list(r.prompt) for r in requests],
        "sampling_params": {"max_new_tokens": requests[0].max_new_tokens, "ignore_eos": True},
    }


def _vocab_size(model_dir: pathlib.Path) -> int:
    return json.loads((model_dir / "config.json").read_text(encoding="utf-8"))["vocab_size"]


def _check(requests: list[OracleRequest], results: list[dict], vocab_size: int) -> None:
    """Every output token of every request equals the oracle's; report all mismatches."""
    assert len(results) == len(requests)
    mismatches = []
    for request, result in zip(requests, results):
        assert result["meta_info"]["prompt_tokens"] == len(request.prompt), request.rid
        expected, got = request.expected(vocab_size), result["output_ids"]
        if got != expected:
            bad = [k for k, (e, g) in enumerate(zip(expected, got)) if e != g]
            mismatches.append(f"{request.rid}: {len(got)}/{len(expected)} tokens, first "
                              f"mismatching output indices {bad[:8]}; got {got[:12]}, expected "
                              f"{expected[:12]}")
    assert not mismatches, "\n".join(mismatches)


def _run_all(server, requests: list[OracleRequest], vocab_size: int) -> None:
    results = server.generate_many([r.payload() for r in requests], concurrency=len(requests))
    _check(requests, results, vocab_size)


_DECODE_LINE = re.compile(r"Decode batch.*?#running-req: (\d+),.*?cuda graph: (True|False)")


def _decode_batches(log: str) -> set[tuple[int, bool]]:
    return {(int(n), flag == "True") for n, flag in _DECODE_LINE.findall(log)}


# ----------------------------------------------------------------------------- (a) eager

@pytest.mark.gpu
def test_every_token_follows_the_oracle_without_cuda_graphs(canary_server, tiny_model_dir) -> None:
    vocab_size = _vocab_size(tiny_model_dir)
    server = canary_server(env=ORACLE_ENV, args=(*ORACLE_ARGS, "--disable-cuda-graph"))
    requests = [
        _request("eager-0", 1, 16, vocab_size),
        _request("eager-1", 7, 9, vocab_size),
        _request("eager-2", 31, 24, vocab_size),
        _request("eager-3", 64, 5, vocab_size),
        _request("eager-4", 100, 30, vocab_size),
        _request("eager-room", 250, 12, vocab_size, bootstrap_room=987_654_321),
    ]
    _run_all(server, requests, vocab_size)
    # The same prompt again under a new rid: a radix-cache hit, the new rid's tokens.
    again = OracleRequest(rid="eager-2-again", prompt=requests[2].prompt, max_new_tokens=20)
    _check([again], [server.generate(again.payload())], vocab_size)
    # Logprob requests get the oracle's tokens, with the model's logprobs of those tokens.
    request = _request("eager-logprobs", 12, 10, vocab_size)
    result = server.generate(request.payload(return_logprob=True, top_logprobs_num=2))
    _check([request], [result], vocab_size)
    entries = result["meta_info"]["output_token_logprobs"]
    assert [entry[1] for entry in entries] == result["output_ids"]
    assert all(entry[0] <= 0.0 for entry in entries)




# ----------------------------------------------------------------------------- (b) CUDA graphs

@pytest.mark.gpu
def test_every_token_follows_the_oracle_with_padded_cuda_graphs(canary_server,
                                                               tiny_model_dir) -> None:
    vocab_size = _vocab_size(tiny_model_dir)
    server = canary_server(env=ORACLE_ENV, args=(*ORACLE_ARGS, "--cuda-graph-bs", "1", "2", "4",
                                                 "8", "--decode-log-interval", "1"))
    for size in (3, 5, 12):  # padded into graphs of 4 and 8; 12 runs eagerly (above 8)
        requests = [_request(f"graph{size}-{i}", 5 + 11 * i, 32, vocab_size)
                    for i in range(size)]
        _check(requests, server.generate(_batch_payload(requests)), vocab_size)
    decode_batches = _decode_batches(server.log_text())
    assert (3, True) in decode_batches, sorted(decode_batches)
    assert (5, True) in decode_batches, sorted(decode_batches)
    assert any(n > 8 and not graph for n, graph in decode_batches), sorted(decode_batches)
    # A batch of one after the larger ones: padded rows of the replays must not leak into it.
    single = _request("graph-single", 17, 16, vocab_size)
    _check([single], [server.generate(single.payload())], vocab_size)


# ----------------------------------------------------------------------------- (c) chunked prefill

@pytest.mark.gpu
@pytest.mark.parametrize("mixed_chunk", [False, True], ids=["alternating", "mixed-chunk"])
def test_every_token_follows_the_oracle_with_chunked_prefill(canary_server, tiny_model_dir,
                                                             mixed_chunk: bool) -> None:
    vocab_size = _vocab_size(tiny_model_dir)
    args = [*ORACLE_ARGS, "--chunked-prefill-size", "64"]
    if mixed_chunk:
        args.append("--enable-mixed-chunk")
    server = canary_server(env=ORACLE_ENV, args=tuple(args))
    decoding = [_request(f"chunk-decode-{i}", 10 + i, 48, vocab_size) for i in range(4)]
    long_prompts = [_request(f"chunk-long-{i}", n, 8, vocab_size)
                    for i, n in enumerate((150, 200, 333))]  # 3 to 6 chunks of 64
    _run_all(server, decoding + long_prompts, vocab_size)


# ----------------------------------------------------------------------------- (d) EAGLE

def _eagle_args(draft_dir: pathlib.Path) -> tuple[str, ...]:
    """The oracle EAGLE server's flags (spec v2, 2 steps, topk 1, 3 draft tokens)."""
    return (*ORACLE_ARGS, "--speculative-algorithm", "EAGLE",
            "--speculative-draft-model-path", str(draft_dir),
            "--speculative-num-steps", "2", "--speculative-eagle-topk", "1",
            "--speculative-num-draft-tokens", "3")


@pytest.mark.gpu
def test_tiny_eagle_draft_serves_speculatively(shared_servers, tiny_eagle_draft_dir) -> None:
    """The tiny EAGLE draft is accepted by ``--speculative-algorithm EAGLE`` and drafts: every
    request of a text batch completes, verified drafts included (on the EAGLE server the oracle
    test below shares; the canary is off there)."""
    server = shared_servers.get(env=ORACLE_ENV, args=_eagle_args(tiny_eagle_draft_dir))
    outputs = serve_a_batch(server)
    assert server.request_json("GET", "/server_info")["speculative_algorithm"] == "EAGLE"
    assert any(o["meta_info"].get("spec_verify_ct", 0) > 0 for o in outputs)


@pytest.mark.gpu
def test_every_token_follows_the_oracle_with_eagle(shared_servers, tiny_model_dir,
                                                   tiny_eagle_draft_dir) -> None:
    """EAGLE spec v2 (overlap on, topk 1): the draft model proposes, the target verifies.

    Only the prefill samples through the sampling backend; the verify step picks tokens from
    the target logits, which the package replaces by the oracle's one-hot logits. So every
    committed token, prefill and verified alike, is the oracle's; a draft token is accepted
    only when it equals the oracle's token.
    """
    vocab_size = _vocab_size(tiny_model_dir)
    server = shared_servers.get(env=ORACLE_ENV, args=_eagle_args(tiny_eagle_draft_dir))
    assert "Spec v2 is enabled" in server.log_text()
    # Default temperature (1.0): verify by tree speculative sampling on the oracle's point mass.
    requests = [_request(f"eagle-{i}", n, 20, vocab_size) for i, n in enumerate((5, 40, 120))]
    _run_all(server, requests, vocab_size)
    # All greedy: verify by argmax + verify_tree_greedy.
    greedy = [_request(f"eagle-greedy-{i}", n, 25, vocab_size) for i, n in enumerate((9, 64))]
    results = server.generate_many([r.payload(temperature=0.0) for r in greedy], concurrency=2)
    _check(greedy, results, vocab_size)


# ----------------------------------------------------------------------------- (e) next_token_swap

_SWAP_LINE = re.compile(
    r"kv_canary perturb: fault=next_token_swap step=(?P<step>\d+) row=\d+ rid=(?P<rid>\S+) "
    r"position=(?P<position>\d+) partner_row=\d+ partner_rid=(?P<partner_rid>\S+) "
    r"partner_position=(?P<partner_position>\d+)"
)


@pytest.mark.gpu
def test_next_token_swap_changes_exactly_the_predicted_tokens(canary_server,
                                                               tiny_model_dir) -> None:
    vocab_size = _vocab_size(tiny_model_dir)
    warmup = 16
    env = {**ORACLE_ENV, "SGLANG_KV_CANARY_PERTURB_NEXT_TOKEN_SWAP_PROB": "1",
           "SGLANG_KV_CANARY_PERTURB_WARMUP_STEPS": str(warmup),
           "SGLANG_KV_CANARY_PERTURB_SEED": "7"}
    server = canary_server(env=env, args=ORACLE_ARGS)
    requests = [_request("swap-a", 20, 24, vocab_size), _request("swap-b", 33, 24, vocab_size)]
    results = server.generate(_batch_payload(requests))

    swaps = [m.groupdict() for m in _SWAP_LINE.finditer(server.log_text())]
    assert all(int(s["step"]) >= warmup for s in swaps), swaps
    ours = {r.rid: r for r in requests}
    # Predicted outputs: the oracle, except at each swapped (rid, position), where the request
    # emits the partner's oracle token at the partner's position.
    predicted = {r.rid: r.expected(vocab_size) for r in requests}
    swapped_here = 0
    for swap in swaps:
        for rid, position, other, other_position in (
            (swap["rid"], swap["position"], swap["partner_rid"], swap["partner_position"]),
            (swap["partner_rid"], swap["partner_position"], swap["rid"], swap["position"]),
        ):
            if rid not in ours:
                continue
            other_room = ours[other].bootstrap_room if other in ours else None
            index = int(position) - len(ours[rid].prompt)
            if index >= len(predicted[rid]):
                # The overlap scheduler runs one more decode step for a request that has just
                # finished; the token sampled there is discarded, so its swap changes no output.
                continue
            predicted[rid][index] = _oracle(_generalized_id(other, other_room),
                                            int(other_position), vocab_size)
            swapped_here += 1
    assert swapped_here >= 2, f"no swap touched the test's requests: {swaps}"
    for request, result in zip(requests, results):
        assert result["output_ids"] == predicted[request.rid], request.rid
        assert result["output_ids"] != request.expected(vocab_size), request.rid


# ----------------------------------------------------------------------------- refusal

@pytest.mark.gpu
def test_oracle_without_its_sampling_backend_is_refused(expect_launch_failure) -> None:
    outcome = expect_launch_failure(env=ORACLE_ENV, args=("--sampling-backend", "pytorch"),
                                    timeout_s=300)
    assert "needs --sampling-backend token_oracle" in outcome.output


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
