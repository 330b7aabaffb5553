"""`attnlab lab`: exercises that grade themselves.

    attnlab lab list                  each lab: what you write, its lecture, its state in ./labs
    attnlab lab start sdpa            writes labs/sdpa.py: the signature, the contract, hints
    attnlab lab check sdpa            runs attnlab's own properties and parity tests on your file
    attnlab --lab labs train run.yaml with model.attention.kernel: lab-sdpa (a passing piece)

`check` exits 0 when every check passes, 1 otherwise (2 for bad input: an unknown lab, a
missing file, a file that does not import).
"""

from __future__ import annotations

import argparse

# attnlab.labs.DEFAULT_DIR, not imported: `attnlab --help` loads no torch (a test checks they agree)
DEFAULT_DIR = "labs"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("lab", help="self-grading exercises: write a piece of attnlab, check it, use it",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                   epilog="example: attnlab lab start sdpa && attnlab lab check sdpa")
    sub = parser.add_subparsers(dest="lab_command", metavar="ACTION")
    listing = sub.add_parser("list", help="the labs and their state in the folder", epilog="example: attnlab lab list")
    start = sub.add_parser("start", help="write a lab's stub for you to fill in",
                           epilog="example: attnlab lab start sdpa")
    check = sub.add_parser("check", help="grade your file: one line per property",
                           epilog="example: attnlab lab check sdpa --dir labs")
    for action in (start, check):
        action.add_argument("name", help="a lab (attnlab lab list names them)")
    for action in (listing, start, check):
        action.add_argument("--dir", default=DEFAULT_DIR, help=f"your labs folder (default ./{DEFAULT_DIR})")
    start.add_argument("--force", action="store_true", help="overwrite a file you already edited with a fresh stub")
    parser.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    from attnlab import labs

    if args.lab_command == "list":
        rows = [(lab.name, labs.state(lab, args.dir), lab.lecture, lab.writes) for lab in labs.LABS.values()]
        widths = [max(len(row[i]) for row in rows) for i in range(3)]
        print(f"labs in {args.dir}/ (attnlab lab start NAME writes one):")
        for row in rows:
            print("  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[3])
        return 0
    if args.lab_command == "start":
        path = labs.start(args.name, args.dir, force=args.force)
        print(f"wrote {path}: fill in what raises NotImplementedError, then `attnlab lab check {args.name}"
              f"{'' if args.dir == DEFAULT_DIR else ' --dir ' + args.dir}`")
        return 0
    if args.lab_command == "check":
        report = labs.check(args.name, args.dir)
        print(report.text())
        return 0 if report.passed else 1
    raise ValueError("name an action: list, start NAME or check NAME (attnlab lab --help)")
