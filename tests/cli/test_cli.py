"""The ``snapshot`` console script, run for real in a subprocess: ``inspect`` and what all commands share.

The other commands have their own files (``test_diff.py``, ``test_verify.py``,
``test_graph.py`` in this folder); they use the helpers defined here.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Callable
from typing import Any

import pytest

import snapshot
from snapshot import format as fmt
from snapshot.storage import _sources
from tests import graphs, helpers


def _command_and_env(env: dict[str, str] | None) -> tuple[list[str], dict[str, str]]:
    exe = shutil.which("snapshot", path=os.path.dirname(sys.executable))
    command = [exe] if exe else [sys.executable, "-m", "snapshot"]
    # no $COLUMNS unless a test sets it: the output goes to a pipe, so lines are whole (pytest-xdist's
    # workers export COLUMNS=80, which would fold them)
    child_env = {k: v for k, v in os.environ.items() if k not in (fmt.KEY_ENV, "COLUMNS", "LINES")}
    child_env["PYTHONWARNINGS"] = "ignore"
    child_env.update(env or {})
    return command, child_env


def run_cli(*args: str, env: dict[str, str] | None = None, cwd: str | None = None,
            text: bool = True) -> subprocess.CompletedProcess[Any]:
    """Run the installed ``snapshot`` script (``python -m snapshot`` if it is not installed).

    ``$SNAPSHOT_KEY`` is removed from the child's environment unless ``env`` sets it.
    """
    command, child_env = _command_and_env(env)
    return subprocess.run([*command, *args], capture_output=True, text=text, timeout=120, env=child_env,
                          cwd=cwd)


def run_cli_batch(*calls: list[str], env: dict[str, str] | None = None,
                  cwd: str | None = None) -> list[subprocess.CompletedProcess[str]]:
    """Run several independent invocations at once (each one starts by importing torch)."""
    command, child_env = _command_and_env(env)
    procs = [subprocess.Popen([*command, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=child_env, cwd=cwd) for args in calls]
    results = []
    try:
        for args, proc in zip(calls, procs):
            out, err = proc.communicate(timeout=180)
            results.append(subprocess.CompletedProcess([*command, *args], proc.returncode, out, err))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return results


def save(path: str, factory: Callable[[], Any] = graphs.combining, samples: int = 5, *,
         key: str | None = None, seed: int = 1, reading_service: Any = None) -> str:
    """A snapshot of ``factory()`` after ``samples`` samples, written to ``path``."""
    with helpers.loader_at(factory(), samples, seed=seed, reading_service=reading_service) as (dl, _):
        dl.save_snapshot(path, key=key)
    return path


def rewrite(src: str, dest: str, edit: Callable[[dict[str, Any]], None]) -> str:
    """Copy a snapshot with its manifest changed by ``edit`` (checksums recomputed, payload kept)."""
    container = _sources.read_container(src)
    manifest = copy.deepcopy(container.manifest)
    edit(manifest)
    with open(dest, "wb") as f:
        f.write(fmt.pack(manifest, container.payload or b""))
    return dest


def three_shards(manifest: dict[str, Any]) -> None:
    """Turn a one-shard manifest into the layout of 3 workers, each with its own logical shard."""
    manifest["service"] = {"name": "MultiProcessingReadingService", "logical_shards": 3, "workers": 3,
                           "ranks": 1, "owners": {"0": 0, "1": 1, "2": 2}}
    first = manifest["shards"][0]
    second = copy.deepcopy(first)
    second.update(yielded=4, in_flight=2, worker=1)
    third = copy.deepcopy(first)
    third.update(yielded=0, exhausted=True, worker=2)
    first["worker"] = 0
    for shard in (second, third):
        for record in shard["nodes"].values():
            record["yielded"] = (record["yielded"] or 0) + 100
    manifest["shards"] = [first, second, third]


@pytest.fixture
def snap_file(tmp_path) -> str:
    return save(str(tmp_path / "c.snap"))


@pytest.fixture(scope="module")
def shared_file(tmp_path_factory: pytest.TempPathFactory) -> str:
    return save(str(tmp_path_factory.mktemp("cli") / "c.snap"))


@pytest.fixture(scope="module")
def inspected(shared_file: str) -> dict[str, subprocess.CompletedProcess[str]]:
    """The outputs of ``inspect``, ``inspect --full-paths``, ``inspect --json`` and ``--help``."""
    names = ["text", "full", "json", "help"]
    calls = [["inspect", shared_file], ["inspect", "--full-paths", shared_file], ["inspect", "--json", shared_file],
             ["--help"]]
    results = dict(zip(names, run_cli_batch(*calls)))
    for proc in results.values():
        assert proc.returncode == 0, proc.stderr
    return results


def test_inspect_prints_the_tree_and_position(inspected: dict[str, Any]) -> None:
    out = inspected["text"].stdout
    assert "position    epoch 0, 5 samples yielded" in out
    assert f"written by  snapshot {snapshot.__version__}, torch " in out and "python " in out
    assert "created 20" in out
    # the tree: the sink, an edge per input, shared inputs listed once
    assert "\n  0                             MultiplexerIterDataPipe()" in out
    assert "├─ datapipes/0                ZipperIterDataPipe()" in out
    assert "│  ├─ datapipes/0             ShufflerIterDataPipe(buffer_size=3)" in out
    assert out.count("= 0/datapipes/0/datapipes/0/datapipe/main_datapipe, listed above") == 2
    row = next(line for line in out.splitlines() if "ShufflerIterDataPipe(buffer_size=3)" in line)
    assert row.split()[-6:] == ["2", "3", "3.1", "KiB", "state", "-"]  # yielded, buffered, state, restore, replay


def test_inspect_shows_every_section(inspected: dict[str, Any], shared_file: str) -> None:
    out = inspected["text"].stdout
    manifest = snapshot.read_manifest(shared_file)
    assert "Restore plan (auto): every node from its state, nothing replayed" in out
    assert "seed  1 (given to seed())" in out
    for path, fingerprint in manifest["randomness"]["node_seeds"].items():
        assert f"{fingerprint[:12]}  {path}\n" in out
    assert "Reading service: InProcessReadingService" in out
    assert "logical shards: 1 (one stream on up to 1 worker per rank; more split them)" in out
    buffered = sum(r["buffered"] for r in manifest["shards"][0]["nodes"].values())
    assert f"Buffers: {buffered} samples held in the buffers of" in out
    assert f" KiB ({manifest['_file']['size']:,} bytes)" in out
    assert f"payload              {manifest['payload']['size']:,}" in out
    for part, size in manifest["payload"]["parts"].items():
        assert f"  {part}" in out and f"{size:,}" in out
    assert "Only the manifest was read." in out


def test_inspect_full_paths(inspected: dict[str, Any]) -> None:
    assert "│  ├─ 0/datapipes/0/datapipes/0  " in inspected["full"].stdout


def test_inspect_json_is_the_manifest(inspected: dict[str, Any], shared_file: str) -> None:
    assert json.loads(inspected["json"].stdout) == snapshot.read_manifest(shared_file)


def test_help_documents_the_exit_codes(inspected: dict[str, Any]) -> None:
    for line in ("0  success", "1  verify found a problem", "2  usage error", "3  a program the command needs"):
        assert line in inspected["help"].stdout


def test_inspect_shows_the_replay_plan(tmp_path) -> None:
    path = save(str(tmp_path / "g.snap"), graphs.with_generator_pipe, samples=3)
    out = run_cli("inspect", path).stdout
    assert "Restore plan (auto): replay 9 samples of 0/datapipe" in out
    assert "0/datapipe: no state hook (its position lives in its generator)" in out
    squares = next(line for line in out.splitlines() if "Squares()" in line)
    assert squares.split()[-3:] == ["-", "replay", "9"]
    assert "about 33 samples are recomputed in all" in out  # 9 + 9 + 15 for the replayed subgraph


def test_inspect_sums_any_number_of_logical_shards(snap_file: str, tmp_path) -> None:
    path = rewrite(snap_file, str(tmp_path / "mp.snap"), three_shards)
    out = run_cli("inspect", path).stdout
    assert "figures summed over 3 logical shards" in out
    assert "Reading service: MultiProcessingReadingService" in out
    assert "  logical shards: 3 (one stream on up to 3 workers per rank; more split them)" in out
    assert "workers  3" in out and 'owners   {"0":0,"1":1,"2":2}' in out
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("  shard  yielded"))
    assert lines[header].split()[-1] == "worker"
    shard_rows = [line.split() for line in lines[header + 1:header + 4]]
    assert [row[:4] + row[-1:] for row in shard_rows] == [
        ["0", "5", "0", "no", "0"], ["1", "4", "2", "no", "1"], ["2", "0", "0", "yes", "2"]]
    sink = next(line for line in out.splitlines() if "MultiplexerIterDataPipe()" in line)
    assert sink.split()[2] == "215"  # 5 + 105 + 105
    assert "2 in flight between workers and the loader" in out
    assert out.count("Restore plan (auto)") == 1  # the plan once, for every shard it applies to
    assert "Restore plan (auto), every logical shard: every node from its state" in out


def test_inspect_and_diff_a_two_worker_snapshot(tmp_path) -> None:
    """Per-shard positions and the copies above the sharding point, from a real multi-process run."""
    workers = save(str(tmp_path / "mp.snap"), graphs.sharded, samples=7,
                   reading_service=snapshot.MultiProcessingReadingService(num_workers=2))
    in_process = save(str(tmp_path / "ip.snap"), graphs.sharded, samples=7)
    manifest = snapshot.read_manifest(workers)
    inspect, diff = run_cli_batch(["inspect", workers], ["diff", in_process, workers])
    assert inspect.returncode == 0, inspect.stderr
    out = inspect.stdout
    assert "figures summed over 2 logical shards and 2 copies above the sharding point" in out
    lines = out.splitlines()
    # the graph yields batches: the loader's unit, then the samples its batcher took in that shard
    header = next(i for i, line in enumerate(lines) if line.startswith("  shard  batches  samples  in flight"))
    for shard, line in zip(manifest["shards"], lines[header + 1:header + 3]):
        samples = shard["nodes"]["0/datapipe"]["yielded"]
        assert line.split()[1:4] == [str(shard["yielded"]), str(samples), str(shard["in_flight"])]
    assert sum(s["yielded"] for s in manifest["shards"]) == 7  # what the loader took from each shard
    copies = lines.index("  above the sharding point (a copy of that part of the graph per process):")
    router = "0/datapipe/datapipe/datapipe"
    for index, (upstream, line) in enumerate(zip(manifest["upstream"], lines[copies + 2:copies + 4])):
        assert line.split()[:4] == [str(index), str(upstream["shards"][0]), router,
                                    str(upstream["routers"][router]["position"])]
    source = next(line for line in lines if "IterableWrapperIterDataPipe(iterable=range(0, 33)" in line)
    source_path = "0/datapipe/datapipe/datapipe/source_datapipe/datapipe"
    read = sum(upstream["nodes"][source_path]["yielded"] for upstream in manifest["upstream"])
    assert source.split()[-6] == str(read)  # summed over the copies, one per worker
    assert diff.returncode == 1
    assert "Reading service and layout:" in diff.stdout and "copies above the sharding point" in diff.stdout
    assert "Same: position, graph, plan, versions" in diff.stdout


def test_python_dash_m_works(shared_file: str) -> None:
    # wide enough that the tree keeps torch's full class names (a narrow terminal shortens them)
    proc = subprocess.run([sys.executable, "-W", "ignore", "-m", "snapshot", "inspect", shared_file],
                          capture_output=True, text=True, timeout=120, env=dict(os.environ, COLUMNS="200"))
    assert proc.returncode == 0 and "MultiplexerIterDataPipe()" in proc.stdout
    proc = subprocess.run([sys.executable, "-m", "snapshot", "--version"], capture_output=True, text=True,
                          timeout=120)
    assert proc.stdout.strip() == f"snapshot {snapshot.__version__}"


def test_bad_input_exits_2_with_a_message(tmp_path) -> None:
    cases = {
        "foreign": (b"not a snapshot", "not a snapshot file"),
        "empty": (b"", "the file is empty"),
        "cut": (b"\x89snapshot\r\n\x1a\n\x01\x00", "inside the 93-byte header"),
    }
    for name, (content, _) in cases.items():
        (tmp_path / f"{name}.snap").write_bytes(content)
    calls = [["inspect", str(tmp_path / "foreign.snap")], ["graph", str(tmp_path / "empty.snap")],
             ["diff", str(tmp_path / "cut.snap"), str(tmp_path / "cut.snap")],
             ["inspect", str(tmp_path / "nope.snap")], ["inspect", str(tmp_path)],
             ["inspect"], ["frobnicate"]]
    results = run_cli_batch(*calls)
    messages = [message for _, message in cases.values()] + [
        "no such file", "is a directory without manifest.snap", "usage: snapshot inspect", "invalid choice"]
    for call, proc, message in zip(calls, results, messages):
        assert proc.returncode == 2, call
        assert proc.stderr.startswith(("snapshot: ", "usage: ")) and message in proc.stderr, (call, proc.stderr)
        assert "Traceback" not in proc.stderr and proc.stdout == ""


def test_a_manifest_of_the_wrong_shape_is_refused_cleanly(snap_file: str, tmp_path) -> None:
    """Valid JSON with intact checksums, but not what snapshot writes: a message, never a traceback."""
    def damage(manifest: dict[str, Any]) -> None:
        manifest["graph"]["nodes"][1]["inputs"] = ["0/nowhere"]
        manifest["shards"][0]["nodes"]["0"]["yielded"] = "five"

    path = rewrite(snap_file, str(tmp_path / "odd.snap"), damage)
    proc = run_cli("inspect", path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "graph.nodes[1].inputs[0]: expected the path of a node of the graph, got '0/nowhere'" in proc.stderr
    assert len(proc.stderr.splitlines()) == 1
    for command in (["inspect", "--json"], ["graph"], ["diff", snap_file]):
        other = run_cli(*command, path)
        assert other.returncode == 2 and "graph.nodes[1].inputs[0]" in other.stderr, command
        assert "Traceback" not in other.stderr and len(other.stderr.splitlines()) == 1


def test_every_command_works_where_the_graphs_modules_are_not_importable(tmp_path) -> None:
    """Inspection never unpickles: a graph made of a module that is gone still inspects."""
    module = tmp_path / "vanished_module.py"
    module.write_text("def f(x):\n    return x + 1\n")
    snap_path = tmp_path / "a.snap"
    script = textwrap.dedent(f"""
        import sys; sys.path.insert(0, {str(tmp_path)!r})
        import vanished_module, snapshot
        from torch.utils.data.datapipes.iter import IterableWrapper
        dl = snapshot.DataLoader2(IterableWrapper(range(5)).map(vanished_module.f))
        it = iter(dl); next(it); next(it)
        dl.save_snapshot({str(snap_path)!r})
    """)
    subprocess.run([sys.executable, "-W", "ignore", "-c", script], check=True, timeout=120)
    module.unlink()
    workdir = tmp_path / "elsewhere"
    workdir.mkdir()
    inspect, verify, diff, dot = run_cli_batch(
        ["inspect", str(snap_path)], ["verify", str(snap_path)], ["diff", str(snap_path), str(snap_path)],
        ["graph", str(snap_path)], cwd=str(workdir))
    assert inspect.returncode == 0, inspect.stderr
    assert "MapperIterDataPipe(fn=vanished_module.f)" in inspect.stdout
    assert verify.returncode == 0 and "OK: no problem found" in verify.stdout
    assert diff.returncode == 0
    assert dot.returncode == 0 and "vanished_module.f" in dot.stdout


def long_chain(manifest: dict[str, Any], length: int = 1500) -> None:
    """A synthetic graph deeper than Python's recursion limit."""
    manifest["graph"]["nodes"] = [
        {"path": f"n{i}", "type": "x.Step", "args": {"i": str(i)}, "fingerprint": "f",
         "inputs": [f"n{i + 1}"] if i + 1 < length else []} for i in range(length)]
    manifest["shards"][0]["nodes"] = {f"n{i}": {"yielded": i, "state_bytes": 1, "buffered": 0, "restore": "state"}
                                      for i in range(length)}
    manifest["randomness"]["node_seeds"] = {}


def test_a_graph_deeper_than_the_recursion_limit(snap_file: str, tmp_path) -> None:
    path = rewrite(snap_file, str(tmp_path / "deep.snap"), long_chain)
    proc = run_cli("inspect", path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.count("Step(i=") == 1500
    proc = run_cli("graph", path)
    assert proc.returncode == 0 and proc.stdout.count(" -> ") == 1499


def test_output_into_a_closed_pipe_is_not_an_error(snap_file: str, tmp_path) -> None:
    path = rewrite(snap_file, str(tmp_path / "deep.snap"), long_chain)  # megabytes of output
    exe = shutil.which("snapshot", path=os.path.dirname(sys.executable)) or "snapshot"
    proc = subprocess.run(f"{exe} inspect {path} | head -c 10", shell=True, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert proc.stdout == path[:10]
    assert proc.stderr == ""
