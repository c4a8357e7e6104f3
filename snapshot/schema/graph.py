"""The saved graph's description: each node's path from the sink, its type, its arguments' reprs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from snapshot.errors import ManifestError
from snapshot.schema import _native
from snapshot.schema._fields import (
    _bool,
    _fail,
    _Fields,
    _records,
    _str,
    _texts,
)
from snapshot.schema._quick import (
    BOOL,
    REQUIRED,
    STR,
    Doubt,
    Quick,
    quick_records,
    quick_strs,
    quick_texts,
)


@dataclass(frozen=True)
class NodeDesc:
    """One node of the saved graph: its path from the sink, its type, its arguments' reprs."""

    path: str
    type: str
    args: dict[str, str]
    fingerprint: str
    inputs: tuple[str, ...]
    #: Code fingerprint per function argument (``"3.11:<digest>"``); absent in older snapshots.
    code: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, value: Any, where: str = "node") -> NodeDesc:
        try:
            return _NODE(value)
        except Doubt:
            pass
        f = _Fields(value, where)
        return cls(path=f.required("path", _str), type=f.required("type", _str),
                   args=f.get("args", _texts, {}), fingerprint=f.get("fingerprint", _str, ""),
                   inputs=f.get("inputs", lambda v, w: _records(v, w, _str), ()), code=f.get("code", _texts, {}))

    def to_dict(self) -> dict[str, Any]:
        described = {"path": self.path, "type": self.type, "args": dict(self.args),
                     "fingerprint": self.fingerprint, "inputs": list(self.inputs)}
        return {**described, "code": dict(self.code)} if self.code else described

    @property
    def short_type(self) -> str:
        return self.type.rsplit(".", 1)[-1]

    def signature(self, *, skip_none: bool = False, width: int = 0, limit: int = 0) -> str:
        """``Type(arg=value, ...)``; ``skip_none`` drops ``None`` arguments, ``width`` shortens
        each value and ``limit`` the whole text (``…`` marks a cut)."""
        parts = []
        for key, value in self.args.items():
            if skip_none and value == "None":
                continue
            if width and len(value) > width:
                value = value[: width - 1] + "…"
            parts.append(f"{key}={value}")
        text = f"{self.short_type}({', '.join(parts)})"
        if limit and len(text) > limit:
            text = text[: limit - 2] + "…)"
        return text


_NODE = Quick(NodeDesc, (("path", STR, REQUIRED), ("type", STR, REQUIRED), ("args", quick_texts, dict),
                         ("fingerprint", STR, ""), ("inputs", quick_strs, ()), ("code", quick_texts, dict)))


@dataclass(frozen=True)
class GraphDesc:
    """The saved graph as a tree of node paths (nothing unpickled)."""

    fingerprint: str
    included: bool
    nodes: tuple[NodeDesc, ...]
    #: The saving loader's policy for changed functions (``plan.CodeChanges``); absent when "refuse".
    code_changes: str = "refuse"

    @classmethod
    def from_dict(cls, value: Any, where: str = "graph") -> GraphDesc:
        try:
            return quick_graph(value)
        except Doubt:
            pass
        f = _Fields(value, where)
        nodes = f.required("nodes", lambda v, w: _records(v, w, NodeDesc.from_dict))
        _check_nodes(nodes, where)
        return cls(fingerprint=f.get("fingerprint", _str, ""), included=f.get("included", _bool, False),
                   nodes=nodes, code_changes=f.get("code_changes", _str, "refuse"))

    def to_dict(self) -> dict[str, Any]:
        described = {"fingerprint": self.fingerprint, "included": self.included,
                     "nodes": [node.to_dict() for node in self.nodes]}
        return described if self.code_changes == "refuse" else {**described, "code_changes": self.code_changes}

    def paths(self) -> set[str]:
        return {node.path for node in self.nodes}


def _check_nodes(nodes: tuple[NodeDesc, ...], where: str) -> None:
    """Each node's path is its own, and its inputs are nodes of the graph."""
    seen: set[str] = set()
    for i, node in enumerate(nodes):
        if node.path in seen:
            raise _fail(f"{where}.nodes[{i}].path", "a path no other node has", node.path)
        seen.add(node.path)
    for i, node in enumerate(nodes):
        for j, path in enumerate(node.inputs):
            if path not in seen:
                raise _fail(f"{where}.nodes[{i}].inputs[{j}]", "the path of a node of the graph", path)


_GRAPH = Quick(GraphDesc, (("fingerprint", STR, ""), ("included", BOOL, False),
                           ("nodes", quick_records(_NODE), REQUIRED), ("code_changes", STR, "refuse")))


def _checked_graph(graph: GraphDesc) -> GraphDesc:
    try:
        _check_nodes(graph.nodes, "")
    except ManifestError:
        raise Doubt from None
    return graph


def quick_graph(value: Any) -> GraphDesc:
    return _checked_graph(_GRAPH(value))


_native.register(quick_graph, _GRAPH, _checked_graph)
