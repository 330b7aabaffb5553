"""position.combine='concat': [token; position] features instead of their sum."""

import pytest
import torch

from attnlab import ModelConfig, build_model
from attnlab.config import ConfigError
from tests.models.helpers import assert_causal_and_cached


def _cfg(**kw):
    position = {"scheme": "learned", "max_len": 32, "combine": "concat", "concat_dim": 8, **kw.pop("position", {})}
    return ModelConfig(arch=kw.pop("arch", "decoder"), vocab_size=40, d_model=32, num_layers=2, num_heads=4, d_ff=64,
                       dropout=0.0, tie_embeddings=kw.pop("tie_embeddings", False), position=position, **kw)


def test_the_first_layer_input_is_token_then_position_features():
    model = build_model(_cfg()).eval()
    emb = model.embed
    assert emb.token.weight.shape == (40, 24)
    ids, pos = torch.tensor([[3, 7, 3]]), torch.arange(3)[None]
    h = emb(ids, pos)
    assert h.shape == (1, 3, 32)
    torch.testing.assert_close(h[0, :, :24], emb.token.weight[ids[0]])
    torch.testing.assert_close(h[0, :, 24:], emb.positions(pos)[0])
    assert torch.equal(h[0, 0, :24], h[0, 2, :24]) and not torch.equal(h[0, 0, 24:], h[0, 2, 24:])


@pytest.mark.parametrize("scheme", ["learned", "sinusoidal", "binary"])
def test_decoders_stay_causal_and_decode_like_their_forward(scheme):
    model = build_model(_cfg(position={"scheme": scheme})).eval()
    assert_causal_and_cached(model, 40)


def test_encoder_decoder_with_segments_builds_and_runs():
    model = build_model(_cfg(arch="encoder_decoder")).eval()
    out = model(torch.randint(0, 40, (2, 6)), torch.randint(0, 40, (2, 5)))
    assert out.shape == (2, 5, 40)
    enc = build_model(_cfg(arch="encoder", head="mlm", type_vocab_size=2)).eval()
    assert enc(torch.randint(0, 40, (2, 6)), token_type_ids=torch.zeros(2, 6, dtype=torch.long)).shape == (2, 6, 40)


@pytest.mark.parametrize("change, field", [
    ({"tie_embeddings": True}, "tie_embeddings"),
    ({"position": {"scheme": "rotary"}}, "position.combine"),
    ({"position": {"concat_dim": 32}}, "position.concat_dim"),
    ({"position": {"scheme": "sinusoidal", "concat_dim": 7}}, "position.concat_dim"),
    ({"position": {"combine": "multiply"}}, "position.combine"),
])
def test_impossible_combinations_name_the_field(change, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        _cfg(**change)
