"""NVIDIA's LLM API contract at TensorRT-LLM 1.2.1 (tensorrtllm_backend/nvidia_llmapi.py), without Triton.

Each test_finding_* holds a finding of issue 21: our llmapi config.pbtxt keeps upstream's tensors,
model.yaml is checked as TorchLlmArgs checks it (and packing writes only 1.2.1 fields), the stand-in
LLM API (llm_standin.py) is the 1.2.1 surface with its refusals, and the production path
(llm_engine.LLMEngine) runs here on the reference engine through it.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import llm_standin
import numpy as np
import nvidia_llmapi as nv
import pytest
import yaml
from google.protobuf import text_format
from llm_engine import LLMEngine, token_log_probs
from llmapi_contract import TextLimits, parse_text_request, text_arrays
from pydantic import ValidationError
from shared_contract import RequestError
from tritonclient.grpc import model_config_pb2

from tensorrtllm_backend import LLMAPI_TEMPLATES_DIR
from tensorrtllm_backend.lora import Adapter
from tensorrtllm_backend.repository import fill_model_config, repository_values
from trtllm_service.packing.adapters import lora_values
from trtllm_service.packing.options import RuntimeOptions
from trtllm_service.packing.sources import read_hf_checkpoint

pytestmark = pytest.mark.unit

TEMPLATE = LLMAPI_TEMPLATES_DIR / "tensorrt_llm"


# ---- the Triton model's tensors ---------------------------------------------------------------------


def _config(tmp_path: Path) -> Any:
    values = repository_values(engine_dir=tmp_path, tokenizer_dir=tmp_path, overrides={"end_ids": "7"})
    text = fill_model_config("tensorrt_llm", values, LLMAPI_TEMPLATES_DIR)
    return text_format.Parse(text, model_config_pb2.ModelConfig())


def _declared(tensors: Any) -> dict[str, tuple[str, tuple[int, ...]]]:
    return {
        t.name: ("TYPE_" + model_config_pb2.DataType.Name(t.data_type).removeprefix("TYPE_"), tuple(t.dims))
        for t in tensors
    }


def test_finding_config_pbtxt_keeps_every_upstream_tensor(tmp_path: Path) -> None:
    config = _config(tmp_path)
    inputs, outputs = _declared(config.input), _declared(config.output)
    for tensor, declared in [*((t, inputs) for t in nv.INPUTS), *((t, outputs) for t in nv.OUTPUTS)]:
        assert declared.get(tensor.name) == (tensor.datatype, tensor.dims), tensor.name
    # Every other tensor is ours, and says so where it is declared.
    upstream = {t.name for t in (*nv.INPUTS, *nv.OUTPUTS)}
    for line in (TEMPLATE / "config.pbtxt").read_text().splitlines():
        if line.strip().startswith("{ name:"):
            name = line.split('"')[1]
            assert (name in upstream) != ("# ours" in line), line
    assert nv.input_tensor("text_input").optional is False  # upstream's; ours relaxes it (input_ids)
    with pytest.raises(KeyError, match="not an input of NVIDIA's llmapi model"):
        nv.input_tensor("input_ids")


def test_finding_cumulative_logprob_is_fp32(tmp_path: Path) -> None:
    (declared,) = [o for o in _config(tmp_path).output if o.name == "cumulative_logprob"]
    assert model_config_pb2.DataType.Name(declared.data_type) == "TYPE_FP32"
    request = _text_request(return_cumulative_logprob=True)
    sent = text_arrays(request, "x", generated=1, cumulative_logprob=-1.5)["cumulative_logprob"]
    assert sent.dtype == np.float32 and sent.tolist() == [-1.5]
    none = text_arrays(request, "x", generated=1, cumulative_logprob=None)["cumulative_logprob"]
    assert none.dtype == np.float32 and math.isnan(none[0])  # upstream sends the string "None"


# ---- model.yaml: TorchLlmArgs, update_llm_args_with_extra_dict ----------------------------------------


def _errors(error: ValidationError) -> dict[str, str]:
    return {".".join(str(p) for p in e["loc"]): e["msg"] for e in error.errors()}


def test_finding_model_yaml_unknown_key_fails_like_llm_args() -> None:
    good = {"model": "/m", "kv_cache_config": {"free_gpu_memory_fraction": 0.5}, "_mpi_session": object()}
    args = nv.validate_llm_args(good)
    assert args.max_num_tokens == 8192 and args.kv_cache_config.enable_block_reuse is True
    with pytest.raises(ValidationError) as info:
        nv.validate_llm_args(
            {
                "model": "/m",
                "max_batch_sise": 8,
                "kv_cache_config": {"free_gpu_mem_fraction": 0.5},
                "lora_config": {"lora_dir": [], "max_lora": 2},
                "mpi_session": object(),  # the field takes its alias only
                "tensor_parallel_size": "two",
            }
        )
    errors = _errors(info.value)
    assert info.value.title == "TorchLlmArgs"
    for key in (
        "max_batch_sise",
        "kv_cache_config.free_gpu_mem_fraction",
        "lora_config.max_lora",
        "mpi_session",
    ):
        assert errors.pop(key) == nv.EXTRA_FORBIDDEN, key
    assert errors == {
        "tensor_parallel_size": "Input should be a valid integer, unable to parse string as an integer"
    }
    with pytest.raises(ValidationError, match="less than or equal to 1"):
        nv.validate_llm_args({"model": "/m", "kv_cache_config": {"free_gpu_memory_fraction": 1.5}})
    with pytest.raises(ValueError, match="specific to TensorRT backend"):
        nv.validate_llm_args({"model": "/m", "build_config": {}})
    # The stand-in's LLM() refuses the same before building anything.
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        _standin("synthetic", None).LLM(model="/m", kv_cache_config={"nope": 1})


def test_finding_update_llm_args_with_extra_dict_is_upstreams_merge() -> None:
    merge = llm_standin.update_llm_args_with_extra_dict
    assert merge({}, {"model": "/m", "lora_config": {"lora_dir": []}}) == {
        "model": "/m",
        "lora_config": {"lora_dir": []},
    }
    with pytest.raises(
        TypeError, match=r"LoraConfig\(\) argument after \*\* must be a mapping, not NoneType"
    ):
        merge({}, {"model": "/m", "lora_config": None})  # why model.py leaves nulls out
    assert nv.drop_nulls({"a": None, "b": {"c": None, "d": 1}, "e": 0}) == {"b": {"d": 1}, "e": 0}
    assert set(nv.EXTRA_DICT_CLASSES) >= {"lora_config", "quant_config", "build_config", "moe_config"}
    assert nv.UPDATE_LLM_ARGS[0] == ("tensorrt_llm.llmapi.llm_utils", "update_llm_args_with_extra_dict")


def _packed_model_yaml(
    tmp_path: Path, demo_model_dir: Path, options: RuntimeOptions, adapters: dict[str, Adapter] | None = None
) -> dict:
    source = read_hf_checkpoint(demo_model_dir, mode="demo")
    values = options.template_values(source)
    if adapters is None:
        adapters = {
            "poet": Adapter(rank=4, alpha=8, target_modules=("q_proj", "v_proj"), factors={}),
            "critic": Adapter(rank=8, alpha=8, target_modules=("o_proj", "down_proj"), factors={}),
        }
    values = repository_values(
        engine_dir=demo_model_dir,
        tokenizer_dir=demo_model_dir,
        overrides={
            "end_ids": "1",
            **values,
            **lora_values(
                adapters,
                tmp_path,
                cache=options.lora_cache_adapters,
                max_rank=options.max_lora_rank,
                modules=options.lora_target_modules,
            ),
        },
    )
    from tensorrtllm_backend.tools.fill_template import fill_text, placeholders

    text = (TEMPLATE / "1" / "model.yaml").read_text()
    data = yaml.safe_load(fill_text(text, {k: values[k] for k in placeholders(text)}, source="model.yaml"))
    data.pop("triton_config")
    return data


@pytest.mark.parametrize(
    "options",
    [
        RuntimeOptions(),
        RuntimeOptions(
            max_batch_size=4,
            max_num_tokens=512,
            max_seq_len=1024,
            dtype="float32",
            trust_remote_code=True,
            enable_kv_cache_reuse=True,
            enable_chunked_context=True,
            kv_cache_free_gpu_mem_fraction=0.5,
            lora_cache_adapters=2,
        ),
    ],
)
def test_finding_packing_writes_only_llm_api_fields(
    tmp_path: Path, demo_model_dir: Path, options: RuntimeOptions
) -> None:
    """Every key packing writes into model.yaml is a 1.2.1 TorchLlmArgs / KvCacheConfig / LoraConfig
    field (present in both versions around the tag), and the whole validates as TorchLlmArgs."""
    data = _packed_model_yaml(tmp_path, demo_model_dir, options)
    assert nv.unknown_keys(data) == []
    assert nv.unknown_keys(nv.drop_nulls(data)) == []
    args = nv.validate_llm_args(nv.drop_nulls(data))
    assert args.lora_config.max_loras == options.lora_cache_adapters
    assert args.lora_config.lora_target_modules == ["attn_dense", "attn_q", "attn_v", "mlp_4h_to_h"]
    assert args.guided_decoding_backend == "xgrammar" and args.backend == "pytorch"
    assert nv.unknown_keys({**data, "env_overrides": {}}) == ["env_overrides"]  # estimated: not ours to write


def test_finding_lora_config_takes_an_empty_lora_dir(tmp_path: Path, demo_model_dir: Path) -> None:
    """--max-lora-rank with no adapter packed: LoraConfig takes lora_dir [] (1.2.1's default_factory=list;
    lora_helper.py), and the PyTorch executor then needs lora_target_modules, which packing writes
    (create_py_executor_instance asserts "Expecting at least one lora target module")."""
    data = _packed_model_yaml(tmp_path, demo_model_dir, RuntimeOptions(max_lora_rank=16), adapters={})
    args = nv.validate_llm_args(nv.drop_nulls(data))
    assert args.lora_config.lora_dir == [] and args.lora_config.max_lora_rank == 16
    llm_standin._check_lora_modules(args.lora_config)  # what StandInLLM checks when it is made
    bare = nv.validate_llm_args({"model": "/m", "lora_config": {}}).lora_config
    assert (bare.lora_dir, bare.max_lora_rank, bare.lora_target_modules) == ([], 64, [])
    with pytest.raises(AssertionError, match="Expecting at least one lora target module"):
        llm_standin._check_lora_modules(bare)
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "adapter_config.json").write_text('{"target_modules": ["q_proj"]}')
    one = nv.validate_llm_args({"model": "/m", "lora_config": {"lora_dir": [str(tmp_path / "a")]}})
    llm_standin._check_lora_modules(one.lora_config)  # inferred from the one adapter
    (tmp_path / "a" / "adapter_config.json").write_text("{}")
    with pytest.raises(ValueError, match="lora_target_modules is empty"):
        llm_standin._check_lora_modules(one.lora_config)


# ---- SamplingParams, GuidedDecodingParams ----------------------------------------------------------------


def test_finding_sampling_params_is_the_1_2_1_dataclass(monkeypatch: pytest.MonkeyPatch) -> None:
    sp = llm_standin.SamplingParams
    fields = dataclasses.fields(sp)
    assert [(f.name, f.default) for f in fields] == list(nv.SAMPLING_PARAMS)
    assert all(f.kw_only for f in fields) and not hasattr(sp(), "__dict__")  # kw_only, slots
    with pytest.raises(TypeError, match="unexpected keyword argument 'logprobs_mode'"):
        sp(logprobs_mode="raw")
    with pytest.raises(TypeError):
        sp(32)
    params = sp(end_id=5, logprobs=True, n=1)
    assert (params.pad_id, params.best_of, params.logprobs, params.max_tokens) == (5, 1, 1, 32)
    monkeypatch.delenv(nv.ALLOW_N_GREEDY_ENV, raising=False)
    for kwargs, message in (
        ({"top_p": 1.5}, "require 0 <= top_p <= 1, got top_p=1.5"),
        ({"top_k": -1}, "require top_k >= 0, got top_k=-1"),
        ({"temperature": -0.5}, "require temperature >= 0, got temperature=-0.5"),
        ({"best_of": 1, "n": 2, "temperature": 1.0}, "best_of (1) cannot be less than n (2)"),
        ({"best_of": 2}, "Greedy decoding in the LLM API does not allow multiple returns"),
        ({"truncate_prompt_tokens": 0}, "truncate_prompt_tokens must be >= 1, got 0"),
    ):
        with pytest.raises(ValueError) as info:
            sp(**kwargs)
        assert str(info.value).startswith(message), str(info.value)
    monkeypatch.setenv(nv.ALLOW_N_GREEDY_ENV, "1")
    assert sp(best_of=2).best_of == 2
    assert sp(top_k=1)._greedy_decoding and sp()._greedy_decoding and not sp(temperature=0.7)._greedy_decoding
    guided = llm_standin.GuidedDecodingParams
    assert [(f.name, f.default) for f in dataclasses.fields(guided)] == list(nv.GUIDED_DECODING_FIELDS)
    with pytest.raises(ValueError, match=r"Only one guide can be used for a request, but got 2\."):
        sp(guided_decoding=guided(regex="a+", json_object=True))


# ---- the stand-in LLM API over the reference engine -------------------------------------------------------


def _make_source(kind: str, model_dir: str, tokenizer_dir: str, **options: Any) -> tuple[Any, int, int]:
    """sources.make_source with a batch of 4 and no block reuse."""
    if kind == "reference":
        from reference import ReferenceSource

        source = ReferenceSource(
            model_dir, options["device"], options["dtype"], slots=options["slots"] or 4,
            max_len=options["max_seq_len"], tokenizer_dir=tokenizer_dir,
        )  # fmt: skip
        return source, source.vocab_size, source.max_len
    from synthetic import SyntheticSource, printable_tokens

    words = printable_tokens(tokenizer_dir)
    return SyntheticSource(words), max(words) + 1, 1 << 20


def _standin(kind: str, tokenizer: Any, log: Any = None) -> Any:
    return llm_standin.StandIn(kind, tokenizer, _make_source, log=log or (lambda _: None))


@pytest.fixture(scope="module")
def llm(demo_model_dir: Path, tokenizer: Any) -> Iterator[Any]:
    api = _standin("reference", tokenizer)
    llm = api.LLM(**api.update_llm_args_with_extra_dict({}, {"model": str(demo_model_dir)}))
    yield llm
    llm.shutdown()


def test_speculative_config_reaches_the_engine_as_its_decoding_types_object(
    demo_model_dir: Path, tokenizer: Any
) -> None:
    """model.yaml's speculative_config mapping goes through the merge as a mapping and comes out of
    LLM() as TensorRT-LLM's does: the object of its decoding type, read by attribute."""
    api = _standin("synthetic", tokenizer)
    spec = {"decoding_type": "NGram", "max_draft_len": 4, "max_matching_ngram_size": 2}
    args = api.update_llm_args_with_extra_dict({}, {"model": str(demo_model_dir), "speculative_config": spec})
    assert args["speculative_config"] == spec
    llm = api.LLM(**args)
    try:
        got = llm.args.speculative_config
        assert type(got).__name__ == "NGramDecodingConfig"
        assert (got.decoding_type, got.max_draft_len, got.max_matching_ngram_size) == ("NGram", 4, 2)
        assert got.is_keep_all and got.is_use_oldest and got.is_public_pool
    finally:
        llm.shutdown()
    with pytest.raises(ValidationError, match="max_matching_ngram_size > 0"):
        api.LLM(model=str(demo_model_dir), speculative_config={"decoding_type": "NGram", "max_draft_len": 4})


async def _steps(result: Any) -> list[tuple[str, list[int], list[dict]]]:
    """(text_diff, token_ids_diff, logprobs_diff) of every step of a result."""
    steps = []
    async for output in result:
        out = output.outputs[0]
        steps.append((out.text_diff, out.token_ids_diff, out.logprobs_diff))
    return steps


def test_finding_logprobs_are_logprob_objects(llm: Any, tokenizer: Any, loop: Any) -> None:
    ids = tokenizer.encode("The sea is", add_special_tokens=True)
    params = llm_standin.SamplingParams(max_tokens=6, top_k=1, logprobs=3, ignore_eos=True)

    async def go() -> tuple[Any, list]:
        result = llm.generate_async(ids, sampling_params=params, streaming=True)
        return result, await _steps(result)

    result, steps = loop.run_until_complete(go())
    out = result.outputs[0]
    assert result.finished and out.finish_reason == "length" and len(out.token_ids) == 6
    assert len(steps) > 1 and all(len(t) == len(lp) >= 1 for _, t, lp in steps)  # streamed, token by token
    assert sum(len(t) for _, t, _ in steps) == 6
    assert "".join(text for text, _, _ in steps) == out.text
    for token, entry in zip(out.token_ids, out.logprobs, strict=True):
        assert all(type(v) is llm_standin.Logprob for v in entry.values())
        assert sorted(v.rank for v in entry.values()) == [1, 2, 3]  # top 3, the sampled one among them
        assert entry[token].rank == 1  # greedy
    assert out.cumulative_logprob == pytest.approx(
        sum(e[t].logprob for t, e in zip(out.token_ids, out.logprobs, strict=True))
    )
    # llm_engine reads them back as the relay's arrays: each token's log prob, its top N by rank.
    got_ids, values, tops = token_log_probs(out, 0, 6, 2)
    assert got_ids == out.token_ids and [row[0][0] for row in tops] == out.token_ids
    assert all(len(row[0]) == 2 and row[1][0] >= row[1][1] for row in tops)
    assert values == [e[t].logprob for t, e in zip(out.token_ids, out.logprobs, strict=True)]


def test_finding_output_objects_have_the_pinned_shapes(llm: Any, loop: Any) -> None:
    public = [f.name for f in dataclasses.fields(llm_standin.CompletionOutput) if not f.name.startswith("_")]
    assert public == list(nv.COMPLETION_OUTPUT_FIELDS)
    assert [f.name for f in dataclasses.fields(llm_standin.Logprob)] == list(nv.LOGPROB_FIELDS)
    assert [f.name for f in dataclasses.fields(llm_standin.LoRARequest)] == list(nv.LORA_REQUEST_FIELDS)

    async def go() -> Any:
        result = llm.generate_async([1, 2, 3], sampling_params=llm_standin.SamplingParams(max_tokens=2))
        await _steps(result)
        return result

    result = loop.run_until_complete(go())
    assert all(hasattr(result, name) for name in nv.REQUEST_OUTPUT_FIELDS)
    assert result.outputs[0].finish_reason in nv.FINISH_REASONS
    assert result.outputs[0].cumulative_logprob is None and result.outputs[0].logprobs == []  # not asked


def test_finding_stop_token_is_cut_like_the_llm_api(llm: Any, tokenizer: Any, loop: Any) -> None:
    ids = tokenizer.encode("The sea is", add_special_tokens=True)

    async def go(**kwargs: Any) -> Any:
        result = llm.generate_async(ids, sampling_params=llm_standin.SamplingParams(top_k=1, **kwargs))
        await _steps(result)
        return result.outputs[0]

    free = loop.run_until_complete(go(max_tokens=12, ignore_eos=True))
    at = next(i for i in range(2, 12) if free.token_ids[i] not in free.token_ids[:i])
    stopped = loop.run_until_complete(go(max_tokens=12, stop_token_ids=[free.token_ids[at]]))
    assert (stopped.finish_reason, stopped.stop_reason) == ("stop", free.token_ids[at])
    assert stopped.token_ids == free.token_ids[:at]  # STOP_WORDS: the stop token is cut
    ended = loop.run_until_complete(go(max_tokens=12, end_id=free.token_ids[at]))
    assert (ended.finish_reason, ended.stop_reason, ended.token_ids) == ("stop", None, free.token_ids[:at])


def test_finding_streaming_is_passed_by_keyword(llm: Any, loop: Any) -> None:
    """Upstream 1.2.1 calls generate_async(prompt, params, streaming): the third parameter is
    lora_request, so nothing streams. The stand-in has the same signature and refuses that call."""
    params = list(inspect.signature(llm.generate_async).parameters)
    assert params == list(nv.GENERATE_ASYNC_PARAMETERS)

    async def upstreams_call() -> None:
        llm.generate_async([1, 2, 3], llm_standin.SamplingParams(max_tokens=2), True)

    with pytest.raises(TypeError, match="lora_request must be a LoRARequest, got bool"):
        loop.run_until_complete(upstreams_call())


def test_finding_standin_refuses_what_it_cannot_serve(llm: Any, loop: Any) -> None:
    async def call(**kwargs: Any) -> None:
        llm.generate_async([1, 2, 3], sampling_params=llm_standin.SamplingParams(temperature=1.0, **kwargs))

    for kwargs, message in (
        ({"n": 2}, "best_of 2, n 2: the stand-in engine samples one sequence"),
        ({"return_generation_logits": True}, "return_generation_logits is not modelled"),
        ({"min_p": 0.5}, "min_p is not modelled"),
    ):
        with pytest.raises(RequestError, match=message):
            loop.run_until_complete(call(**kwargs))
    with pytest.raises(ValueError, match="guided_decoding_backend"):  # model.yaml sets xgrammar
        loop.run_until_complete(call(guided_decoding=llm_standin.GuidedDecodingParams(regex="a+")))

    # beam search runs exactly the LLM's max_beam_width (unset: 1): the executor's request error
    # (test_llmapi_executor_rules.py holds the rule)
    async def beams() -> None:
        result = llm.generate_async(
            [1, 2, 3], sampling_params=llm_standin.SamplingParams(use_beam_search=True, best_of=2)
        )
        async for _ in result:
            pass

    with pytest.raises(
        llm_standin.ExecutorRequestError, match=r"beam width 2 is not equal to max_beam_width 1"
    ):
        loop.run_until_complete(beams())
    with pytest.raises(RequestError, match="embedding_bias has 3 values"):
        loop.run_until_complete(call(embedding_bias=[0.0, 1.0, 2.0]))


# ---- llm_engine.LLMEngine, the production path --------------------------------------------------------


class _Responder:
    """Triton's side: responses as the arrays themselves."""

    def response(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return arrays

    def error(self, message: str) -> dict[str, str]:
        return {"error": message}

    def invalid(self, message: str) -> dict[str, str]:
        return {"invalid": message}

    def probe(self, status: dict[str, Any]) -> dict[str, Any]:
        return {"probe": status}

    def log(self, message: str) -> None:
        pass


class _Counters:
    def __init__(self) -> None:
        self.outcomes: dict[str, int] = {}
        self.generated = 0

    def finished(self, outcome: str) -> None:
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1

    def tokens(self, count: int) -> None:
        self.generated += count


class _Sink:
    def __init__(self) -> None:
        self.responses: list[dict] = []
        self.done = threading.Event()
        self.cancelled = False

    def send(self, response: Any, final: bool) -> None:
        self.responses.append(response or {})
        if final:
            self.done.set()

    def is_cancelled(self) -> bool:
        return self.cancelled

    @property
    def text(self) -> str:
        return b"".join(r["text_output"][0] for r in self.responses if "text_output" in r).decode()


def _text_request(tokenize: Any = lambda s: [5] * len(s), **inputs: Any) -> Any:
    arrays = {"text_input": np.array([b"The sea is"], dtype=np.object_)}
    for name, value in inputs.items():
        arrays[name] = np.array([value])
    limits = TextLimits(vocab_size=1 << 20, max_seq_len=2048, end_ids=(1,))
    return parse_text_request(arrays.get, "req-1", limits, tokenize, lambda ids: "")


@pytest.fixture(scope="module")
def engine(demo_model_dir: Path, tokenizer: Any) -> Iterator[tuple[LLMEngine, _Counters, list[str]]]:
    log: list[str] = []
    api = _standin("reference", tokenizer, log.append)
    counters = _Counters()
    args = api.update_llm_args_with_extra_dict({}, {"model": str(demo_model_dir)})
    engine = LLMEngine(api, args, _Responder(), counters, cancel_check_s=0.05)
    yield engine, counters, log
    engine.shutdown()


def _serve(engine: LLMEngine, tokenizer: Any, **inputs: Any) -> _Sink:
    sink = _Sink()
    engine.submit_text(_text_request(tokenizer.encode, **inputs), sink)
    assert sink.done.wait(60)
    return sink


def test_finding_llm_engine_runs_in_ci(engine: Any, tokenizer: Any) -> None:
    llm_engine, counters, _ = engine
    assert "LLM API stand-in over the reference engine" in llm_engine.describe()
    common = {"sampling_param_max_tokens": np.int32(20), "sampling_param_top_k": np.int32(1)}
    outputs = {"return_num_output_tokens": True, "return_finish_reason": True, "sampling_param_end_id": -1}
    streamed = _serve(llm_engine, tokenizer, streaming=True, **common, **outputs)
    whole = _serve(llm_engine, tokenizer, **common, **outputs)
    assert len(whole.responses) == 1 and len(streamed.responses) > 1
    assert streamed.text == whole.text and whole.text
    counts = [int(r["num_output_tokens"][0]) for r in streamed.responses]
    assert counts == sorted(set(counts)) and counts[-1] == 20
    reasons = [r["finish_reason"][0] for r in streamed.responses]
    assert reasons == [b"None"] * (len(reasons) - 1) + [b"length"]
    # SamplingParams' refusal, in NVIDIA's words; ours, as INVALID_ARG
    refused = _serve(llm_engine, tokenizer, sampling_param_top_p=np.float32(1.5))
    assert refused.responses == [
        {"error": "Error generating request: require 0 <= top_p <= 1, got top_p=1.5"}
    ]
    ours = _serve(llm_engine, tokenizer, sampling_param_best_of=np.int32(2), sampling_param_temperature=1.0)
    assert "best_of 2" in ours.responses[0]["invalid"]
    deadline = time.monotonic() + 5
    while counters.generated < 40 and time.monotonic() < deadline:  # counted every cancel_check_s
        time.sleep(0.05)
    assert counters.generated == 40 and counters.outcomes["error"] == 2


def test_finding_llm_engine_aborts_cancelled_and_stopped_requests(engine: Any, tokenizer: Any) -> None:
    llm_engine, counters, log = engine
    before = dict(counters.outcomes)
    for how in ("cancelled", "stopped"):
        sink = _Sink()
        request = _text_request(
            tokenizer.encode,
            streaming=True,
            sampling_param_max_tokens=np.int32(1500),
            sampling_param_end_id=-1,
        )
        llm_engine.submit_text(request, sink)
        deadline = time.monotonic() + 30
        while len(sink.responses) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        if how == "cancelled":
            sink.cancelled = True  # the client went away
        else:
            llm_engine.stop("req-1")  # upstream's `stop` request
        assert sink.done.wait(10)
        assert sink.responses[-1]["text_output"].tolist() == [b""]
        assert len(sink.text) < 1500
        assert counters.outcomes[how] == before.get(how, 0) + 1
    # The engine loop itself dropped both (RequestOutput.abort() reached it), not only the relay.
    deadline = time.monotonic() + 5
    while sum("cancelled after" in line for line in log) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sum("cancelled after" in line for line in log) == 2, log
    assert llm_engine.in_flight == 0


def test_finding_llm_engine_shutdown_drains_requests_in_flight(demo_model_dir: Path, tokenizer: Any) -> None:
    api = _standin("synthetic", tokenizer)
    api.step_delay_s = 0.01
    llm_engine = LLMEngine(
        api, {"model": str(demo_model_dir)}, _Responder(), _Counters(), cancel_check_s=0.05
    )
    sink = _Sink()
    request = _text_request(
        tokenizer.encode,
        streaming=True,
        sampling_param_max_tokens=np.int32(30),
        return_num_output_tokens=True,
    )
    llm_engine.submit_text(request, sink)
    llm_engine.shutdown(timeout_s=20)  # waits for the request, then shuts the LLM down
    assert sink.done.is_set() and int(sink.responses[-1]["num_output_tokens"][0]) == 30
    assert all(set(r) == {"text_output", "num_output_tokens"} for r in sink.responses)


class _ThreadRecordingSink(_Sink):
    """A sink that notes which thread calls it (Triton's response sender in production)."""

    def __init__(self) -> None:
        super().__init__()
        self.callers: set[str] = set()

    def send(self, response: Any, final: bool) -> None:
        self.callers.add(threading.current_thread().name)
        super().send(response, final)

    def is_cancelled(self) -> bool:
        self.callers.add(threading.current_thread().name)
        return super().is_cancelled()


def test_only_a_requests_lane_calls_its_response_sender(demo_model_dir: Path, tokenizer: Any) -> None:
    # A call into Triton's Python backend may block on the server; the loop must never make one,
    # and no two threads may race on one sender (its final response frees it). So its lane sends
    # and asks is_cancelled(); the watcher only asks the lane to.
    api = _standin("synthetic", tokenizer)
    api.step_delay_s = 0.01
    llm_engine = LLMEngine(
        api, {"model": str(demo_model_dir)}, _Responder(), _Counters(), cancel_check_s=0.02
    )
    try:
        done, cancelled = _ThreadRecordingSink(), _ThreadRecordingSink()
        request = _text_request(tokenizer.encode, streaming=True, sampling_param_max_tokens=np.int32(20))
        llm_engine.submit_text(request, done)
        endless = _text_request(
            tokenizer.encode,
            streaming=True,
            sampling_param_max_tokens=np.int32(5000),
            sampling_param_end_id=-1,
        )
        llm_engine.submit_text(endless, cancelled)
        time.sleep(0.3)
        cancelled.cancelled = True
        assert done.done.wait(20) and cancelled.done.wait(20)
        for sink in (done, cancelled):
            assert sink.callers and all(name.startswith("llm-api-send-") for name in sink.callers), (
                sink.callers
            )
        assert len(cancelled.text) < 5000
    finally:
        llm_engine.shutdown(timeout_s=20)


def test_the_probe_is_answered_through_a_lane_with_the_engines_status(
    demo_model_dir: Path, tokenizer: Any
) -> None:
    api = _standin("synthetic", tokenizer)
    api.step_delay_s = 0.3  # a slow step: busy, not stuck
    llm_engine = LLMEngine(
        api, {"model": str(demo_model_dir)}, _Responder(), _Counters(), cancel_check_s=0.05
    )
    try:
        idle = _ThreadRecordingSink()
        llm_engine.probe(idle)
        assert idle.done.wait(5)
        assert idle.responses == [{"probe": {"in_flight": 0, "idle_s": 0.0, "busy": False}}]
        assert all(name.startswith("llm-api-send-") for name in idle.callers)
        working = _Sink()
        request = _text_request(tokenizer.encode, streaming=True, sampling_param_max_tokens=np.int32(4))
        llm_engine.submit_text(request, working)
        time.sleep(0.15)
        busy = _Sink()
        llm_engine.probe(busy)
        assert busy.done.wait(5)
        status = busy.responses[0]["probe"]
        assert status["in_flight"] == 1 and status["busy"] is True and 0 <= status["idle_s"] < 5
        assert working.done.wait(20)
    finally:
        llm_engine.shutdown(timeout_s=20)
