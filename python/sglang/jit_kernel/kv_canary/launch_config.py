"""Host-side launch helpers shared by the canary kernels: the interpreter check and the refusal
of CPU tensors, the device's program cap, and the real-data sources and the window slots as
kernel arguments and constexprs."""

from __future__ import annotations

import functools

import torch
import triton
from triton.runtime.interpreter import InterpretedFunction

from sglang.jit_kernel.kv_canary.consts import MAX_REAL_DATA_SOURCES
from sglang.jit_kernel.kv_canary.kernel_inputs import RealDataSources, SlotWindow

PROGRAMS_PER_SM = 4
INTERPRETER_PROGRAMS = 3  # the interpreter runs programs one after another: few, each looping
MAX_WORD_CHUNK = 16  # real-data words read per lane per step when whole rows are folded


def interpreted(kernel: object) -> bool:
    """Whether ``kernel`` runs in Triton's interpreter (``TRITON_INTERPRET=1`` at import)."""
    return isinstance(kernel, InterpretedFunction)


def require_cuda_or_interpreter(
    *, device: torch.device, kernel_interpreted: bool, who_needs: str, reference: str
) -> None:
    """Refuse a compiled Triton launch on tensors that are not on CUDA.

    Args:
        who_needs: the launch and its verb ("the canary sweep kernel needs").
        reference: the torch twin to use on a CPU ("sweep_ref (same signature)").
    Raises:
        ValueError: ``device`` is not CUDA and the kernel is not interpreted (names both ways
            out: the reference, or ``TRITON_INTERPRET=1`` before the kernel is imported).
    """
    if device.type != "cuda" and not kernel_interpreted:
        raise ValueError(
            f"{who_needs} CUDA tensors, got {device}; on a CPU use {reference} or set "
            "TRITON_INTERPRET=1 before importing the kernel module"
        )


@functools.cache
def _cuda_programs(device_index: int) -> int:
    sms = torch.cuda.get_device_properties(device_index).multi_processor_count
    return sms * PROGRAMS_PER_SM


def max_programs(device: torch.device) -> int:
    """The most programs worth launching at once on ``device`` (a few per SM on CUDA)."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return _cuda_programs(index)
    return INTERPRETER_PROGRAMS


def real_data_constexprs(real_data: RealDataSources | None) -> dict[str, int | bool]:
    """``NUM_SOURCES``, ``PARTIAL``, ``WORDS0..3`` and ``WORD_CHUNK`` of the sources: fixed per
    pool (they are constexprs)."""
    words = list(real_data.words_per_row) if real_data is not None else []
    partial = real_data is not None and real_data.partial
    chunk = 1
    if words and not partial:
        chunk = min(triton.next_power_of_2(max(words)), MAX_WORD_CHUNK)
    padded = words + [1] * (MAX_REAL_DATA_SOURCES - len(words))
    return {
        "NUM_SOURCES": len(words),
        "PARTIAL": partial,
        **{f"WORDS{index}": count for index, count in enumerate(padded)},
        "WORD_CHUNK": chunk,
    }


def real_data_args(real_data: RealDataSources | None, *, placeholder: torch.Tensor) -> tuple:
    """``(pointer, rows, row stride)`` of each of the ``MAX_REAL_DATA_SOURCES`` source slots;
    unused slots get ``placeholder`` (never read)."""
    sources = list(real_data.sources) if real_data is not None else []
    args: list = []
    for index in range(MAX_REAL_DATA_SOURCES):
        if index < len(sources):
            words = sources[index]
            args += [words, words.shape[0], words.stride(0)]
        else:
            args += [placeholder, 0, 0]
    return tuple(args)


def window_args(window: SlotWindow | None, *, placeholder: torch.Tensor) -> tuple:
    """``(table, table length, owners, window slots, window)`` of the window slots; without
    them ``placeholder`` (never read) and zeros."""
    if window is None:
        return (placeholder, 0, placeholder, 0, 0)
    return (window.slot_table, window.slot_table.shape[0], window.owners,
            window.num_window_slots, window.window)


def window_constexprs(window: SlotWindow | None,
                      real_data: RealDataSources | None) -> tuple[bool, int]:
    """``(HAS_WINDOW, WINDOWED)``: whether there are window slots, and the bit mask of the
    real-data sources read through them (0 with real data off)."""
    if window is None:
        return (False, 0)
    return (True, window.windowed_sources if real_data is not None else 0)
