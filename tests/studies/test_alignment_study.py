"""examples/studies/alignment: the alignment error rate, pieces pooled into words, the Strong's
reference, the symmetrisation, and the attributions against direct autograd computations."""

from __future__ import annotations

import sys

import pytest
import torch

from attnlab import ModelConfig, build_model
from attnlab.inspect.attribution import gradient_x_input, integrated_gradients
from attnlab.tokenizers import Tokenizer

from tests.studies import STUDIES

sys.path.insert(0, str(STUDIES / "alignment"))
import align  # noqa: E402
import scores  # noqa: E402
import statistical  # noqa: E402

TEXTS = ["Moses sent them to spy out the land of Canaan.", "Moisés envió á reconocer la tierra de Canaán.",
         "and said to them, go up this way", "y les dijo: subid por aquí"]


def test_aer_follows_och_and_ney():
    sure, possible = {(0, 0)}, {(0, 0), (1, 1)}
    # |A&S| = 1, |A&P| = 2, |A| = 3, |S| = 1: 1 - 3/4
    counts = align.aer({(0, 0), (1, 1), (2, 1)}, sure, possible)
    assert counts == (1, 2, 3, 1)
    assert align.aer_from_counts([counts]) == pytest.approx(0.25)
    assert align.aer_from_counts([align.aer(sure, sure, possible)]) == 0.0  # exactly the sure links
    assert align.aer_from_counts([align.aer({(1, 1)}, sure, possible)]) == pytest.approx(0.5)  # possible only
    assert align.aer_from_counts([align.aer({(2, 2)}, sure, possible)]) == 1.0
    # counts add up over sentences before the ratio (not a mean of ratios)
    assert align.aer_from_counts([(1, 1, 1, 1), (0, 0, 3, 1)]) == pytest.approx(1 - 2 / 6)
    with pytest.raises(ValueError, match="counts"):
        align.aer_from_counts([(0, 0, 0, 0)])


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.train(TEXTS * 3, kind="bpe", vocab_size=300, special_tokens=["<pad>", "<unk>", "<s>", "</s>"],
                           lowercase=False)


@pytest.mark.parametrize("text", TEXTS)
def test_each_piece_maps_to_the_word_it_spells(tok, text):
    ids = tok.encode(text)
    spans = align.words(text)
    owner = align.piece_words(align.piece_spans(tok.decode, ids, text), spans)
    assert len(owner) == len(ids)
    for k, (a, b) in enumerate(spans):
        spelled = tok.decode([i for i, w in zip(ids, owner) if w == k]).strip()  # pieces may split a character
        assert spelled == text[a:b]
    for i, w in zip(ids, owner):  # pieces of no word spell no letter
        if w < 0:
            assert not any(c.isalnum() for c in tok.decode([i]))


def test_piece_spans_refuse_ids_of_another_text(tok):
    with pytest.raises(ValueError, match="ids"):
        align.piece_spans(tok.decode, tok.encode("the land"), "the lands")


def test_pool_sums_source_pieces_and_averages_target_pieces():
    m = torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.5, 0.1, 0.1, 0.3], [0.0, 1.0, 0.0, 0.0]])
    # target pieces 0, 1 are word 0, piece 2 is word 1; source pieces 0, 1 are word 0, 2 is word 1, 3 none
    got = align.pool(m, [0, 0, 1], [0, 0, 1, -1], 2, 2)
    want = torch.tensor([[(0.3 + 0.6) / 2, (0.3 + 0.1) / 2], [1.0, 0.0]], dtype=torch.float64)
    assert torch.allclose(got, want)


def test_links_from_scores():
    s = torch.tensor([[0.1, 0.7, 0.2], [0.5, 0.0, 0.5], [0.0, 0.0, 1.0]])
    assert align.argmax_links(s) == {(1, 0), (0, 1), (2, 2)}  # (source, target)
    assert align.threshold_links(s, 0.2) == {(1, 0), (2, 0), (0, 1), (2, 1), (2, 2)}
    assert align.restrict({(1, 0), (2, 2)}, [True, True, False], [True, True, True]) == {(1, 0)}


def test_osis_words_carry_their_strongs_numbers_and_skip_notes():
    osis = ('<w lemma="strong:H4872">Moses</w> <w lemma="strong:H7971">sent</w><note>a note</note> '
            '<w lemma="strong:H0776 strong:H9">the land</w>, <transChange>of</transChange> Canaan.')
    assert align.osis_words(osis) == [("Moses", {"H4872"}), ("sent", {"H7971"}), ("the", {"H776", "H9"}),
                                      ("land", {"H776", "H9"}), ("of", set()), ("Canaan", set())]


def test_strongs_reference_sure_only_where_a_number_is_one_to_one():
    en = [frozenset({"H1"}), frozenset({"H2"}), frozenset({"H2"}), frozenset(), frozenset({"H4"})]
    es = [frozenset({"H2"}), frozenset({"H1"}), frozenset({"H3"}), frozenset({"H4"}), frozenset({"H4"})]
    sure, possible = align.strongs_reference(en, es)
    # H2: two English words, one Spanish; H4: one English word, two Spanish; only H1 is one-to-one
    assert possible == {(0, 1), (1, 0), (2, 0), (4, 3), (4, 4)}
    assert sure == {(0, 1)}


def test_grow_diag_final_and():
    forward = {(0, 0), (3, 3)}
    reverse = {(0, 0), (1, 1), (3, 4)}
    # intersection {(0,0)}; (1,1) is its diagonal neighbour with both words unaligned -> grown;
    # nothing is next to (3,3) or (3,4); final-and adds (3,3) (both words unaligned), then not
    # (3,4) (its source word 3 is now aligned)
    assert statistical.grow_diag_final_and(forward, reverse) == {(0, 0), (1, 1), (3, 3)}
    # a link next to the grown ones is taken while one of its words is unaligned
    assert statistical.grow_diag_final_and({(0, 0), (1, 1)}, {(0, 0), (1, 2)}) == {(0, 0), (1, 1), (1, 2)}
    assert statistical.parse_links("0-1 2-3") == {(0, 1), (2, 3)}


def tiny(arch: str, tok: Tokenizer) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = ModelConfig(arch=arch, vocab_size=tok.vocab_size, d_model=16, num_layers=2, num_heads=2, d_ff=32,
                      dropout=0.0, pad_token_id=tok.pad_token_id, position={"scheme": "learned", "max_len": 64},
                      rnn={"cell": "lstm", "attention": "additive", "hidden_size": 16})
    return build_model(cfg).eval()


@pytest.mark.parametrize("arch", ["encoder_decoder", "rnn_encoder_decoder"])
def test_each_row_is_the_attribution_of_its_own_piece(tok, arch):
    """The study scores all target pieces in one batch (row t: piece t's log-probability); each
    row equals attnlab's attribution of that one piece asked for alone, at its position."""
    model = tiny(arch, tok).double()  # float64: the scores of an untrained model are ~1e-5
    src, tgt_in, labels = scores.teacher_forcing(tok, TEXTS[0], TEXTS[1])
    got = scores.attribution_scores(model, src, tgt_in, labels, steps=3)
    T, S = labels.shape[1] - 1, src.shape[1]
    assert got["grad_x_input"].shape == got["integrated_gradients"].shape == (T, S)
    for t in (0, 3, T - 1):
        one = dict(target=int(labels[0, t]), position=t, side="source")
        gxi = gradient_x_input(model, src, tgt_in, **one).scores[0].abs()
        ig = integrated_gradients(model, src, tgt_in, steps=3, **one).scores[0].abs()
        torch.testing.assert_close(got["grad_x_input"][t], gxi, rtol=1e-5, atol=1e-10)
        torch.testing.assert_close(got["integrated_gradients"][t], ig, rtol=1e-5, atol=1e-10)
    assert not torch.allclose(got["integrated_gradients"][0], got["integrated_gradients"][3])
    with pytest.raises(ValueError, match="steps"):
        scores.attribution_scores(model, src, tgt_in, labels, steps=0)


@pytest.mark.parametrize("arch", ["encoder_decoder", "rnn_encoder_decoder"])
def test_attention_rows_are_the_steps_that_predict_each_piece(tok, arch):
    model = tiny(arch, tok)
    src, tgt_in, labels = scores.teacher_forcing(tok, TEXTS[0], TEXTS[1])
    maps = scores.attention_scores(model, src, tgt_in)
    shifted = scores.attention_scores(model, src, tgt_in, shifted=True)
    T, S = labels.shape[1] - 1, src.shape[1]
    assert len(maps) == (2 if arch == "encoder_decoder" else 1)
    for name, w in maps.items():
        assert w.shape[1:] == (T, S)
        assert torch.allclose(w.sum(-1), torch.ones(w.shape[:2]), atol=1e-5)
        assert torch.allclose(shifted[name][:, :-1], w[:, 1:])


@pytest.mark.slow
def test_the_study_runs_end_to_end_at_a_tiny_budget(tmp_path):
    """Training to a few seconds' mark, the Strong's reference and the verse-pairing check on the real
    modules, eflomal on 300 training pairs, scoring, faithfulness, tables and plots."""
    import json
    import os
    import subprocess

    out = tmp_path / "study"
    cmd = [sys.executable, str(STUDIES / "alignment" / "run.py"), "--out", str(out), "--models", "transformer",
           "--marks", "0.05", "--verses", "4", "--attribution-verses", "2", "--ig-steps", "2", "--faith-verses", "2",
           "--eflomal-pairs", "300"]
    subprocess.run(cmd, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=3000)
    ref = json.loads((out / "reference.json").read_text())
    # the corpus pairs Numbers 13:17 ("Moses sent them to spy out ...") with the Spanish verse before it
    assert ref["numbers_13_17"]["flagged"] and ref["numbers_13_17"]["target"].startswith("Estos son los nombres")
    result = json.loads((out / "transformer" / "alignment.json").read_text())
    (mark, r), = result.items()
    assert mark == "0.05min" and r["verses"] == 4
    for method in ("L0 h0", "all layers mean", "input all layers mean", "diagonal"):
        assert 0.0 <= r["aer"][method]["argmax"] <= 1.0
    for method in ("grad_x_input", "integrated_gradients"):
        assert 0.0 <= r["aer_attribution_subset"][method]["argmax"] <= 1.0
    assert 0.0 <= r["aer"]["eflomal grow-diag-final-and"]["links"] <= 1.0
    assert r["faithfulness"]["verses"] == 2 and 0.0 <= r["faithfulness"]["greedy"]["chrf"] <= 100.0
    text = (out / "results.md").read_text()
    assert "cross-attention head" in text and "Faithfulness" in text and "greedy BLEU" in text
    assert (out / "aer_heads.png").exists() and (out / "example_transformer.png").exists()


def test_verse_shifts_flag_a_pair_whose_neighbour_shares_more_numbers():
    import reference

    def osis(*numbers):
        return " ".join(f'<w lemma="strong:{n}">w{n}</w>' for n in numbers)

    en = {("Num", 13, 1): osis("H1", "H2"), ("Num", 13, 2): osis("H3", "H4"), ("Num", 13, 3): osis("H5", "H6")}
    es = {("Num", 13, 1): osis("H1", "H2"), ("Num", 13, 2): osis("H9"), ("Num", 13, 3): osis("H3", "H4")}
    verses = {"en": en, "es": es, "pairs": {ref: ("x", "y") for ref in en}}
    found = reference.verse_shifts(verses)
    # 13:2's English matches the Spanish 13:3 (one verse on); 13:3 matches nothing near it; 13:1 is right
    assert found["flagged"] == 1 and found["chapters"] == {"Num 13": [2]}
    assert found["examples"][0]["neighbour"] == 1 and found["examples"][0]["own"] == 0.0
