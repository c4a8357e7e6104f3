"""``snapshot verify``, run for real: checksums, signature, versions, graph; exit 0 ok, 1 problem, 2 unusable."""

from __future__ import annotations

import json
import struct
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest

from snapshot import format as fmt
from snapshot.storage import _sources
from tests.cli.test_cli import rewrite, run_cli, run_cli_batch, save

Results = dict[str, subprocess.CompletedProcess[str]]
KEY = "team-secret"
PLEN_AT = len(fmt.MAGIC) + 8  # the payload length in the header (docs/format.md)


def repack(data: bytes, payload: bytes, *, record: bool) -> bytes:
    """A forger's file: another payload with the header's digests recomputed (unsigned).

    With ``record`` the manifest's own record of the payload is updated too.
    """
    container = fmt.unpack(data)
    manifest = dict(container.manifest)
    if record:
        manifest["payload"] = {**manifest["payload"], **fmt.payload_record(payload), "data": len(payload)}
    return fmt.pack(manifest, payload)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("verify")
    paths = {"plain": save(str(root / "plain.snap")), "signed": save(str(root / "signed.snap"), key=KEY)}
    data = Path(paths["plain"]).read_bytes()
    payload_at = len(data) - struct.unpack_from("<Q", data, PLEN_AT)[0]
    variants = {
        "cut": data[:-10],
        "flipped": data[:payload_at + 3] + bytes([data[payload_at + 3] ^ 1]) + data[payload_at + 4:],
        "forged": repack(data, b"P" + b"\x80\x04N.", record=False),
        "forged_fully": repack(data, b"P" + b"\x80\x04N.", record=True),
        "newer": data[:len(fmt.MAGIC)] + struct.pack("<H", 4) + data[len(fmt.MAGIC) + 2:],
        "foreign": b"PK\x03\x04 a torch checkpoint",
    }
    for name, content in variants.items():
        paths[name] = str(root / f"{name}.snap")
        Path(paths[name]).write_bytes(content)
    (root / "key.txt").write_text(KEY + "\n")
    paths["key_file"] = str(root / "key.txt")

    def old_versions(manifest: dict[str, Any]) -> None:
        manifest["versions"].update(torch="2.4.0", python="3.9.18")

    def odd_shape(manifest: dict[str, Any]) -> None:
        manifest["loader"]["yielded"] = "five"

    paths["old"] = rewrite(paths["plain"], str(root / "old.snap"), old_versions)
    paths["odd"] = rewrite(paths["plain"], str(root / "odd.snap"), odd_shape)
    return paths


@pytest.fixture(scope="module")
def results(files: dict[str, str]) -> Results:
    calls = {
        "plain": ["verify", files["plain"]],
        "signed_no_key": ["verify", files["signed"]],
        "signed_key": ["verify", files["signed"], "--key", KEY],
        "signed_key_file": ["verify", files["signed"], "--key-file", files["key_file"]],
        "wrong_key": ["verify", files["signed"], "--key", "guess"],
        "plain_with_key": ["verify", files["plain"], "--key", KEY],
        "cut": ["verify", files["cut"]],
        "flipped": ["verify", files["flipped"]],
        "forged": ["verify", files["forged"]],
        "forged_fully": ["verify", files["forged_fully"]],
        "forged_fully_key": ["verify", files["forged_fully"], "--key", KEY],
        "newer": ["verify", files["newer"]],
        "foreign": ["verify", files["foreign"]],
        "old": ["verify", files["old"]],
        "odd": ["verify", files["odd"]],
        "json": ["verify", "--json", files["signed"], "--key", KEY],
        "missing": ["verify", files["plain"] + ".nope"],
        "both_keys": ["verify", files["plain"], "--key", KEY, "--key-file", files["key_file"]],
    }
    return dict(zip(calls, run_cli_batch(*calls.values())))


def status(proc: subprocess.CompletedProcess[str], check: str) -> tuple[str, str]:
    """``(status, detail)`` of one check in the report."""
    for line in proc.stdout.splitlines():
        parts = line.split(maxsplit=2)
        if len(parts) == 3 and parts[1] == check:
            return parts[0], parts[2]
    raise AssertionError(f"no {check!r} line in:\n{proc.stdout}")


def test_a_good_unsigned_file(results: Results) -> None:
    proc = results["plain"]
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [status(proc, c)[0] for c in ("container", "manifest", "payload", "versions")] == ["ok"] * 4
    assert status(proc, "signature") == ("note", "not signed: anyone could have written it; restore it only if "
                                                 "you trust where it came from (sign with save_snapshot(..., key=...))")
    assert "not unpickled" in status(proc, "payload")[1]
    assert proc.stdout.rstrip().endswith("OK: no problem found") and proc.stderr == ""


def test_signatures(results: Results) -> None:
    assert results["signed_no_key"].returncode == 0
    assert status(results["signed_no_key"], "signature")[0] == "skip"
    assert "not checked: no key" in status(results["signed_no_key"], "signature")[1]
    for name, source in (("signed_key", "--key"), ("signed_key_file", "--key-file")):
        assert results[name].returncode == 0, results[name].stdout
        assert status(results[name], "signature") == ("ok", f"signed, and the signature matches the key from {source}")
    wrong = results["wrong_key"]
    assert wrong.returncode == 1
    assert status(wrong, "signature")[0] == "FAIL" and "does not match this key" in wrong.stdout
    assert status(wrong, "payload") == ("skip", "not checked after the signature failed")
    assert wrong.stderr.strip().endswith("failed verification: signature")
    unsigned = results["plain_with_key"]
    assert unsigned.returncode == 1 and "the file is not signed" in status(unsigned, "signature")[1]


def test_the_key_from_the_environment(files: dict[str, str]) -> None:
    signed, plain = run_cli_batch(["verify", files["signed"]], ["verify", files["plain"]], env={fmt.KEY_ENV: KEY})
    assert signed.returncode == 0
    assert status(signed, "signature") == ("ok", f"signed, and the signature matches the key from ${fmt.KEY_ENV}")
    assert plain.returncode == 1
    assert status(plain, "signature")[1].startswith(f"with the key from ${fmt.KEY_ENV}: a signing key was given")


def test_damaged_files(results: Results) -> None:
    cut = results["cut"]
    assert cut.returncode == 1 and status(cut, "file")[0] == "FAIL" and "it was cut short" in cut.stdout
    flipped = results["flipped"]
    assert flipped.returncode == 1 and status(flipped, "payload")[0] == "FAIL"
    assert "the payload checksum does not match" in flipped.stdout
    newer = results["newer"]
    assert newer.returncode == 1 and "written in snapshot format 4" in status(newer, "file")[1]
    foreign = results["foreign"]
    assert foreign.returncode == 1 and "a zip archive (a torch.save checkpoint?)" in foreign.stdout
    odd = results["odd"]
    assert odd.returncode == 1 and status(odd, "container")[0] == "ok" and status(odd, "manifest")[0] == "FAIL"
    assert "loader.yielded: expected a non-negative int, got 'five'" in status(odd, "manifest")[1]


def test_forged_payloads(results: Results) -> None:
    """Recomputed header digests defeat the checksums; the manifest record, then only a key, catch the rest."""
    forged = results["forged"]
    assert forged.returncode == 1
    assert "the manifest records another payload" in status(forged, "payload")[1]
    # A forger who also rewrites the manifest passes every checksum: only a signature tells.
    assert results["forged_fully"].returncode == 0
    assert status(results["forged_fully"], "signature")[0] == "note"
    assert results["forged_fully_key"].returncode == 1
    assert "not signed" in status(results["forged_fully_key"], "signature")[1]


def test_versions_that_differ_are_a_note(results: Results) -> None:
    proc = results["old"]
    assert proc.returncode == 0
    state, detail = status(proc, "versions")
    assert state == "note"
    assert "torch 2.4.0 (here " in detail and "python 3.9.18 (here " in detail
    assert "dill pickles functions as bytecode" in detail and "rebuild the graph in code" in detail


def test_json_report(results: Results) -> None:
    data = json.loads(results["json"].stdout)
    assert data["ok"] is True
    assert [c["check"] for c in data["checks"]] == ["container", "manifest", "signature", "payload", "versions"]
    assert {c["status"] for c in data["checks"]} == {"ok"}


def test_unusable_invocations_exit_2(results: Results) -> None:
    assert results["missing"].returncode == 2 and "no such file" in results["missing"].stderr
    assert results["both_keys"].returncode == 2 and "not allowed with argument" in results["both_keys"].stderr


GRAPHS = '''
from torch.utils.data.datapipes.iter import IterableWrapper
from tests import graphs

same = graphs.combining

def bigger_shuffle():
    dp = graphs.combining()
    dp.datapipes[0].datapipes[0].buffer_size = 4
    return dp

ready_made = graphs.combining()

def broken():
    raise RuntimeError("no data today")

not_a_pipe = 42
'''


def test_graph_built_in_code(files: dict[str, str], tmp_path) -> None:
    """--graph MODULE:FACTORY, the module found in the current directory like `python -m`."""
    (tmp_path / "user_graphs.py").write_text(textwrap.dedent(GRAPHS))
    root = str(Path(__file__).resolve().parents[2])
    env = {"PYTHONPATH": root}
    calls = [["verify", files["plain"], "--graph", spec] for spec in (
        "user_graphs:same", "user_graphs:bigger_shuffle", "user_graphs:ready_made", "tests.graphs:linear",
        "user_graphs:broken", "user_graphs:not_a_pipe", "user_graphs:nothing", "no_such_module:f", "user_graphs")]
    calls.append(["verify", "--json", files["plain"], "--graph", "tests.graphs:linear"])
    same, bigger, ready, linear, broken, not_a_pipe, nothing, no_module, no_colon, as_json = run_cli_batch(
        *calls, env=env, cwd=str(tmp_path))
    assert same.returncode == 0, same.stdout + same.stderr
    assert status(same, "graph") == ("ok", "user_graphs:same builds the saved graph (15 nodes, fingerprint "
                                           f"{_sources.read_manifest(files['plain'])['graph']['fingerprint'][:16]})")
    assert ready.returncode == 0
    assert bigger.returncode == 1
    lines = [line.strip() for line in bigger.stdout.splitlines()]
    at = lines.index("at 0/datapipes/0/datapipes/0:")
    assert lines[at - 1].endswith("user_graphs:bigger_shuffle builds a different graph (1 difference); "
                                  "restore_snapshot() would refuse it:")
    assert lines[at + 1:at + 3] == ["in snapshot: ShufflerIterDataPipe(buffer_size=3)",
                                    "in code:     ShufflerIterDataPipe(buffer_size=4)"]
    assert bigger.stderr.strip().endswith("failed verification: graph")
    assert linear.returncode == 1 and "in code:     BatcherIterDataPipe(batch_size=4" in linear.stdout
    graph_check = json.loads(as_json.stdout)["checks"][-1]
    assert graph_check["status"] == "FAIL" and len(graph_check["differences"]) == 19
    assert graph_check["differences"][0] == {"path": "0", "saved": "MultiplexerIterDataPipe()",
                                             "current": "BatcherIterDataPipe(batch_size=4, drop_last=False, "
                                                        "wrapper_class=torch.utils.data.datapipes.datapipe.DataChunk)"}
    expected = {
        "broken": (broken, "user_graphs:broken() raised RuntimeError: no data today"),
        "not_a_pipe": (not_a_pipe, "neither a DataPipe nor a function that builds one"),
        "nothing": (nothing, "'user_graphs' has no attribute 'nothing'"),
        "no_module": (no_module, "cannot import 'no_such_module': ModuleNotFoundError"),
        "no_colon": (no_colon, "expected MODULE:FACTORY"),
    }
    for name, (proc, message) in expected.items():
        assert proc.returncode == 2, name
        assert proc.stderr.startswith("snapshot: --graph") and message in proc.stderr, (name, proc.stderr)
        assert "Traceback" not in proc.stderr and proc.stdout == ""


def test_an_empty_key_file_is_refused(files: dict[str, str], tmp_path) -> None:
    empty = tmp_path / "empty.key"
    empty.write_text("\n")
    proc = run_cli("verify", files["signed"], "--key-file", str(empty))
    assert proc.returncode == 2 and "the key file is empty" in proc.stderr
