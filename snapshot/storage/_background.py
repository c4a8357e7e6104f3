"""Background saves: one writer thread per save, at most one save in flight per loader.

:class:`BackgroundSaver` runs a save function in a thread and hands back a
``concurrent.futures.Future`` of its result. A second save waits for the first; the
loader's ``shutdown()`` waits too, and so does the interpreter's exit (an ``atexit`` hook
waits for every save still running). A save that fails sets the exception on its future
and logs it (``logging.getLogger("snapshot.storage._background")``), so it is never lost even when
nobody looks at the future.
"""

from __future__ import annotations

import atexit
import logging
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from snapshot.errors import SnapshotError

__all__ = ["BackgroundSaver", "DEFAULT_TIMEOUT"]

logger = logging.getLogger(__name__)

#: Seconds to wait for a save still in flight before giving up with an error.
DEFAULT_TIMEOUT = 1800.0

_savers: weakref.WeakSet[BackgroundSaver] = weakref.WeakSet()


class BackgroundSaver:
    """Runs saves in a background thread, one at a time."""

    def __init__(self, timeout: float = DEFAULT_TIMEOUT):
        self.timeout = timeout
        self._future: Future[Any] | None = None
        self._thread: threading.Thread | None = None
        _savers.add(self)

    @property
    def busy(self) -> bool:
        """Whether a save is still running."""
        return self._future is not None and not self._future.done()

    def wait(self, timeout: float | None = None) -> None:
        """Wait for the save in flight (its failure stays on its future, already logged)."""
        future = self._future
        if future is None:
            return
        limit = self.timeout if timeout is None else timeout
        try:
            future.exception(timeout=limit)
        except FutureTimeout:
            raise SnapshotError(
                f"the background save started earlier has not finished after {limit:g} s (a stuck "
                "storage?); the previous snapshot on disk is intact. Check the destination, or "
                "wait longer with future.result()."
            ) from None
        thread = self._thread
        if thread is not None:
            thread.join(limit)

    def submit(self, fn: Callable[[], Any], what: str) -> Future[Any]:
        """Run ``fn`` in the background once the previous save is done; its result in a future."""
        self.wait()
        future: Future[Any] = Future()
        future.set_running_or_notify_cancel()

        def run() -> None:
            try:
                result = fn()
            except BaseException as exc:
                logger.error("background save of %s failed: %s: %s", what, type(exc).__name__, exc,
                             exc_info=exc)
                future.set_exception(exc)
            else:
                logger.debug("background save of %s done", what)
                future.set_result(result)

        self._future = future
        self._thread = threading.Thread(target=run, name=f"snapshot-save {what}", daemon=False)
        self._thread.start()
        return future


@atexit.register
def _wait_for_all() -> None:
    """At interpreter exit, let every save in flight finish (a save is never cut short)."""
    for saver in list(_savers):
        try:
            saver.wait()
        except SnapshotError as exc:  # pragma: no cover - a storage stuck at exit
            logger.error("%s", exc)
