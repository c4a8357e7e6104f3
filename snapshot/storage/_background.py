"""Background saves: one writer thread per save, at most one save in flight per loader, no wait without a bound.

:class:`BackgroundSaver` runs a save function in a thread and hands back a :class:`SaveFuture` of its
result. Who waits for a save in flight, and how long:

- the next save and the loader's ``shutdown()`` wait at most ``timeout`` seconds
  (:data:`DEFAULT_TIMEOUT`, 30 minutes), then raise a :class:`~snapshot.errors.SnapshotError`;
- the interpreter's exit waits at most :data:`EXIT_TIMEOUT` seconds for every save in flight, then
  leaves it: the writer thread is a daemon, so the process ends. What the save had written is a
  temporary file (removed by the next save into the directory) or an upload never completed; the
  previous snapshot is intact;
- nothing waits for a save from the save's own thread (a loader collected there, by a finalizer), nor
  in a process forked while it ran (its thread is not there), nor for a loader that is collected (the
  save goes on without the loader; the exit waits for it).

A save that fails sets the exception on its future and logs it (``logging.getLogger(
"snapshot.storage._background")``). It is never waited on; it is raised again, once, by the loader's
next save and by its ``shutdown()``, unless its future's ``result()`` or ``exception()`` was read.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from snapshot.errors import SnapshotError

__all__ = ["DEFAULT_TIMEOUT", "EXIT_TIMEOUT", "BackgroundSaver", "SaveFuture"]

logger = logging.getLogger(__name__)

#: Seconds the next save and ``shutdown()`` wait for a save still in flight before raising.
DEFAULT_TIMEOUT = 1800.0
#: Seconds the interpreter's exit waits for the saves still in flight before it leaves them.
EXIT_TIMEOUT = 1800.0
#: Seconds a save's thread waits for the thread that started it to go on (set as soon as it does).
_GO_TIMEOUT = 10.0


class SaveFuture(Future[Any]):
    """The future of a background save; it knows whether its outcome was read (``result()`` or
    ``exception()``), so that a failure nobody read is raised by the next save instead."""

    def __init__(self) -> None:
        super().__init__()
        self.read = False

    def result(self, timeout: float | None = None) -> Any:
        try:
            return super().result(timeout)
        finally:
            self.read = self.read or self.done()

    def exception(self, timeout: float | None = None) -> BaseException | None:
        exc = super().exception(timeout)
        self.read = True
        return exc


@dataclasses.dataclass(eq=False)
class _Save:
    """A save started in this process: what it writes, its future, its thread, and how it ended.

    ``finished`` and ``failure`` say how it ended without asking the future: a finalizer that runs while
    the interpreter clears its modules finds ``concurrent.futures``' states cleared, and a finished
    future then looks unfinished to it (so it would wait for it until its timeout)."""

    what: str
    future: SaveFuture
    thread: threading.Thread
    pid: int = dataclasses.field(default_factory=os.getpid)
    finished: threading.Event = dataclasses.field(default_factory=threading.Event)
    failure: BaseException | None = None

    def waitable(self) -> bool:
        """Whether waiting for this save can end: it runs, in this process, in another thread."""
        return (not self.finished.is_set() and self.pid == os.getpid()
                and threading.current_thread() is not self.thread)


#: The saves in flight (strong references: a save outlives the loader that started it).
_running: set[_Save] = set()


class BackgroundSaver:
    """Runs saves in a background thread, one at a time."""

    def __init__(self, timeout: float = DEFAULT_TIMEOUT):
        self.timeout = timeout
        self._save: _Save | None = None

    @property
    def busy(self) -> bool:
        """Whether a save is still running."""
        return self._save is not None and not self._save.future.done()

    def wait(self, timeout: float | None = None) -> None:
        """Wait for the save in flight, at most ``timeout`` seconds (default: ``self.timeout``); its failure
        stays on its future (see :meth:`raise_failure`). A save that is done, or that this thread or process
        cannot see finish, is not waited for."""
        save = self._save
        if save is None or not save.waitable():
            return
        limit = self.timeout if timeout is None else timeout
        start = time.monotonic()
        if not save.finished.wait(limit):
            raise SnapshotError(
                f"the background save of {save.what} started earlier has not finished after {limit:g} s (a stuck "
                "storage?); the previous snapshot there is intact. Check the destination, or wait longer with "
                "future.result().")
        save.thread.join(max(0.0, limit - (time.monotonic() - start)))  # it returns as soon as it finished

    def raise_failure(self) -> None:
        """Raise the failure of the last save, once, unless its future's outcome was read."""
        save = self._save
        if save is None or not save.finished.is_set() or save.future.read or save.failure is None:
            return
        save.future.read = True  # raised once
        if hasattr(save.failure, "add_note"):  # Python >= 3.11
            save.failure.add_note(f"raised again: the background save of {save.what} failed earlier, and its "
                                  "future's result() was not read")
        raise save.failure

    def submit(self, fn: Callable[[], Any], what: str) -> SaveFuture:
        """Run ``fn`` in the background once the previous save is done; its result in a future."""
        self.wait()
        future = SaveFuture()
        future.set_running_or_notify_cancel()
        go = threading.Event()

        def run() -> None:
            # Thread.start() returns once this thread has started and given the GIL back: waiting here
            # gives it back at once, not after a switch interval (5 ms) of the save's own work
            go.wait(_GO_TIMEOUT)
            try:
                result = fn()
            except BaseException as exc:
                logger.error("background save of %s failed: %s: %s", what, type(exc).__name__, exc,
                             exc_info=exc)
                save.failure = exc
                future.set_exception(exc)
            else:
                logger.debug("background save of %s done", what)
                future.set_result(result)
            finally:
                save.finished.set()
                _running.discard(save)

        # a daemon: the interpreter's exit waits for it (at most EXIT_TIMEOUT), not without a bound
        save = _Save(what, future, threading.Thread(target=run, name=f"snapshot-save {what}", daemon=True))
        self._save = save
        _running.add(save)
        save.thread.start()
        go.set()
        return future


@atexit.register
def _wait_at_exit() -> None:
    """At the interpreter's exit, let the saves in flight finish, for at most :data:`EXIT_TIMEOUT` seconds."""
    deadline = time.monotonic() + EXIT_TIMEOUT
    for save in [s for s in list(_running) if s.waitable()]:
        if not save.finished.wait(max(0.0, deadline - time.monotonic())):
            logger.error("the background save of %s did not finish within %g s of the interpreter's exit and is "
                         "abandoned: the previous snapshot there is intact, and the next save into its directory "
                         "removes the temporary file it leaves", save.what, EXIT_TIMEOUT)
