"""Entry point of the `attnlab` command.

Each subcommand lives in its own module of this package (`fill-mask` in fill_mask.py) and exposes
``add_parser(subparsers)``, which registers an ``argparse`` parser whose
``func`` default is called with the parsed arguments. To add a subcommand,
write the module, list it in ``SUBCOMMANDS`` and give its one-line help in
``SUMMARIES`` (a test checks that the two agree with the module's parser).

Only the module of the subcommand being run is imported: `attnlab --help` lists the others
from ``SUMMARIES``, so it answers without importing torch or any subcommand.

Errors reach the user as one line, never a traceback (see `describe_error`):

    attnlab CMD: error: MESSAGE            exit 2: bad input, a missing or unreadable file
    attnlab CMD: internal error: MESSAGE   exit 1: a bug in attnlab (please report it)
    attnlab CMD: interrupted               exit 130: Ctrl-C
    (train, finetune) stopped by SIGTERM     exit 128 + the signal's number: 143 SIGTERM, 138 SIGUSR1,
                                           after a checkpoint (attnlab.training.run.signals)

`ATTNLAB_DEBUG=1` in the environment (or `attnlab --traceback CMD ...`) lets the exception
through with its traceback. Warnings print as one line too: `attnlab CMD: warning: MESSAGE`.
"""

from __future__ import annotations

import argparse
import importlib
import io
import os
import sys
import warnings
from collections.abc import Iterable
from typing import NoReturn

SUBCOMMANDS = ["convert", "data", "demo", "embed", "eval", "fill-mask", "finetune", "generate", "inspect", "lab",
               "model", "parallel", "predict", "score", "tokenizer", "train", "translate"]

# what `attnlab --help` shows for each subcommand without importing its module; equal to the
# help its module registers (tests/cli/test_main.py checks it)
SUMMARIES = {
    "convert": "convert weights between attnlab and Hugging Face folders",
    "data": "list, fetch and inspect built-in corpora",
    "demo": "train a small GPT on Shakespeare for a few minutes and generate",
    "embed": "sentence embeddings (all-MiniLM-L6-v2 by default) to .npy or JSONL",
    "eval": "evaluate a training checkpoint",
    "fill-mask": "a masked LM's top tokens at each [MASK] of a text",
    "finetune": "fine-tune a pretrained model on a classification or tagging task",
    "generate": "continue a prompt with a saved model (streams to the terminal)",
    "inspect": "look inside models: attention maps, patching, attribution, cost, gradients, rank",
    "lab": "self-grading exercises: write a piece of attnlab, check it, use it",
    "model": "inspect model configurations and presets",
    "parallel": "data/tensor/pipeline-parallel planning: memory per rank, communication, pipeline bubble",
    "predict": "label a CSV/JSONL file with a fine-tuned model",
    "score": "log-probability of texts under a language model",
    "tokenizer": "train, encode, decode and inspect tokenizers (BPE, WordPiece, char, word)",
    "train": "train a model from a YAML/JSON run config",
    "translate": "translate a file or stdin, one sentence per line",
}

DEBUG_ENV = "ATTNLAB_DEBUG"
LABS_ENV = "ATTNLAB_LABS"  # labs folders (os.pathsep-separated) whose passing pieces every command registers


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line (`attnlab CMD: error: ...`), like every
    other error of the command; subparsers inherit the class."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {_one_line(message)} (see {self.prog} --help)\n")


class _Version(argparse.Action):
    """`--version`: the installed package's version, looked up only when asked for."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None) -> NoReturn:
        print(f"attnlab {version()}")
        parser.exit(0)


def version() -> str:
    """attnlab's version: the installed distribution's, else the package's `__version__`."""
    from importlib import metadata

    try:
        return metadata.version("attnlab")
    except metadata.PackageNotFoundError:
        from attnlab._version import __version__

        return __version__


def build_parser(commands: Iterable[str] | None = None) -> argparse.ArgumentParser:
    """The `attnlab` parser. Subcommands in `commands` (default: all) get their full parser,
    which imports their module; the others a one-line placeholder from `SUMMARIES`."""
    load = set(SUBCOMMANDS if commands is None else commands)
    parser = _Parser(
        prog="attnlab",
        description="Build, pretrain, fine-tune, decode and inspect Transformers and their recurrent ancestors.",
        epilog=f"Errors are one line; set {DEBUG_ENV}=1 (or pass --traceback) to see the traceback.",
    )
    parser.add_argument("--version", action=_Version, help="print attnlab's version and exit")
    parser.add_argument("--traceback", action="store_true",
                        help=f"on an error, show the Python traceback (as {DEBUG_ENV}=1 does)")
    parser.add_argument("--lab", action="append", metavar="DIR", default=[],
                        help="register the passing pieces of this labs folder (attnlab lab) so that a config can "
                             "name them: model.attention.kernel: lab-sdpa, model.position.scheme: lab-rotary "
                             f"(repeatable; may follow the command; {LABS_ENV}=DIR does the same)")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        if name in load:
            importlib.import_module(f"attnlab.cli.{name.replace('-', '_')}").add_parser(subparsers)
        else:
            subparsers.add_parser(name, help=SUMMARIES.get(name))
    return parser


def _command_of(argv: list[str]) -> str | None:
    """The subcommand named in `argv`: its first word that is not an option nor the value of
    `--lab` (the other top-level options take no value), or None."""
    return next((a for i, a in enumerate(argv) if not a.startswith("-") and (i == 0 or argv[i - 1] != "--lab")), None)


def _hoist_lab(argv: list[str]) -> list[str]:
    """`--lab DIR` (or `--lab=DIR`) wherever it stands, moved before the command, where the
    top-level parser reads it: `attnlab train run.yaml --lab labs` works as `attnlab --lab labs
    train run.yaml`."""
    front, rest, i = [], [], 0
    while i < len(argv):
        if argv[i] == "--lab" and i + 1 < len(argv):
            front += argv[i:i + 2]
            i += 2
            continue
        (front if argv[i].startswith("--lab=") else rest).append(argv[i])
        i += 1
    return front + rest


def _use_labs(folders: list[str], prog: str) -> None:
    """Register the passing lab pieces of `folders` and of $ATTNLAB_LABS; the folders go into
    $ATTNLAB_LABS so that processes this command starts (torchrun's) register them too."""
    env = [f for f in os.environ.get(LABS_ENV, "").split(os.pathsep) if f]
    folders = list(dict.fromkeys(env + [os.path.abspath(f) for f in folders]))
    if not folders:
        return
    from attnlab.labs import use

    for folder in folders:
        registered, skipped = use(folder)
        for name, why in skipped.items():
            warnings.warn(f"lab {name} of {folder} is not registered: {why}")
        if registered and os.environ.get("RANK", "0") == "0":
            names = ", ".join(s for settings in registered.values() for s in settings)
            print(f"{prog}: lab pieces from {folder}: {names}", file=sys.stderr)
    os.environ[LABS_ENV] = os.pathsep.join(folders)


def main(argv: list[str] | None = None) -> int:
    """Run `attnlab ARGV`; returns the exit status (0, 2 for a user's error, 1 for a bug, 130 on
    Ctrl-C). Usage errors and --help/--version exit through SystemExit, as argparse does."""
    argv = _hoist_lab(list(sys.argv[1:] if argv is None else argv))
    command = _command_of(argv)
    parser = build_parser([command] if command in SUBCOMMANDS else [])
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        print("attnlab: error: give a COMMAND (listed above)", file=sys.stderr)
        return 2
    debug = args.traceback or os.environ.get(DEBUG_ENV, "") not in ("", "0")
    prog = f"attnlab {args.command}"
    with warnings.catch_warnings():
        warnings.showwarning = _warning_printer(prog)
        try:
            _use_labs(args.lab, prog)
            return args.func(args) or 0
        except KeyboardInterrupt:
            if debug:
                raise
            print(f"{prog}: interrupted", file=sys.stderr)
            return 130
        except BrokenPipeError:  # `attnlab ... | head`: the reader left; stop quietly
            _silence_stdout()
            return 141
        except Exception as err:
            if debug:
                raise
            message, code = describe_error(err)
            print(f"{prog}: {message}", file=sys.stderr)
            return code


def _warning_printer(prog: str):
    """A `warnings.showwarning` that prints `attnlab CMD: warning: MESSAGE` on one line (the
    source line a Python warning normally shows means nothing to a command-line user)."""

    def show(message, category, filename, lineno, file=None, line=None) -> None:
        try:
            print(f"{prog}: warning: {_one_line(str(message))}", file=file or sys.stderr)
        except OSError:
            pass

    return show


def _silence_stdout() -> None:
    """Point stdout at /dev/null so that Python's final flush does not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        pass


# ---------------------------------------------------------------- errors as one line

def describe_error(err: BaseException) -> tuple[str, int]:
    """(`error: MESSAGE`, 2) for what a user can act on, (`internal error: ...`, 1) for a bug.

    A user's error is: a bad value (ValueError, TypeError — configs, flags, file contents), a
    file-system error (OSError, named by its file), a file that does not decode (not UTF-8,
    not YAML, a truncated pickle or safetensors file), memory exhausted (MemoryError, torch's
    allocator failing), or any error class of attnlab's own. Anything else (KeyError, IndexError, a RuntimeError from torch ...) is a bug.
    """
    if isinstance(err, OSError):
        return f"error: {_os_error_message(err)}", 2
    if isinstance(err, UnicodeDecodeError):
        return f"error: {_decode_error_message(err)}", 2
    if isinstance(err, MemoryError) or _is_allocation_failure(err):
        return f"error: out of memory ({_one_line(str(err)) or 'MemoryError'}); ask for less", 2
    if isinstance(err, (ValueError, TypeError)) or _is_decode_error(err) or _is_attnlab_error(err):
        return f"error: {_one_line(str(err)) or type(err).__name__}", 2
    detail = _one_line(str(err))
    return (f"internal error: {type(err).__name__}{f': {detail}' if detail else ''} (a bug in attnlab; "
            f"rerun with {DEBUG_ENV}=1 for the traceback and report it)"), 1


_OS_MEANINGS = {  # what went wrong, and what was expected there
    "IsADirectoryError": "is a folder, expected a file",
    "NotADirectoryError": "is not a folder (a file stands where a folder was expected)",
    "FileExistsError": "already exists",
    "FileNotFoundError": "no such file or folder",
    "PermissionError": "permission denied",
}


def _os_error_message(err: OSError) -> str:
    """`PATH: what is wrong` from an OSError that carries a filename, else its own message. A
    reason the raiser wrote (`IsADirectoryError(EISDIR, "is a folder, expected a JSON file",
    path)`) is kept; the system's standard one is replaced by what was expected there."""
    if err.filename is None:
        text = str(err)
        return text.split("] ", 1)[1] if text.startswith("[Errno") and "] " in text else _one_line(text)
    standard = os.strerror(err.errno) if isinstance(err.errno, int) else None
    if err.strerror and err.strerror != standard:
        meaning = err.strerror
    else:
        meaning = _OS_MEANINGS.get(type(err).__name__) or (err.strerror or str(err)).lower()
    where = os.fsdecode(err.filename)
    if err.filename2 is not None:
        where = f"{where} -> {os.fsdecode(err.filename2)}"
    return f"{where}: {meaning}"


def _decode_error_message(err: UnicodeDecodeError) -> str:
    """`FILE is not UTF-8 text (...)`, the file found in the traceback's frames when the reader
    did not name it (see `_file_in_traceback`)."""
    name = _file_in_traceback(err)
    where = "standard input" if name == "<stdin>" else name or "an input file"
    bad = err.object[err.start:err.start + 1]
    byte = f"byte 0x{bad[0]:02x} at offset {err.start}" if isinstance(bad, (bytes, bytearray)) and bad else err.reason
    return f"{where}: expected UTF-8 text ({byte} is not {err.encoding})"


def _file_in_traceback(err: BaseException) -> str | None:
    """The name of the open text file whose reading raised `err`: a decode error happens inside
    `file.read()`, so the innermost frame holding an open text file is the reader's. A
    fallback for readers that do not name the file themselves (`attnlab.io.files.read_text`
    does)."""
    frames = []
    tb = err.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    for frame in reversed(frames):
        for value in frame.f_locals.values():
            if isinstance(value, io.TextIOWrapper) and isinstance(getattr(value, "name", None), str):
                return value.name
    return None


def _is_allocation_failure(err: BaseException) -> bool:
    """torch's way of running out of memory: a RuntimeError from its allocator (CPU), C++'s
    std::bad_alloc passed on as one (a container of millions of tensors, under a memory limit),
    or its OutOfMemoryError (GPU)."""
    if type(err).__name__ == "OutOfMemoryError":
        return True
    return isinstance(err, RuntimeError) and any(
        s in str(err) for s in ("DefaultCPUAllocator: not enough memory", "DefaultCPUAllocator: can't allocate memory",
                                "std::bad_alloc"))


def _is_decode_error(err: BaseException) -> bool:
    """A file that does not parse as what it should be: YAML, pickle, a zip archive or
    safetensors (checked by class, so that this module imports none of those libraries)."""
    import pickle
    import zipfile

    if isinstance(err, (EOFError, pickle.UnpicklingError, zipfile.BadZipFile)):
        return True
    names = {(c.__module__.split(".")[0], c.__name__) for c in type(err).__mro__}
    return ("yaml", "YAMLError") in names or any(n == "SafetensorError" for _, n in names)


def _is_attnlab_error(err: BaseException) -> bool:
    """attnlab's own error classes (DownloadError, WorkerError, ...) carry messages for users."""
    return any(c.__module__.startswith("attnlab.") for c in type(err).__mro__ if issubclass(c, Exception))


def _one_line(text: str) -> str:
    """`text` on one line: YAML and pip errors span several."""
    return " ".join(part.strip() for part in text.splitlines() if part.strip())


if __name__ == "__main__":
    sys.exit(main())
