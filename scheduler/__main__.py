"""``python -m scheduler ARGS`` is ``zsched ARGS`` (the CLI's entry point)."""
import sys

from scheduler.shell.cli import main

sys.exit(main())
