"""Host cost of the token-history sync (full vs incremental) and the scatter kernel's speed.

Part 1, any machine: per-forward host time of ``RequestRows.prepare`` (at
``ForwardBatch.init_new``) and of the upload (before the forward: the packed buffer copied to the
device staging, ``TokenHistory.upload``, ``RequestRows.commit``, as the model runner's canary
does it) for a steady decode batch of N running requests with H-token histories, full
(``incremental=False``) and incremental side by side; plus a "churn" variant where every step two
requests finish and two new H-token requests take their rows. On a machine without CUDA the
history lives on the CPU and the scatter launch is left out (a CPU has no Triton backend; the
interpreter would measure itself), so "upload" is its host work: the staging copy and the
bookkeeping. With CUDA, upload is the real call (pinned copy + launch), timed without a sync.

Part 2, CUDA only: the scatter kernel vs the torch reference from decode sizes to 2M tokens:
GPU time (from CUDA-graph replays) with the achieved bandwidth, and the eager call's time.

    python benchmark/bench_token_history.py [--requests 256] [--history 8192] [--steps 50]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

from sglang.jit_kernel.kv_canary.scatter_req_token_ids import launch_scatter_req_token_ids_kernel
from sglang.jit_kernel.kv_canary.scatter_req_token_ids_ref import (
    scatter_req_token_ids_torch_reference,
)
from sglang.srt.kv_canary.runner.request_rows import RequestRows, RowUpdates
from sglang.srt.kv_canary.token_history.history import TokenHistory

from timing import event_time_us, graph_time_us  # sibling module: this directory is on sys.path


class _Req:
    """The attributes of SGLang's ``Req`` the bookkeeping reads (list-based, as in 0.5.12)."""

    def __init__(self, rid: str, prompt: list[int], row: int) -> None:
        self.rid = rid
        self.origin_input_ids = prompt
        self.output_ids: list[int] = []
        self.req_pool_idx = row
        self.retraction_count = 0


def _new_request(rng: random.Random, rid: int, history: int, row: int) -> _Req:
    return _Req(f"r{rid}", [rng.randrange(150_000) for _ in range(history)], row)


class _HistorySync:
    """Request-row bookkeeping and the device history, driven as the model runner's canary
    drives them (one preallocated device staging buffer, grown on demand)."""

    def __init__(self, *, incremental: bool, num_rows: int, max_context_len: int,
                 device: str) -> None:
        self.rows = RequestRows(num_rows=num_rows, token_history=True, owner_chains=False,
                                pin_memory=device == "cuda", incremental=incremental)
        self.history = TokenHistory(
            num_rows=num_rows, max_context_len=max_context_len, device=device,
            # See the module docstring: on a CPU time the host work, not a CPU Triton interpreter.
            scatter=launch_scatter_req_token_ids_kernel if device == "cuda" else _no_scatter,
        )
        self._staging = torch.empty((1 << 16,), dtype=torch.int64, device=device)

    def prepare(self, reqs: list[_Req]) -> RowUpdates:
        return self.rows.prepare(reqs=reqs, prefix_lens=[0] * len(reqs), seq_lens=[1] * len(reqs))

    def upload(self, updates: RowUpdates) -> None:
        words = updates.packed.shape[0]
        if self._staging.shape[0] < words:
            self._staging = torch.empty((1 << (words - 1).bit_length(),), dtype=torch.int64,
                                        device=self._staging.device)
        staging = self._staging[:words]
        staging.copy_(updates.packed, non_blocking=True)
        _, section, _, _ = updates.sections_on(staging)
        self.history.upload(section)
        self.rows.commit(updates)


def _measure_host(
    *, incremental: bool, num_requests: int, history: int, steps: int, churn: int, device: str,
) -> dict[str, float]:
    rng = random.Random(0)
    sync = _HistorySync(incremental=incremental, num_rows=num_requests + 1,
                        max_context_len=history + steps + 8, device=device)
    reqs = [_new_request(rng, i, history, row=i + 1) for i in range(num_requests)]
    next_rid = num_requests
    sync.upload(sync.prepare(reqs))  # admission: every history is written once
    prepare_ms, upload_ms, tokens = [], [], []
    for _ in range(steps):
        for req in reqs:
            req.output_ids.append(rng.randrange(150_000))
        for _ in range(churn):  # a request finishes; a new one takes its row
            victim = rng.randrange(len(reqs))
            reqs[victim] = _new_request(rng, next_rid, history, row=reqs[victim].req_pool_idx)
            next_rid += 1
        start = time.perf_counter()
        updates = sync.prepare(reqs)
        middle = time.perf_counter()
        sync.upload(updates)
        end = time.perf_counter()
        prepare_ms.append((middle - start) * 1e3)
        upload_ms.append((end - middle) * 1e3)
        tokens.append(updates.token_history.req_all_ids_flat.shape[0])
    if device == "cuda":
        torch.cuda.synchronize()
    return {
        "prepare_ms": statistics.median(prepare_ms),
        "upload_ms": statistics.median(upload_ms),
        "tokens": statistics.median(tokens),
    }


def _no_scatter(**_: object) -> None:
    return None


def _host_report(*, num_requests: int, history: int, steps: int, device: str) -> None:
    print(f"\n== host time per forward: {num_requests} running requests, {history}-token "
          f"histories, median of {steps} decode steps, pool on {device} ==")
    print(f"{'scenario':<22}{'mode':<13}{'prepare ms':>13}{'upload ms':>13}{'total ms':>11}"
          f"{'tokens/fwd':>12}")
    for churn in (0, 2):
        scenario = "decode" if churn == 0 else f"decode + {churn} new/step"
        for incremental in (False, True):
            r = _measure_host(incremental=incremental, num_requests=num_requests,
                              history=history, steps=steps, churn=churn, device=device)
            total_ms = r["prepare_ms"] + r["upload_ms"]
            mode = "incremental" if incremental else "full"
            print(f"{scenario:<22}{mode:<13}{r['prepare_ms']:>13.3f}"
                  f"{r['upload_ms']:>13.3f}{total_ms:>11.3f}{int(r['tokens']):>12}")


def _kernel_report() -> None:
    print("\n== scatter kernel (CUDA): Triton vs torch reference ==")
    print("kernel us: GPU time (launches replayed from a CUDA graph); call us: one eager call "
          "between CUDA events (host launch overhead included); GB/s counts 8 B read + 4 B "
          "written per token + 32 B per row")
    print(f"{'rows':>7}{'tokens':>10}{'kernel us':>11}{'GB/s':>7}{'call us':>9}"
          f"{'torch ref us':>14}{'ref/call':>10}")
    for batch_size, per_row in ((256, 8192), (4096, 512), (32768, 64), (4096, 1), (256, 1)):
        generator = torch.Generator().manual_seed(0)
        num_tokens = batch_size * per_row
        inputs = {
            "flat_in": torch.randint(0, 150_000, (num_tokens,), generator=generator).cuda(),
            "offsets": torch.arange(0, num_tokens + 1, per_row, dtype=torch.int64).cuda(),
            "req_pool_indices": torch.randperm(batch_size, generator=generator).add(1).cuda(),
            "pool_out": torch.zeros((batch_size + 1, per_row), dtype=torch.int32, device="cuda"),
            "history_lens": torch.full((batch_size,), per_row, dtype=torch.int64, device="cuda"),
            "history_lens_out": torch.zeros(batch_size + 1, dtype=torch.int64, device="cuda"),
        }
        moved = num_tokens * (8 + 4) + batch_size * 32
        kernel_us = graph_time_us(fn=lambda: launch_scatter_req_token_ids_kernel(**inputs)).median
        call_us = event_time_us(fn=lambda: launch_scatter_req_token_ids_kernel(**inputs)).median
        reference_us = event_time_us(
            fn=lambda: scatter_req_token_ids_torch_reference(**inputs)).median
        print(f"{batch_size:>7}{num_tokens:>10}{kernel_us:>11.1f}{moved / kernel_us / 1e3:>7.0f}"
              f"{call_us:>9.1f}{reference_us:>14.1f}{reference_us / call_us:>9.1f}x")
    copy_source = torch.empty(3 << 20, dtype=torch.int64, device="cuda")
    copy_target = torch.empty_like(copy_source)
    copy_us = graph_time_us(fn=lambda: copy_target.copy_(copy_source)).median
    print(f"for scale: a device-to-device copy of 24 MiB (read + write 48 MiB) takes "
          f"{copy_us:.1f} us ({2 * copy_source.nbytes / copy_us / 1e3:.0f} GB/s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--history", type=int, default=8192)
    parser.add_argument("--steps", type=int, default=50)
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    _host_report(num_requests=args.requests, history=args.history, steps=args.steps,
                 device="cuda" if cuda else "cpu")
    if cuda:
        _kernel_report()


if __name__ == "__main__":
    main()
