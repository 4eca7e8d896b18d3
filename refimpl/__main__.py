"""``python -m refimpl`` is the ``timeshare`` command."""
import sys

from refimpl.cli import main

sys.exit(main())
