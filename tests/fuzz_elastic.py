"""The graph fuzz's elastic draw (issue 34): snapshots restored onto more workers than they have units.

Each case is a case of ``tests/fuzz_grammar.py`` (a graph, most with a sharding point; a third of them
pipes over streams that no opener made, ``["memory", [n]]``: ``readlines`` over ``io.StringIO``) saved on few
logical shards and restored onto 3 or 4 workers, so the restore splits the units into sub-shards. The
oracle (``tests/fuzz_oracle.py``) compares the restored stream with the same units run in one process,
and the run that saves with the one that never saves.

    python -m tests.fuzz_elastic --examples 50
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

from tests import fuzz_grammar

#: (saved on, restored onto): always onto more workers than the saved logical shards.
ELASTIC_PAIRS = (("mp2", "mp3"), ("inproc", "mp3"), ("mp1", "mp4"), ("inproc_L2", "mp4"), ("mp2_L3", "mp4"))


def cases() -> st.SearchStrategy[dict[str, Any]]:
    source = fuzz_grammar._node("memory", st.tuples(st.integers(1, 6)))
    memory = st.recursive(source, lambda c: fuzz_grammar._unary(c, tuple(fuzz_grammar.UNARY)), max_leaves=4)
    graph = st.tuples(fuzz_grammar.graphs(), st.integers(0, 4), st.integers(0, 2), memory).map(
        lambda t: fuzz_grammar.sharded_at(t[3] if t[2] == 0 else t[0], t[1]))
    fields = st.fixed_dictionaries({
        "graph": graph,
        "seed": st.integers(0, 2**31 - 1),
        "services": st.sampled_from(ELASTIC_PAIRS),
        "cuts": st.lists(fuzz_grammar.CUTS.map(list), min_size=1, max_size=2, unique_by=lambda c: (c[0], c[1], c[2])),
        "strategy": st.sampled_from(["auto", "fast_forward"]),
        "rebuild": st.sampled_from(["code", "pickle"]),
        "again": st.booleans(),
    })
    return fields.map(fuzz_grammar._case)


def draw_cases(examples: int, seed: int = 0) -> list[dict[str, Any]]:
    """``examples`` elastic cases, the same for the same ``seed`` (drawn in a fresh process, as
    :func:`tests.fuzz_grammar.draw_cases` explains)."""
    return fuzz_grammar.draw_cases(examples, seed, module="tests.fuzz_elastic")


def main(argv: list[str] | None = None) -> int:
    import sys

    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["--draw"]:
        print(json.dumps(fuzz_grammar._draw_here(int(args[1]), int(args[2]), strategy=cases())))
        return 0
    from tests import fuzz_oracle

    return fuzz_oracle.main(argv, draw=draw_cases)


if __name__ == "__main__":
    raise SystemExit(main())
