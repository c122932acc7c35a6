"""The NGram drafter (prompt lookup, ngram.py) and its configuration, without a model: what TensorRT-LLM
1.2.1's NGram pool proposes for a sequence, and how model.yaml's speculative_config is read."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from ngram import NGramConfig, NGramDrafter


def drafter(draft: int = 4, ngram: int = 3, **flags: bool) -> NGramDrafter:
    return NGramDrafter(NGramConfig(max_draft_len=draft, max_matching_ngram_size=ngram, **flags))


def test_the_longest_matching_suffix_proposes_what_followed_it() -> None:
    # suffix (1, 2) was followed by 3 4 1 2; (4, 1, 2) never occurred before
    assert drafter().draft("a", [1, 2, 3, 4, 1, 2], room=10) == [3, 4, 1, 2]
    # a longer pattern wins over a shorter one: (9, 1, 2) -> 8, where (1, 2) alone -> 3 ...
    assert drafter().draft("a", [1, 2, 3, 9, 1, 2, 8, 9, 1, 2], room=10) == [8, 9, 1, 2]


def test_drafts_are_cut_to_the_room_and_to_max_draft_len() -> None:
    tokens = [5, 6, 7, 8, 9, 10, 11, 5, 6]
    assert drafter(draft=4).draft("a", tokens, room=2) == [7, 8]
    assert drafter(draft=3).draft("a", tokens, room=10) == [7, 8, 9]
    assert drafter().draft("a", tokens, room=0) == []


def test_nothing_to_propose() -> None:
    assert drafter().draft("a", [1, 2, 3, 4], room=5) == []  # no suffix occurred before
    assert drafter().draft("a", [1], room=5) == []  # too short for any pattern


def test_oldest_or_newest_continuation() -> None:
    tokens = [1, 2, 3, 4, 1, 5, 1]  # after 1: first 2 3 4 1, later 5 1
    assert drafter(ngram=1).draft("a", tokens, room=10) == [2, 3, 4, 1]
    assert drafter(ngram=1, is_use_oldest=False).draft("a", tokens, room=10) == [5, 1]


def test_continuations_cut_short_are_learned_whole_at_a_later_step() -> None:
    pool = drafter(draft=4, ngram=1, is_public_pool=False)
    assert pool.draft("a", [5, 1, 9], room=10) == []
    # (1,) was followed by only (9,) at the first step; now by 9 1 2 3, which replaces it
    assert pool.draft("a", [5, 1, 9, 1, 2, 3, 4, 1], room=10) == [9, 1, 2, 3]


def test_public_pool_is_shared_private_pools_are_not() -> None:
    public = drafter()
    public.draft("a", [1, 2, 3, 4, 5], room=10)
    assert public.draft("b", [7, 1, 2], room=10) == [3, 4, 5]
    private = drafter(is_public_pool=False)
    private.draft("a", [1, 2, 3, 4, 5], room=10)
    assert private.draft("b", [7, 1, 2], room=10) == []
    assert private.pool_size() > 0
    private.release("a")
    private.release("b")
    assert private.pool_size() == 0


def test_config_from_a_mapping_or_an_object() -> None:
    block = {
        "decoding_type": "NGram",
        "max_draft_len": 5,
        "max_matching_ngram_size": 4,
        "is_public_pool": False,
    }
    expected = NGramConfig(max_draft_len=5, max_matching_ngram_size=4, is_public_pool=False)
    assert NGramConfig.read(block) == expected
    validated = SimpleNamespace(**{**block, "is_keep_all": True, "is_use_oldest": True})
    assert NGramConfig.read(validated) == expected
    assert NGramConfig.read(None) is None
    # 1.2's defaults: max_matching_ngram_size 2, every flag true
    assert NGramConfig.read({"decoding_type": "NGram", "max_draft_len": 3}) == NGramConfig(
        3, 2, True, True, True
    )


@pytest.mark.parametrize(
    ("block", "message"),
    [
        ({"decoding_type": "Eagle", "max_draft_len": 3}, "decoding_type 'Eagle' is not served"),
        ({"decoding_type": "NGram"}, "max_draft_len must be > 0 for NGram"),
        ({"decoding_type": "NGram", "max_draft_len": 0}, "max_draft_len must be > 0 for NGram"),
        (
            {"decoding_type": "NGram", "max_draft_len": 2, "max_matching_ngram_size": 0},
            "max_matching_ngram_size",
        ),
    ],
)
def test_config_refusals(block: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        NGramConfig.read(block)
