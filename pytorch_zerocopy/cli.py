"""The ``zerocopy`` command: ``train``, ``doctor``, ``mps`` (see :data:`DESCRIPTION`).

This module imports only the standard library: a command's module (and torch with it) is
imported when that command runs or its own ``--help`` is shown, so ``zerocopy``, ``zerocopy
--help`` and a mistyped command answer without loading any of it.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from typing import Callable, Dict, List, Optional

DESCRIPTION = """\
GPUs reading graph data straight out of host memory.

'zerocopy COMMAND --help' lists a command's options with their defaults."""

# Each command's line in 'zerocopy --help' and in the list a bare 'zerocopy' prints.
COMMANDS: Dict[str, str] = {
    "train": "train GraphSAGE through the zero-copy pipeline (embedded dataset by default)",
    "doctor": "check this machine for zero-copy use; every line says OK or what to do",
    "mps": "run a command as a client of a private CUDA MPS daemon (a loader's pipeline=True shares the GPU)",
}


class CommandParser(argparse.ArgumentParser):
    """A command's parser whose options are added by ``add_options`` the first time they are
    needed (its arguments parsed or its help formatted), so that building the ``zerocopy``
    parser imports no command's module."""

    def __init__(self, *args, add_options: Optional[Callable[[argparse.ArgumentParser], None]] = None, **kwargs):
        super().__init__(*args, **kwargs)
        self._add_options = add_options

    def _complete(self) -> None:
        add, self._add_options = self._add_options, None
        if add is not None:
            add(self)

    def parse_known_args(self, args=None, namespace=None):
        self._complete()
        return super().parse_known_args(args, namespace)

    def format_usage(self) -> str:
        self._complete()
        return super().format_usage()

    def format_help(self) -> str:
        self._complete()
        return super().format_help()


def _train_options(parser: argparse.ArgumentParser) -> None:
    from .train import HelpFormatter, add_arguments

    parser.formatter_class = HelpFormatter
    add_arguments(parser)


def _doctor_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seconds", type=float, default=2.0, help="length of the H2D bandwidth check")


def _mps_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--share", type=float, default=100.0,
                        help="percent of the GPU's threads the command's own CUDA work may use")
    parser.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- COMMAND ...",
                        help="the command and its arguments, e.g. -- python train.py")


def _mps(args: argparse.Namespace) -> int:
    from .pipeline.partition import MPS_CONTROL, MpsError, run_as_client

    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        print("zerocopy mps: give the command to run after --, e.g. zerocopy mps -- python train.py",
              file=sys.stderr)
        return 2
    if shutil.which(MPS_CONTROL) is None:
        print(f"zerocopy mps: needs CUDA MPS, but {MPS_CONTROL!r} is not on PATH (it comes with the NVIDIA "
              "driver's utilities)", file=sys.stderr)
        return 1
    try:
        return run_as_client(cmd, args.share)
    except (MpsError, ValueError) as e:
        print(f"zerocopy mps: {e}", file=sys.stderr)
        return 1


def _train(args: argparse.Namespace) -> int:
    from .train import run_from_args

    return run_from_args(args)


def _doctor(args: argparse.Namespace) -> int:
    from .doctor import run_doctor

    return run_doctor(bandwidth_seconds=args.seconds)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="zerocopy", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=CommandParser)
    sub.add_parser("train", help=COMMANDS["train"], add_options=_train_options,
                   description="Train GraphSAGE (node classification) through the sampler -> producer ->\n"
                               "trainer pipeline; prints per-epoch time, loss and validation accuracy,\n"
                               "then test accuracy.",
                   formatter_class=argparse.RawDescriptionHelpFormatter).set_defaults(run=_train)
    sub.add_parser("doctor", help=COMMANDS["doctor"], add_options=_doctor_options,
                   formatter_class=argparse.ArgumentDefaultsHelpFormatter).set_defaults(run=_doctor)
    sub.add_parser("mps", help=COMMANDS["mps"], add_options=_mps_options,
                   description="Run COMMAND as a client of a private CUDA MPS daemon, started here and\n"
                               "stopped when COMMAND ends. A PyG NeighborLoader or DGL DataLoader with\n"
                               "pipeline=True in COMMAND then shares the GPU with its producer process\n"
                               "through MPS instead of taking turns with it; 'zerocopy train' in it\n"
                               "uses the same daemon.",
                   formatter_class=argparse.RawDescriptionHelpFormatter).set_defaults(run=_mps)
    return parser


def command_list() -> str:
    """The commands, one line each, as ``zerocopy`` without a command prints them."""
    width = max(len(name) for name in COMMANDS)
    return "\n".join(f"  {name:<{width}}  {line}" for name, line in COMMANDS.items())


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_usage(sys.stderr)
        print(f"zerocopy: choose a command:\n{command_list()}\n'zerocopy COMMAND --help' lists its options.",
              file=sys.stderr)
        return 2
    return int(args.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
