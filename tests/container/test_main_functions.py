"""Functions and classes of the training script (``__main__``) travel with what they use.

Script A defines the graph's functions at its top level and saves; script B, a different
file in another directory, only calls ``from_snapshot`` (or ``from_state``) and iterates. The
stream B yields must be the rest of A's stream. Where the functions cannot be carried, A's save
says which function, which global and what to do; a restore that still meets a missing name
or module says the likely cause and the fix.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]

SCRIPT_A = """
import json, sys
import torch
from torch.utils.data.datapipes.iter import IterableWrapper
import snapshot

SCALE = 10
OFFSET = {"value": 3}


def helper(x):
    return x + OFFSET["value"]


def f(x):
    return helper(x) * SCALE


class Shift:
    def __init__(self, by):
        self.by = by

    def __call__(self, x):
        return x - self.by * SCALE


keep = lambda x: x % 7 != 0  # noqa: E731

{extra}

def build():
    return (IterableWrapper(range(200)).shuffle().sharding_filter().filter(keep).map(f).map(Shift(2))
            .batch(4))


if __name__ == "__main__":
    {service}
    loader = snapshot.DataLoader2(build(), reading_service=service)
    loader.seed(5)
    it = iter(loader)
    first = [next(it) for _ in range(6)]
    {save}
    rest = list(it)
    loader.shutdown()
    print(json.dumps({"first": first, "rest": rest}))
"""

SCRIPT_B = """
import json, sys
import torch
import snapshot

if __name__ == "__main__":  # spawned workers import this script again
    for src in sys.argv[1:]:
        if src.endswith(".pt"):
            loader = snapshot.DataLoader2.from_state(torch.load(src, weights_only=True))
        else:
            loader = snapshot.DataLoader2.from_snapshot(src, {service})
        with loader:
            print(json.dumps(list(loader)))
"""

SAVE = "loader.save_snapshot(sys.argv[1])"
STATE = "torch.save(loader.state_dict(), sys.argv[1])"


def run(script: str, *args: str, cwd: Path, ok: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, script, *args], cwd=cwd, capture_output=True, text=True, timeout=180)
    if ok:
        assert proc.returncode == 0, proc.stderr
    return proc


def write_scripts(tmp_path: Path, *, save: str = SAVE, service_a: str = "None",
                  extra: str = "") -> tuple[Path, Path]:
    """Script A in ``tmp_path/a``, script B in ``tmp_path/b``: neither can import the other."""
    a_dir, b_dir = tmp_path / "a", tmp_path / "b"
    a_dir.mkdir()
    b_dir.mkdir()
    script_a = SCRIPT_A.replace("{service}", f"service = {service_a}").replace("{save}", save)
    (a_dir / "train.py").write_text(script_a.replace("{extra}", extra))
    (b_dir / "resume.py").write_text(SCRIPT_B.replace("{service}", ""))
    return a_dir, b_dir


SPAWNED = "reading_service=snapshot.MultiProcessingReadingService(2, multiprocessing_context='spawn')"


@pytest.fixture(scope="module")
def in_process_job(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], dict[str, Any]]:
    """Script A run once in-process, saving both ways at one point (a snapshot file, then a state dict), and
    script B run once, restoring each: what A read after the save, and B's stream from each file."""
    tmp_path = tmp_path_factory.mktemp("in-process")
    a_dir, b_dir = write_scripts(tmp_path, save=SAVE + "\n    " + STATE.replace("sys.argv[1]", "sys.argv[2]"))
    targets = ["data.snap", "state.pt"]
    paths = [str(tmp_path / target) for target in targets]
    saved = json.loads(run("train.py", *paths, cwd=a_dir).stdout)
    rests = [json.loads(line) for line in run("resume.py", *paths, cwd=b_dir).stdout.splitlines()]
    return saved, dict(zip(targets, rests))


@pytest.mark.parametrize("target", ["data.snap", "state.pt"], ids=["in_process", "state_dict"])
def test_a_scripts_functions_restore_in_another_script(in_process_job, target: str) -> None:
    saved, rests = in_process_job
    assert len(saved["rest"]) > 10
    assert rests[target] == saved["rest"]


def test_a_scripts_functions_restore_in_another_script_with_workers(tmp_path) -> None:
    """A save by workers is restored by B in-process, and by B's spawned workers (which import B again),
    from the same file (one run of A for both)."""
    a_dir, b_dir = write_scripts(tmp_path, service_a="snapshot.MultiProcessingReadingService(2)")
    path = tmp_path / "data.snap"
    saved = json.loads(run("train.py", str(path), cwd=a_dir).stdout)
    assert len(saved["rest"]) > 10
    rest = json.loads(run("resume.py", str(path), cwd=b_dir).stdout)
    assert rest == saved["rest"]
    spawn_dir = tmp_path / "b-spawned"
    spawn_dir.mkdir()
    (spawn_dir / "resume.py").write_text(SCRIPT_B.replace("{service}", SPAWNED))
    rest = json.loads(run("resume.py", str(path), cwd=spawn_dir).stdout)
    assert rest == saved["rest"]


UNPICKLABLE = """
SOURCE = (i for i in range(10**9))  # a generator: no pickler can carry it


def numbered(x):
    return (next(SOURCE), x)
"""

NUMBERED_SAVE = """
    loader = snapshot.DataLoader2(IterableWrapper(range(20)).map(numbered), reading_service=service)
    try:
        loader.save_snapshot(sys.argv[1])
    except snapshot.SerializationError as exc:
        print(json.dumps({"refused": str(exc)}))
    loader.save_snapshot(sys.argv[1], include_graph=False)  # rebuilding the graph in code still works
    with pytest_warns() as caught:
        state = loader.state_dict()
    torch.save(state, sys.argv[2])
    print(json.dumps({"warned": [str(w.message) for w in caught]}))
    sys.exit(0)
"""


def test_a_function_whose_globals_cannot_be_pickled_is_refused_at_save(tmp_path) -> None:
    extra = UNPICKLABLE + "\nimport warnings\n\ndef pytest_warns():\n    return warnings.catch_warnings(record=True)\n"
    a_dir, b_dir = write_scripts(tmp_path, save=NUMBERED_SAVE, extra=extra)
    proc = run("train.py", str(tmp_path / "x.snap"), str(tmp_path / "state.pt"), cwd=a_dir)
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    refused, warned = lines[0]["refused"], lines[1]["warned"]
    for message in (refused, warned[0]):
        assert "cannot be saved so that another script can load it" in message
        assert "the DataPipe at 0 (MapperIterDataPipe" in message
        assert "the function numbered (in __main__) uses the global 'SOURCE' = generator" in message
        assert "into a module the restoring script can import" in message and "include_graph=False" in message
    assert len(warned) == 1 and "loads only in the script that saved it" in warned[0]
    # what the warning says: that state dict's graph fails in another script, with the cause and the fix
    proc = run("resume.py", str(tmp_path / "state.pt"), cwd=b_dir, ok=False)
    assert proc.returncode != 0
    assert "NameError: name 'SOURCE' is not defined" in proc.stderr
    assert "unpickled from a snapshot, and one of its functions needs the name 'SOURCE'" in proc.stderr
    assert "put the function in a module that both scripts import" in proc.stderr


IMPORTS_A_SIBLING = """
def f(x):
    import sibling_of_train  # a module next to script A only
    return sibling_of_train.triple(x)
"""


def test_a_missing_module_at_restore_names_the_cause(tmp_path) -> None:
    a_dir, b_dir = write_scripts(tmp_path, extra=IMPORTS_A_SIBLING)  # this f replaces the first one
    (a_dir / "sibling_of_train.py").write_text("def triple(x):\n    return 3 * x\n")
    path = tmp_path / "data.snap"
    run("train.py", str(path), cwd=a_dir)
    proc = run("resume.py", str(path), cwd=b_dir, ok=False)
    assert "ModuleNotFoundError: No module named 'sibling_of_train'" in proc.stderr
    assert "needs the module 'sibling_of_train'" in proc.stderr and "Likely cause" in proc.stderr


def test_a_loader_built_in_code_gets_no_snapshot_hint() -> None:
    """The hint is for graphs unpickled from a snapshot; a typo in the user's own graph is just a NameError."""
    from torch.utils.data.datapipes.iter import IterableWrapper

    import snapshot

    def broken(x):
        return x * UNDEFINED_NAME  # noqa: F821

    with pytest.raises(NameError) as info, snapshot.DataLoader2(IterableWrapper(range(3)).map(broken)) as loader:
        list(loader)
    assert "unpickled from a snapshot" not in "\n".join(getattr(info.value, "__notes__", []))


#: Two scripts' claims in one process (``python -c``, functions in ``__main__``): the globals a snapshot carries,
#: and the warning about a large one (attributed to the user's line).
GLOBALS_SCRIPT = textwrap.dedent("""
    import warnings
    from torch.utils.data.datapipes.iter import IterableWrapper
    import snapshot
    SCALE = 1
    def f(x):
        return x * SCALE
    loader = snapshot.DataLoader2(IterableWrapper(range(3)).map(f))
    SCALE = 100
    print(list(loader), list(snapshot.DataLoader2.from_snapshot(loader.save_snapshot())))

    TABLE = bytes(20 * 2**20)
    def look_up(i):
        return TABLE[i]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = snapshot.DataLoader2(IterableWrapper(range(3)).map(look_up))
    print([str(w.message) for w in caught if "MiB" in str(w.message)])
    print(caught[-1].filename)
""")


@pytest.fixture(scope="module")
def globals_script(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    proc = subprocess.run([sys.executable, "-c", GLOBALS_SCRIPT], cwd=tmp_path_factory.mktemp("globals"),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


def test_the_snapshot_carries_the_globals_as_they_were_when_the_loader_was_built(globals_script) -> None:
    """The graph (globals included) is pickled when the loader is built, as the loader copies it
    then; the running loader keeps torchdata's behaviour and reads the script's live globals."""
    assert globals_script[0].split() == ["[0,", "100,", "200]", "[0,", "1,", "2]"]


def test_a_large_global_copied_into_the_graph_is_warned_about(globals_script) -> None:
    assert "make the graph's pickle 20 MiB (without them: 0 MiB)" in globals_script[1]
    assert globals_script[2] == "<string>"  # attributed to the user's line
