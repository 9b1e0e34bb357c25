"""The ``zerocopy`` command.

    zerocopy train    train GraphSAGE through the zero-copy pipeline (embedded dataset by default)
    zerocopy demo     map a feature table for the GPU and gather rows from it
    zerocopy doctor   check this machine for zero-copy use; every line says OK or what to do
"""

from __future__ import annotations

import argparse
import sys
from typing import List, Optional


def _demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    return run_demo(rows=args.rows, dim=args.dim, batch=args.batch, iters=args.iters)


def _train(args: argparse.Namespace) -> int:
    from .train import run_from_args

    return run_from_args(args)


def _doctor(args: argparse.Namespace) -> int:
    from .doctor import run_doctor

    return run_doctor(bandwidth_seconds=args.seconds)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="zerocopy", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    train = sub.add_parser("train", help="train GraphSAGE through the zero-copy pipeline")
    from .train import add_arguments

    add_arguments(train)
    train.set_defaults(run=_train)

    demo = sub.add_parser("demo", help="gather rows of a host-resident feature table on the GPU")
    demo.add_argument("--rows", type=int, default=200_000, help="rows in the table")
    demo.add_argument("--dim", type=int, default=128, help="float32 features per row")
    demo.add_argument("--batch", type=int, default=65_536, help="rows gathered per call")
    demo.add_argument("--iters", type=int, default=20, help="timed gathers")
    demo.set_defaults(run=_demo)

    doctor = sub.add_parser("doctor", help="check this machine for zero-copy use")
    doctor.add_argument("--seconds", type=float, default=2.0, help="length of the H2D bandwidth check")
    doctor.set_defaults(run=_doctor)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
