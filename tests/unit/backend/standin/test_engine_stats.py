"""The engine's statistics without Triton: the reference engine's prefix reuse and KV block counts
(TensorRT-LLM's kvCacheStats), the iteration-stats dicts our stand-ins return from `get_stats`, and
the metric values each flavour publishes from them (trtllm-serve's names; the C++ backend's families).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from engine import EngineLoop
from engine_metrics import LLMAPI_FAMILIES, LlmApiStats
from engine_stats import CPP_FAMILIES, CppBackendStats, cpp_backend_metrics, snapshot
from prefix_cache import PrefixStore
from reference import ReferenceSource

from tests.unit.backend.standin.engine_harness import Recorder, Sink, ids_and_log_probs, request


def test_prefix_store_matches_whole_blocks_and_leaves_the_last_token() -> None:
    store = PrefixStore(tokens_per_block=4, entries=2)
    first = list(range(10))
    assert store.lookup(first) == (0, None)
    store.count_prompt(len(first), 0)
    store.keep(first, "layers-1")
    # The same prompt: two whole blocks (8 tokens) of its 9 leading tokens; the 10th is computed.
    assert store.lookup(first) == (8, "layers-1")
    assert store.lookup(list(range(9))) == (8, "layers-1")
    assert store.lookup(list(range(8))) == (4, "layers-1")  # the last token stays to compute
    assert store.lookup([0, 1, 2, 9, 4, 5, 6, 7, 8]) == (0, None)  # differs in the first block
    assert store.lookup(first, salt="adapter") == (0, None)
    store.count_prompt(10, 8)
    assert (store.reused, store.missed) == (2, 3 + 1)
    assert store.alloc_total == 6 and store.alloc_new == 4
    assert store.hit_rate == pytest.approx(2 / 6)
    # Least recently used goes first.
    store.keep([7] * 8, "layers-2")
    store.keep([8] * 8, "layers-3")
    assert store.lookup(first) == (0, None)
    assert store.lookup([8] * 8 + [1]) == (8, "layers-3")


def test_prefix_store_off_reuses_nothing_but_counts() -> None:
    store = PrefixStore(tokens_per_block=4, enabled=False)
    store.keep(list(range(10)), "layers")
    assert store.lookup(list(range(10))) == (0, None)
    store.count_prompt(10, 0)
    assert (store.reused, store.missed) == (0, 3)


@pytest.fixture(scope="module")
def reusing(demo_model_dir: Path) -> ReferenceSource:
    return ReferenceSource(
        str(demo_model_dir), "cpu", "float32", slots=2, max_len=512, block_reuse=True, tokens_per_block=32
    )


def test_reference_engine_reuses_a_repeated_prompt_and_counts_it(reusing: ReferenceSource) -> None:
    prompt = torch.randint(0, 1000, (100,), generator=torch.Generator().manual_seed(3)).tolist()
    loop = EngineLoop(reusing, Recorder(), Recorder(), cancel_check_s=0.0)
    try:
        outputs = []
        for _ in range(2):
            sink = Sink()
            loop.submit(request(prompt, 8), sink)
            assert sink.done.wait(120)
            outputs.append(ids_and_log_probs(sink.final)[0])
        deadline = time.monotonic() + 5
        while loop.num_active and time.monotonic() < deadline:  # the round ends after the reply
            time.sleep(0.01)
        stats = snapshot(loop, reusing, {})
    finally:
        loop.shutdown()
    # The second run took the first run's three whole blocks (96 of 99 leading tokens) and
    # computed the rest; greedy output is the same.
    assert outputs[0] == outputs[1]
    kv = stats["kvCacheStats"]
    assert kv["reusedBlocks"] == 3
    assert kv["missedBlocks"] == 4 + 1
    assert kv["cacheHitRate"] == pytest.approx(3 / 8)
    assert kv["tokensPerBlock"] == 32 and kv["maxNumBlocks"] == 2 * 16
    assert kv["usedNumBlocks"] == 0 and kv["freeNumBlocks"] == kv["maxNumBlocks"]  # all released
    assert kv["allocTotalBlocks"] == 2 * 4 and kv["allocNewBlocks"] == 8 - 3
    assert stats["numActiveRequests"] == 0 and stats["numQueuedRequests"] == 0
    assert stats["iter"] >= 16 and stats["maxNumActiveRequests"] == 2
    assert "specDecodingStats" not in stats  # the engine does not speculate


class Speculating:
    """A source with the counters a speculating reference engine keeps (cumulative since start)."""

    capacity = 4

    def __init__(self) -> None:
        self.counts = {"draft_tokens": 0, "accepted_draft_tokens": 0, "verify_passes": 0, "decode_steps": 0}

    def speculative_counters(self) -> dict[str, int]:
        return dict(self.counts)


def test_snapshot_turns_cumulative_speculative_counts_into_each_iterations() -> None:
    source, last = Speculating(), {}
    assert "specDecodingStats" not in snapshot(object(), source, last)  # nothing drafted yet
    source.counts.update(draft_tokens=12, accepted_draft_tokens=6, verify_passes=3, decode_steps=9)
    first = snapshot(object(), source, last)["specDecodingStats"]
    assert first == {
        "numDraftTokens": 12,
        "numAcceptedTokens": 6,
        "numRequestsWithDraftTokens": 3,
        "acceptanceLength": 3.0,
    }
    source.counts.update(draft_tokens=16, accepted_draft_tokens=6, verify_passes=4, decode_steps=10)
    second = snapshot(object(), source, last)["specDecodingStats"]
    assert second["numDraftTokens"] == 4 and second["numAcceptedTokens"] == 0
    assert second["acceptanceLength"] == 1.0


def kv(reused: int, missed: int, used: int = 5) -> dict[str, float]:
    return {
        "maxNumBlocks": 20,
        "freeNumBlocks": 20 - used,
        "usedNumBlocks": used,
        "tokensPerBlock": 32,
        "reusedBlocks": reused,
        "missedBlocks": missed,
        "cacheHitRate": reused / (reused + missed) if reused + missed else 0.0,
    }


def test_llmapi_metrics_from_iteration_stats() -> None:
    stats = LlmApiStats()
    gauges, counters = stats.values([])
    assert gauges == {} and counters == {}
    iterations = [
        {
            "iter": 1,
            "numActiveRequests": 1,
            "numQueuedRequests": 0,
            "iterLatencyMS": 10.0,
            "kvCacheStats": kv(0, 4),
        },
        {
            "iter": 2,
            "numActiveRequests": 2,
            "numQueuedRequests": 3,
            "iterLatencyMS": 20.0,
            "kvCacheStats": kv(3, 5),
            "specDecodingStats": {
                "numDraftTokens": 8,
                "numAcceptedTokens": 5,
                "numRequestsWithDraftTokens": 2,
                "acceptanceLength": 3.5,
            },
        },
    ]
    gauges, counters = stats.values(iterations)
    assert gauges["trtllm_kv_cache_utilization"] == 0.25
    assert gauges["trtllm_kv_cache_hit_rate"] == pytest.approx(3 / 8)
    assert gauges["trtllm_num_requests_running"] == 2 and gauges["trtllm_num_requests_waiting"] == 3
    assert gauges["trtllm_iteration_latency_seconds"] == pytest.approx(0.02)
    assert gauges["trtllm_spec_decode_acceptance_length"] == 3.5
    assert counters["trtllm_kv_cache_reused_blocks_total"] == 3
    assert counters["trtllm_kv_cache_missed_blocks_total"] == 5
    assert counters["trtllm_spec_decode_num_drafts_total"] == 2
    assert counters["trtllm_spec_decode_num_draft_tokens_total"] == 8
    assert counters["trtllm_spec_decode_num_accepted_tokens_total"] == 5
    # Cumulative block counts become increments; a count that went down (a restart) starts over.
    _, counters = stats.values([{"kvCacheStats": kv(4, 5)}])
    assert counters == {"trtllm_kv_cache_reused_blocks_total": 1, "trtllm_kv_cache_missed_blocks_total": 0}
    _, counters = stats.values([{"kvCacheStats": kv(1, 2)}])
    assert counters == {"trtllm_kv_cache_reused_blocks_total": 1, "trtllm_kv_cache_missed_blocks_total": 2}
    # Without KV stats or speculation (the synthetic engine): those families get nothing.
    gauges, counters = stats.values([{"numActiveRequests": 0, "numQueuedRequests": 0}])
    assert set(gauges) == {"trtllm_num_requests_running", "trtllm_num_requests_waiting"} and counters == {}
    assert set(gauges) | set(counters) <= set(LLMAPI_FAMILIES)


def test_cpp_backend_metrics_fill_the_backends_families() -> None:
    values = cpp_backend_metrics(
        {
            "iter": 7,
            "numActiveRequests": 2,
            "numQueuedRequests": 1,
            "maxNumActiveRequests": 8,
            "kvCacheStats": kv(3, 5),
        }
    )
    family = "nv_trt_llm_kv_cache_block_metrics"
    assert values[(family, "fraction")] == 0.25
    assert values[(family, "reused")] == 3 and values[(family, "tokens_per")] == 32
    assert values[(family, "max")] == 20 and values[(family, "free")] == 15 and values[(family, "used")] == 5
    assert values[("nv_trt_llm_request_metrics", "waiting")] == 1
    assert values[("nv_trt_llm_request_metrics", "active")] == 2
    assert values[("nv_trt_llm_request_metrics", "max")] == 8
    assert values[("nv_trt_llm_general_metrics", "iteration_counter")] == 7
    # Every label value is one the backend's reporter declares for its family.
    for name, value_label in values:
        assert value_label in CPP_FAMILIES[name][2]


def test_publisher_rows_name_kind_and_label_each_flavours_families() -> None:
    """What triton_adapter.MetricsPublisher publishes: the llmapi model's rows (trtllm-serve's names,
    labelled by engine), the ensemble stand-in's (the C++ backend's gauges, labelled by version)."""
    stats = {"iter": 7, "numActiveRequests": 2, "numQueuedRequests": 1, "kvCacheStats": kv(3, 5)}
    llmapi = LlmApiStats()
    rows = llmapi.metrics([stats])
    gauges, counters = LlmApiStats().values([stats])
    assert [(name, value) for name, _, _, _, value in rows] == [*gauges.items(), *counters.items()]
    for name, kind, description, label, _ in rows:
        assert (kind, description) == LLMAPI_FAMILIES[name] and label is None
    assert llmapi.labels("m", "reference") == {"model": "m", "engine": "reference"}
    cpp = CppBackendStats()
    rows = cpp.metrics([{}, stats])  # the newest iteration's
    values = cpp_backend_metrics(stats)
    assert {(name, label[1]): value for name, _, _, label, value in rows if "timestamp" not in label} == {
        key: value for key, value in values.items() if key[1] != "timestamp"
    }
    for name, kind, description, label, _ in rows:
        assert kind == "gauge" and description == CPP_FAMILIES[name][0] and label[0] == CPP_FAMILIES[name][1]
    assert cpp.labels("m", "reference") == {"model": "m", "version": "1"}


def _standin_source(kind: str, model_dir: str, tokenizer_dir: str, **options: Any) -> tuple[Any, int, int]:
    source = ReferenceSource(
        model_dir,
        options["device"],
        options["dtype"],
        slots=options["slots"] or 2,
        max_len=options["max_seq_len"] or 512,
        block_reuse=options["block_reuse"],
        tokens_per_block=options["tokens_per_block"],
    )
    return source, source.vocab_size, source.max_len


def test_standin_llm_get_stats_as_the_llm_api(demo_model_dir: Path) -> None:
    import llm_standin
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(demo_model_dir))
    api = llm_standin.StandIn("reference", tokenizer, _standin_source, log=lambda _: None)

    def make(**extra: Any) -> Any:
        return api.LLM(**api.update_llm_args_with_extra_dict({}, {"model": str(demo_model_dir), **extra}))

    async def generate(llm: Any, ids: list[int]) -> None:
        async for _ in llm.generate_async(ids, sampling_params=llm_standin.SamplingParams(max_tokens=3)):
            pass

    async def stats_async(llm: Any) -> list[dict[str, Any]]:
        return [stats async for stats in llm.get_stats_async(timeout=1)]

    quiet = make(kv_cache_config={"enable_block_reuse": True})
    try:
        assert quiet.get_stats(timeout=1) == []  # upstream's default: no iteration stats
    finally:
        quiet.shutdown()
    llm = make(
        enable_iter_perf_stats=True, kv_cache_config={"enable_block_reuse": True, "tokens_per_block": 16}
    )
    try:
        prompt = list(range(5, 45))  # two whole blocks of 16, and then some
        loop = asyncio.new_event_loop()  # the stand-in serves one event loop, as the model's
        try:
            loop.run_until_complete(generate(llm, prompt))
            loop.run_until_complete(generate(llm, prompt))
        finally:
            loop.close()
        (stats,) = llm.get_stats(timeout=1)
        assert stats["kvCacheStats"]["tokensPerBlock"] == 16
        assert stats["kvCacheStats"]["reusedBlocks"] == 2 and stats["kvCacheStats"]["missedBlocks"] == 3 + 1
        assert asyncio.run(stats_async(llm))[0]["kvCacheStats"]["reusedBlocks"] == 2
    finally:
        llm.shutdown()
