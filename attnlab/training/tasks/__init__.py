"""What the loop trains on: the task protocol (`protocol`), the pretraining objectives as a task
(`pretrain`), segments with a memory (`recurrence`), images (`images`), and the batch losses they
share (`batch_loss`, `span_boundary`). Fine-tuning tasks live in attnlab.finetune."""
