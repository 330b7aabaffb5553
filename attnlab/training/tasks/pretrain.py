"""The pretraining objectives as a Trainer task: batches from the DataPipeline, the fused loss of
`steps.batch_loss`, validation loss / perplexity (+ masked-LM and NSP accuracy, BLEU/chrF).

    task = PretrainTask(DataPipeline.build(cfg.data, out_dir), eval_batches=20, bleu_samples=200)
    Trainer(cfg, task=task).fit()

A step's loss is weighted by label tokens (`weight`): the masked positions of masked LM, the
target tokens of causal / prefix LM and seq2seq (see attnlab.training.tasks.protocol). For a BERT batch
with next-sentence labels the NSP term rides on the same weight.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnlab.decoding import generate
from attnlab.evaluation import bleu_chrf, perplexity
from attnlab.nn.losses import IGNORE
from attnlab.training.data.batches import DataPipeline
from attnlab.training.tasks.batch_loss import autocast, batch_loss, eval_sums, to_device
from attnlab.training.tasks.protocol import StepLoss, Task


class PretrainTask(Task):
    """A DataPipeline's objective as a task.

    Args:
        pipeline: prepared data (tokenizer, token files, objective).
        eval_batches: validation batches per evaluation (the same ones every time).
        bleu_samples: seq2seq: validation sentences decoded for BLEU/chrF (0: none).
    """

    def __init__(self, pipeline: DataPipeline, *, eval_batches: int = 20, bleu_samples: int = 0):
        self.pipeline, self.eval_batches, self.bleu_samples = pipeline, eval_batches, bleu_samples

    @property
    def tokenizer(self):
        return self.pipeline.tokenizer

    def train_batch(self, generator: torch.Generator) -> dict[str, Tensor]:
        return self.pipeline.train_batch(generator)

    def weight(self, batch: dict[str, Tensor]) -> int:
        return int((batch["labels"] != IGNORE).sum())

    def loss(self, model: nn.Module, batch: dict[str, Tensor], *, label_smoothing: float = 0.0) -> StepLoss:
        return StepLoss(batch_loss(model, batch, label_smoothing=label_smoothing), {})

    @torch.no_grad()
    def evaluate(self, model: nn.Module, device: torch.device, precision: str) -> dict[str, float]:
        """Validation loss and perplexity on the fixed eval batches; masked LM adds the accuracy
        on masked positions, NSP runs the MLM and NSP losses (val_loss is their sum, as trained)
        and the NSP accuracy, an objective on pairs (`Objective.bleu`) BLEU/chrF."""
        sums: dict[str, float] = {}
        for batch in self.pipeline.eval_batches(self.eval_batches):
            batch = to_device(batch, device)
            with autocast(precision, device):
                for key, value in eval_sums(model, batch).items():
                    sums[key] = sums.get(key, 0) + value
        count = max(sums.get("tokens", 0), 1)
        result = {"val_loss": sums.get("loss_sum", 0.0) / count}
        result["val_ppl"] = perplexity(result["val_loss"])  # of the token loss (MLM alone in NSP runs)
        if "correct" in sums:
            result["val_mlm_accuracy"] = sums["correct"] / count
        if sums.get("nsp_count"):
            result["val_mlm_loss"] = result["val_loss"]
            result["val_nsp_loss"] = sums["nsp_loss_sum"] / sums["nsp_count"]
            result["val_nsp_accuracy"] = sums["nsp_correct"] / sums["nsp_count"]
            result["val_loss"] = result["val_mlm_loss"] + result["val_nsp_loss"]
        if sums.get("sbo_count"):  # SpanBERT: val_loss = MLM + SBO, as trained
            result["val_mlm_loss"] = result["val_loss"]
            result["val_sbo_loss"] = sums["sbo_loss_sum"] / sums["sbo_count"]
            result["val_sbo_accuracy"] = sums["sbo_correct"] / sums["sbo_count"]
            result["val_loss"] = result["val_mlm_loss"] + result["val_sbo_loss"]
        if self.pipeline.objective.bleu and self.bleu_samples:
            result.update(self.translation_scores(model, device, self.bleu_samples))
        return result

    @torch.no_grad()
    def translation_scores(self, model: nn.Module, device: torch.device, limit: int) -> dict[str, float]:
        """BLEU/chrF of greedy translations of the first `limit` validation pairs."""
        tok, cfg = self.pipeline.tokenizer, self.pipeline.cfg
        src, tgt = self.pipeline.valid
        n = min(limit, src.num_documents)
        max_new = min(cfg.max_pair_len + 1, model.config.position.max_len - 1)  # a table's context
        bos = tok.bos_token_id if tok.bos_token_id is not None else tok.pad_token_id  # as DataPipeline's batches
        hyps, refs = [], []
        for start in range(0, n, cfg.batch_size):
            batch = self.pipeline._pairs_batch(self.pipeline.valid, list(range(start, min(start + cfg.batch_size, n))))
            out = generate(model, batch["src_ids"].to(device), max_new, attention_mask=batch["src_mask"].to(device),
                           decoder_start_token_id=bos, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
            for row in out[:, 1:].tolist():
                row = row[: row.index(tok.eos_token_id)] if tok.eos_token_id in row else row
                hyps.append(tok.decode(row, skip_special_tokens=True))
            refs.extend(tok.decode(tgt.document(i).tolist()) for i in range(start, min(start + cfg.batch_size, n)))
        return bleu_chrf(hyps, refs)
