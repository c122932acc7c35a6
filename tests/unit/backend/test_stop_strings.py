"""StopStringMatcher: stop strings on streamed text, never emitting any part of a stop string."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tensorrtllm_backend.stop_strings import MAX_STOP_STRINGS, StopStringError, StopStringMatcher, check_stop


def reference(text: str, stops: list[str]) -> tuple[str, bool]:
    """What a stream should emit: the text before the first stop string to complete.

    "First" is by end position (the moment a streaming engine sees it complete); among stop strings
    ending at the same position, the longest (earliest start) wins.
    """
    best: tuple[int, int] | None = None
    for stop in stops:
        i = text.find(stop)  # the first occurrence of a string is also its earliest-ending one
        if i >= 0:
            key = (i + len(stop), -len(stop))
            best = key if best is None else min(best, key)
    if best is None:
        return text, False
    end, neg_len = best
    return text[: end + neg_len], True


def run(stops: list[str], deltas: list[str]) -> tuple[list[str], bool]:
    """Feed deltas until a stop; return the emitted pieces (flushed text last) and whether it stopped."""
    matcher = StopStringMatcher(stops)
    out: list[str] = []
    for delta in deltas:
        text, stopped = matcher.push(delta)
        out.append(text)
        if stopped:
            return out, True
    out.append(matcher.flush())
    return out, False


def test_no_stops_passes_deltas_through() -> None:
    matcher = StopStringMatcher([])
    assert matcher.push("hello ") == ("hello ", False)
    assert matcher.push("") == ("", False)
    assert matcher.flush() == ""


def test_stop_inside_one_delta() -> None:
    assert run(["STOP"], ["hello STOP world"]) == (["hello "], True)


def test_stop_spanning_two_deltas() -> None:
    matcher = StopStringMatcher(["</s>"])
    assert matcher.push("answer</") == ("answer", False)
    assert matcher.push("s>more") == ("", True)
    assert matcher.matched == "</s>"
    assert matcher.push("anything") == ("", True)
    assert matcher.flush() == ""


def test_stop_spanning_many_deltas() -> None:
    assert run(["abcdef"], ["x", "a", "b", "c", "d", "e", "f", "y"]) == (["x", "", "", "", "", "", ""], True)


def test_prefix_held_back_then_released() -> None:
    matcher = StopStringMatcher(["STOP"])
    assert matcher.push("a ST") == ("a ", False)  # "ST" might become "STOP": held back
    assert matcher.push("O") == ("", False)  # "STO" still might
    assert matcher.push("RM") == ("STORM", False)  # it did not: released


def test_prefix_released_when_it_cannot_match() -> None:
    matcher = StopStringMatcher(["STOP"])
    assert matcher.push("a ST") == ("a ", False)
    assert matcher.push("AR") == ("STAR", False)
    assert matcher.push("S") == ("", False)
    assert matcher.flush() == "S"  # end of stream: held-back text is released


def test_partial_restart_inside_stop() -> None:
    # "aab" after "aa": the held text must slide, not reset: "aaab" stops after one "a".
    assert run(["aab"], ["a", "a", "a", "b"]) == (["", "", "a", ""], True)


def test_overlapping_stops_first_to_complete_wins() -> None:
    # "bc" completes (at 3) before "abcd" would (at 4), even though "abcd" starts earlier.
    assert run(["abcd", "bc"], ["abcd"]) == (["a"], True)
    assert run(["abcd", "bc"], ["a", "b", "c", "d"]) == (["", "", "a"], True)


def test_stops_ending_together_longest_wins() -> None:
    matcher = StopStringMatcher(["bc", "abc"])
    assert matcher.push("xabcy") == ("x", True)
    assert matcher.matched == "abc"


def test_stop_that_is_prefix_of_another() -> None:
    assert run(["ab", "abc"], ["xabc"]) == (["x"], True)


def test_unicode_stops() -> None:
    assert run(["ünd"], ["grü", "ün", "d!"]) == (["gr", "ü", ""], True)


@pytest.mark.parametrize(
    ("stops", "code", "index"),
    [
        (["ok", ""], "invalid_value", 1),
        (["ok", 3], "invalid_type", 1),
        ([str(i) for i in range(MAX_STOP_STRINGS + 1)], "invalid_value", None),
    ],
)
def test_check_stop_rejects(stops: list[object], code: str, index: int | None) -> None:
    with pytest.raises(StopStringError) as excinfo:
        check_stop(stops)
    assert (excinfo.value.code, excinfo.value.index) == (code, index)


def test_check_stop_keeps_order_and_drops_duplicates() -> None:
    assert check_stop(["b", "a", "b"]) == ("b", "a")
    assert check_stop([str(i) for i in range(MAX_STOP_STRINGS)]) == tuple(
        str(i) for i in range(MAX_STOP_STRINGS)
    )


def test_held_back_text_is_bounded() -> None:
    """The state is bounded by the longest stop string, however long the stream gets."""
    matcher = StopStringMatcher(["ab" * 5 + "c"])
    emitted = []
    for _ in range(20_000):
        text, stopped = matcher.push("ab")
        assert not stopped
        emitted.append(text)
        assert len(matcher._pending) <= 10
    assert "".join(emitted) + matcher.flush() == "ab" * 20_000


TEXT = st.text(alphabet="abc ü", max_size=40)
STOPS = st.lists(st.text(alphabet="abc ü", min_size=1, max_size=5), min_size=1, max_size=4)


@settings(max_examples=400, deadline=None)
@given(text=TEXT, stops=STOPS, data=st.data())
def test_random_chunkings_match_reference(text: str, stops: list[str], data: st.DataObject) -> None:
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=12)))
    bounds = [0, *cuts, len(text)]
    deltas = [text[a:b] for a, b in itertools.pairwise(bounds)]
    expected, expected_stop = reference(text, stops)

    matcher = StopStringMatcher(stops)
    emitted = ""
    stopped = False
    for delta in deltas:
        piece, stopped = matcher.push(delta)
        emitted += piece
        assert expected.startswith(emitted)  # nothing emitted is ever taken back
        assert not any(stop in emitted for stop in stops)
        if stopped:
            break
    if not stopped:
        emitted += matcher.flush()
    assert stopped == expected_stop
    assert emitted == expected
