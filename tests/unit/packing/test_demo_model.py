"""Tests for the offline demo model builder: determinism, loadability, tokenizer and chat format."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest

from tests.support import REPO_ROOT
from trtllm_service.packing import demo_model
from trtllm_service.packing.demo_model import DEMO_SEED, build_demo_model

EXPECTED_FILES = {
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "special_tokens_map.json",
    "tokenizer.json",
    "tokenizer_config.json",
}
HARD_TEXTS = [
    "Hello, world!",
    " leading space",
    "   three leading spaces and trailing   ",
    "café naïve Grüße, déjà vu",
    "中文 日本語 한국어",
    "👍🏽 👨‍👩‍👧 🦀 🇫🇷",
    "mixed: x=1; café→中文 👍🏽\n\tnext line\r\n",
    "Zażółć gęślą jaźń 🧑🏿‍🚀 ß ẞ ﬁ",
]


def digests(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in directory.iterdir() if p.is_file()}


def test_writes_expected_files(demo_model_dir: Path) -> None:
    assert {p.name for p in demo_model_dir.iterdir()} == EXPECTED_FILES


def test_same_seed_gives_byte_identical_files(tmp_path: Path) -> None:
    first = build_demo_model(tmp_path / "a")
    second = build_demo_model(tmp_path / "b", seed=DEMO_SEED)
    assert set(digests(first)) == EXPECTED_FILES
    assert digests(first) == digests(second)


def test_different_seed_changes_only_weights(tmp_path: Path) -> None:
    a = digests(build_demo_model(tmp_path / "a", seed=0))
    b = digests(build_demo_model(tmp_path / "b", seed=1))
    assert a["model.safetensors"] != b["model.safetensors"]
    assert {k: v for k, v in a.items() if k != "model.safetensors"} == {
        k: v for k, v in b.items() if k != "model.safetensors"
    }


def test_build_is_fast(tmp_path: Path) -> None:
    start = time.monotonic()
    build_demo_model(tmp_path / "m")
    assert time.monotonic() - start < 20


def test_rebuild_into_identical_dir_returns_it(demo_model_dir: Path) -> None:
    before = digests(demo_model_dir)
    assert build_demo_model(demo_model_dir) == demo_model_dir
    assert digests(demo_model_dir) == before


def test_refuses_non_empty_foreign_dir(tmp_path: Path) -> None:
    out = tmp_path / "m"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="does not hold the demo model"):
        build_demo_model(out)
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["m"]  # no temp dir left behind


def test_refuses_other_seed_build(tmp_path: Path) -> None:
    out = build_demo_model(tmp_path / "m", seed=0)
    with pytest.raises(FileExistsError):
        build_demo_model(out, seed=1)


def test_fills_existing_empty_dir(tmp_path: Path) -> None:
    out = tmp_path / "m"
    out.mkdir()
    assert build_demo_model(out) == out
    assert {p.name for p in out.iterdir()} == EXPECTED_FILES


def test_interrupted_build_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def half_write(target: Path, seed: int) -> None:
        (target / "config.json").write_text("{")
        raise KeyboardInterrupt

    monkeypatch.setattr(demo_model, "_write_checkpoint", half_write)
    with pytest.raises(KeyboardInterrupt):
        build_demo_model(tmp_path / "m")
    assert list(tmp_path.iterdir()) == []


def test_config_files(demo_model_dir: Path) -> None:
    config = json.loads((demo_model_dir / "config.json").read_text())
    gen = json.loads((demo_model_dir / "generation_config.json").read_text())
    tok_config = json.loads((demo_model_dir / "tokenizer_config.json").read_text())
    vocab = json.loads((demo_model_dir / "tokenizer.json").read_text())["added_tokens"]
    ids = {t["content"]: t["id"] for t in vocab}
    assert config["model_type"] == "llama"
    assert config["num_key_value_heads"] < config["num_attention_heads"]  # GQA
    assert config["tie_word_embeddings"] is False
    assert config["torch_dtype"] == "float32"
    assert config["max_position_embeddings"] == 2048
    assert config["bos_token_id"] == ids["<|begin_of_text|>"]
    assert config["eos_token_id"] == ids["<|end_of_text|>"]
    assert gen["bos_token_id"] == ids["<|begin_of_text|>"]
    assert gen["eos_token_id"] == [ids["<|end_of_text|>"], ids["<|eot_id|>"]]
    assert tok_config["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert tok_config["bos_token"] == "<|begin_of_text|>"
    assert tok_config["eos_token"] == "<|eot_id|>"
    assert tok_config["clean_up_tokenization_spaces"] is False
    assert tok_config["model_max_length"] == 2048


def test_model_loads_with_all_weights(demo_model_dir: Path, tokenizer: Any) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    model, info = AutoModelForCausalLM.from_pretrained(
        demo_model_dir, local_files_only=True, output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert type(model).__name__ == "LlamaForCausalLM"
    assert model.dtype == torch.float32
    assert model.config.vocab_size == len(tokenizer)
    assert 200_000 < sum(p.numel() for p in model.parameters()) < 3_000_000


def test_special_tokens_are_single_ids(tokenizer: Any) -> None:
    names = [
        "<|begin_of_text|>",
        "<|end_of_text|>",
        "<|start_header_id|>",
        "<|end_header_id|>",
        "<|eot_id|>",
        "<|reserved_special_token_0|>",
    ]
    ids = {}
    for name in names:
        encoded = tokenizer.encode(name, add_special_tokens=False)
        assert len(encoded) == 1, name
        assert tokenizer.convert_ids_to_tokens(encoded[0]) == name
        ids[name] = encoded[0]
    assert len(set(ids.values())) == len(names)
    assert ids["<|eot_id|>"] != ids["<|end_of_text|>"]
    assert tokenizer.bos_token_id == ids["<|begin_of_text|>"]
    assert tokenizer.eos_token_id == ids["<|eot_id|>"]
    # Appended after the BPE vocab, as Llama-3 does: they are the highest ids.
    assert min(ids.values()) >= len(tokenizer) - len(demo_model.SPECIAL_TOKENS)


@pytest.mark.parametrize("text", HARD_TEXTS)
def test_round_trip_is_exact(tokenizer: Any, text: str) -> None:
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids) == text
    with_bos = tokenizer.encode(text)
    assert with_bos == [tokenizer.bos_token_id, *ids]
    assert tokenizer.decode(with_bos, skip_special_tokens=True) == text


def test_byte_fallback_and_merges(tokenizer: Any) -> None:
    pieces = {ch: tokenizer.encode(ch, add_special_tokens=False) for ch in set("".join(HARD_TEXTS))}
    split = [ch for ch, ids in pieces.items() if len(ids) >= 2]
    assert split, "expected at least one character to need several byte-level tokens"
    assert len(tokenizer.encode("🦀", add_special_tokens=False)) >= 2
    # ... while frequent multi-byte characters from the corpus got merged into one token.
    assert len(tokenizer.encode("é", add_special_tokens=False)) == 1
    assert len(tokenizer.encode("中", add_special_tokens=False)) == 1


def test_chat_template_is_llama3_format(tokenizer: Any) -> None:
    messages = [
        {"role": "system", "content": "  You are terse.\n"},
        {"role": "user", "content": "Hi there 👋"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "\nWhat is 2+2? "},
    ]
    expected = "<|begin_of_text|>"
    expected += "<|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|>"
    expected += "<|start_header_id|>user<|end_header_id|>\n\nHi there 👋<|eot_id|>"
    expected += "<|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>"
    expected += "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>"
    rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert rendered == expected + "<|start_header_id|>assistant<|end_header_id|>\n\n"
    without_prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=False, tokenize=False)
    assert without_prompt == expected


def test_chat_text_has_exactly_one_bos(tokenizer: Any) -> None:
    messages = [{"role": "user", "content": "Hello"}]
    rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = tokenizer.encode(rendered, add_special_tokens=False)
    assert ids[0] == tokenizer.bos_token_id
    assert ids.count(tokenizer.bos_token_id) == 1
    assert tokenizer.decode(ids) == rendered


def test_greedy_generate_is_deterministic(hf_model: Any, tokenizer: Any) -> None:
    import torch

    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Say something."}], add_generation_prompt=True, tokenize=False
    )
    input_ids = torch.tensor([tokenizer.encode(prompt, add_special_tokens=False)])
    outputs = [
        hf_model.generate(
            input_ids, max_new_tokens=12, do_sample=False, attention_mask=torch.ones_like(input_ids)
        )
        for _ in range(2)
    ]
    assert torch.equal(outputs[0], outputs[1])
    new = outputs[0][0, input_ids.shape[1] :]
    assert 1 <= len(new) <= 12
    assert int(new.max()) < len(tokenizer)
    assert isinstance(tokenizer.decode(new), str)


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, "-m", "trtllm_service.packing.demo_model", *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_cli_builds_same_files(tmp_path: Path, demo_model_dir: Path) -> None:
    out = tmp_path / "cli"
    result = run_cli(str(out), "--seed", str(DEMO_SEED))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(out)
    # A separate process must produce the very same bytes (tokenizer training and weights included).
    assert digests(out) == digests(demo_model_dir)


@pytest.mark.parametrize("args", [(), ("out", "--seed", "abc"), ("out", "--bogus")])
def test_cli_bad_args(tmp_path: Path, args: tuple[str, ...]) -> None:
    result = run_cli(*(str(tmp_path / a) if a == "out" else a for a in args))
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "error:" in lines[0]
    assert not (tmp_path / "out").exists()


def test_cli_refuses_foreign_dir(tmp_path: Path) -> None:
    out = tmp_path / "m"
    out.mkdir()
    (out / "x").write_text("x")
    result = run_cli(str(out))
    assert result.returncode == 1
    assert len(result.stderr.strip().splitlines()) == 1 and "error:" in result.stderr
