"""MkDocs hooks for this site (listed under ``hooks:`` in ``mkdocs.yml``).

- ``on_files``: a placeholder for each page that another issue is still writing. The nav
  lists every page the site will have; a page in ``PENDING`` whose file does not exist yet
  is generated with a short "in progress" note, so the site builds (strictly) with a
  complete nav. As soon as the real file lands in ``docs/`` it is used instead.
- ``on_config``: the tutorials' kernels (mkdocs-jupyter executes them) talk to the build over
  local IPC sockets, not TCP: ``jupyter/jupyter_nbconvert_config.json`` here sets the kernel
  transport, and is put on ``$JUPYTER_CONFIG_PATH`` for this process only (the kernel would
  otherwise warn, once per notebook, that it runs over TCP without encryption).
- ``on_page_content``: the package's docstrings are also read as reStructuredText by
  editors and ``help()``; in the API pages, drop their Sphinx roles (``:func:`x``` becomes
  ``x`` in code) and the ``::`` that introduces a literal block.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

log = logging.getLogger(f"mkdocs.hooks.{__name__}")

_ISSUE_6 = "issue 6 (the `snapshot` command: `inspect`, `diff`, `verify`, `graph`; its reference and the threat model)"

PENDING = {
    "cli.md": (
        "Command line",
        "The reference of the `snapshot` command is being written in " + _ISSUE_6 + ".\n\n"
        "Until it lands, `snapshot --help` and `snapshot COMMAND --help` list the commands and "
        "their options, and [Inspect a snapshot](how-to/inspect.md) walks through "
        "`snapshot inspect`.",
    ),
    "threat-model.md": (
        "Threat model",
        "The threat model is being written in " + _ISSUE_6 + ".\n\n"
        "Until it lands, the [file format](format.md#reading-order) says which checks a reader "
        "makes, in which order, before anything is unpickled.",
    ),
}


#: Jupyter configuration read by the tutorials' execution (see the module docstring).
JUPYTER_CONFIG = Path(__file__).resolve().parent / "jupyter"


def on_config(config: Any) -> Any:
    paths = [str(JUPYTER_CONFIG), *filter(None, os.environ.get("JUPYTER_CONFIG_PATH", "").split(os.pathsep))]
    os.environ["JUPYTER_CONFIG_PATH"] = os.pathsep.join(dict.fromkeys(paths))
    return config


def on_files(files: Files, config: Any) -> Files:
    docs_dir = Path(config["docs_dir"])
    for name, (title, body) in PENDING.items():
        if (docs_dir / name).exists():
            continue
        log.info("%s is not written yet: using a placeholder page", name)
        content = f"# {title}\n\n!!! note \"In progress\"\n    " + body.replace("\n", "\n    ") + "\n"
        files.append(File.generated(config, name, content=content))
    return files


# ``:role:`name```, ``:role:`~pkg.name``` and ``:role:`title <target>``` (which may span lines)
_ROLE = re.compile(r":(?:py:)?(?:func|class|meth|mod|attr|exc|data|obj|const):<code>(~?)([^<]*?)"
                   r"(?:\s*&lt;[^<]*?&gt;)?</code>")
#: What a role left in a rendered page looks like (tests/package/test_docs.py looks for it).
RAW_ROLE = re.compile(r":(?:py:)?(?:func|class|meth|mod|attr|exc|data|obj|const):(?:<code>|`)")
_LITERAL = re.compile(r"::</p>")


def _short(match: re.Match[str]) -> str:
    name = " ".join(match.group(2).split())
    shown = name.rsplit(".", 1)[-1] if match.group(1) else name
    return f"<code>{shown}</code>"


# The tutorials link to the repository's files (tutorials/NN_x.py -> ../docs/page.md, or
# NN_y.py); on the site they are pages at tutorials/NN_x/.
_TUTORIAL_DOC_LINK = re.compile(r'href="\.\./docs/([^"#]+?)\.md(#[^"]*)?"')
_TUTORIAL_LINK = re.compile(r'href="(\d\d_\w+)\.py(#[^"]*)?"')


def _tutorial_links(html: str) -> str:
    html = _TUTORIAL_DOC_LINK.sub(lambda m: f'href="../../{m.group(1)}/{m.group(2) or ""}"', html)
    return _TUTORIAL_LINK.sub(lambda m: f'href="../{m.group(1)}/{m.group(2) or ""}"', html)


def on_page_content(html: str, page: Any, config: Any, files: Files) -> str:
    html = _ROLE.sub(_short, html)
    if page.file.src_uri.startswith("tutorials/"):
        html = _tutorial_links(html)
    if not page.file.src_uri.startswith("reference/"):
        return html
    return _LITERAL.sub(":</p>", html)
