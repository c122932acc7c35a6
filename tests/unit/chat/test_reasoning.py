"""The reasoning parsers: think blocks split from the content, whole and streamed in any chunks."""

from __future__ import annotations

import random

import pytest

from trtllm_service.chat.reasoning import STYLES, ReasoningSplitter, split, style_of

R1, QWEN3 = STYLES["deepseek-r1"], STYLES["qwen3"]


@pytest.mark.parametrize(
    ("style", "text", "expected"),
    [
        # deepseek-r1: the template opened <think>: what comes before </think> is reasoning
        (R1, "plan it</think>The answer.", ("plan it", "The answer.")),
        (R1, "<think>plan it</think>\n\nThe answer.", ("plan it", "\n\nThe answer.")),
        (R1, "still thinking", ("still thinking", None)),  # no tags: cut off while thinking
        (R1, "<think>unterminated", ("unterminated", None)),
        (R1, "a</think>b</think><think>c", ("a", "b</think><think>c")),  # after the end: content
        (R1, "</think>only content", (None, "only content")),
        (R1, "", (None, "")),
        # qwen3: both tags, written by the model
        (QWEN3, "<think>plan it</think>The answer.", ("plan it", "The answer.")),
        (QWEN3, "no tags at all", (None, "no tags at all")),
        (QWEN3, "plan it</think>The answer.", (None, "plan it</think>The answer.")),  # needs <think>
        (QWEN3, "Sure. <think>hm</think>Done", ("hm", "Sure. Done")),
        (QWEN3, "<think>unterminated", ("unterminated", None)),
        (QWEN3, "<think></think>empty block", (None, "empty block")),
        (QWEN3, "a <thin", (None, "a <thin")),
    ],
)
def test_split_whole(style: object, text: str, expected: tuple[str | None, str | None]) -> None:
    assert split(style, text) == expected  # type: ignore[arg-type]  # a ReasoningStyle, parametrized as object


def streamed(style: object, chunks: list[str]) -> tuple[str, str]:
    splitter = ReasoningSplitter(style)  # type: ignore[arg-type]  # a ReasoningStyle, parametrized as object
    reasoning = content = ""
    for chunk in chunks:
        r, c = splitter.push(chunk)
        reasoning, content = reasoning + r, content + c
    r, c = splitter.flush()
    return reasoning + r, content + c


TEXTS = [
    "<think>Let me think: 2 < 3 and </ is no tag.</think>\n\nYes, <think> here is content.",
    "plan</think>answer",
    "<thinking is not the tag</think> but this ends it",
    "<think>open and never closed </thi",
    "no reasoning </think",
    "",
]


@pytest.mark.parametrize("style", [R1, QWEN3], ids=lambda s: s.name)
@pytest.mark.parametrize("text", TEXTS)
def test_streamed_in_any_chunks_equals_whole(style: object, text: str) -> None:
    reasoning, content = split(style, text)  # type: ignore[arg-type]  # a ReasoningStyle, parametrized as object
    whole = (reasoning or "", content or "")
    assert streamed(style, list(text)) == whole  # one character per chunk: every tag split
    rng = random.Random(text)
    for _ in range(50):
        cuts = sorted(rng.sample(range(len(text) + 1), min(len(text) + 1, rng.randint(0, 4))))
        chunks = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        assert streamed(style, chunks) == whole, chunks


def test_a_split_tag_is_held_back_until_the_next_chunk_says() -> None:
    splitter = ReasoningSplitter(R1)
    assert splitter.push("<th") == ("", "")  # maybe the optional opening tag
    assert splitter.push("ink>step one </thi") == ("step one ", "")
    assert splitter.push("nk>The") == ("", "The")
    assert splitter.push(" end") == ("", " end")

    splitter = ReasoningSplitter(QWEN3)
    assert splitter.push("Hi <") == ("", "Hi ")
    assert splitter.push("b>") == ("", "<b>")  # not a tag after all: released as it was
    assert splitter.push("<think>x</") == ("x", "")
    assert splitter.flush() == ("</", "")  # the answer ended inside the block


def test_style_names() -> None:
    assert style_of(None) is None
    assert style_of("qwen3") is QWEN3
    with pytest.raises(ValueError, match="deepseek-r1, qwen3"):
        style_of("o1")
