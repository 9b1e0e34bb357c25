"""The ``zerocopy`` command: ``train``, ``doctor`` (see :data:`DESCRIPTION`)."""

from __future__ import annotations

import argparse
import sys
from typing import List, Optional

DESCRIPTION = """\
GPUs reading graph data straight out of host memory.

'zerocopy COMMAND --help' lists a command's options with their defaults."""


def _train(args: argparse.Namespace) -> int:
    from .train import run_from_args

    return run_from_args(args)


def _doctor(args: argparse.Namespace) -> int:
    from .doctor import run_doctor

    return run_doctor(bandwidth_seconds=args.seconds)


def build_parser() -> argparse.ArgumentParser:
    from .train import HelpFormatter, add_arguments

    parser = argparse.ArgumentParser(prog="zerocopy", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    train = sub.add_parser("train", help="train GraphSAGE through the zero-copy pipeline (embedded dataset by "
                                         "default)",
                           description="Train GraphSAGE (node classification) through the sampler -> producer ->\n"
                                       "trainer pipeline; prints per-epoch time, loss and validation accuracy,\n"
                                       "then test accuracy.",
                           formatter_class=HelpFormatter)
    add_arguments(train)
    train.set_defaults(run=_train)

    doctor = sub.add_parser("doctor", help="check this machine for zero-copy use; every line says OK or what to do",
                            formatter_class=HelpFormatter)
    doctor.add_argument("--seconds", type=float, default=2.0, help="length of the H2D bandwidth check")
    doctor.set_defaults(run=_doctor)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
