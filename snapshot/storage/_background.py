"""Background saves: a writer thread, at most one save in flight per loader, no wait without a bound.

:class:`BackgroundSaver` runs a save function in a thread and hands back a :class:`SaveFuture` of its
result. The thread is the process's resident writer when it is idle: started once, off the loader's
path (:func:`prepare`, at a loader's first epoch), and handed each save through a queue, so a save's
blocking part does not pay a thread's start (0.2-0.5 ms, more than the rest of a save by position).
While it writes another loader's save, a save gets a thread of its own. Who waits for a save in
flight, and how long:

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
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from snapshot.errors import SnapshotError

__all__ = ["DEFAULT_TIMEOUT", "EXIT_TIMEOUT", "BackgroundSaver", "SaveFuture", "prepare"]

logger = logging.getLogger(__name__)

#: Seconds the next save and ``shutdown()`` wait for a save still in flight before raising.
DEFAULT_TIMEOUT = 1800.0
#: Seconds the interpreter's exit waits for the saves still in flight before it leaves them.
EXIT_TIMEOUT = 1800.0
#: Seconds a save's thread waits for the thread that started it to go on (set as soon as it does).
_GO_TIMEOUT = 10.0
#: The name of the process's resident writer thread (it lives as long as the process).
NAME = "snapshot-writer"
#: Seconds the resident writer waits for a save at a time before it looks again (it only sleeps meanwhile).
_IDLE_POLL = 60.0


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
    #: The thread that runs it: its own (joined once it finished), or ``None`` for the resident writer.
    thread: threading.Thread | None = None
    ident: int | None = None  # the running thread's (``threading.get_ident()``), set before the save runs
    pid: int = dataclasses.field(default_factory=os.getpid)
    finished: threading.Event = dataclasses.field(default_factory=threading.Event)
    failure: BaseException | None = None

    def waitable(self) -> bool:
        """Whether waiting for this save can end: it runs, in this process, in another thread."""
        return not self.finished.is_set() and self.pid == os.getpid() and threading.get_ident() != self.ident

    def run(self, fn: Callable[[], Any]) -> None:
        """Run ``fn`` and settle the future with its outcome (never raises)."""
        try:
            result = fn()
        except BaseException as exc:
            logger.error("background save of %s failed: %s: %s", self.what, type(exc).__name__, exc, exc_info=exc)
            self.failure = exc
            self.future.set_exception(exc)
        else:
            logger.debug("background save of %s done", self.what)
            self.future.set_result(result)
        finally:
            self.finished.set()
            _running.discard(self)


class _Resident:
    """The process's long-lived writer thread: it runs the saves handed to it through ``jobs``, one at a time.

    It is a thread of the ``_thread`` module, started without waiting for it to run
    (``threading.Thread.start`` waits for the new thread to take the GIL and say it started: 0.2 ms and
    more on a loaded machine, which :func:`prepare` would add to a loader's first epoch). Like a daemon
    thread, the interpreter's exit does not wait for it: :func:`_wait_at_exit` waits for the saves in
    flight (at most :data:`EXIT_TIMEOUT`), then tells it to end. A forked process has no such thread:
    it forgets its parent's (:func:`_forget_resident`), and :func:`prepare` starts one of its own."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.jobs: queue.SimpleQueue[tuple[_Save, Callable[[], Any]] | None] = queue.SimpleQueue()
        self.idle = threading.Lock()  # held from a save's hand-over to its end
        #: A running future and an event for the next save, made by this thread ahead of it (see :func:`_parts`).
        self.spares: list[tuple[SaveFuture, threading.Event]] = []
        import _thread

        _thread.start_new_thread(self._serve, ())

    def _serve(self) -> None:
        threading.current_thread().name = NAME  # known to threading (a dummy thread, as a daemon), by its name
        ident = threading.get_ident()
        while True:
            if not self.spares:
                self.spares.append(_made())
            try:
                job = self.jobs.get(timeout=_IDLE_POLL)
            except queue.Empty:
                continue
            if job is None:  # the interpreter's exit
                return
            save, fn = job
            save.ident = ident  # before it runs: a finalizer that runs in this thread does not wait for it
            try:
                save.run(fn)
            finally:
                # the capture is let go now, not at the next save: a staged copy of samples may be large
                job = save = fn = None  # type: ignore[assignment]
                self.idle.release()

    def take(self, save: _Save, fn: Callable[[], Any]) -> bool:
        """Hand ``save`` to this thread if it is idle (it may not have run yet: the save waits in ``jobs``)."""
        if self.pid != os.getpid() or not self.idle.acquire(blocking=False):
            return False
        self.jobs.put((save, fn))
        return True


def _made() -> tuple[SaveFuture, threading.Event]:
    """A save's running future and the event that says it finished."""
    future = SaveFuture()
    future.set_running_or_notify_cancel()
    return future, threading.Event()


def _parts() -> tuple[SaveFuture, threading.Event]:
    """:func:`_made`, by the resident writer ahead of the save when it could (0.05 ms of a save's blocking
    part): taken by one save only (``list.pop`` is atomic)."""
    resident = _resident
    if resident is not None and resident.pid == os.getpid():
        try:
            return resident.spares.pop()
        except IndexError:
            pass
    return _made()


_resident: _Resident | None = None
_resident_lock = threading.Lock()


def _forget_resident() -> None:
    """In a forked child: the parent's writer thread is not there (nor, maybe, the lock's holder)."""
    global _resident, _resident_lock
    _resident, _resident_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_resident)


def prepare() -> None:
    """Start this process's resident writer, if it has none: once, off any save's path (costs its caller
    about 0.05 ms: it does not wait for the thread to run)."""
    global _resident
    if _resident is not None:
        return
    with _resident_lock:
        if _resident is None:
            _resident = _Resident()


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
        if save.thread is not None:
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
        future, finished = _parts()
        save = _Save(what, future, finished=finished)
        self._save = save
        _running.add(save)
        resident = _resident
        if resident is None or not resident.take(save, fn):
            self._start(save, fn)
        return future

    @staticmethod
    def _start(save: _Save, fn: Callable[[], Any]) -> None:
        """Run ``save`` in a thread of its own (the resident writer is busy, or not started)."""
        go = threading.Event()

        def run() -> None:
            # Thread.start() returns once this thread has started and given the GIL back: waiting here
            # gives it back at once, not after a switch interval (5 ms) of the save's own work
            go.wait(_GO_TIMEOUT)
            save.run(fn)

        # a daemon: the interpreter's exit waits for it (at most EXIT_TIMEOUT), not without a bound
        save.thread = threading.Thread(target=run, name=f"snapshot-save {save.what}", daemon=True)
        save.thread.start()
        save.ident = save.thread.ident
        go.set()


@atexit.register
def _wait_at_exit() -> None:
    """At the interpreter's exit, let the saves in flight finish, for at most :data:`EXIT_TIMEOUT` seconds."""
    deadline = time.monotonic() + EXIT_TIMEOUT
    for save in [s for s in list(_running) if s.waitable()]:
        if not save.finished.wait(max(0.0, deadline - time.monotonic())):
            logger.error("the background save of %s did not finish within %g s of the interpreter's exit and is "
                         "abandoned: the previous snapshot there is intact, and the next save into its directory "
                         "removes the temporary file it leaves", save.what, EXIT_TIMEOUT)
    if _resident is not None:
        _resident.jobs.put(None)  # it ends once its save (if one is still stuck) returns
