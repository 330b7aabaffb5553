"""What a run leaves and how it stops: signals (`signals`), TensorBoard (`tensorboard`) and the loss
curve (`loss_curve`) beside metrics.jsonl. Checkpoints themselves are attnlab.io.checkpoints."""
