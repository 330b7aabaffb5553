"""Setting a run up before its first step: where the model starts (`start`), LoRA adapters
(`adapters`), the precision (`precision`), threads (`threads`), memory checked before it is spent
(`memory`, `free_memory`), compilation and activation checkpointing (`speedups`)."""
