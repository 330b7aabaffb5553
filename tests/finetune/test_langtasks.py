"""Language tasks from UI catalogues: deduplicated, trivial strings dropped, split by English
source, deterministic; the off-Debian error points at `sources`."""

import csv
import json

import pytest

from attnlab.data import corpora
from attnlab.finetune.langtasks import language_id, language_tags, pretraining_text, string_pool

EN = [f"Insert row number {i}" for i in range(40)] + ["OK", "PDF export", "Ab"]
TRANSLATIONS = {
    "de": [f"Zeile Nummer {i} einfügen" for i in range(40)] + ["OK", "PDF export", "Ab"],
    "fr": [f"Insérer la ligne numéro {i}" for i in range(40)] + ["OK", "Export PDF", "Ab"],
}


@pytest.fixture()
def sources(tmp_path):
    out = {}
    for lang, texts in TRANSLATIONS.items():
        path = tmp_path / f"{lang}.tsv"
        path.write_text("".join(f"{en}\t{tr}\n" for en, tr in zip(EN, texts)), encoding="utf-8")
        out[lang] = path
    return out


def _rows(path):
    with open(path, encoding="utf-8", newline="") as f:
        return list(csv.DictReader(f))


def test_string_pool_drops_duplicates_and_trivial_strings_and_splits_by_english(sources):
    pool = string_pool(["en", "de", "fr"], seed=1, sources=sources)
    everything = [(s, lang, t) for s in pool for lang in pool[s] for t in pool[s][lang]]
    texts = [t for _, _, t in everything]
    assert len(texts) == len(set(texts))  # no string in two languages or two splits
    assert "OK" not in texts and "Ab" not in texts  # shared across languages / fewer than 3 letters
    assert "PDF export" not in texts and "Export PDF" in texts  # untranslated in de -> shared with en
    for s in pool:  # the translations of message i sit in the split of its English source
        numbers = {lang: {t.split()[-1 if lang == "en" else (2 if lang == "de" else -1)] for t in pool[s][lang]}
                   for lang in pool[s]}
        assert numbers["en"] == numbers["de"] == numbers["fr"] - {"PDF"}
    sizes = [sum(len(v) for v in pool[s].values()) for s in ("train", "valid", "test")]
    assert sizes[0] > sizes[1] > 0 and sizes[2] > 0
    assert string_pool(["en", "de", "fr"], seed=1, sources=sources) == pool
    assert string_pool(["en", "de", "fr"], seed=2, sources=sources) != pool


def test_language_id_is_balanced_and_deterministic(tmp_path, sources):
    a = language_id(tmp_path / "a", languages=["en", "de", "fr"], n_train=20, n_valid=2, n_test=2, sources=sources)
    b = language_id(tmp_path / "b", languages=["en", "de", "fr"], n_train=20, n_valid=2, n_test=2, sources=sources)
    assert all(a[s].read_bytes() == b[s].read_bytes() for s in a)
    rows = _rows(a["train"])
    assert sorted(r["label"] for r in rows) == ["de"] * 20 + ["en"] * 20 + ["fr"] * 20
    truth = {t: lang for lang, texts in TRANSLATIONS.items() for t in texts} | {e: "en" for e in EN}
    assert all(truth[r["text"]] == r["label"] for s in a for r in _rows(a[s]))
    with pytest.raises(ValueError, match=r"language 'en' has \d+ train strings; 100 requested"):
        language_id(tmp_path / "c", languages=["en", "de"], n_train=100, sources=sources)
    with pytest.raises(ValueError, match="at least 2 distinct"):
        language_id(tmp_path / "d", languages=["de"], sources=sources)


def test_language_tags_label_every_word_with_its_strings_language(tmp_path, sources):
    paths = language_tags(tmp_path / "t", languages=["en", "de"], n_train=30, n_valid=5, n_test=5, sources=sources)
    rows = [json.loads(x) for x in paths["train"].read_text(encoding="utf-8").splitlines()]
    assert len(rows) == 30
    vocab = {lang: {w for t in texts for w in t.split()} for lang, texts in (("en", EN), ("de", TRANSLATIONS["de"]))}
    for r in rows:
        assert len(r["words"]) == len(r["labels"]) <= 24 and set(r["labels"]) == {"en", "de"}
        assert all(w in vocab[lang] for w, lang in zip(r["words"], r["labels"]))
    text = pretraining_text(tmp_path / "p", languages=["en", "de"], sources=sources)
    held_out = {t for s in ("test",) for lang in ("en", "de")
                for t in string_pool(["en", "de"], sources=sources)[s][lang]}
    assert held_out and not held_out & set(text["train"].read_text(encoding="utf-8").splitlines())


def test_off_debian_without_sources_names_the_sources_argument(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(corpora.shutil, "which", lambda name: None)
    with pytest.raises(FileNotFoundError, match=r"Debian or Ubuntu[\s\S]*sources=\{'de'"):
        language_id(tmp_path / "x", languages=["en", "de"])
