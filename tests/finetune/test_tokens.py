"""Token classification: word labels on sub-tokens (WordPiece vs Hugging Face's word_ids, byte-level
BPE vs the whole-text encoding), row-named data errors, a tiny run that learns a tagging task,
and `attnlab finetune` / `attnlab predict` end to end."""

import json

import pytest
import torch

from attnlab.finetune import LabelMap, Recipe, with_head
from attnlab.finetune.token_runner import TokenFinetuner, word_report
from attnlab.finetune.tokens import (IGNORE, WordExample, align_words, encode_word_batch, encode_word_labels,
                                     read_word_examples, word_predictions)
from attnlab.tokenizers import Tokenizer, pretrained
from tests.finetune.helpers import char_tokenizer, tiny, write_csv

SENTENCES = [
    ["Insert", "Zeilen", "unterhalb", "(Minus)", "tokenization's", "überprüfen!"],
    ["a"], ["Datei", "öffnen", "...", "Result", "Log:", "x2"],
]


def _labelled_positions(row):
    return [t for t, w in enumerate(row["word_index"]) if w >= 0]


@pytest.fixture(scope="module")
def bert():
    folder = pretrained.bert_uncased_files()
    return Tokenizer.load(folder / "vocab.txt"), folder


@pytest.fixture(scope="module")
def gpt2():
    return Tokenizer.load(pretrained.gpt2_files())


@pytest.mark.parametrize("words", SENTENCES)
def test_wordpiece_alignment_matches_hugging_face_word_ids(bert, words):
    import tokenizers
    tok, folder = bert
    hf = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
    hf.no_padding()
    hf.no_truncation()
    ref = hf.encode(words, is_pretokenized=True)
    row = align_words(tok, words, list(range(len(words))), max_length=128)
    assert row["input_ids"] == ref.ids
    first = {}
    for t, w in enumerate(ref.word_ids):
        if w is not None and w not in first:
            first[w] = t
    assert _labelled_positions(row) == [first[w] for w in range(len(words))]
    assert [row["labels"][t] for t in _labelled_positions(row)] == list(range(len(words)))
    assert all(row["labels"][t] == IGNORE for t in range(len(row["labels"])) if t not in first.values())


@pytest.mark.parametrize("position", ["first", "last"])
@pytest.mark.parametrize("words", SENTENCES)
def test_bpe_alignment_is_the_whole_text_encoding_with_labels_at_word_edges(gpt2, words, position):
    row = align_words(gpt2, words, [7] * len(words), max_length=128, position=position)
    assert row["input_ids"] == gpt2(" ".join(words))["input_ids"]  # GPT-2's template adds nothing
    pos = _labelled_positions(row)
    assert len(pos) == len(words) and row["truncated"] == 0
    bounds = pos + [len(row["input_ids"])] if position == "first" else [-1] + pos
    for w in range(len(words)):  # the tokens between consecutive labelled positions decode to the word
        span = row["input_ids"][bounds[w]:bounds[w + 1]] if position == "first" else \
            row["input_ids"][bounds[w] + 1:bounds[w + 1] + 1]
        assert gpt2.decode(span).strip() == words[w]
    assert sum(x != IGNORE for x in row["labels"]) == len(words)


def test_truncation_is_counted_and_truncated_words_get_no_prediction(bert):
    tok, _ = bert
    words = ["alpha", "beta", "gamma", "delta", "epsilon"]
    row = align_words(tok, words, [0, 1, 0, 1, 0], max_length=5)  # [CLS] 3 tokens [SEP]
    assert len(row["input_ids"]) == 5 and row["input_ids"][-1] == tok.token_to_id("[SEP]")
    kept = len(_labelled_positions(row))
    assert kept + row["truncated"] == len(words) and row["truncated"] >= 2
    enc = encode_word_batch(tok, [WordExample(words)], None, max_length=5)
    logits = torch.zeros(1, enc["input_ids"].shape[1], 2)
    preds = word_predictions(logits, enc["word_index"], [len(words)])[0]
    assert preds[:kept] == [0] * kept and preds[kept:] == [None] * row["truncated"]
    report = word_report([[0, 1, 0, 1, 0]], [preds], 2, truncated=int(enc["truncated"].sum()))
    assert report["n"] == kept and report["truncated"] == row["truncated"]


def test_word_data_errors_name_the_row(tmp_path):
    jl = tmp_path / "a.jsonl"
    rows = [{"words": ["a", "b"], "labels": ["X", "Y"]}, {"words": ["c", "d", "e"], "labels": ["X", "Y"]}]
    jl.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    with pytest.raises(ValueError, match="row 2 has 3 words but 2 labels"):
        read_word_examples(jl)
    csv_file = write_csv(tmp_path / "b.csv", ["words", "labels"], [["a b", "X Y"], ["c", "Z"]])
    examples = read_word_examples(csv_file)
    assert examples[0].words == ["a", "b"] and examples[1].row == 3
    with pytest.raises(ValueError, match=r"row 3 word 0 \('c'\) has label 'Z'.*\['X', 'Y'\]"):
        encode_word_labels(LabelMap(["X", "Y"]), examples, str(csv_file))
    with pytest.raises(ValueError, match=r"text_column='tokens' is not a column \(row 2"):
        read_word_examples(csv_file, words_column="tokens")
    with pytest.raises(ValueError, match=r"label_column='tags'"):
        read_word_examples(csv_file, labels_column="tags")
    empty = write_csv(tmp_path / "e.csv", ["words", "labels"], [])
    with pytest.raises(ValueError, match="empty"):
        read_word_examples(empty)
    bad = tmp_path / "c.jsonl"
    bad.write_text(json.dumps({"words": {"a": 1}, "labels": []}) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match="row 1 column 'words' must be a list"):
        read_word_examples(bad)


COLOURS, ANIMALS = "red blue green".split(), "cat dog sun moon".split()


def _tag_rows(n, seed):
    """Trivially learnable: colour words are C, the others A."""
    g = torch.Generator().manual_seed(seed)
    vocab = COLOURS + ANIMALS
    rows = []
    for _ in range(n):
        words = [vocab[int(i)] for i in torch.randint(len(vocab), (int(torch.randint(2, 6, (1,), generator=g)),),
                                                       generator=g)]
        rows.append(WordExample(words, ["C" if w in COLOURS else "A" for w in words]))
    return rows


@pytest.mark.parametrize("steps", [20, pytest.param(80, marks=pytest.mark.slow)])  # 10 reach 1.0 here
def test_a_tiny_run_learns_a_trivial_tagging_task(steps):
    torch.manual_seed(0)
    tok = char_tokenizer()
    train, test = _tag_rows(96, 0), _tag_rows(32, 1)
    labels = LabelMap(["A", "C"])
    model = with_head(tiny("encoder", num_layers=2), "token_classification", 2, seed=0)
    run = TokenFinetuner(model, tok, train, encode_word_labels(labels, train),
                         Recipe(lr=3e-3, max_steps=steps, batch_size=16, warmup_ratio=0.0), seed=0)
    before = run.evaluate(test, encode_word_labels(labels, test))
    run.train(steps)
    after = run.evaluate(test, encode_word_labels(labels, test))
    assert after["accuracy"] >= 0.97 and after["macro_f1"] >= 0.95 and after["truncated"] == 0
    assert after["accuracy"] > before["accuracy"]
    assert run.history[-1]["loss"] < run.history[0]["loss"]


@pytest.mark.parametrize("steps", [20, pytest.param(80, marks=pytest.mark.slow)])  # 10 reach 1.0 here
def test_finetune_and_predict_cli_for_token_classification(tmp_path, steps):
    from attnlab.cli.main import main
    from attnlab.interop.serialization import save

    torch.manual_seed(0)
    save(tiny("encoder", num_layers=2), tmp_path / "base", tokenizer=char_tokenizer())
    for split, (n, seed) in {"train": (96, 0), "valid": (16, 1)}.items():
        (tmp_path / f"{split}.jsonl").write_text(
            "".join(json.dumps({"words": e.words, "labels": e.labels}) + "\n" for e in _tag_rows(n, seed)),
            encoding="utf-8")
    config = {"model": str(tmp_path / "base"), "head": "token_classification",
              "data": {"train": str(tmp_path / "train.jsonl"), "valid": str(tmp_path / "valid.jsonl")},
              "recipe": {"lr": 3e-3, "max_steps": steps, "batch_size": 16, "warmup_ratio": 0.0},
              "out_dir": str(tmp_path / "out")}
    (tmp_path / "cfg.json").write_text(json.dumps(config), encoding="utf-8")
    assert main(["finetune", str(tmp_path / "cfg.json")]) == 0
    summary = json.loads((tmp_path / "out" / "summary.json").read_text(encoding="utf-8"))
    assert summary["labels"] == ["A", "C"] and summary["valid"]["accuracy"] >= 0.97
    assert (tmp_path / "out" / "confusion.png").is_file()
    write_csv(tmp_path / "in.csv", ["words"], [["red cat sun"], ["moon blue"]])
    assert main(["predict", str(tmp_path / "out" / "model"), "--input", str(tmp_path / "in.csv"),
                 "--output", str(tmp_path / "pred.jsonl")]) == 0
    rows = [json.loads(x) for x in (tmp_path / "pred.jsonl").read_text(encoding="utf-8").splitlines()]
    assert rows == [{"words": ["red", "cat", "sun"], "predictions": ["C", "A", "A"]},
                    {"words": ["moon", "blue"], "predictions": ["A", "C"]}]
