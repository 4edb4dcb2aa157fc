"""GPU cost of the host tier's record copies beside SGLang's own hierarchical-cache copies.

With ``--enable-hierarchical-cache`` SGLang copies a page's KV device -> host
(``MHATokenToKVPoolHost.backup_from_device_all_layer``) and host -> device, layer by layer
(``load_to_device_per_layer``, ``--hicache-io-backend kernel``). The canary adds, per backup,
its records and origins (``HostTierRecords.on_backup``: two index copies) and, per load, the
records' restore and the fingerprints' re-key (``restore_started`` + ``rekey_restored``: two
index copies and one Triton launch). This times both sides on the same slots with CUDA events
on one stream, for a Llama-3-8B-shaped pool (32 layers, 8 KV heads of 128, bf16: 128 KiB per
token), with ``partial`` and ``all`` real data, and prints per token the µs of each side and
their ratio, as the median over repeats with the 10th-90th percentile spread (both sides index
slot by slot: a page of ``P`` tokens costs ``P`` times a token).

Needs a CUDA GPU and SGLang. Usage: ``python benchmark/bench_host_tier.py [--tokens 4096]
[--repeats 30] [--out DIR]`` (writes ``host_tier.txt`` and ``host_tier.json`` there).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics

import torch

from sglang.srt.kv_canary.config import CanaryConfig, CanaryMode, RealDataMode
from sglang.srt.kv_canary.pools import canary_pool_for
from sglang.srt.kv_canary.pools.seam import PoolContext
from sglang.srt.kv_canary.runner.device_state import allocate_device_state
from sglang.srt.kv_canary.runner.host_tier import HostTierRecords
from sglang.srt.kv_canary.runner.kernels import KernelBackend, load_kernels
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
from sglang.srt.mem_cache.memory_pool_host import MHATokenToKVPoolHost

_LAYERS, _HEADS, _HEAD_DIM = 32, 8, 128


def _timed(work, *, repeats: int) -> list[float]:
    """µs of ``work()`` per call on the current stream, one CUDA-event pair per repeat."""
    work()  # compile / warm up
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        work()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0)
    return times


def _summary(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {"median": statistics.median(ordered), "p10": ordered[len(ordered) // 10],
            "p90": ordered[(len(ordered) * 9) // 10]}


def _pools(*, tokens: int) -> tuple[MHATokenToKVPool, MHATokenToKVPoolHost, ReqToTokenPool]:
    """One device pool of ``4 * tokens`` slots and its host pool (twice as large, pinned: SGLang
    registers its pages once per process, so every measurement shares them)."""
    device_pool = MHATokenToKVPool(4 * tokens, page_size=1, dtype=torch.bfloat16,
                                   head_num=_HEADS, head_dim=_HEAD_DIM, layer_num=_LAYERS,
                                   device="cuda", enable_memory_saver=False,
                                   enable_alt_stream=False)
    host_pool = MHATokenToKVPoolHost(device_pool, 2.0, 0, 1, "layer_first")
    req_pool = ReqToTokenPool(size=8, max_context_len=tokens + 8, device="cuda",
                              enable_memory_saver=False)
    return device_pool, host_pool, req_pool


def _measure(*, pools: tuple, tokens: int, repeats: int, real_data: RealDataMode) -> dict:
    """µs per token of each side's backup and load of ``tokens`` contiguous slots (the copies
    index slot by slot, so a page of ``P`` tokens costs ``P`` times a token)."""
    device_pool, host_pool, req_pool = pools
    pool = canary_pool_for(req_to_token_pool=req_pool, token_to_kv_pool=device_pool,
                           context=PoolContext(attention_backends=("triton", "triton")))
    state = allocate_device_state(config=CanaryConfig(mode=CanaryMode.LOG, real_data=real_data),
                                  pool=pool, req_to_token=req_pool.req_to_token)
    tier = HostTierRecords(state=state, num_host_slots=host_pool.size,
                           rekey=load_kernels(KernelBackend.TRITON).rekey_loaded)
    device_slots = torch.arange(1, 1 + tokens, device="cuda")
    loaded_slots = device_slots + tokens + 1
    host_slots = torch.arange(tokens, device="cuda")

    def sglang_backup() -> None:
        host_pool.backup_from_device_all_layer(device_pool, host_slots, device_slots, "kernel")

    def canary_backup() -> None:
        tier.on_backup(host_slots=host_slots, device_slots=device_slots)

    def sglang_load() -> None:
        for layer in range(_LAYERS):
            host_pool.load_to_device_per_layer(device_pool, host_slots, loaded_slots, layer,
                                               "kernel")

    def canary_load() -> None:
        tier.on_load_started(host_slots=host_slots, device_slots=loaded_slots)
        tier.restore_started()
        tier.rekey_restored()

    result = {"tokens": tokens, "real_data": real_data.value}
    for name, work in (("sglang_backup", sglang_backup), ("canary_backup", canary_backup),
                       ("sglang_load", sglang_load), ("canary_load", canary_load)):
        result[name] = _summary([t / tokens for t in _timed(work, repeats=repeats)])
    for side in ("backup", "load"):
        result[f"{side}_ratio"] = (result[f"canary_{side}"]["median"]
                                   / result[f"sglang_{side}"]["median"])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("."))
    args = parser.parse_args()
    pools = _pools(tokens=args.tokens)
    results = [_measure(pools=pools, tokens=args.tokens, repeats=args.repeats, real_data=mode)
               for mode in (RealDataMode.PARTIAL, RealDataMode.ALL)]
    lines = [f"host tier record copies, {torch.cuda.get_device_name()}, {args.tokens} tokens per "
             f"copy, Llama-3-8B-shaped pool ({_LAYERS} layers x {_HEADS} KV heads x "
             f"{_HEAD_DIM}, bf16, 128 KiB per token), µs per token: median [p10, p90] over "
             f"{args.repeats} repeats (a page of P tokens: P times)",
             "real_data  SGLang backup          canary backup          ratio   "
             "SGLang load            canary load            ratio"]
    for r in results:
        cells = []
        for side in ("backup", "load"):
            for who in ("sglang", "canary"):
                s = r[f"{who}_{side}"]
                cells.append(f"{s['median']:7.4f} [{s['p10']:.4f}, {s['p90']:.4f}]")
            cells.append(f"{r[f'{side}_ratio']:6.4f}")
        lines.append(f"{r['real_data']:9s}  " + "  ".join(cells))
    text = "\n".join(lines)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "host_tier.txt").write_text(text + "\n")
    (args.out / "host_tier.json").write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
