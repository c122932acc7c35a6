"""NGram speculative decoding (prompt lookup) in the reference engine: tokens/s with and without drafts,
side by side in one run.

The reference engine runs in this process (the engine loop and token source Triton runs; no Triton,
no service), on the SmolLM2 demo (`pack_model.py --demo`'s checkpoint) or `--model`. Each prompt is
chat-templated and decoded greedily until the model ends it (or `--tokens`), once without and once
with `speculative_config` (NGram, `--draft`/`--ngram`), alternating `--rounds` times; both runs must
produce the same tokens (the script fails otherwise). Prompts:

- `repeat-code`: asks to repeat a code block that is in the prompt (drafts come from the prompt);
- `repeat-list`: asks to repeat a list in the prompt;
- `free`: a question whose answer is not in the prompt (what drafting costs when little is accepted).

Results: bench/results/speculative-<label>.{json,md}.

    python bench/speculative.py --label 2core
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CODE = '''def merge_sorted(left, right):
    """Merge two sorted lists into one sorted list."""
    out = []
    i = j = 0
    while i < len(left) and j < len(right):
        if left[i] <= right[j]:
            out.append(left[i])
            i += 1
        else:
            out.append(right[j])
            j += 1
    out.extend(left[i:])
    out.extend(right[j:])
    return out
'''
CITIES = ("Lisbon", "Madrid", "Paris", "Berlin", "Vienna", "Prague", "Warsaw", "Budapest", "Rome", "Athens")
CITIES += ("Oslo", "Stockholm", "Helsinki", "Copenhagen", "Dublin", "London", "Brussels", "Amsterdam")
RECORD = (
    '{"name": "Ada Lovelace", "born": 1815, "city": "London", "fields": ["mathematics", "computing"], '
    '"notes": "wrote the first published algorithm for a machine"}'
)
PROMPTS = {
    "repeat-list": "Repeat this list of cities exactly, separated by commas, and nothing else:\n\n"
    + ", ".join(CITIES),
    "repeat-json": f"Repeat this JSON exactly:\n{RECORD}",
    # SmolLM2-135M rewrites the function rather than copying it: the drafts match only in part
    "repeat-code": f"Repeat this Python function exactly, in a code block, and nothing else:\n\n```python\n{CODE}```",
    "free": "Explain in a few sentences why the sky is blue.",
}


class _Collect:
    """One request's responses: its token ids, when it started and ended."""

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.started = time.perf_counter()
        self.ended = 0.0
        self.error: str | None = None
        self.done = threading.Event()

    def send(self, response: Any, final: bool) -> None:
        if "error" in response:
            self.error = response["error"]
        else:
            self.ids.extend(int(i) for i in response["output_ids"].reshape(-1))
        if final:
            self.ended = time.perf_counter()
            self.done.set()

    def is_cancelled(self) -> bool:
        return False


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--label", default="2core")
    parser.add_argument("--model", type=Path, help="a checkpoint directory (default: the SmolLM2 demo)")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/bench-speculative"))
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--draft", type=int, default=4, help="max_draft_len")
    parser.add_argument("--ngram", type=int, default=3, help="max_matching_ngram_size")
    parser.add_argument("--tokens", type=int, default=256, help="the most tokens per answer")
    parser.add_argument("--rounds", type=int, default=3, help="alternations of without / with drafts")
    parser.add_argument("--streams", type=int, default=1, help="requests at once (the same prompt each)")
    parser.add_argument("--slots", type=int, default=0, help="the engine's batch slots (default: --streams)")
    args = parser.parse_args()

    from tensorrtllm_backend import STANDIN_DIR

    sys.path.insert(0, str(STANDIN_DIR))  # as a Triton model sees them
    sys.path.insert(0, str(ROOT / "tensorrtllm_backend"))
    import numpy as np
    import torch
    from contract import EngineLimits, parse_request
    from engine import EngineLoop
    from reference import ReferenceSource
    from transformers import AutoTokenizer

    model = args.model
    if model is None:
        from trtllm_service.packing.smollm2 import build_smollm2_model

        model = args.workdir / "smollm2"
        if not (model / "config.json").exists():
            build_smollm2_model(model)
    tokenizer = AutoTokenizer.from_pretrained(model)
    source = ReferenceSource(str(model), "auto", args.dtype, slots=args.slots or args.streams, max_len=2048)
    limits = EngineLimits(vocab_size=source.vocab_size, max_seq_len=source.max_len)
    config = {"decoding_type": "NGram", "max_draft_len": args.draft, "max_matching_ngram_size": args.ngram}
    side: Any = type(
        "Side",
        (),
        {
            "response": staticmethod(lambda arrays: arrays),
            "error": staticmethod(lambda message: {"error": message}),
            "log": staticmethod(lambda message: None),
            "finished": staticmethod(lambda outcome: None),
            "tokens": staticmethod(lambda count: None),
        },
    )()
    loop = EngineLoop(source, side, side, cancel_check_s=1.0)

    def prompt_ids(text: str) -> list[int]:
        if tokenizer.chat_template:
            ids = tokenizer.apply_chat_template(
                [{"role": "user", "content": text}], add_generation_prompt=True
            )
            return list(ids["input_ids"] if hasattr(ids, "keys") else ids)  # transformers 5: a BatchEncoding
        return tokenizer.encode(text)

    def request(ids: list[int]) -> Any:
        inputs = {
            "input_ids": np.array([ids], dtype=np.int32),
            "input_lengths": np.array([len(ids)], dtype=np.int32),
            "request_output_len": np.array([args.tokens], dtype=np.int32),
            "end_id": np.array([tokenizer.eos_token_id], dtype=np.int32),
            "streaming": np.array([True]),
        }
        return parse_request(inputs.get, uuid.uuid4().hex, limits, ("output_ids", "sequence_length"))

    def once(ids: list[int]) -> tuple[list[list[int]], float]:
        sinks = [_Collect() for _ in range(args.streams)]
        started = time.perf_counter()
        for sink in sinks:
            loop.submit(request(ids), sink)
        for sink in sinks:
            if not sink.done.wait(1800) or sink.error:
                raise RuntimeError(sink.error or "a request never finished")
        return [s.ids for s in sinks], max(s.ended for s in sinks) - started

    rows = []
    load = os.getloadavg()
    try:
        source.speculate(None)
        once(prompt_ids("Hello"))  # warm-up
        for name, text in PROMPTS.items():
            ids = prompt_ids(text)
            runs: dict[str, list[float]] = {"off": [], "ngram": []}
            outputs: dict[str, list[list[int]]] = {}
            counts: dict[str, dict[str, Any]] = {}
            for _ in range(args.rounds):
                for mode in ("off", "ngram"):
                    source.speculate(config if mode == "ngram" else None)
                    before = source.speculative_counters()
                    out, wall = once(ids)
                    after = source.speculative_counters()
                    outputs.setdefault(mode, out)
                    if out != outputs[mode]:
                        raise RuntimeError(f"{name}: {mode} decoded other tokens in another round")
                    runs[mode].append(sum(len(o) for o in out) / wall)
                    counts[mode] = {k: after[k] - before[k] for k in after if k != "acceptance_rate"}
            if outputs["off"] != outputs["ngram"]:
                raise RuntimeError(f"{name}: greedy tokens differ with drafts")
            tokens = len(outputs["off"][0])
            off, on = statistics.median(runs["off"]), statistics.median(runs["ngram"])
            row = {
                "prompt": name,
                "prompt_tokens": len(ids),
                "answer_tokens": tokens,
                "off_tokens_per_s": round(off, 1),
                "ngram_tokens_per_s": round(on, 1),
                "speedup": round(on / off, 2),
                "draft_tokens": counts["ngram"]["draft_tokens"],
                "accepted_draft_tokens": counts["ngram"]["accepted_draft_tokens"],
                "acceptance_rate": round(
                    counts["ngram"]["accepted_draft_tokens"] / max(1, counts["ngram"]["draft_tokens"]), 3
                ),
                "decode_forwards_off": counts["off"]["decode_steps"],
                "decode_forwards_ngram": counts["ngram"]["decode_steps"],
                "off_runs": [round(x, 1) for x in runs["off"]],
                "ngram_runs": [round(x, 1) for x in runs["ngram"]],
                "same_tokens": True,
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        loop.shutdown()

    command = "python " + " ".join(
        shlex.quote(a) for a in [sys.argv[0].replace(str(ROOT) + "/", ""), *sys.argv[1:]]
    )
    result = {
        "command": command,
        "label": args.label,
        "model": str(args.model or "SmolLM2-135M-Instruct (pack_model.py --demo)"),
        "dtype": args.dtype,
        "speculative_config": config,
        "streams": args.streams,
        "max_tokens": args.tokens,
        "rounds": args.rounds,
        "machine": f"{platform.machine()}, {torch.get_num_threads()} torch threads, torch {torch.__version__}",
        "describe": source.describe(),
        "rows": rows,
    }
    out = ROOT / "bench" / "results" / f"speculative-{args.label}"
    out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [
        f"# NGram speculative decoding, reference engine ({args.label})",
        "",
        f"`{command}`",
        "",
        f"Model: {result['model']}, {args.dtype}; {result['machine']}. speculative_config: "
        f"`{json.dumps(config)}`. Greedy, streamed, {args.streams} request(s) at once, up to {args.tokens} "
        f"tokens (the model's end token ends it); median of {args.rounds} alternating runs each. "
        "Both modes decoded the same tokens (checked). tokens/s: answer tokens / wall time of the request, "
        "prefill included. decode forwards: the engine's forward passes after the prefill (one per "
        f"token without drafts). Load average (1 min) before / after: {load[0]:.2f} / {os.getloadavg()[0]:.2f} "
        f"({os.cpu_count()} cores).",
        "",
        "| prompt | prompt tokens | answer tokens | tokens/s off | tokens/s NGram | speedup | drafted | accepted "
        "| acceptance | decode forwards off / NGram | runs off (tokens/s) | runs NGram |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['prompt']} | {r['prompt_tokens']} | {r['answer_tokens']} | {r['off_tokens_per_s']} | "
            f"{r['ngram_tokens_per_s']} | {r['speedup']}x | {r['draft_tokens']} | {r['accepted_draft_tokens']} | "
            f"{r['acceptance_rate']} | {r['decode_forwards_off']} / {r['decode_forwards_ngram']} | "
            f"{r['off_runs']} | {r['ngram_runs']} |"
        )
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out}.md", flush=True)


if __name__ == "__main__":
    main()
