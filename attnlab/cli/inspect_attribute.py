"""`attnlab inspect attribute`: which input tokens a prediction rests on — integrated gradients,
gradient x input, attention rollout and flow, the logit lens — of a saved text model on a text, as
PNGs, attribution.json and a page of the attention viewer. `attnlab.cli.inspect` registers it."""

from __future__ import annotations

import argparse
import os

from attnlab.cli.argtypes import positive_int

ATTRIBUTION_METHODS = ("ig", "grad_x_input", "rollout", "flow", "logit_lens")


def _attribute(args: argparse.Namespace) -> int:
    """`inspect attribute`: integrated gradients, gradient x input, rollout, flow or the logit lens
    of a saved text model on --text: PNGs, the numbers (attribution.json) and, with --html, a page
    of the attention viewer."""
    import json

    import torch

    from attnlab.inspect import attribution_views as views
    from attnlab.inspect.viewer import render_html, token_labels
    from attnlab.interop.serialization import load
    from attnlab.io.files import atomic_write_text
    from attnlab.models.families import family

    model, tok = load(args.checkpoint, with_tokenizer=True)
    own = family(model.config)
    if tok is None:
        raise ValueError(f"{args.checkpoint} has no tokenizer.json; save the model with attnlab.save(model, path, tokenizer=tok)")
    src = tok.encode(args.text)
    if not src:
        raise ValueError("--text encodes to no tokens")
    if args.html is not None and (not args.html or os.path.isdir(args.html)):
        raise ValueError(f"--html {args.html!r} is not a file path; give one such as attribution.html")
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        raise ValueError(f"--out {args.out} is a file; give a folder")
    has_source = own.traits.has_source
    if args.side is not None and not has_source:
        raise ValueError(f"--side is for encoder-decoders; {args.checkpoint} holds {own.description}: drop --side")
    if has_source:
        if args.target is None:
            raise ValueError(f"--target is needed for {own.description}: the target text, teacher-forced "
                             "(its log-likelihood is attributed)")
        tgt = tok.encode(args.target)
        if len(tgt) < 2:
            raise ValueError("--target must encode to at least 2 tokens (the first is read, the rest are scored)")
        inputs = (torch.tensor([src]), torch.tensor([tgt]))
    else:
        tgt, inputs = None, (torch.tensor([src]),)
    if args.method in ("ig", "grad_x_input") and not has_source and getattr(model, "head", None) is None:
        raise ValueError(f"--method {args.method} scores a predicted token; {args.checkpoint} holds {own.description} "
                         "without a head (it returns hidden states): use --method rollout or flow")
    if args.method == "logit_lens" and args.top_k > model.config.vocab_size:
        raise ValueError(f"--top-k {args.top_k} is more than the {model.config.vocab_size} tokens of the vocabulary")
    side = args.side or ("source" if has_source else None)
    shown = tgt if side == "target" else src
    labels = token_labels(shown, tok)
    os.makedirs(args.out, exist_ok=True)
    result: dict = {"checkpoint": args.checkpoint, "method": args.method, "text": args.text, "tokens": labels}
    page = None
    if args.method in ("ig", "grad_x_input"):
        from attnlab.inspect.attribution import gradient_x_input, integrated_gradients

        if has_source:  # the target's teacher-forced log-likelihood: position t predicts tgt[t + 1]
            nxt = inputs[1][:, 1:]

            def target(out):
                logp = torch.log_softmax(out[:, :-1].float(), -1)
                return logp.gather(-1, nxt.repeat(out.shape[0], 1)[..., None])[..., 0].sum(-1)

            what = f"log p({args.target!r} | {args.text!r})"
        else:
            target = tok.encode(args.target)[0] if args.target else None
            if args.target is not None and not tok.encode(args.target):
                raise ValueError("--target encodes to no tokens")
        common = dict(target=target, position=args.position, side=side)
        if args.method == "ig":
            att = integrated_gradients(model, *inputs, steps=args.steps, baseline=args.baseline, batch_points=32,
                                       **common)  # 32 points per forward pass: memory stays bounded
        else:
            att = gradient_x_input(model, *inputs, **common)
        if not has_source:
            what = f"log p({token_labels([int(att.target[0])], tok)[0]!r}) at position {args.position}"
        scores = att.scores[0]
        name = "integrated gradients" if args.method == "ig" else "gradient x input"
        path = views.plot_token_scores(scores, labels, os.path.join(args.out, f"{args.method}.png"),
                                       title=f"{name} of {what}")
        result.update(target=what, scores=scores.tolist(), value=float(att.value[0]))
        line = f"{name} of {what} = {float(att.value[0]):.4f}"
        if att.delta is not None:
            result.update(baseline=att.baseline, steps=args.steps, baseline_value=float(att.baseline_value[0]),
                          delta=float(att.delta[0]))
            line += (f"; baseline {att.baseline} {float(att.baseline_value[0]):.4f}; completeness error "
                     f"{float(att.delta[0]):.2e}")
        print(line)
        for label, v in sorted(zip(labels, scores.tolist()), key=lambda p: -abs(p[1]))[:10]:
            print(f"  {label!r:<20} {v:+.4f}")
        page = views.scores_view(scores, labels, what, side=side or "input", method=name)
    elif args.method in ("rollout", "flow"):
        from attnlab.inspect.attention_flow import attention_flow, attention_rollout, self_attention_maps
        from attnlab.inspect.plots import plot_heatmap

        stack = {"source": "encoder", "target": "decoder"}.get(side) if has_source else None
        maps = self_attention_maps(model, *inputs, stack=stack)
        rollouts = [attention_rollout(maps[:l + 1])[0] for l in range(len(maps))]
        if args.method == "flow":
            print(f"attention flow: {len(labels) ** 2} max-flow problems through {len(maps)} layers "
                  "(seconds for a sentence, minutes for a paragraph)")
        flow = attention_flow(maps)[0] if args.method == "flow" else None
        shown_map = flow if flow is not None else rollouts[-1]
        title = f"attention {args.method} over {len(maps)} layers (rows: positions, columns: input tokens)"
        path = plot_heatmap(shown_map, os.path.join(args.out, f"{args.method}.png"), x_labels=labels, y_labels=labels,
                            title=title, x_name="input token", y_name="position")
        result.update(rollout=rollouts[-1].tolist(), **({"flow": flow.tolist()} if flow is not None else {}))
        print(f"{title}; last position's top inputs: " + ", ".join(
            f"{labels[j]!r} {float(shown_map[-1, j]):.3f}" for j in shown_map[-1].argsort(descending=True)[:5]))
        page = views.rollout_view(rollouts, labels, flow)
    else:
        from attnlab.inspect.logit_lens import lens_top_tokens, logit_lens

        lens = logit_lens(model, *inputs)[:, 0]  # (L, T, V)
        ids, probs = lens_top_tokens(lens, k=args.top_k)  # (L, T, k)
        top = [[token_labels([int(i)], tok)[0] for i in row] for row in ids[..., 0]]
        path = views.plot_logit_lens(probs[..., 0], top, labels if not has_source else token_labels(tgt, tok),
                                     os.path.join(args.out, "logit_lens.png"),
                                     title="logit lens: each layer's top next token")
        result.update(top_ids=ids.tolist(), top_probs=probs.tolist())
        for l in range(ids.shape[0]):
            print(f"layer {l + 1:>2} at the last position: " + ", ".join(
                f"{token_labels([int(i)], tok)[0]!r} {float(p):.3f}" for i, p in zip(ids[l, -1], probs[l, -1])))
    print(f"plot: {path}")
    numbers = atomic_write_text(os.path.join(args.out, "attribution.json"), json.dumps(result, indent=1))
    print(f"numbers: {numbers}")
    if args.html is not None:
        if page is None:
            print("note: the logit lens has no attention-viewer page (its plot shows it); --html skipped")
        else:
            title = f"{os.path.basename(os.path.normpath(args.checkpoint))}: {args.method} on {args.text[:60]}"
            html = atomic_write_text(args.html, render_html(page, title))
            print(f"viewer: {html} ({os.path.getsize(html) / 1024:.0f} KB; open it in a browser, it loads nothing)")
    return 0


def _steps(text: str) -> int:
    """--steps: a whole number in [1, 4096] (beyond that the quadrature gains nothing, and a typo's
    10**9 points would run for days)."""
    value = positive_int(text)
    if value > 4096:
        raise argparse.ArgumentTypeError(f"at most 4096 integration points, got {value}")
    return value


def add_attribute_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("attribute", help="which input tokens a prediction rests on: integrated gradients, "
                                         "gradient x input, attention rollout/flow, the logit lens",
                       epilog='examples: attnlab inspect attribute run/model --text "the cat sat on the" --out attr\n'
                              '          attnlab inspect attribute run/model --text "the cat" --method flow '
                              '--html flow.html\n'
                              '          attnlab inspect attribute mt/model --text "das Haus" --target "<s> the house" '
                              '--side source',
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", help="a folder written by attnlab.save(model, path, tokenizer=...)")
    p.add_argument("--text", required=True, help="the input (the source of an encoder-decoder)")
    p.add_argument("--method", choices=ATTRIBUTION_METHODS, default="ig",
                   help="ig (integrated gradients, default), grad_x_input, rollout, flow (Abnar & Zuidema 2020), "
                        "logit_lens")
    p.add_argument("--target", help="decoder / masked-LM encoder: the token whose log-probability at --position is "
                                    "attributed (the first token of this text; default: the predicted one); "
                                    "encoder-decoder: the target text (teacher-forced; its log-likelihood)")
    p.add_argument("--position", type=int, default=-1, help="the output position of the scored token (default -1, "
                                                            "the last: the next token after --text)")
    p.add_argument("--side", choices=("source", "target"), help="encoder-decoder: attribute to the source (default) "
                                                                "or target tokens; rollout/flow: that side's stack")
    p.add_argument("--steps", type=_steps, default=50, help="ig: Gauss-Legendre points (default 50, at most 4096)")
    p.add_argument("--baseline", choices=("pad", "zeros"),
                   help="ig: the embeddings started from: the pad token's at every position (the default where "
                        "the model has a pad token) or zeros (the default without one, as GPT-2)")
    p.add_argument("--top-k", type=positive_int, default=3, help="logit_lens: tokens listed per layer (default 3)")
    p.add_argument("--out", default="attribution", help="output folder of the PNG and attribution.json "
                                                        "(default attribution/)")
    p.add_argument("--html", metavar="FILE", help="also write a page of the attention viewer (ig, grad_x_input, "
                                                   "rollout, flow)")
    p.set_defaults(func=_attribute)
