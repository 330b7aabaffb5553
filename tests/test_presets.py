"""Preset sizes equal the published parameter counts (counted on the meta device)."""

import pytest
import torch

from attnlab import build_model, presets


def count(name: str) -> int:
    with torch.device("meta"):
        model = build_model(presets.get(name))
    return sum(p.numel() for p in model.parameters())  # shared (tied) tensors counted once


@pytest.mark.parametrize("name, expected", [
    ("gpt2-small", 124_439_808),  # GPT2LMHeadModel, vocab 50,257, tied head
    ("bert-base", 109_482_240),  # BertModel with pooler
    ("bert-large", 335_141_888),  # BertModel with pooler
    ("t5-small", 60_506_624),  # T5ForConditionalGeneration, tied
    ("gpt1", 116_534_784),  # OpenAIGPTModel, vocab 40,478
])
def test_exact_published_counts(name, expected):
    assert count(name) == expected


@pytest.mark.parametrize("name, published", [("vaswani-base", 65e6), ("vaswani-big", 213e6)])
def test_vaswani_within_three_percent(name, published):
    assert abs(count(name) - published) / published <= 0.03


def test_every_preset_builds_on_meta():
    for name in presets.names():
        assert count(name) > 0
