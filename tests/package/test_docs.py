"""The documentation site: it builds with warnings as errors, and its examples run.

- ``mkdocs build --strict`` (the API reference is generated from the docstrings, so a broken
  docstring or a dead link fails here);
- every ```` ```python ```` block of every page runs, in page order, in one namespace per
  page and in a scratch directory: a page's examples are a script, and the ``assert``
  statements in them are the page's claims. A block preceded by a line
  ``<!-- example: not run, REASON -->`` is skipped (none is, today);
- the nav lists every page that issue 8 asks for;
- the benchmark figures can be made again from the committed results file.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"

_FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<lang>[\w-]*)[^\n]*\n(?P<body>.*?)^(?P=indent)```[ \t]*$",
                    re.MULTILINE | re.DOTALL)
_NOT_RUN = re.compile(r"<!--\s*example:\s*not run\b")


def python_blocks(text: str) -> list[tuple[int, str]]:
    """``(line number, code)`` of each ```` ```python ```` block that is meant to run."""
    blocks = []
    for match in _FENCE.finditer(text):
        if match.group("lang") != "python":
            continue
        before = text[:match.start()].rstrip().rsplit("\n", 1)[-1]
        if _NOT_RUN.search(before):
            continue
        indent = match.group("indent")
        body = "\n".join(line[len(indent):] for line in match.group("body").splitlines())
        blocks.append((text.count("\n", 0, match.start()) + 2, body))
    return blocks


PAGES = sorted(p for p in DOCS.rglob("*.md") if python_blocks(p.read_text()))


def test_site_builds_with_warnings_as_errors(tmp_path: Path) -> None:
    # a banner from mkdocs-material, not a warning; the tutorials are rendered without running
    # them again (tests/package/test_tutorials.py runs them, and checks what they render)
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1", SNAPSHOT_DOCS_EXECUTE="false")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(ROOT / "mkdocs.yml"),
         "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=180,
    )
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}\n{proc.stderr}"
    assert "WARNING" not in proc.stderr, proc.stderr
    site = tmp_path / "site"
    pages = ["index.html", "reference/loader/index.html", "reference/errors/index.html",
             *(f"tutorials/{p.stem}/index.html" for p in sorted((ROOT / "tutorials").glob("[0-9][0-9]_*.py")))]
    for page in pages:
        assert (site / page).exists(), f"{page} was not built"
    # the API reference is generated from the docstrings
    assert "save_snapshot" in (site / "reference/loader/index.html").read_text()
    # docstrings' Sphinx roles (:class:`x`) are for editors and help(); no page shows one raw
    raw_role = re.compile(r":(?:py:)?(?:func|class|meth|mod|attr|exc|data|obj|const):(?:<code>|`)")
    shown = {str(p.relative_to(site)): m.group(0) for p in site.rglob("*.html")
             for m in [raw_role.search(p.read_text())] if m}
    assert not shown, f"pages that show raw roles: {shown}"


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(DOCS)) for p in PAGES])
def test_page_examples_run(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A real module, so that classes and functions defined on the page pickle by reference
    # (as they would from an importable module of yours).
    name = "docs_example_" + re.sub(r"\W", "_", str(page.relative_to(DOCS))[:-3])
    module = types.ModuleType(name)
    module.__file__ = str(page)
    monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.chdir(tmp_path)
    for line, code in python_blocks(page.read_text()):
        padded = "\n" * (line - 1) + code  # tracebacks give the line of the page
        compiled = compile(padded, str(page.relative_to(ROOT)), "exec")
        exec(compiled, module.__dict__)  # the page's own examples


def test_python_blocks_are_found() -> None:
    text = "a\n```python\nx = 1\n```\n<!-- example: not run, needs a GPU -->\n```python\ny\n```\n" \
           "!!! note\n    ```python\n    z = 2\n    ```\n```sh\nls\n```\n"
    assert [code for _, code in python_blocks(text)] == ["x = 1", "z = 2"]


def _nav_files(nav: object) -> list[str]:
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, list):
        return [f for item in nav for f in _nav_files(item)]
    if isinstance(nav, dict):
        return [f for value in nav.values() for f in _nav_files(value)]
    return []


def test_nav_has_every_page_the_issue_asks_for() -> None:
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_constructor("!ENV", lambda loader, node: None)  # mkdocs's environment variables
    nav = _nav_files(yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=Loader)["nav"])
    wanted = {
        "getting started": "getting-started.md",
        "concept: graph": "concepts/graph.md",
        "concept: snapshot": "concepts/snapshots.md",
        "concept: restore strategies and plans": "concepts/restore.md",
        "concept: logical shards": "concepts/logical-shards.md",
        "how-to: multi-process": "how-to/multi-process.md",
        "how-to: distributed with torchrun": "how-to/distributed.md",
        "how-to: accelerate": "how-to/accelerate.md",
        "how-to: Lightning": "how-to/lightning.md",
        "how-to: DCP": "how-to/dcp.md",
        "how-to: write a state hook": "hooks.md",
        "how-to: inspect a snapshot": "how-to/inspect.md",
        "how-to: migrate from torchdata 0.9": "how-to/migrate.md",
        "file format": "format.md",
        "threat model": "threat-model.md",
        "command line": "cli.md",
        "API reference": "reference/loader.md",
        "benchmarks": "benchmarks.md",
        **{f"tutorial {p.stem}": f"tutorials/{p.name}" for p in sorted((ROOT / "tutorials").glob("[0-9][0-9]_*.py"))},
    }
    missing = {what: path for what, path in wanted.items() if path not in nav}
    assert not missing, f"pages missing from the nav of mkdocs.yml: {missing}"


def test_benchmark_figures_can_be_made_again(tmp_path: Path) -> None:
    results = sorted((DOCS / "benchmarks").glob("results-*.json"))
    assert results, "docs/benchmarks/ holds no results file"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.plot", str(results[-1]), "--out", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    for figure in ("restore.svg", "iterate.svg", "workers.svg"):
        assert (tmp_path / figure).stat().st_size > 1000
        assert (DOCS / "benchmarks" / figure).exists(), f"docs/benchmarks/{figure} is not committed"


# -- docs/cli.md shows what the commands print ------------------------------------------------

_PIPELINE = '''
from torch.utils.data import IterDataPipe
from torch.utils.data.datapipes.iter import Batcher, IterableWrapper, Shuffler


class Tagged(IterDataPipe):
    """A pipe of your own, without a state hook."""

    def __init__(self, datapipe):
        self.datapipe = datapipe

    def __iter__(self):
        for x in self.datapipe:
            yield {"id": x}


def build(buffer_size=50):
    return Batcher(Tagged(Shuffler(IterableWrapper(range(1000)), buffer_size=buffer_size)), 8)


def build_bigger_buffer():
    return build(64)
'''


def cli_examples(directory: Path, monkeypatch: pytest.MonkeyPatch,
                 capsys: pytest.CaptureFixture[str]) -> dict[str, str]:
    """What ``inspect``, ``diff`` and ``verify`` print, at 80 columns, for the snapshots docs/cli.md describes."""
    import snapshot
    from snapshot.cli import main

    (directory / "pipeline.py").write_text(_PIPELINE)
    monkeypatch.chdir(directory)
    monkeypatch.syspath_prepend(str(directory))
    monkeypatch.setenv("COLUMNS", "80")
    import pipeline  # type: ignore[import-not-found]

    dl = snapshot.DataLoader2(pipeline.build())
    dl.seed(42)
    it = iter(dl)
    for _ in range(12):
        next(it)
    dl.save_snapshot("early.snap", metadata={"step": 12})
    for _ in range(30):
        next(it)
    dl.save_snapshot("later.snap", metadata={"step": 42})
    dl.shutdown()
    outputs = {}
    for name, argv in {"inspect": ["inspect", "early.snap"], "diff": ["diff", "early.snap", "later.snap"],
                       "verify": ["verify", "early.snap", "--graph", "pipeline:build_bigger_buffer"]}.items():
        capsys.readouterr()
        main(argv)
        outputs[name] = capsys.readouterr().out
    sys.modules.pop("pipeline", None)
    return outputs


def _masked(text: str) -> str:
    """The text without what differs from run to run: times, digests, sizes and counts, spacing."""
    text = re.sub(r"\d{4}-\d\d-\d\dT[\d:.+]+", "TIME", text)
    text = re.sub(r"\b[0-9a-f]{12,}\b…?", "HEX", text)
    text = re.sub(r"\d[\d,.]*(\+cpu)?( (B|KiB|MiB))?", "N", text)
    return " ".join(text.split())


def _text_block_after(page: str, heading: str) -> str:
    section = page[page.index(heading):]
    match = _FENCE.search(section)
    assert match is not None and match.group("lang") == "text", f"no ```text block under {heading}"
    return match.group("body")


def test_cli_page_shows_what_the_commands_print(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    page = (DOCS / "cli.md").read_text()
    outputs = cli_examples(tmp_path, monkeypatch, capsys)
    for name, heading in {"inspect": "## `snapshot inspect FILE`", "diff": "## `snapshot diff A B`",
                          "verify": "## `snapshot verify FILE`"}.items():
        shown = _text_block_after(page, heading)
        assert _masked(shown) == _masked(outputs[name]), (
            f"docs/cli.md's `snapshot {name}` example is not what the command prints; it prints:\n{outputs[name]}")
        assert max(len(line) for line in shown.splitlines()) <= 80


def test_cli_page_lists_every_command_and_option() -> None:
    from snapshot.cli import _parser

    page = (DOCS / "cli.md").read_text()
    commands = _parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    for name, parser in commands.items():
        assert f"## `snapshot {name} " in page, f"docs/cli.md has no section for `snapshot {name}`"
        for action in parser._actions:
            for option in action.option_strings:
                if option not in ("-h", "--help"):
                    assert f"{option}" in page, f"docs/cli.md does not mention `snapshot {name} {option}`"
    usage_block = _text_block_after(page, "# Command line")
    assert len(re.findall(r"^snapshot (\w+) ", usage_block, re.MULTILINE)) == len(commands)
    for usage in re.findall(r"^snapshot (\w+) ", usage_block, re.MULTILINE):
        assert usage in commands, f"docs/cli.md shows `snapshot {usage}`, which is not a command"


# -- the docs build is quiet: the tutorials' kernels run over IPC, not TCP -----------------------

_EXECUTE_LIKE_THE_SITE = '''
import importlib.util, sys
import nbformat
from nbconvert import HTMLExporter
from nbconvert.nbconvertapp import NbConvertApp

if sys.argv[1] == "with-hook":
    spec = importlib.util.spec_from_file_location("site_hooks", "docs/_hooks/site.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    hooks.on_config({})
app = NbConvertApp()
app.load_config_file()  # as mkdocs-jupyter does
app.config.ExecutePreprocessor.enabled = True
app.config.ExecutePreprocessor.kernel_name = "python3"
notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print(6 * 7)")])
html, _ = HTMLExporter(config=app.config).from_notebook_node(notebook)
assert "42" in html
'''


def test_tutorial_kernels_do_not_warn_about_tcp() -> None:
    def run(mode: str) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if k != "JUPYTER_CONFIG_PATH"}
        return subprocess.run([sys.executable, "-c", _EXECUTE_LIKE_THE_SITE, mode], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=180)

    without, with_hook = run("without-hook"), run("with-hook")
    assert without.returncode == 0 and with_hook.returncode == 0, without.stderr + with_hook.stderr
    assert "running over TCP without encryption" in without.stderr  # what the hook's config prevents
    assert "WARNING" not in with_hook.stderr, with_hook.stderr
