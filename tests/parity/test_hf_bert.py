"""BERT from transformers == attnlab after conversion, and back (random small models)."""

import pytest
import torch
import transformers

from attnlab.interop import from_hf, save_hf
from tests.interop.helpers import (TOL, assert_round_trip, randomize, real_max_diff, right_padded,
                                   single_thread)

pytestmark = pytest.mark.usefixtures(single_thread.__name__)

V = 57
CONFIGS = {
    "3-heads": dict(hidden_size=48, num_attention_heads=3, num_hidden_layers=2, intermediate_size=40),
    "4-heads-tanh-gelu-untied": dict(hidden_size=32, num_attention_heads=4, num_hidden_layers=3, intermediate_size=64,
                                     hidden_act="gelu_new", layer_norm_eps=1e-5, type_vocab_size=3,
                                     tie_word_embeddings=False),
}
CLASSES = ["BertModel", "BertForMaskedLM", "BertForSequenceClassification"]


def _hf(cls: str, name: str):
    cfg = transformers.BertConfig(vocab_size=V, max_position_embeddings=32, num_labels=3, **CONFIGS[name])
    return randomize(getattr(transformers, cls)(cfg))


def _batch(name: str):
    ids, mask = right_padded([8, 3, 6], V)
    types = torch.randint(0, CONFIGS[name].get("type_vocab_size", 2), ids.shape,
                          generator=torch.Generator().manual_seed(1))
    return ids, mask, types


@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("cls", CLASSES)
def test_outputs_match_on_a_padded_batch(cls, name):
    hf = _hf(cls, name)
    ours = from_hf(hf)
    ids, mask, types = _batch(name)
    with torch.no_grad():
        out = hf(input_ids=ids, attention_mask=mask, token_type_ids=types)
        got = ours(ids, mask, token_type_ids=types)
    if cls == "BertModel":
        assert real_max_diff(got, out.last_hidden_state, mask) <= TOL
        with torch.no_grad():  # the pooler too
            assert real_max_diff(ours.pool(got), out.pooler_output) <= TOL
    elif cls == "BertForMaskedLM":
        assert real_max_diff(got, out.logits, mask) <= TOL
    else:
        assert got.shape == (3, 3) and real_max_diff(got, out.logits) <= TOL


@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("cls", CLASSES)
def test_round_trip_is_exact(cls, name):
    ours = from_hf(_hf(cls, name))
    if cls == "BertForMaskedLM":
        assert (ours.head.decoder.weight is ours.embed.token.weight) == (name == "3-heads")
    assert_round_trip(ours)


def test_folders_both_ways(tmp_path):
    hf = _hf("BertForMaskedLM", "3-heads")
    hf.save_pretrained(tmp_path / "hf")
    ours = from_hf(tmp_path / "hf")
    save_hf(ours, tmp_path / "ours")
    back = transformers.BertForMaskedLM.from_pretrained(tmp_path / "ours").eval()
    ids, mask, types = _batch("3-heads")
    with torch.no_grad():
        want = hf(input_ids=ids, attention_mask=mask, token_type_ids=types).logits
        assert real_max_diff(ours(ids, mask, token_type_ids=types), want, mask) <= TOL
        assert real_max_diff(back(input_ids=ids, attention_mask=mask, token_type_ids=types).logits, want, mask) <= TOL


def test_relative_position_bert_is_refused():
    cfg = transformers.BertConfig(vocab_size=V, hidden_size=32, num_attention_heads=4, num_hidden_layers=1,
                                  intermediate_size=64, position_embedding_type="relative_key")
    with pytest.raises(ValueError, match="position_embedding_type='relative_key'"):
        from_hf(transformers.BertModel(cfg))
