"""The library version (single source of truth; ``setup.py`` reads it)."""

__version__ = "0.1.0"
