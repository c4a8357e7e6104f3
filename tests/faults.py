"""Real faults for the fault tests: a small filesystem that fills up or turns read-only, a sample whose
pickling holds a save mid-write until the test lets it go, and a process that drops its privileges.

A filesystem is a tmpfs mounted for the test (the tests run as root in CI and in the dev container);
where mounting is impossible the test is skipped, saying why. Nothing here sleeps to time a fault: a
held save signals when it is mid-write (an event, or a file for another process), and waits for the
test to say when it may go on.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

#: Bytes of each sample of :func:`big_graph`: 80 of them fill a 4 MB shuffle buffer.
SAMPLE_BYTES = 50_000


def big_sample(i: int) -> bytes:
    """Sample ``i``: 50 kB, its index in the last four bytes (see :func:`index_of`)."""
    return bytes([i % 251]) * SAMPLE_BYTES + i.to_bytes(4, "little")


def index_of(sample: bytes) -> int:
    return int.from_bytes(sample[-4:], "little")


def big_graph(n: int = 400) -> Any:
    """The graph of issue 32: a 4 MB shuffle buffer, so that a snapshot is about 4 MB."""
    from torch.utils.data.datapipes.iter import IterableWrapper

    return IterableWrapper(range(n)).map(big_sample).shuffle(buffer_size=80)


@contextlib.contextmanager
def tmpfs(directory: Path, megabytes: int) -> Iterator[Path]:
    """A tmpfs of ``megabytes`` MB mounted at ``directory`` (created) for the block; skips the test where
    it cannot be mounted."""
    directory.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        pytest.skip("mounting a small filesystem (a real full disk) needs root")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={megabytes}m,mode=0755", "tmpfs", str(directory)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip() or mounted.returncode}")
    try:
        yield directory
    finally:
        subprocess.run(["umount", "-l", str(directory)], check=True)


def remount_read_only(directory: Path) -> None:
    """Turn the tmpfs at ``directory`` read-only (as a filesystem does after an error)."""
    subprocess.run(["mount", "-o", "remount,ro", str(directory)], check=True)


def fill(path: Path, megabytes: float) -> None:
    """A ballast file of ``megabytes`` MB (to free later)."""
    with open(path, "wb") as f:
        f.write(b"\0" * int(megabytes * (1 << 20)))


class Held:
    """A sample whose pickling, once :attr:`armed`, says it is mid-write (:attr:`entered`) and waits until
    the test sets :attr:`go` (a save held mid-write, in this process)."""

    armed = False
    entered = threading.Event()
    go = threading.Event()

    def __init__(self, value: int):
        self.value = value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Held) and other.value == self.value

    def __hash__(self) -> int:
        return hash(self.value)

    def __deepcopy__(self, memo: Any) -> Held:
        return Held(self.value)

    def __reduce__(self) -> Any:
        if Held.armed:
            Held.armed = False  # once: the save's other samples pickle at once
            Held.hold()
        return (revive, (self.value,))

    @staticmethod
    def hold() -> None:
        """Say so and wait for the test (a process about to be killed replaces it: :meth:`Landing.arrive`)."""
        Held.entered.set()
        if not Held.go.wait(120):
            raise TimeoutError("the test never let the held save go on")

    @classmethod
    def reset(cls) -> None:
        cls.armed = cls.reviving = False
        cls.entered.clear()
        cls.go.clear()

    #: Hold when a sample is unpickled (by a restore), once.
    reviving = False


def revive(value: int) -> Held:
    """A :class:`Held` sample unpickled; held there once :attr:`Held.reviving` (mid-restore)."""
    if Held.reviving:
        Held.reviving = False
        Held.hold()
    return Held(value)


def held_graph(n: int = 30) -> Any:
    from torch.utils.data.datapipes.iter import IterableWrapper

    return IterableWrapper([Held(i) for i in range(n)]).shuffle(buffer_size=8)


class Landing:
    """Where a kill lands: the process to kill calls :meth:`arrive` at that moment (mid-save, say); a thread
    of the test (:meth:`kill_on_arrival`) is told at once, looks at what the process left (``proof``), and
    SIGKILLs it. Across processes forked after it is made (ranks, workers): a ``multiprocessing`` event,
    no sleeps."""

    def __init__(self) -> None:
        context = multiprocessing.get_context("fork")
        self._arrived = context.Event()
        self._pid = context.Value("i", 0)
        self._armed = context.Value("b", 0)
        self._test = os.getpid()
        self.proof: Any = None
        self.killed: int | None = None

    def arm(self) -> None:
        """Let :attr:`armed` say so in every process, those forked before included."""
        self._armed.value = 1

    @property
    def armed(self) -> bool:
        return bool(self._armed.value)

    def arrive(self) -> None:
        """In the process to kill: say where it is, and wait there to be killed. Only the first process to
        arrive waits; the others go on."""
        if os.getpid() == self._test:
            raise AssertionError("the test's own process arrived where another was to be killed")
        with self._pid.get_lock():
            if self._pid.value:
                return
            self._pid.value = os.getpid()
        self._arrived.set()
        threading.Event().wait(300)
        raise TimeoutError("the test did not kill this process")

    @contextlib.contextmanager
    def kill_on_arrival(self, proof: Callable[[], Any] = lambda: None, timeout: float = 120) -> Iterator[Landing]:
        """For the block, a thread that kills the process that arrives (after ``proof()`` of where it was)."""
        def killer() -> None:
            pid = self._pid.value if self._arrived.wait(timeout) else 0
            if pid > 0:  # 0: nobody arrived (os.kill(0, ...) would kill the test's own process group)
                self.proof = proof()
                os.kill(pid, signal.SIGKILL)
                self.killed = pid

        thread = threading.Thread(target=killer, name="test-killer")
        thread.start()
        try:
            yield self
        finally:
            self._arrived.set()  # nobody arrived: the thread ends (and kills nothing: no pid)
            thread.join(timeout)

    def __getstate__(self) -> Any:
        raise TypeError("a Landing crosses to processes by fork only")


def drop_privileges() -> None:
    """Become ``nobody`` in this (child) process: root's permission to write anywhere goes, so a directory's
    mode refuses writes (``EACCES``). Import everything the rest needs first: the interpreter's own files may
    not be readable by ``nobody``."""
    os.setgroups([])
    os.setgid(65534)
    os.setuid(65534)
