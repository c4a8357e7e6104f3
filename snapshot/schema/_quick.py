"""The quick reader of the schema's records: it checks a well-formed record in one pass and leaves
anything else to the precise reader (:mod:`snapshot.schema._fields`), which judges."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from snapshot.schema._fields import _SHA256, MAX_COUNT, UINT64_LIMIT, T

# A restore reads ~160 fields: through _Fields each costs a path string, a reader call and a frozen
# dataclass's setattr. The quick reader checks the same fields with code made for each record (see Quick),
# keeps no path, and fills the record's __dict__ itself; on anything it does not accept at once (a wrong or
# unusual value, an int subclass, a failed cross-check) it raises Doubt, and the record's precise reader (the
# ``_Fields`` code, the only one that judges) reads the value again and names what is wrong. So it may refuse
# more than the precise reader, never accept more (tests/schema/test_quick.py holds them to it).
# Each record's from_dict tries its quick reader inline (try/except Doubt) rather than through a
# decorator: a Quick is made from its class, so it exists only after the class statement.

class Doubt(Exception):
    """The quick reader leaves this value to the precise one."""


#: A field's kinds the quick reader checks inline (any other kind is a function: value -> value, or Doubt).
COUNT, STR, BOOL, ANY = "count", "str", "bool", "any"
#: A field with no default: missing or null is Doubt.
REQUIRED: Any = object()
_new = object.__new__
#: Each Quick, by its ``read`` (what the helpers below keep of it: see :func:`_reader`).
OF_READ: dict[Any, Quick] = {}


class Quick:
    """Reads one record type: ``fields`` are ``(attribute, key, kind, default)`` in the order of the
    dataclass's fields (a default that is a type is called for a fresh value); ``extra`` keeps the keys
    it does not know, as ``_Fields.extra`` does.

    The reader is code made for the record (as ``dataclasses`` makes ``__init__``): one test per field, written
    out, with no loop over the fields nor a branch on their kinds at read time (:func:`_reader_source`)."""

    __slots__ = ("cls", "fields", "known", "read", "_values", "source")

    def __init__(self, cls: type, fields: tuple[tuple[Any, ...], ...], *, extra: bool = False):
        self.cls = cls
        #: ``(attribute, kind, default)`` is short for a field whose key is its attribute's name
        self.fields = tuple(field if len(field) == 4 else (field[0], *field) for field in fields)
        self.known = frozenset(key for _, key, _, _ in self.fields) if extra else None
        self.source, names = _reader_source(self.fields, extra)
        scope = {"Doubt": Doubt, "new": _new, "cls": cls, "known": self.known, **names}
        exec(compile(self.source, f"<quick reader of {cls.__qualname__}>", "exec"), scope)
        #: The record of a value, or Doubt (what a reader made after this one calls: no method in between).
        self.read: Callable[[Any], Any] = scope["read"]
        self._values: Callable[[Any], dict[str, Any]] = scope["values"]
        OF_READ[self.read] = self

    def __call__(self, value: Any) -> Any:
        """The record of ``value``, or Doubt."""
        return self.read(value)

    def values(self, value: Any) -> dict[str, Any]:
        """The checked fields of ``value`` by attribute, or Doubt."""
        return self._values(value)


def _reader_source(fields: tuple[tuple[Any, ...], ...], extra: bool) -> tuple[str, dict[str, Any]]:
    """The source of ``read`` and ``values`` for ``fields`` (see :class:`Quick`), and the objects it names.
    Only the keys and attribute names (as ``repr``) and the bounds of this module enter the text; every other
    object (a reader, a default) is named ``k<i>``/``d<i>`` and passed in."""
    names: dict[str, Any] = {}
    body: list[str] = []
    for i, (name, key, kind, default) in enumerate(fields):
        store = f"out[{name!r}] ="
        body += [f"item = get({key!r})", "if item is None:"]
        if default is REQUIRED:
            body.append("    raise Doubt")
        else:
            body.append(default_line(i, default, store, names))
        if kind is COUNT:
            body += [f"elif type(item) is not int or not 0 <= item <= {MAX_COUNT}:", "    raise Doubt"]
        elif kind is STR:
            body += ["elif type(item) is not str:", "    raise Doubt"]
        elif kind is BOOL:
            body += ["elif type(item) is not bool:", "    raise Doubt"]
        elif _SHAPES.get(kind, ("",))[0] in _TYPES:
            test, lines = _shape_source(_SHAPES[kind], f"k{i}", names)
            body += [f"elif {test}:", "    raise Doubt", "else:", *(f"    {line}" for line in lines), f"    {store} x"]
            continue
        elif kind is not ANY:
            names[f"k{i}"] = _reader(kind)
            body += ["else:", f"    {store} k{i}(item)"]
            continue
        body += ["else:", f"    {store} item"]
    if extra:
        body.append("out['extra'] = {} if value.keys() <= known else "
                    "{k: v for k, v in value.items() if k not in known}")
    inner = "".join(f"    {line}\n" for line in body)
    head = "    if type(value) is not dict:\n        raise Doubt\n    get = value.get\n"
    return (f"def read(value):\n{head}    record = new(cls)\n    out = record.__dict__\n{inner}    return record\n"
            f"def values(value):\n{head}    out = {{}}\n{inner}    return out\n"), names


#: The helpers below whose checks a reader writes out in its own code, a call the less per field:
#: ``helper: (shape, reader of each item or None, what makes the result)``.
_SHAPES: dict[Any, tuple[str, Any, Any]] = {}
_COUNT = f"type(v) is not int or not 0 <= v <= {MAX_COUNT}"
_TYPES = {"texts": "dict", "counts": "dict", "copy": "dict", "by_path": "dict",
          "list": "list", "strs": "list", "ints": "list", "records": "list"}


def default_line(i: int, default: Any, store: str, names: dict[str, Any]) -> str:
    """The generated line that stores field ``i``'s default (a type is called for a new value; names it in
    ``names``)."""
    names[f"d{i}"] = default
    if type(default) is type:
        return f"    {store} {'{}' if default is dict else '[]' if default is list else f'd{i}()'}"
    return f"    {store} d{i}"


def _shape_source(shape: tuple[str, Any, Any], name: str, names: dict[str, Any]) -> tuple[str, list[str]]:
    """What a reader writes for a helper of ``_SHAPES`` read into ``x`` from ``item``: the test that Doubts,
    and the lines after it (``name``: what the item reader is called in the reader's scope)."""
    kind, read, make = shape
    test = f"type(item) is not {_TYPES[kind]}"
    made = "x" if make is None else f"{make.__name__}(x)"
    if kind in ("texts", "counts"):
        bad = "type(v) is not str" if kind == "texts" else _COUNT
        return test, ["for v in item.values():", f"    if {bad}:", "        raise Doubt", "x = dict(item)"]
    if kind in ("strs", "ints"):
        bad = "type(v) is not str" if kind == "strs" else _COUNT
        return test, ["for v in item:", f"    if {bad}:", "        raise Doubt", f"x = {make.__name__}(item)"]
    if kind in ("copy", "list"):
        return test, [f"x = {'dict(item)' if kind == 'copy' else made.replace('x', 'item')}"]
    optional = _SHAPES.get(read, ("",))[0] == "optional"
    names[name] = _SHAPES[read][1] if optional else _reader(read)
    call = f"None if v is None else {name}(v)" if optional else f"{name}(v)"
    if kind == "by_path":
        return test, ["x = {}", "for p, v in item.items():", f"    x[p] = {call}"]
    return test, ["x = []", "for v in item:", f"    x.append({call})", *([] if make is list else [f"x = {made}"])]


def build(cls: type[T], values: dict[str, Any]) -> T:
    """A record from its checked fields, as its ``__init__`` would make it (the dataclasses here have no
    ``__post_init__``; equality, hashing and ``repr`` read the same fields)."""
    record = _new(cls)
    record.__dict__.update(values)
    return record


def quick_int(minimum: int, maximum: int = MAX_COUNT) -> Callable[[Any], int]:
    def read(value: Any) -> int:
        if type(value) is not int or not minimum <= value <= maximum:
            raise Doubt
        return value
    return read


def quick_seed(value: Any) -> int:
    if type(value) is not int or not 0 <= value < UINT64_LIMIT:
        raise Doubt
    return value


def quick_sha256(value: Any) -> str:
    if type(value) is not str or not _SHA256.fullmatch(value):
        raise Doubt
    return value


def quick_choice(choices: tuple[str, ...]) -> Callable[[Any], str]:
    def read(value: Any) -> str:
        if type(value) is not str or value not in choices:
            raise Doubt
        return value
    return read


def quick_texts(value: Any) -> dict[str, str]:
    """``_texts`` when every value is a string already (a number, kept as its text, is left to it)."""
    if type(value) is not dict:
        raise Doubt
    for item in value.values():
        if type(item) is not str:
            raise Doubt
    return dict(value)


def quick_counts(value: Any) -> dict[str, int]:
    if type(value) is not dict:
        raise Doubt
    for item in value.values():
        if type(item) is not int or not 0 <= item <= MAX_COUNT:
            raise Doubt
    return dict(value)


def quick_copy(value: Any) -> dict[Any, Any]:
    """``dict(_object(...))``: an object, copied."""
    if type(value) is not dict:
        raise Doubt
    return dict(value)


def quick_list(value: Any) -> list[Any]:
    """``_list``: a list, as it is."""
    if type(value) is not list:
        raise Doubt
    return value


def quick_list_copy(value: Any) -> list[Any]:
    """``list(_list(...))``: a list, copied."""
    if type(value) is not list:
        raise Doubt
    return list(value)


def quick_strs(value: Any) -> tuple[str, ...]:
    """``_records(..., _str)``."""
    if type(value) is not list:
        raise Doubt
    for item in value:
        if type(item) is not str:
            raise Doubt
    return tuple(value)


def quick_ints(make: Callable[[list[int]], Any] = tuple) -> Callable[[Any], Any]:
    """``_records(..., _int)`` (``make=list``: ``_items(_int)``)."""
    def ints(value: Any) -> Any:
        if type(value) is not list:
            raise Doubt
        for item in value:
            if type(item) is not int or not 0 <= item <= MAX_COUNT:
                raise Doubt
        return make(value)
    _shaped(ints, "ints", None, make)
    return ints


def quick_records(read: Callable[[Any], T], make: Callable[[list[T]], Any] = tuple) -> Callable[[Any], Any]:
    """``_records(..., read)`` (``make=list``: ``_items``); ``read`` may take ``None`` (see ``_optional``)."""
    read = _reader(read)

    def records(value: Any) -> Any:
        if type(value) is not list:
            raise Doubt
        return make([read(item) for item in value])
    _shaped(records, "records", read, make)
    return records


def quick_by_path(read: Callable[[Any], T]) -> Callable[[Any], dict[Any, T]]:
    """``_by_path(..., read)``."""
    read = _reader(read)

    def by_path(value: Any) -> dict[Any, T]:
        if type(value) is not dict:
            raise Doubt
        return {path: read(item) for path, item in value.items()}
    _shaped(by_path, "by_path", read, None)
    return by_path


def quick_optional(read: Callable[[Any], T]) -> Callable[[Any], T | None]:
    read = _reader(read)

    def optional(value: Any) -> T | None:
        return None if value is None else read(value)
    _SHAPES[optional] = ("optional", read, None)  # written out only as the items of records
    return optional


def _reader(read: Callable[[Any], T]) -> Callable[[Any], T]:
    """A Quick's reader itself (a call the less per record)."""
    return read.read if isinstance(read, Quick) else read


def _shaped(helper: Any, kind: str, read: Any, make: Any) -> None:
    if make in (None, tuple, list):  # what _shape_source writes by name
        _SHAPES[helper] = (kind, read, make)


for _helper, _shape in ((quick_texts, "texts"), (quick_counts, "counts"), (quick_copy, "copy"), (quick_list, "list"),
                        (quick_list_copy, "list"), (quick_strs, "strs")):
    _shaped(_helper, _shape, None, list if _helper is quick_list_copy else tuple if _shape == "strs" else None)
