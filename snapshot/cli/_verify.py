"""``snapshot verify FILE``: checksums, signature, versions, and the graph built in code.

The checks follow the reader's order (docs/format.md): container, manifest, signature,
payload. A failed check stops the ones that depend on it. Nothing is unpickled; only
``--graph`` runs code (the factory the user names, to build the graph to compare).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import hashlib
import importlib
import json
import os
import platform
import sys
import types
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from importlib import metadata
from typing import Any

from snapshot import schema
from snapshot._version import __version__
from snapshot.cli._exit import EXIT_INVALID, EXIT_OK, EXIT_PROBLEM, CommandError
from snapshot.cli._source import Source, locate, part_path
from snapshot.cli._text import MAX_LISTED, count, fit
from snapshot.cli._view import PartFile, View, read_view
from snapshot.container import format as fmt
from snapshot.errors import CorruptSnapshotError, ManifestError, SignatureError, SnapshotFileError
from snapshot.storage import _fsspec, _sources, multipart

__all__ = ["Check", "add_command", "load_factory"]

OK, FAIL, NOTE, SKIP = "ok", "FAIL", "note", "skip"
_PINNED = ("snapshot", "torch", "python", "dill", "torchdata")


@dataclass
class Check:
    """One line of the report."""

    check: str
    status: str
    detail: str
    #: For the graph check: every node that differs (``path``, ``saved``, ``current``).
    differences: list[dict[str, str]] | None = None

    def as_json(self) -> dict[str, Any]:
        return {key: value for key, value in asdict(self).items() if value is not None}


def add_command(commands: Any) -> None:
    cmd = commands.add_parser(
        "verify", help="check checksums, signature, versions and the graph built in code",
        description="Check a snapshot without unpickling it: the container and both checksums, "
                    "the signature (with a key), the versions it was written with, and with "
                    "--graph whether a graph built in code matches the saved one. Exit code 0 "
                    "when every check passes, 1 when one fails, 2 when it cannot run (no such "
                    "file, bad arguments, a --graph factory that cannot be imported or fails).")
    cmd.add_argument("file", help="a snapshot file")
    keys = cmd.add_mutually_exclusive_group()
    keys.add_argument("--key", help=f"the signing key (others may see it in the process list; "
                                    f"prefer --key-file or ${fmt.KEY_ENV})")
    keys.add_argument("--key-file", metavar="PATH", help="read the signing key from PATH (one trailing "
                                                         "newline is ignored)")
    cmd.add_argument("--graph", metavar="MODULE:FACTORY",
                     help="build the graph with MODULE.FACTORY() (or take the DataPipe MODULE.NAME) "
                          "and check that it matches the saved graph; SCRIPT.py:FACTORY runs a training "
                          "script as __main__ (without its __main__ block), for a graph whose functions "
                          "it defines")
    cmd.add_argument("--json", action="store_true", help="print the checks as JSON")
    cmd.set_defaults(run=run)


def _key(args: argparse.Namespace) -> tuple[bytes | str | None, str | None]:
    """The key to check with, and where it came from (``None`` when there is none)."""
    if args.key is not None:
        return args.key, "--key"
    if args.key_file is not None:
        with open(args.key_file, "rb") as f:
            key = f.read()
        key = key[:-2] if key.endswith(b"\r\n") else key[:-1] if key.endswith(b"\n") else key
        if not key:
            raise CommandError(f"{args.key_file}: the key file is empty")
        return key, "--key-file"
    if fmt.resolve_key(None) is not None:
        return None, f"${fmt.KEY_ENV}"
    return None, None


def _here() -> dict[str, str]:
    versions = {"snapshot": __version__, "python": platform.python_version()}
    for package in ("torch", "dill", "torchdata"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            pass
    return versions


def _versions(view: View) -> Check:
    here = _here()
    saved = {name: view.versions[name] for name in _PINNED if name in view.versions}
    written = ", ".join(f"{name} {version}" for name, version in saved.items()) or "unknown versions"
    differ = [name for name, version in saved.items() if name in here and here[name] != version]
    if not differ:
        return Check("versions", OK, f"format {view.format}, read by this installation; written with {written}, "
                                     "the same as here")
    notes = ", ".join(f"{name} {saved[name]} (here {here[name]})" for name in differ)
    why = []
    if "python" in differ and _minor(saved["python"]) != _minor(here["python"]):
        why.append("dill pickles functions as bytecode, which another Python minor version may not load")
    if "torch" in differ or "torchdata" in differ:
        why.append("the pickled graph names torch's classes, which another version may lack or change")
    hint = ("; ".join(why) + ": if restoring fails, rebuild the graph in code and use restore_snapshot()"
            if why else "format-compatible")
    return Check("versions", NOTE, f"format {view.format}, read by this installation; written with {notes}; {hint}")


def _minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def load_factory(spec: str) -> Any:
    """The DataPipe named by ``MODULE:FACTORY`` (called with no arguments) or ``MODULE:NAME``; or, for
    ``SCRIPT.py:FACTORY``, by the script run as ``__main__`` is (see :func:`_script`)."""
    module_name, sep, attribute = spec.rpartition(":")
    if not sep or not module_name or not attribute:
        raise CommandError(f"--graph {spec!r}: expected MODULE:FACTORY or SCRIPT.py:FACTORY, for example "
                           "mypkg.data:build_graph or train.py:build_graph")
    if module_name.endswith(".py"):
        with _script(module_name) as script:
            return _datapipe(spec, script, attribute)
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())  # like `python -m`: modules in the current directory
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # any import-time failure is the user's module's, reported as such
        raise CommandError(f"--graph: cannot import {module_name!r}: {type(exc).__name__}: {exc}") from exc
    return _datapipe(spec, module, attribute)


def _main_guard(test: ast.expr) -> bool:
    """Whether ``test`` compares ``__name__`` with ``"__main__"`` (alone, or in an ``and``)."""
    for node in ast.walk(test):
        if isinstance(node, ast.Compare) and len(node.comparators) == 1:
            sides = {ast.dump(node.left), ast.dump(node.comparators[0])}
            if sides == {ast.dump(ast.Name("__name__", ast.Load())), ast.dump(ast.Constant("__main__"))}:
                return True
    return False


@contextlib.contextmanager
def _script(path: str) -> Iterator[types.ModuleType]:
    """The training script at ``path`` as a module named ``__main__``, so that its functions and classes
    carry the names that a job started as ``python train.py`` (or under torchrun) saved
    (``__main__.decode``), run without its ``if __name__ == "__main__":`` blocks (which would start the
    training). Its directory comes first on ``sys.path`` (as for ``python train.py``); both that and
    ``sys.modules["__main__"]`` are put back when the factory has run."""
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
    except (OSError, SyntaxError, ValueError) as exc:
        raise CommandError(f"--graph: cannot read the script {path}: {exc}") from exc
    body: list[ast.stmt] = []
    for statement in tree.body:
        guarded = isinstance(statement, ast.If) and _main_guard(statement.test)
        body.extend(statement.orelse if guarded else [statement])  # type: ignore[attr-defined]
    tree.body = body
    module = types.ModuleType("__main__")
    module.__file__ = os.path.abspath(path)
    main, search = sys.modules.get("__main__"), list(sys.path)
    sys.modules["__main__"] = module
    sys.path.insert(0, os.path.dirname(module.__file__))
    try:
        try:
            exec(compile(tree, path, "exec"), module.__dict__)  # the user's own script, as --graph says
        except Exception as exc:  # the script's own failure, reported as such
            raise CommandError(f"--graph: running {path} (without its __main__ block) raised "
                               f"{type(exc).__name__}: {exc}") from exc
        yield module
    finally:
        sys.path[:] = search
        if main is not None:
            sys.modules["__main__"] = main


def _datapipe(spec: str, module: types.ModuleType, attribute: str) -> Any:
    module_name = spec.rpartition(":")[0]
    target: Any = module
    for name in attribute.split("."):
        if not hasattr(target, name):
            raise CommandError(f"--graph: {module_name!r} has no attribute {attribute!r}")
        target = getattr(target, name)
    from torch.utils.data import IterDataPipe, MapDataPipe

    if not isinstance(target, (IterDataPipe, MapDataPipe)):
        if not callable(target):
            raise CommandError(f"--graph: {spec} is neither a DataPipe nor a function that builds one")
        try:
            target = target()
        except Exception as exc:  # the factory's own failure, reported with its type
            raise CommandError(f"--graph: {spec}() raised {type(exc).__name__}: {exc}") from exc
        if not isinstance(target, (IterDataPipe, MapDataPipe)):
            raise CommandError(f"--graph: {spec}() returned a {type(target).__name__}, not a DataPipe")
    return target


def _graph(view: View, spec: str, datapipe: Any) -> Check:
    from snapshot.engine.graph import Graph, another_pipeline, compare_nodes

    graph = Graph(datapipe)
    saved = [node.to_dict() for node in view.nodes]
    diffs = compare_nodes(saved, graph)
    if not diffs:
        return Check("graph", OK, f"{spec} builds the saved graph ({len(graph)} nodes, "
                                  f"fingerprint {graph.fingerprint[:16]})")
    foreign = another_pipeline(saved, graph)
    shown = 5 if foreign else MAX_LISTED
    lines = [f"{spec} builds a different graph ({len(diffs)} difference{'s' if len(diffs) != 1 else ''}); "
             "restore_snapshot() would refuse it" + (f": {foreign}." if foreign else ":")]
    script = _script_hint(view, spec)
    if script:
        lines.append(script)
    for diff in diffs[:shown]:
        lines += [f"at {diff.path}:", f"  in snapshot: {diff.saved}", f"  in code:     {diff.current}"]
    if len(diffs) > shown:
        lines.append(f"... and {len(diffs) - shown} more (--json lists every difference)")
    return Check("graph", FAIL, "\n".join(lines),
                 [{"path": d.path, "saved": d.saved, "current": d.current} for d in diffs])


def _script_hint(view: View, spec: str) -> str | None:
    """Why a graph whose functions were saved as ``__main__.f`` cannot match one imported as a module,
    and what to pass instead; ``None`` when the saved graph names nothing of ``__main__``."""
    module = spec.rpartition(":")[0]
    named = any("__main__." in text for node in view.nodes for text in (node.type, *node.args.values()))
    if not named or module.endswith(".py"):
        return None
    return (f"The snapshot's graph was built by a script run as __main__ (python train.py, torchrun): its "
            f"functions and classes are saved as __main__.NAME, and importing {module} names them {module}.NAME. "
            f"Pass the script's path instead, --graph {module.replace('.', os.sep)}.py:"
            f"{spec.rpartition(':')[2]}: it is run as __main__ without its `if __name__ == \"__main__\":` block.")


def _signature(container: fmt.Container, key_source: str | None) -> Check:
    if key_source is not None:
        return Check("signature", OK, f"signed, and the signature matches the key from {key_source}")
    if container.signed:
        return Check("signature", SKIP, f"signed, but not checked: no key (pass --key-file or --key, "
                                        f"or set ${fmt.KEY_ENV})")
    return Check("signature", NOTE, "not signed: anyone could have written it; restore it only if you "
                                    "trust where it came from (sign with save_snapshot(..., key=...))")


def _payload(view: View, container: fmt.Container) -> Check:
    payload = container.payload or b""
    digest = hashlib.sha256(payload).hexdigest()
    if view.payload_sha256 is not None and view.payload_sha256 != digest:
        return Check("payload", FAIL, "the checksum in the header matches, but the manifest records "
                                      f"another payload (sha256 {view.payload_sha256[:16]}…, not {digest[:16]}…): "
                                      "the manifest does not describe this file's payload")
    return Check("payload", OK, f"checksum matches ({count(len(payload))} bytes, sha256 {digest[:16]}…); "
                                "not unpickled")


def _read(path: str) -> bytes:
    """A file's bytes, or an object's behind an fsspec URL."""
    if _fsspec.is_url(path):
        return _fsspec.read_bytes(path)
    with open(path, "rb") as f:
        return f.read()


def _part(source: Source, index: schema.Manifest, part: PartFile, key: bytes | str | None,
          key_source: str | None) -> Check:
    """One rank's part of a distributed snapshot: present, as recorded, of the same save, and sound on its
    own (the checks ``load`` makes, in :func:`snapshot.multipart.check_part`)."""
    label = f"rank {part.rank}"
    path = part_path(source, part.file)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        return Check(label, FAIL, f"{part.file}: the manifest lists it, but it cannot be read ({exc.strerror})")
    if len(data) != part.size or hashlib.sha256(data).hexdigest() != part.sha256:
        return Check(label, FAIL, f"{part.file} is not the part the manifest records ({count(len(data))} bytes, "
                                  f"recorded {count(part.size)}): the directory mixes parts of different saves, "
                                  "or the part was altered")
    try:
        container = fmt.unpack(data, source=path, key=key)
    except SnapshotFileError as exc:
        return Check(label, FAIL, f"{part.file}: {_reason(exc, path)}")
    try:
        multipart.check_part(index, part, container.info, source=path)
    except SnapshotFileError as exc:
        return Check(label, FAIL, _reason(exc, path))
    signed = ("signature matches the key" if key_source is not None
              else "signed (not checked: no key)" if container.signed else "not signed")
    return Check(label, OK, f"{part.file}, {count(len(data))} bytes, as the manifest records; checksums match; "
                            f"{signed}; not unpickled")


def verify(source: Source, key: bytes | str | None, key_source: str | None,
           graph: tuple[str, Any] | None = None) -> list[Check]:
    """Every check, in order; a failed check stops those that depend on it.

    ``graph`` is ``(spec, datapipe)``: the graph built in code, to compare with the saved one.
    A distributed snapshot's manifest is checked like a file, then every part it lists.
    """
    path = source.manifest
    checks: list[Check] = []
    what = f"the manifest of a distributed snapshot ({source.directory})" if source.directory else "a snapshot file"
    try:
        manifest = _sources.read_manifest(path)
    except ManifestError as exc:
        return [Check("container", OK, f"{what}; sizes agree with the header"),
                Check("manifest", FAIL, f"checksum matches and valid JSON, but not a valid manifest: "
                                        f"{_reason(exc, path)}")]
    except SnapshotFileError as exc:
        return [Check("file", FAIL, _reason(exc, path))]
    checks.append(Check("container", OK, f"{what}, {count(manifest['_file']['size'])} bytes, "
                                         "sizes agree with the header"))
    checks.append(Check("manifest", OK, f"checksum matches, valid JSON, format {manifest['format']}"))
    try:
        view = read_view(manifest, path)
    except CorruptSnapshotError as exc:
        return [*checks, Check("manifest", FAIL, _reason(exc, path))]
    data = _read(path)
    try:
        container = fmt.unpack(data, source=path, key=key)
    except SignatureError as exc:
        checks.append(Check("signature", FAIL, f"with the key from {key_source}: {_reason(exc, path)}"))
        checks.append(Check("payload", SKIP, "not checked after the signature failed"))
    except SnapshotFileError as exc:
        checks.append(Check("payload", FAIL, _reason(exc, path)))
    else:
        checks.append(_signature(container, key_source))
        if not view.part_files:
            checks.append(_payload(view, container))
    if source.directory is not None:
        if not view.part_files:
            checks.append(Check("parts", FAIL, "the manifest lists no parts"))
        index = schema.Manifest.from_dict(manifest, source=path)  # read_view checked it
        checks.extend(_part(source, index, part, key, key_source) for part in view.part_files)
    checks.append(_versions(view))
    if graph is not None:
        checks.append(_graph(view, *graph))
    return checks


def _reason(exc: SnapshotFileError, path: str) -> str:
    """The error's message without the file name the report already shows."""
    text = str(exc)
    at = f" (at byte {exc.offset})" if exc.offset is not None else ""
    prefix = f"{path}{at}: "
    if exc.source == path and text.startswith(prefix):
        text = text[len(prefix):]
        if exc.offset is not None:
            text = f"at byte {exc.offset}: {text}"
    return text


def _report(path: str, checks: list[Check]) -> str:
    width = max(len(c.check) for c in checks)
    lines = [path]
    for check in checks:
        first, *rest = check.detail.splitlines()
        lines.append(f"  {check.status:<4}  {check.check:<{width}}  {first}")
        lines.extend(f"  {'':<4}  {'':<{width}}    {line}" for line in rest)
    failed = [c.check for c in checks if c.status == FAIL]
    lines.append(f"FAILED: {', '.join(failed)}" if failed else "OK: no problem found")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    if not _fsspec.is_url(args.file) and not os.path.exists(args.file):
        raise CommandError(f"{args.file}: no such file", EXIT_INVALID)
    source = locate(args.file)  # a file, or a distributed snapshot's directory
    key, key_source = _key(args)
    graph = (args.graph, load_factory(args.graph)) if args.graph else None  # fail early on a bad factory
    checks = verify(source, key, key_source, graph)
    failed = [c for c in checks if c.status == FAIL]
    if args.json:
        print(json.dumps({"file": args.file, "ok": not failed, "checks": [c.as_json() for c in checks]}, indent=2))
    else:
        print(fit(_report(args.file, checks)))
    if failed:
        print(f"snapshot: {args.file} failed verification: {', '.join(c.check for c in failed)}", file=sys.stderr)
        return EXIT_PROBLEM
    return EXIT_OK
