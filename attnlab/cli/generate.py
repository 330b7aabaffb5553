"""`attnlab generate CKPT --prompt TEXT`: continue a prompt with a saved model, streaming the
new text to the terminal as it is produced (greedy by default; sampling or beam search on
request). CKPT is a folder written by `attnlab.save(model, path, tokenizer=...)`."""

from __future__ import annotations

import argparse
import sys
import warnings
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported when a command runs, so that building the parser stays light
    import torch

_EXTRAPOLATING = ("rotary", "sinusoidal")  # positions computed for any index, but trained on max_len of them
_SAMPLING_FLAGS = ("temperature", "top_k", "top_p")


def load_checkpoint(path: str) -> tuple[torch.nn.Module, Any]:
    """(model, tokenizer) from a folder written by `attnlab.save`; an error without a tokenizer."""
    from attnlab.interop.serialization import load

    model, tokenizer = load(path, with_tokenizer=True)
    if tokenizer is None:
        raise ValueError(f"{path} has no tokenizer.json: save the model with attnlab.save(model, path, tokenizer=tok)")
    return model, tokenizer


def role_id(tokenizer: Any, role: str) -> int | None:
    """The id of the tokenizer's `role` token (eos, pad, bos), or None."""
    token = getattr(tokenizer, "roles", {}).get(role)
    return tokenizer.token_to_id(token) if token is not None else None


def pad_batch(rows: list[list[int]], pad: int, *, left: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Token lists -> (ids (B, T), mask (B, T)), padded on the left (prompts) or right (sources)."""
    import torch

    if any(not r for r in rows):
        raise ValueError("an input is empty after tokenization: give at least one token")
    T = max(len(r) for r in rows)
    ids = torch.full((len(rows), T), pad, dtype=torch.long)
    mask = torch.zeros(len(rows), T, dtype=torch.long)
    for b, r in enumerate(rows):
        sl = slice(T - len(r), T) if left else slice(0, len(r))
        ids[b, sl] = torch.tensor(r)
        mask[b, sl] = 1
    return ids, mask


def new_text(tokenizer: Any, ids: list[int], eos: int | None) -> str:
    """Text of new token ids, cut at the first EOS, special tokens dropped."""
    if eos is not None and eos in ids:
        ids = ids[:ids.index(eos)]
    return tokenizer.decode(ids, skip_special_tokens=True)


def default_max_new_tokens(model: torch.nn.Module, prompt_len: int, usual: int) -> int:
    """What --max-new-tokens is when not given: `usual`, or fewer where the model's positions
    end. A fixed table (learned, binary positions) has position.max_len slots and refuses
    more; rotary and sinusoidal positions were never trained past it (past a prompt that is
    already longer, `usual` stands, with check_length's warning). An explicit value beyond
    the limit stays the user's: refused by `generate` for a table, warned about otherwise.

    Args:
        prompt_len: tokens of the longest prompt, or 1 (an encoder-decoder's start token).
    """
    from attnlab.config.families import traits
    from attnlab.decoding.generate import TABLE_SCHEMES

    config = model.config
    pos = getattr(config, "position", None)
    limited = TABLE_SCHEMES + _EXTRAPOLATING
    own = traits(getattr(config, "arch", None))
    if (own is not None and own.recurrent) or pos is None or pos.scheme not in limited:
        return usual  # no positions, or relative ones (relative, alibi, t5_bias) without a fixed end
    room = pos.max_len - prompt_len
    if room <= 0 and pos.scheme in _EXTRAPOLATING:
        return usual
    return max(1, min(usual, room))  # (a table with no room left: generate names the limit)


def decoding_kwargs(args: argparse.Namespace, tokenizer: Any) -> dict[str, Any]:
    """generate() keyword arguments from the shared decoding flags; a warning for sampling
    flags given without --sample (greedy and beam search ignore them).

    Raises:
        ValueError: a --seed outside [0, 2**63).
    """
    import torch

    eos = args.eos_token_id if args.eos_token_id is not None else role_id(tokenizer, "eos")
    pad = role_id(tokenizer, "pad")
    kw = dict(max_new_tokens=args.max_new_tokens, num_beams=args.num_beams, length_penalty=args.length_penalty,
              repetition_penalty=args.repetition_penalty, no_repeat_ngram_size=args.no_repeat_ngram_size,
              eos_token_id=eos, pad_token_id=pad)
    if not 0 <= args.seed < 2 ** 63:
        raise ValueError(f"--seed must be in [0, 2**63), got {args.seed}")
    if args.sample:
        kw.update(do_sample=True, temperature=1.0 if args.temperature is None else args.temperature,
                  top_k=args.top_k, top_p=args.top_p, generator=torch.Generator().manual_seed(args.seed))
    else:
        ignored = [f"--{name.replace('_', '-')}" for name in _SAMPLING_FLAGS if getattr(args, name) is not None]
        if ignored:
            warnings.warn(f"{', '.join(ignored)} only apply with --sample; without it decoding is "
                          f"{'beam search' if args.num_beams > 1 else 'greedy'} and ignores them", stacklevel=2)
    return kw


def check_length(model: torch.nn.Module, *, rows: int, prompt_len: int, max_new_tokens: int,
                 source_len: int | None = None) -> None:
    """Refuse a decoding that cannot fit in memory, and warn when it runs past the context the
    model was built for with positions that extrapolate (rotary, sinusoidal). Learned and
    binary positions have a fixed table: `generate` refuses those itself.

    The memory needed is counted before anything is allocated: generate() reserves the output
    ids and the key/value cache for prompt + max_new_tokens tokens per row up front.

    Args:
        rows: sequences decoded at once (prompts x beams).
        prompt_len: tokens of the longest prompt (decoder) or 1 (an encoder-decoder's start token).
        source_len: tokens of the longest source of an encoder-decoder (None for a decoder).

    Raises:
        ValueError: more memory than this machine has free, naming --max-new-tokens and the
            largest value that fits.
    """
    if max_new_tokens < 0:
        return  # generate() refuses it with its own message
    config = model.config
    length = prompt_len + max_new_tokens
    per_token = _bytes_per_token(model)
    available = available_memory()
    if available is not None and rows * length * per_token > available:
        fits = max(0, available // (rows * per_token) - prompt_len)
        raise ValueError(f"--max-new-tokens {max_new_tokens:,}: decoding {rows} row(s) of up to {length:,} tokens "
                         f"needs about {rows * length * per_token / 2 ** 30:,.1f} GiB (output ids and key/value "
                         f"cache), more than the {available / 2 ** 30:.1f} GiB of memory available; the model's "
                         f"context is {config.position.max_len} tokens and at most about {fits:,} new tokens fit here")
    pos = config.position
    if pos.scheme not in _EXTRAPOLATING:
        return
    past = (f"the model's context of {pos.max_len} tokens (position.max_len, {pos.scheme} positions): it never saw "
            "positions beyond it")
    if source_len is not None and source_len > pos.max_len:
        warnings.warn(f"a source of {source_len} tokens is longer than {past}", stacklevel=2)
    if length > pos.max_len:
        text = (f"an output of up to {length} tokens (--max-new-tokens {max_new_tokens})" if source_len is not None
                else f"the prompt ({prompt_len} tokens) + --max-new-tokens {max_new_tokens} = {length} tokens")
        warnings.warn(f"{text} runs past {past}, and text past that point usually degrades", stacklevel=2)


def _bytes_per_token(model: torch.nn.Module) -> int:
    """Bytes one token of one row takes while decoding: its id, mask and position, and its keys
    and values in every decoder layer."""
    from attnlab.models.families import family

    config = model.config
    element = next(model.parameters()).element_size()
    layers = family(config).decoder_layers(config)  # 0 for a recurrent decoder: its state is not per token
    kv = 2 * layers * config.resolved_num_kv_heads * config.resolved_head_dim * element
    return 8 + 1 + 8 + kv


def available_memory() -> int | None:
    """Bytes of memory available to this process (Linux: MemAvailable), or None when unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def add_decoding_flags(parser: argparse.ArgumentParser, *, max_new: int, beams: int) -> None:
    parser.add_argument("--max-new-tokens", type=int, default=None,
                        help=f"at most this many new tokens (default {max_new}, or fewer where the model's positions "
                             "end: position.max_len less the prompt, or less the start token of a translation)")
    parser.set_defaults(usual_max_new_tokens=max_new)
    parser.add_argument("--sample", action="store_true", help="sample instead of greedy/beam search")
    parser.add_argument("--temperature", type=float, default=None, help="sampling temperature (> 0; default 1)")
    parser.add_argument("--top-k", type=int, default=None, help="sample among the k most likely tokens")
    parser.add_argument("--top-p", type=float, default=None, help="nucleus sampling: smallest set with mass >= p")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sampler (default 0)")
    parser.add_argument("--num-beams", type=int, default=beams, help=f"beam search width (default {beams})")
    parser.add_argument("--length-penalty", type=float, default=1.0,
                        help="beam score = sum log p / new_tokens ** this (default 1.0)")
    parser.add_argument("--repetition-penalty", type=float, default=1.0,
                        help="CTRL's penalty (> 1 discourages repeats)")
    parser.add_argument("--no-repeat-ngram-size", type=int, default=0, help="forbid repeating n-grams of this size")
    parser.add_argument("--eos-token-id", type=int, default=None, help="end token (default: the tokenizer's eos)")
    parser.add_argument("--weights", choices=["fp32", "bf16", "int8"], default="fp32",
                        help="store the model's Linear weights in this precision while decoding (weight-only; "
                             "int8 has one scale per output channel): fewer bytes read per token, slightly less "
                             "accurate; on a 2-core CPU int8 decoded 1.7-2.4x and bf16 1.2-1.5x faster than fp32; "
                             "the first use compiles a C++ kernel (about 15 s, needs g++): see "
                             "docs/concepts/decoding.md, 'Reduced-precision weights'; default fp32, exact")


def decoding_weights(model: torch.nn.Module, weights: str) -> torch.nn.Module:
    """The model with its Linear weights stored as --weights says (in place; fp32: as it is)."""
    if weights == "fp32":
        return model
    from attnlab.decoding.quantize import quantize_weights

    return quantize_weights(model, weights, inplace=True)


class _Streamer:
    """Prints the new text of row 0 as tokens arrive; holds back a trailing partial character."""

    def __init__(self, tokenizer: Any, eos: int | None, out: Any):
        self.tokenizer, self.eos, self.out = tokenizer, eos, out
        self.ids: list[int] = []
        self.printed = 0
        self.done = False

    def __call__(self, tokens: torch.Tensor) -> None:  # (N,) the new token of each row
        if self.done:
            return
        token = int(tokens[0])
        if self.eos is not None and token == self.eos:
            self.done = True
            return
        self.ids.append(token)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if text.endswith("\ufffd"):  # an unfinished UTF-8 sequence (byte-level BPE): wait for the rest
            return
        self.out.write(text[self.printed:])
        self.out.flush()
        self.printed = len(text)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "generate", help="continue a prompt with a saved model (streams to the terminal)", description=__doc__,
        epilog='example: attnlab generate runs/char-gpt --prompt "Shall I compare" --max-new-tokens 100 '
               "--sample --top-p 0.9 --seed 1",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", help="folder written by attnlab.save(model, path, tokenizer=...)")
    parser.add_argument("--prompt", action="append", required=True,
                        help="text to continue (repeat the flag for a batch; only one prompt streams)")
    parser.add_argument("--stop", action="append", default=None, help="stop once the new text contains this string")
    parser.add_argument("--add-special-tokens", action="store_true",
                        help="wrap the prompt with the tokenizer's template")
    parser.add_argument("--no-stream", action="store_true", help="print the result at the end only")
    shots = parser.add_argument_group("few-shot prompting (each --prompt becomes the query after k solved examples)")
    shots.add_argument("--few-shot", metavar="FILE.jsonl",
                       help="solved examples, one JSON object per line with the template's fields "
                            '(default template: {"input": ..., "output": ...})')
    shots.add_argument("--template", default=None,
                       help="how an example reads, {output} last (default: 'Input: {input}\nOutput: {output}'; "
                            "write \n for a line break)")
    shots.add_argument("--shots", type=int, default=None, help="examples to use (default: all)")
    shots.add_argument("--shot-seed", type=int, default=None,
                       help="draw the --shots examples at random with this seed (default: the first ones)")
    shots.add_argument("--instruction", default="", help="text before the examples")
    add_decoding_flags(parser, max_new=50, beams=1)
    parser.set_defaults(func=run)


def few_shot_prompts(args: argparse.Namespace) -> list[str]:
    """Each --prompt as the query of a few-shot prompt built from --few-shot's examples (the
    prompts themselves without --few-shot); generation then stops at the example separator
    unless --stop says otherwise.

    Raises:
        ValueError: a few-shot flag without --few-shot, a line that is not a JSON object, no
            examples, or a template/shots the examples cannot fill (naming the file and line).
    """
    if args.few_shot is None:
        if args.template is not None or args.shots is not None or args.shot_seed is not None or args.instruction:
            raise ValueError("--template, --shots, --shot-seed and --instruction shape a few-shot prompt: "
                             "give the examples with --few-shot FILE.jsonl")
        return list(args.prompt)
    import json

    from attnlab.decoding.prompts import FewShotPrompt
    from attnlab.io.files import read_text

    examples = []
    for n, line in enumerate(read_text(args.few_shot).splitlines(), 1):
        if not line.strip():
            continue
        try:
            example = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{args.few_shot}: line {n} is not JSON ({err.msg})") from None
        if not isinstance(example, dict):
            raise ValueError(f"{args.few_shot}: line {n} is a {type(example).__name__}; expected a JSON object "
                             'such as {"input": "...", "output": "..."}')
        examples.append(example)
    if not examples:
        raise ValueError(f"{args.few_shot}: no examples (one JSON object per line)")
    template = (args.template or FewShotPrompt.template).replace("\\n", "\n")
    prompt = FewShotPrompt(template, instruction=args.instruction)
    if args.stop is None:
        args.stop = [prompt.example_separator]
    try:
        return [prompt.build(examples, query, k=args.shots, seed=args.shot_seed) for query in args.prompt]
    except (ValueError, TypeError) as err:
        raise ValueError(f"{args.few_shot}: {err}") from None


def run(args: argparse.Namespace) -> int:
    from attnlab.decoding import generate

    args.prompt = few_shot_prompts(args)
    model, tokenizer = load_checkpoint(args.checkpoint)
    model = decoding_weights(model, args.weights)
    seq2seq = hasattr(model, "encode")
    if seq2seq:  # a source, formatted as in training (template, then EOS)
        from attnlab.data.objectives import encoder_source

        rows = [encoder_source(tokenizer, p, special_tokens=args.add_special_tokens) for p in args.prompt]
    else:
        rows = [tokenizer.encode(p, add_special_tokens=args.add_special_tokens) for p in args.prompt]
    pad = role_id(tokenizer, "pad")
    ids, mask = pad_batch(rows, pad if pad is not None else 0, left=True)
    start = 1 if seq2seq else ids.shape[1]
    if args.max_new_tokens is None:
        args.max_new_tokens = default_max_new_tokens(model, start, args.usual_max_new_tokens)
    kw = decoding_kwargs(args, tokenizer)
    if args.stop:
        kw.update(stop_strings=args.stop, tokenizer=tokenizer)
    check_length(model, rows=len(rows) * max(1, args.num_beams), prompt_len=start, max_new_tokens=args.max_new_tokens,
                 source_len=ids.shape[1] if seq2seq else None)
    stream = len(rows) == 1 and args.num_beams == 1 and not args.no_stream
    streamer = _Streamer(tokenizer, kw["eos_token_id"], sys.stdout) if stream else None
    if stream and not seq2seq:
        sys.stdout.write(args.prompt[0])
        sys.stdout.flush()
    out = generate(model, ids, attention_mask=mask, streamer=streamer, **kw)
    if stream:
        sys.stdout.write("\n")
        return 0
    for b, prompt in enumerate(args.prompt):
        text = new_text(tokenizer, out[b, start:].tolist(), kw["eos_token_id"])
        print(text if seq2seq else prompt + text)
    return 0
