"""The order in which ``python -m bench fanout`` runs its sides, backends and worker counts
(bench/fanout.py ``blocks``): with ``--compare`` the two sides of each W run back to back, which
of them goes first alternating, so the machine's drift over a run does not read as a difference
between the sides."""
from __future__ import annotations

from pathlib import Path

from bench.fanout import Side, blocks

THIS, OTHER = Side("this", Path("/a")), Side("other", Path("/b"))


def test_one_side_keeps_one_stack_per_backend_for_every_worker_count() -> None:
    assert blocks(0, [THIS], ["single", "cluster"], [1, 4, 16]) == [
        (THIS, "single", [1, 4, 16]), (THIS, "cluster", [1, 4, 16])]
    assert blocks(1, [THIS], ["single", "cluster"], [1, 4, 16]) == [
        (THIS, "cluster", [16, 4, 1]), (THIS, "single", [16, 4, 1])]


def test_two_sides_run_each_worker_count_back_to_back_in_abba_order() -> None:
    got = blocks(0, [THIS, OTHER], ["single"], [1, 4, 16])
    assert [(s.name, b, ws) for s, b, ws in got] == [
        ("this", "single", [1]), ("other", "single", [1]),
        ("other", "single", [4]), ("this", "single", [4]),
        ("this", "single", [16]), ("other", "single", [16])]


def test_every_round_runs_every_side_backend_and_worker_count_once() -> None:
    for rnd in range(4):
        got = blocks(rnd, [THIS, OTHER], ["single", "cluster"], [1, 2, 16])
        runs = sorted((s.name, b, n) for s, b, ws in got for n in ws)
        assert runs == sorted((s, b, n) for s in ("this", "other") for b in ("single", "cluster") for n in (1, 2, 16))
        firsts = [got[i][0].name for i in range(0, len(got), 2)]
        assert firsts.count("this") in (len(firsts) // 2, (len(firsts) + 1) // 2), firsts


def test_the_side_that_goes_first_alternates_between_rounds() -> None:
    assert blocks(0, [THIS, OTHER], ["single"], [1])[0][0] is THIS
    assert blocks(1, [THIS, OTHER], ["single"], [1])[0][0] is OTHER
