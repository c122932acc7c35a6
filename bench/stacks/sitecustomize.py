"""Benchmark-only hooks for every Python process started with this folder on PYTHONPATH (the
service's workers, the load generators); it takes the place of any other sitecustomize for them.

- SIGUSR2: all threads' stacks to stderr (faulthandler), so that a run that stalls says where each
  process waits (`bench/relay.py` sends it before giving up on a run).
- An in-process sampling profiler, for machines where py-spy cannot attach (the GPU box's VM):
  SIGRTMIN+5 starts sampling the main thread's stack every 0.5 ms of the process's CPU time
  (ITIMER_PROF, so samples are proportional to CPU, syscalls included), SIGRTMIN+6 stops it and
  writes the collapsed stacks, in py-spy's raw format, to $BENCH_PROFILE_DIR/<pid>.txt. Python runs
  the handler between bytecodes: time in a C call is charged to the line that made it.
- $BENCH_TIMELINE: timestamps along each request's path to its first token (`timeline.py`,
  `bench/ttft_breakdown.py`).
- $BENCH_GC_LOG (a folder): every garbage collection, appended to <folder>/<pid>.gc as one line
  (wall time, generation, CPU microseconds, objects collected), to tell start-up from serving.
"""

import faulthandler
import os
import signal

faulthandler.register(signal.SIGUSR2, all_threads=True)

if os.environ.get("BENCH_PROFILE_DIR"):
    _counts: dict[str, int] = {}

    def _sample(signum: int, frame: object) -> None:
        parts = []
        while frame is not None:
            code = frame.f_code  # type: ignore[attr-defined]  # a frame, typed object
            name = getattr(code, "co_qualname", code.co_name)
            parts.append(f"{name} ({code.co_filename}:{frame.f_lineno})")  # type: ignore[attr-defined]  # a frame, typed object
            frame = frame.f_back  # type: ignore[attr-defined]  # a frame, typed object
        stack = ";".join(reversed(parts))
        _counts[stack] = _counts.get(stack, 0) + 1

    def _start(signum: int, frame: object) -> None:
        _counts.clear()
        signal.setitimer(signal.ITIMER_PROF, 0.0005, 0.0005)

    def _stop(signum: int, frame: object) -> None:
        signal.setitimer(signal.ITIMER_PROF, 0.0)
        path = os.path.join(os.environ["BENCH_PROFILE_DIR"], f"{os.getpid()}.txt")
        with open(path + ".part", "w") as out:
            for stack, count in _counts.items():
                out.write(f"{stack} {count}\n")
        os.replace(path + ".part", path)

    signal.signal(signal.SIGPROF, _sample)
    signal.signal(signal.SIGRTMIN + 5, _start)
    signal.signal(signal.SIGRTMIN + 6, _stop)

if os.environ.get("BENCH_TIMELINE"):  # timestamps along each request's path to its first token
    import timeline

    timeline.install()


if os.environ.get("BENCH_GC_LOG"):
    import gc
    import time

    _gc_started = [0.0]

    def _gc_callback(phase: str, info: dict) -> None:
        now = time.process_time()
        if phase == "start":
            _gc_started[0] = now
            return
        line = (
            f"{time.time():.4f} {info['generation']} {(now - _gc_started[0]) * 1e6:.0f} {info['collected']}\n"
        )
        with open(f"{os.environ['BENCH_GC_LOG']}/{os.getpid()}.gc", "a") as log:
            log.write(line)

    gc.callbacks.append(_gc_callback)
