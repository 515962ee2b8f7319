"""`python -m bertforge` runs the command line."""

from bertforge.cli import entry

entry()
