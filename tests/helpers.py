"""Helpers that several test modules share: a seeded loader stopped at a position (and its
snapshot), and a job that holds a background save mid-write so that a test can kill it."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import snapshot

ROOT = str(Path(__file__).resolve().parent.parent)


@contextlib.contextmanager
def loader_at(datapipe: Any, samples: int, *, seed: int,
              reading_service: Any = None) -> Iterator[tuple[snapshot.DataLoader2[Any], Iterator[Any]]]:
    """A fresh loader over ``datapipe``, seeded with ``seed``, after ``samples`` samples: the loader
    and its iterator, to save or read on; the loader is shut down on leaving."""
    with snapshot.DataLoader2(datapipe, reading_service=reading_service) as loader:
        loader.seed(seed)
        it = iter(loader)
        for _ in range(samples):
            next(it)
        yield loader, it


def snapshot_after(factory: Any, samples: int, *, seed: int = 0, reading_service: Any = None) -> snapshot.Snapshot:
    """The snapshot of a fresh loader over ``factory()`` (seeded) after ``samples`` samples."""
    with loader_at(factory(), samples, seed=seed, reading_service=reading_service) as (loader, _):
        return loader.save_snapshot()


#: A job (``python job.py MODE DEST MARKER SECONDS``) that takes one sample of a shuffled graph whose
#: samples pickle slowly once ``HOLD`` is set, then saves to ``DEST`` in the background: the pickling
#: creates ``MARKER`` and sleeps ``SECONDS``, so the save is held mid-write. With ``MODE`` ``kill``
#: it first saves a previous snapshot to ``DEST`` (at sample 1) and takes another sample.
SLOW_SAVE_SCRIPT = textwrap.dedent("""
    import sys, time
    from torch.utils.data.datapipes.iter import IterableWrapper
    import snapshot

    HOLD = False

    class Slow:
        def __init__(self, value):
            self.value = value
        def __deepcopy__(self, memo):
            return Slow(self.value)
        def __reduce__(self):
            if HOLD:
                open(sys.argv[3], "w").close()
                time.sleep(float(sys.argv[4]))
            return (Slow, (self.value,))

    dl = snapshot.DataLoader2(IterableWrapper([Slow(i) for i in range(20)]).shuffle(buffer_size=4))
    dl.seed(0)
    it = iter(dl)
    next(it)
    if sys.argv[1] == "kill":
        dl.save_snapshot(sys.argv[2])              # the previous snapshot, at sample 1
        next(it)
    HOLD = True
    dl.save_snapshot(sys.argv[2], blocking=False)  # held mid-write
""")


def start_slow_save(directory: Path, mode: str, dest: str, marker: str, seconds: float,
                    env: Mapping[str, str] | None = None) -> subprocess.Popen[str]:
    """Start :data:`SLOW_SAVE_SCRIPT` (written into ``directory``) with its four arguments."""
    script = directory / "job.py"
    script.write_text(SLOW_SAVE_SCRIPT)
    return subprocess.Popen([sys.executable, str(script), mode, dest, marker, str(seconds)],
                            env={**os.environ, **(env or {}), "PYTHONPATH": ROOT}, text=True)


def kill_once_started(child: subprocess.Popen[str], marker: str, timeout: float = 120) -> None:
    """Kill ``child`` (SIGKILL) as soon as ``marker`` exists: its background save is mid-write."""
    try:
        deadline = time.monotonic() + timeout
        while not os.path.exists(marker):
            assert child.poll() is None and time.monotonic() < deadline, "the background save never started"
            time.sleep(0.05)
        child.kill()
    finally:
        child.kill()
        child.wait(30)


def assert_resumes_exactly_onto(factory: Any, reading_service: Any, targets: Mapping[str, Any], *, seed: int,
                                cuts: list[Any], strategies: Mapping[str, tuple[str, ...]],
                                epochs: int = 2) -> None:
    """:func:`snapshot.testing.assert_resumes_exactly` (in memory, in this process) onto several targets from one
    run per cut: the runs that save are the same for every target (the same graph, service, seed and cut), so
    each is run once and its snapshot restored onto each target (a name and a service factory) with that
    target's ``strategies``."""
    from snapshot.testing import _after, _check_continuation, _continue, _reference, _save_at

    reference = _reference(factory, reading_service, seed, epochs)
    for cut in cuts:
        data = _save_at(factory, reading_service, seed, "values", cut, reference, False)
        epochs_left = epochs - cut.epoch - (1 if cut.finished else 0)
        for name, target in targets.items():
            for strategy in strategies[name]:
                streams, _ = _continue(factory, target, data, strategy, epochs_left, None)
                _check_continuation(f"restore at [{cut}] onto {name} with strategy={strategy!r}", cut, cut.samples,
                                    _after(reference, cut, cut.samples), streams)


#: The restore strategies to check a graph whose every node has a state hook with: ``auto`` makes the plan of
#: ``state`` for such a graph (nothing to replay: snapshot/engine/plan.py's make_plan), so where ``state`` restores
#: exactly, ``auto`` would run the same restore again. ``auto`` is checked where some node must replay.
HOOKED_STRATEGIES = ("state", "fast_forward")
