"""Pretraining objectives, a registry: `OBJECTIVES` maps the config string `data.objective` to a
spec saying everything a run needs to know of that objective. The batch arithmetic itself lives
in the pure functions of attnlab.data.objectives; a spec chooses the windows they see.

    spec = OBJECTIVES["masked_lm"]
    spec.special_tokens("wordpiece")             # what a tokenizer trained for it reserves
    spec.model_fields(nsp=False)                 # {"arch": "encoder", "head": "mlm"}
    OBJECTIVES["span_masked_lm"].model_fields(nsp=False, span_boundary=True)  # ... and "sbo_head": True
    spec.train_batch(cfg, tok, files, generator) # one batch from the token files
    spec.eval_batches(cfg, tok, files, 20)       # the same validation batches every time

`cfg` is the run's DataConfig (attnlab.training.config, which imports this registry: hence not
imported here), `tok` its tokenizer, `files` a TokenFile (or a (src, tgt) pair of
them when the spec trains on `pairs`).

Adding an objective: an `Objective` subclass here (its class attributes, `special_tokens` and
`train_batch`; `eval_batches` only where fixed-seed draws are not the right validation) and its
line in `OBJECTIVES`. The config accepts exactly the registry keys; see
tests/training/data/test_objectives.py for one registered and trained in a test.
"""

from __future__ import annotations

import functools
from typing import Any, ClassVar, Iterator, Sequence

import numpy as np
import torch
from torch import Tensor

from attnlab.data import objectives as batches
from attnlab.data.buckets import bucketed_batch, length_order
from attnlab.tokenizers.boundaries import word_starts

NUM_SENTINELS = 100  # T5's <extra_id_i> tokens
EVAL_SEED = 1234
NSP_FIELDS = {"type_vocab_size": 2, "pooler": True, "nsp_head": True}  # BERT's segments, pooler, NSP classifier


class Objective:
    """What a pretraining objective is to the run (subclass and register in `OBJECTIVES`).

    Attributes:
        arch: the stack it trains (`decoder`, `encoder`, `encoder_decoder`); the config sets
            model.arch from it (a recurrent encoder-decoder stays one under an encoder-decoder objective).
        head: the model head it trains (`lm`, `mlm`).
        pairs: trains on sentence pairs (a TSV/CSV file, a pairs corpus) instead of plain text.
        eos_between_documents: the token files end each document with the tokenizer's EOS (packed
            LM windows then see where one document stops).
        next_sentence: data.nsp may add BERT's next-sentence task.
        span_boundary: data.span_boundary may add SpanBERT's span-boundary objective (SBO).
        bleu: validation also decodes pairs for BLEU/chrF (train.bleu_samples).
        length_buckets: data.batch_tokens may batch pairs of similar length to a token budget.
    """

    arch: ClassVar[str]
    head: ClassVar[str] = "lm"
    pairs: ClassVar[bool] = False
    eos_between_documents: ClassVar[bool] = False
    next_sentence: ClassVar[bool] = False
    span_boundary: ClassVar[bool] = False
    bleu: ClassVar[bool] = False
    length_buckets: ClassVar[bool] = False

    def special_tokens(self, tokenizer_kind: str) -> list[str]:
        """The special tokens a tokenizer trained for this objective reserves."""
        raise NotImplementedError

    def model_fields(self, nsp: bool, span_boundary: bool = False) -> dict[str, Any]:
        """The model fields this objective decides (with `nsp`, BERT's NSP parts too; with
        `span_boundary`, SpanBERT's SBO head)."""
        fields = {"arch": self.arch, "head": self.head, **(NSP_FIELDS if nsp and self.next_sentence else {})}
        if span_boundary and self.span_boundary:
            fields["sbo_head"] = True
        return fields

    def train_batch(self, cfg: Any, tok: Any, files: Any, generator: torch.Generator) -> dict[str, Tensor]:
        """One batch of `cfg.batch_size` rows drawn from `files` with `generator`."""
        raise NotImplementedError

    def eval_batches(self, cfg: Any, tok: Any, files: Any, num_batches: int) -> Iterator[dict[str, Tensor]]:
        """`num_batches` validation batches, the same at every evaluation: by default training
        batches drawn with a fixed seed."""
        generator = torch.Generator().manual_seed(EVAL_SEED)
        for _ in range(num_batches):
            yield self.train_batch(cfg, tok, files, generator)

    def row_lengths(self, cfg: Any) -> tuple[int, int | None]:
        """(S, Tt): the most tokens a row of a training batch holds, padding included, on the
        source (or only) side and on an encoder-decoder's target side (None for one stack), read
        from the config alone (the memory estimate, attnlab.training.setup.memory). By default
        data.seq_len tokens on one side."""
        return cfg.seq_len, None


def _lm_special_tokens(tokenizer_kind: str) -> list[str]:
    # byte-level BPE needs no <unk>, and GPT-2 pads with its one special token
    return ["<|endoftext|>"] if tokenizer_kind == "bpe" else ["<pad>", "<unk>", "<|endoftext|>"]


class CausalLM(Objective):
    """Next-token prediction on packed windows (GPT); validation walks the split in order."""

    arch = "decoder"
    eos_between_documents = True

    def special_tokens(self, tokenizer_kind: str) -> list[str]:
        return _lm_special_tokens(tokenizer_kind)

    def train_batch(self, cfg, tok, files, generator):
        return batches.causal_lm(files.random_windows(cfg.batch_size, cfg.seq_len + 1, generator))

    def eval_batches(self, cfg, tok, files, num_batches):
        windows = files.sequential_windows(cfg.seq_len + 1, limit=num_batches * cfg.batch_size)
        for i in range(0, len(windows), cfg.batch_size):
            yield batches.causal_lm(windows[i: i + cfg.batch_size])


class PrefixLM(Objective):
    """A decoder that sees a random prefix bidirectionally and predicts the rest (T5 3.2.1)."""

    arch = "decoder"
    eos_between_documents = True

    def special_tokens(self, tokenizer_kind: str) -> list[str]:
        return _lm_special_tokens(tokenizer_kind)

    def train_batch(self, cfg, tok, files, generator):
        return batches.prefix_lm(files.random_windows(cfg.batch_size, cfg.seq_len + 1, generator), generator)


class MaskedLM(Objective):
    """BERT's masked LM (with data.whole_word_mask, whole words: attnlab.tokenizers.boundaries
    says where a tokenizer's words start), optionally with next-sentence prediction on
    `[CLS] A [SEP] B [SEP]` rows."""

    arch, head = "encoder", "mlm"
    next_sentence = True

    def special_tokens(self, tokenizer_kind: str) -> list[str]:
        return ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]

    def train_batch(self, cfg, tok, files, generator):
        pair = self._sentence_pairs(cfg, tok, files, generator) if cfg.nsp else None
        ids = pair["input_ids"] if pair is not None else files.random_windows(cfg.batch_size, cfg.seq_len, generator)
        starts = word_starts(tok, ids) if cfg.whole_word_mask else None
        batch = batches.masked_lm(ids, generator, vocab_size=tok.vocab_size, mask_id=tok.mask_token_id,
                                  special_ids=tok.all_special_ids, mask_prob=cfg.mask_prob, word_starts=starts)
        if pair is not None:
            batch.update(token_type_ids=pair["token_type_ids"], nsp_labels=pair["nsp_labels"])
        return batch

    @staticmethod
    def _sentence_pairs(cfg, tok, files, generator: torch.Generator) -> dict[str, Tensor]:
        """`[CLS] A [SEP] B [SEP]` rows of seq_len tokens (A and B split the rest in halves);
        B is A's next segment or, with probability 1/2, a segment of another document."""
        T = cfg.seq_len - 3
        if tok.cls_token_id is None or tok.sep_token_id is None:
            raise ValueError("data.nsp needs a tokenizer with [CLS] and [SEP] tokens")
        first, second, other = batches.segment_pairs(files.tokens, files.offsets, cfg.batch_size, T // 2, T - T // 2,
                                                     generator)
        return batches.next_sentence(first, second, other, generator, cls_id=tok.cls_token_id, sep_id=tok.sep_token_id)


class SpanMaskedLM(Objective):
    """SpanBERT's span masking: spans of whole words (geometric lengths, data.span_words_p and
    data.max_span_words) masked up to data.mask_prob of the tokens, 80/10/10 per span.

    With data.span_boundary, also SpanBERT's span-boundary objective (SBO): each masked token is
    predicted again from the encodings just outside its span and its place in it, by the model's
    SBO head (ModelConfig.sbo_head, `attnlab.models.heads.SpanBoundaryHead`, which checkpoints
    hold like any head); the batches carry `span_left` and `span_right` and the loss is MLM + SBO."""

    arch, head = "encoder", "mlm"
    span_boundary = True

    def special_tokens(self, tokenizer_kind: str) -> list[str]:
        return ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]

    def train_batch(self, cfg, tok, files, generator):
        ids = files.random_windows(cfg.batch_size, cfg.seq_len, generator)
        return batches.span_masked_lm(ids, generator, vocab_size=tok.vocab_size, mask_id=tok.mask_token_id,
                                      special_ids=tok.all_special_ids, word_starts=word_starts(tok, ids),
                                      mask_prob=cfg.mask_prob, geometric_p=cfg.span_words_p,
                                      max_span_words=cfg.max_span_words,
                                      span_boundary=getattr(cfg, "span_boundary", False))


class SpanCorruption(Objective):
    """T5's span corruption: spans of the encoder input become sentinels, the decoder writes them out."""

    arch = "encoder_decoder"

    def special_tokens(self, tokenizer_kind: str) -> list[str]:
        return ["<pad>", "</s>", "<unk>"] + [f"<extra_id_{i}>" for i in range(NUM_SENTINELS)]

    def train_batch(self, cfg, tok, files, generator):
        ids = files.random_windows(cfg.batch_size, cfg.seq_len, generator)
        sc = batches.span_corruption(ids, generator, sentinel_ids=tok.sentinel_token_ids, eos_id=tok.eos_token_id,
                                     noise_density=cfg.noise_density, mean_span_length=cfg.mean_span_length)
        start = torch.full((cfg.batch_size, 1), tok.pad_token_id)  # T5 starts decoding from the pad id
        return {"src_ids": sc["input_ids"], "tgt_ids": torch.cat([start, sc["labels"][:, :-1]], 1),
                "labels": sc["labels"]}

    def row_lengths(self, cfg):
        # the kept tokens and a sentinel per span + EOS; a sentinel per span, the noise, a last sentinel + EOS
        noise, spans = batches.span_noise_counts(cfg.seq_len, cfg.noise_density, cfg.mean_span_length)
        return cfg.seq_len - noise + spans + 1, noise + spans + 2


class EncoderDecoderLM(Objective):
    """T5's prefix LM for an encoder-decoder: a window cut at a uniform random point, the prefix
    into the encoder, the rest decoded (the decoder-only version is `prefix_lm`)."""

    arch = "encoder_decoder"

    def special_tokens(self, tokenizer_kind: str) -> list[str]:
        return ["<pad>", "</s>", "<unk>"]

    def train_batch(self, cfg, tok, files, generator):
        windows = files.random_windows(cfg.batch_size, cfg.seq_len, generator)
        # T5 starts decoding from the pad id, and ends source and target with EOS
        return batches.encoder_decoder_lm(windows, generator, pad_id=tok.pad_token_id, start_id=tok.pad_token_id,
                                          eos_id=tok.eos_token_id)

    def row_lengths(self, cfg):
        return cfg.seq_len, cfg.seq_len  # a prefix of up to seq_len - 1 tokens + EOS; start + the rest


def pairs_batch(cfg: Any, tok: Any, files: Any, index: Sequence[int] | np.ndarray) -> dict[str, Tensor]:
    """The seq2seq batch of the pairs at `index` of `files` (src, tgt TokenFiles)."""
    src, tgt = files
    # decoding starts from BOS, or from the pad id for tokenizers without one (Marian, T5)
    start = tok.bos_token_id if tok.bos_token_id is not None else tok.pad_token_id
    return batches.seq2seq([src.document(int(i)).tolist() for i in index],
                           [tgt.document(int(i)).tolist() for i in index], pad_id=tok.pad_token_id, bos_id=start,
                           eos_id=tok.eos_token_id, max_len=cfg.max_pair_len)


@functools.lru_cache(maxsize=4)
def _pair_lengths(files: tuple[Any, Any], max_pair_len: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(length order, source cost, target cost) of the pairs of (src, tgt) TokenFiles, each side
    cut at `max_pair_len` plus its EOS (source) or BOS (target), as `pairs_batch` collates them."""
    src, tgt = (np.minimum(np.diff(f.offsets), max_pair_len) + 1 for f in files)
    return length_order(src, tgt), src, tgt


class Seq2Seq(Objective):
    """Translation-style training on sentence pairs; validation walks the pairs in order."""

    arch = "encoder_decoder"
    pairs = True
    bleu = True
    length_buckets = True

    def special_tokens(self, tokenizer_kind: str) -> list[str]:
        return ["<pad>", "<unk>", "<s>", "</s>"]

    def train_batch(self, cfg, tok, files, generator):
        if cfg.batch_tokens is None:
            index = torch.randint(0, files[0].num_documents, (cfg.batch_size,), generator=generator).numpy()
        else:  # pairs of similar length up to a budget of padded tokens
            order, src, tgt = _pair_lengths(files, cfg.max_pair_len)
            index = bucketed_batch(order, src, tgt, cfg.batch_tokens, generator)
        return pairs_batch(cfg, tok, files, index)

    def row_lengths(self, cfg):
        return cfg.max_pair_len + 1, cfg.max_pair_len + 1  # each side cut, + EOS (source) or the start (target)

    def eval_batches(self, cfg, tok, files, num_batches):
        n = min(files[0].num_documents, num_batches * cfg.batch_size)
        for i in range(0, n, cfg.batch_size):
            yield pairs_batch(cfg, tok, files, np.arange(i, min(i + cfg.batch_size, n)))


class PairsLM(Objective):
    """Pairs for a decoder alone: `source [SEP] target EOS` rows, the loss on the target only
    (`attnlab.data.objectives.pairs_lm`; the decoder-only summariser of Liu et al. 2018). A model so
    trained writes a target by continuing `source [SEP]` (`pairs_lm_prompt`) up to EOS. Validation
    walks the pairs in order; both sides are cut at data.max_pair_len tokens. With data.batch_tokens,
    training batches are pairs of similar length as for seq2seq (a row, source + SEP + target, is
    one token shorter than the pair's cost there)."""

    arch = "decoder"
    pairs = True
    length_buckets = True

    def special_tokens(self, tokenizer_kind: str) -> list[str]:
        return ["<pad>", "<unk>", "<s>", "</s>", "<sep>"]  # seq2seq's and a separator: one tokenizer serves both

    def train_batch(self, cfg, tok, files, generator):
        if cfg.batch_tokens is None:
            index = torch.randint(0, files[0].num_documents, (cfg.batch_size,), generator=generator).numpy()
        else:
            order, src, tgt = _pair_lengths(files, cfg.max_pair_len)
            index = bucketed_batch(order, src, tgt, cfg.batch_tokens, generator)
        return self._batch(cfg, tok, files, index)

    def row_lengths(self, cfg):
        return 2 * cfg.max_pair_len + 1, None  # source SEP target, each side cut at max_pair_len

    def eval_batches(self, cfg, tok, files, num_batches):
        n = min(files[0].num_documents, num_batches * cfg.batch_size)
        for i in range(0, n, cfg.batch_size):
            yield self._batch(cfg, tok, files, np.arange(i, min(i + cfg.batch_size, n)))

    @staticmethod
    def _batch(cfg: Any, tok: Any, files: Any, index: Sequence[int] | np.ndarray) -> dict[str, Tensor]:
        missing = [name for name, i in (("a separator (<sep>, [SEP])", tok.sep_token_id),
                                        ("an end token (</s>, <|endoftext|>)", tok.eos_token_id)) if i is None]
        if missing:
            raise ValueError(f"data.objective='pairs_lm' needs a tokenizer with {' and '.join(missing)}; this one has "
                             "none (a tokenizer the run trains has both)")
        src, tgt = files
        pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id  # masked out either way
        return batches.pairs_lm([src.document(int(i)).tolist() for i in index],
                                [tgt.document(int(i)).tolist() for i in index], pad_id=pad,
                                sep_id=tok.sep_token_id, eos_id=tok.eos_token_id, max_len=cfg.max_pair_len)


OBJECTIVES: dict[str, Objective] = {
    "causal_lm": CausalLM(),
    "prefix_lm": PrefixLM(),
    "masked_lm": MaskedLM(),
    "span_masked_lm": SpanMaskedLM(),
    "span_corruption": SpanCorruption(),
    "encoder_decoder_lm": EncoderDecoderLM(),
    "seq2seq": Seq2Seq(),
    "pairs_lm": PairsLM(),
}

__all__ = ["EVAL_SEED", "NUM_SENTINELS", "OBJECTIVES", "CausalLM", "EncoderDecoderLM", "MaskedLM", "Objective",
           "PairsLM", "PrefixLM", "Seq2Seq", "SpanCorruption", "SpanMaskedLM", "pairs_batch"]
