"""The quick reader (``snapshot.schema._quick.Quick``) may refuse more than the precise reader, never accept
more: on every value the precise reader refuses, the quick one doubts; on every value it accepts, it gives the
same record, field for field and type for type, sharing the same parts of the input. So ``from_dict`` ends as
the precise reader alone would, error message and all.

Every field of real manifests and payload states (and of the records' own test values) is edited in turn:
removed, renamed, or replaced by a value of another type, out of range, a subclass, an empty container.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import snapshot
from snapshot import schema
from snapshot.schema import _quick, manifest, saved
from tests import graphs, helpers
from tests.schema import test_state_records as records


class Int(int):
    pass


class Str(str):
    pass


class Dict(dict):  # type: ignore[type-arg]
    pass


class List(list):  # type: ignore[type-arg]
    pass


#: What each place is set to in turn: each type the schema reads, and each bound of its ranges, either side.
SAMPLES: list[Any] = [None, True, False, 0, 1, -1, -2, 2**32 - 1, 2**32, 2**63 - 1, 2**63, 2**64 - 1, 2**64, 1.0,
                      "", "x", "0", "state", "f" * 64, [], [1], ["x"], [None], {}, {"x": 1}, {"0": 0}, {0: 1},
                      Int(1), Str("x"), Dict(x=1), List([1])]


def _saved_with(factory: Callable[[], Any], service: Any, take: int, **save: Any) -> snapshot.Snapshot:
    with helpers.loader_at(factory(), take, seed=3, reading_service=service) as (loader, _):
        return loader.save_snapshot(**save)


def _bases() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    snaps = [_saved_with(graphs.linear, None, 5, verify=2, metadata={"step": 3}), _saved_with(graphs.sharded, None, 7),
             _saved_with(graphs.sharded, snapshot.MultiProcessingReadingService(num_workers=2, timeout=60), 6)]
    manifests = [snapshot.load(s.to_bytes()).manifest for s in snaps]
    states = [s.state for s in snaps] + [records.SAVED.to_dict()]
    rich = copy.deepcopy(manifests[-1])
    rich["payload"].update(pickled=[{"at": "x", "type": "T", "size": 0}])
    rich["randomness"]["node_seeds"] = {"0": "ab"}
    rich["shards"][0]["nodes"]["0"]["reading"] = {"file": "a.txt", "member": "m", "offset": 3, "entry": 1,
                                                  "inflated": True}
    rich["future"] = {"kept": 1}
    schema.Manifest.from_dict(rich)  # a well-formed manifest with the fields the saves above leave out
    return manifests + [rich], states


MANIFESTS, STATES = _bases()
SERVICES = [s["service"] for s in STATES if s["service"]]


#: The fields the schema keeps as they are (a node's state, generator states): edited whole, not inside.
OPAQUE = {"state", "rng", "merge", "passes", "persistent", "in_flight", "queues", "deal", "even_batches", "lookahead"}


def _places(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every place in a JSON tree (lists: their first three items; opaque fields: themselves)."""
    yield path
    if path and path[-1] in OPAQUE:
        return
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _places(item, (*path, key))
    elif isinstance(value, list):
        for i, item in enumerate(value[:3]):
            yield from _places(item, (*path, i))


_GONE = object()


def _edits(base: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    """``base`` with one place removed, renamed or replaced (or an unknown field added to an object), edited in
    place and put back after each."""
    for sample in SAMPLES:
        yield repr(sample), sample
    for path in list(_places(base)):
        if not path:
            continue
        parent, last = _at(base, path[:-1]), path[-1]
        item = parent[last]
        if isinstance(parent, dict):
            keys = list(parent)
            for new in (None, f"{last}_", 1):
                if new in parent:
                    continue
                del parent[last]
                if new is not None:
                    parent[new] = item
                yield f"{path} {'removed' if new is None else f'renamed {new!r}'}", base
                parent.pop(new, None)
                parent[last] = item
                for key in keys:  # the order as it was
                    parent[key] = parent.pop(key)
        if isinstance(item, dict):
            item["zz_unknown"] = 1
            yield f"{path} with an unknown field", base
            del item["zz_unknown"]
        for sample in SAMPLES:
            parent[last] = sample
            yield f"{path} {sample!r}", base
        parent[last] = item


def _trimmed(value: Any) -> Any:
    """``value`` with its long lists (a generator's state, a buffer) cut to three items: fewer places to edit."""
    if isinstance(value, dict):
        return {key: _trimmed(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_trimmed(item) for item in (value[:3] if len(value) > 4 else value)]
    return value


class _Precise:
    """The precise readers alone: every quick reader doubts."""

    def __enter__(self) -> None:
        self._saved = _quick.Quick.values, _quick.Quick.__call__

        def doubt(self: Any, value: Any) -> Any:
            raise _quick.Doubt
        _quick.Quick.values = _quick.Quick.__call__ = doubt  # type: ignore[method-assign]

    def __exit__(self, *exc: Any) -> None:
        _quick.Quick.values, _quick.Quick.__call__ = self._saved  # type: ignore[method-assign]


def _outcome(read: Callable[[], Any]) -> tuple[str, Any]:
    try:
        return "value", read()
    except Exception as exc:  # noqa: BLE001 - the outcome compared is any exception, by type and message
        return type(exc).__name__, str(exc)


def _same(a: Any, b: Any, where: str = "") -> None:
    """``a`` and ``b`` hold the same values of the same types, all the way down."""
    assert type(a) is type(b), f"{where}: {type(a).__name__} != {type(b).__name__}"
    if dataclasses.is_dataclass(a):
        assert list(vars(a)) == list(vars(b)), where
        for key in vars(a):
            _same(vars(a)[key], vars(b)[key], f"{where}.{key}")
    elif isinstance(a, dict):
        assert list(a) == list(b), where
        for key in a:
            _same(a[key], b[key], f"{where}[{key!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{where}[{i}]")
    else:
        assert a == b or a != a and b != b, f"{where}: {a!r} != {b!r}"  # nan is itself


def _shared(record: Any, given: Any) -> list[bool]:
    """Whether each container in ``record`` (in order) is one of ``given``'s own, not a copy."""
    mine: set[int] = set()

    def own(value: Any) -> None:
        if isinstance(value, (dict, list)):
            mine.add(id(value))
            for item in value.values() if isinstance(value, dict) else value:
                own(item)
    own(given)
    out: list[bool] = []

    def walk(value: Any) -> None:
        if dataclasses.is_dataclass(value):
            for item in vars(value).values():
                walk(item)
        elif isinstance(value, (dict, list, tuple)):
            if not isinstance(value, tuple):
                out.append(id(value) in mine)
            for item in value.values() if isinstance(value, dict) else value:
                walk(item)
    walk(record)
    return out


def _at(value: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        value = value[key]
    return value


def _agree(read: Callable[[Any], Any], quick: Callable[[Any], Any], value: Any) -> bool:
    """The quick reader doubts ``value`` or reads it as the precise one does; ``read`` (the quick reader
    first) ends as the precise reader alone. Whether the quick reader took it."""
    with _Precise():
        precise = _outcome(lambda: read(value))
    try:
        fast = quick(value)
    except _quick.Doubt:
        fast = _quick.Doubt
    outcome = _outcome(lambda: read(value))
    if precise[0] != "value":
        assert fast is _quick.Doubt, f"the quick reader took what the precise one refuses: {precise[1]}"
        assert outcome == precise
        return False
    assert outcome[0] == "value", outcome
    _same(outcome[1], precise[1])
    if fast is _quick.Doubt:
        return False
    _same(fast, precise[1])
    assert _shared(fast, value) == _shared(precise[1], value)
    return True


EDITED = [
    ("manifest", schema.Manifest.from_dict, manifest._quick_manifest, [MANIFESTS[-1]]),
    ("state", schema.SavedState.from_dict, saved._quick_saved, [STATES[2], STATES[3]]),
]
READERS: list[tuple[str, Callable[[Any], Any], Callable[[Any], Any], list[dict[str, Any]]]] = [
    ("manifest", schema.Manifest.from_dict, manifest._quick_manifest, MANIFESTS),
    ("state", schema.SavedState.from_dict, saved._quick_saved, STATES),
    ("service", schema.ServiceState.from_dict, saved._quick_service, SERVICES),
]


@pytest.mark.parametrize("name, read, quick, bases", READERS, ids=[r[0] for r in READERS])
def test_the_quick_reader_takes_what_a_loader_writes(name: str, read: Any, quick: Any, bases: Any) -> None:
    for base in bases:
        assert _agree(read, quick, base), "the quick reader doubts a well-formed record: it is never used"


@pytest.mark.parametrize("name, read, quick, bases", EDITED, ids=[r[0] for r in EDITED])
def test_on_every_edit_the_quick_reader_doubts_or_agrees(name: str, read: Any, quick: Any, bases: Any) -> None:
    taken = refused = 0
    for base in bases:
        trimmed = _trimmed(base)
        base = trimmed if _outcome(lambda: read(trimmed))[0] == "value" else base  # noqa: B023 - called here
        assert _agree(read, quick, base)
        for what, edited in _edits(base):
            try:
                taken += _agree(read, quick, edited)
            except AssertionError as exc:
                raise AssertionError(f"{name}, {what}: {exc}") from None
            refused += 1
    assert taken > 10 and refused > taken  # both sides of the fence were tried


@settings(max_examples=300, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.data())
def test_several_edits_at_once_are_doubted_or_agreed(data: st.DataObject) -> None:
    name, read, quick, bases = data.draw(st.sampled_from(READERS))
    value = copy.deepcopy(data.draw(st.sampled_from(bases)))
    places = [p for p in _places(value) if p]
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from(places))
        try:
            parent = _at(value, path[:-1])
            parent[path[-1]] = copy.deepcopy(data.draw(st.sampled_from(SAMPLES)))  # samples stay as they are
        except (KeyError, IndexError, TypeError):
            continue  # a place an earlier edit removed
    _agree(read, quick, value)


@pytest.mark.parametrize("record", [records.NODE, records.ROUTER, records.SHARD, records.UPSTREAM, records.SEEDS,
                                    records.SHARD.plan, schema.ShardState(), schema.NodeState(),
                                    schema.UpstreamState()], ids=lambda r: type(r).__name__)
def test_the_records_test_values_read_quickly_and_the_same(record: Any) -> None:
    value = record.to_dict()
    with _Precise():
        precise = type(record).from_dict(value)
    _same(type(record).from_dict(value), precise)


_SABOTAGE = {"a count may be -1": ("not 0 <= item", "not -1 <= item"),
             "a bool may be an int": ("type(item) is not bool", "type(item) is not bool and type(item) is not int"),
             None: ("", "")}


@pytest.mark.parametrize("sabotage", list(_SABOTAGE), ids=lambda s: s or "intact")
def test_a_broken_reader_is_caught(sabotage: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The edits above catch a reader made wrong (and find nothing wrong with one made right)."""
    made = _quick._reader_source
    old, new = _SABOTAGE[sabotage]
    monkeypatch.setattr(_quick, "_reader_source", lambda fields, extra: (made(fields, extra)[0].replace(old, new),
                                                                         made(fields, extra)[1]))
    reader = _quick.Quick(schema.LoaderPosition, (("epoch", _quick.quick_int(-1), _quick.REQUIRED),
                                                  ("yielded", _quick.COUNT, _quick.REQUIRED),
                                                  ("epoch_finished", _quick.BOOL, _quick.REQUIRED),
                                                  ("lookahead", _quick.COUNT, 0)))
    caught = []
    for what, edited in _edits({"epoch": 0, "yielded": 3, "epoch_finished": False, "lookahead": 1}):
        try:
            _agree(schema.LoaderPosition.from_dict, reader.read, edited)
        except AssertionError:
            caught.append(what)
    assert bool(caught) == (sabotage is not None), caught
