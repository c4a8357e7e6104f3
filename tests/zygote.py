"""A process that has imported torch and snapshot and forks a new process per call (a test harness).

A restore "in a fresh process" needs a process that holds nothing of the one that saved: only the
file. A new interpreter gives that, at 3 to 4 s of CPU to import torch each time. The zygote is one
such interpreter (spawned, so it shares nothing with the test process), that imports ``preload``
once and then, per call, forks a child that runs ``fn(*args)`` and sends back its result: each
child is a process of its own that never saw the saving loader, as a new interpreter would be,
without the imports. Bounded: a call that takes more than ``timeout`` seconds kills the zygote and
every process it started (its own session), and fails the test.
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import pickle
import signal
import subprocess
import sys
import traceback
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _child(fn: Callable[..., Any], args: tuple[Any, ...], conn: Any) -> None:
    try:
        result: Any = ("ok", fn(*args))
    except BaseException as exc:  # noqa: BLE001 - reported to the test
        result = ("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")
    conn.send_bytes(pickle.dumps(result))
    conn.close()


def run_script(script: str, args: list[str], cwd: str) -> str:
    """``python SCRIPT *ARGS`` in ``cwd`` (called in a zygote's child): what it printed. The script runs as
    ``__main__`` (a module of its own, as runpy makes it), with its directory first on ``sys.path``."""
    import contextlib
    import io
    import runpy

    os.chdir(cwd)
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    sys.argv = [script, *args]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            runpy.run_path(script, run_name="__main__")
        except SystemExit as exc:
            if exc.code not in (None, 0):
                raise
    return out.getvalue()


def _serve(receive_fd: int, send_fd: int, preload: tuple[str, ...]) -> None:
    """The zygote's loop (``python -c``): a request per message on ``receive_fd``, each reply on ``send_fd``."""
    from multiprocessing.connection import Connection

    sys.path[:] = [os.path.abspath(p) for p in sys.path]  # ``-c``'s "" would follow a child's chdir

    for name in preload:
        importlib.import_module(name)
    receive, send = Connection(receive_fd, writable=False), Connection(send_fd, readable=False)
    context = multiprocessing.get_context("fork")
    while True:
        try:
            fn, args = pickle.loads(receive.recv_bytes())
        except EOFError:
            return
        # not daemonic: a restore may start worker processes of its own
        child = context.Process(target=_child, args=(fn, args, send), name="test-zygote-child")
        child.start()
        child.join()
        if child.exitcode != 0:
            send.send_bytes(pickle.dumps(("error", f"the child died (exit code {child.exitcode})")))


class Zygote:
    """``call(fn, *args)``: ``fn(*args)`` in a new process forked from one that has imported ``preload``.

    The zygote is a plain subprocess (not a ``multiprocessing`` child of the test, so that it is not among
    the test's ``multiprocessing.active_children()``), in a session of its own.
    """

    def __init__(self, preload: Iterable[str] = ("torch", "snapshot")) -> None:
        from multiprocessing.connection import Connection

        theirs_in, mine_out = os.pipe()
        mine_in, theirs_out = os.pipe()
        code = f"from tests.zygote import _serve; _serve({theirs_in}, {theirs_out}, {tuple(preload)!r})"
        self._process = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, pass_fds=(theirs_in, theirs_out),
                                         start_new_session=True)
        os.close(theirs_in)
        os.close(theirs_out)
        self._send, self._receive = Connection(mine_out, readable=False), Connection(mine_in, writable=False)

    def call(self, fn: Callable[..., Any], *args: Any, timeout: float = 180) -> Any:
        self._send.send_bytes(pickle.dumps((fn, args)))
        if not self._receive.poll(timeout):
            self.close(kill=True)
            raise AssertionError(f"{fn.__name__}{args} did not finish within {timeout:g} s in a fresh process")
        status, value = pickle.loads(self._receive.recv_bytes())
        if status != "ok":
            raise AssertionError(f"{fn.__name__}{args} failed in a fresh process: {value}")
        return value

    def close(self, kill: bool = False) -> None:
        self._send.close()  # the zygote returns at the end of its input
        try:
            self._process.wait(0.1 if kill else 30)
        except subprocess.TimeoutExpired:
            pass
        if self._process.poll() is None or kill:
            try:
                os.killpg(self._process.pid, signal.SIGKILL)  # the zygote, its children and their workers
            except ProcessLookupError:
                pass
            self._process.wait(10)
        self._receive.close()
