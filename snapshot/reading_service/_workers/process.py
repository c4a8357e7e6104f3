"""One worker process, from the main process's side: starting it, sending it requests (never
waiting without a bound), and the error that says why it died.

Under ``fork`` a worker is started with its first request (the epoch's start, or its share of
a restore's state) in its memory: nothing of a restore's state is pickled, sent or decoded
again. Other start methods send that request through the pipe once the process runs.
"""

from __future__ import annotations

import signal
from typing import Any

import snapshot.reading_service._workers.transport as transport
from snapshot.container import _serialization
from snapshot.errors import WorkerError
from snapshot.reading_service._workers.worker import run_worker

__all__ = ["WorkerProcess", "exit_reason"]


def exit_reason(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def _widen(connection: Any) -> None:
    """Let a whole batch fit in the pipe (Linux), so the worker writes it in one go."""
    try:
        import fcntl

        with open("/proc/sys/fs/pipe-max-size") as f:
            size = int(f.read())
        fcntl.fcntl(connection.fileno(), 1031, min(size, 8 << 20))  # F_SETPIPE_SZ
    except (ImportError, OSError, ValueError):
        pass


class WorkerProcess:
    """A started worker: its process, the pipes to and from it, and the logical shards it owns."""

    def __init__(self, index: int, process: Any, requests: Any, results: Any, shards: list[int], timeout: float):
        self.index = index
        self.process = process
        self.requests = requests
        self.results = results
        self.shards = shards
        self.timeout = timeout

    @classmethod
    def start(cls, context: Any, index: int, setup: bytes, shards: list[int], timeout: float, parent: int,
              first: tuple[Any, ...] | None = None) -> WorkerProcess:
        """Start worker ``index``; ``first``: a request it handles before reading its pipe (under ``fork``
        only: it is not pickled, the process has it in its copy of this one's memory)."""
        requests_out, requests_in = context.Pipe(duplex=False)
        results_out, results_in = context.Pipe(duplex=False)
        _widen(results_in)
        process = context.Process(target=run_worker, args=(requests_out, results_in, setup, parent, first),
                                  daemon=True, name=f"snapshot-worker-{index}")
        try:
            process.start()
        finally:
            requests_out.close()
            results_in.close()
        return cls(index, process, requests_in, results_out, shards, timeout)

    def send(self, message: tuple[Any, ...], timeout: float | None = None) -> None:
        """Send a request (arrays and tensors out of band, see :mod:`.transport`: torch's multiprocessing
        pickler would share tensors by file descriptor, plain pickle copies each one through
        ``torch.save``); a pickling error raises before anything is written."""
        frames = transport.encode(message)
        timeout = self.timeout if timeout is None else timeout
        try:
            transport.send_within(self.requests, frames, timeout)
        except TimeoutError:
            raise WorkerError(
                f"worker {self.index} (pid {self.process.pid}) read none of a request for {timeout:g} s: it "
                "is stuck (a hung read, a deadlock in the graph's code?). The loader was stopped. Raise "
                "timeout= if one sample can take that long.") from None
        except OSError:
            pass  # a dead worker is reported by the next receive

    def send_epoch(self, message: tuple[Any, ...]) -> None:
        """Send an epoch's start or restore; a restore state that plain pickle cannot carry goes as
        dill's bytes (dill names what cannot be pickled)."""
        try:
            self.send(message)
        except WorkerError:
            raise
        except Exception:
            if message[0] != "restore":
                raise
            self.send((*message[:3], _serialization.dumps(message[3], what="restore state"), *message[4:]))

    def death(self, waiting_for: str, start_method: str) -> WorkerError:
        """The error for this worker having exited while the loader waited for ``waiting_for``."""
        self.process.join(1)
        hint = ""
        if start_method != "fork" and waiting_for.startswith("starting"):
            hint = (f" With multiprocessing_context={start_method!r} each worker re-imports your main "
                    "module: guard the entry point with `if __name__ == \"__main__\":`, and check the "
                    "worker's output above.")
        return WorkerError(
            f"worker {self.index} (pid {self.process.pid}) exited unexpectedly "
            f"({exit_reason(self.process.exitcode)}) while the loader waited for {waiting_for}.{hint} "
            "Its logical shards cannot continue, and the loader was stopped: restore from your "
            "last snapshot (onto fewer workers, if this one keeps dying).")
