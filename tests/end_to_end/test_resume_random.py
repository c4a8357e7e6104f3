"""Property tests over random graphs: same stream as torch's own pipes, exact at every cut."""

from __future__ import annotations

import functools

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from snapshot.testing import assert_resumes_exactly, first_difference
from tests import graphs
from tests.helpers import HOOKED_STRATEGIES
from tests.native import hooked_epochs, native_epochs

OPS = st.one_of(
    st.tuples(st.just("shuffle"), st.integers(1, 12)),
    st.tuples(st.just("map")),
    st.tuples(st.just("filter")),
    st.tuples(st.just("batch"), st.integers(1, 5), st.booleans()),
    st.tuples(st.just("unbatch")),
    st.tuples(st.just("shard")),
    st.tuples(st.just("fork_zip")),
    st.tuples(st.just("concat"), st.integers(0, 6)),
    st.tuples(st.just("mux"), st.integers(1, 40)),
    st.tuples(st.just("demux"), st.booleans()),
    st.tuples(st.just("group"), st.integers(3, 8)),
    st.tuples(st.just("squares")),
)
SPECS = st.lists(OPS, min_size=1, max_size=6)
SETTINGS = settings(max_examples=100, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(spec=SPECS, n=st.integers(0, 40), seed=st.integers(0, 2**64 - 1))
def test_random_graphs_yield_what_torch_yields(spec, n: int, seed: int) -> None:
    factory = functools.partial(graphs.build, spec, n)
    for want, have in zip(native_epochs(factory, seed, 2), hooked_epochs(factory, seed, 2)):
        assert first_difference(want, have) is None


@SETTINGS
@given(spec=SPECS, n=st.integers(0, 40), seed=st.integers(0, 2**64 - 1))
def test_random_graphs_resume_exactly_with_every_strategy(spec, n: int, seed: int) -> None:
    factory = functools.partial(graphs.build, spec, n)
    # without the hookless ``squares`` every node has a hook, and auto would make state's plan (tests/helpers.py)
    strategies = ("auto", "fast_forward") if ("squares",) in spec else HOOKED_STRATEGIES
    assert_resumes_exactly(factory, seed=seed, epochs=2, via_file=False, strategies=strategies)
