"""The global random generators (``random``, ``numpy``, ``torch``) that graph code draws from,
isolated per logical shard: seeded, switched on entry and exit, saved and restored."""

from __future__ import annotations

import enum
import random
from collections.abc import Mapping
from typing import Any

import torch

try:
    import numpy
except ImportError:  # pragma: no cover - numpy is optional
    numpy = None  # type: ignore[assignment]

__all__ = ["GlobalRNG", "plain_rng", "raw_from_plain", "raw_rng", "seeded_rng", "set_raw_rng"]


class GlobalRNG(str, enum.Enum):
    """What code in the graph gets when it draws from ``random``, ``numpy`` or ``torch``.

    ``ISOLATE``: each logical shard has its own generator states, seeded from the loader seed
    and saved in snapshots, so such code is reproducible and restorable. ``SHARED``: graph
    code uses the process's generators (in-process: your training loop's), untouched.
    """

    ISOLATE = "isolate"
    SHARED = "shared"


_RawRNG = tuple[Any, Any, Any]


def raw_rng() -> _RawRNG:
    return (random.getstate(), torch.get_rng_state(),
            numpy.random.get_state() if numpy is not None else None)


def set_raw_rng(raw: _RawRNG) -> None:
    random.setstate(raw[0])
    torch.set_rng_state(raw[1])
    if numpy is not None and raw[2] is not None:
        numpy.random.set_state(raw[2])


def plain_rng(raw: _RawRNG) -> dict[str, Any]:
    """A raw state as plain data (lists, bytes) for a snapshot."""
    version, internal, gauss = raw[0]
    state: dict[str, Any] = {"random": [version, list(internal), gauss], "torch": raw[1].numpy().tobytes()}
    if raw[2] is not None:
        kind, keys, pos, has_gauss, cached = raw[2]
        state["numpy"] = [kind, list(map(int, keys)), pos, has_gauss, cached]
    return state


def raw_from_plain(state: Mapping[str, Any]) -> _RawRNG:
    version, internal, gauss = state["random"]
    numpy_state = None
    if numpy is not None and "numpy" in state:
        kind, keys, pos, has_gauss, cached = state["numpy"]
        numpy_state = (kind, numpy.array(keys, dtype=numpy.uint32), pos, has_gauss, cached)
    return ((version, tuple(internal), gauss), torch.frombuffer(bytearray(state["torch"]), dtype=torch.uint8),
            numpy_state)


def seeded_rng(seed: int) -> _RawRNG:
    saved = raw_rng()
    random.seed(seed)
    torch.manual_seed(seed)
    if numpy is not None:
        numpy.random.seed(seed % 2**32)
    state = raw_rng()
    set_raw_rng(saved)
    return state


class _ShardRNG:
    """Global generator states per logical shard, swapped in while a shard runs."""

    def __init__(self, policy: GlobalRNG, protect_caller: bool):
        self.enabled = policy is GlobalRNG.ISOLATE
        self.protect_caller = protect_caller
        self.states: dict[int, _RawRNG] = {}
        self.active: int | None = None
        self._caller: _RawRNG | None = None

    def reset(self, states: Mapping[int, _RawRNG]) -> None:
        self.leave()
        if self.active is not None:  # a worker that never leaves: drop the old epoch's shard
            self.active = None
        self.states = dict(states)

    def enter(self, shard: int) -> None:
        if not self.enabled or self.active == shard:
            return
        if self.active is not None:
            self.states[self.active] = raw_rng()
        elif self.protect_caller:
            self._caller = raw_rng()
        set_raw_rng(self.states[shard])
        self.active = shard

    def leave(self) -> None:
        if not self.enabled or not self.protect_caller or self.active is None:
            return
        self.states[self.active] = raw_rng()
        if self._caller is not None:
            set_raw_rng(self._caller)
        self.active, self._caller = None, None

    def state(self, shard: int) -> dict[str, Any] | None:
        if not self.enabled:
            return None
        raw = raw_rng() if self.active == shard else self.states.get(shard)
        return plain_rng(raw) if raw is not None else None
