"""The worker's tokenizer is read without PyTorch (and what transformers brings with it), the same
tokenizer as transformers' with PyTorch, and os.environ is left as it was; what the worker imports
before it (the service's modules) does not bring PyTorch either."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.support import REPO_ROOT

PROBE = """
import json, os, sys
from pathlib import Path
before = dict(os.environ)
import trtllm_service.api.app  # what service.py imports, before the worker reads its tokenizer
from trtllm_service.chat.template import PromptFormatter
from trtllm_service.tokenizer_loading import load_tokenizer
tokenizer = load_tokenizer(Path(sys.argv[1]))
messages = [{"role": "user", "content": "Hello there, how are you?"}]
rendered = PromptFormatter(tokenizer).render(messages)
print(json.dumps({
    "heavy": sorted(m for m in ("torch", "sklearn", "pandas", "scipy") if m in sys.modules),
    "environ_unchanged": dict(os.environ) == before,
    "ids": tokenizer(["Hello there, how are you?"])["input_ids"][0],
    "prompt": tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True),
    "rendered": rendered,
}))
"""


def test_the_tokenizer_comes_without_torch_and_is_the_same(demo_model_dir: Path, tokenizer: Any) -> None:
    env = {key: value for key, value in os.environ.items() if key not in ("USE_TORCH", "USE_TF")}
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(demo_model_dir)],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["heavy"] == [], f"imported with the tokenizer: {found['heavy']}"
    assert found["environ_unchanged"]
    assert "None of PyTorch" not in done.stderr, done.stderr
    # The tests' own tokenizer was loaded with PyTorch imported (tests/support.py).
    messages = [{"role": "user", "content": "Hello there, how are you?"}]
    assert found["ids"] == tokenizer(["Hello there, how are you?"])["input_ids"][0]
    assert (
        found["prompt"]
        == found["rendered"]
        == tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    )


CHILD_PROBE = """
import json, os, sys, threading
from trtllm_service.tokenizer_loading import environ_for_children, tokenizer_class
importing = threading.Thread(target=tokenizer_class)
importing.start()
seen = None
while importing.is_alive():
    if os.environ.get("USE_TORCH") == "0":  # the import is under way, with PyTorch kept out
        env = environ_for_children()
        seen = {"still_importing": importing.is_alive(), "child_use_torch": env.get("USE_TORCH")}
        break
importing.join()
print(json.dumps({"seen": seen, "after": environ_for_children().get("USE_TORCH")}))
"""


def test_a_child_started_during_the_import_gets_the_environment_as_it_was() -> None:
    """Triton is started while the worker's tokenizer imports transformers: its environment is
    os.environ without the import's USE_TORCH=0 (its engines need PyTorch), and taking it does not
    wait for the import to end (the event loop that starts Triton would be held 1-2 s)."""
    env = {key: value for key, value in os.environ.items() if key not in ("USE_TORCH", "USE_TF")}
    done = subprocess.run(
        [sys.executable, "-c", CHILD_PROBE],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["seen"] == {"still_importing": True, "child_use_torch": None}, found
    assert found["after"] is None
