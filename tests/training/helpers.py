"""A tiny text corpus and run config for fast training tests (no network)."""

import random

WORDS = "the king queen lord speak hath thou thee love death night day sword crown blood".split()


def write_corpus(folder, n_train=400, n_valid=60, seed=0):
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    lines = lambda n: "\n".join(" ".join(rng.choice(WORDS) for _ in range(8)) for _ in range(n))
    (folder / "train.txt").write_text(lines(n_train))
    (folder / "valid.txt").write_text(lines(n_valid))
    return folder / "train.txt", folder / "valid.txt"


def tiny_config(folder, **train):
    train_path, valid_path = write_corpus(folder)
    run = {"out_dir": str(folder / "run"), "max_steps": 8, "eval_every": 4, "eval_batches": 2, "log_every": 1,
           "checkpoint_every": 2, "keep_last": 2, "seed": 0, "threads": 1,
           "precision": "fp32",  # not auto: ranks and CLI runs in other processes see the CPU's real bf16
           **train}
    return {"model": {"preset": "tiny-decoder", "d_model": 32, "num_layers": 1, "num_heads": 2, "d_ff": 64,
                      "dropout": 0.1, "position": {"scheme": "rotary", "max_len": 32}},
            "data": {"source": str(train_path), "valid": str(valid_path), "seq_len": 16, "batch_size": 4},
            "optim": {"lr": 0.003},
            "schedule": {"name": "cosine", "warmup_steps": 2},
            "train": run}
