"""Registers the built-in hook tables: torch's pipes now, torchdata 0.9's on first use.

The tables live beside their iterators (:mod:`snapshot.hooks.builtin` and its
:mod:`~snapshot.hooks.builtin.torchdata_pipes` package); this module is the only one that imports
both them and the registry, so neither imports the other.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from snapshot.hooks._base import ResumableIterator
from snapshot.hooks._registry import register_lazy, register_refusal, register_state_hook

__all__ = ["install"]


def _register(hooks: Mapping[type, type[ResumableIterator]],
              refusals: Mapping[type, tuple[Callable[[Any], str | None], str]]) -> None:
    for cls, iterator in hooks.items():
        register_state_hook(cls, iterator, replace=True)
    for cls, (reason, when) in refusals.items():
        register_refusal(cls, reason, when=when)


def _torchdata() -> None:
    from snapshot.hooks.builtin import torchdata_pipes as torchdata

    _register(torchdata.TORCHDATA_HOOKS, torchdata.REFUSALS)


def install() -> None:
    """Register torch's built-in hooks, and torchdata's to load when first needed."""
    from snapshot.hooks import builtin

    _register(builtin.BUILTIN_HOOKS, builtin.REFUSALS)
    register_lazy("torchdata", _torchdata)
