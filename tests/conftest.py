"""Fixtures that make every test fail when it leaks processes, threads or environment."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

#: The test files that take longest, longest first (seconds summed over a file's tests, from
#: ``pytest -n 2 --dist loadfile --junitxml`` on a loaded machine; the rest take under 50 s each there).
#: ``make unit`` runs each file whole on one of two processes, in this order (``--no-loadscope-reorder``:
#: pytest-xdist would otherwise start the files with the most tests first, and these few-test, slow files
#: last, when one of them can keep a process busy for minutes after the other has finished).
LONGEST_FIRST = (
    "tests/integrations/test_lightning.py", "tests/end_to_end/test_fuzz_graphs.py",
    "tests/engine/test_reiterated_random.py", "tests/package/test_tutorials.py",
    "tests/reading_service/test_workers.py", "tests/package/test_examples.py", "tests/package/test_docs.py",
    "tests/integrations/test_accelerate.py", "tests/reading_service/test_dispatch.py",
    "tests/container/test_main_functions.py", "tests/hooks/test_coverage.py",
    "tests/package/test_preemption_example.py", "tests/hooks/test_builtin.py",
    "tests/reading_service/test_nonreplicable_tail.py", "tests/reading_service/test_elastic_buffers.py",
    "tests/storage/test_object_store_faults.py", "tests/hooks/test_file_pipelines.py",
    "tests/integrations/test_paired_checkpoint.py", "tests/reading_service/test_distributed.py",
    "tests/storage/test_two_nodes.py", "tests/package/test_benchmarks_distributed.py",
    "tests/hooks/test_positions_batch.py", "tests/schema/test_schema.py", "tests/cli/test_verify.py",
    "tests/reading_service/test_worker_reset_fn.py", "tests/package/test_demo.py", "tests/end_to_end/test_resume.py",
    "tests/reading_service/test_distributed_even.py", "tests/loader/test_shutdown_save.py",
    "tests/package/test_benchmarks_scale.py", "tests/end_to_end/test_resume_random.py",
    "tests/engine/test_fingerprint_code.py", "tests/reading_service/test_elastic_ranks.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run the files of :data:`LONGEST_FIRST` first, in its order; the rest after them, as collected."""
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))


def child_pids() -> set[int]:
    """Live (non-zombie) child processes of this process."""
    me = os.getpid()
    children = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        state, ppid = fields[0], int(fields[1])
        if ppid == me and state != "Z":
            children.add(int(entry))
    return children


def _service_pids() -> set[int]:
    """multiprocessing's own long-lived helpers (resource tracker, forkserver): not leaks."""
    pids = set()
    from multiprocessing import forkserver, resource_tracker

    for helper in (getattr(resource_tracker, "_resource_tracker", None),
                   getattr(forkserver, "_forkserver", None)):
        pid = getattr(helper, "_pid", None) or getattr(helper, "_forkserver_pid", None)
        if pid:
            pids.add(pid)
    return pids


def _threads() -> set[int]:
    return {t.ident for t in threading.enumerate() if t.is_alive() and t.ident is not None}


@pytest.fixture(autouse=True)
def no_leaks() -> Iterator[None]:
    """Fail a test that leaves child processes, new threads or changed env vars behind."""
    env_before = dict(os.environ)
    children_before = child_pids()
    threads_before = _threads()
    yield
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        leaked = child_pids() - children_before - _service_pids()
        new_threads = {t for t in threading.enumerate()
                       if t.ident not in threads_before and t.is_alive()
                       and not t.name.startswith(("QueueFeederThread", "pydevd", "snapshot-writer"))}
        if not leaked and not new_threads:
            break
        time.sleep(0.05)
    problems = []
    if leaked:
        problems.append(f"child processes still running: {sorted(leaked)}")
    if new_threads:
        problems.append(f"threads still running: {sorted(t.name for t in new_threads)}")
    changed = {k for k in set(env_before) | set(os.environ) if env_before.get(k) != os.environ.get(k)}
    # set once, on first use, by torch itself (inductor's cache, the CUDA check), not by a test
    changed -= {"PYTEST_CURRENT_TEST", "TORCHINDUCTOR_CACHE_DIR", "PYTORCH_NVML_BASED_CUDA_CHECK"}
    if changed:
        problems.append(f"environment variables changed: {sorted(changed)}")
        os.environ.clear()
        os.environ.update(env_before)
    if problems:
        pytest.fail("test leaked: " + "; ".join(problems))


@pytest.fixture
def data_dir(tmp_path: object) -> str:
    """A directory of small text and JSON files (see ``graphs.write_files``)."""
    from tests.graphs import write_files

    return write_files(os.path.join(str(tmp_path), "data"))


@pytest.fixture(scope="module")
def zygote() -> Iterator[Any]:
    """One interpreter that has imported torch and snapshot (tests/zygote.py); each call is a process forked
    from it: a restore in a fresh process without the imports."""
    from tests.zygote import Zygote

    forks = Zygote()
    yield forks
    forks.close()
