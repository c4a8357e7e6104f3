"""Where a live ``DataLoader2`` stands: one mutable object, so rolling back is one copy; and
whether it is paused (torchdata 0.9's pause and limit).

The saved form is :class:`snapshot.schema.SavedState` (its ``position`` a
:class:`snapshot.schema.LoaderPosition`); the fields shared with it keep its names.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from snapshot.engine.randomness import SeedGenerator, draw_seed
from snapshot.loader._digest import sample_digest
from snapshot.schema import SavedState


@dataclass
class LivePosition:
    """The loader's epoch, samples yielded in it, randomness and the running iterator."""

    #: -1 before the first epoch.
    epoch: int = -1
    yielded: int = 0
    epoch_finished: bool = False
    #: Samples computed ahead (for verification) and not yet yielded.
    lookahead: deque[Any] = field(default_factory=deque)
    #: The seed of the current epoch, and whether ``seed()`` gave it (else it was drawn).
    seed: int | None = None
    seed_given: bool = False
    #: The seed from ``seed()`` (or the restored given seed) and whether it still has to seed an epoch.
    user_seed: int | None = None
    reset_seed: bool = True
    generator: SeedGenerator | None = None
    #: Whether the next ``iter(loader)`` starts a new epoch.
    reset_iter: bool = True
    #: The reading service's end of the graph, and the current epoch's iterator over it.
    end: Iterable[Any] | None = None
    datapipe_iter: Iterator[Any] | None = None

    def copy(self) -> LivePosition:
        """A copy to roll back to (the lookahead copied, the rest shared)."""
        before = LivePosition.__new__(LivePosition)  # (not dataclasses.replace or copy.copy: slower)
        before.__dict__.update(self.__dict__, lookahead=deque(self.lookahead))
        return before

    def roll_back(self, before: LivePosition) -> None:
        """Stand where ``before`` (a :meth:`copy`) stood; an epoch's run that was replaced since is
        not resumed: the next ``iter(loader)`` starts afresh."""
        for name in (f.name for f in dataclasses.fields(self)):
            setattr(self, name, getattr(before, name))
        if self.datapipe_iter is not None:
            self.datapipe_iter, self.reset_iter = None, True

    def detach(self) -> None:
        """Let go of the epoch's iterator (the reading service stopped): the next ``iter()`` starts anew."""
        self.reset_iter, self.datapipe_iter = True, None

    def take_saved(self, saved: SavedState) -> None:
        """Stand where ``saved`` says the loader stood: epoch, samples, randomness, the samples
        computed ahead and whether a seed from ``seed()`` is still to be used. The epoch's run (the
        reading service's restore) is set apart, by the restorer."""
        self.epoch = saved.position.epoch
        self.yielded = saved.position.yielded
        self.epoch_finished = saved.position.epoch_finished
        self.seed, self.seed_given = saved.seed, saved.seed_given
        self.generator = SeedGenerator.from_state(saved.generator) if saved.generator is not None else None
        self.lookahead = deque(saved.lookahead)
        # seed() semantics: a seed given before the snapshot and not yet used stays pending;
        # otherwise the epoch's own seed keeps driving the seed sequence.
        self.user_seed = self.seed if self.seed_given else None
        self.reset_seed = False
        if saved.pending_seed is not None:
            self.user_seed, self.reset_seed = saved.pending_seed, True

    def ahead(self, count: int) -> dict[str, Any]:
        """Compute up to ``count`` samples ahead (kept, then yielded first) and digest them: what
        ``save_snapshot(verify=K)`` records (the manifest's ``fingerprints``) and a restore compares."""
        if self.epoch < 0 or self.epoch_finished:
            return {"count": 0, "fingerprints": [], "ends": True}
        it = self.datapipe_iter
        while it is not None and len(self.lookahead) < count:
            try:
                self.lookahead.append(next(it))
            except StopIteration:
                break
        ahead = list(self.lookahead)[:count]
        return {"count": count, "fingerprints": [sample_digest(x) for x in ahead], "ends": len(ahead) < count}

    def choose_generator(self, collective: Any = None) -> None:
        """Set the seed generator of the epoch that starts, as torchdata 0.9 does: a seed from
        ``seed()`` seeds the first epoch after the call and later epochs continue its sequence;
        without one, each epoch draws a seed. Across ranks (``collective``) rank 0 decides, in
        one broadcast per epoch on every rank."""
        given = self.user_seed is not None
        reseed = not given or self.reset_seed or self.generator is None
        seed = self.user_seed if given else (draw_seed() if reseed else None)
        if collective is not None:
            reseed, seed, given = collective.broadcast((reseed, seed, given), "sharing the loader seed")
        if reseed:
            assert seed is not None
            self.generator = SeedGenerator(seed)
            self.seed, self.seed_given = seed, given
            self.reset_seed = False

    def start_epoch(self, service: Any, collective: Any = None) -> None:
        """Begin the next epoch: choose its seed generator, start ``service``'s iteration (a
        reading service, already initialized so that ``end`` is set) and iterate ``end``."""
        self.choose_generator(collective)
        assert self.generator is not None and self.end is not None
        service.initialize_iteration(self.generator)
        self.epoch += 1
        self.yielded = 0
        self.epoch_finished = False
        self.lookahead.clear()
        self.datapipe_iter = iter(self.end)


@dataclass
class Stopped:
    """What a stopped loader (``shutdown()``, the end of a ``with`` block) still knows of its
    position: the reading service's checkpoint, taken as it stopped while its workers were still
    there, or why there is none (the graph raised, a worker died, the service cannot checkpoint).
    A save after the stop uses it, so it restores exactly where the loader stopped."""

    #: The service's checkpoint (``{}`` before the first epoch); ``None`` when ``why_not`` says why.
    service: dict[str, Any] | None = None
    why_not: str | None = None
    #: Whether the loader spanned ranks: its process group is gone, so a save must come first.
    distributed: bool = False


class PausingMethods:
    """torchdata 0.9's pause / resume / limit on ``DataLoader2`` (private in 0.9 too): through
    :class:`Pausing`, the loader's ``_pausing``."""

    _pausing: Pausing

    def _pause(self) -> None:
        """Make the current iterator stop (``StopIteration``) until :meth:`_resume`."""
        self._pausing.pause()

    def _resume(self) -> None:
        self._pausing.resume()

    def _limit(self, num_batches: int | None) -> None:
        """Pause after ``num_batches`` more samples, then again after each ``num_batches``."""
        self._pausing.limit(num_batches)


@dataclass
class Pausing:
    """torchdata 0.9's pause and limit: the iterator stops (``StopIteration``) without ending
    the epoch. Pausing changes nothing but the loader's willingness to yield: workers keep what
    they prefetched, so a snapshot taken while paused is as exact as any other."""

    paused: bool = False
    threshold: int | None = None
    counter: int | None = None

    def pause(self) -> None:
        self.paused = True
        if self.threshold is not None:
            self.counter = 0

    def resume(self) -> None:
        if not self.paused:
            warnings.warn("Resume is called when `DataLoader2` is not paused. No operation is performed.",
                          stacklevel=3)
            return
        self.paused = False

    def limit(self, num_batches: int | None) -> None:
        if num_batches is not None and num_batches < 0:
            raise ValueError(f"num_batches must be >= 0 or None, got {num_batches}")
        self.threshold = num_batches
        self.counter = 0

    def count(self) -> None:
        """One more sample yielded: pause when the limit is reached."""
        if self.threshold is None or self.counter is None:
            return
        self.counter += 1
        if self.counter >= self.threshold:
            self.pause()


def loader_repr(graph: Any, service: Any, position: LivePosition | None, terminated: bool) -> str:
    """``repr(DataLoader2)``: its graph's sink and size, the reading service, where it stands."""
    sink = "no graph" if graph is None else f"{type(graph.sink).__name__}, {len(graph.nodes)} nodes"
    workers = getattr(service, "num_workers", None)
    service_name = type(service).__name__ + (f"(num_workers={workers})" if workers else "")
    if position is None or position.epoch < 0:
        where = "not started"
    else:
        where = f"epoch {position.epoch}, " + ("finished" if position.epoch_finished else f"{position.yielded} yielded")
    return f"DataLoader2({sink}; {service_name}; {where}" + ("; shut down)" if terminated else ")")
