"""The token oracle's one-launch kernel (and its torch twin) against the scalar reference of
SPEC §4, bit for bit: generalized ids (bootstrap room over rid), position offsets, int32 and
int64 positions and tokens, strided views, extreme ids, vocabularies up to 2**31 - 1; the input
contract; and a CUDA-graph capture replayed on new inputs."""

import sys

import pytest
import torch

from _canary_sim import IMPLS, hash_oracle_launch
from sglang.srt.kv_canary.token_oracle.oracle import hash_oracle_token_scalar
from sglang.test.ci.ci_register import register_cpu_ci, register_cuda_ci

register_cpu_ci(est_time=10, suite="kv-canary-cpu")
register_cuda_ci(est_time=10, suite="kv-canary-gpu")

EXTREME_IDS = [0, 1, -1, (1 << 63) - 1, -(1 << 63), 123456789, -987654321, 1 << 40]


def _expected(rids, rooms, positions, offset, vocab_size):
    tokens = []
    for index, (rid, position) in enumerate(zip(rids, positions)):
        gid = rooms[index] if rooms is not None and rooms[index] >= 0 else rid
        tokens.append(hash_oracle_token_scalar(
            generalized_req_id=gid, position=position + offset, vocab_size=vocab_size
        ))
    return tokens


@pytest.mark.parametrize("impl, device", IMPLS)
@pytest.mark.parametrize("vocab_size", [1, 7, 151936, (1 << 31) - 1])
@pytest.mark.parametrize("offset", [-1, 0, 1])
def test_tokens_equal_the_scalar_oracle(impl, device, vocab_size, offset):
    n = 300  # more than one block
    rids = [EXTREME_IDS[i % len(EXTREME_IDS)] * (i + 1) % (1 << 62) - i for i in range(n)]
    rooms = [-1 if i % 3 else i * 7919 for i in range(n)]
    positions = [(i * 37) % 40961 for i in range(n)]
    tokens = torch.full((n,), -5, dtype=torch.int64, device=device)
    positions_out = torch.full((n,), -5, dtype=torch.int64, device=device)
    hash_oracle_launch(impl)(
        req_ids=torch.tensor(rids, dtype=torch.int64, device=device),
        bootstrap_room_ids=torch.tensor(rooms, dtype=torch.int64, device=device),
        positions=torch.tensor(positions, dtype=torch.int64, device=device),
        position_offset=offset, vocab_size=vocab_size, tokens_out=tokens,
        positions_out=positions_out,
    )
    assert tokens.tolist() == _expected(rids, rooms, positions, offset, vocab_size)
    assert positions_out.tolist() == [p + offset for p in positions]


@pytest.mark.parametrize("impl, device", IMPLS)
def test_int32_inputs_strided_outputs_and_no_rooms(impl, device):
    rids = EXTREME_IDS * 3
    n = len(rids)
    positions = torch.arange(n, dtype=torch.int32, device=device) * 5
    block = torch.full((n, 3), -5, dtype=torch.int32, device=device)
    hash_oracle_launch(impl)(
        req_ids=torch.tensor(rids, dtype=torch.int64, device=device), bootstrap_room_ids=None,
        positions=positions, position_offset=1, vocab_size=151936, tokens_out=block[:, 1],
    )
    assert block[:, 1].tolist() == _expected(rids, None, positions.tolist(), 1, 151936)
    assert (block[:, 0] == -5).all() and (block[:, 2] == -5).all()


@pytest.mark.parametrize("impl, device", IMPLS)
def test_an_empty_batch_is_a_no_op(impl, device):
    empty = torch.empty((0,), dtype=torch.int64, device=device)
    hash_oracle_launch(impl)(req_ids=empty, bootstrap_room_ids=None, positions=empty,
                             position_offset=0, vocab_size=5, tokens_out=empty)


@pytest.mark.parametrize("impl, device", IMPLS)
@pytest.mark.parametrize(
    "change, error, message",
    [
        ({"req_ids": torch.zeros(4, dtype=torch.int32)}, TypeError, "req_ids must be torch.int64"),
        ({"positions": torch.zeros(4, dtype=torch.float32)}, TypeError,
         "positions must be torch.int32 or torch.int64"),
        ({"tokens_out": torch.zeros(4, dtype=torch.int16)}, TypeError, "tokens_out must be"),
        ({"positions_out": torch.zeros(4, dtype=torch.int32)}, TypeError,
         "positions_out must be torch.int64"),
        ({"bootstrap_room_ids": torch.zeros(3, dtype=torch.int64)}, ValueError,
         "bootstrap_room_ids must be 1-D with tokens_out's length 4, got shape (3,)"),
        ({"tokens_out": torch.zeros(2, 2, dtype=torch.int64)}, ValueError, "not 1-D"),
        ({"vocab_size": 0}, ValueError, "vocab_size=0 is invalid"),
        ({"vocab_size": 1 << 31}, ValueError, "allowed: [1, 2147483647]"),
    ],
)
def test_bad_inputs_name_the_argument(impl, device, change, error, message):
    arguments = {
        "req_ids": torch.zeros(4, dtype=torch.int64),
        "bootstrap_room_ids": None,
        "positions": torch.zeros(4, dtype=torch.int64),
        "position_offset": 0,
        "vocab_size": 11,
        "tokens_out": torch.zeros(4, dtype=torch.int64),
        "positions_out": None,
    }
    arguments.update(change)
    arguments = {
        name: value.to(device) if isinstance(value, torch.Tensor) else value
        for name, value in arguments.items()
    }
    with pytest.raises(error, match=message.replace("(", r"\(").replace(")", r"\)")
                       .replace("[", r"\[").replace("]", r"\]")):
        hash_oracle_launch(impl)(**arguments)


@pytest.mark.gpu
def test_the_kernel_replays_from_a_cuda_graph_on_new_inputs():
    launch = hash_oracle_launch("triton")
    n = 64
    rids = torch.zeros(n, dtype=torch.int64, device="cuda")
    rooms = torch.full((n,), -1, dtype=torch.int64, device="cuda")
    seq_lens = torch.ones(n, dtype=torch.int32, device="cuda")
    tokens = torch.empty(n, dtype=torch.int64, device="cuda")
    positions = torch.empty(n, dtype=torch.int64, device="cuda")

    def run():
        launch(req_ids=rids, bootstrap_room_ids=rooms, positions=seq_lens, position_offset=-1,
               vocab_size=151936, tokens_out=tokens, positions_out=positions)

    run()  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    new_rids = [(i * 0x9E3779B97F4A7C15) % (1 << 63) - (1 << 62) for i in range(n)]
    new_rooms = [-1 if i % 2 else 1000 + i for i in range(n)]
    new_lens = [100 + 13 * i for i in range(n)]
    rids.copy_(torch.tensor(new_rids))
    rooms.copy_(torch.tensor(new_rooms))
    seq_lens.copy_(torch.tensor(new_lens, dtype=torch.int32))
    graph.replay()
    torch.cuda.synchronize()
    assert tokens.tolist() == _expected(new_rids, new_rooms, new_lens, -1, 151936)
    assert positions.tolist() == [length - 1 for length in new_lens]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
