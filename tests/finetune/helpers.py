"""Tiny models, tokenizers and data files shared by the fine-tuning tests."""

import csv

import torch

from attnlab import ModelConfig, build_model
from attnlab.tokenizers import Tokenizer

WORDS = "the cat sat on a mat dog ran far away red blue green sun moon star"


def tiny(arch: str = "encoder", **kw) -> torch.nn.Module:
    cfg = ModelConfig(arch=arch, vocab_size=kw.pop("vocab_size", 40), d_model=32, num_layers=kw.pop("num_layers", 3),
                      num_heads=4, d_ff=64, dropout=0.0, position={"scheme": "learned", "max_len": 64}, **kw)
    return build_model(cfg)


def char_tokenizer() -> Tokenizer:
    return Tokenizer.train([WORDS], kind="char")


def write_csv(path, header, rows):
    with open(path, "w", encoding="utf-8", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)
    return path


def colour_rows(n: int, seed: int = 0) -> list[tuple[str, str]]:
    """A learnable toy task: the label is the colour word in the text."""
    g = torch.Generator().manual_seed(seed)
    colours, fill = ["red", "blue", "green"], WORDS.split()[:6]
    rows = []
    for _ in range(n):
        c = colours[int(torch.randint(3, (1,), generator=g))]
        a, b = (fill[int(i)] for i in torch.randint(len(fill), (2,), generator=g))
        rows.append((f"{a} {c} {b}", c))
    return rows
