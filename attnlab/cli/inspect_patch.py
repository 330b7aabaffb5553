"""`attnlab inspect patch`: activation patching of a saved model on a clean and a corrupted text,
written as PNG heatmaps, viewer pages (attnlab.inspect.viewer) and patch.json."""

from __future__ import annotations

import argparse
import os

PATCH_OVER = ("resid", "attn_out", "ffn_out", "heads", "pattern")


def _patch_token(tok, text: str, flag: str) -> int:
    """--target/--wrong: a token of the vocabulary, or a text that encodes to exactly one token."""
    found = tok.token_to_id(text) if hasattr(tok, "token_to_id") else None
    if found is not None:
        return int(found)
    ids = tok.encode(text)
    if len(ids) != 1:
        raise ValueError(f"{flag} {text!r} encodes to {len(ids)} tokens; give one token of the vocabulary")
    return ids[0]


def _patch_sweeps(own, over: str, src_labels: list[str], tgt_labels: list[str]) -> list[tuple[str, str, str, list[str] | None]]:
    """(file stem, points, by, column labels) of each sweep that --over asks of this family."""
    if own.traits.recurrent:
        if over == "resid":
            return [("resid_memory", "hook_memory", "position", src_labels)]
        if over == "pattern":
            return [("pattern_alignment", "attention.hook_pattern", "position", tgt_labels)]
        raise ValueError(f"--over {over}: a recurrent encoder-decoder has no such point; choose resid (its memory, "
                         "over source positions) or pattern (its alignment, over target positions)")
    sides = [("encoder", "encoder.", src_labels), ("decoder", "decoder.", tgt_labels)] if own.traits.has_source \
        else [("", "", tgt_labels)]
    sweeps = []
    for side, prefix, labels in sides:
        stem = f"{over}_{side}" if side else over
        if over in ("resid", "attn_out", "ffn_out"):
            point = "hook_resid_pre" if over == "resid" else f"hook_{over}"
            sweeps.append((stem, f"{prefix}layers.*.{point}", "position", labels))
        else:
            point = "hook_z" if over == "heads" else "hook_pattern"
            sweeps.append((stem, f"{prefix}layers.*.self_attn.{point}", "head", None))
            if side == "decoder":
                sweeps.append((f"{over}_cross", f"{prefix}layers.*.cross_attn.{point}", "head", None))
    return sweeps


def _patch(args: argparse.Namespace) -> int:
    import json

    import torch

    from attnlab.inspect.patching import activation_patching, logit_diff, target_logprob
    from attnlab.inspect.patching_plots import plot_patching, write_patching_html
    from attnlab.inspect.viewer import token_labels
    from attnlab.interop.serialization import load
    from attnlab.io.files import atomic_write_text
    from attnlab.models.families import family

    if os.path.exists(args.out) and not os.path.isdir(args.out):
        raise ValueError(f"--out {args.out} is a file; give a folder for the heatmaps")
    model, tok = load(args.checkpoint, with_tokenizer=True)
    if _is_vit(model):
        raise ValueError(f"{args.checkpoint} holds a Vision Transformer; inspect patch takes models that read text")
    if tok is None:
        raise ValueError(f"{args.checkpoint} has no tokenizer.json; save the model with attnlab.save(model, path, tokenizer=tok)")
    model.eval()
    own = family(model.config)
    clean, corrupted = tok.encode(args.clean), tok.encode(args.corrupted)
    if not clean or not corrupted:
        raise ValueError("--clean and --corrupted must encode to at least one token each")
    if len(clean) != len(corrupted):
        raise ValueError(f"--clean and --corrupted must encode to the same number of tokens (patching copies "
                         f"position by position): --clean is {len(clean)} tokens, --corrupted {len(corrupted)}")
    if own.traits.has_source:
        if args.prefix is None:
            raise ValueError(f"--prefix is needed for arch={model.config.arch!r}: the target text so far (teacher-forced); "
                             "--target is the token predicted after it")
        prefix = tok.encode(args.prefix)
        if not prefix:
            raise ValueError("--prefix encodes to no tokens")
        inputs = ((torch.tensor([clean]), torch.tensor([prefix])), (torch.tensor([corrupted]), torch.tensor([prefix])))
    elif args.prefix is not None:
        raise ValueError(f"--prefix is for encoder-decoders; arch={model.config.arch!r} reads --clean/--corrupted alone")
    else:
        prefix, inputs = clean, (torch.tensor([clean]), torch.tensor([corrupted]))
    if not -len(prefix) <= args.position < len(prefix):
        raise ValueError(f"--position {args.position} is outside the {len(prefix)} output positions "
                         f"({'--prefix' if own.traits.has_source else '--clean'} tokens; -1 is the last)")
    target = _patch_token(tok, args.target, "--target")
    if args.wrong is not None:
        metric, what = logit_diff(target, _patch_token(tok, args.wrong, "--wrong"), position=args.position), \
            f"logit[{args.target!r}] - logit[{args.wrong!r}]"
    else:
        metric, what = target_logprob(target, position=args.position), f"log p({args.target!r})"
    src_labels, tgt_labels = token_labels(clean, tok), token_labels(prefix, tok)
    sweeps = _patch_sweeps(own, args.over, src_labels, tgt_labels)
    print(f"patching {args.direction}: {what} at position {args.position}, over {args.over} "
          f"({len(sweeps)} sweep{'s' if len(sweeps) > 1 else ''}, {len(clean)} tokens)")
    os.makedirs(args.out, exist_ok=True)
    summary = {"metric": what, "direction": args.direction, "over": args.over, "sweeps": {}}
    for stem, points, by, labels in sweeps:
        result = activation_patching(model, inputs[0], inputs[1], metric, points, by=by, direction=args.direction)
        title = f"{points}: {args.direction} ({what})"
        png = plot_patching(result, os.path.join(args.out, f"patch_{stem}.png"), column_labels=labels, title=title)
        page = write_patching_html(os.path.join(args.out, f"patch_{stem}.html"), result, column_labels=labels,
                                   title=title)
        score = result.normalised()
        best = int(torch.nan_to_num(score, nan=float("-inf")).argmax())
        row, col = divmod(best, score.shape[1])
        print(f"{points:<40} clean {result.clean:.4f}, corrupted {result.corrupted:.4f}; highest score "
              f"{float(score[row, col]):.3f} at {result.rows[row]} {result.axis} {result.columns[col]}  -> {png}, {page}")
        summary["sweeps"][stem] = {"points": points, "by": by, "rows": result.rows, "columns": result.columns,
                                   "axis": result.axis, "clean": result.clean, "corrupted": result.corrupted,
                                   "values": result.values.tolist(), "png": png, "html": page}
    path = atomic_write_text(os.path.join(args.out, "patch.json"), json.dumps(summary, indent=1, allow_nan=True))
    print(f"results: {path}")
    return 0



def _is_vit(model) -> bool:
    from attnlab.models.vision import VisionEncoder

    return isinstance(model, VisionEncoder)


def add_patch_parser(sub: argparse._SubParsersAction) -> None:
    """The `patch` action under `attnlab inspect`."""
    p = sub.add_parser("patch", help="activation patching from a clean into a corrupted text: PNG heatmaps and an "
                                     "HTML view of which layers, positions and heads restore the answer",
                       epilog='example: attnlab inspect patch run/model --clean "When Mary and John went, John gave '
                              'it to" --corrupted "When Mary and John went, Mary gave it to" --target " Mary" '
                              '--wrong " John" --over resid --out patching',
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", help="a model folder (attnlab.save(model, path, tokenizer=...)), an attnlab train run "
                                      "folder (its best checkpoint) or one of its checkpoints")
    p.add_argument("--clean", required=True, help="the clean text (the source of an encoder-decoder)")
    p.add_argument("--corrupted", required=True, help="the corrupted text, the same number of tokens as --clean")
    p.add_argument("--target", required=True, help="the token the clean run should predict (a vocabulary token, "
                                                   "or a text of one token)")
    p.add_argument("--wrong", help="a competing token: the metric is then logit[target] - logit[wrong] "
                                   "(default: log p(target))")
    p.add_argument("--prefix", help="an encoder-decoder's target text so far (teacher-forced); --target follows it")
    p.add_argument("--position", type=int, default=-1, help="the output position the metric reads (default -1: the last)")
    p.add_argument("--over", choices=PATCH_OVER, default="resid",
                   help="resid: each layer's incoming stream x positions; attn_out, ffn_out: the sublayers' outputs x "
                        "positions; heads: each head's output (hook_z), layers x heads; pattern: each head's "
                        "attention pattern, layers x heads (default resid)")
    p.add_argument("--direction", choices=("denoise", "noise"), default="denoise",
                   help="denoise: run the corrupted text, copy from the clean run; noise: the reverse (default denoise)")
    p.add_argument("--out", default="patching", help="output folder: patch_*.png, patch_*.html, patch.json (default patching/)")
    p.set_defaults(func=_patch)

