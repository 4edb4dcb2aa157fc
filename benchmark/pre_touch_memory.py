"""Touch N GiB of host memory once, then free it, so a machine whose memory grows on first use
has grown before the servers start.

On the GPU host's microVMs the guest's RAM starts small and grows as it is used (``MemTotal``
in ``/proc/meminfo`` starts far below the machine's memory). A server started early then
takes memory that the machine adds while it runs, a later one memory added before. Running
this before ``bench_server_overhead.py`` takes that difference away, to test whether it is why
some server processes run SGLang's host code slower than others. It prints ``MemTotal`` before
and after and how long the touch took.

Usage: ``python benchmark/pre_touch_memory.py --gib 100``
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

import numpy as np

_MEMINFO = pathlib.Path("/proc/meminfo")
_CHUNK_BYTES = 1 << 30


def mem_total_kib(meminfo: str) -> int | None:
    """``MemTotal`` in KiB from the text of ``/proc/meminfo`` (None: not there)."""
    for line in meminfo.splitlines():
        name, _, value = line.partition(":")
        if name == "MemTotal":
            return int(value.split()[0])
    return None


def touch(*, gib: float) -> float:
    """Allocate ``gib`` GiB in chunks of at most 1 GiB, write every byte, free it all; the
    seconds it took."""
    started = time.monotonic()
    left = int(gib * (1 << 30))
    chunks = []
    while left > 0:
        size = min(left, _CHUNK_BYTES)
        chunk = np.empty(size, dtype=np.uint8)
        chunk.fill(1)
        chunks.append(chunk)
        left -= size
    chunks.clear()
    return time.monotonic() - started


def _mem_total_text() -> str:
    try:
        kib = mem_total_kib(_MEMINFO.read_text())
    except OSError:
        kib = None
    return "unknown" if kib is None else f"{kib / (1 << 20):.1f} GiB"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gib", type=float, required=True,
                        help="GiB of memory to touch (> 0; leave room for the rest of the machine)")
    options = parser.parse_args(argv)
    if not options.gib > 0:
        parser.error(f"--gib={options.gib} is invalid; allowed: > 0")
    before = _mem_total_text()
    seconds = touch(gib=options.gib)
    print(f"pre-touch: {options.gib:g} GiB written and freed in {seconds:.1f} s; MemTotal "
          f"{before} before, {_mem_total_text()} after", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
