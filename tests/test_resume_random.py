"""Property test: random graphs restore exactly at every default cut point."""

from __future__ import annotations

import functools

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from snapshot.testing import assert_resumes_exactly
from tests import graphs

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
)


@settings(max_examples=100, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(spec=st.lists(OPS, min_size=1, max_size=6), n=st.integers(0, 40), seed=st.integers(0, 2**64 - 1))
def test_random_graphs_resume_exactly(spec, n: int, seed: int) -> None:
    factory = functools.partial(graphs.build, spec, n)
    assert_resumes_exactly(factory, seed=seed, epochs=2, via_file=False)
