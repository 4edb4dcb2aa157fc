"""On CUDA: the kernels fed from the packed per-forward upload (the token-history scatter, the
deferred admission check) and the oracle's launches never compile a new variant because their
inputs sit at another offset of a buffer.

Triton specializes a pointer argument on its 16-byte alignment unless told not to, and the
views into one packed upload start wherever the batch puts them: each new combination would be
a compile (tens to hundreds of ms) in the middle of serving, at unpredictable forwards.
"""

import sys

import pytest
import torch

from _canary_sim import KvSim, import_triton_modules
from sglang.test.ci.ci_register import register_cuda_ci

register_cuda_ci(est_time=20, suite="kv-canary-gpu")

pytestmark = pytest.mark.gpu


def _variants(kernel) -> int:
    return sum(len(cache[0]) for cache in kernel.device_caches.values())


def _views(values: list[list[int]], offset: int) -> list[torch.Tensor]:
    """The lists as int64 views into one CUDA buffer, the first at ``offset`` words."""
    flat = [0] * offset + [value for column in values for value in column]
    packed = torch.tensor(flat, dtype=torch.int64, device="cuda")
    views, start = [], offset
    for column in values:
        views.append(packed[start : start + len(column)])
        start += len(column)
    return views


def test_the_history_scatter_takes_views_at_any_offset() -> None:
    # imported here: on a machine without CUDA the kernel modules are loaded interpreted
    from sglang.jit_kernel.kv_canary.scatter_req_token_ids import (
        _scatter_req_token_ids_kernel,
        launch_scatter_req_token_ids_kernel,
    )

    pool = torch.zeros((4, 16), dtype=torch.int32, device="cuda")
    lens_out = torch.zeros(4, dtype=torch.int64, device="cuda")

    def scatter(offset: int, tokens: list[int]) -> None:
        rows, lens, offsets, flat = _views(
            [[2], [len(tokens)], [0, len(tokens)], tokens], offset
        )
        launch_scatter_req_token_ids_kernel(
            flat_in=flat, offsets=offsets, req_pool_indices=rows, pool_out=pool,
            history_lens=lens, history_lens_out=lens_out,
        )

    scatter(0, [5, 6, 7])
    before = _variants(_scatter_req_token_ids_kernel)
    for offset in range(1, 5):
        scatter(offset, [5, 6, 7, 8][: offset])
    torch.cuda.synchronize()
    assert _variants(_scatter_req_token_ids_kernel) == before
    assert pool[2, :4].tolist() == [5, 6, 7, 8] and lens_out[2].item() == 4


def test_the_admission_check_takes_views_at_any_offset() -> None:
    module = import_triton_modules()["admission_owner"]
    sim = KvSim(device="cuda")
    sim.add_request(1, [1, 2, 3])
    module.launch_admission_owner_check(
        state=sim.state, **dict(zip(("req_pool_indices", "prefix_lens", "chains"),
                                    _views([[0], [0], [0]], 0)))
    )
    before = _variants(module._admission_owner_kernel)
    for offset in range(1, 5):
        rows, prefixes, chains = _views([[0] * offset, [0] * offset, [0] * offset], offset)
        module.launch_admission_owner_check(
            state=sim.state, req_pool_indices=rows, prefix_lens=prefixes, chains=chains
        )
    torch.cuda.synchronize()
    assert _variants(module._admission_owner_kernel) == before


def test_the_oracle_takes_views_at_any_offset() -> None:
    module = import_triton_modules()["hash_oracle"]
    out = torch.zeros(8, dtype=torch.int64, device="cuda")

    def oracle(offset: int) -> None:
        ids, positions = _views([[7] * 3, [1, 2, 3]], offset)
        module.launch_hash_oracle_tokens(
            req_ids=ids, bootstrap_room_ids=None, positions=positions, position_offset=0,
            vocab_size=1000, tokens_out=out[offset % 2 : offset % 2 + 3],
        )

    oracle(0)
    before = _variants(module._hash_oracle_tokens_kernel)
    for offset in range(1, 5):
        oracle(offset)
    torch.cuda.synchronize()
    assert _variants(module._hash_oracle_tokens_kernel) == before


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
