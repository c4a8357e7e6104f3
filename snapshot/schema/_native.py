"""The native reader of a manifest: its JSON checked by msgspec's C decoder against types made from the schema's
one definition (each record's :class:`~snapshot.schema._quick.Quick` fields), then made into the schema's records.

A manifest's JSON through ``json.loads`` and the quick readers costs ~0.12 ms, most of a small restore's reading;
msgspec decodes and checks it in ~0.02 ms. Nothing here is a second schema: each record's msgspec type is made
from its quick reader's fields (a count, a string, a nested record, a list of them...), and every other field's
check (a seed's range, a digest, a choice, a record's own cross-checks) is the quick reader's own function, run
on the value msgspec decoded. Anything msgspec refuses (an unknown field of a record that keeps them in
``extra``, a wrong type, a bound, JSON that ``json`` reads but msgspec does not) is :class:`Doubt`: the caller
reads the manifest as before, and the precise reader judges and names what is wrong. So this reader may refuse
more than the precise one, never accept more (tests/schema/test_native.py holds it to that).

msgspec is a light dependency (one small C wheel); without it :func:`reader` is ``None`` and manifests are read
in Python as before.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Optional

from snapshot.schema._fields import MAX_COUNT
from snapshot.schema._quick import _SHAPES, ANY, BOOL, COUNT, OF_READ, REQUIRED, STR, Doubt, Quick, default_line

try:
    import msgspec
except ImportError:  # pragma: no cover - an optional speed-up
    msgspec = None  # type: ignore[assignment]

__all__ = ["reader"]

_new = object.__new__


class _Made:
    """A record type's msgspec Struct (``struct``) and what makes the schema's record of a decoded one
    (``adopt``), both made from a :class:`Quick`'s fields."""

    __slots__ = ("struct", "adopt", "source")

    def __init__(self, quick: Quick) -> None:
        names: dict[str, Any] = {"Doubt": Doubt, "new": _new, "cls": quick.cls}
        annotations: dict[str, Any] = {}
        defaults: dict[str, Any] = {}
        rename: dict[str, str] = {}
        body: list[str] = []
        for i, (name, key, kind, default) in enumerate(quick.fields):
            field = f"f{i}"
            rename[field] = key
            kind_type, convert = _kind(kind, f"k{i}", names)
            store = f"out[{name!r}] ="
            body.append(f"v = s.{field}")
            if default is REQUIRED:
                annotations[field] = kind_type
                if kind_type is Any:
                    body += ["if v is None:", "    raise Doubt"]
                body.append(f"{store} {convert('v')}")
                continue
            annotations[field] = Optional[kind_type]  # noqa: UP045 (a runtime type for msgspec)
            defaults[field] = None
            if default is None:  # null stays null: one line
                body[-1] = f"{store} s.{field}" if convert("v") == "v" else \
                    f"{store} None if (v := s.{field}) is None else {convert('v')}"
                continue
            body += ["if v is None:", default_line(i, default, store, names)]
            body += ["else:", f"    {store} {convert('v')}"]
        if quick.known is not None:
            body.append("out['extra'] = {}")
        namespace = {"__annotations__": annotations, **defaults}
        # a record that keeps unknown keys in extra refuses them here (the quick reader keeps them); the others
        # pass over them, as their readers do
        self.struct = type(f"{quick.cls.__name__}Native", (msgspec.Struct,), namespace,
                           kw_only=True, rename=rename, forbid_unknown_fields=quick.known is not None)
        inner = "".join(f"    {line}\n" for line in body)
        self.source = f"def adopt(s):\n    record = new(cls)\n    out = record.__dict__\n{inner}    return record\n"
        exec(compile(self.source, f"<native reader of {quick.cls.__qualname__}>", "exec"), names)
        self.adopt: Callable[[Any], Any] = names["adopt"]


_COUNT_TYPE: Any = None
#: Each Quick's made types, by the Quick (made when first read).
_made: dict[int, _Made] = {}
#: The functions (the quick readers' own checks) read natively through a Quick and a check of its record:
#: ``function: (quick, check)`` (see :func:`register`).
_WRAPPED: dict[Any, tuple[Quick, Callable[[Any], Any]]] = {}


def register(function: Any, quick: Quick, check: Callable[[Any], Any]) -> None:
    """Read ``function`` (a quick reader: ``quick``'s record, then ``check(record)`` -> the record, or Doubt)
    natively as ``quick``'s Struct, then the same ``check``."""
    _WRAPPED[function] = (quick, check)


def _made_of(quick: Quick) -> _Made:
    made = _made.get(id(quick))
    if made is None:
        made = _made[id(quick)] = _Made(quick)
    return made


def _kind(kind: Any, name: str, names: dict[str, Any]) -> tuple[Any, Callable[[str], str]]:
    """A field kind's msgspec type, and what makes the record's value of a decoded one (an expression of it)."""
    if kind is COUNT:
        return _COUNT_TYPE, lambda v: v
    if kind is STR:
        return str, lambda v: v
    if kind is BOOL:
        return bool, lambda v: v
    if kind is ANY:
        return Any, lambda v: v
    kind = OF_READ.get(kind, kind)
    if isinstance(kind, Quick):
        made = _made_of(kind)
        names[name] = made.adopt
        return made.struct, lambda v: f"{name}({v})"
    wrapped = _WRAPPED.get(kind)
    if wrapped is not None:
        made = _made_of(wrapped[0])
        names[name], names[f"{name}c"] = made.adopt, wrapped[1]
        return made.struct, lambda v: f"{name}c({name}({v}))"
    shape = _SHAPES.get(kind)
    if shape is None:  # a check of the quick reader's own: on the value as decoded
        names[name] = kind
        return Any, lambda v: f"{name}({v})"
    what, read, make = shape
    if what in ("texts", "counts", "copy", "strs", "ints", "list"):
        item = {"texts": str, "counts": _COUNT_TYPE, "copy": Any, "strs": str, "ints": _COUNT_TYPE}.get(what, Any)
        kind_type = list[item] if what in ("strs", "ints", "list") else dict[str, item]  # type: ignore[valid-type]
        if make in (None, list) or what in ("texts", "counts", "copy"):
            return kind_type, lambda v: v  # msgspec's own container: a fresh one, as the quick reader copies
        names[f"{name}m"] = make
        return kind_type, lambda v: f"{name}m({v})"
    optional = False
    if _SHAPES.get(read, ("",))[0] == "optional":
        optional, read = True, _SHAPES[read][1]
    item_type, convert = _kind(read, f"{name}i", names)
    if optional:
        item_type = Optional[item_type]  # noqa: UP045
    each = convert("x")
    if optional:
        each = f"None if x is None else {each}"
    if what == "by_path":
        return dict[str, item_type], lambda v: f"{{p: {each} for p, x in {v}.items()}}"  # type: ignore[valid-type]
    if make is tuple:
        return list[item_type], lambda v: f"tuple([{each} for x in {v}])"  # type: ignore[valid-type]
    if make is list:
        return list[item_type], lambda v: f"[{each} for x in {v}]"  # type: ignore[valid-type]
    names[f"{name}m"] = make
    return list[item_type], lambda v: f"{name}m([{each} for x in {v}])"  # type: ignore[valid-type]


class Reader:
    """Reads a record from JSON bytes natively (``read``: the record, or Doubt)."""

    def __init__(self, quick: Quick, check: Callable[[Any], Any]) -> None:
        made = _made_of(quick)
        self._decode: Callable[[bytes], Any] = msgspec.json.Decoder(made.struct).decode
        self._adopt, self._check = made.adopt, check

    def read(self, data: bytes) -> Any:
        try:
            decoded = self._decode(data)
        except (ValueError, RecursionError, OverflowError):  # msgspec's DecodeError is a ValueError, as is bad UTF-8
            raise Doubt from None
        return self._check(self._adopt(decoded))


def reader(quick: Quick, check: Callable[[Any], Any]) -> Reader | None:
    """The native reader of ``quick``'s records (``check``: the record's cross-checks, Doubt if one fails), or
    ``None`` without msgspec."""
    global _COUNT_TYPE
    if msgspec is None:
        return None
    if _COUNT_TYPE is None:
        _COUNT_TYPE = Annotated[int, msgspec.Meta(ge=0, le=MAX_COUNT)]
    return Reader(quick, check)
