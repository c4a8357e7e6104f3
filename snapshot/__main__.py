"""``python -m snapshot`` is the ``snapshot`` command."""

import sys

from snapshot.cli import main

sys.exit(main())
