"""The shared harness of the benchmark scripts under ``benchmark/``.

One module per job:

- :mod:`.stats`: medians and quartiles of repeated measurements, ratios paired by round;
- :mod:`.timers`: host and CUDA timers, the device's copy bandwidth;
- :mod:`.table`: the side-by-side text table every script prints;
- :mod:`.results`: one result set (one JSON document plus one short text) per benchmark, and
  the machine it ran on;
- :mod:`.options`: command-line values refused with the option, the value and what is allowed;
- :mod:`.deadline`: the time budget of a run;
- :mod:`.configs`: the configurations every benchmark compares (stock SGLang, canary off, off
  with the canary's flags, the canary, every check);
- :mod:`.targets`: the performance targets and their verdicts;
- :mod:`.models`: the dummy-weight model shapes the servers serve;
- :mod:`.workloads`: the server workloads, their payloads and the streamed client that times
  them;
- :mod:`.servers`: real ``sglang.launch_server`` processes started side by side (through
  :mod:`sglang.srt.kv_canary.tools.server`), paused between their rounds, and what their logs
  say;
- :mod:`.interleave`: rounds of every workload on every server, interleaved, within a deadline;
- :mod:`.server_run` and :mod:`.server_report`: the server benchmark's run and its result sets;
- :mod:`.simulated`: the canary on the CPU simulator of a serving loop
  (:mod:`sglang.srt.kv_canary.selfcheck.simulation`), its hooks timed per forward;
- :mod:`.host_modes` and :mod:`.host_rounds`: what the host benchmark drives through the
  simulator, in interleaved rounds;
- :mod:`.kernel_cases` and :mod:`.kernel_timing`: clean canary device states and batches, and
  the timing of the launches on them, for the kernel benchmark.

The scripts put ``benchmark/`` on ``sys.path`` and import this package as ``harness``.
"""
