"""Which DataPipe classes can be saved and restored from state, and how.

Two kinds of hook:

- an *iterator* hook: a :class:`ResumableIterator` subclass that runs the pipe (the engine
  uses it instead of the pipe's own generator, whose locals cannot be read);
- an *object* hook: ``state_dict(datapipe)`` / ``load_state_dict(datapipe, state)``
  functions, for pipes that keep their position in attributes.

A DataPipe that defines ``state_dict()`` and ``load_state_dict(state)`` methods itself (the
torchdata ``Stateful`` protocol) needs no registration. A registered iterator hook also
covers subclasses that do not override ``__iter__``, ``__next__`` or ``reset``.

This module imports no hook: :mod:`snapshot.hooks._install` registers the built-in tables
(the ``builtin`` package), and :func:`register_lazy` loads a third-party package's table
the first time one of its classes is looked up. So imports point one way: the built-in
modules may use the registry, the registry never imports them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from snapshot.hooks._base import ResumableIterator

__all__ = ["StateHook", "generation", "hook_for", "hook_for_class", "refusal_condition", "refusal_for",
           "register_lazy", "register_refusal", "register_state_hook", "registered_types"]

#: Methods through which a pipe yields: a subclass that overrides one does not inherit a hook.
_BEHAVIOUR = ("__iter__", "__next__", "reset", "get_next_element_by_instance")


@dataclass(frozen=True)
class StateHook:
    """How instances of one DataPipe class are saved and restored."""

    iterator: type[ResumableIterator] | None = None
    state_dict: Callable[[Any], Any] | None = None
    load_state_dict: Callable[[Any, Any], None] | None = None

    @property
    def kind(self) -> str:
        return "iterator" if self.iterator is not None else "object"


_HOOKS: dict[type, StateHook] = {}
#: Per class, a function that says why an instance cannot be snapshotted at all (or ``None``).
_REFUSALS: dict[type, tuple[Callable[[Any], str | None], str]] = {}
#: Per top-level package, a function that registers its hooks, called on first use.
_LAZY: dict[str, Callable[[], None]] = {}
_loaded_lazy: set[str] = set()
#: Counts the changes to the tables above (see :func:`generation`).
_changes = 0


def generation() -> int:
    """A number that changes whenever a hook or a refusal is registered (a lazy table loaded included):
    what is derived from the registry for a graph holds while it stays the same."""
    return _changes


def _changed() -> None:
    global _changes
    _changes += 1


def register_state_hook(
    cls: type,
    iterator: type[ResumableIterator] | None = None,
    *,
    state_dict: Callable[[Any], Any] | None = None,
    load_state_dict: Callable[[Any, Any], None] | None = None,
    replace: bool = False,
) -> None:
    """Teach the engine to save and restore ``cls`` from state.

    Give either ``iterator`` (a :class:`~snapshot.hooks.ResumableIterator` subclass that
    runs the pipe) or both ``state_dict(datapipe) -> state`` and
    ``load_state_dict(datapipe, state)``. ``replace=True`` overrides an existing hook
    (the built-in ones included).

    Examples:
        >>> from torch.utils.data import IterDataPipe
        >>> from snapshot.hooks import hook_for, register_state_hook
        >>> class Counter(IterDataPipe):
        ...     def __init__(self, n):
        ...         self.n, self.i = n, 0
        ...     def reset(self):
        ...         self.i = 0
        ...     def __iter__(self):
        ...         while self.i < self.n:
        ...             self.i += 1
        ...             yield self.i
        >>> hook_for(Counter(3)) is None
        True
        >>> register_state_hook(Counter, state_dict=lambda dp: {"i": dp.i},
        ...                     load_state_dict=lambda dp, state: setattr(dp, "i", state["i"]))
        >>> hook_for(Counter(3)).kind
        'object'
    """
    if not isinstance(cls, type):
        raise TypeError(f"register_state_hook needs a class, got {cls!r}")
    if (iterator is None) == (state_dict is None and load_state_dict is None):
        raise TypeError("give either iterator=..., or both state_dict=... and load_state_dict=...")
    if iterator is not None and not (isinstance(iterator, type) and issubclass(iterator, ResumableIterator)):
        raise TypeError(f"iterator must be a ResumableIterator subclass, got {iterator!r}")
    if iterator is None and (state_dict is None or load_state_dict is None):
        raise TypeError("an object hook needs both state_dict=... and load_state_dict=...")
    if cls in _HOOKS and not replace:
        raise ValueError(
            f"{cls.__module__}.{cls.__qualname__} already has a state hook; pass replace=True "
            "to override it"
        )
    _HOOKS[cls] = StateHook(iterator, state_dict, load_state_dict)
    _changed()


def register_lazy(package: str, load: Callable[[], None]) -> None:
    """Call ``load()`` (which registers hooks) the first time a class of ``package`` is looked up."""
    _LAZY[package] = load
    _changed()


def _load_lazy(cls: type) -> None:
    package = cls.__module__.split(".", 1)[0]
    load = _LAZY.get(package)
    if load is not None and package not in _loaded_lazy:
        _loaded_lazy.add(package)
        try:
            load()
        finally:
            _changed()


def _defines_behaviour(cls: type, upto: type) -> bool:
    for klass in cls.__mro__:
        if klass is upto:
            return False
        if any(name in vars(klass) for name in _BEHAVIOUR):
            return True
    return False


def hook_for(datapipe: Any) -> StateHook | None:
    """The hook that applies to ``datapipe``, or ``None`` when it has hidden state."""
    hook = hook_for_class(type(datapipe))
    if hook is not None and hook.iterator is not None and not hook.iterator.accepts(datapipe):
        return None
    return hook


def hook_for_class(cls: type) -> StateHook | None:
    """The hook registered for ``cls``, or inherited by it (without looking at an instance)."""
    hook = _HOOKS.get(cls)
    if hook is None:
        _load_lazy(cls)
        hook = _HOOKS.get(cls)
    if hook is None:  # the torchdata ``Stateful`` protocol, on the class itself
        save, load = getattr(cls, "state_dict", None), getattr(cls, "load_state_dict", None)
        if callable(save) and callable(load):
            return StateHook(None, save, load)
    if hook is None:
        for base in cls.__mro__[1:]:
            inherited = _HOOKS.get(base)
            if inherited is not None and inherited.iterator is not None and not _defines_behaviour(cls, base):
                return inherited
    return hook


def register_refusal(cls: type, reason: Callable[[Any], str | None], *, when: str) -> None:
    """Refuse to snapshot instances of ``cls`` for which ``reason(datapipe)`` returns a text.

    ``when`` says in a few words which instances are refused (for the coverage table).

    For pipes whose position cannot be put back by any strategy (a generator of their own
    that neither a hook nor a replay can reproduce): saving or restoring a graph that holds
    one then raises a :class:`~snapshot.errors.RestoreError` with that text, rather than
    yielding a different stream.
    """
    _REFUSALS[cls] = (reason, when)
    _changed()


def refusal_for(datapipe: Any) -> str | None:
    """Why ``datapipe`` cannot be snapshotted, or ``None`` when it can."""
    cls = type(datapipe)
    _load_lazy(cls)
    for klass in cls.__mro__:
        refusal = _REFUSALS.get(klass)
        if refusal is not None:
            return refusal[0](datapipe)
    return None


def refusal_condition(cls: type) -> str | None:
    """Which instances of ``cls`` are refused (``register_refusal``'s ``when``), or ``None``."""
    _load_lazy(cls)
    for klass in cls.__mro__:
        refusal = _REFUSALS.get(klass)
        if refusal is not None:
            return refusal[1]
    return None


def registered_types() -> list[type]:
    """Every class with an explicitly registered hook (third-party tables once loaded)."""
    return list(_HOOKS)
