"""Fine-tuning: task heads on pretrained attnlab models, recipes, metrics, task builders — on the
one training loop (attnlab.training.Trainer; a head's loss and data are a FinetuneTask), so runs
have checkpoints, exact resume, the NaN policy and data parallel.

    from attnlab.finetune import load_pretrained, with_head, Finetuner, Recipe
    model, tok = load_pretrained("minilm")
    clf = with_head(model, "classification", num_labels=2, pooling="mean", seed=0)
    run = Finetuner(clf, tok, examples, labels, Recipe(lr=1e-4, layer_decay=0.9, max_steps=150), out_dir="runs/ft")
    run.train(150); run.evaluate(valid_examples, valid_labels)   # accuracy, macro_f1, mcc

Token classification (one label per word, on its first sub-token):

    run = TokenFinetuner(with_head(model, "token_classification", 2), tok, read_word_examples("train.jsonl"),
                         word_label_ids, Recipe(max_steps=200))

`attnlab finetune CONFIG` / `attnlab predict CKPT --input ... --output ...` wrap these.
"""

from attnlab.finetune.data import Example, LabelMap, encode_batch, read_examples
from attnlab.finetune.loading import load_pretrained, with_head
from attnlab.finetune.metrics import (accuracy, classification_report, confusion_matrix, format_confusion,
                                      macro_f1, matthews_corrcoef, plot_confusion)
from attnlab.finetune.recipes import freeze, llrd_param_groups, parameter_depths, reinit_top_layers
from attnlab.finetune.runner import Finetuner, Recipe, predict
from attnlab.finetune.task import FinetuneTask, lm_loss, task_loss
from attnlab.finetune.sweep import SweepResult, seed_sweep
from attnlab.finetune.token_runner import TokenFinetuner, predict_words, word_report
from attnlab.finetune.tokens import (WordExample, align_words, encode_word_batch, encode_word_labels,
                                     read_word_examples, word_label_map)

__all__ = ["Example", "LabelMap", "encode_batch", "read_examples", "load_pretrained", "with_head", "accuracy",
           "classification_report", "confusion_matrix", "format_confusion", "macro_f1", "matthews_corrcoef",
           "plot_confusion", "freeze", "llrd_param_groups", "parameter_depths", "reinit_top_layers", "Finetuner", "FinetuneTask",
           "Recipe", "lm_loss", "predict", "task_loss", "SweepResult", "seed_sweep", "TokenFinetuner", "predict_words",
           "word_report", "WordExample", "align_words", "encode_word_batch", "encode_word_labels",
           "read_word_examples", "word_label_map"]
