"""WordPiece training: properties of the vocabulary, and closeness to Hugging Face's trainer.

Hugging Face's WordPieceTrainer gives its ``##`` characters ids in a hash map's order, so its
tie-breaking (and its vocabulary, at the margin) changes from run to run; exact equality is not
defined. What holds: the same alphabet, and nearly all tokens in common.
"""

from __future__ import annotations

import pytest

from attnlab.tokenizers import Tokenizer
from attnlab.tokenizers.wordpiece_trainer import _merge_word, train_wordpiece
from tokenizer_samples import training_corpus

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


@pytest.fixture(scope="module")
def corpus():
    return training_corpus()


@pytest.fixture(scope="module")
def trained(corpus):
    return Tokenizer.train(corpus, kind="wordpiece", vocab_size=1200)


def test_vocabulary_layout(trained, corpus):
    vocab = trained.get_vocab()
    assert len(vocab) == trained.vocab_size == 1200
    assert [vocab[t] for t in SPECIALS] == [0, 1, 2, 3, 4]
    words = {w for line in corpus for w in trained.model.words(line)}
    for word in words:  # every character can be spelled, at the start or inside a word
        assert all(c in vocab for c in word)
        assert all("##" + c in vocab for c in word[1:])
    assert all(trained.unk_token_id not in ids for ids in trained.encode_batch(corpus[:200]))


def test_common_words_become_single_tokens(trained):
    for word in ("the", "return", "self", "def"):
        assert trained.tokenize(word) == [word]


def test_close_to_hf_trainer(corpus, trained):
    import tokenizers as hf
    from tokenizers import models, normalizers, pre_tokenizers, trainers

    tok = hf.Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train_from_iterator(corpus, trainers.WordPieceTrainer(vocab_size=1200, min_frequency=2,
                                                              special_tokens=SPECIALS, show_progress=False))
    theirs, ours = set(tok.get_vocab()), set(trained.get_vocab())
    assert len(theirs) == len(ours)
    assert len(theirs & ours) >= 0.97 * len(ours)


def test_deterministic(corpus):
    first = Tokenizer.train(corpus[:500], kind="wordpiece", vocab_size=400)
    second = Tokenizer.train(corpus[:500], kind="wordpiece", vocab_size=400)
    assert first.get_vocab() == second.get_vocab()


def test_likelihood_criterion_takes_the_best_scoring_pair_first():
    counts = {"hug": 10, "pug": 5, "pun": 12, "bun": 4, "hugs": 5}
    vocab = train_wordpiece(counts, vocab_size=0 + 100, special_tokens=["[UNK]"], min_frequency=1,
                            criterion="likelihood")
    alphabet = 1 + len("hpbugns") + len({"##u", "##g", "##n", "##s"})
    first = min((t for t, i in vocab.items() if i >= alphabet), key=vocab.get)
    # score = count(a b) / (count(a) count(b)); "##g ##s" occurs 5 times, ##g 20 and ##s 5 times:
    # 5 / (20 * 5) = 0.05, the best of all pairs (e.g. "h ##u": 15 / (15 * 36)).
    assert first == "##gs"


def test_frequency_criterion_takes_the_most_frequent_pair_first():
    counts = {"hug": 10, "pug": 5, "pun": 12, "bun": 4, "hugs": 5}
    vocab = train_wordpiece(counts, vocab_size=100, special_tokens=["[UNK]"], min_frequency=1)
    alphabet = 1 + 7 + 4
    first = min((t for t, i in vocab.items() if i >= alphabet), key=vocab.get)
    assert first == "##ug"  # "##u ##g" occurs 20 times


def test_errors():
    with pytest.raises(ValueError, match="vocab_size must be at least"):
        Tokenizer.train(["abc def"], kind="wordpiece", vocab_size=6)
    with pytest.raises(ValueError, match="criterion"):
        train_wordpiece({"ab": 2}, 10, criterion="entropy")
    with pytest.raises(ValueError, match="special_tokens"):
        Tokenizer.train(["abc"], kind="wordpiece", special_tokens=["[PAD]"])  # no [UNK]


def test_merge_word_reports_count_changes():
    word = [1, 2, 2, 2, 3]
    changes = _merge_word(word, 2, 2, 9)
    assert word == [1, 9, 2, 3]  # left to right, no overlap
    assert changes == [((1, 2), -1), ((1, 9), 1), ((2, 2), -1), ((9, 2), 1)]
