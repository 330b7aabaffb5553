"""Fine-tuning a token-classification head: a Finetuner whose examples are rows of words.

The loss is the cross-entropy over labelled sub-tokens (one per word; attnlab.finetune.tokens),
IGNORE elsewhere. Metrics are over words that fit in max_length:

    token accuracy = #(words predicted right) / #(words scored)
    macro-F1       = attnlab.finetune.metrics.macro_f1 over the scored words' labels

with `truncated`, the number of words cut off by max_length (not scored), beside them.

Notation: B batch, T tokens, K labels.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import Tensor, nn

from attnlab.finetune.metrics import accuracy, macro_f1
from attnlab.finetune.runner import Finetuner, Recipe
from attnlab.finetune.task import model_inputs
from attnlab.finetune.tokens import WordExample, encode_word_batch, word_predictions


class TokenFinetuner(Finetuner):
    """Finetuner for a `token_classification` head.

    Args:
        model: an attnlab encoder/decoder with head `token_classification`.
        tokenizer: its tokenizer.
        train_examples: WordExample rows; train_labels: label ids per word of each row.
        recipe: as for Finetuner; recipe.label_position picks the labelled sub-token.
        **kwargs: passed to Finetuner (seed, pad_id, out_dir, resume, log).

    Raises:
        ValueError: the model's head is not token_classification.
    """

    def __init__(self, model: nn.Module, tokenizer: Any, train_examples: Sequence[WordExample],
                 train_labels: Sequence[Sequence[int]], recipe: Recipe, **kwargs: Any):
        if model.config.head != "token_classification":
            raise ValueError(f"TokenFinetuner needs a token_classification head, got {model.config.head!r}")
        super().__init__(model, tokenizer, train_examples, train_labels, recipe, **kwargs)

    def encode(self, examples: Sequence[WordExample], labels: Sequence[Sequence[int]] | None) -> dict[str, Tensor]:
        """encode_word_batch with the recipe's length, padding and label position."""
        return encode_word_batch(self.tokenizer, examples, labels, max_length=self.recipe.max_length,
                                 pad_id=self.pad_id, padding_side=self.recipe.padding_side,
                                 position=self.recipe.label_position)

    def encode_training(self, examples: Sequence[WordExample], labels: Sequence[Sequence[int]]) -> dict[str, Tensor]:
        """A training batch: sub-token ids with each word's label on its labelled sub-token."""
        enc = self.encode(examples, labels)
        return {k: enc[k] for k in ("input_ids", "attention_mask", "token_type_ids", "labels")}

    @torch.no_grad()
    def predict_words(self, examples: Sequence[WordExample], batch_size: int = 64) -> tuple[list[list[int | None]], int]:
        """(label id or None per word per row, words truncated in all)."""
        return predict_words(self.model, self.tokenizer, examples, max_length=self.recipe.max_length,
                             pad_id=self.pad_id, padding_side=self.recipe.padding_side,
                             position=self.recipe.label_position, batch_size=batch_size)

    def evaluate(self, examples: Sequence[WordExample], labels: Sequence[Sequence[int]]) -> dict:
        """token accuracy, macro-F1 over word labels, words scored (n) and truncated."""
        preds, truncated = self.predict_words(examples)
        return word_report(labels, preds, self.model.config.num_labels, truncated)


def word_report(gold: Sequence[Sequence[int]], pred: Sequence[Sequence[int | None]], num_labels: int,
                truncated: int = 0) -> dict:
    """{"accuracy", "macro_f1", "n", "truncated"} over the words with a prediction."""
    g = [x for row_g, row_p in zip(gold, pred) for x, p in zip(row_g, row_p) if p is not None]
    p = [x for row_p in pred for x in row_p if x is not None]
    if not g:
        raise ValueError("no word fits in max_length: nothing to score (raise recipe.max_length)")
    return {"accuracy": accuracy(g, p), "macro_f1": macro_f1(g, p, num_labels), "n": len(g), "truncated": truncated}


@torch.no_grad()
def predict_words(model: nn.Module, tokenizer: Any, examples: Sequence[WordExample], *, max_length: int = 128,
                  pad_id: int = 0, padding_side: str = "right", position: str = "first", batch_size: int = 64
                  ) -> tuple[list[list[int | None]], int]:
    """Label id per word (None when truncated) for each row, and the number of truncated words."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    out: list[list[int | None]] = []
    truncated = 0
    try:
        for i in range(0, len(examples), batch_size):
            chunk = examples[i:i + batch_size]
            enc = encode_word_batch(tokenizer, chunk, None, max_length=max_length, pad_id=pad_id,
                                    padding_side=padding_side, position=position)
            inputs = {k: enc[k].to(device) for k in ("input_ids", "attention_mask", "token_type_ids")}
            hidden = model.features(inputs["input_ids"], **model_inputs(model, inputs))
            logits = model.apply_head(hidden, inputs["attention_mask"]).float().cpu()  # (B, T, K)
            out.extend(word_predictions(logits, enc["word_index"], [len(e.words) for e in chunk]))
            truncated += int(enc["truncated"].sum())
    finally:
        model.train(was_training)
    return out, truncated
