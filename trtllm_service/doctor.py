"""`python -m trtllm_service.doctor [MODEL]`: check a packed model on the machine that will serve it.

Run it on the GPU box, in the production image, before `bentoml serve`: it prints the versions
(TensorRT-LLM installed vs pinned and the minimum, Triton, the image this project pins), the GPUs
seen against tp x pp, whether a prebuilt engine was built by the installed TensorRT-LLM, then
starts Triton with the model exactly as the service does and sends one request per feature
(streaming, stop strings, seeds, log probs, guided decoding, LoRA, beams), each a one-message chat
rendered with the model's chat template as /generate and /v1/chat/completions render it, each
reported ok, unsupported (with why) or failed (with the error). A failed check says whose fault it
is: "the engine:" (Triton, the engine or the relay did not do what was asked) or "the model's
answer:" (the engine did, but the answer cannot show the feature; e.g. a greedy answer that ends at
once, which the probes of engine features then ask for again with ignore_eos). A model of the
legacy ensemble flavour gets one warning line (pinned.ENSEMBLE_LEGACY_WARNING); a warning does not
fail. A model packed with --config / --set shows those LLM API options, and which of them a stand-in
engine ignores (they need TensorRT-LLM on a GPU). It says whether LoRA adapters can be loaded while
serving (TRTLLM_ALLOW_RUNTIME_LORA_UPDATING); with --probe-lora-load PATH it loads that adapter as
/v1/load_lora_adapter would, asks one request of it and unloads it. Exit status 1 when anything failed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from tensorrtllm_backend import pinned
from trtllm_service.errors import APIError
from trtllm_service.relay.request import SamplingParams
from trtllm_service.versions import installed_tensorrt_llm, triton_version

PROG = "trtllm_service.doctor"
PROMPT = "Write one short sentence about the sea."
OK, UNSUPPORTED, FAILED, WARNING = "ok", "unsupported", "failed", "warning"
ENGINE, MODEL = "engine", "model"
"""Whose fault a failed (or warning) check is: the engine's, or the model's answer."""


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    status: str
    detail: str
    fault: str | None = None  # ENGINE or MODEL, for a check that is not ok


def engine_fault(name: str, detail: str) -> Check:
    """A failed check the engine is to blame for: it did not do what the request asked."""
    return Check(name, FAILED, f"the engine: {detail}", ENGINE)


def model_fault(name: str, status: str, detail: str) -> Check:
    """A check the model's answer decides: the engine did what was asked."""
    return Check(name, status, f"the model's answer: {detail}", MODEL)


@dataclass(slots=True)
class Answer:
    text: str
    tokens: int
    finish_reason: str | None
    first_token_s: float
    logprobs: list[Any] = field(default_factory=list)


def gpus_seen() -> int:
    """GPUs nvidia-smi lists (0 without it: no driver, no GPU)."""
    binary = shutil.which("nvidia-smi")
    if binary is None:
        return 0
    try:
        listed = subprocess.run([binary, "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in listed.stdout.splitlines() if line.startswith("GPU "))


BEAM_PACKED = (
    "beam-packed (max_beam_width {width}): every request runs as a beam search over {width} beams, "
    "since TensorRT-LLM 1.2.1's executor refuses any other width; n <= {width} choices, one streams as "
    "one chunk; temperature/top_p/top_k, log probs, guides and several streamed beams are 400s"
)
"""The doctor's one line on a beam-packed LLM API model (docs/api.md: Beam search)."""


STAND_IN_HONOURS = (
    "max_batch_size",
    "max_seq_len",
    "max_num_tokens",
    "max_beam_width",
    "enable_chunked_prefill",
    "context_parallel_size",
    "dtype",
    "trust_remote_code",
    "guided_decoding_backend",
    "kv_cache_config.max_tokens",
)
"""LLM API options the stand-in engines act on (llm_standin.py: slots, limits, the KV cache's size, beams,
guides); the reference engine also runs speculative_config's NGram drafting. Every other option is
validated as TensorRT-LLM 1.2.1 validates it and then takes effect only with TensorRT-LLM (a GPU)."""


def llm_options_checks(info: Any, engine: str | None) -> list[Check]:
    """What the packed model's --config / --set options do here: all of them with TensorRT-LLM; with a
    stand-in engine, the ones it ignores are named (they need TensorRT-LLM on a GPU)."""
    options = getattr(info, "llm_options", None) or {}
    if not options:
        return []
    from trtllm_service.packed_model import flatten_options

    leaves = [item.split("=", 1)[0] for item in flatten_options(options)]
    given = " and ".join(info.llm_options_from) or "--config"
    if engine not in ("reference", "synthetic"):
        return [Check("llm options", OK, f"{len(leaves)} from {given}, applied by TensorRT-LLM")]
    spec = options.get("speculative_config") or {}
    ngram = engine == "reference" and isinstance(spec, dict) and spec.get("decoding_type") == "NGram"

    def honoured(key: str) -> bool:
        if key.startswith("speculative_config."):
            return ngram
        return any(key == k or key.startswith(k + ".") for k in STAND_IN_HONOURS)

    ignored = [key for key in leaves if not honoured(key)]
    if not ignored:
        return [Check("llm options", OK, f"{len(leaves)} from {given}, all acted on by the {engine} engine")]
    return [
        Check(
            "llm options",
            UNSUPPORTED,
            f"the {engine} engine ignores {', '.join(ignored)} (validated; they take effect with "
            "TensorRT-LLM on a GPU)",
        )
    ]


def flavor_checks(flavor: Any) -> list[Check]:
    """One warning for a model of a legacy flavour (the ensemble: a TensorRT engine), none otherwise."""
    return [Check("flavor", WARNING, flavor.legacy)] if flavor.legacy else []


def environment_checks(info: Any, engine: str | None, installed: str | None) -> list[Check]:
    """What can be told without a request: TensorRT-LLM, GPUs, the engine's build."""
    checks = []
    if installed is None:
        checks.append(Check("tensorrt_llm", UNSUPPORTED, "not installed here: stand-in engines serve"))
    elif not pinned.supported(installed):
        checks.append(
            Check(
                "tensorrt_llm",
                FAILED,
                f"{installed} is older than the {pinned.MIN_TENSORRT_LLM} this service supports "
                f"(pinned: {pinned.TENSORRT_LLM_VERSION}, image {pinned.IMAGE})",
            )
        )
    else:
        checks.append(
            Check(
                "tensorrt_llm",
                OK,
                f"{installed} (pinned {pinned.TENSORRT_LLM_VERSION}, minimum {pinned.MIN_TENSORRT_LLM})",
            )
        )
    seen, needed = gpus_seen(), int(info.world_size)
    shape = f"tp {info.tp_size} x pp {info.pp_size}"
    stand_in = engine in ("reference", "synthetic")
    if seen >= needed:
        checks.append(Check("gpus", OK, f"{seen} seen, the model needs {needed} ({shape})"))
    elif stand_in:
        checks.append(
            Check("gpus", OK, f"{seen} seen, {needed} needed ({shape}): the {engine} engine needs none")
        )
    else:
        checks.append(Check("gpus", FAILED, f"{seen} seen, the model needs {needed} ({shape})"))
    built = info.versions.get("tensorrt_llm") if info.backend == "tensorrtllm" else None
    if info.backend != "tensorrtllm":
        checks.append(Check("engine build", OK, "a checkpoint: nothing was built ahead"))
    elif built is None:
        checks.append(
            Check("engine build", UNSUPPORTED, "the engine's config.json names no TensorRT-LLM version")
        )
    elif installed is not None and built != installed:
        checks.append(
            Check(
                "engine build",
                FAILED,
                f"built by TensorRT-LLM {built}, {installed} is installed: an engine runs only with the "
                "version that built it; rebuild it here (pack_model.py --build-engine)",
            )
        )
    else:
        checks.append(Check("engine build", OK, f"built by TensorRT-LLM {built}"))
    return checks


PROBES = ("stream", "stop", "seed", "logprobs", "guided", "lora", "beams")
"""The features FeatureProbe checks, in the report's order: each is its method of that name."""


class FeatureProbe:
    """Sends one small request per feature through a started Runtime, each a one-message chat
    rendered with the model's chat template (a raw prompt is not what a chat model answers: SmolLM2's
    greedy answer to one is its end token)."""

    def __init__(self, runtime: Any, max_tokens: int = 16) -> None:
        self.runtime = runtime
        self.max_tokens = max_tokens

    async def prepare(self, params: SamplingParams) -> Any:
        """The request the service makes of PROMPT sent as a chat: templated, tokenized, settled."""
        messages = [{"role": "user", "content": PROMPT}]
        return await self.runtime.prepare_chat(messages, params, param="prompt", budget_param="max_tokens")

    async def ask(self, params: SamplingParams) -> Answer:
        runtime = self.runtime
        flavor = runtime.flavor
        if flavor.beam_packed:  # as the service serves it: a beam search (or a 400)
            params = flavor.fill_beam_search(params)
            flavor.check_engine_features(params, stream=True)
        request = await self.prepare(replace(params, max_tokens=self.max_tokens))
        started = time.monotonic()
        stream = await runtime.generate(request)
        first = 0.0
        pieces = []
        logprobs: list[Any] = []
        try:
            while True:
                piece = await stream.read()
                if piece and not first:
                    first = time.monotonic() - started
                pieces.append(piece)
                logprobs.extend(stream.take_logprobs())
                if stream.finish_reason is not None:
                    break
        finally:
            stream.close()
        return Answer("".join(pieces), stream.completion_tokens, stream.finish_reason, first, logprobs)

    async def ask_for_tokens(self, params: SamplingParams) -> tuple[Answer, SamplingParams]:
        """`ask`; when the model's answer is empty (it ended at once: an end token first), once more
        with ignore_eos, so that a probe of an engine feature has tokens to look at. Returns the
        answer and the parameters that gave it."""
        answer = await self.ask(params)
        if answer.tokens or answer.finish_reason != "stop" or params.ignore_eos:
            return answer, params
        params = replace(params, ignore_eos=True)
        return await self.ask(params), params

    async def stream(self) -> Check:
        answer = await self.ask(SamplingParams(temperature=0.0))
        if answer.tokens:
            return Check(
                "stream", OK, f"{answer.tokens} tokens, the first after {answer.first_token_s:.2f} s"
            )
        if answer.finish_reason != "stop":
            return engine_fault("stream", f"no tokens came back (finish reason {answer.finish_reason})")
        forced = await self.ask(SamplingParams(temperature=0.0, ignore_eos=True))
        if not forced.tokens:
            return engine_fault("stream", "no tokens came back, not even with ignore_eos")
        return model_fault(
            "stream",
            WARNING,
            "the greedy answer to a one-message chat is empty (its first token is an end token); the "
            f"engine streams ({forced.tokens} tokens with ignore_eos). Check the chat template "
            "(pack_model.py --chat-template)",
        )

    async def stop(self) -> Check:
        plain, params = await self.ask_for_tokens(SamplingParams(temperature=0.0))
        text = plain.text
        cut = next(
            (
                i
                for i in range(3, len(text) - 3)
                if len(text[i : i + 3].strip()) == 3 and text.find(text[i : i + 3]) == i
            ),
            None,
        )
        if cut is None:
            return model_fault(
                "stop", UNSUPPORTED, f"the greedy answer {text!r} is too short to pick a stop string"
            )
        stop = text[cut : cut + 3]
        stopped = await self.ask(replace(params, stop=(stop,)))
        if stopped.text != text[:cut] or stopped.finish_reason != "stop":
            return engine_fault("stop", f"stop {stop!r}: got {stopped.text!r}, expected {text[:cut]!r}")
        return Check("stop", OK, f"ended before {stop!r} after {stopped.tokens} tokens")

    async def seed(self) -> Check:
        sampled = SamplingParams(temperature=1.0, seed=1234)
        first, again = await self.ask(sampled), await self.ask(sampled)
        if (first.text, first.tokens) != (again.text, again.tokens):
            return engine_fault("seed", f"seed 1234 gave {first.text!r}, then {again.text!r}")
        other = await self.ask(replace(sampled, seed=4321))
        return Check(
            "seed",
            OK,
            f"seed 1234 twice: the same {first.tokens} tokens; seed 4321 "
            f"{'differs' if other.text != first.text else 'gave the same text'}",
        )

    async def logprobs(self) -> Check:
        unsupported = self.runtime.flavor.no_top_logprobs
        top = 0 if unsupported else 2
        answer, _ = await self.ask_for_tokens(SamplingParams(temperature=0.0, logprobs=top))
        if len(answer.logprobs) != answer.tokens or not answer.tokens:
            return engine_fault("logprobs", f"{len(answer.logprobs)} log probs for {answer.tokens} tokens")
        if top and any(len(entry.top_ids) != top for entry in answer.logprobs):
            return engine_fault("logprobs", "a token came without its top 2")
        detail = f"{answer.tokens} tokens with their log probs"
        if top:
            return Check("logprobs", OK, f"{detail} and top {top}")
        return Check("logprobs", OK, f"{detail}; top log probs unsupported: {unsupported}")

    async def guided(self) -> Check:
        unsupported = self.runtime.flavor.no_guides
        if unsupported:
            return Check("guided", UNSUPPORTED, unsupported)
        answer = await self.ask(SamplingParams(temperature=0.0, guide=("regex", "(yes|no)")))
        if answer.text not in ("yes", "no"):
            return engine_fault("guided", f"regex (yes|no) gave {answer.text!r}")
        return Check("guided", OK, f"regex (yes|no) gave {answer.text!r}")

    async def lora(self) -> Check:
        adapters = list(self.runtime.adapters)
        if not adapters:
            return Check("lora", UNSUPPORTED, "no adapters packed (pack_model.py --lora NAME=DIR)")
        answer, _ = await self.ask_for_tokens(SamplingParams(temperature=0.0, lora=adapters[0]))
        if answer.tokens < 1:
            return engine_fault("lora", f"adapter {adapters[0]!r}: no tokens came back")
        return Check("lora", OK, f"adapter {adapters[0]!r}: {answer.tokens} tokens")

    async def beams(self) -> Check:
        """Beam search where the engine can: its beams (the LLM API: exactly its max_beam_width),
        the best two returned, in one response."""
        limit, exact = self.runtime.flavor.beam_limit
        if limit < 2:
            return Check(
                "beams",
                UNSUPPORTED,
                f"max_beam_width {limit}: pack the model with --max-beam-width N (a C++ engine: built with it)",
            )
        width = limit if exact else 2
        params = SamplingParams(temperature=0.0, max_tokens=self.max_tokens, beam_width=width)
        request = await self.prepare(params)
        stream = await self.runtime.generate(replace(request, num_return=2))
        try:
            beams = await stream.beams()
        finally:
            stream.close()
        if len(beams) != 2 or not all(tokens for _, tokens, _ in beams):
            return engine_fault("beams", f"beam width {width}: got {[(t, n) for t, n, _ in beams]}")
        got = f"2 beams of {beams[0][1]} and {beams[1][1]} tokens"
        if self.runtime.flavor.beam_packed:
            return Check("beams", OK, f"{BEAM_PACKED.format(width=width)}; {got}")
        return Check("beams", OK, f"beam width {width}: {got}")

    async def run(self, names: Sequence[str] = PROBES) -> list[Check]:
        """The checks of `names` (methods of this class), in that order."""
        checks = []
        for name in names:
            try:
                checks.append(await getattr(self, name)())
            except APIError as exc:
                if exc.status == 400:  # what this model was packed without, as the service says it
                    checks.append(Check(name, UNSUPPORTED, f"{exc.status}: {exc.message}"))
                else:
                    checks.append(engine_fault(name, f"{exc.status}: {exc.message}"))
            except Exception as exc:  # a doctor reports; it does not crash on the first fault
                checks.append(engine_fault(name, f"{type(exc).__name__}: {exc}"))
        return checks


def runtime_lora_line(runtime: Any) -> str:
    """Whether adapters can be loaded while serving, and from where (the doctor's facts)."""
    settings = runtime.settings
    if not settings.allow_runtime_lora_updating:
        return "off (TRTLLM_ALLOW_RUNTIME_LORA_UPDATING unset)"
    root = settings.lora_root or "unset: BentoML model tags only"
    why = runtime.lora_limits.unavailable
    return f"on, TRTLLM_LORA_ROOT {root}" + (f"; but {why}" if why else "")


async def probe_lora_load(runtime: Any, lora_path: str, name: str = "doctor-probe") -> Check:
    """Loads the adapter at `lora_path` as /v1/load_lora_adapter would, asks one request of it and
    unloads it (the set every worker sees is left as it was)."""
    try:
        entry = await runtime.load_adapter(name, lora_path, replace=True)
    except APIError as exc:
        return Check("lora load", FAILED, f"{lora_path!r}: {exc.message}")
    try:
        answer = await FeatureProbe(runtime).ask(SamplingParams(temperature=0.0, lora=name))
    except APIError as exc:
        return engine_fault("lora load", f"adapter {lora_path!r} loaded, its request failed: {exc.message}")
    finally:
        await runtime.unload_adapter(name)
    if not answer.tokens:
        return engine_fault("lora load", f"adapter {lora_path!r}: no tokens came back")
    detail = f"{lora_path!r} loaded (rank {entry['rank']}), {answer.tokens} tokens, unloaded"
    return Check("lora load", OK, detail)


async def diagnose(tag: str | None, lora_path: str | None = None) -> tuple[dict[str, Any], list[Check]]:
    """Starts the model's Triton as the service does, checks it (with `lora_path`: one load and
    unload of that adapter), stops it."""
    import bentoml

    from trtllm_service import served_model as served
    from trtllm_service.runtime import Runtime, default_model_tag
    from trtllm_service.settings import get_settings

    settings = get_settings()
    chosen = default_model_tag(tag or settings.model_tag)
    model = bentoml.models.get(chosen)
    runtime = Runtime(Path(model.path), str(model.tag.name), settings)
    runtime.load()
    why = "named on the command line" if tag else served.CHOSEN.get(chosen)
    facts: dict[str, Any] = {
        "model": str(model.tag),
        **({"chosen by": why} if why else {}),
        "flavor": runtime.flavor.name,
        "image (pinned)": pinned.IMAGE,
        "tensorrt_llm (pinned)": pinned.TENSORRT_LLM_VERSION,
    }
    options = runtime.info.llm_options_line()
    if options:
        facts["llm options"] = options
    facts["runtime lora loading"] = runtime_lora_line(runtime)
    try:
        await runtime.start()
        await runtime.learn_engine()
        facts["engine"] = runtime.engine
        facts["triton"] = triton_version(runtime.triton.http_url)
        checks = flavor_checks(runtime.flavor)
        checks += environment_checks(runtime.info, runtime.engine, installed_tensorrt_llm())
        checks += llm_options_checks(runtime.info, runtime.engine)
        checks += await FeatureProbe(runtime).run()
        if lora_path is not None:
            checks.append(await probe_lora_load(runtime, lora_path))
    finally:
        await runtime.stop()
    return facts, checks


def report(facts: dict[str, Any], checks: Sequence[Check]) -> str:
    width = max(len(check.name) for check in checks)
    lines = [f"{key}: {value}" for key, value in facts.items()]
    lines += [f"  {check.name:<{width}}  {check.status:<11}  {check.detail}" for check in checks]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "model",
        nargs="?",
        help="model store tag (default: the one `bentoml serve .` serves: TRTLLM_MODEL, else the served "
        "model pack_model.py recorded, else the only packed one)",
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument(
        "--probe-lora-load",
        metavar="LORA_PATH",
        help="load this adapter (a directory under TRTLLM_LORA_ROOT, or a BentoML model tag) as "
        "/v1/load_lora_adapter would, ask one request of it, and unload it",
    )
    args = parser.parse_args(argv)
    try:
        facts, checks = asyncio.run(diagnose(args.model, args.probe_lora_load))
    except Exception as exc:  # the model cannot be found or Triton cannot start: one line
        print(f"{PROG}: error: {' '.join(str(exc).split()) or type(exc).__name__}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"facts": facts, "checks": [asdict(check) for check in checks]}, indent=2))
    else:
        print(report(facts, checks))
    return 1 if any(check.status == FAILED for check in checks) else 0


if __name__ == "__main__":
    sys.exit(main())
