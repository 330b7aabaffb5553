"""Language tasks from the LibreOffice UI catalogues (`libreoffice-<lang>` corpora).

    language_id        (single text) which language is a UI string in? English comes from the
                       msgids, the others from the msgstrs of each catalogue.
    language_tags      (token classification) sentences that mix words from two catalogues:
                       label each word with its language.

Both start from the same string pool:

    1. every (english, translation) pair of each language's corpus (train.tsv and valid.tsv);
    2. strings with fewer than `min_letters` letters are dropped, and so is every string that
       occurs in more than one language (untranslated UI strings, "PDF", "OK", ...), so no
       text has two right answers;
    3. the English strings are shuffled with the seed and cut 80/10/10 into train/valid/test;
       a translation goes to the split of its English source (the smallest one if it
       translates several), so the translations of one message never straddle splits.

Same seed and corpora -> byte-identical files. Written atomically.
"""

from __future__ import annotations

import os
import random
import re
from pathlib import Path
from typing import Mapping, Sequence

from attnlab.finetune.tasks import SPLITS, _sizes, _write_csv
from attnlab.finetune.tokens import WordExample, to_jsonl

DEFAULT_LANGUAGES = ("en", "de", "fr", "es", "it", "nl", "pt")
_LETTER = re.compile(r"[^\W\d_]")


def _read_sources(languages: Sequence[str], sources: Mapping[str, str | os.PathLike] | None
                  ) -> dict[str, list[tuple[str, str]]]:
    """(english, translation) pairs per non-English language, fetched or from `sources`."""
    from attnlab.data.sources import read_pairs

    out = {}
    for lang in languages:
        if lang == "en":
            continue
        if sources is not None and lang in sources:
            files = [Path(sources[lang])]
        else:
            from attnlab.data.corpora import split_files

            try:
                files = list(split_files(f"libreoffice-{lang}").values())
            except FileNotFoundError as err:
                raise FileNotFoundError(
                    f"{err}\nFor the language tasks, pass sources={{'{lang}': 'pairs.tsv', ...}}: "
                    "TSV files of english<TAB>translation per language") from None
        out[lang] = [pair for f in files for pair in read_pairs(f)]
    return out


def string_pool(languages: Sequence[str] = DEFAULT_LANGUAGES, *, seed: int = 0, min_letters: int = 3,
                sources: Mapping[str, str | os.PathLike] | None = None) -> dict[str, dict[str, list[str]]]:
    """The deduplicated strings of each language by split (module docstring, steps 1-3).

    Args:
        languages: language codes; "en" means the English msgids.
        seed: the split of the English strings.
        min_letters: shortest string kept, in letters.
        sources: optional {lang: TSV of english<TAB>translation} instead of the fetched corpora.

    Returns:
        {split: {lang: sorted strings}}.

    Raises:
        ValueError: fewer than 2 languages, or a language without its corpus name.
        FileNotFoundError: no Debian tools and no `sources` for a language.
    """
    if len(set(languages)) != len(languages) or len(languages) < 2:
        raise ValueError(f"languages must be at least 2 distinct codes, got {list(languages)}")
    pairs = _read_sources(languages, sources)
    english = sorted({en for lang_pairs in pairs.values() for en, _ in lang_pairs})
    rng = random.Random(seed)
    rng.shuffle(english)
    n = len(english)
    split_of = {en: (0 if i < 0.8 * n else 1 if i < 0.9 * n else 2) for i, en in enumerate(english)}
    found: dict[str, dict[str, int]] = {lang: {} for lang in languages}  # lang -> string -> split index
    for lang in languages:
        items = [(en, en) for en in english] if lang == "en" else pairs[lang]
        for en, text in items:
            found[lang][text] = min(found[lang].get(text, 2), split_of[en])
    owners: dict[str, int] = {}
    for lang in languages:
        for text in found[lang]:
            owners[text] = owners.get(text, 0) + 1
    pool: dict[str, dict[str, list[str]]] = {s: {lang: [] for lang in languages} for s in SPLITS}
    for lang in languages:
        for text, split in sorted(found[lang].items()):
            if owners[text] == 1 and len(_LETTER.findall(text)) >= min_letters:
                pool[SPLITS[split]][lang].append(text)
    return pool


def language_id(out_dir: str | os.PathLike, *, languages: Sequence[str] = DEFAULT_LANGUAGES, seed: int = 0,
                n_train: int = 1000, n_valid: int = 100, n_test: int = 200, min_letters: int = 3,
                sources: Mapping[str, str | os.PathLike] | None = None) -> dict[str, Path]:
    """Write the language-identification task: per language n strings per split (label = code).

    Args:
        out_dir: folder for train.csv, valid.csv, test.csv (header text,label).
        languages, seed, min_letters, sources: as for `string_pool`.
        n_train, n_valid, n_test: strings per language per split.

    Returns:
        {"train": path, "valid": path, "test": path}.

    Raises:
        ValueError: bad sizes, or a language with too few strings in a split (named).
    """
    sizes = _sizes(n_train, n_valid, n_test)
    pool = string_pool(languages, seed=seed, min_letters=min_letters, sources=sources)
    rng = random.Random(seed)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for split, n in zip(SPLITS, sizes):
        rows = []
        for lang in languages:
            strings = pool[split][lang]
            if len(strings) < n:
                raise ValueError(f"language {lang!r} has {len(strings)} {split} strings; {n} requested")
            rows.extend((text, lang) for text in rng.sample(strings, n))
        rng.shuffle(rows)
        paths[split] = _write_csv(out / f"{split}.csv", ("text", "label"), rows)
    return paths


def language_tags(out_dir: str | os.PathLike, *, languages: Sequence[str] = ("en", "de"), seed: int = 0,
                  n_train: int = 2000, n_valid: int = 200, n_test: int = 400, max_words: int = 24,
                  min_letters: int = 3, sources: Mapping[str, str | os.PathLike] | None = None) -> dict[str, Path]:
    """Write the word-level language-tagging task: each row joins 2-4 UI strings of the
    given languages (at least two different ones), every word labelled with its string's language.

    Args:
        out_dir: folder for train.jsonl, valid.jsonl, test.jsonl ({"words": [...], "labels": [...]}).
        languages: 2 or more language codes (as for `string_pool`).
        seed: the strings, their order and the split.
        n_train, n_valid, n_test: rows per split.
        max_words: longest row; strings of more words are not used.
        min_letters, sources: as for `string_pool`.

    Returns:
        {"train": path, "valid": path, "test": path}.

    Raises:
        ValueError: bad sizes or max_words, or a language without strings short enough in a split.
    """
    sizes = _sizes(n_train, n_valid, n_test)
    if not isinstance(max_words, int) or max_words < 4:
        raise ValueError(f"max_words must be an int >= 4, got {max_words!r}")
    pool = string_pool(languages, seed=seed, min_letters=min_letters, sources=sources)
    rng = random.Random(f"{seed}:tags")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for split, n in zip(SPLITS, sizes):
        short = {lang: [s.split() for s in pool[split][lang] if len(s.split()) <= max_words // 4]
                 for lang in languages}
        for lang, strings in short.items():
            if not strings:
                raise ValueError(f"language {lang!r} has no {split} string of <= {max_words // 4} words")
        rows = []
        for _ in range(n):
            langs = rng.sample(list(languages), 2)
            langs += [rng.choice(languages) for _ in range(rng.randrange(3))]
            rng.shuffle(langs)
            words, labels = [], []
            for lang in langs:
                piece = rng.choice(short[lang])
                words += piece
                labels += [lang] * len(piece)
            rows.append(WordExample(words, labels))
        paths[split] = to_jsonl(rows, out / f"{split}.jsonl")
    return paths


def pretraining_text(out_dir: str | os.PathLike, *, languages: Sequence[str] = DEFAULT_LANGUAGES, seed: int = 0,
                     min_letters: int = 3, sources: Mapping[str, str | os.PathLike] | None = None) -> dict[str, Path]:
    """Write the pool's train strings (train.txt) and valid strings (valid.txt), one per line in
    a seeded order, for pretraining a model with `attnlab train` that never sees a test string.

    Args:
        out_dir: folder for train.txt and valid.txt.
        languages, seed, min_letters, sources: as for `string_pool` (use the task's seed).

    Returns:
        {"train": path, "valid": path}.
    """
    from attnlab.io.files import atomic_write_text

    pool = string_pool(languages, seed=seed, min_letters=min_letters, sources=sources)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(f"{seed}:pretrain")
    paths = {}
    for split in ("train", "valid"):
        lines = [text for lang in languages for text in pool[split][lang]]
        rng.shuffle(lines)
        paths[split] = out / f"{split}.txt"
        atomic_write_text(paths[split], "\n".join(lines) + "\n")
    return paths
