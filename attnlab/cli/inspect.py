"""`attnlab inspect`: look inside models — attention maps, activation patching, attribution, cost,
gradient flow, rank collapse, kernel regression."""

from __future__ import annotations

import argparse
import os
import re

from attnlab.cli.argtypes import positive_float, positive_int
from attnlab.cli.inspect_patch import add_patch_parser


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


def _heads(text: str | None) -> list[int] | None:
    """`--heads 0,2` -> [0, 2]."""
    if text is None:
        return None
    try:
        return [int(h) for h in text.split(",")]
    except ValueError:
        raise ValueError(f"--heads expects comma-separated head indices such as 0,2, got {text!r}") from None


def _attention(args: argparse.Namespace) -> int:
    import torch

    from attnlab.inspect.attention_maps import attention_maps
    from attnlab.inspect.plots import plot_alignment, plot_head_grid
    from attnlab.inspect.viewer import token_labels
    from attnlab.io.weights import write_safetensors
    from attnlab.interop.serialization import load
    from attnlab.models.families import family

    model, tok = load(args.checkpoint, with_tokenizer=True)
    if _is_vit(model):
        return _image_attention(args, model)
    if args.image is not None or args.image_file is not None:
        raise ValueError(f"--image and --image-file are for a Vision Transformer; {args.checkpoint} holds "
                         f"arch={model.config.arch!r}, which reads text: give --text")
    if tok is None:
        raise ValueError(f"{args.checkpoint} has no tokenizer.json; save the model with attnlab.save(model, path, tokenizer=tok)")
    if args.text is None:
        raise ValueError("--text is needed: the input text (the source of an encoder-decoder)")
    arch, own = model.config.arch, family(model.config)
    src = tok.encode(args.text)
    if not src:
        raise ValueError("--text encodes to no tokens")
    heads = _heads(args.heads)
    if args.target is not None and not own.traits.has_source:
        raise ValueError(f"--target is for encoder-decoders (the text aligned with --text); {args.checkpoint} holds "
                         f"arch={arch!r}, whose maps are of --text alone: drop --target")
    if own.traits.has_source:
        if args.target is None:
            raise ValueError(f"--target is needed for arch={arch!r} (the target text to align with --text)")
        tgt = tok.encode(args.target)
        if not tgt:
            raise ValueError("--target encodes to no tokens")
        inputs = (torch.tensor([src]), torch.tensor([tgt]))
    else:
        tgt = src
        inputs = (torch.tensor([src]),)
    if args.max_tokens is not None and args.html is None:
        raise ValueError("--max-tokens applies to the --html page; add --html FILE (the PNGs show every token)")
    out = _output_folder(args)
    if args.html is not None:
        _attention_page(args, model, tok, src, tgt if len(inputs) == 2 else None, heads)
    if out is None:
        return 0
    maps = attention_maps(model, *inputs, names=args.layers or None, heads=heads)
    os.makedirs(out, exist_ok=True)
    write_safetensors({n: w.contiguous() for n, w in maps.items()}, os.path.join(out, "attention.safetensors"))
    src_tok, tgt_tok = token_labels(src, tok), token_labels(tgt, tok)
    for name, w in maps.items():
        w = w[0]  # (H, Tq, Tk)
        if own.is_alignment(name):
            path = plot_alignment(w.mean(0), src_tok, tgt_tok, os.path.join(out, f"{_safe(name)}.png"),
                                  title=f"{name} (mean over heads)" if w.shape[0] > 1 else name)
        else:
            path = plot_head_grid(w, os.path.join(out, f"{_safe(name)}.png"), row_names=[name], title=name)
        print(f"{name:<40} {tuple(w.shape)}  -> {path}")
    print(f"weights: {os.path.join(out, 'attention.safetensors')}")
    return 0


def _output_folder(args: argparse.Namespace) -> str | None:
    """The folder of the PNGs (None: only the --html page), after checking --out and --html."""
    if args.html is not None and (not args.html or os.path.isdir(args.html)):
        raise ValueError(f"--html {args.html!r} is not a file path; give one such as attention.html")
    out = args.out if args.out is not None or args.html is not None else "attention_maps"  # --html alone: the page
    if out is not None and os.path.exists(out) and not os.path.isdir(out):
        raise ValueError(f"--out {out} is a file; give a folder for the maps")
    return out


def _is_vit(model) -> bool:
    from attnlab.models.vision import VisionEncoder

    return isinstance(model, VisionEncoder)


def _read_image(args: argparse.Namespace, config):
    """The image of --image N (the digits test split of examples/vit_digits) or --image-file
    (a .npy array), as a float tensor (C, S, S), and a line saying what it is."""
    import numpy as np
    import torch

    from attnlab.inspect.patch_maps import DIGITS_TEST_FRACTION, DIGITS_SPLIT_SEED

    want = (config.channels, config.image_size, config.image_size)
    if args.image is not None:
        from attnlab.data.images import DIGITS_SIZE, load_digits, stratified_split

        if want != (1, DIGITS_SIZE, DIGITS_SIZE):
            raise ValueError(f"--image picks a {DIGITS_SIZE}x{DIGITS_SIZE} grey digit; {args.checkpoint} takes "
                             f"{' x '.join(map(str, want))} images: give --image-file FILE.npy")
        images, labels = load_digits()
        _, test = stratified_split(labels, DIGITS_TEST_FRACTION, seed=DIGITS_SPLIT_SEED)
        if not 0 <= args.image < len(test):
            raise ValueError(f"--image {args.image}: the digits test split has {len(test)} images, "
                             f"0..{len(test) - 1}")
        index = int(test[args.image])
        return images[index], f"digits test image {args.image} (digit #{index} of 1,797), label {int(labels[index])}"
    path = args.image_file
    if not os.path.isfile(path):
        raise FileNotFoundError(f"--image-file {path}: no such file (expected a .npy array)")
    try:
        array = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as err:
        raise ValueError(f"--image-file {path}: not a .npy array written by numpy.save ({err})") from None
    if not isinstance(array, np.ndarray) or array.dtype.kind not in "biuf":
        raise ValueError(f"--image-file {path}: expected a numeric array, got {getattr(array, 'dtype', type(array))}")
    image = torch.from_numpy(np.ascontiguousarray(array).astype(np.float32))
    if image.dim() == 2 and want[0] == 1:
        image = image[None]
    if tuple(image.shape) != want:
        raise ValueError(f"--image-file {path}: the array is {tuple(array.shape)}; {args.checkpoint} takes "
                         f"{' x '.join(map(str, want))} (channels, height, width)"
                         + (f" or {want[1]} x {want[2]}" if want[0] == 1 else ""))
    if not bool(torch.isfinite(image).all()):
        raise ValueError(f"--image-file {path}: the array has NaN or infinite values")
    return image, f"{path}, pixels {float(image.min()):g}..{float(image.max()):g}"


def _image_attention(args: argparse.Namespace, model) -> int:
    """`inspect attention` for a ViT: the PNGs of [CLS]'s and each patch's attention over the
    patch grid, the weights, and the --html page over `[CLS]`, `p(r,c)`."""
    import torch

    from attnlab.inspect.patch_maps import image_attention, image_view, plot_cls_attention, plot_patch_attention
    from attnlab.io.weights import write_safetensors

    name = args.checkpoint
    if args.text is not None or args.target is not None:
        raise ValueError(f"{name} holds a Vision Transformer, which reads images: give --image N or "
                         "--image-file FILE.npy instead of --text/--target")
    if (args.image is None) == (args.image_file is None):
        raise ValueError(f"{name} holds a Vision Transformer: give one of --image N (a digit of the digits test "
                         "split) or --image-file FILE.npy")
    if args.max_tokens is not None:
        raise ValueError(f"--max-tokens is for texts; the Vision Transformer in {name} reads all its "
                         f"{model.config.seq_len} tokens ([CLS] + patches)")
    out = _output_folder(args)
    heads = _heads(args.heads)
    image, what = _read_image(args, model.config)
    print(f"image: {what}")
    with torch.no_grad():
        logits = model(image[None].to(next(model.parameters()).device))
    if model.head is not None:
        probs = logits.float().softmax(-1)[0]
        print(f"predicted class {int(probs.argmax())} (p = {float(probs.max()):.3f})")
    grid = model.config.grid
    if args.html is not None:
        from attnlab.inspect.viewer import render_html
        from attnlab.io.files import atomic_write_text

        view = image_view(model, image, names=args.layers or None, heads=heads)
        title = f"{os.path.basename(os.path.normpath(name))}: {what}"
        path = atomic_write_text(args.html, render_html(view, title))
        print(f"viewer: {path} ({os.path.getsize(path) / 1024:.0f} KB; open it in a browser, it loads nothing)")
    if out is None:
        return 0
    maps = image_attention(model, image, names=args.layers or None, heads=heads)
    os.makedirs(out, exist_ok=True)
    write_safetensors({n: w[None].contiguous() for n, w in maps.items()}, os.path.join(out, "attention.safetensors"))
    print(f"{'[CLS] over the patches':<40} {len(maps)} module(s)  -> "
          f"{plot_cls_attention(image, maps, grid, os.path.join(out, 'cls.png'), heads=heads)}")
    for module, w in maps.items():
        path = plot_patch_attention(image, w, grid, os.path.join(out, f"{_safe(module)}.png"),
                                    title=f"{module}: each patch's attention over the {grid}x{grid} patches "
                                          f"(mean over {w.shape[0]} heads; red: the query)")
        print(f"{module:<40} {tuple(w.shape)}  -> {path}")
    print(f"weights: {os.path.join(out, 'attention.safetensors')}")
    return 0


def _attention_page(args: argparse.Namespace, model, tok, src: list[int], tgt: list[int] | None,
                    heads: list[int] | None) -> None:
    """The interactive viewer page of `inspect attention --html`."""
    from attnlab.inspect.viewer import MAX_TOKENS, capture_view, render_html
    from attnlab.io.files import atomic_write_text

    view = capture_view(model, src, tgt, tokenizer=tok, names=args.layers or None, heads=heads,
                        max_tokens=args.max_tokens or MAX_TOKENS)
    if view.notice:
        print(f"note: {view.notice}")
    title = f"{os.path.basename(os.path.normpath(args.checkpoint))}: {args.text[:60]}"
    path = atomic_write_text(args.html, render_html(view, title))
    for kind in view.kinds:
        print(f"{kind.label:<60} {len(kind.maps)} layer(s) x {kind.maps[0].weights.shape[0]} head(s)")
    print(f"viewer: {path} ({os.path.getsize(path) / 1024:.0f} KB; open it in a browser, it loads nothing)")


def _cost(args: argparse.Namespace) -> int:
    from attnlab.cli.model import resolve_config
    from attnlab.inspect.cost import cost_table, crossover_seq_len, format_table
    from attnlab.nn.kernels import KERNELS

    if args.kernel is not None and args.kernel not in KERNELS:
        raise ValueError(f"--kernel {args.kernel!r} is not a kernel; choose from {', '.join(KERNELS)}")
    cfg = resolve_config(args.config, args.set)
    rows = cost_table(cfg, args.seq_len, src_len=args.src_len, kernel=args.kernel)
    print(format_table(rows, bytes_per_element=args.bytes))
    attn = sum(r.flops for r in rows if r.name.endswith(".scores"))
    dense = sum(r.flops for r in rows if r.name.endswith((".projections", ".ffn")))
    t_star = crossover_seq_len(cfg)
    kernel = args.kernel or cfg.attention.kernel
    print(f"attention (scores + weighted sum, as kernel {kernel!r} computes them): {attn:,} FLOPs; "
          f"projections + FFN (T d^2 terms): {dense:,} FLOPs")
    print(f"for dense attention, 4 T^2 H Dh per self-attention layer overtakes the projections + FFN at "
          f"T* = {t_star:,.0f} (2 d_model + d_ff = {2 * cfg.d_model + cfg.d_ff:,} for plain multi-head attention); "
          f"T = {args.seq_len} is {'above' if args.seq_len > t_star else 'below'} it")
    return 0


def _gradient_flow(args: argparse.Namespace) -> int:
    from attnlab.inspect.gradient_flow import gradient_flow, plot_gradient_flow

    norms = {}
    for kind in ("rnn", "lstm", "transformer"):
        norms[kind] = gradient_flow(kind, seq_len=args.seq_len, spectral_norm=args.spectral_norm if kind == "rnn" else None,
                                    seed=args.seed)
        n = norms[kind]
        print(f"{kind:<12} ||dL/dh_k|| at distance 0: {float(n[-1]):.3e}, {args.seq_len - 1}: {float(n[0]):.3e}")
    print(f"plot: {plot_gradient_flow(norms, args.out)}")
    return 0


def _rank_collapse(args: argparse.Namespace) -> int:
    from attnlab.inspect.rank_collapse import VARIANTS, plot_rank_collapse, rank_collapse

    curves = {v: rank_collapse(v, depth=args.depth, seed=args.seed) for v in VARIANTS}
    for v, c in curves.items():
        print(f"{v:<14} relative residual: input {float(c[0]):.3f}, after {args.depth} layers {float(c[-1]):.3e}")
    print(f"plot: {plot_rank_collapse(curves, args.out)}")
    return 0


def _kernel_regression(args: argparse.Namespace) -> int:
    from attnlab.inspect.kernel_regression import kernel_regression_demo

    try:
        bandwidths = tuple(float(b) for b in args.bandwidths.split(","))
    except ValueError:
        raise ValueError(f"--bandwidths expects comma-separated numbers such as 0.1,0.5,2, got {args.bandwidths!r}") \
            from None
    if any(not 0 < b < 1e150 for b in bandwidths):  # scores divide by h**2, which must stay a finite float
        raise ValueError(f"--bandwidths must be positive numbers below 1e150, got {args.bandwidths!r}")
    errors = kernel_regression_demo(args.out, bandwidths=bandwidths, seed=args.seed)
    for h, e in errors.items():
        print(f"bandwidth {h:g}: mean squared error against the true curve {e:.4f}")
    print(f"plot: {args.out}")
    return 0


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("inspect", help="look inside models: attention maps, patching, attribution, cost, gradients, rank",
                                   description="Look inside models: attention maps, FLOPs and memory, gradient flow "
                                               "through time, rank collapse, attention as kernel regression.",
                                   epilog="example: attnlab inspect cost gpt2-small --seq-len 1024")
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)

    p = sub.add_parser("attention", help="attention weights of a saved model on a text (or a ViT on an image): PNGs, "
                                         "tensors, an HTML viewer",
                       epilog='examples: attnlab inspect attention run/model --text "the cat sat" --html attention.html\n'
                              '          attnlab inspect attention vit/model --image 3 --out vit_maps',
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", help="a folder written by attnlab.save(model, path, tokenizer=...)")
    p.add_argument("--text", help="the input (the source of an encoder-decoder); required but for a ViT")
    p.add_argument("--image", type=int, metavar="N", help="a Vision Transformer's input: image N of the digits test "
                                                          "split (examples/vit_digits: 20%%, stratified, seed 0)")
    p.add_argument("--image-file", metavar="FILE.npy", help="a Vision Transformer's input: an array saved by "
                                                            "numpy.save, (H, W) or (C, H, W), pixels as in training")
    p.add_argument("--target", help="the target text of an encoder-decoder (teacher-forced)")
    p.add_argument("--layers", nargs="*", help="attention module names or patterns, e.g. 'decoder.*.cross_attn'")
    p.add_argument("--heads", help="comma-separated head indices (default all)")
    p.add_argument("--out", help="output folder of the PNGs and attention.safetensors (default attention_maps/, "
                                 "none when only --html is given)")
    p.add_argument("--html", metavar="FILE", help="write an interactive viewer: one self-contained HTML page (head "
                                                   "view, model view, every attention kind); without --out, no PNGs")
    p.add_argument("--max-tokens", type=positive_int,
                   help="with --html: run and show at most N tokens per text; a longer one is cut to its first N "
                        "tokens, and the page says so (default 512)")
    p.set_defaults(func=_attention)

    add_patch_parser(sub)  # attnlab/cli/inspect_patch.py

    p = sub.add_parser("cost", help="parameters, FLOPs and activation memory per module",
                       epilog="example: attnlab inspect cost vaswani-base --seq-len 4096")
    p.add_argument("config", help="a preset name or a config.json path")
    p.add_argument("--seq-len", type=positive_int, required=True, help="tokens per sequence T")
    p.add_argument("--src-len", type=positive_int, help="source length of an encoder-decoder (default T)")
    p.add_argument("--kernel", help="count activation memory as this attention kernel holds it (a name that "
                                    "attention.kernel allows; default: the config's kernel)")
    p.add_argument("--bytes", type=positive_int, default=4, help="bytes per activation element (default 4)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config field")
    p.set_defaults(func=_cost)

    p = sub.add_parser("gradient-flow", help="||dL/dh_k|| against distance for RNN, LSTM, Transformer",
                       epilog="example: attnlab inspect gradient-flow --seq-len 50 --out grad.png")
    p.add_argument("--seq-len", type=positive_int, default=40)
    p.add_argument("--spectral-norm", type=positive_float, default=0.9, help="sigma_max of the RNN's W_h (default 0.9)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="gradient_flow.png")
    p.set_defaults(func=_gradient_flow)

    p = sub.add_parser("rank-collapse", help="distance from rank 1 across depth, with and without residuals",
                       epilog="example: attnlab inspect rank-collapse --depth 12 --out rank.png")
    p.add_argument("--depth", type=positive_int, default=12)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="rank_collapse.png")
    p.set_defaults(func=_rank_collapse)

    p = sub.add_parser("kernel-regression", help="Nadaraya-Watson regression as attention, plotted",
                       epilog="example: attnlab inspect kernel-regression --bandwidths 0.1,0.5,2 --out nw.png")
    p.add_argument("--bandwidths", default="0.1,0.5,2", help="comma-separated Gaussian bandwidths")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="kernel_regression.png")
    p.set_defaults(func=_kernel_regression)

    from attnlab.cli.inspect_attribute import add_attribute_parser

    add_attribute_parser(sub)
