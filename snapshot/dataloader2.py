"""``snapshot.dataloader2``, the path this module had before the package was grouped by layer: it
is now :mod:`snapshot.loader.dataloader2`, and this name is the same module object (so that importing,
pickling and monkeypatching through either name reach one module)."""

import sys

from snapshot.loader import dataloader2 as _module
from snapshot.loader.dataloader2 import *  # noqa: F403  (the names, for type checkers)

sys.modules[__name__] = _module
