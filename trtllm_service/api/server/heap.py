"""The worker's heap after start-up: kept out of the garbage collector's full collections.

A worker holds about 500,000 objects once it has started (BentoML, FastAPI, transformers, the
tokenizer), none of which become garbage while it serves. CPython's full collection walks all of
them, and every stream the worker relays waits meanwhile: 110-460 ms a pass on 2 cores (logged with
bench/stacks' BENCH_GC_LOG while workers started). While serving, a full pass comes only once the
objects that survived younger passes reach a quarter of that heap: rarely (none in a 22 s,
32-stream run, whose younger passes cost 0.4 us per streamed token), but then as one stall of all
the worker's streams. Frozen, the start-up objects sit in the collector's permanent generation: a
full pass walks only what was made since, and objects that die by reference count are freed as
before.
"""

from __future__ import annotations

import gc
import logging

logger = logging.getLogger("trtllm_service")


def freeze_startup_heap() -> int:
    """Collects what start-up left as garbage, then freezes the rest. Returns the objects frozen."""
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    logger.debug("%d start-up objects frozen out of the garbage collector's passes", frozen)
    return frozen
