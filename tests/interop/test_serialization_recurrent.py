"""attnlab.save / attnlab.load round-trip recurrent encoder-decoders: tied and untied output
projections, shared and separate vocabularies, every encoder cell."""

import pytest
import torch
from safetensors.torch import load_file

import attnlab
from attnlab import ModelConfig, build_model


@pytest.mark.parametrize("cell,attention,shared,tied", [("rnn", "none", True, True), ("lstm", "additive", False, True),
                                                        ("gru", "general", True, False), ("conv", "dot", False, False)])
def test_save_load_gives_the_same_outputs(tmp_path, cell, attention, shared, tied):
    cfg = ModelConfig(arch="rnn_encoder_decoder", vocab_size=40, d_model=16, dropout=0.0, share_embeddings=shared,
                      src_vocab_size=None if shared else 30, tie_embeddings=tied,
                      rnn={"cell": cell, "attention": attention, "hidden_size": 16, "num_layers": 2})
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    attnlab.save(model, tmp_path / "m")
    stored = load_file(str(tmp_path / "m" / "model.safetensors"))
    assert ("out.weight" in stored) != tied  # a tied projection is stored once, as the embedding
    assert len([k for k in stored if k.endswith("embed.weight")]) == (1 if shared else 2)
    loaded = attnlab.load(tmp_path / "m")
    assert loaded.config == cfg and not loaded.training
    assert (loaded.out.weight is loaded.tgt_embed.weight) == tied and (loaded.src_embed is loaded.tgt_embed) == shared
    src, tgt = torch.randint(1, 30, (2, 6)), torch.randint(1, 40, (2, 5))
    torch.testing.assert_close(loaded(src, tgt), model(src, tgt), rtol=0, atol=0)
