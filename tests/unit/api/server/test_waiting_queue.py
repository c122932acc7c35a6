"""The shared waiting queue's table (api/server/waiting_queue.py), without servers: several processes
are stood in for by queues over one file, each with its own pid."""

from __future__ import annotations

from pathlib import Path

import pytest

from trtllm_service.api.server.waiting_queue import ADMITTED, CAPACITY, FULL, SharedQueue

DEAD: set[int] = set()


def queue(path: Path, pid: int) -> SharedQueue:
    return SharedQueue(path / "queue", pid=pid, alive=lambda other: other not in DEAD)


@pytest.fixture(autouse=True)
def _nobody_dead() -> None:
    DEAD.clear()


def test_requests_start_at_once_while_slots_are_free_then_wait(tmp_path: Path) -> None:
    q = queue(tmp_path, 101)
    assert [q.enter(1, 0, slots=2, max_waiting=10) for _ in range(2)] == [ADMITTED, ADMITTED]
    third = q.enter(1, 0, slots=2, max_waiting=10)
    assert third >= 0
    assert q.counts() == (2, 1)
    assert q.admit(2, {third}) == []  # no slot free yet
    q.release()
    assert q.admit(2, {third}) == [third]
    assert q.counts() == (2, 0)


def test_a_higher_priority_starts_before_earlier_lower_ones_and_equal_ones_keep_arrival_order(
    tmp_path: Path,
) -> None:
    q = queue(tmp_path, 101)
    assert q.enter(1, 0, slots=1, max_waiting=10) == ADMITTED
    low = q.enter(1, 5, slots=1, max_waiting=10)
    first, second = (q.enter(1, 0, slots=1, max_waiting=10) for _ in range(2))
    urgent = q.enter(0, 9, slots=1, max_waiting=10)  # the priority tier ranks before any priority
    waiting = {low, first, second, urgent}
    order = []
    for _ in range(4):
        q.release()
        started = q.admit(1, waiting)
        assert len(started) == 1
        order += started
        waiting -= set(started)
    assert order == [urgent, first, second, low]


def test_a_newcomer_does_not_take_a_free_slot_from_a_better_ranked_waiting_request(tmp_path: Path) -> None:
    a, b = queue(tmp_path, 101), queue(tmp_path, 202)
    assert a.enter(1, 0, slots=1, max_waiting=10) == ADMITTED
    waiting = b.enter(1, 0, slots=1, max_waiting=10)
    a.release()  # b has not looked yet
    assert a.enter(1, 0, slots=1, max_waiting=10) >= 0  # equal priority, later: it waits
    assert a.enter(0, 0, slots=1, max_waiting=10) == ADMITTED  # a better rank takes the slot
    assert b.admit(1, {waiting}) == []


def test_each_process_starts_only_its_own_requests(tmp_path: Path) -> None:
    a, b = queue(tmp_path, 101), queue(tmp_path, 202)
    assert a.enter(1, 0, slots=1, max_waiting=10) == ADMITTED
    of_b = b.enter(1, 0, slots=1, max_waiting=10)
    of_a = a.enter(1, 0, slots=1, max_waiting=10)
    a.release()
    assert a.admit(1, {of_a}) == []  # b's request ranks first: the slot is its
    assert b.admit(1, {of_b}) == [of_b]
    assert a.counts() == (1, 1)


def test_the_count_bound_refuses_and_leaving_frees_the_place(tmp_path: Path) -> None:
    q = queue(tmp_path, 101)
    assert q.enter(1, 0, slots=1, max_waiting=2) == ADMITTED
    first = q.enter(1, 0, slots=1, max_waiting=2)
    q.enter(1, 0, slots=1, max_waiting=2)
    assert q.enter(1, 0, slots=1, max_waiting=2) == FULL
    assert q.leave(first) is True
    assert q.leave(first) is False
    assert q.enter(1, 0, slots=1, max_waiting=2) >= 0
    assert q.enter(1, 0, slots=1, max_waiting=10**9) >= 0  # capped at CAPACITY, not refused
    assert CAPACITY >= 1024


def test_zero_waiting_places_refuses_whenever_the_slots_are_busy(tmp_path: Path) -> None:
    q = queue(tmp_path, 101)
    assert q.enter(1, 0, slots=1, max_waiting=0) == ADMITTED
    assert q.enter(1, 0, slots=1, max_waiting=0) == FULL


def test_a_dead_process_holds_no_slot_and_no_place(tmp_path: Path) -> None:
    a, b = queue(tmp_path, 101), queue(tmp_path, 202)
    assert a.enter(1, 0, slots=1, max_waiting=1) == ADMITTED
    a.enter(1, 0, slots=1, max_waiting=1)
    mine = b.enter(1, 0, slots=1, max_waiting=1)
    assert mine == FULL
    DEAD.add(101)
    assert b.counts() == (0, 0)
    assert b.enter(1, 0, slots=1, max_waiting=1) == ADMITTED


def test_the_version_changes_with_every_write(tmp_path: Path) -> None:
    q = queue(tmp_path, 101)
    before = q.version()
    q.enter(1, 0, slots=1, max_waiting=1)
    after = q.version()
    assert after != before
    q.release()
    assert q.version() != after
    q.close()


def test_a_request_of_several_engine_requests_takes_as_many_slots_and_keeps_its_rank(tmp_path: Path) -> None:
    a, b = queue(tmp_path, 101), queue(tmp_path, 202)
    assert a.enter(1, 0, slots=4, max_waiting=10, weight=3) == ADMITTED  # n=3: three of four slots
    assert a.counts() == (3, 0)
    pair = b.enter(1, 0, slots=4, max_waiting=10, weight=2)  # two do not fit in the one left
    single = a.enter(1, 0, slots=4, max_waiting=10)  # fits, but does not pass the earlier pair
    assert pair >= 0 and single >= 0
    assert a.admit(4, {single}) == []
    a.release(3)
    assert b.admit(4, {pair}) == [pair]
    assert a.admit(4, {single}) == [single]
    assert a.counts() == (3, 0)
    b.release(2)
    a.release()
    assert a.counts() == (0, 0)


def test_a_request_larger_than_the_engine_runs_alone(tmp_path: Path) -> None:
    q = queue(tmp_path, 101)
    assert q.enter(1, 0, slots=2, max_waiting=10, weight=8) == ADMITTED  # capped at the two slots
    assert q.counts() == (2, 0)
    waiting = q.enter(1, 0, slots=2, max_waiting=10)
    q.release(2)
    assert q.admit(2, {waiting}) == [waiting]


class _LongWay(SharedQueue):
    """`enter` without its short way: the reference the short way must agree with."""

    def enter(self, tier: int, priority: int, slots: int, max_waiting: int, weight: int = 1) -> int:
        from trtllm_service.api.server.waiting_queue import weight_of

        with self._locked() as table:
            return self._enter(table, tier, priority, slots, max_waiting, weight_of(weight, slots))


def test_the_short_way_in_answers_as_the_whole_way_does(tmp_path: Path) -> None:
    """2,000 random arrivals, releases, departures and starts over three processes, one of which dies
    half-way (its slots and places still in the table) and is replaced by a fourth, on two tables:
    one whose `enter` takes its short way where it can, one that always takes the whole way. Every
    answer, count and version agrees (a version that moves on one table moves on the other)."""
    import random

    rng = random.Random(46)
    sides = []
    for name, kind in (("short", SharedQueue), ("long", _LongWay)):
        (tmp_path / name).mkdir()
        sides.append(
            [
                kind(tmp_path / name / "queue", pid=pid, alive=lambda other: other not in DEAD)
                for pid in (101, 202, 303, 404)
            ]
        )
    running: list[tuple[int, int]] = []  # (process, weight) of the requests that started
    waiting: list[tuple[int, int, int]] = []  # (process, arrival number, weight)
    short_ways, live = 0, [0, 1, 2]
    for step in range(2000):
        if step == 1000:  # 303 dies with what it holds; 404 starts
            DEAD.add(303)
            running = [item for item in running if item[0] != 2]
            waiting = [item for item in waiting if item[0] != 2]
            live = [0, 1, 3]
        action, who = rng.random(), rng.choice(live)
        if action < 0.45:
            tier, priority, weight = rng.randrange(3), rng.randrange(-2, 3), rng.choice((1, 1, 1, 2, 5))
            fast_before = sides[0][who]._mine is not None
            answers = [side[who].enter(tier, priority, 4, 6, weight) for side in sides]
            short_ways += fast_before and answers[0] == ADMITTED
            assert answers[0] == answers[1]
            if answers[0] == ADMITTED:
                running.append((who, min(weight, 4)))
            elif answers[0] != FULL:
                waiting.append((who, answers[0], min(weight, 4)))
        elif action < 0.75 and running:
            process, weight = running.pop(rng.randrange(len(running)))
            for side in sides:
                side[process].release(weight)
        elif action < 0.85 and waiting:
            process, seq, _ = waiting.pop(rng.randrange(len(waiting)))
            assert sides[0][process].leave(seq) == sides[1][process].leave(seq)
        else:
            mine = {seq for process, seq, _ in waiting if process == who}
            started = [side[who].admit(4, mine) for side in sides]
            assert started[0] == started[1]
            for seq in started[0]:
                entry = next(item for item in waiting if item[:2] == (who, seq))
                waiting.remove(entry)
                running.append((who, entry[2]))
        assert sides[0][0].counts() == sides[1][0].counts()
        assert sides[0][0].version() == sides[1][0].version()
    assert short_ways > 200  # the short way was taken, and often
