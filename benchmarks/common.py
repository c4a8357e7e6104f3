"""Timing and reporting helpers shared by the benchmarks."""

from __future__ import annotations

import gc
import json
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any


def timed(fn: Callable[[], Any], *, repeat: int = 3, setup: Callable[[], Any] | None = None) -> float:
    """Median wall time of ``fn()`` in seconds over ``repeat`` runs (``setup`` untimed)."""
    samples = []
    for _ in range(repeat):
        if setup is not None:
            setup()
        gc.collect()
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:9.2f} ms"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    widths = [max(len(str(h)), *(len(str(r[i])) for r in rows)) for i, h in enumerate(headers)]
    line = "  ".join(str(h).rjust(w) for h, w in zip(headers, widths))
    out = [line, "  ".join("-" * w for w in widths)]
    for row in rows:
        out.append("  ".join(str(c).rjust(w) for c, w in zip(row, widths)))
    return "\n".join(out)


def save_json(path: str | None, payload: dict[str, Any]) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(payload, f, indent=2)


def _send(connection: Any, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    try:
        connection.send(("ok", fn(*args)))
    except Exception as exc:  # noqa: BLE001 - the parent raises it, with the child's traceback
        import traceback

        connection.send(("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
    finally:
        connection.close()


def forked(fn: Callable[..., Any], *args: Any, timeout: float = 600) -> Any:
    """``fn(*args)`` in a child forked from this process, which has imported torch and snapshot already: a
    process of its own (its memory, its peak-RSS mark) without an interpreter's start and imports (3 to 4 s of
    CPU each). Bounded: the child is killed after ``timeout`` seconds."""
    import multiprocessing

    context = multiprocessing.get_context("fork")
    receive, send = context.Pipe(duplex=False)
    child = context.Process(target=_send, args=(send, fn, args), daemon=True)
    child.start()
    send.close()
    try:
        if not receive.poll(timeout):
            raise TimeoutError(f"{getattr(fn, '__name__', fn)}{args} took more than {timeout:.0f} s in a child")
        status, value = receive.recv()
    finally:
        child.join(timeout=30)
        if child.is_alive():
            child.kill()
            child.join(timeout=30)
        receive.close()
    if status != "ok":
        raise RuntimeError(f"{getattr(fn, '__name__', fn)}{args} failed in a forked child: {value}")
    return value
