"""Where a live ``DataLoader2`` stands: one mutable object, so rolling back is one copy.

The saved form is :class:`snapshot.schema.SavedState` (its ``position`` a
:class:`snapshot.schema.LoaderPosition`); the fields shared with it keep its names.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from snapshot.randomness import SeedGenerator


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
        return dataclasses.replace(self, lookahead=deque(self.lookahead))
