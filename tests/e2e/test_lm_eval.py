"""Prompt log probabilities and lm-eval-harness itself, through `bentoml serve`, on both flavours.

`echo` with `logprobs` returns the prompt's tokens first (the first with no log prob), then the
generated ones, also with max_tokens 0 (the prompt's only) and 1 (what lm-eval's `local-completions`
sends for loglikelihood: the prompt as token ids, `logprobs: 1`, `echo: true`, `max_tokens: 1`). The
numbers are an independent `transformers` forward pass over the same tokens. Then lm-eval runs, as a
user runs it, on a tiny local task of one loglikelihood and one generate_until request, with
`local-completions` and `local-chat-completions`, offline, with the packed model's tokenizer.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from tests.openai_support import Reference

TOL = 2e-3
CONTEXT = "The sea is"
CONTINUATION = " blue and deep"


def _logprobs(service: Any, model_name: str, prompt: Any, max_tokens: int) -> dict[str, Any]:
    body = {
        "model": model_name,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "logprobs": 1,
        "echo": True,
    }
    response = httpx.post(f"{service.url}/v1/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


@pytest.mark.parametrize("max_tokens", [0, 1])
def test_echo_logprobs_are_the_prompts_then_the_answers(
    service: Any, model_name: str, ref: Reference, max_tokens: int
) -> None:
    ids = ref.tokenizer.encode(CONTEXT + CONTINUATION, add_special_tokens=False)
    body = _logprobs(service, model_name, ids, max_tokens)
    choice = body["choices"][0]
    logprobs = choice["logprobs"]
    values, tops = logprobs["token_logprobs"], logprobs["top_logprobs"]
    assert len(values) == len(ids) + max_tokens == len(tops) == len(logprobs["tokens"])
    assert values[0] is None and tops[0] is None  # nothing predicts the first token
    with torch.inference_mode():
        table = torch.log_softmax(ref.model(torch.tensor([ids])).logits[0].float(), -1)
    for i in range(1, len(ids)):
        assert values[i] == pytest.approx(float(table[i - 1, ids[i]]), abs=TOL)
        assert list(tops[i].values()) == pytest.approx([float(table[i - 1].max())], abs=TOL)
    usage = body["usage"]
    assert usage["completion_tokens"] == max_tokens and usage["prompt_tokens"] == len(ids)
    assert usage["prompt_tokens_details"] == {"cached_tokens": 0}  # the engines reuse no KV block
    if max_tokens == 0:
        assert choice["finish_reason"] == "length"
    else:
        assert values[-1] == pytest.approx(float(table[-1].max()), abs=TOL)  # greedy: the likeliest


def test_cached_tokens_is_an_integer_in_every_usage(service: Any, model_name: str) -> None:
    messages = [{"role": "user", "content": "Hi"}]
    url = f"{service.url}/v1"
    chat = httpx.post(
        f"{url}/chat/completions", json={"model": model_name, "messages": messages, "max_tokens": 2}
    )
    assert chat.json()["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    streamed = httpx.post(
        f"{url}/completions",
        json={
            "model": model_name,
            "prompt": "Hi",
            "max_tokens": 2,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
        timeout=60,
    )
    events = [json.loads(line[6:]) for line in streamed.text.splitlines() if line.startswith("data: {")]
    assert events[-1]["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}


def _task_dir(tmp_path: Path) -> Path:
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "ll.jsonl").write_text(json.dumps({"context": CONTEXT, "continuation": CONTINUATION}) + "\n")
    (tasks / "gen.jsonl").write_text(json.dumps({"question": "Say hello.", "answer": "hello"}) + "\n")
    common = "dataset_path: json\ntest_split: test\n"
    (tasks / "tiny_loglikelihood.yaml").write_text(
        f"task: tiny_loglikelihood\n{common}dataset_kwargs:\n  data_files:\n    test: {tasks / 'll.jsonl'}\n"
        "output_type: loglikelihood\ndoc_to_text: '{{context}}'\ndoc_to_target: '{{continuation}}'\n"
        "metric_list:\n  - metric: perplexity\n    aggregation: perplexity\n    higher_is_better: false\n"
        "  - metric: acc\n    aggregation: mean\n    higher_is_better: true\n"
    )
    (tasks / "tiny_generate.yaml").write_text(
        f"task: tiny_generate\n{common}dataset_kwargs:\n  data_files:\n    test: {tasks / 'gen.jsonl'}\n"
        "output_type: generate_until\ndoc_to_text: '{{question}}'\ndoc_to_target: '{{answer}}'\n"
        "generation_kwargs:\n  until: ['\\n\\n']\n  max_gen_toks: 8\n  do_sample: false\n"
        "metric_list:\n  - metric: exact_match\n    aggregation: mean\n    higher_is_better: true\n"
    )
    return tasks


LM_EVAL_PYTHON = Path(sys.prefix) / "lm-eval" / "bin" / "python"
"""lm-eval-harness's own venv, inside the tests' (requirements-lm-eval.txt says why; dev.sh makes it)."""


def _lm_eval(
    model: str, args: str, tasks: str, task_dir: Path, out: Path, *extra: str
) -> list[dict[str, Any]]:
    """Runs lm-eval's CLI as a user does (offline), returns its logged samples."""
    assert LM_EVAL_PYTHON.exists(), f"{LM_EVAL_PYTHON} is missing: ./dev.sh test makes lm-eval's venv"
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "OPENAI_API_KEY": "unused"}
    command = [str(LM_EVAL_PYTHON), "-m", "lm_eval", "--model", model, "--model_args", args, "--tasks", tasks]
    command += ["--include_path", str(task_dir), "--output_path", str(out), "--log_samples", *extra]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    samples = []
    for path in out.rglob("samples_*.jsonl"):
        samples += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return samples


@pytest.mark.flavors("llmapi")  # a client of the API; the echo log-prob tests above run on both
def test_lm_eval_harness_runs_against_the_service(
    service: Any, model_name: str, ref: Reference, packed_model_dir: Path, tmp_path: Path
) -> None:
    tasks = _task_dir(tmp_path)
    tokenizer = packed_model_dir / "tokenizer"
    common = f"model={model_name},tokenizer={tokenizer},tokenizer_backend=huggingface,num_concurrent=1,max_retries=1"
    samples = _lm_eval(
        "local-completions",
        f"{common},base_url={service.url}/v1/completions,tokenized_requests=True",
        "tiny_loglikelihood,tiny_generate",
        tasks,
        tmp_path / "completions",
    )
    by_task = {(sample["doc"].get("context") and "ll") or "gen": sample for sample in samples}
    assert set(by_task) == {"ll", "gen"}, samples
    # The loglikelihood lm-eval computed from our prompt log probs: transformers' own number.
    context = ref.tokenizer.encode(CONTEXT, add_special_tokens=False)
    whole = ref.tokenizer.encode(CONTEXT + CONTINUATION, add_special_tokens=False)
    with torch.inference_mode():
        table = torch.log_softmax(ref.model(torch.tensor([whole])).logits[0].float(), -1)
    expected = sum(float(table[i - 1, whole[i]]) for i in range(len(context), len(whole)))
    greedy = all(int(table[i - 1].argmax()) == whole[i] for i in range(len(context), len(whole)))
    logprob, is_greedy = by_task["ll"]["resps"][0][0]
    assert float(logprob) == pytest.approx(expected, abs=5 * TOL)
    assert str(is_greedy) == str(greedy)  # lm-eval logs the flag as text
    # Its generate_until request: the greedy answer to the prompt's tokens (lm-eval adds no BOS), cut
    # where lm-eval cuts it.
    prompt = ref.tokenizer.encode("Say hello.", add_special_tokens=False)
    completed = httpx.post(
        f"{service.url}/v1/completions",
        json={"model": model_name, "prompt": prompt, "max_tokens": 8, "temperature": 0},
        timeout=60,
    ).json()["choices"][0]["text"]
    assert by_task["gen"]["resps"][0][0] == completed.split("\n\n")[0]

    # local-chat-completions: lm-eval's chat client, generate_until only (its loglikelihood is refused).
    samples = _lm_eval(
        "local-chat-completions",
        f"model={model_name},base_url={service.url}/v1/chat/completions,num_concurrent=1,max_retries=1",
        "tiny_generate",
        tasks,
        tmp_path / "chat",
        "--apply_chat_template",
    )
    chatted = httpx.post(
        f"{service.url}/v1/chat/completions",
        json={
            "model": model_name,
            "messages": [{"role": "user", "content": "Say hello."}],
            "max_tokens": 8,
            "temperature": 0,
        },
        timeout=60,
    ).json()["choices"][0]["message"]["content"]
    answers = {
        sample["resps"][0][0]
        for sample in samples
        if sample["doc"] == {"question": "Say hello.", "answer": "hello"}
    }
    assert answers == {chatted.split("\n\n")[0]}
