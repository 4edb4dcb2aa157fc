"""The forensics report file's schema (:mod:`.schema`) and its reader and summary tool:
``python -m sglang.srt.kv_canary.report FILE [--plot OUT.png]`` (see :mod:`.__main__`).

The writer is :mod:`sglang.srt.kv_canary.monitor.report_file`. Standard library only (the plot
imports matplotlib when asked for).
"""
