"""State hooks: how each DataPipe is saved and restored in O(state), not O(samples).

A DataPipe is restored from its state when it has a hook:

- every DataPipe in ``torch.utils.data.datapipes.iter`` (and torchdata 0.9's most used
  pipes) ships with one: a :class:`ResumableIterator` that runs the pipe and yields exactly
  what its own generator yields, but whose position can be read between any two samples;
- a DataPipe that defines ``state_dict()`` and ``load_state_dict(state)`` (the torchdata
  ``Stateful`` protocol) is restored through them;
- :func:`register_state_hook` adds either kind for classes you cannot edit.

A pipe whose own generator can be neither saved nor replayed (an unseeded
``random_split``, a ``Sampler`` over a random sampler) is refused: saving or restoring a
graph that holds one raises a :class:`~snapshot.errors.RestoreError` (see
:func:`register_refusal`).

A pipe without a hook (a generator ``__iter__`` of your own, say) is replayed: the restore
plan fast-forwards the smallest part of the graph that contains it, from the start of the
epoch. A pipe whose generator keeps nothing between samples (``for x in self.source: yield
f(x)``) can be declared so with ``register_state_hook(MyPipe, Itemwise)``: it is then restarted
over its inputs, restored from their states, and nothing is replayed. See
``docs/hooks.md`` for the contract a hook must keep.
"""

from snapshot.hooks._base import ResumableIterator, Stateless
from snapshot.hooks._install import install as _install
from snapshot.hooks._registry import (
    StateHook,
    hook_for,
    refusal_for,
    register_refusal,
    register_state_hook,
    registered_types,
)
from snapshot.hooks.builtin.callable import ItemwiseIterator as Itemwise

_install()

__all__ = [
    "Itemwise",
    "ResumableIterator",
    "StateHook",
    "Stateless",
    "hook_for",
    "refusal_for",
    "register_refusal",
    "register_state_hook",
    "registered_types",
]
