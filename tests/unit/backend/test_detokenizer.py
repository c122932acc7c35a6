"""The incremental detokenizer the service and the postprocessing model share, without Triton.

Reference texts come from the tokenizer's own one-shot decode of all ids.
"""

from __future__ import annotations

import random
from typing import Any

from tensorrtllm_backend.detokenizer import LOOK_BACK, IncrementalDetokenizer
from tests.support import HARD_TEXT


def whole(tokenizer: Any, ids: list[int]) -> str:
    return tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)


def pieces(tokenizer: Any, ids: list[int], sizes: list[int]) -> list[str]:
    decoder = IncrementalDetokenizer(tokenizer)
    out, position = [], 0
    for size in sizes:
        out.append(decoder.push(ids[position : position + size]))
        position += size
    return out


def test_hard_text_one_token_and_random_chunks_at_a_time(tokenizer: Any) -> None:
    ids = tokenizer.encode(HARD_TEXT, add_special_tokens=False)
    assert "\ufffd" in "".join(tokenizer.decode([i]) for i in ids), (
        "the text must split characters across tokens"
    )
    rng = random.Random(7)
    for sizes in ([1] * len(ids), [rng.randint(1, 9) for _ in range(len(ids))], [len(ids)]):
        out = pieces(tokenizer, ids, sizes)
        assert "".join(out) == HARD_TEXT == whole(tokenizer, ids)
        assert not any("\ufffd" in piece for piece in out)


def test_a_trailing_incomplete_character_is_never_emitted(tokenizer: Any) -> None:
    ids = tokenizer.encode("ok 𝄞", add_special_tokens=False)  # a 4-byte character, one token per byte
    cut = ids[:-1]  # its last byte missing
    assert whole(tokenizer, cut).endswith("\ufffd")
    assert "".join(pieces(tokenizer, cut, [1] * len(cut))) == "ok "


def test_a_long_run_of_stray_bytes_is_held_back_at_most_look_back_tokens(tokenizer: Any) -> None:
    stray = tokenizer.encode("𝄞", add_special_tokens=False)[-1:]
    assert whole(tokenizer, stray) == "\ufffd", "a lone continuation byte"
    words = tokenizer.encode(" words", add_special_tokens=False)
    ids = words + stray * (3 * LOOK_BACK) + words
    decoder = IncrementalDetokenizer(tokenizer)
    emitted, first_stray_out = [], None
    for n, token in enumerate(ids):
        piece = decoder.push([token])
        emitted.append(piece)
        if "\ufffd" in piece and first_stray_out is None:
            first_stray_out = n
    assert first_stray_out is not None and first_stray_out - len(words) < LOOK_BACK + 1
    assert "".join(emitted) == whole(tokenizer, ids)


def test_empty_pushes_and_special_tokens(tokenizer: Any) -> None:
    decoder = IncrementalDetokenizer(tokenizer)
    assert decoder.push([]) == ""
    eot = tokenizer.convert_tokens_to_ids("<|eot_id|>")
    ids = tokenizer.encode("Hi", add_special_tokens=False)
    assert decoder.push(ids) + decoder.push([eot]) == "Hi"


def test_byte_level_tokenizers_take_the_byte_path_with_the_window_paths_pieces(tokenizer: Any) -> None:
    """Random ids (added and special tokens, bytes that split characters or never complete one, ids
    past the vocabulary), pushed in random runs: the byte path emits exactly the window path's pieces,
    which the Rust tokenizer's decode makes."""
    assert IncrementalDetokenizer(tokenizer)._table is not None, "the demo tokenizer is byte-level"
    rust = tokenizer.backend_tokenizer
    vocab = rust.get_vocab_size(with_added_tokens=True)
    added = list(rust.get_added_tokens_decoder())
    stray = tokenizer.encode("𝄞", add_special_tokens=False)  # one token per byte of a 4-byte character
    rng = random.Random(11)
    for _ in range(400):
        ids = [
            rng.choice(
                (rng.randrange(vocab), rng.randrange(300), rng.choice(added), rng.choice(stray), vocab + 3)
            )
            for _ in range(rng.randint(0, 60))
        ]
        fast, window = IncrementalDetokenizer(tokenizer), IncrementalDetokenizer(tokenizer, byte_path=False)
        position = 0
        while position < len(ids):
            size = rng.randint(1, 5)
            run = ids[position : position + size]
            assert fast.push(run) == window.push(run), (ids, position)
            position += size


def test_whole_characters_skip_the_window_and_split_ones_take_it(tokenizer: Any) -> None:
    """Text that stays on whole characters is emitted from the new tokens' bytes alone (no window
    decoded); a split character, a literal U+FFFD and the tokens after them go through the window,
    and the pieces are still the window path's."""
    text = "Plain words, then 𝄞 split, a literal \ufffd mark, and plain words again."
    ids = tokenizer.encode(text, add_special_tokens=False)
    fast, window = IncrementalDetokenizer(tokenizer), IncrementalDetokenizer(tokenizer, byte_path=False)
    windows = []
    decode = fast._decode
    fast._decode = lambda run: windows.append(len(run)) or decode(run)
    out, slow = [], 0
    for token in ids:
        decoded = len(windows)
        out.append(fast.push([token]))
        slow += len(windows) > decoded
    assert out == [window.push([token]) for token in ids]
    assert "".join(out) == text
    assert 0 < slow < len(ids) // 3, "most pushes decode no window; the split character's do"


def test_other_decoders_keep_the_window_path() -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = {"<unk>": 0, "▁hello": 1, "▁world": 2, "!": 3}
    backend = Tokenizer(models.WordLevel(words, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Metaspace()
    backend.decoder = decoders.Metaspace()
    metaspace = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>")
    decoder = IncrementalDetokenizer(metaspace)
    assert decoder._table is None
    assert "".join(decoder.push([i]) for i in (1, 2, 3)) == whole(metaspace, [1, 2, 3]) == "hello world!"
