"""The graph check compares each function's code, not only its name.

A module of map functions is edited between the process that saves and the process that
restores: an edited body is a ``GraphMismatchError`` naming the node path and the function,
unless the ``code_changes`` policy allows it; an unchanged module restores exactly; snapshots
without code fingerprints (older ones, another Python) restore as before.
"""

from __future__ import annotations

import functools
import json
import sys
import textwrap
from pathlib import Path

import pytest
from torch.utils.data import IterDataPipe
from torch.utils.data.datapipes.iter import IterableWrapper

import snapshot
from snapshot import format as fmt
from snapshot.engine._code import code_fingerprint
from snapshot.engine.graph import Graph
from tests.zygote import Zygote, run_script

ROOT = Path(__file__).resolve().parents[2]

# -- the fingerprint itself -------------------------------------------------------------------


def _define(source: str, name: str = "f") -> object:
    """A function ``name`` defined by ``source`` in a fresh namespace (the same qualified name each time)."""
    namespace: dict[str, object] = {"__name__": "userfns"}
    exec(textwrap.dedent(source), namespace)  # functions with the same qualified name and other code
    return namespace[name]


@pytest.mark.parametrize(("before", "after"), [
    ("def f(x):\n    return x * 10", "def f(x):\n    return x * 11"),                          # a constant
    ("def f(x):\n    return x * 10", "def f(x):\n    return x + 10"),                          # bytecode
    ("def f(x):\n    return x.upper()", "def f(x):\n    return x.lower()"),                    # a name
    ("def f(x):\n    return [i * 2 for i in x]", "def f(x):\n    return [i * 3 for i in x]"),  # nested code
    ("def f(x):\n    g = lambda y: y + 1\n    return g(x)",
     "def f(x):\n    g = lambda y: y + 2\n    return g(x)"),                                     # a nested lambda
    ("def f(x, k=2):\n    return x * k", "def f(x, k=3):\n    return x * k"),                    # a default
    ("def h(x):\n    return x + 1\ndef f(x):\n    return h(x)",
     "def h(x):\n    return x + 2\ndef f(x):\n    return h(x)"),                                 # a helper it calls
    ("def make(k):\n    def f(x):\n        return x * k\n    return f\nf = make(2)",
     "def make(k):\n    def f(x):\n        return x * k\n    return f\nf = make(3)"),            # a closure
])
def test_an_edited_body_changes_the_fingerprint(before: str, after: str) -> None:
    old, new = _define(before), _define(after)
    assert old.__qualname__ == new.__qualname__  # type: ignore[attr-defined]
    assert code_fingerprint(old) != code_fingerprint(new)
    assert code_fingerprint(old) == code_fingerprint(_define(before))  # the same code: the same fingerprint


def test_callables_are_fingerprinted_by_the_function_they_run() -> None:
    f = _define("def f(x, y=0):\n    return x * 10 + y")

    class Scale:
        def __call__(self, x: int) -> int:
            return x * 2

    assert code_fingerprint(functools.partial(f, y=1)) == code_fingerprint(f)
    assert code_fingerprint(Scale()) == code_fingerprint(Scale.__call__)
    assert code_fingerprint(Scale().__call__) == code_fingerprint(Scale.__call__)
    assert code_fingerprint(len) is None and code_fingerprint(str.upper) is None and code_fingerprint(3) is None
    assert str(code_fingerprint(f)).startswith(f"{sys.version_info[0]}.{sys.version_info[1]}:")


def test_the_manifest_records_code_per_function_argument() -> None:
    f = _define("def f(x):\n    return x * 10")
    with snapshot.DataLoader2(IterableWrapper(range(10)).map(f).filter(bool).batch(2)) as loader:
        nodes = {n["path"]: n for n in loader.save_snapshot().manifest["graph"]["nodes"]}
    assert nodes["0/datapipe/datapipe"]["code"] == {"fn": code_fingerprint(f)}
    assert "code" not in nodes["0/datapipe"]  # bool is a builtin: no code to compare
    assert "code" not in nodes["0"] and "code" not in nodes["0/datapipe/datapipe/datapipe"]


class _Several(IterDataPipe):
    """A pipe with functions in a list, a dict and a plain argument, beside inputs and other values."""

    def __init__(self, datapipe: IterDataPipe, fns: list, table: dict, fn: object = None, n: int = 3) -> None:
        self.datapipe, self.fns, self.table, self.fn, self.n = datapipe, fns, table, fn, n

    def __iter__(self):
        yield from self.datapipe


def test_every_function_argument_has_its_code_and_the_structure_keeps_the_rest() -> None:
    f, g = _define("def f(x):\n    return x * 10"), _define("def g(x):\n    return x + 1", "g")
    sources = [IterableWrapper(range(3)), IterableWrapper(range(4))]
    node = Graph(_Several(IterableWrapper(range(5)).zip(*sources), [f, len, g], {"a": g, "b": 2}, fn=f))["0"]
    assert node.code == {"fns[0]": code_fingerprint(f), "fns[2]": code_fingerprint(g),
                         "table[a]": code_fingerprint(g), "fn": code_fingerprint(f)}
    assert list(node.args) == ["fns", "table", "fn", "n"] and node.args["n"] == "3"
    assert Graph(IterableWrapper(range(5)).zip(*sources))["0"].code == {}  # its inputs run no code of it


# -- restoring in a fresh process after the module was edited ----------------------------------

SCRIPT = """
import json, sys
from torch.utils.data import IterDataPipe
from torch.utils.data.datapipes.iter import IterableWrapper
import snapshot
import userfns

def build():
    return IterableWrapper(range(80)).shuffle().map(userfns.f).batch(4)

if __name__ == "__main__":
    command, path = sys.argv[1], sys.argv[2]
    if command == "save":
        loader = snapshot.DataLoader2(build())
        loader.seed(4)
        it = iter(loader)
        first = [next(it) for _ in range(5)]
        loader.save_snapshot(path)
        print(json.dumps({"first": first, "rest": list(it)}))
    elif command == "full":
        loader = snapshot.DataLoader2(build())
        loader.seed(4)
        print(json.dumps(list(loader)))
    else:
        policy = sys.argv[3]
        try:
            if command == "restore":
                loader = snapshot.DataLoader2(build(), code_changes=policy)
                loader.restore_snapshot(path)
            else:
                loader = snapshot.DataLoader2.from_snapshot(path, code_changes=policy)
        except snapshot.GraphMismatchError as exc:
            print(json.dumps({"refused": str(exc), "differences": exc.differences}))
        else:
            print(json.dumps({"rest": list(loader)}))
"""

TIMES_10 = "def f(x):\n    return x * 10\n"
TIMES_11 = "def f(x):\n    return x * 11\n"


class Job:
    """A module of map functions and a script that imports it, run in fresh processes (forked from a zygote
    that has imported torch and snapshot, never the module: each run imports it as the file is then)."""

    def __init__(self, root: Path, zygote: Zygote):
        self.root, self.zygote = root, zygote
        (root / "job.py").write_text(SCRIPT)

    def module(self, source: str) -> None:
        (self.root / "userfns.py").write_text(source)
        for cached in (self.root / "__pycache__").glob("userfns*"):
            cached.unlink()  # the same size and mtime second must not reuse the old bytecode

    def run(self, *args: str) -> object:
        return json.loads(self.zygote.call(run_script, "job.py", list(args), str(self.root)))


@pytest.fixture
def job(tmp_path: Path, zygote: Zygote) -> Job:
    return Job(tmp_path, zygote)


def test_an_unchanged_function_restores_exactly_in_a_fresh_process(job: Job) -> None:
    job.module(TIMES_10)
    saved = job.run("save", "data.snap")
    for command in ("restore", "from_snapshot"):
        assert job.run(command, "data.snap", "refuse") == {"rest": saved["rest"]}


def test_an_edited_function_is_refused_by_default_naming_it(job: Job) -> None:
    job.module(TIMES_10)
    job.run("save", "data.snap")
    job.module(TIMES_11)
    for command in ("restore", "from_snapshot"):  # one save for both
        refused = job.run(command, "data.snap", "refuse")
        message = refused["refused"]
        assert message.startswith("1 function(s) of the graph changed since the snapshot was saved:"), command
        assert "at 0/datapipe:" in message and "MapperIterDataPipe: fn=userfns.f (code " in message
        assert ": changed)" in message and 'code_changes="allow"' in message
        assert [d[0] for d in refused["differences"]] == ["0/datapipe"]


def test_the_policy_allows_an_edited_function_and_the_rest_comes_from_the_new_code(job: Job) -> None:
    job.module(TIMES_10)
    saved = job.run("save", "data.snap")
    job.module(TIMES_11)
    allowed = job.run("restore", "data.snap", "allow")
    new_stream = job.run("full", "-")
    # the shuffle sits before the map, and a batch is cut at a boundary: nothing old is buffered
    assert allowed == {"rest": new_stream[len(saved["first"]):]}
    assert allowed["rest"] != saved["rest"]


def test_warn_restores_with_a_warning_naming_the_function() -> None:
    old = _define(TIMES_10)
    new = _define(TIMES_11)
    loader = snapshot.DataLoader2(IterableWrapper(range(20)).map(old), code_changes="allow")
    loader.seed(1)
    it = iter(loader)
    next(it)
    snap = loader.save_snapshot()
    assert snap.manifest["graph"]["code_changes"] == "allow"
    with pytest.warns(UserWarning, match=r"(?s)1 function\(s\) whose code changed.*at 0:.*fn=userfns.f"):
        restored = snapshot.DataLoader2(IterableWrapper(range(20)).map(new), code_changes="warn")
        restored.restore_snapshot(snap)
    assert list(restored) == [x * 11 for x in range(1, 20)]


def test_the_policy_is_parsed_by_name() -> None:
    assert snapshot.DataLoader2(IterableWrapper(range(3))).code_changes is snapshot.CodeChanges.REFUSE
    with pytest.raises(ValueError, match="unknown code_changes 'sometimes'; choose one of 'refuse', 'warn', 'allow'"):
        snapshot.DataLoader2(IterableWrapper(range(3)), code_changes="sometimes")
    default = snapshot.DataLoader2(IterableWrapper(range(3)).map(_define(TIMES_10))).save_snapshot()
    assert "code_changes" not in default.manifest["graph"]  # absent means "refuse"


# -- snapshots without comparable code fingerprints --------------------------------------------


def _rewritten(snap: snapshot.Snapshot, change) -> bytes:
    """The snapshot's file with its manifest changed by ``change`` (checksums made again)."""
    manifest = json.loads(json.dumps(snap.manifest))
    change(manifest)
    return fmt.pack(manifest, snap._payload)


def _saved_with(fn) -> snapshot.Snapshot:
    loader = snapshot.DataLoader2(IterableWrapper(range(20)).map(fn))
    loader.seed(2)
    it = iter(loader)
    next(it), next(it)
    return loader.save_snapshot()


def _drop_code(manifest: dict) -> None:
    for node in manifest["graph"]["nodes"]:
        node.pop("code", None)


def _other_python(manifest: dict) -> None:
    for node in manifest["graph"]["nodes"]:
        node["code"] = {name: "3.0:" + value.split(":", 1)[1] for name, value in node.get("code", {}).items()}


@pytest.mark.parametrize(("change", "saved_code"), [(_drop_code, None), (_other_python, "3.0:")],
                         ids=["older_snapshot", "other_python"])
def test_a_snapshot_without_comparable_code_restores_as_before(tmp_path, change, saved_code) -> None:
    path = tmp_path / "old.snap"
    path.write_bytes(_rewritten(_saved_with(_define(TIMES_10)), change))
    code = snapshot.load(path).manifest["graph"]["nodes"][0].get("code")
    assert code is None if saved_code is None else code["fn"].startswith(saved_code)
    restored = snapshot.DataLoader2(IterableWrapper(range(20)).map(_define(TIMES_11)))
    restored.restore_snapshot(path)  # nothing to compare: as before code fingerprints existed
    assert list(restored) == [x * 11 for x in range(2, 20)]


def test_an_older_snapshot_still_refuses_a_structural_change(tmp_path) -> None:
    path = tmp_path / "old.snap"
    path.write_bytes(_rewritten(_saved_with(_define(TIMES_10)), _drop_code))
    with pytest.raises(snapshot.GraphMismatchError, match="does not match the graph in the snapshot"):
        snapshot.DataLoader2(IterableWrapper(range(20)).map(_define(TIMES_10)).batch(2)).restore_snapshot(path)
