"""fill_mask: on a random Hugging Face BertForMaskedLM converted by attnlab, the probabilities at
each mask equal a softmax of the transformers model's logits there, and the top-k agree with
transformers' own fill-mask pipeline on the same folder; models that cannot fill a mask, and
texts without the tokenizer's mask token, are refused with a message that says why."""

import pytest
import torch
import transformers

import attnlab
from attnlab import ModelConfig, build_model
from attnlab.decoding.fill_mask import fill_mask, mask_probabilities
from attnlab.interop import from_hf
from attnlab.tokenizers import Tokenizer
from tests.interop.helpers import randomize

LINES = ["the cat sat on the mat", "import a module with the import statement", "the dog ran far away"] * 4
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
TEXT = "the [MASK] sat on the [MASK] ."


@pytest.fixture(scope="module")
def tok():
    with pytest.warns(UserWarning, match="reached"):  # the tiny corpus has fewer pieces than asked for
        return Tokenizer.train(LINES, kind="wordpiece", vocab_size=80, special_tokens=SPECIALS)


@pytest.fixture(scope="module")
def hf(tok):
    cfg = transformers.BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_attention_heads=4,
                                  num_hidden_layers=2, intermediate_size=64, max_position_embeddings=32)
    return randomize(transformers.BertForMaskedLM(cfg), seed=3)


def _hf_probs(hf, ids):
    with torch.no_grad():
        return hf(input_ids=torch.tensor([ids])).logits[0].softmax(-1)  # (T, V)


def test_probabilities_are_the_softmax_of_the_hf_logits_at_each_mask(hf, tok):
    ours = from_hf(hf)
    ids = tok.encode(TEXT, add_special_tokens=True)
    positions = [i for i, t in enumerate(ids) if t == tok.mask_token_id]
    assert len(positions) == 2 and ids[0] == tok.cls_token_id and ids[-1] == tok.sep_token_id
    want = _hf_probs(hf, ids)[positions]  # (2, V)
    got = fill_mask(ours, TEXT, top_k=tok.vocab_size, tokenizer=tok)  # the whole vocabulary, sorted
    assert len(got) == 2
    for row, predictions in zip(want, got):
        probs = torch.tensor([p["probability"] for p in predictions])
        order = torch.tensor([p["id"] for p in predictions])
        torch.testing.assert_close(probs, row[order], atol=1e-5, rtol=0)
        assert order.tolist() == row.argsort(descending=True).tolist()  # the same order
        assert [p["token"] for p in predictions[:3]] == [tok.id_to_token(i) for i in order[:3].tolist()]
    top = fill_mask(ours, TEXT, top_k=4, tokenizer=tok)
    assert [[p["id"] for p in m] for m in top] == [[p["id"] for p in m[:4]] for m in got]
    assert max(want[0].max(), want[1].max()) > 3 / tok.vocab_size  # peaked: the order is not a tie-break


def test_a_hf_folder_gives_what_the_transformers_pipeline_gives(hf, tok, tmp_path):
    hf.save_pretrained(tmp_path)
    vocab = [tok.id_to_token(i) for i in range(tok.vocab_size)]
    (tmp_path / "vocab.txt").write_text("".join(f"{t}\n" for t in vocab), encoding="utf-8")
    hf_tok = transformers.BertTokenizerFast(str(tmp_path / "vocab.txt"))
    pipe = transformers.pipeline("fill-mask", model=hf, tokenizer=hf_tok, top_k=5)
    want = pipe(TEXT)
    got = attnlab.fill_mask(tmp_path, TEXT, top_k=5)  # the folder: config.json, weights, vocab.txt
    assert len(got) == len(want) == 2
    for ours, theirs in zip(got, want):
        assert [p["id"] for p in ours] == [p["token"] for p in theirs]
        assert [p["probability"] for p in ours] == pytest.approx([p["score"] for p in theirs], abs=1e-5)


def test_a_saved_attnlab_folder_and_a_model_in_train_mode(tok, tmp_path):
    torch.manual_seed(0)
    model = build_model(ModelConfig(arch="encoder", head="mlm", vocab_size=tok.vocab_size, d_model=16, num_layers=1,
                                    num_heads=2, d_ff=32, dropout=0.5, init_std=0.3,
                                    position={"scheme": "learned", "max_len": 32}))
    attnlab.save(model, tmp_path, tokenizer=tok)
    from_folder = fill_mask(str(tmp_path), "a [MASK] ran far", top_k=3)
    model.train()  # dropout 0.5: fill_mask must not apply it, and must give the mode back
    assert fill_mask(model, "a [MASK] ran far", top_k=3, tokenizer=tok) == from_folder  # the same weights
    assert model.training
    bare = fill_mask(model, "a [MASK] ran far", tokenizer=tok, add_special_tokens=False)
    ids = tok.encode("a [MASK] ran far")
    want = mask_probabilities(model, torch.tensor([ids]), torch.tensor([1]))[0]
    assert [p["probability"] for p in bare[0]] == pytest.approx(want.sort(descending=True).values[:5].tolist())


def test_top_k_beyond_the_vocabulary_returns_all_of_it(hf, tok):
    got = fill_mask(from_hf(hf), "[MASK]", top_k=10 ** 6, tokenizer=tok)
    assert len(got) == 1 and len(got[0]) == tok.vocab_size
    assert sum(p["probability"] for p in got[0]) == pytest.approx(1.0, abs=1e-5)


def test_a_text_without_the_mask_token_names_the_tokenizers_token(hf, tok):
    with pytest.raises(ValueError, match=r"no mask token: write '\[MASK\]'"):
        fill_mask(from_hf(hf), "the cat sat", tokenizer=tok)
    other = Tokenizer.train(LINES, kind="char", special_tokens=["<pad>", "<unk>", "<mask>"])
    model = build_model(ModelConfig(arch="encoder", head="mlm", vocab_size=other.vocab_size, d_model=16,
                                    num_layers=1, num_heads=2, d_ff=32))
    with pytest.raises(ValueError, match="write '<mask>'"):
        fill_mask(model, "the [MASK] sat", tokenizer=other)
    assert len(fill_mask(model, "the <mask> sat", tokenizer=other)) == 1
    no_mask = Tokenizer.train(LINES, kind="char", special_tokens=["<pad>", "<unk>"])
    with pytest.raises(ValueError, match="the tokenizer has no mask token"):
        fill_mask(model, "the [MASK] sat", tokenizer=no_mask)


@pytest.mark.parametrize("config,message", [
    (dict(arch="decoder"), "got a decoder-only model"),
    (dict(arch="encoder_decoder"), "got an encoder-decoder"),
    (dict(arch="encoder"), "head='none', no MLM head"),
    (dict(arch="encoder", head="classification", num_labels=2), "head='classification', no MLM head"),
])
def test_models_that_cannot_fill_a_mask_are_refused(tok, config, message):
    model = build_model(ModelConfig(vocab_size=tok.vocab_size, d_model=16, num_layers=1, num_heads=2, d_ff=32,
                                    **config))
    with pytest.raises(ValueError, match=message):
        fill_mask(model, TEXT, tokenizer=tok)


def test_a_converted_bert_without_its_mlm_head_is_refused(hf, tok):
    bare = from_hf(transformers.BertModel(hf.config))
    with pytest.raises(ValueError, match="no MLM head"):
        fill_mask(bare, TEXT, tokenizer=tok)


def test_bad_arguments(hf, tok):
    ours = from_hf(hf)
    for k in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="top_k must be a positive integer"):
            fill_mask(ours, TEXT, top_k=k, tokenizer=tok)
    with pytest.raises(TypeError, match="needs the model's tokenizer"):
        fill_mask(ours, TEXT)
    with pytest.raises(TypeError, match="attnlab model"):
        fill_mask(hf, TEXT, tokenizer=tok)
    small = build_model(ModelConfig(arch="encoder", head="mlm", vocab_size=4, d_model=16, num_layers=1,
                                    num_heads=2, d_ff=32))
    with pytest.raises(ValueError, match="outside the model's vocabulary of 4"):
        fill_mask(small, TEXT, tokenizer=tok)
    with pytest.raises(ValueError, match=r"the text is 42 tokens long \(special tokens included\), more than the 32"):
        fill_mask(ours, "the [MASK] " * 20, tokenizer=tok)  # BERT's learned positions stop at 32 here
