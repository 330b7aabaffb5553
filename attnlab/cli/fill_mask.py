"""`attnlab fill-mask MODEL TEXT [TEXT ...]`: what a masked-LM encoder (BERT) predicts at each
[MASK] of a text, with probabilities — e.g.
`attnlab fill-mask runs/bert-mlm "The [MASK] statement is used to import a module."`

MODEL is an `attnlab train` run with data.objective masked_lm (examples/bert_mlm.yaml), a folder
`attnlab.save` wrote, or a Hugging Face BertForMaskedLM folder. The text is wrapped in the
tokenizer's template ([CLS] ... [SEP]) unless --no-special-tokens; write the tokenizer's own mask
token ([MASK] for BERT's). Each mask is predicted with the others still masked. Columns: rank,
probability, token id, vocabulary entry (`##ing` continues a word).
"""

from __future__ import annotations

import argparse
import json


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("fill-mask", help="a masked LM's top tokens at each [MASK] of a text",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                   epilog='example: attnlab fill-mask runs/bert-mlm "The [MASK] statement is used '
                                          'to import a module." --top-k 5')
    parser.add_argument("model", help="an attnlab train run (masked_lm), an attnlab.save folder, or a Hugging Face "
                                      "BERT folder")
    parser.add_argument("texts", nargs="+", metavar="text", help="text with one or more mask tokens ([MASK])")
    parser.add_argument("--top-k", type=int, default=5, help="tokens to show per mask (default 5)")
    parser.add_argument("--tokenizer", default=None,
                        help="tokenizer file or folder (default: the model folder's tokenizer.json or vocab.txt)")
    parser.add_argument("--no-special-tokens", action="store_true",
                        help="do not wrap the text in [CLS] ... [SEP] (a model trained on bare windows: an "
                             "attnlab masked_lm run without data.nsp)")
    parser.add_argument("--json", action="store_true", help="print one JSON object per text")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from attnlab.decoding.fill_mask import fill_mask, load_masked_lm

    if args.top_k < 1:
        raise ValueError(f"--top-k must be at least 1, got {args.top_k}")
    model, tokenizer = load_masked_lm(args.model, args.tokenizer)  # once for all the texts
    results = [fill_mask(model, text, top_k=args.top_k, tokenizer=tokenizer,
                         add_special_tokens=not args.no_special_tokens) for text in args.texts]
    for n, (text, masks) in enumerate(zip(args.texts, results)):
        if args.json:
            print(json.dumps({"text": text, "masks": masks}, ensure_ascii=False))
            continue
        if n:
            print()
        if len(args.texts) > 1:
            print(text)
        _print_table(masks)
    return 0


def _print_table(masks: list[list[dict]]) -> None:
    """One block per mask: rank, probability, id, token, columns aligned."""
    width = max(len(str(c["id"])) for predictions in masks for c in predictions)
    for m, predictions in enumerate(masks, 1):
        print(f"mask {m} of {len(masks)}" if len(masks) > 1 else "mask")
        print(f"  {'rank':>4}  {'prob':>7}  {'id':>{width}}  token")
        for rank, c in enumerate(predictions, 1):
            print(f"  {rank:>4}  {c['probability']:7.4f}  {c['id']:>{width}}  {c['token']}")
