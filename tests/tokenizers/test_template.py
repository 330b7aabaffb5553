"""Templates: BERT's and GPT's layouts, and Hugging Face's TemplateProcessing both ways."""

from __future__ import annotations

import pytest

from attnlab.tokenizers import Template, Tokenizer

ROLES = {"cls": "[CLS]", "sep": "[SEP]", "start": "[START]", "delim": "[DELIM]", "extract": "[EXTRACT]",
         "bos": "<s>", "eos": "</s>"}
IDS = {"[CLS]": 101, "[SEP]": 102, "[START]": 1, "[DELIM]": 2, "[EXTRACT]": 3, "<s>": 4, "</s>": 5}


@pytest.mark.parametrize("name, single, pair, pair_types", [
    ("none", [7, 8], [7, 8, 9], [0, 0, 1]),
    ("bert", [101, 7, 8, 102], [101, 7, 8, 102, 9, 102], [0, 0, 0, 0, 1, 1]),
    ("gpt", [1, 7, 8, 3], [1, 7, 8, 2, 9, 3], [0, 0, 0, 0, 1, 1]),
    ("bos_eos", [4, 7, 8, 5], [4, 7, 8, 5, 9, 5], [0, 0, 0, 0, 1, 1]),
])
def test_presets(name, single, pair, pair_types):
    template = Template.preset(name, ROLES)
    assert template.apply([7, 8], None, IDS.__getitem__) == (single, [0] * len(single))
    assert template.apply([7, 8], [9], IDS.__getitem__) == (pair, pair_types)
    assert template.num_added(False) == len(single) - 2
    assert template.num_added(True) == len(pair) - 3


def test_bos_eos_with_eos_only():
    template = Template.preset("bos_eos", {"eos": "</s>"})
    assert template.apply([7], [9], IDS.__getitem__) == ([7, 5, 9, 5], [0, 0, 1, 1])


def test_missing_roles_are_named():
    with pytest.raises(ValueError, match="cls, sep"):
        Template.preset("bert", {})
    with pytest.raises(ValueError, match="preset"):
        Template.preset("t5", ROLES)
    with pytest.raises(ValueError, match="pair"):
        Template((("$A", 0),), (("$A", 0),))


@pytest.mark.parametrize("name", ["bert", "gpt", "bos_eos"])
def test_hf_round_trip(name):
    template = Template.preset(name, ROLES)
    spec = template.to_hf(IDS.__getitem__)
    assert Template.from_hf(spec, ROLES) == template


def test_hf_processors_apply_the_same(gpt2_dir):
    import tokenizers as hf
    tok = Tokenizer.load(gpt2_dir)
    tok.add_special_tokens(["[START]", "[DELIM]", "[EXTRACT]"])
    tok.set_template("gpt")
    ref = hf.Tokenizer.from_str(__import__("json").dumps(tok.to_dict()))
    encoding = ref.encode("premise here", "hypothesis")
    ours = tok("premise here", "hypothesis")
    assert ours["input_ids"] == encoding.ids
    assert ours["token_type_ids"] == encoding.type_ids
    assert tok.encode("premise", add_special_tokens=True) == ref.encode("premise").ids


def test_bert_and_roberta_processing_blocks():
    bert = Template.from_hf({"type": "BertProcessing", "sep": ["[SEP]", 102], "cls": ["[CLS]", 101]}, ROLES)
    assert bert.name == "bert"
    roberta = Template.from_hf({"type": "RobertaProcessing", "sep": ["</s>", 2], "cls": ["<s>", 0]}, ROLES)
    assert roberta.apply([7], [9], IDS.__getitem__) == ([4, 7, 5, 5, 9, 5], [0] * 6)
    with pytest.raises(ValueError, match="post_processor"):
        Template.from_hf({"type": "Mystery"}, ROLES)
