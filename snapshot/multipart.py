"""``snapshot.multipart``, the path this module had before the package was grouped by layer: it
is now :mod:`snapshot.storage.multipart`, and this name is the same module object (so that importing,
pickling and monkeypatching through either name reach one module)."""

import sys

from snapshot.storage import multipart as _module
from snapshot.storage.multipart import *  # noqa: F403  (the names, for type checkers)

sys.modules[__name__] = _module
