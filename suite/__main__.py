"""Entry point for `python -m suite`."""

import sys

from suite.commands.cli import main

sys.exit(main())
