"""Run a function on N ranks of a real gloo process group on 127.0.0.1 (a test harness).

Each rank is a forked process that joins ``init_process_group("gloo", tcp://127.0.0.1:<free
port>)``, runs ``fn(rank, world, *args)`` and sends back its result. The harness waits at
most ``timeout`` seconds, kills every rank that is still alive, and never leaves one behind.
"""

from __future__ import annotations

import datetime
import multiprocessing
import os
import pickle
import socket
import time
import traceback
from collections.abc import Callable
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank_main(rank: int, world: int, port: int, fn: Callable[..., Any], args: tuple[Any, ...],
               conn: Any, pg_timeout: float) -> None:
    import torch.distributed as dist

    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=pg_timeout))
        result: Any = ("ok", fn(rank, world, *args))
    except BaseException as exc:  # noqa: BLE001 - reported to the test
        result = ("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")
    try:
        conn.send_bytes(pickle.dumps(result))
    finally:
        conn.close()
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001
            pass
    os._exit(0)  # skip atexit handlers inherited from the test process


class RankFailure(AssertionError):
    def __init__(self, rank: int, message: str):
        super().__init__(f"rank {rank}: {message}")
        self.rank = rank
        self.message = message


def run_ranks(world: int, fn: Callable[..., Any], *args: Any, timeout: float = 120,
              pg_timeout: float = 60, allow_errors: bool = False) -> list[Any]:
    """``fn(rank, world, *args)`` on ``world`` ranks; their results in rank order.

    With ``allow_errors`` a failed rank's entry is ``RankFailure`` instead of raising.
    """
    ctx = multiprocessing.get_context("fork")
    port = free_port()
    ranks = []
    for rank in range(world):
        receiver, sender = ctx.Pipe(duplex=False)
        process = ctx.Process(target=_rank_main, args=(rank, world, port, fn, args, sender, pg_timeout),
                              name=f"test-rank-{rank}")
        process.start()
        sender.close()
        ranks.append((process, receiver))
    deadline = time.monotonic() + timeout
    results: list[Any] = [None] * world
    try:
        for rank, (process, receiver) in enumerate(ranks):
            remaining = max(0.0, deadline - time.monotonic())
            if not receiver.poll(remaining):
                raise AssertionError(f"rank {rank} did not finish within {timeout:g} s")
            try:
                status, value = pickle.loads(receiver.recv_bytes())
            except EOFError:
                process.join(5)
                value, status = f"died ({process.exitcode})", "error"
            results[rank] = value if status == "ok" else RankFailure(rank, value)
    finally:
        for process, receiver in ranks:
            process.join(max(0.5, deadline - time.monotonic()) if process.is_alive() else 0)
            if process.is_alive():
                process.kill()
                process.join(5)
            receiver.close()
    if not allow_errors:
        for result in results:
            if isinstance(result, RankFailure):
                raise result
    return results
