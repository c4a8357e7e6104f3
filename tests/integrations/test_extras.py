"""Each integration is an optional extra: without its tool, importing it says what to install.

And importing ``snapshot`` (or ``snapshot.integrations``) imports none of the tools.
"""

from __future__ import annotations

import importlib
import importlib.util
import subprocess
import sys

import pytest


@pytest.mark.parametrize("module, tool, extra", [
    ("snapshot.integrations.accelerate", "accelerate", "accelerate"),
    ("snapshot.integrations.lightning", "lightning", "lightning"),
    ("snapshot.integrations.torchdata", "torchdata", "torchdata-nodes"),
])
def test_a_missing_tool_is_an_import_error_that_names_the_extra(module: str, tool: str, extra: str,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, tool, None)  # as if it were not installed
    monkeypatch.delitem(sys.modules, module, raising=False)
    expected = rf"{module} needs the '{tool}' package.*pip install 'datapipe-snapshot\[{extra}\]'"
    with pytest.raises(ImportError, match=expected):
        importlib.import_module(module)


def test_as_node_needs_torchdata_0_10() -> None:
    if importlib.util.find_spec("torchdata") is None:
        pytest.skip("torchdata is not installed")
    if importlib.util.find_spec("torchdata.nodes") is not None:
        pytest.skip("this environment has torchdata.nodes (tests/torchdata_new tests it)")
    from torch.utils.data.datapipes.iter import IterableWrapper

    from snapshot.integrations.torchdata import as_node

    expected = r"torchdata 0.10 or later.*pip install 'datapipe-snapshot\[torchdata-nodes\]'"
    with pytest.raises(ImportError, match=expected):
        as_node(IterableWrapper(range(3)))


def test_importing_snapshot_imports_no_tool() -> None:
    code = ("import sys, snapshot, snapshot.integrations; "
            "print(sorted(m for m in ('accelerate', 'lightning', 'torchdata') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "[]"
