"""``attnlab tokenizer``: train, encode with, decode with and describe tokenizers.

A thin layer over :class:`attnlab.tokenizers.Tokenizer`; see ``attnlab tokenizer SUBCOMMAND --help``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from attnlab.tokenizers import Tokenizer
from attnlab.tokenizers.pretrained import PRETRAINED, DownloadError, load_pretrained

_EXAMPLES = {
    "train": """example:
  attnlab tokenizer train corpus.txt more.txt --kind bpe --vocab-size 8000 --output runs/tok
  attnlab tokenizer train corpus.txt --kind wordpiece --vocab-size 4000 --cased --output tok.json""",
    "encode": """example:
  attnlab tokenizer encode --tokenizer runs/tok "Hello world!"
  attnlab tokenizer encode --tokenizer gpt2 --tokens "Hello world!"     # 15496 995 0
  echo "one line per text" | attnlab tokenizer encode --tokenizer runs/tok""",
    "decode": """example:
  attnlab tokenizer decode --tokenizer gpt2 15496 995 0                  # Hello world!
  echo "15496 995 0" | attnlab tokenizer decode --tokenizer gpt2""",
    "info": """example:
  attnlab tokenizer info --tokenizer runs/tok
  attnlab tokenizer info --tokenizer bert-uncased --json""",
}


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``tokenizer`` and its sub-subcommands on the ``attnlab`` parser."""
    parser = subparsers.add_parser(
        "tokenizer", help="train, encode, decode and inspect tokenizers (BPE, WordPiece, char, word)",
        description="Train a tokenizer on text files, or use one (a tokenizer.json, vocab.txt, "
                    "a folder of GPT-2/HF files, or 'gpt2' / 'bert-uncased').",
        epilog="example:\n  attnlab tokenizer train corpus.txt --kind bpe --vocab-size 8000 --output runs/tok",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="tokenizer_command", metavar="SUBCOMMAND")
    parser.set_defaults(func=lambda args: _usage(parser))

    train = _sub(commands, "train", "learn a tokenizer from text files")
    train.add_argument("files", nargs="+", type=Path, help="UTF-8 text files (read line by line)")
    train.add_argument("--kind", choices=("bpe", "wordpiece", "char", "word"), default="bpe", help="tokenizer kind (default: bpe)")
    train.add_argument("--vocab-size", type=int, default=None, help="target vocabulary size, specials included "
                       "(default: 8000; char: every character seen)")
    train.add_argument("--min-frequency", type=int, default=None, help="least count of a merged pair (default 2; char: 1)")
    train.add_argument("--special-tokens", nargs="*", default=None, metavar="TOKEN",
                       help="special tokens (default: <|endoftext|> for bpe; [PAD] [UNK] [CLS] [SEP] [MASK] "
                            "for wordpiece; <pad> <unk> for char)")
    train.add_argument("--cased", action="store_true", help="wordpiece: keep case and accents")
    train.add_argument("--criterion", choices=("frequency", "likelihood"), default="frequency",
                       help="wordpiece: how pairs are chosen (default: frequency)")
    train.add_argument("--template", choices=("none", "bert", "gpt", "bos_eos"), default=None,
                       help="what add_special_tokens wraps around a text (default: bert when [CLS]/[SEP] exist)")
    train.add_argument("--output", "-o", type=Path, required=True, help="folder or .json file to write tokenizer.json to")
    train.add_argument("--quiet", "-q", action="store_true", help="no progress line")
    train.set_defaults(func=run_train)

    encode = _sub(commands, "encode", "print the token ids of texts")
    _tokenizer_arg(encode)
    encode.add_argument("texts", nargs="*", help="texts to encode (default: each line of stdin)")
    encode.add_argument("--add-special-tokens", action="store_true", help="wrap with the template ([CLS] ... [SEP])")
    encode.add_argument("--tokens", action="store_true", help="print token strings instead of ids")
    encode.set_defaults(func=run_encode)

    decode = _sub(commands, "decode", "print the text of token ids")
    _tokenizer_arg(decode)
    decode.add_argument("ids", nargs="*", help="ids, space or comma separated (default: one sequence per stdin line)")
    decode.add_argument("--skip-special-tokens", action="store_true", help="leave special tokens out")
    decode.set_defaults(func=run_decode)

    info = _sub(commands, "info", "describe a tokenizer")
    _tokenizer_arg(info)
    info.add_argument("--json", action="store_true", help="print JSON")
    info.set_defaults(func=run_info)
    return parser


def _sub(commands: argparse._SubParsersAction, name: str, help_text: str) -> argparse.ArgumentParser:
    return commands.add_parser(name, help=help_text, description=help_text[0].upper() + help_text[1:] + ".",
                               epilog=_EXAMPLES[name], formatter_class=argparse.RawDescriptionHelpFormatter)


def _tokenizer_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tokenizer", "-t", required=True,
                        help=f"a tokenizer.json, vocab.txt or folder; or one of: {', '.join(PRETRAINED)} (downloaded once)")


def _usage(parser: argparse.ArgumentParser) -> int:
    """No SUBCOMMAND: the help, and the error on stderr (a failed command says why there)."""
    parser.print_help()
    print(f"{parser.prog}: error: give a SUBCOMMAND (train, encode, decode or info)", file=sys.stderr)
    return 2


def _open(spec: str) -> Tokenizer:
    if not Path(spec).exists() and spec in PRETRAINED:
        try:
            return load_pretrained(spec)
        except DownloadError as err:
            raise ValueError(f"--tokenizer {spec}: {err}") from err
    return Tokenizer.load(spec)


def run_train(args: argparse.Namespace) -> int:
    """Train, save, and print the settings and a summary."""
    settings = {"files": [str(f) for f in args.files], "kind": args.kind, "vocab_size": args.vocab_size,
                "min_frequency": args.min_frequency, "special_tokens": args.special_tokens,
                "lowercase": not args.cased, "criterion": args.criterion, "template": args.template,
                "output": str(args.output)}
    print("settings: " + json.dumps(settings, ensure_ascii=False))
    for path in args.files:
        if not path.is_file():
            raise ValueError(f"files: {str(path)!r} is not a file")
    start = time.perf_counter()
    tok = Tokenizer.train(args.files, kind=args.kind, vocab_size=args.vocab_size, special_tokens=args.special_tokens,
                          min_frequency=args.min_frequency, show_progress=not args.quiet, lowercase=not args.cased,
                          criterion=args.criterion, template=args.template)
    seconds = time.perf_counter() - start
    written = tok.save(args.output)
    merges = f", {len(tok.model.merges)} merges" if tok.kind == "bpe" else ""
    print(f"trained {tok.kind} tokenizer: vocab_size {tok.vocab_size}{merges}, "
          f"{len(tok.all_special_ids)} special tokens, in {seconds:.1f}s")
    print(f"saved {written}")
    return 0


def run_encode(args: argparse.Namespace) -> int:
    """One line of ids (or tokens) per text."""
    tok = _open(args.tokenizer)
    texts = args.texts if args.texts else [line.rstrip("\n") for line in sys.stdin]
    for text in texts:
        ids = tok.encode(text, add_special_tokens=args.add_special_tokens)
        if args.tokens:
            print(" ".join(tok.id_to_token(i) for i in ids))
        else:
            print(" ".join(map(str, ids)))
    return 0


def _parse_ids(parts: list[str]) -> list[int]:
    ids = []
    for part in " ".join(parts).replace(",", " ").split():
        try:
            ids.append(int(part))
        except ValueError:
            raise ValueError(f"ids: {part!r} is not an integer") from None
    return ids


def run_decode(args: argparse.Namespace) -> int:
    """The text of the given ids (or of each stdin line of ids)."""
    tok = _open(args.tokenizer)
    rows = [args.ids] if args.ids else [[line] for line in sys.stdin if line.strip()]
    for row in rows:
        print(tok.decode(_parse_ids(row), skip_special_tokens=args.skip_special_tokens))
    return 0


def run_info(args: argparse.Namespace) -> int:
    """Kind, size, special tokens and template."""
    tok = _open(args.tokenizer)
    info = {
        "kind": tok.kind,
        "vocab_size": tok.vocab_size,
        "special_tokens": {t.content: t.id for t in tok.added_tokens if t.special},
        "roles": tok.roles,
        "template": tok.template.name,
    }
    if tok.kind == "bpe":
        info["merges"] = len(tok.model.merges)
    if tok.kind == "wordpiece":
        info["lowercase"] = tok.model.lowercase
    if args.json:
        print(json.dumps(info, ensure_ascii=False, indent=2))
    else:
        for key, value in info.items():
            print(f"{key}: {value}")
    return 0
