"""Model inputs: truncation strategies, padding side and multiple, masks, tensors."""

from __future__ import annotations

import pytest
import torch

from attnlab.tokenizers.inputs import padded_length, truncate_pair


@pytest.fixture(scope="module")
def hf_bert_json(bert_dir):
    import tokenizers as hf
    tok = hf.Tokenizer.from_file(str(bert_dir / "tokenizer.json"))
    tok.no_padding()
    return tok


@pytest.mark.parametrize("len_a", [0, 1, 3, 6, 9])
@pytest.mark.parametrize("len_b", [0, 2, 6, 9])
@pytest.mark.parametrize("max_length", [3, 4, 8, 11, 20])
def test_longest_first_matches_hf(bert_shared, hf_bert_json, len_a, len_b, max_length):
    a, b = " ".join(["a"] * len_a), " ".join(["b"] * len_b)
    hf_bert_json.enable_truncation(max_length=max_length, strategy="longest_first")
    ours = bert_shared(a, b, truncation=True, max_length=max_length)
    theirs = hf_bert_json.encode(a, b)
    assert ours["input_ids"] == theirs.ids
    assert ours["token_type_ids"] == theirs.type_ids


def test_only_first_and_only_second():
    a, b = list(range(10)), list(range(100, 105))
    assert truncate_pair(a, b, 12, "only_first") == (a[:7], b)
    assert truncate_pair(a, b, 12, "only_second") == (a, b[:2])
    with pytest.raises(ValueError, match="second sequence has 5 tokens but 8 must go"):
        truncate_pair(a, b, 7, "only_second")
    with pytest.raises(ValueError, match="text_pair"):
        truncate_pair(a, None, 5, "only_second")
    assert truncate_pair(a, None, 4, "longest_first") == (a[:4], None)
    assert truncate_pair(a, b, 99, "only_first") == (a, b)


def test_truncation_counts_the_template(bert_shared):
    out = bert_shared("one two three four five six", "seven eight nine", truncation="only_first", max_length=8)
    assert len(out["input_ids"]) == 8  # [CLS] 2 words [SEP] 3 words [SEP]
    assert bert_shared.decode(out["input_ids"]) == "[CLS] one two [SEP] seven eight nine [SEP]"
    with pytest.raises(ValueError, match="max_length"):
        bert_shared("a", "b", truncation=True, max_length=2)
    with pytest.raises(ValueError, match="max_length"):
        bert_shared("a", truncation=True)


@pytest.mark.parametrize("side", ["right", "left"])
def test_padding_side_and_masks(bert_shared, hf_bert, side):
    texts = ["short", "a somewhat longer sentence here", ""]
    ours = bert_shared(texts, padding=True, padding_side=side)
    hf_bert.padding_side = side
    try:
        theirs = hf_bert(texts, padding=True)
    finally:
        hf_bert.padding_side = "right"
    assert ours == {k: theirs[k] for k in ("input_ids", "attention_mask", "token_type_ids")}
    for ids, mask in zip(ours["input_ids"], ours["attention_mask"]):
        assert [i != bert_shared.pad_token_id for i in ids] == [m == 1 for m in mask]
        assert (mask[-1] == 1) if side == "left" else (mask[0] == 1)


def test_pad_to_multiple_of_eight(bert_shared):
    out = bert_shared(["x " * 9, "y"], padding=True, pad_to_multiple_of=8)
    assert {len(row) for row in out["input_ids"]} == {16}  # 11 tokens, rounded up to 16
    assert out["attention_mask"][1] == [1, 1, 1] + [0] * 13
    fixed = bert_shared(["x", "y y"], padding="max_length", max_length=10, pad_to_multiple_of=8)
    assert {len(row) for row in fixed["input_ids"]} == {16}
    assert padded_length([3, 5], None, None, 8) == 5  # no padding asked: rows keep their length


def test_tensors(bert_shared):
    out = bert_shared(["hello world", "hi"], padding=True, return_tensors="pt")
    assert out["input_ids"].dtype == torch.long and out["input_ids"].shape == (2, 4)
    assert out["attention_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 1, 0]]
    single = bert_shared("hello", return_tensors="pt")
    assert single["input_ids"].shape == (1, 3)
    with pytest.raises(ValueError, match="padding=True"):
        bert_shared(["hello world", "hi"], return_tensors="pt")


def test_single_text_gives_flat_lists(bert_shared):
    out = bert_shared("hello")
    assert out == {"input_ids": [101, 7592, 102], "attention_mask": [1, 1, 1], "token_type_ids": [0, 0, 0]}
    assert bert_shared("hello", add_special_tokens=False)["input_ids"] == [7592]


def test_bad_options_name_the_argument(bert_shared):
    for kwargs, name in [({"padding": "sideways"}, "padding"), ({"truncation": "middle", "max_length": 4}, "truncation"),
                         ({"padding_side": "up"}, "padding_side"), ({"pad_to_multiple_of": 0}, "pad_to_multiple_of"),
                         ({"return_tensors": "np"}, "return_tensors"), ({"max_length": -1}, "max_length")]:
        with pytest.raises(ValueError, match=name):
            bert_shared(["a"], **kwargs)
    with pytest.raises(ValueError, match="text_pair"):
        bert_shared(["a", "b"], ["c"])


def test_padding_needs_a_pad_token(gpt2_shared):
    with pytest.raises(ValueError, match="pad token"):
        gpt2_shared(["a", "b c"], padding=True)


def test_encode_batch_is_encode_per_text(gpt2_shared):
    texts = ["a", "b c", ""]
    assert gpt2_shared.encode_batch(texts) == [gpt2_shared.encode(t) for t in texts]
    with pytest.raises(TypeError, match="list"):
        gpt2_shared.encode_batch("not a list")
