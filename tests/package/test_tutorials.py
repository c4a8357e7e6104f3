"""Every tutorial notebook runs in a real Jupyter kernel, and its own asserts hold.

The tutorials are jupytext "percent" scripts (``tutorials/NN_name.py``), the reviewed source
of truth. Each is converted to a notebook in memory and executed by nbclient in a fresh
``python3`` kernel (the test environment's Python), with a scratch directory as the working
directory and a timeout per cell. A cell that raises (an ``assert`` included) fails the test
with the cell's traceback. The kernel is shut down before the test ends.
"""

from __future__ import annotations

import asyncio
import re
import sys
from html import unescape
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
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


def _execute(path: Path, workdir: Path) -> Any:
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
    return notebook


def test_every_notebook_is_listed() -> None:
    names = [p.name for p in NOTEBOOKS]
    assert [n[:2] for n in names] == ["01", "02", "03", "04", "05", "06"], names
    assert set(WAITING) <= set(names)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("path", _params())
def test_notebook_runs_and_its_claims_hold(path: Path, tmp_path: Path) -> None:
    assert sys.executable  # the kernel is the test environment's own Python (ipykernel)
    notebook = _execute(path, tmp_path)
    # what the docs site shows (mkdocs-jupyter renders through nbconvert): the outputs, and plots
    from nbconvert import HTMLExporter

    html, _ = HTMLExporter().from_notebook_node(notebook)
    assert "jp-OutputArea-output" in html, f"{path.name} renders no output"
    if path.name in PLOTS:
        assert "data:image/png;base64," in html, f"{path.name} renders no plot"
    assert list(tmp_path.iterdir()) == [], "a tutorial writes into the directory it is opened in"
    _hidden_cells_stay_hidden(path, notebook)


def _site_hidden_tag() -> str:
    """The tag whose cells' code the site hides (mkdocs.yml, mkdocs-jupyter's remove_tag_config)."""
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_constructor("!ENV", lambda loader, node: None)
    config = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=Loader)
    options = next(p["mkdocs-jupyter"] for p in config["plugins"] if isinstance(p, dict) and "mkdocs-jupyter" in p)
    return str(options["remove_tag_config"]["remove_input_tags"][0])


def _hidden_cells_stay_hidden(path: Path, notebook: Any) -> None:
    """A set-up cell (tagged to hide its code on the site) shows nothing there: neither its code
    (rendered as the site renders it) nor any output, such as a stray ``Out[2]: 2808``."""
    from nbconvert import HTMLExporter
    from traitlets.config import Config

    tag = _site_hidden_tag()
    hidden = [cell for cell in notebook.cells if tag in cell.metadata.get("tags", [])]
    for cell in hidden:
        assert not cell.get("outputs"), f"{path.name}: a hidden set-up cell shows output {cell.outputs}"
    config = Config({"TagRemovePreprocessor": {"enabled": True, "remove_input_tags": {tag}}})
    html, _ = HTMLExporter(config=config).from_notebook_node(notebook)
    shown = unescape(re.sub(r"<[^>]+>", "", html))  # the page's text, without the highlighting's markup
    for cell in hidden:
        code = max(cell.source.splitlines(), key=len)
        assert code.strip() not in shown, f"{path.name}: the site shows the hidden cell's code ({code})"


#: Tutorials that draw a figure.
PLOTS = {"04_inspecting_snapshots.py"}


def _writefile(path: Path) -> tuple[str, str] | None:
    """The file a tutorial's ``%%writefile`` cell writes, and its text in the notebook."""
    import jupytext

    for cell in jupytext.read(path).cells:
        first, _, body = cell.source.partition("\n")
        if cell.cell_type == "code" and first.startswith("%%writefile "):
            return first.split()[1], body
    return None


@pytest.mark.parametrize("path", [p for p in NOTEBOOKS if _writefile(p)], ids=lambda p: p.stem)
def test_as_a_plain_script_the_written_file_is_the_notebooks(path: Path, tmp_path: Path) -> None:
    """Run as ``python tutorials/NN.py``, the ``%%writefile`` cell is plain code that must not run its
    job, and the next cell writes the same file the notebook's magic writes (in a scratch directory)."""
    import subprocess

    name, body = _writefile(path)  # type: ignore[misc]
    text = path.read_text()
    cut = text.index("\n# %%", text.index(f"Path({name!r}).write_text(_text)".replace("'", '"')))
    head = tmp_path / path.name   # the tutorial up to its scratch directory, run as a script
    head.write_text(text[:cut] + "\nprint(os.getcwd())\n")
    code = (f"import sys; __file__ = {str(path)!r}; sys.argv = [__file__]; "
            f"exec(compile(open({str(head)!r}).read(), __file__, 'exec'))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    scratch = Path(proc.stdout.strip().splitlines()[-1])
    assert (scratch / name).read_text().strip() == body.strip()
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]


@pytest.mark.timeout(600)
def test_a_tutorial_runs_as_a_plain_script(tmp_path: Path) -> None:
    import subprocess

    path = TUTORIALS / "03_state_hooks.py"  # writes a module, imports it, runs workers: the whole path
    proc = subprocess.run([sys.executable, str(path)], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "exact at 8 cut points" in proc.stdout
    assert list(tmp_path.iterdir()) == []


def test_a_notebook_whose_claim_is_wrong_fails(tmp_path: Path) -> None:
    wrong = tmp_path / "99_wrong.py"
    wrong.write_text("# %%\nanswer = 1 + 1\n\n# %%\nassert answer == 3, 'the notebook claims 3'\n")
    with pytest.raises(pytest.fail.Exception, match="the notebook claims 3"):
        _execute(wrong, tmp_path)
