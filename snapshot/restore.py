"""``snapshot.restore``, the path this module had before the package was grouped by layer: it
is now :mod:`snapshot.loader.restore`, and this name is the same module object (so that importing,
pickling and monkeypatching through either name reach one module)."""

import sys

from snapshot.loader import restore as _module
from snapshot.loader.restore import *  # noqa: F403  (the names, for type checkers)

sys.modules[__name__] = _module
