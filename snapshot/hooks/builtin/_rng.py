"""A ``random.Random``'s state as plain data (lists and numbers), and back."""

from __future__ import annotations

import random
from typing import Any

#: Key of a random hook's state: the values of its other keys as they were when its current
#: pass began, for a pipe that keeps its generator when a ``cycle`` starts it again; a replay
#: from the start of that pass rewinds to them (see :mod:`snapshot.engine._passes`).
AT_PASS_START = "at_pass_start"


def rng_state(rng: random.Random) -> list[Any]:
    """``rng``'s state as ``[version, [625 ints], gauss_next]``."""
    version, internal, gauss = rng.getstate()
    return [version, list(internal), gauss]


def set_rng_state(rng: random.Random, state: Any) -> None:
    """Put back a state from :func:`rng_state`."""
    version, internal, gauss = state
    rng.setstate((version, tuple(internal), gauss))
