"""Checkpoints, in one place: the run folder's layout and reading it back verified (`layout`:
all that `attnlab.load(run_folder)` needs), and writing and restoring a training state — weights,
optimizer moments, schedule, random states, data position (`training_state`). A model split over
processes gathers its shards into this same layout first (attnlab.parallel.checkpoint).

    save_checkpoint(OUT / "checkpoints", step=200, model=model, optimizer=opt, ...)
    state = load_checkpoint(resolve_checkpoint(OUT), model=model, optimizer=opt)
"""

from attnlab.io.checkpoints.layout import (TOKENIZER, CheckpointError, check_tokenizer, checkpoint_name,
                                           list_checkpoints, read_index, read_state, resolve_checkpoint, run_tokenizer)

_TRAINING_STATE = {"load_checkpoint", "rng_state", "save_checkpoint", "saved_run_config", "set_rng_state"}

__all__ = ["TOKENIZER", "CheckpointError", "check_tokenizer", "checkpoint_name", "list_checkpoints", "load_checkpoint",
           "read_index", "read_state", "resolve_checkpoint", "rng_state", "run_tokenizer", "save_checkpoint",
           "saved_run_config", "set_rng_state"]


def __getattr__(name: str):
    """The training-state functions, imported on first use: they need torch, and the layout
    (what the command line's parsers and `attnlab.load` read first) does not."""
    if name in _TRAINING_STATE:
        from attnlab.io.checkpoints import training_state

        return getattr(training_state, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
