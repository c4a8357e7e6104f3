"""pytest's settings for the whole checkout (``tests/conftest.py`` holds the tests' own).

The package's old module paths (``snapshot/format.py`` and the like) make their name the module
that lives in a layer's folder: its doctests are collected there, and the old path is not
collected again (pytest would refuse it: the module's file is the one in the folder)."""

from pathlib import Path

collect_ignore = [str(path) for path in sorted((Path(__file__).parent / "snapshot").glob("*.py"))
                  if "sys.modules[__name__] = _module" in path.read_text()]
