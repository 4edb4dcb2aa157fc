"""``benchmark/cpu_pinning.py`` without touching real affinities: sysfs CPU lists, the plans (each
scheduler alone on one physical core, the rest elsewhere) and what :func:`pin_server` asks of
``sched_setaffinity`` for every thread of a server's processes."""

import pathlib
import sys

import pytest

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="kv-canary-cpu")

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "benchmark"))

import cpu_pinning  # noqa: E402


@pytest.mark.parametrize("text,cpus", [
    ("0-3,8,10-11\n", {0, 1, 2, 3, 8, 10, 11}), ("5", {5}), ("2,10", {2, 10}), ("", set()),
])
def test_sysfs_cpu_lists(text: str, cpus: set[int]) -> None:
    assert cpu_pinning.parse_cpu_list(text) == cpus


def test_siblings_come_from_sysfs_or_are_the_cpu_alone(tmp_path: pathlib.Path) -> None:
    topology = tmp_path / "cpu7" / "topology"
    topology.mkdir(parents=True)
    (topology / "thread_siblings_list").write_text("7,15\n")
    assert cpu_pinning.thread_siblings(7, sys_cpu=tmp_path) == {7, 15}
    assert cpu_pinning.thread_siblings(3, sys_cpu=tmp_path) == {3}


def test_the_plan_gives_the_scheduler_the_last_physical_core() -> None:
    def siblings(cpu: int) -> frozenset[int]:  # 8 cores, hyperthreads n and n + 8
        return frozenset({cpu % 8, cpu % 8 + 8})

    plan = cpu_pinning.plan_pinning(range(16), siblings=siblings)
    assert plan.scheduler_cpus == {7, 15} and plan.other_cpus == set(range(16)) - {7, 15}
    # only the allowed sibling, and nothing left for the rest: no plan
    assert cpu_pinning.plan_pinning({0, 1, 2, 15}, siblings=siblings).scheduler_cpus == {15}
    assert cpu_pinning.plan_pinning({7, 15}, siblings=siblings) is None
    assert cpu_pinning.plan_pinning(set(), siblings=siblings) is None
    assert plan.describe() == ("scheduler on CPUs 7,15, the rest of the server and the benchmark "
                               "on 0,1,2,3,4,5,6,8,9,10,11,12,13,14")



def test_servers_together_get_a_physical_core_each_and_share_the_rest() -> None:
    def siblings(cpu: int) -> frozenset[int]:  # 8 cores, hyperthreads n and n + 8
        return frozenset({cpu % 8, cpu % 8 + 8})

    plans = cpu_pinning.plan_pinning_apart(range(16), servers=3, siblings=siblings)
    assert [plan.scheduler_cpus for plan in plans] == [{7, 15}, {6, 14}, {5, 13}]
    rest = set(range(16)) - {5, 6, 7, 13, 14, 15}
    assert all(plan.other_cpus == rest for plan in plans)
    assert cpu_pinning.plan_pinning_apart(range(16), servers=1, siblings=siblings)[0] == (
        cpu_pinning.plan_pinning(range(16), siblings=siblings))
    # 8 physical cores hold at most 7 schedulers and the rest
    assert len(cpu_pinning.plan_pinning_apart(range(16), servers=7, siblings=siblings)) == 7
    assert cpu_pinning.plan_pinning_apart(range(16), servers=8, siblings=siblings) is None

def test_pin_server_moves_every_thread_and_this_process() -> None:
    plan = cpu_pinning.PinningPlan(scheduler_cpus=frozenset({7}), other_cpus=frozenset({0, 1}))
    titles = {10: "python3 -m sglang.launch_server --model-path m",
              11: "sglang::scheduler_TP0", 12: "sglang::detokenizer"}
    threads = {10: [10, 20], 11: [11, 21, 22], 12: []}  # 12: its threads could not be read
    calls: list[tuple[int, frozenset[int]]] = []

    def set_affinity(tid: int, cpus) -> None:
        if tid == 22:
            raise ProcessLookupError  # a thread that exited meanwhile
        calls.append((tid, frozenset(cpus)))

    found = cpu_pinning.pin_server(pids=[10, 11, 12], plan=plan, set_affinity=set_affinity,
                                   title=titles.__getitem__, threads=threads.__getitem__)
    assert found == [11]
    assert calls == [(10, {0, 1}), (20, {0, 1}), (11, {7}), (21, {7}), (12, {0, 1}),
                     (0, {0, 1})]


def test_without_a_scheduler_nothing_is_pinned() -> None:
    calls: list[int] = []
    found = cpu_pinning.pin_server(
        pids=[10], plan=cpu_pinning.PinningPlan(scheduler_cpus=frozenset({1}),
                                                other_cpus=frozenset({0})),
        set_affinity=lambda tid, cpus: calls.append(tid), title=lambda pid: "python3",
        threads=lambda pid: [pid])
    assert found == [] and calls == []


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
