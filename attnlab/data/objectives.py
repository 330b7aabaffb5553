"""Pretraining objectives: pure functions from token ids and a `torch.Generator` to a batch.

Notation: B batch, T sequence length, V vocabulary; labels use IGNORE (-100) where no loss is
taken (PyTorch's `cross_entropy` default `ignore_index`).

| objective            | paper                                                                   | returns |
|----------------------|-------------------------------------------------------------------------|---------|
| `causal_lm`          | Radford et al. 2018, https://openai.com/research/language-unsupervised | input_ids, labels |
| `masked_lm`          | Devlin et al. 2019, https://arxiv.org/abs/1810.04805 (3.1)              | input_ids, labels |
| `span_masked_lm`     | Joshi et al. 2020 (SpanBERT), https://arxiv.org/abs/1907.10529 (3.1-2)  | input_ids, labels (+ span_left, span_right) |
| `span_corruption`    | Raffel et al. 2020, https://arxiv.org/abs/1910.10683 (3.1.4)            | input_ids, labels |
| `prefix_lm`          | Raffel et al. 2020 (3.2.1); Dong et al. 2019                            | input_ids, labels, prefix_lengths |
| `encoder_decoder_lm` | Raffel et al. 2020 (3.2.3; "prefix language modeling", Tables 3-4)     | seq2seq's, prefix_lengths |
| `next_sentence`      | Devlin et al. 2019 (3.1, task 2)                                        | input_ids, token_type_ids, nsp_labels |
| `segment_pairs`      | (draws A, its next segment and a random one for `next_sentence`)        | first, second, random_second |
| `seq2seq`            | Sutskever et al. 2014; Vaswani et al. 2017                              | src_ids, src_mask, tgt_ids, tgt_mask, labels |
| `pairs_lm`           | Liu et al. 2018 (T-D), https://arxiv.org/abs/1801.10198 (4.2.2)         | input_ids, attention_mask, labels |
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch
from torch import Tensor

IGNORE = -100


def _check_ids(name: str, ids: Tensor, min_len: int = 1) -> None:
    if not isinstance(ids, Tensor) or ids.dim() != 2 or ids.dtype != torch.long:
        raise ValueError(f"{name} must be a LongTensor (B, T), got "
                         f"{tuple(ids.shape) if isinstance(ids, Tensor) else type(ids).__name__}")
    if ids.shape[1] < min_len:
        raise ValueError(f"{name} needs at least {min_len} tokens per row, got {ids.shape[1]}")


def _check_masking(ids: Tensor, mask_prob: float, replace_probs: tuple[float, float]) -> None:
    """The arguments every masking objective shares: ids, the masked share, the 80/10/10 split."""
    _check_ids("ids", ids)
    if not 0.0 < mask_prob < 1.0:
        raise ValueError(f"mask_prob must be in (0, 1), got {mask_prob}")
    p_mask, p_random = replace_probs
    if p_mask < 0 or p_random < 0 or p_mask + p_random > 1:
        raise ValueError(f"replace_probs must be two non-negative numbers summing to <= 1, got {replace_probs}")


def _special_table(ids: Tensor, vocab_size: int, special_ids: Sequence[int]) -> Tensor:
    """Bool per id (at least vocab_size, and every id in `ids`): True for the special ids."""
    special = torch.zeros(max(vocab_size, int(ids.max()) + 1), dtype=torch.bool)
    special[list(special_ids)] = True
    return special


def causal_lm(windows: Tensor, generator: torch.Generator | None = None) -> dict[str, Tensor]:
    """Next-token prediction on packed windows (documents joined with EOS in the stream).

    Args:
        windows: (B, T + 1) consecutive token ids.
        generator: unused (the objective is deterministic); kept for a uniform signature.

    Returns:
        `input_ids` (B, T) = windows[:, :-1], `labels` (B, T) = windows[:, 1:].
    """
    _check_ids("windows", windows, 2)
    return {"input_ids": windows[:, :-1].contiguous(), "labels": windows[:, 1:].contiguous()}


def prefix_lm(windows: Tensor, generator: torch.Generator, *, min_prefix: int = 1) -> dict[str, Tensor]:
    """Prefix LM: a random prefix of each row is seen bidirectionally and takes no loss; the
    rest is predicted left to right. Decoders take `prefix_lengths` in forward.

    Args:
        windows: (B, T + 1) token ids.
        generator: draws each row's prefix length uniformly in [min_prefix, T - 1].
        min_prefix: shortest prefix.

    Returns:
        `input_ids` (B, T), `labels` (B, T) with IGNORE on the first prefix_length - 1
        positions (position prefix_length - 1 predicts the first target token), and
        `prefix_lengths` (B,).
    """
    _check_ids("windows", windows, 3)
    B, T = windows.shape[0], windows.shape[1] - 1
    if not 1 <= min_prefix <= T - 1:
        raise ValueError(f"min_prefix must be in [1, {T - 1}] for T={T}, got {min_prefix}")
    batch = causal_lm(windows)
    prefix = torch.randint(min_prefix, T, (B,), generator=generator)
    positions = torch.arange(T)[None]
    batch["labels"] = batch["labels"].masked_fill(positions < (prefix[:, None] - 1), IGNORE)
    batch["prefix_lengths"] = prefix
    return batch


def masked_lm(ids: Tensor, generator: torch.Generator, *, vocab_size: int, mask_id: int,
              special_ids: Sequence[int] = (), mask_prob: float = 0.15, replace_probs: tuple[float, float] = (0.8, 0.1),
              word_starts: Tensor | None = None, attention_mask: Tensor | None = None) -> dict[str, Tensor]:
    """BERT's masked LM: pick `mask_prob` of the tokens; of those, 80% become [MASK], 10% a
    random token, 10% stay; the loss is on the picked positions only.

    Args:
        ids: (B, T) token ids.
        generator: all random choices.
        vocab_size: random replacements are drawn from [0, vocab_size) minus `special_ids`.
        mask_id: the [MASK] id.
        special_ids: never picked ([CLS], [SEP], [PAD], ...) and never drawn as replacements.
        mask_prob: probability that a (word) position is picked.
        replace_probs: (to [MASK], to random); the rest stay unchanged.
        word_starts: (B, T) bool, True where a word begins (WordPiece: not a `##` piece):
            whole-word masking picks words and masks all their pieces together.
        attention_mask: (B, T), 0 on padding (never picked).

    Returns:
        `input_ids` (B, T) corrupted, `labels` (B, T) original ids where picked, else IGNORE.
    """
    _check_masking(ids, mask_prob, replace_probs)
    p_mask, p_random = replace_probs
    special = _special_table(ids, vocab_size, special_ids)
    eligible = ~special[ids]
    if attention_mask is not None:
        eligible &= attention_mask.bool()
    if word_starts is None:
        picked = (torch.rand(ids.shape, generator=generator) < mask_prob) & eligible
    else:
        if word_starts.shape != ids.shape:
            raise ValueError(f"word_starts must have the shape of ids {tuple(ids.shape)}, got {tuple(word_starts.shape)}")
        word_id = torch.cumsum(word_starts.long(), dim=1)  # (B, T): index of the word each piece belongs to
        word_picked = torch.rand(ids.shape[0], ids.shape[1] + 1, generator=generator) < mask_prob
        picked = torch.gather(word_picked, 1, word_id) & eligible
    labels = ids.masked_fill(~picked, IGNORE)
    u = torch.rand(ids.shape, generator=generator)
    to_mask = picked & (u < p_mask)
    to_random = picked & (u >= p_mask) & (u < p_mask + p_random)
    allowed = torch.nonzero(~special[:vocab_size]).squeeze(1)
    random_ids = allowed[torch.randint(0, len(allowed), ids.shape, generator=generator)]
    corrupted = torch.where(to_mask, torch.full_like(ids, mask_id), ids)
    corrupted = torch.where(to_random, random_ids, corrupted)
    return {"input_ids": corrupted, "labels": labels}


def span_length_probs(p: float = 0.2, max_length: int = 10) -> Tensor:
    """SpanBERT's span lengths: a geometric distribution P(L = k) = p (1 - p)^(k - 1) cut at
    `max_length` and renormalised over k = 1..max_length -> (max_length,) float64, entry k - 1
    being P(L = k). With p = 0.2 and 10 the mean is 3.80 (the paper's 3.8); piling the cut-off
    mass on `max_length` instead would give a mean of 4.46.

    Raises:
        ValueError: p outside (0, 1], or max_length below 1.
    """
    if not 0.0 < p <= 1.0:
        raise ValueError(f"p must be in (0, 1], got {p}")
    if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1:
        raise ValueError(f"max_length must be an integer >= 1, got {max_length!r}")
    k = torch.arange(1, max_length + 1, dtype=torch.float64)
    weights = p * (1 - p) ** (k - 1)
    return weights / weights.sum()


def _place_spans(word_len: np.ndarray, word_ok: np.ndarray, budget: int, cdf: np.ndarray,
                 generator: torch.Generator) -> list[tuple[int, int]]:
    """One row's spans as (first word, word count): lengths drawn from the length distribution
    (`cdf`: its cumulative probabilities), each placed at a uniform start among those where its
    words are all `word_ok` and none of them or of their two neighbours is in a span already
    (spans never touch: each keeps an unmasked word on both sides, the boundary SpanBERT's SBO
    reads). Drawing goes on while fewer than `budget` tokens are in spans; a length that fits
    nowhere is drawn again, and a row with no placeable word left stops."""
    n = len(word_len)
    taken = np.zeros(n + 2, dtype=bool)  # padded by one word each side
    spans: list[tuple[int, int]] = []
    covered, draws, used = 0, np.empty(0), 0
    while covered < budget:
        free = word_ok & ~taken[:-2] & ~taken[1:-1] & ~taken[2:]  # word w and both neighbours untaken
        if not free.any():
            break
        if used == len(draws):  # uniforms in blocks, two per span (length, start): one call, not two per span
            draws, used = torch.rand(2 * (budget - covered) + 2, generator=generator, dtype=torch.float64).numpy(), 0
        u_length, u_start = draws[used], draws[used + 1]
        used += 2
        length = min(int(np.searchsorted(cdf, u_length, side="right")), len(cdf) - 1) + 1
        if length > n:
            continue
        run = np.concatenate([[0], np.cumsum(free)])
        starts = np.nonzero(run[length:] - run[:-length] == length)[0]  # windows of `length` free words
        if not len(starts):
            continue
        first = int(starts[int(u_start * len(starts))])
        taken[first + 1: first + 1 + length] = True
        spans.append((first, length))
        covered += int(word_len[first: first + length].sum())
    return spans


def span_boundaries(labels: Tensor, attention_mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Where SpanBERT's span-boundary objective reads each masked token from: the positions s - 1
    and e + 1 just outside its span s..e, a span being a maximal run of labelled positions
    (`span_masked_lm`'s spans never touch, so its runs are its spans).

    A span whose boundary falls outside the row (it starts at 0 or ends at T - 1) or on padding
    (attention_mask 0) gives no target: both are -1 there, as at every unlabelled position.

    Example: labels [-100, 7, 8, -100, 9] -> span_left [-1, 0, 0, -1, -1], span_right [-1, 3, 3, -1, -1]
    (the span at 4 ends the row: no right boundary).

    Args:
        labels: (B, T), IGNORE where not masked.
        attention_mask: (B, T), 0 on padding.

    Returns:
        (span_left, span_right), each (B, T) long.
    """
    _check_ids("labels", labels)
    B, T = labels.shape
    picked = labels != IGNORE
    pos = torch.arange(T).expand(B, T)
    first = picked & ~_shifted(picked, 1)  # a run starts here
    last = picked & ~_shifted(picked, -1)  # a run ends here
    start = torch.where(first, pos, -1).cummax(1).values  # (B, T): the latest run start at or before each position
    end = torch.where(last, pos, T).flip(1).cummin(1).values.flip(1)  # the earliest run end at or after it
    left, right = start - 1, end + 1
    ok = picked & (left >= 0) & (right < T)
    if attention_mask is not None:
        real = attention_mask.bool()
        ok &= torch.gather(real, 1, left.clamp(0, T - 1)) & torch.gather(real, 1, right.clamp(0, T - 1))
    return torch.where(ok, left, -1), torch.where(ok, right, -1)


def _shifted(x: Tensor, shift: int) -> Tensor:
    """x (B, T) bool moved `shift` places along T (1: x[t - 1] at t), False where nothing moved in."""
    out = torch.zeros_like(x)
    if shift > 0:
        out[:, shift:] = x[:, :-shift]
    else:
        out[:, :shift] = x[:, -shift:]
    return out


def span_masked_lm(ids: Tensor, generator: torch.Generator, *, vocab_size: int, mask_id: int,
                   special_ids: Sequence[int] = (), word_starts: Tensor | None = None, mask_prob: float = 0.15,
                   geometric_p: float = 0.2, max_span_words: int = 10, replace_probs: tuple[float, float] = (0.8, 0.1),
                   attention_mask: Tensor | None = None, span_boundary: bool = False) -> dict[str, Tensor]:
    """SpanBERT's span masking: contiguous spans of whole words are masked instead of single
    tokens, until `mask_prob` of a row's tokens are; a span's length in words is drawn from a
    geometric distribution (`span_length_probs`), and each span is replaced as a unit: 80% of
    spans become all [MASK], 10% random tokens, 10% stay (BERT's rule, applied per span).

    The budget rule: a row's budget is round(mask_prob * its maskable tokens), at least 1 (the
    maskable: not special, not padding). Spans are drawn while fewer tokens than the budget are
    masked, and the last one is kept whole, so a row masks at least its budget and exceeds it by
    less than that last span's tokens (SpanBERT's code cuts the last span at the budget instead,
    which would split words). The excess is about half a span per row: with words of 1.4 tokens,
    17.7% of 128-token rows are masked, 16.2% of 256, 15.8% of 512. A row too crowded to place
    another span stops below its budget.

    Spans never touch (an unmasked word between any two, so the masked runs of the output are
    the spans), never cover a special token, and a length that fits nowhere in the row is drawn
    again: in crowded rows long spans are a little rarer than the distribution says.

    Args:
        ids: (B, T) token ids.
        generator: all random choices.
        vocab_size: random replacements are drawn from [0, vocab_size) minus `special_ids`.
        mask_id: the [MASK] id.
        special_ids: never masked ([CLS], [SEP], [PAD], ...), never drawn as replacements, and
            words of their own.
        word_starts: (B, T) bool, True where a word begins (attnlab.tokenizers.boundaries.word_starts);
            None: every token is a word.
        mask_prob: the share of maskable tokens to mask (the budget).
        geometric_p, max_span_words: the span length distribution, in words.
        replace_probs: (to [MASK], to random) per span; the rest stay unchanged.
        attention_mask: (B, T), 0 on padding (never masked).
        span_boundary: also return the span-boundary objective's inputs (`span_boundaries`).

    Returns:
        `input_ids` (B, T) corrupted, `labels` (B, T) original ids where masked, else IGNORE; with
        `span_boundary`, `span_left` and `span_right` (B, T): the positions just outside each
        masked token's span, -1 where it has no SBO target. The draws do not depend on it.
    """
    _check_masking(ids, mask_prob, replace_probs)
    p_mask, p_random = replace_probs
    cdf = span_length_probs(geometric_p, max_span_words).cumsum(0).numpy()
    special = _special_table(ids, vocab_size, special_ids)
    blocked = special[ids]  # (B, T) never masked; words of their own
    if attention_mask is not None:
        blocked |= ~attention_mask.bool()
    if word_starts is None:
        starts = torch.ones_like(ids, dtype=torch.bool)
    elif word_starts.shape != ids.shape:
        raise ValueError(f"word_starts must have the shape of ids {tuple(ids.shape)}, got {tuple(word_starts.shape)}")
    else:
        starts = word_starts.bool().clone()
    starts |= blocked
    starts[:, 1:] |= blocked[:, :-1]
    starts[:, 0] = True
    word_id = (torch.cumsum(starts.long(), dim=1) - 1).numpy()  # (B, T) each token's word in its row
    span_of = np.full(ids.shape, -1, dtype=np.int64)  # (B, T) each masked token's span (batch-wide index)
    num_spans = 0
    for row in range(ids.shape[0]):
        words = word_id[row]
        word_len = np.bincount(words)
        word_ok = np.bincount(words, weights=blocked[row].numpy()) == 0
        maskable = int((~blocked[row]).sum())
        if maskable == 0:
            continue
        budget = max(1, int(mask_prob * maskable + 0.5))
        span_word = np.full(len(word_len), -1, dtype=np.int64)
        for first, length in _place_spans(word_len, word_ok, budget, cdf, generator):
            span_word[first: first + length] = num_spans
            num_spans += 1
        span_of[row] = span_word[words]
    span_of = torch.from_numpy(span_of)
    picked = span_of >= 0
    labels = ids.masked_fill(~picked, IGNORE)
    u = torch.rand(num_spans + 1, generator=generator)[span_of.clamp(min=0)]  # one draw per span, shared by its tokens
    to_mask = picked & (u < p_mask)
    to_random = picked & (u >= p_mask) & (u < p_mask + p_random)
    allowed = torch.nonzero(~special[:vocab_size]).squeeze(1)
    random_ids = allowed[torch.randint(0, len(allowed), ids.shape, generator=generator)]  # a token of its own each
    corrupted = torch.where(to_mask, torch.full_like(ids, mask_id), ids)
    corrupted = torch.where(to_random, random_ids, corrupted)
    batch = {"input_ids": corrupted, "labels": labels}
    if span_boundary:
        batch["span_left"], batch["span_right"] = span_boundaries(labels, attention_mask)
    return batch


def _random_segmentation(n_items: int, n_segments: int, generator: torch.Generator) -> Tensor:
    """Split n_items into n_segments positive lengths, uniformly over such splits -> (n_segments,)."""
    cuts = torch.randperm(n_items - 1, generator=generator)[: n_segments - 1] + 1
    bounds = torch.cat([torch.zeros(1, dtype=torch.long), cuts.sort().values, torch.tensor([n_items])])
    return bounds.diff()


def span_noise_counts(length: int, noise_density: float, mean_span_length: float) -> tuple[int, int]:
    """(noise tokens, noise spans) of a row of `length` tokens under `span_noise_mask`: they depend
    on the length alone, so every row of a span-corruption batch has the same lengths.

    Example:
        >>> span_noise_counts(100, 0.15, 3.0)
        (15, 5)
    """
    num_noise = min(max(int(round(length * noise_density)), 1), length - 1)
    num_spans = max(int(round(num_noise / mean_span_length)), 1)
    return num_noise, min(num_spans, num_noise, length - num_noise)


def span_noise_mask(length: int, noise_density: float, mean_span_length: float,
                    generator: torch.Generator) -> Tensor:
    """T5's random span mask for one row -> bool (length,), True on noise.

    round(length * noise_density) noise tokens (at least 1) in round(noise / mean_span_length)
    spans (at least 1), span and gap lengths drawn as random segmentations, starting with a
    gap (non-noise).
    """
    num_noise, num_spans = span_noise_counts(length, noise_density, mean_span_length)
    noise = _random_segmentation(num_noise, num_spans, generator)
    keep = _random_segmentation(length - num_noise, num_spans, generator)
    lengths = torch.stack([keep, noise], dim=1).reshape(-1)  # keep, noise, keep, noise, ...
    flags = torch.tensor([False, True]).repeat(num_spans)
    return torch.repeat_interleave(flags, lengths)


def span_corruption(ids: Tensor, generator: torch.Generator, *, sentinel_ids: Sequence[int], eos_id: int | None,
                    noise_density: float = 0.15, mean_span_length: float = 3.0) -> dict[str, Tensor]:
    """T5's span corruption: each noise span in the input is replaced by one sentinel; the
    target lists each sentinel followed by the tokens it hid, then a final sentinel
    (`inputs: Thank you <X> me to your party <Y> week. targets: <X> for inviting <Y> last <Z>`),
    both ending in EOS.

    Args:
        ids: (B, L) token ids.
        generator: span positions.
        sentinel_ids: ids of <extra_id_0>, <extra_id_1>, ... (enough for every span + 1).
        eos_id: appended to inputs and targets (None: nothing appended).
        noise_density: fraction of tokens corrupted.
        mean_span_length: mean length of a noise span.

    Returns:
        `input_ids` (B, Li) and `labels` (B, Lt): every row has the same lengths (the number
        of noise tokens and spans depend only on L).
    """
    _check_ids("ids", ids, 2)
    if not 0.0 < noise_density < 1.0:
        raise ValueError(f"noise_density must be in (0, 1), got {noise_density}")
    if not mean_span_length >= 1.0:
        raise ValueError(f"mean_span_length must be >= 1, got {mean_span_length}")
    inputs, targets = [], []
    tail = [eos_id] if eos_id is not None else []
    for row in ids:
        noise = span_noise_mask(len(row), noise_density, mean_span_length, generator)
        starts = noise & ~torch.cat([torch.tensor([False]), noise[:-1]])
        if int(starts.sum()) + 1 > len(sentinel_ids):
            raise ValueError(f"sentinel_ids has {len(sentinel_ids)} ids; {int(starts.sum()) + 1} are needed")
        inp, tgt, span = [], [], -1
        for token, is_noise, is_start in zip(row.tolist(), noise.tolist(), starts.tolist()):
            if is_start:
                span += 1
                inp.append(sentinel_ids[span])
                tgt.append(sentinel_ids[span])
            (tgt if is_noise else inp).append(token)
        tgt.append(sentinel_ids[span + 1])
        inputs.append(inp + tail)
        targets.append(tgt + tail)
    return {"input_ids": torch.tensor(inputs), "labels": torch.tensor(targets)}


def encoder_decoder_lm(windows: Tensor, generator: torch.Generator, *, pad_id: int, start_id: int, eos_id: int,
                       min_prefix: int = 1, min_target: int = 1) -> dict[str, Tensor]:
    """T5's prefix language modeling for an encoder-decoder: each window is cut at a random
    point; the encoder reads the prefix, the decoder writes the rest (teacher-forced). The
    decoder-only `prefix_lm` is the same task in one stack.

    Example (window "Thank you for inviting me to your party", cut after 4 tokens):
    src "Thank you for inviting </s>", tgt_ids "<start> me to your party", labels "me to your party </s>".

    Args:
        windows: (B, L) token ids.
        generator: draws each row's cut (the prefix length) uniformly in [min_prefix, L - min_target].
        pad_id, start_id, eos_id: padding, the decoder's first input, the end token appended to
            the source and to the labels (as `seq2seq`).
        min_prefix, min_target: the fewest tokens on each side.

    Returns:
        `seq2seq`'s batch of (window[:cut], window[cut:]) rows: `src_ids` (B, S), `src_mask`,
        `tgt_ids` (B, Tt), `tgt_mask`, `labels` (B, Tt), right-padded; and `prefix_lengths` (B,),
        the cuts.
    """
    _check_ids("windows", windows, 2)
    L = windows.shape[1]
    if min_prefix < 1 or min_target < 1 or min_prefix + min_target > L:
        raise ValueError(f"min_prefix and min_target must be >= 1 and sum to at most the window length {L}, "
                         f"got {min_prefix} and {min_target}")
    cut = torch.randint(min_prefix, L - min_target + 1, (windows.shape[0],), generator=generator)
    rows = windows.tolist()
    batch = seq2seq([r[:c] for r, c in zip(rows, cut.tolist())], [r[c:] for r, c in zip(rows, cut.tolist())],
                    pad_id=pad_id, bos_id=start_id, eos_id=eos_id)
    batch["prefix_lengths"] = cut
    return batch


def next_sentence(first: Tensor, second: Tensor, random_second: Tensor, generator: torch.Generator, *,
                  cls_id: int, sep_id: int) -> dict[str, Tensor]:
    """BERT's next-sentence prediction: `[CLS] A [SEP] B [SEP]` where B is the true next
    segment with probability 1/2 (label 0, IsNext) and a random one otherwise (label 1).

    Args:
        first: (B, Ta) segments A; second: (B, Tb) their true continuations;
        random_second: (B, Tb) segments from elsewhere in the corpus.
        generator: the coin flips.

    Returns:
        `input_ids` (B, Ta + Tb + 3), `token_type_ids` (0 on A and its [CLS]/[SEP], 1 on B),
        `nsp_labels` (B,).
    """
    for name, t in (("first", first), ("second", second), ("random_second", random_second)):
        _check_ids(name, t)
    if second.shape != random_second.shape or first.shape[0] != second.shape[0]:
        raise ValueError("second and random_second must have one shape, and the batch size of first")
    B = first.shape[0]
    is_random = torch.rand(B, generator=generator) < 0.5
    b = torch.where(is_random[:, None], random_second, second)
    cls = torch.full((B, 1), cls_id)
    sep = torch.full((B, 1), sep_id)
    ids = torch.cat([cls, first, sep, b, sep], dim=1)
    types = torch.cat([torch.zeros(B, first.shape[1] + 2, dtype=torch.long),
                       torch.ones(B, b.shape[1] + 1, dtype=torch.long)], dim=1)
    return {"input_ids": ids, "token_type_ids": types, "nsp_labels": is_random.long()}


def segment_pairs(tokens, offsets, batch_size: int, len_a: int, len_b: int,
                  generator: torch.Generator) -> tuple[Tensor, Tensor, Tensor]:
    """Segments for next-sentence prediction, drawn from a corpus of documents.

    A is `len_a` consecutive tokens at a uniform random position among those where A and the
    `len_b` tokens after it fit inside one document; "second" is those next `len_b` tokens;
    "random_second" is `len_b` consecutive tokens from a different document (uniform over
    positions). Segments are token spans, not linguistic sentences.

    Args:
        tokens: 1-D token ids of all documents back to back (an array or a memmap; only the
            drawn spans are read).
        offsets: (num_documents + 1,) start offset of each document, then the end.
        batch_size: B.
        len_a, len_b: segment lengths (>= 1).
        generator: every random choice.

    Returns:
        `first` (B, len_a), `second` (B, len_b), `random_second` (B, len_b), LongTensors.

    Raises:
        ValueError: a length below 1, no document long enough for A + B, or no second
            document long enough for B.
    """
    for name, value in (("batch_size", batch_size), ("len_a", len_a), ("len_b", len_b)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    offsets = torch.as_tensor(offsets, dtype=torch.long)
    lengths = offsets.diff()  # (num_documents,)
    pair_starts = (lengths - (len_a + len_b) + 1).clamp(min=0)  # valid start positions per document
    b_starts = (lengths - len_b + 1).clamp(min=0)
    if int(pair_starts.sum()) == 0:
        raise ValueError(f"no document holds {len_a + len_b} tokens (len_a + len_b); use a shorter data.seq_len")
    if int((b_starts > 0).sum()) < 2:
        raise ValueError(f"next-sentence prediction needs two documents of at least {len_b} tokens (len_b), "
                         f"found {int((b_starts > 0).sum())}")
    docs = torch.multinomial(pair_starts.double(), batch_size, replacement=True, generator=generator)  # (B,)
    starts = offsets[docs] + (torch.rand(batch_size, generator=generator, dtype=torch.float64)
                              * pair_starts[docs]).long()
    others = []
    for d in docs.tolist():  # a different document for each row
        weights = b_starts.double().clone()
        weights[d] = 0
        if weights.sum() == 0:
            raise ValueError(f"document {d} is the only one with at least {len_b} tokens (len_b)")
        others.append(int(torch.multinomial(weights, 1, generator=generator)))
    others_t = torch.tensor(others, dtype=torch.long)
    r_starts = offsets[others_t] + (torch.rand(batch_size, generator=generator, dtype=torch.float64)
                                    * b_starts[others_t]).long()

    def spans(begin: Tensor, length: int) -> Tensor:
        return torch.from_numpy(np.stack([np.asarray(tokens[int(s): int(s) + length]) for s in begin]).astype(np.int64))

    return spans(starts, len_a), spans(starts + len_a, len_b), spans(r_starts, len_b)


def encoder_source(tokenizer: Any, text: str, special_tokens: bool = True) -> list[int]:
    """`text` as an encoder-decoder's source was in training (`seq2seq` below: the pieces, then
    EOS): the tokenizer's template, then EOS unless the template already ends with it (Marian's,
    T5's and BART's do). Translating a source without that EOS is off the training distribution
    (a recurrent bottleneck model summarises the source by its last state, which in training was
    the EOS's). `special_tokens=False`: the bare pieces.

    Example (a tokenizer without a template, EOS id 3):
        >>> encoder_source(tok, "In the beginning")
        [1435, 269, 3996, 3]
    """
    ids = tokenizer.encode(text, add_special_tokens=special_tokens)
    eos = tokenizer.eos_token_id
    if special_tokens and eos is not None and (not ids or ids[-1] != eos):
        ids = [*ids, eos]
    return ids


def seq2seq(src: Sequence[Sequence[int]], tgt: Sequence[Sequence[int]], generator: torch.Generator | None = None, *,
            pad_id: int, bos_id: int, eos_id: int, max_len: int | None = None) -> dict[str, Tensor]:
    """Collate sentence pairs for an encoder-decoder (teacher forcing).

    Args:
        src, tgt: token id lists, one per example.
        generator: unused; kept for a uniform signature.
        pad_id, bos_id, eos_id: padding, decoder start and end tokens.
        max_len: truncate source and target (before EOS is added) to this many tokens.

    Returns:
        `src_ids` (B, S) = src + EOS, right-padded; `src_mask` (B, S); `tgt_ids` (B, Tt) =
        BOS + tgt; `tgt_mask`; `labels` (B, Tt) = tgt + EOS with IGNORE on padding.
    """
    if len(src) != len(tgt) or not len(src):
        raise ValueError(f"src and tgt must be non-empty and of one length, got {len(src)} and {len(tgt)}")
    cut = (lambda x: list(x)[:max_len]) if max_len else list
    srcs = [cut(s) + [eos_id] for s in src]
    tgts_in = [[bos_id] + cut(t) for t in tgt]
    labels = [cut(t) + [eos_id] for t in tgt]

    def pad(rows: list[list[int]], value: int) -> Tensor:
        width = max(map(len, rows))
        return torch.tensor([r + [value] * (width - len(r)) for r in rows], dtype=torch.long)

    src_ids, tgt_ids = pad(srcs, pad_id), pad(tgts_in, pad_id)
    src_mask = pad([[1] * len(r) for r in srcs], 0)
    tgt_mask = pad([[1] * len(r) for r in tgts_in], 0)
    return {"src_ids": src_ids, "src_mask": src_mask, "tgt_ids": tgt_ids, "tgt_mask": tgt_mask,
            "labels": pad(labels, IGNORE)}


def pairs_lm_prompt(src: Sequence[int], sep_id: int, max_len: int | None = None) -> list[int]:
    """What a decoder trained with `pairs_lm` reads before it writes a target: the source (cut at
    `max_len` tokens, as in training), then SEP. Generation continues it until EOS.

    Example: pairs_lm_prompt([5, 6, 7], sep_id=3, max_len=2) -> [5, 6, 3]
    """
    return [*(list(src)[:max_len] if max_len else src), sep_id]


def pairs_lm(src: Sequence[Sequence[int]], tgt: Sequence[Sequence[int]], generator: torch.Generator | None = None, *,
             pad_id: int, sep_id: int, eos_id: int, max_len: int | None = None) -> dict[str, Tensor]:
    """Collate pairs for a decoder alone: each row is one sequence `source SEP target EOS` read left
    to right, and the loss is on the target only (the decoder-only summariser, T-D, of Liu et al.
    2018, https://arxiv.org/abs/1801.10198, section 4.2.2; `seq2seq` is the encoder-decoder's view
    of the same pairs, with the same target tokens).

    Example (source [5, 6], target [8], SEP 3, EOS 2):
        input_ids [5, 6, 3, 8], labels [-100, -100, 8, 2]: SEP predicts the target's first token,
        the target's last token predicts EOS, nothing predicts the source.

    Args:
        src, tgt: token id lists, one per example (documents and their summaries).
        generator: unused; kept for a uniform signature.
        pad_id, sep_id, eos_id: padding, the separator, the end token.
        max_len: truncate source and target (before SEP and EOS) to this many tokens.

    Returns:
        `input_ids` (B, T) = source + SEP + target, right-padded with pad_id; `attention_mask`
        (B, T), 1 on real tokens; `labels` (B, T): target + EOS on the positions from SEP on,
        IGNORE on the source and the padding.
    """
    if len(src) != len(tgt) or not len(src):
        raise ValueError(f"src and tgt must be non-empty and of one length, got {len(src)} and {len(tgt)}")
    rows, labels = [], []
    for s, t in zip(src, tgt):
        prompt, target = pairs_lm_prompt(s, sep_id, max_len), list(t)[:max_len] if max_len else list(t)
        rows.append(prompt + target)
        labels.append([IGNORE] * (len(prompt) - 1) + target + [eos_id])  # position i predicts token i + 1
    width = max(map(len, rows))
    pad = lambda row, value: row + [value] * (width - len(row))
    return {"input_ids": torch.tensor([pad(r, pad_id) for r in rows], dtype=torch.long),
            "attention_mask": torch.tensor([pad([1] * len(r), 0) for r in rows], dtype=torch.long),
            "labels": torch.tensor([pad(r, IGNORE) for r in labels], dtype=torch.long)}
