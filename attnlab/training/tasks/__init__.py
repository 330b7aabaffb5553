"""What the loop trains on: the task protocol (`protocol`), the pretraining objectives as a task
(`pretrain`), segments with a memory (`recurrence`), images (`images`), and the batch loss they
share (`batch_loss`, which asks the model's family: attnlab.models.families). Fine-tuning tasks live in attnlab.finetune."""
