"""Guides checked as the engine uses them (llguidance over the model's tokenizer, its default
limits, its first steps): what compiles alone but fails in the engine is a short 400 naming the
field, and a large grammar is checked without holding the event loop. Real llguidance, and the
demo model's real tokenizer."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

from trtllm_service.packing.demo_model import build_demo_model
from trtllm_service.relay import guided
from trtllm_service.relay.guided import GuideChecker, GuideRequestError, choice_guide


@pytest.fixture(scope="module")
def checker(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from transformers import AutoTokenizer

    model = build_demo_model(tmp_path_factory.mktemp("demo") / "model")
    tokenizer = AutoTokenizer.from_pretrained(model, local_files_only=True)
    made = GuideChecker(tokenizer, len(tokenizer))
    yield made
    made.close()


def alternatives(count: int) -> str:
    return "root ::= " + " | ".join(f'"a" "{i}"' for i in range(count))


REFUSED = [
    (choice_guide([f"c{i}" for i in range(2001)], "guided_choice"), "guided_choice", "max is 2000"),
    (("ebnf_grammar", alternatives(2100)), "guided_grammar", "max is 2000"),
    (("regex", "(x{1000}){1000}"), "guided_regex", "lexer"),
    (("json_schema", json.dumps({"type": "nope"})), "tools", "nope"),
    (("ebnf_grammar", alternatives(30_000) + " | ( "), "guided_grammar", "GBNF"),
]


@pytest.mark.parametrize(("guide", "param", "says"), REFUSED, ids=[r[1] + "-" + r[2] for r in REFUSED])
def test_what_the_engine_refuses_is_a_short_error_naming_the_field(
    checker: GuideChecker, guide: tuple[str, str], param: str, says: str
) -> None:
    with pytest.raises(GuideRequestError) as info:
        checker.check_now(guide, param)
    message = str(info.value)
    assert info.value.param == param and says in message, message
    assert message.startswith(f"'{param}' cannot be used for guided decoding: ")
    assert len(message) <= 400 and "<state>" not in message, message


GOOD = [
    choice_guide([f"c{i}" for i in range(1990)], "guided_choice"),
    ("ebnf_grammar", alternatives(1990)),
    ("regex", "(x{100}){100}"),
    ("json", ""),
    (
        "json_schema",
        json.dumps({"type": "object", "properties": {"c": {"enum": [f"v{i}" for i in range(3000)]}}}),
    ),
    ("regex", ".*"),
]


@pytest.mark.parametrize("guide", GOOD, ids=range(len(GOOD)))
def test_what_the_engine_serves_passes_and_is_remembered(
    checker: GuideChecker, guide: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    checker.check_now(guide, "guided")
    compiled = _counted_checks(monkeypatch)
    checker.check_now(guide, "guided")
    assert compiled == []  # remembered, not compiled again (a time bound flakes on a busy machine)


def _counted_checks(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """llguidance's check, its calls counted from here on (the list of their arguments)."""
    compiled: list[Any] = []
    check = guided.grammars.check

    def counted(*args: Any, **kwargs: Any) -> None:
        compiled.append(args)
        check(*args, **kwargs)

    monkeypatch.setattr(guided.grammars, "check", counted)
    return compiled


def test_a_refused_guide_is_remembered_and_refused_again_at_once(
    checker: GuideChecker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The regex llguidance takes 1.7-2.3 s to refuse (tests/e2e/test_hostile_input): a client that
    repeats it gets the same 400 from a lookup, naming its own field, and takes no checker thread."""
    guide = ("regex", "(y{1000}){1000}")
    compiled = _counted_checks(monkeypatch)
    with pytest.raises(GuideRequestError) as first:
        asyncio.run(checker.check(guide, "guided_regex"))
    assert len(compiled) == 1

    async def again() -> BaseException | None:
        task = asyncio.ensure_future(checker.check(guide, "response_format"))
        await asyncio.sleep(0)
        assert task.done()  # a check in a thread would still be running here
        return task.exception()

    second = asyncio.run(again())
    assert isinstance(second, GuideRequestError) and second.param == "response_format"
    assert str(second) == str(first.value).replace("'guided_regex'", "'response_format'")
    with pytest.raises(GuideRequestError):
        checker.check_now(guide, "guided_regex")
    assert len(compiled) == 1  # neither the loop's refusal nor check_now's compiled it again
    longer = ("regex", "(y{1000}){1000}" + "|z" * GuideChecker.REMEMBERED_CHARS)
    for _ in range(2):
        with pytest.raises(GuideRequestError):
            checker.check_now(longer, "guided_regex")
    assert len(compiled) == 3  # too long to remember: checked each time


def test_a_large_grammar_is_checked_off_the_event_loop(checker: GuideChecker) -> None:
    """A 540 KB grammar takes the checker seconds; the event loop meanwhile keeps running (it held
    the loop 4.8 s when the request's model compiled it)."""
    grammar = "root ::= " + " | ".join(f'"w{i}"' for i in range(50_000))

    async def check_while_ticking() -> tuple[float, list[float]]:
        gaps: list[float] = []

        async def tick() -> None:
            last = time.monotonic()
            while True:
                await asyncio.sleep(0.01)
                gaps.append(time.monotonic() - last)
                last = time.monotonic()

        ticker = asyncio.create_task(tick())
        started = time.monotonic()
        with pytest.raises(GuideRequestError, match="max is 2000"):
            await checker.check(("ebnf_grammar", grammar), "guided_grammar")
        took = time.monotonic() - started
        ticker.cancel()
        return took, gaps

    took, gaps = asyncio.run(check_while_ticking())
    longest = max(gaps)
    print(f"checked in {took:.2f} s; {len(gaps)} ticks, the event loop's longest wait {longest:.3f} s")
    assert took > 0.5  # it was heavy work
    # On the loop, the check would be one wait as long as the check itself. Off it, the loop ticks
    # throughout; its longest wait is a collection of the grammar's garbage holding the GIL (~0.3 s
    # here, 1.2 s once in CI on a busy machine, of a 7.4 s check), so the bound is relative.
    assert longest < took / 3
    assert len(gaps) >= 10
