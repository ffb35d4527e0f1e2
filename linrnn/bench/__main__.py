"""``python -m linrnn.bench``: the same as ``linrnn bench`` (see :mod:`linrnn.bench.cli`)."""

import sys

from linrnn.bench.cli import cli

if __name__ == "__main__":
    sys.exit(cli())
