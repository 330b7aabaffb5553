"""`attnlab score MODEL TEXT [TEXT ...]`: the log-probability a language model gives each text,
most likely first — e.g. `attnlab score runs/lm "turn off the lights" "off turn the lights"`.

MODEL is a folder `attnlab.save` wrote or an `attnlab train` run folder. For an encoder-decoder
give the source with `--source` (one for all texts, or one per text): it scores P(text | source).
Columns: total log-probability (nats), scored tokens, per-token mean, perplexity. A decoder-only
model scores every token after the tokenizer's beginning-of-sequence token, or after the first
token when it has none. An encoder (a masked LM: its prediction at a position sees the token
there) is refused; `attnlab fill-mask` shows what a masked LM predicts.
"""

from __future__ import annotations

import argparse

from attnlab.io.files import json_text


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("score", help="log-probability of texts under a language model", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter,
                                   epilog='example: attnlab score runs/lm "turn off the lights" "off turn the lights"')
    parser.add_argument("model", help="folder written by attnlab.save, or an attnlab train run folder")
    parser.add_argument("texts", nargs="*", help="texts to score")
    parser.add_argument("--file", help="more texts, one per line (blank lines skipped)")
    parser.add_argument("--source", action="append", default=None,
                        help="encoder-decoders: the source text (once for all texts, or once per text)")
    parser.add_argument("--eos", action="store_true", help="score the end-of-sequence token after each text too")
    parser.add_argument("--json", action="store_true", help="print one JSON object per text")
    parser.set_defaults(func=run)


def _texts(args: argparse.Namespace) -> list[str]:
    texts = list(args.texts)
    if args.file:
        from attnlab.io.files import read_text

        lines = [line for line in read_text(args.file).splitlines() if line.strip()]
        if not lines:
            raise ValueError(f"{args.file}: no text to score (the file is empty or blank)")
        texts += lines
    if not texts:
        raise ValueError("give texts to score (arguments or --file)")
    return texts


def run(args: argparse.Namespace) -> int:
    from attnlab.cli.generate import load_checkpoint
    from attnlab.decoding.scoring import score_texts

    texts = _texts(args)
    sources = args.source
    if sources is not None and len(sources) == 1:
        sources = sources * len(texts)
    model, tokenizer = load_checkpoint(args.model)
    scores = score_texts(model, tokenizer, texts, sources=sources, with_eos=args.eos)
    ranked = sorted(scores, key=lambda s: -s.log_prob)
    if args.json:
        for s in ranked:
            print(json_text({"text": s.text, "log_prob": s.log_prob, "tokens": s.tokens, "mean": s.mean,
                              "perplexity": s.perplexity}))
        return 0
    print(f"{'log P':>10} {'tokens':>6} {'mean':>8} {'ppl':>9}  text")
    for s in ranked:
        print(f"{s.log_prob:10.3f} {s.tokens:6d} {s.mean:8.3f} {s.perplexity:9.2f}  {s.text}")
    return 0
