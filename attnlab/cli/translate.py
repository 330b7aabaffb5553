"""`attnlab translate CKPT`: translate one sentence per line with a saved encoder-decoder.

Reads a file (or stdin), sorts the lines by length so that each batch holds sentences of
similar length (little padding), decodes them with beam search (4 beams by default), and
writes the translations in the input order to a file (written atomically) or stdout, with a
progress line on stderr. Empty lines stay empty. CKPT is a folder written by
`attnlab.save(model, path, tokenizer=...)` or an `attnlab train` run folder. With `--reference`
(the correct translations, line by line) it also prints sacrebleu's corpus BLEU and chrF as JSON
on stderr."""

from __future__ import annotations

import argparse
import sys

from attnlab.cli.generate import (add_decoding_flags, check_length, decoding_kwargs, decoding_weights,
                                  default_max_new_tokens, load_checkpoint, new_text, pad_batch, role_id)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "translate", help="translate a file or stdin, one sentence per line", description=__doc__,
        epilog="example: attnlab translate runs/en-de --input test.en --output test.de --reference test.ref.de",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", help="folder written by attnlab.save(model, path, tokenizer=...)")
    parser.add_argument("--input", default="-", help="source file, one sentence per line ('-' = stdin, the default)")
    parser.add_argument("--output", default="-", help="where to write the translations ('-' = stdout, the default)")
    parser.add_argument("--batch-size", type=int, default=32, help="sentences per batch (default 32)")
    parser.add_argument("--decoder-start-token-id", type=int, default=None,
                        help="first target token (default: the tokenizer's bos, else the model's pad)")
    parser.add_argument("--no-special-tokens", action="store_true",
                        help="feed the bare pieces: no template, no EOS (by default a source is formatted as "
                             "in training: the tokenizer's template, then EOS unless the template ends with it)")
    parser.add_argument("--reference", default=None,
                        help="the correct translations, one per input line: print BLEU and chrF (sacrebleu) on stderr")
    parser.add_argument("--quiet", action="store_true", help="no progress line")
    add_decoding_flags(parser, max_new=128, beams=4)
    parser.set_defaults(func=run)


def _read_lines(path: str) -> list[str]:
    """The lines of a UTF-8 file, or of stdin for '-'.

    Raises:
        ValueError: not UTF-8 (naming the file, or standard input).
    """
    from attnlab.io.files import read_text

    if path != "-":
        return read_text(path, expected="UTF-8 text, one sentence per line").splitlines()
    try:
        return sys.stdin.read().splitlines()
    except UnicodeDecodeError as err:
        raise ValueError(f"standard input: expected UTF-8 text, one sentence per line ({err.reason} at offset "
                         f"{err.start})") from None


def run(args: argparse.Namespace) -> int:
    from attnlab.decoding import generate
    from attnlab.io.files import atomic_write_text, json_text
    from attnlab.io.progress import Progress

    if args.batch_size <= 0:
        raise ValueError(f"--batch-size must be a positive integer, got {args.batch_size}")
    lines = _read_lines(args.input)
    references = _read_lines(args.reference) if args.reference else None
    if references is not None and len(references) != len(lines):
        raise ValueError(f"--reference {args.reference} has {len(references)} lines, the input {len(lines)}: "
                         "give one reference per source line")
    model, tokenizer = load_checkpoint(args.checkpoint)
    if not hasattr(model, "encode"):
        raise ValueError(f"{args.checkpoint} holds a decoder-only model; translate needs an encoder-decoder "
                         "(use `attnlab generate` to continue prompts)")
    model = decoding_weights(model, args.weights)
    if args.max_new_tokens is None:  # the target starts with one token
        args.max_new_tokens = default_max_new_tokens(model, 1, args.usual_max_new_tokens)
    kw = decoding_kwargs(args, tokenizer)
    start = args.decoder_start_token_id
    if start is None:
        start = role_id(tokenizer, "bos")
    pad = role_id(tokenizer, "pad")
    pad = pad if pad is not None else (model.config.pad_token_id or 0)
    from attnlab.data.objectives import encoder_source

    sources = [encoder_source(tokenizer, line, special_tokens=not args.no_special_tokens) for line in lines]
    todo = sorted((i for i, s in enumerate(sources) if lines[i].strip()), key=lambda i: -len(sources[i]))
    if todo:
        check_length(model, rows=min(len(todo), args.batch_size) * max(1, args.num_beams), prompt_len=1,
                     max_new_tokens=args.max_new_tokens, source_len=len(sources[todo[0]]))
    results = [""] * len(lines)
    progress = Progress(total=len(todo), unit="sent", desc="translate", enabled=not args.quiet)
    for k in range(0, len(todo), args.batch_size):
        batch = todo[k:k + args.batch_size]
        ids, mask = pad_batch([sources[i] for i in batch], pad, left=False)
        out = generate(model, ids, attention_mask=mask, decoder_start_token_id=start, **kw)
        for row, i in enumerate(batch):
            results[i] = new_text(tokenizer, out[row, 1:].tolist(), kw["eos_token_id"])
        progress.update(len(batch))
    progress.close()
    text = "".join(r + "\n" for r in results)
    if args.output == "-":
        sys.stdout.write(text)
    else:
        atomic_write_text(args.output, text)
    if not args.quiet:
        print(f"summary: {len(todo)} sentences translated ({len(lines) - len(todo)} empty lines kept empty)",
              file=sys.stderr)
    if references is not None:
        from attnlab.evaluation import bleu_chrf

        scores = {name: round(value, 2) for name, value in bleu_chrf(results, references).items()}
        print("scores: " + json_text({**scores, "sentences": len(lines), "beams": args.num_beams}), file=sys.stderr)
    return 0
