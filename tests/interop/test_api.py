"""`to_hf` on models attnlab builds itself (not converted from transformers): the presets of the
families transformers has give the same outputs there; the others are refused with the fields
that stand in the way."""

import pytest
import torch
import transformers

import attnlab
from attnlab.interop import hf_export, to_hf
from tests.interop.helpers import TOL, single_thread

pytestmark = pytest.mark.usefixtures(single_thread.__name__)

SMALL = dict(num_layers=1, d_model=48, num_heads=3, d_ff=64, vocab_size=100)


@pytest.mark.parametrize("name, cls", [("gpt2-small", "GPT2LMHeadModel"), ("bert-base", "BertModel"),
                                       ("t5-small", "T5ForConditionalGeneration")])
def test_presets_export_with_equal_outputs(name, cls):
    cfg = attnlab.presets.get(name, **SMALL)
    if cfg.position.scheme == "learned":
        cfg = cfg.replace(position={"scheme": "learned", "max_len": 32})
    model = attnlab.build_model(cfg).eval()
    hf = to_hf(model)
    assert type(hf).__name__ == cls
    ids = torch.randint(1, 100, (2, 7))
    with torch.no_grad():
        if cfg.arch == "encoder_decoder":
            got, want = model(ids, ids[:, :4]), hf(input_ids=ids, decoder_input_ids=ids[:, :4]).logits
        elif cfg.arch == "encoder":
            got, want = model(ids), hf(input_ids=ids).last_hidden_state
        else:
            got, want = model(ids), hf(input_ids=ids).logits
    assert (got - want).abs().max() <= TOL


def test_the_original_transformer_is_not_a_marian_model():
    model = attnlab.build_model(attnlab.presets.get("vaswani-base", **SMALL))
    with pytest.raises(ValueError, match=r"Marian.*lm_head_bias=False.*sinusoidal_layout='interleaved'"):
        hf_export(model)
    with pytest.raises(ValueError, match="family='gpt_neox' is not one of"):  # (llama converts since issue 37)
        hf_export(model, family="gpt_neox")
    with pytest.raises(TypeError, match="build_model"):
        hf_export(torch.nn.Linear(2, 2))


def test_a_spanbert_encoder_is_refused_naming_its_span_boundary_head():
    cfg = attnlab.presets.get("bert-base", **SMALL).replace(position={"scheme": "learned", "max_len": 32},
                                                            head="mlm", pooler=False, sbo_head=True)
    with pytest.raises(ValueError, match=r"BERT model: sbo_head=True \(needs False\)"):
        hf_export(attnlab.build_model(cfg))


@pytest.mark.parametrize("family", [None, "gpt2", "llama"])
def test_an_attention_only_decoder_is_refused_naming_d_ff(family):
    cfg = attnlab.ModelConfig(arch="decoder", vocab_size=20, d_model=16, num_layers=1, num_heads=2, d_ff=0)
    with pytest.raises(ValueError, match="d_ff=0: attention-only"):
        hf_export(attnlab.build_model(cfg), family=family)
