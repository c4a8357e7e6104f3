"""torchdata 0.9's pipes beyond the hook cases (tests/hook_cases.py, run by tests/hooks/test_builtin.py)."""

from __future__ import annotations

import functools

import pytest

td = pytest.importorskip("torchdata.datapipes.iter")

from torch.utils.data.datapipes.iter import IterableWrapper  # noqa: E402

from snapshot.testing import assert_resumes_exactly  # noqa: E402
from tests import graphs  # noqa: E402
from tests.helpers import HOOKED_STRATEGIES  # noqa: E402
from tests.hook_cases import cached, read_lines  # noqa: E402
from tests.native import hooked_epochs, native_epochs  # noqa: E402

STRATEGIES = HOOKED_STRATEGIES  # auto: the same plan as state for these (tests/helpers.py)


def test_in_memory_cache_serves_later_epochs_from_its_cache() -> None:
    expected = native_epochs(cached, seed=1, epochs=3)
    assert expected[1] == expected[0] == expected[2]  # the cache freezes the first epoch's order
    assert hooked_epochs(cached, seed=1, epochs=3) == expected
    assert_resumes_exactly(cached, epochs=3, strategies=STRATEGIES, via_file=False)


def write_lines(root: str) -> str:
    for i in range(4):
        with open(f"{root}/f{i}.txt", "w") as f:
            f.write("".join(f"file {i} line {j}\n" for j in range(i + 2)))
    return root


def test_line_reader(tmp_path) -> None:
    factory = functools.partial(read_lines, write_lines(str(tmp_path)))
    assert native_epochs(factory, epochs=1) == hooked_epochs(factory, epochs=1)
    assert_resumes_exactly(factory, epochs=2, strategies=STRATEGIES)


def test_cycler_over_a_generator_pipe_is_replayed() -> None:
    factory = functools.partial(lambda: td.Cycler(graphs.Squares(IterableWrapper(range(6))), count=2))
    assert_resumes_exactly(factory, epochs=1, strategies=("auto", "fast_forward"), via_file=False)
