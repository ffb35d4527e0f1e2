"""Command line: ``python -m linrnn [command]`` (also the ``linrnn`` console script).

Commands (the default is ``selfcheck``):

- ``selfcheck`` — every family and torch mode in fp32 against the fp64 reference, timed.
- ``train`` — a small byte-level language model on the shipped corpus (``linrnn.train``).
- ``bench`` — the benchmark suite (:mod:`linrnn.bench`): every family and mode with peers,
  FLOP/s, bytes/s, × floor, JSON and plots; on a CPU-only machine the quick suite, torch path.

A command is a module with ``add_arguments(parser)`` and ``main(args) -> exit code``; adding one
is one entry in :data:`COMMANDS`.
"""

from __future__ import annotations

import argparse
import sys

from linrnn import selfcheck, train
from linrnn.bench import cli as bench_cli

COMMANDS = {
    "selfcheck": (selfcheck, "check every family and mode against the fp64 reference"),
    "train": (train, "train a small byte-level language model on the shipped corpus"),
    "bench": (bench_cli, "benchmark every family and mode, with peers (see linrnn.bench)"),
}
DEFAULT_COMMAND = "selfcheck"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="linrnn",
        description="linrnn: kernels for linear attention and linear RNNs. "
        f"With no command, runs '{DEFAULT_COMMAND}'.",
    )
    sub = parser.add_subparsers(dest="command", metavar="command")
    for name, (module, help_text) in COMMANDS.items():
        cmd = sub.add_parser(name, help=help_text, description=help_text)
        module.add_arguments(cmd)
        cmd.set_defaults(run=module.main)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help")):
        argv.insert(0, DEFAULT_COMMAND)  # `linrnn -T 64` means `linrnn selfcheck -T 64`
    args = build_parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
