"""The restore's graph check on the manifest's node records: it says what the check on their dicts says.

A restore compares the saved graph with the loader's on the records the manifest was read into; only
where they differ are they described (as dicts) to say how. Each difference below must be found on the
records exactly as on the dicts.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from typing import Any

import pytest
from torch.utils.data.datapipes.iter import IterableWrapper, Mapper, Shuffler, Zipper

from snapshot.engine.graph import ROOT, Graph, compare_nodes
from snapshot.engine.plan import CodeChanges, _Part, _unchanged, check_graph
from snapshot.errors import GraphMismatchError
from snapshot.schema.graph import NodeDesc
from tests import graphs


def double(x: int) -> int:
    return 2 * x


def triple(x: int) -> int:
    return 3 * x


def pipeline(fn: Any = double, size: int = 10) -> Any:
    return Mapper(Shuffler(IterableWrapper(range(size)), buffer_size=4), fn)


def records(datapipe: Any) -> tuple[NodeDesc, ...]:
    """The saved graph's nodes as a manifest reads them."""
    return tuple(NodeDesc.from_dict(node) for node in Graph(datapipe).describe())


def refusal(saved: Any, graph: Graph, code_changes: CodeChanges = CodeChanges.REFUSE) -> str | None:
    try:
        check_graph(saved, graph, code_changes)
    except GraphMismatchError as exc:
        return str(exc)
    return None


def edited(node: NodeDesc) -> NodeDesc:
    """The node as saved with other code in its function (made by this Python)."""
    return replace(node, code={name: f"{sys.version_info[0]}.{sys.version_info[1]}:0123456789abcdef"
                               for name in node.code})


def other_python(node: NodeDesc) -> NodeDesc:
    return replace(node, code={name: "2.7:0123456789abcdef" for name in node.code})


CHANGES = {
    "the same graph": (pipeline, lambda saved: saved),
    "an argument": (lambda: pipeline(size=11), lambda saved: saved),
    "a function's code": (lambda: pipeline(triple), lambda saved: saved),
    "a node more": (lambda: Mapper(pipeline(), double), lambda saved: saved),
    "a node less": (lambda: Shuffler(IterableWrapper(range(10)), buffer_size=4), lambda saved: saved),
    "another input": (pipeline, lambda saved: (replace(saved[0], inputs=("0/other",)), *saved[1:])),
    "a path": (pipeline, lambda saved: (saved[0], replace(saved[1], path="0/elsewhere"), saved[2])),
    "a path twice": (pipeline, lambda saved: (saved[0], saved[1], replace(saved[2], path=saved[1].path))),
    "a function's code only": (pipeline, lambda saved: (edited(saved[0]), *saved[1:])),
    "code of another Python": (pipeline, lambda saved: (other_python(saved[0]), *saved[1:])),
}


@pytest.mark.parametrize("change", list(CHANGES))
def test_the_records_are_checked_as_their_dicts_are(change: str) -> None:
    build, edit = CHANGES[change]
    saved = edit(records(pipeline()))
    graph = Graph(build())
    as_dicts = [node.to_dict() for node in saved]
    assert _unchanged(saved, graph) == (compare_nodes(as_dicts, graph) == [])
    assert refusal(saved, graph) == refusal(as_dicts, Graph(build()))
    expect_refused = change not in ("the same graph", "code of another Python")
    assert (refusal(saved, graph) is not None) == expect_refused


def test_a_changed_function_is_let_through_by_the_policy_from_the_records() -> None:
    saved = (edited(records(pipeline())[0]), *records(pipeline())[1:])
    with pytest.warns(UserWarning, match="whose code changed"):
        check_graph(saved, Graph(pipeline()), CodeChanges.WARN)
    assert "1 function(s) of the graph changed" in (refusal(saved, Graph(pipeline())) or "")


@pytest.mark.parametrize("factory", [graphs.combining, graphs.with_generator_pipe, graphs.replicated_source,
                                     lambda: Zipper(pipeline(), pipeline(triple))])
def test_the_whole_graph_is_every_node_its_sink_reads(factory: Any) -> None:
    graph = Graph(factory())
    assert _Part(graph, [ROOT], frozenset()).nodes == set(graph.ancestors(ROOT)) == set(graph.by_path)
