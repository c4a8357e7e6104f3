"""The DataPipe graph as data: deterministic traversal, node paths, fingerprints.

A node is named by its *path* from the sink through input edges: the sink is ``"0"``, and
each input edge appends the attribute that holds the input (plus an index when the
attribute is a list, tuple or dict). In ``IterableWrapper(...).shuffle().map(f)`` the map is
``0``, the shuffle ``0/datapipe`` and the source ``0/datapipe/datapipe``; the second input of
a ``zip`` is ``0/datapipes/1``. A graph rebuilt in code gets the same paths, so a saved
snapshot maps onto it without relying on ``id()``.

A node reached through several edges (the shared container behind ``fork`` or ``demux``
children) is visited once and keeps the path of the first edge that reaches it, in a
depth-first walk that follows attributes in definition order.

Each node has a structural fingerprint: its type and the constructor arguments that
matter, reduced to stable tokens (numbers and strings by value, functions by qualified
name, large collections by length and a sample, other objects by type). The graph's
fingerprint covers every node and every edge. Apart from it, each node has a *code*
fingerprint per function argument (``Node.code``): the function's bytecode, constants and
names, recursively through nested code objects, closures and the functions of its own module
that it calls, so an edited function is seen even when its name is not changed. Bytecode
differs between Python versions, so a code fingerprint is tagged with the version that made it.

torchdata 0.9's graph utilities (``traverse_dps``, ``list_dps``, ``find_dps``,
``replace_dp``, ``remove_dp``, ``set_datapipes_seed``, ``set_graph_random_seed``, ``DataPipe``)
are importable from here too, so code written against ``torchdata.dataloader2.graph``
migrates by changing the import.

This module knows nothing of snapshots, files or reading services.
"""

from __future__ import annotations

import hashlib
import inspect
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from snapshot.engine._code import code_fingerprint, python_of
from snapshot.engine._graph_utils import (
    DataPipe,
    DataPipeGraph,
    find_dps,
    list_dps,
    remove_dp,
    replace_dp,
    set_datapipes_seed,
    set_graph_random_seed,
    traverse_dps,
)
from snapshot.engine._tokens import _MAX_TOKEN_ITEMS, _is_datapipe, _token, attribute, describe_value, type_name

__all__ = ["ROOT", "DataPipe", "DataPipeGraph", "Graph", "Node", "NodeDiff", "compare_nodes", "describe_value",
           "find_dps", "list_dps", "remove_dp", "replace_dp", "set_datapipes_seed", "set_graph_random_seed",
           "traverse_dps", "type_name"]

ROOT = "0"
#: Collections longer than this are not searched for input DataPipes.
_MAX_SCAN = 256
_DISPLAY_WIDTH = 80


_PARAMETERS: dict[type, tuple[str, ...]] = {}


def _init_parameters(cls: type) -> tuple[str, ...]:
    cached = _PARAMETERS.get(cls)
    if cached is None:
        cached = _PARAMETERS[cls] = _signature_names(cls)
    return cached


def _signature_names(cls: type) -> tuple[str, ...]:
    try:
        signature = inspect.signature(cls)
    except (TypeError, ValueError):
        return ()
    names = []
    for name, param in signature.parameters.items():
        if name == "self" or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        names.append(name)
    return tuple(names)


_MISSING = object()


def _arguments(datapipe: Any) -> tuple[dict[str, str], list[tuple[str, Any]]]:
    """Constructor arguments that are not DataPipes, as tokens, in signature order; and the functions among
    them (items of a list or dict argument as ``name[i]``), whose code :attr:`Node.code` fingerprints when
    asked (each argument is looked up once, for both)."""
    args: dict[str, str] = {}
    functions: list[tuple[str, Any]] = []
    for name in _init_parameters(type(datapipe)):
        value = attribute(datapipe, name, _MISSING)
        if value is _MISSING or _is_datapipe(value):
            continue
        if isinstance(value, (list, tuple, dict)):
            _collect_functions(name, value, functions)
            if isinstance(value, (list, tuple)) and value and all(_is_datapipe(v) for v in value):
                continue
        elif callable(value):  # only a callable runs code (most arguments are not)
            functions.append((name, value))
        args[name] = _token(value)
    return args, functions


def _collect_functions(name: str, value: list[Any] | tuple[Any, ...] | dict[Any, Any],
                       functions: list[tuple[str, Any]]) -> None:
    """The functions among the items of a list or dict argument, as ``name[i]``."""
    if len(value) > _MAX_TOKEN_ITEMS:
        return
    for key, item in value.items() if isinstance(value, dict) else enumerate(value):
        if callable(item) and not _is_datapipe(item):
            functions.append((f"{name}[{key}]", item))


def _input_edges(datapipe: Any) -> list[tuple[str, Any]]:
    """``(segment, input)`` pairs for every DataPipe held by ``datapipe``'s attributes."""
    try:
        attributes = vars(datapipe)
    except TypeError:
        return []
    edges: list[tuple[str, Any]] = []
    for name, value in list(attributes.items()):
        if name != "_fast_forward_iterator" and _is_datapipe(value):  # most are an input or a plain value
            edges.append((name, value))
        elif name != "_fast_forward_iterator" and isinstance(value, (list, tuple, dict)):
            _collect(name, value, edges, depth=0)
    return edges


def _collect(segment: str, value: Any, edges: list[tuple[str, Any]], depth: int) -> None:
    if _is_datapipe(value):
        edges.append((segment, value))
    elif depth < 2 and isinstance(value, (list, tuple)) and len(value) <= _MAX_SCAN:
        for index, item in enumerate(value):
            _collect(f"{segment}/{index}", item, edges, depth + 1)
    elif depth < 2 and isinstance(value, dict) and len(value) <= _MAX_SCAN:
        for key, item in value.items():
            if isinstance(key, (str, int)):
                _collect(f"{segment}/{key}", item, edges, depth + 1)


@dataclass
class Node:
    """One DataPipe in a graph."""

    path: str
    datapipe: Any
    type: str
    args: dict[str, str]
    inputs: list[str] = field(default_factory=list)
    consumers: list[str] = field(default_factory=list)
    #: The function arguments (name, callable) whose code :attr:`code` fingerprints.
    functions: list[tuple[str, Any]] = field(default_factory=list, repr=False, compare=False)
    # computed once, when first asked (a plain attribute: ``functools.cached_property`` takes a lock per
    # read before Python 3.12, which a restore's graph check paid on every node)
    _fingerprint: str | None = field(default=None, init=False, repr=False, compare=False)
    _code: dict[str, str] | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def fingerprint(self) -> str:
        """A digest of the type and the arguments (both fixed once the node is found: computed once)."""
        if self._fingerprint is None:
            text = self.type + "(" + ", ".join(f"{k}={v}" for k, v in self.args.items()) + ")"
            self._fingerprint = hashlib.sha256(text.encode()).hexdigest()[:16]
        return self._fingerprint

    @property
    def code(self) -> dict[str, str]:
        """The code fingerprint of each function argument (see :func:`code_fingerprint`); computed once."""
        if self._code is None:
            code = {}  # set when whole: a background save's thread may compute it as the loader's reads it
            for name, function in self.functions:
                fingerprint = code_fingerprint(function)
                if fingerprint is not None:
                    code[name] = fingerprint
            self._code = code
        return self._code

    @property
    def signature(self) -> str:
        """``Type(arg=value, ...)`` for messages, with long values shortened."""
        short = self.type.rsplit(".", 1)[-1]
        parts = []
        for key, value in self.args.items():
            if len(value) > _DISPLAY_WIDTH:
                value = value[: _DISPLAY_WIDTH - 3] + "..."
            parts.append(f"{key}={value}")
        return f"{short}({', '.join(parts)})"

    def describe(self) -> dict[str, Any]:
        """JSON-able description (used by manifests); ``code`` only for a node with functions."""
        described = {
            "path": self.path,
            "type": self.type,
            "args": {k: (v if len(v) <= _DISPLAY_WIDTH else v[: _DISPLAY_WIDTH - 3] + "...")
                     for k, v in self.args.items()},
            "fingerprint": self.fingerprint,
            "inputs": list(self.inputs),
        }
        if self.code:
            described["code"] = dict(self.code)
        return described


class Graph:
    """A DataPipe graph walked from its sink.

    ``nodes`` is in depth-first pre-order (sink first, inputs in attribute order), which is
    deterministic for a graph built by the same code.
    """

    def __init__(self, sink: Any):
        if not _is_datapipe(sink):
            raise TypeError(f"expected an IterDataPipe or MapDataPipe, got {type_name(sink)}")
        self.sink = sink
        self.nodes: list[Node] = []
        self.by_path: dict[str, Node] = {}
        self._path_of: dict[int, str] = {}
        #: What the layers above derive from this graph alone, kept with it (made again with the graph):
        #: a restore's checks and its plans ask for the same facts.
        self.memo: dict[Any, Any] = {}
        self._walk(sink)

    def _walk(self, sink: Any) -> None:
        stack: list[tuple[str, Any, str | None]] = [(ROOT, sink, None)]
        while stack:
            path, datapipe, consumer = stack.pop()
            known = self._path_of.get(id(datapipe))
            if known is not None:
                if consumer is not None and consumer not in self.by_path[known].consumers:
                    self.by_path[known].consumers.append(consumer)
                if consumer is not None and known not in self.by_path[consumer].inputs:
                    self.by_path[consumer].inputs.append(known)
                continue
            args, functions = _arguments(datapipe)
            node = Node(path, datapipe, type_name(datapipe), args, functions=functions)
            if consumer is not None:
                node.consumers.append(consumer)
                self.by_path[consumer].inputs.append(path)
            self.nodes.append(node)
            self.by_path[path] = node
            self._path_of[id(datapipe)] = path
            edges = _input_edges(datapipe)
            for segment, child in reversed(edges):
                stack.append((f"{path}/{segment}", child, path))

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes)

    def __len__(self) -> int:
        return len(self.nodes)

    def __getitem__(self, path: str) -> Node:
        return self.by_path[path]

    def path_of(self, datapipe: Any) -> str:
        """Path of a DataPipe of this graph (``KeyError`` if it is not part of it)."""
        return self._path_of[id(datapipe)]

    def contains(self, datapipe: Any) -> bool:
        return id(datapipe) in self._path_of

    def ancestors(self, path: str, *, include_self: bool = True,
                  stop: frozenset[str] | set[str] = frozenset()) -> list[str]:
        """Paths of ``path`` and everything it reads from, in graph order.

        Nodes in ``stop`` are included but not walked through (a logical shard's input).
        """
        seen: set[str] = set()
        stack = [path]
        while stack:
            current = stack.pop()
            if current in seen:
                continue
            seen.add(current)
            if current not in stop:
                stack.extend(self.by_path[current].inputs)
        if not include_self:
            seen.discard(path)
        return [n.path for n in self.nodes if n.path in seen]

    def bfs(self, start: str = ROOT, *, exclude: set[str] | None = None) -> list[str]:
        """Breadth-first order from ``start`` through inputs (torchdata's seeding order)."""
        exclude = exclude or set()
        order: list[str] = []
        seen = set(exclude)
        if start in seen:
            return order
        queue = [start]
        seen.add(start)
        while queue:
            current = queue.pop(0)
            order.append(current)
            for child in self.by_path[current].inputs:
                if child not in seen:
                    seen.add(child)
                    queue.append(child)
        return order

    @property
    def fingerprint(self) -> str:
        digest = hashlib.sha256()
        for node in self.nodes:
            digest.update(f"{node.path}={node.fingerprint}<{','.join(node.inputs)}\n".encode())
        return digest.hexdigest()[:32]

    def describe(self) -> list[dict[str, Any]]:
        return [node.describe() for node in self.nodes]


@dataclass(frozen=True)
class NodeDiff:
    """One difference between a saved graph description and a live graph (``code``: only a
    function's code differs; the structure is the same)."""

    path: str
    saved: str
    current: str
    code: bool = False

    def __str__(self) -> str:
        return f"  at {self.path}:\n    in snapshot: {self.saved}\n    in loader:   {self.current}"


def _saved_signature(desc: dict[str, Any]) -> str:
    short = str(desc["type"]).rsplit(".", 1)[-1]
    args = ", ".join(f"{k}={v}" for k, v in desc.get("args", {}).items())
    return f"{short}({args})"


def compare_nodes(saved: list[dict[str, Any]], graph: Graph) -> list[NodeDiff]:
    """Every node whose type, arguments, inputs or functions' code differ between ``saved`` and ``graph``."""
    diffs: list[NodeDiff] = []
    saved_by_path = {d["path"]: d for d in saved}
    for desc in saved:
        node = graph.by_path.get(desc["path"])
        if node is None:
            diffs.append(NodeDiff(desc["path"], _saved_signature(desc), "(no node at this path)"))
            continue
        if node.fingerprint != desc["fingerprint"]:
            saved_sig, current_sig = _saved_signature(desc), node.signature
            if saved_sig == current_sig and str(desc["type"]) != node.type:
                # same name, other class (`__main__.Plain` against `mymodule.Plain`): show the modules
                saved_sig = str(desc["type"]) + saved_sig[saved_sig.index("("):]
                current_sig = node.type + current_sig[current_sig.index("("):]
            diffs.append(NodeDiff(desc["path"], saved_sig, current_sig))
            continue
        if list(desc.get("inputs", [])) != node.inputs:
            diffs.append(NodeDiff(
                desc["path"],
                f"inputs {desc.get('inputs', [])}",
                f"inputs {node.inputs}",
            ))
        diffs.extend(_code_diffs(desc, node))
    for node in graph.nodes:
        if node.path not in saved_by_path:
            diffs.append(NodeDiff(node.path, "(no node at this path)", node.signature))
    return diffs


def another_pipeline(saved: list[dict[str, Any]], graph: Graph) -> str | None:
    """When ``graph`` looks like another pipeline than the saved one (fewer than half of the saved nodes
    have a node of their type at their path, and no more than half have their type and arguments
    anywhere in it: a batch added at the sink shifts every path, but keeps the nodes), the clause that
    says so, with both graphs' node types from the sink; else ``None``."""
    same = sum(1 for d in saved if d["path"] in graph.by_path and graph.by_path[d["path"]].type == str(d["type"]))
    here = Counter(node.signature for node in graph.nodes)
    kept = sum((Counter(_saved_signature(d) for d in saved) & here).values())
    if not saved or 2 * same >= len(saved) or 2 * kept > len(saved):
        return None
    return (f"the snapshot is of another pipeline (its graph: {_types(str(d['type']) for d in saved)}; this one: "
            f"{_types(node.type for node in graph.nodes)}): of its {len(saved)} nodes, {same} "
            f"{'is' if same == 1 else 'are'} of the same type at the same place here. Restore it with the pipeline "
            "that saved it (`snapshot inspect FILE` shows its graph)")


def _types(names: Any, limit: int = 12) -> str:
    """``Batcher ← Mapper ← ...``: short type names, from the sink, in the graph's order."""
    short = [name.rsplit(".", 1)[-1].removesuffix("IterDataPipe") or "IterDataPipe" for name in names]
    return " ← ".join(short[:limit]) + (f" ← ... ({len(short) - limit} more)" if len(short) > limit else "")


def _code_diffs(desc: dict[str, Any], node: Node) -> list[NodeDiff]:
    """The function arguments of ``node`` whose code differs from the saved fingerprints (those
    made by another Python version cannot be compared, and are skipped)."""
    diffs = []
    for name, saved in desc.get("code", {}).items():  # older snapshots have none: nothing to compare
        current = node.code.get(name)
        if current is None or python_of(saved) != python_of(current) or saved == current:
            continue
        function = node.args.get(name.split("[", 1)[0], "?")
        diffs.append(NodeDiff(node.path, f"{node.type.rsplit('.', 1)[-1]}: {name}={function} (code {saved})",
                              f"{node.type.rsplit('.', 1)[-1]}: {name}={function} (code {current}: changed)",
                              code=True))
    return diffs
