"""``snapshot.execution``, the path this module had before the package was grouped by layer: it
is now :mod:`snapshot.engine.execution`, and this name is the same module object (so that importing,
pickling and monkeypatching through either name reach one module)."""

import sys

from snapshot.engine import execution as _module
from snapshot.engine.execution import *  # noqa: F403  (the names, for type checkers)

sys.modules[__name__] = _module
