import sys

from strata.cli import entry

sys.exit(entry())
