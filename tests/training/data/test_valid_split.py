"""data.valid_fraction (a validation split held out of one source) and the checks that refuse
empty or too-short splits when the pipeline is built, not at the first evaluation."""

import random

import pytest

from attnlab.training.config import DataConfig
from attnlab.training.data.batches import DataPipeline, SourceSplit, held_out_pairs, source_splits, tail_split

WORDS = "the king queen lord speak hath thou thee love death night day sword crown blood".split()


def _lines(n, seed=0):
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(6)) + f" {i}" for i in range(n)]


def _text_config(path, **data):
    return DataConfig(source=str(path), seq_len=8, batch_size=2, **data)


# ---------------------------------------------------------------- text: the tail
@pytest.mark.parametrize("fraction", [0.05, 0.2, 0.5])
def test_text_parts_rebuild_the_source_and_the_valid_part_is_its_tail(tmp_path, fraction):
    text = "\n".join(_lines(200)) + "\n"
    path = tmp_path / "all.txt"
    path.write_text(text)
    pieces = lambda: [(text[i:i + 333], i + 333 >= len(text)) for i in range(0, len(text), 333)]  # cut mid-line
    train = "".join(t for t, _ in tail_split(pieces, fraction, "train"))
    valid = "".join(t for t, _ in tail_split(pieces, fraction, "valid"))
    assert train + valid == text  # nothing lost, nothing twice
    assert valid and text.endswith(valid) and train.endswith("\n")  # the tail, cut at a line start
    wanted = int(fraction * len(text))
    longest_line = max(len(line) + 1 for line in text.splitlines())
    assert wanted - longest_line < len(valid) <= wanted  # the cut moves forward by less than a line


def test_a_document_cut_in_two_ends_in_the_validation_part(tmp_path):
    pieces = lambda: [("a\nb\n", True), ("c\nd\ne\nf\n", True)]
    train = list(tail_split(pieces, 0.34, "train"))  # the last int(0.34 * 12) = 4 characters
    valid = list(tail_split(pieces, 0.34, "valid"))
    assert train == [("a\nb\n", True), ("c\nd\n", False)]  # no end-of-document where the text goes on
    assert valid == [("e\nf\n", True)]


def test_text_split_is_deterministic_and_cached_per_fraction(tmp_path, isolated_cache):
    path = tmp_path / "all.txt"
    path.write_text("\n".join(_lines(300)) + "\n")
    cfg = _text_config(path, valid_fraction=0.1)
    first = DataPipeline.build(cfg, tmp_path / "run", show_progress=False)
    again = DataPipeline.build(cfg, tmp_path / "run", show_progress=False)
    assert first.valid.tokens.tolist() == again.valid.tokens.tolist()
    valid_text = first.tokenizer.decode(first.valid.tokens.tolist(), skip_special_tokens=True)
    assert valid_text.strip() and path.read_text().rstrip("\n").endswith(valid_text.rstrip("\n"))
    total = len(first.train) + len(first.valid)
    assert 0.05 < len(first.valid) / total < 0.15
    other = DataPipeline.build(_text_config(path, valid_fraction=0.3), tmp_path / "run", show_progress=False)
    assert len(other.valid) > 2 * len(first.valid)  # another fraction is another cached split


def test_the_tokenizer_is_trained_on_the_training_part_only(tmp_path, isolated_cache):
    path = tmp_path / "all.txt"
    path.write_text("\n".join(_lines(300)) + "\n" + "\n".join(["ZZZ QQQ XXX"] * 30) + "\n")  # letters only at the end
    pipe = DataPipeline.build(_text_config(path, valid_fraction=0.1), tmp_path / "run", show_progress=False)
    assert pipe.tokenizer.token_to_id("Z") is None and pipe.tokenizer.token_to_id("k") is not None


# ---------------------------------------------------------------- pairs: a salted hash sample
def test_pairs_hold_out_a_sample_independent_of_file_order():
    pairs = [(f"source {i}", f"target {i}") for i in range(400)]
    held = held_out_pairs(pairs, 0.1)
    assert len(held) == 40
    assert held == held_out_pairs(list(reversed(pairs)), 0.1)  # order does not matter
    indices = sorted(int(s.split()[1]) for s, _ in held)
    assert indices[0] < 100 and indices[-1] >= 300  # spread over the file, not its end


def test_repeated_pairs_fall_on_one_side():
    pairs = [("Thank you.", "Danke.")] * 30 + [(f"s{i}", f"t{i}") for i in range(170)]
    for fraction in (0.05, 0.1, 0.3, 0.6):
        held = held_out_pairs(pairs, fraction)
        covered = sum(p in held for p in pairs)
        assert covered >= int(fraction * len(pairs))
        assert (("Thank you.", "Danke.") in held) == all(p in held for p in pairs if p[0] == "Thank you.")


@pytest.mark.parametrize("suffix,write", [
    (".tsv", lambda rows: "\n".join(f"{s}\t{t}" for s, t in rows) + "\n"),
    (".csv", lambda rows: "\n".join(f'"{s}","{t}"' for s, t in rows) + "\n"),
])
def test_pair_sources_split_into_two_disjoint_parts(tmp_path, suffix, write):
    rows = [(f"hello {i}", f"hallo {i}") for i in range(60)]
    path = tmp_path / f"pairs{suffix}"
    path.write_text(write(rows))
    train = SourceSplit(path, True, part="train", fraction=0.1).read_pairs()
    valid = SourceSplit(path, True, part="valid", fraction=0.1).read_pairs()
    assert len(valid) == 6 and sorted(train + valid) == sorted(rows) and not set(train) & set(valid)


def test_seq2seq_pipeline_on_a_split_tsv(tmp_path, isolated_cache):
    path = tmp_path / "pairs.tsv"
    path.write_text("\n".join(f"{a}\t{b}" for a, b in zip(_lines(80), _lines(80, seed=1))) + "\n")
    cfg = DataConfig(source=str(path), objective="seq2seq", valid_fraction=0.1, batch_size=2, max_pair_len=12)
    pipe = DataPipeline.build(cfg, tmp_path / "run", show_progress=False)
    assert pipe.valid[0].num_documents == 8 and pipe.train[0].num_documents == 72


def test_too_few_pairs_for_the_fraction_are_refused(tmp_path, isolated_cache):
    path = tmp_path / "pairs.tsv"
    path.write_text("".join(f"a{i}\tb{i}\n" for i in range(10)))
    cfg = DataConfig(source=str(path), objective="seq2seq", valid_fraction=0.05)
    with pytest.raises(ValueError, match=r"data\.valid_fraction=0\.05 of the 10 pairs .* at least 20"):
        DataPipeline.build(cfg, tmp_path / "run", show_progress=False)


# ---------------------------------------------------------------- config and sources
def test_valid_fraction_is_checked_on_load():
    with pytest.raises(ValueError, match=r"data\.valid_fraction: 0\.1 and data\.valid='v\.txt' .* keep one"):
        DataConfig(source="a.txt", valid="v.txt", valid_fraction=0.1)
    for bad in (0, 1, 1.5, -0.1):
        with pytest.raises(ValueError, match=r"data\.valid_fraction: expected a number in \(0, 1\)"):
            DataConfig(source="a.txt", valid_fraction=bad)


def test_own_data_needs_a_validation_split(tmp_path):
    (tmp_path / "a.txt").write_text("text\n")
    with pytest.raises(ValueError, match=r"data\.valid: .* or data\.valid_fraction"):
        source_splits(DataConfig(source=str(tmp_path / "a.txt")))


def test_a_built_in_corpus_refuses_valid_fraction(monkeypatch, tmp_path):
    import attnlab.training.data.batches as pipeline

    monkeypatch.setattr(pipeline, "resolve_source", lambda source, split, **kw: tmp_path / f"{split}.txt")
    with pytest.raises(ValueError, match="data.valid_fraction: the built-in corpus 'shakespeare' brings its own"):
        source_splits(DataConfig(source="shakespeare", valid_fraction=0.1))


# ---------------------------------------------------------------- empty and short splits
@pytest.mark.parametrize("content", ["", "\n\n  \n"])
def test_an_empty_validation_file_is_refused_before_the_tokenizer(tmp_path, isolated_cache, content):
    (tmp_path / "train.txt").write_text("\n".join(_lines(100)))
    (tmp_path / "valid.txt").write_text(content)
    cfg = _text_config(tmp_path / "train.txt", valid=str(tmp_path / "valid.txt"))
    with pytest.raises(ValueError, match=r"data\.valid '.*valid\.txt': no text in it"):
        DataPipeline.build(cfg, tmp_path / "run", show_progress=False)
    assert not (tmp_path / "run" / "tokenizer.json").exists()  # refused before anything was trained


def test_an_empty_training_source_is_refused(tmp_path, isolated_cache):
    (tmp_path / "train.txt").write_text("")
    (tmp_path / "valid.txt").write_text("\n".join(_lines(10)))
    with pytest.raises(ValueError, match=r"data\.source '.*train\.txt': no text in it"):
        DataPipeline.build(_text_config(tmp_path / "train.txt", valid=str(tmp_path / "valid.txt")), None,
                       show_progress=False)


@pytest.mark.parametrize("suffix,content", [(".tsv", ""), (".tsv", "only-one-column\n"), (".csv", "src,tgt\n")])
def test_a_validation_file_without_pairs_is_refused(tmp_path, isolated_cache, suffix, content):
    (tmp_path / f"train{suffix}").write_text("".join(f"a{i}\tb{i}\n" if suffix == ".tsv" else f"a{i},b{i}\n"
                                                     for i in range(20)))
    (tmp_path / f"valid{suffix}").write_text(content)
    cfg = DataConfig(source=str(tmp_path / f"train{suffix}"), valid=str(tmp_path / f"valid{suffix}"),
                     objective="seq2seq")
    with pytest.raises(ValueError, match=r"data\.valid '.*': no sentence pairs in it|column"):
        DataPipeline.build(cfg, tmp_path / "run", show_progress=False)


def test_a_validation_text_shorter_than_a_window_is_refused(tmp_path, isolated_cache):
    (tmp_path / "train.txt").write_text("\n".join(_lines(100)))
    (tmp_path / "valid.txt").write_text("king")  # 4 characters + EOS: no window of seq_len + 1 = 9 tokens
    cfg = _text_config(tmp_path / "train.txt", valid=str(tmp_path / "valid.txt"))
    with pytest.raises(ValueError, match=r"data\.valid '.*valid\.txt' \(5 tokens\) fills no validation batch"):
        DataPipeline.build(cfg, tmp_path / "run", show_progress=False)


def test_a_pipeline_built_without_drawing_draws_once_later_naming_its_splits(tmp_path, isolated_cache, monkeypatch):
    """The Trainer builds its pipeline with check=False and draws the first batches after its
    memory check (attnlab.training.setup.memory): the messages still name the split, and a pipeline
    draws them once."""
    (tmp_path / "train.txt").write_text("\n".join(_lines(100)))
    (tmp_path / "valid.txt").write_text("king")
    drawn = []
    monkeypatch.setattr(DataPipeline, "make_batch", lambda self, files, generator: drawn.append(files) or {})
    cfg = _text_config(tmp_path / "train.txt", valid=str(tmp_path / "valid.txt"))
    pipe = DataPipeline.build(cfg, tmp_path / "run", show_progress=False, check=False)
    assert drawn == []
    monkeypatch.undo()
    with pytest.raises(ValueError, match=r"data\.valid '.*valid\.txt' \(5 tokens\) fills no validation batch"):
        pipe.check_batches()
    (tmp_path / "valid.txt").write_text("\n".join(_lines(10)))
    pipe = DataPipeline.build(cfg, tmp_path / "run2", show_progress=False)  # drawn here
    monkeypatch.setattr(DataPipeline, "make_batch", lambda self, files, generator: drawn.append(files) or {})
    pipe.check_batches()
    assert drawn == []


def test_a_tiny_source_with_a_fraction_is_refused(tmp_path, isolated_cache):
    path = tmp_path / "all.txt"
    path.write_text("\n".join(_lines(6)) + "\n")
    with pytest.raises(ValueError, match=r"the validation part \(data\.valid_fraction=0\.05\) of data\.source .* "
                                         r"fills no validation batch.*larger data\.valid_fraction"):
        DataPipeline.build(_text_config(path, valid_fraction=0.05), tmp_path / "run", show_progress=False)


def test_a_training_text_shorter_than_a_window_is_refused(tmp_path, isolated_cache):
    (tmp_path / "train.txt").write_text("king")
    (tmp_path / "valid.txt").write_text("\n".join(_lines(10)))
    cfg = _text_config(tmp_path / "train.txt", valid=str(tmp_path / "valid.txt"))
    with pytest.raises(ValueError, match=r"data\.source '.*train\.txt' \(\d+ tokens\) is too short for one training"):
        DataPipeline.build(cfg, tmp_path / "run", show_progress=False)
