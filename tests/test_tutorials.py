"""Every tutorial notebook runs in a real Jupyter kernel, and its own asserts hold.

The tutorials are jupytext "percent" scripts (``tutorials/NN_name.py``), the reviewed source
of truth. Each is converted to a notebook in memory and executed by nbclient in a fresh
``python3`` kernel (the test environment's Python), with a scratch directory as the working
directory and a timeout per cell. A cell that raises (an ``assert`` included) fails the test
with the cell's traceback. The kernel is shut down before the test ends.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TUTORIALS = ROOT / "tutorials"
CELL_TIMEOUT = 300

#: Stubs (they raise if run), skipped with the reason until they are written.
WAITING = {
}

NOTEBOOKS = sorted(TUTORIALS.glob("[0-9][0-9]_*.py"))


def _params() -> list[object]:
    return [pytest.param(path, id=path.stem,
                         marks=[pytest.mark.skip(reason=WAITING[path.name])] if path.name in WAITING else [])
            for path in NOTEBOOKS]


def _execute(path: Path, workdir: Path) -> None:
    import jupytext
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    notebook = jupytext.read(path)
    client = NotebookClient(notebook, timeout=CELL_TIMEOUT, kernel_name="python3",
                            resources={"metadata": {"path": str(workdir)}})
    # Run on an event loop of our own (closed afterwards): nbclient's synchronous API keeps
    # a loop thread alive, which the leak check would rightly report.
    try:
        asyncio.run(client.async_execute())
    except CellExecutionError as error:
        pytest.fail(f"{path.name}: a cell failed\n{error}", pytrace=False)


def test_every_notebook_is_listed() -> None:
    names = [p.name for p in NOTEBOOKS]
    assert [n[:2] for n in names] == ["01", "02", "03", "04", "05"], names
    assert set(WAITING) <= set(names)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("path", _params())
def test_notebook_runs_and_its_claims_hold(path: Path, tmp_path: Path) -> None:
    assert sys.executable  # the kernel is the test environment's own Python (ipykernel)
    _execute(path, tmp_path)


def test_a_notebook_whose_claim_is_wrong_fails(tmp_path: Path) -> None:
    wrong = tmp_path / "99_wrong.py"
    wrong.write_text("# %%\nanswer = 1 + 1\n\n# %%\nassert answer == 3, 'the notebook claims 3'\n")
    with pytest.raises(pytest.fail.Exception, match="the notebook claims 3"):
        _execute(wrong, tmp_path)
