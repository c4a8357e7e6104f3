"""The library version and distribution name (single source of truth; ``setup.py`` reads both)."""

__version__ = "0.2.0"

#: The name on the package index. ``snapshot`` there is an unrelated project, so the
#: distribution is ``datapipe-snapshot``; the import name and the command stay ``snapshot``.
DISTRIBUTION = "datapipe-snapshot"
