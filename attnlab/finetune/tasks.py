"""Task builders: labelled CSV splits from the built-in corpora, deterministic given a seed.

    translation_pairs   (pair task) is `text_pair` (German) a translation of `text` (English)?
                        From the `de-en` corpus (Ding dictionary sentence pairs). Each English
                        sentence appears twice: with its own German sentence (label 1) and with
                        another one (label 0) — a random one, or (hard_fraction of the time) the
                        German sentence of the nearest length. Splits are by English sentence,
                        so no sentence crosses splits. The training split may use its own share
                        of hard negatives (`train_hard_fraction`); valid/test keep `hard_fraction`.
    lexicon_pairs       the same task on dictionary words and phrases (`de-en-lexicon`): the
                        intermediate task that teaches an English model German words first.
    ui_translation_pairs the same task on LibreOffice UI strings (`libreoffice-de`): the
                        intermediate task that teaches a model to align the two languages
                        before the sentence task (examples/finetune/README.md).
    shakespeare_plays   (single text) which play is a line from? From the `shakespeare` corpus:
                        speech lines of >= min_words words from a few plays, balanced per play.
    debian_sections     (single text) which section of Debian is a package in, from its
                        description (synopsis and first paragraph)? From `debian-sections`:
                        a few sections whose names the text does not give away, balanced.

All write `train.csv`, `valid.csv`, `test.csv` (header text[,text_pair],label) with an atomic
write each, and return their paths. Same seed and corpus -> byte-identical files.
"""

from __future__ import annotations

import bisect
import csv
import io
import os
import random
import re
from pathlib import Path
from typing import Sequence

from attnlab.io.files import atomic_write_text

DEFAULT_PLAYS = ("Hamlet", "A Midsummer Night's Dream", "Henry V")
# sections a description does not name outright (unlike python, perl, rust, libdevel, doc, fonts)
DEFAULT_SECTIONS = ("admin", "games", "graphics", "net", "science", "sound", "text", "utils")
SPLITS = ("train", "valid", "test")
_WORD = re.compile(r"[^\W\d_]{2,}")  # a word: two or more letters
_ENGLISH_WORD = re.compile(r"[A-Za-z][A-Za-z'-]*")


def _write_csv(path: Path, header: Sequence[str], rows: Sequence[Sequence[str]]) -> Path:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    atomic_write_text(path, buf.getvalue())
    return path


def _sizes(n_train: int, n_valid: int, n_test: int) -> tuple[int, int, int]:
    for name, n in (("n_train", n_train), ("n_valid", n_valid), ("n_test", n_test)):
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"{name} must be an int >= 1, got {n!r}")
    return n_train, n_valid, n_test


def make_pair_examples(pairs: Sequence[tuple[str, str]], rng: random.Random, hard_fraction: float
                       ) -> list[tuple[str, str, str]]:
    """(english, german, label) rows: each pair once positive and once with another pair's German.

    A hard negative is a German sentence nearest in length (characters) among the other
    pairs, drawn at random among those equally near; a random negative is any other pair's
    German sentence."""
    if len(pairs) < 2:
        raise ValueError("need at least 2 pairs to build negatives")
    by_len = sorted(range(len(pairs)), key=lambda i: (len(pairs[i][1]), i))
    lengths = [len(pairs[i][1]) for i in by_len]
    rows = []
    for i, (en, de) in enumerate(pairs):
        rows.append((en, de, "1"))
        if rng.random() < hard_fraction:
            pos = bisect.bisect_left(lengths, len(de))
            near = [by_len[j] for j in range(max(0, pos - 3), min(len(by_len), pos + 4)) if by_len[j] != i]
            gap = min(abs(len(pairs[k][1]) - len(de)) for k in near)
            # a random one of all the sentences at that distance: a fixed tie-break would make a
            # few German sentences the negative of hundreds of pairs (a label shortcut)
            tied = [by_len[j] for n in {len(de) - gap, len(de) + gap}
                    for j in range(bisect.bisect_left(lengths, n), bisect.bisect_right(lengths, n)) if by_len[j] != i]
            j = tied[rng.randrange(len(tied))]
        else:
            j = rng.randrange(len(pairs) - 1)
            j = j + 1 if j >= i else j
        rows.append((en, pairs[j][1], "0"))
    return rows


def translation_pairs(out_dir: str | os.PathLike, *, seed: int = 0, n_train: int = 14000, n_valid: int = 300,
                      n_test: int = 500, hard_fraction: float = 0.5, train_hard_fraction: float | None = None,
                      source: str | os.PathLike | None = None) -> dict[str, Path]:
    """Write the translation-pair task (see the module docstring).

    Args:
        out_dir: folder for train.csv, valid.csv, test.csv.
        seed: picks the sentences, the negatives and the order.
        n_train, n_valid, n_test: English sentences per split (each gives 2 rows). The
            defaults use 14,800 of the corpus' 15,615 training pairs.
        hard_fraction: share of negatives that are length-matched (valid and test; train too
            unless train_hard_fraction is given).
        train_hard_fraction: share for the training split only (None: hard_fraction). Training
            on hard negatives only makes every negative informative; the held-out splits stay
            as the task defines them.
        source: a TSV of english<TAB>german pairs (default: the `de-en` corpus' train.tsv, fetched).

    Returns:
        {"train": path, "valid": path, "test": path}.

    Raises:
        ValueError: bad sizes, or fewer pairs than asked for.
    """
    from attnlab.data.sources import read_pairs

    if source is None:
        from attnlab.data.corpora import split_files

        source = split_files("de-en")["train"]
    return _write_pair_task(out_dir, sorted(set(read_pairs(source))), str(source), seed=seed,
                            sizes=_sizes(n_train, n_valid, n_test), hard_fraction=hard_fraction,
                            train_hard_fraction=train_hard_fraction)


def ui_translation_pairs(out_dir: str | os.PathLike, *, language: str = "de", seed: int = 0, n_train: int = 13000,
                         n_valid: int = 300, n_test: int = 300, min_words: int = 2, hard_fraction: float = 0.5,
                         source: str | os.PathLike | None = None) -> dict[str, Path]:
    """The translation-pair task on LibreOffice UI strings (`libreoffice-<language>` corpus,
    train and valid files): an intermediate task for the sentence task above — UI strings
    share many words with their translations (names, placeholders, loanwords), so a model
    learns to align the two sides here before the harder everyday sentences.

    Pairs whose translation equals the English string (untranslated) and English strings of
    fewer than `min_words` words are dropped. Otherwise as `translation_pairs`.

    Raises:
        ValueError: bad sizes or min_words, or fewer pairs than asked for.
        FileNotFoundError: the corpus cannot be fetched here and no `source` is given.
    """
    from attnlab.data.sources import read_pairs

    if not isinstance(min_words, int) or min_words < 1:
        raise ValueError(f"min_words must be an int >= 1, got {min_words!r}")
    if source is None:
        from attnlab.data.corpora import split_files

        files = list(split_files(f"libreoffice-{language}").values())
        source = f"libreoffice-{language}"
    else:
        files = [Path(source)]
    pairs = {(en, tr) for f in files for en, tr in read_pairs(f)
             if en != tr and len(_WORD.findall(en)) >= min_words}
    return _write_pair_task(out_dir, sorted(pairs), str(source), seed=seed, sizes=_sizes(n_train, n_valid, n_test),
                            hard_fraction=hard_fraction, train_hard_fraction=None)


def lexicon_pairs(out_dir: str | os.PathLike, *, seed: int = 0, n_train: int = 29000, n_valid: int = 500,
                  n_test: int = 500, max_words: int = 2, vocabulary: str | os.PathLike | set[str] | None = None,
                  hard_fraction: float = 0.5, source: str | os.PathLike | None = None) -> dict[str, Path]:
    """The translation-pair task on dictionary entries (`de-en-lexicon`: Ding's words and
    phrases): does this German word or phrase translate this English one? An intermediate task
    for the sentence task: an English encoder learns German vocabulary from it.

    Entries are kept when their English side is 1 to `max_words` words of letters (hyphens and
    apostrophes allowed) and, with a `vocabulary`, every English word (lower-cased) is in it —
    e.g. the model's WordPiece vocab.txt, so the words are ones the model knows whole.
    Otherwise as `translation_pairs`.

    Raises:
        ValueError: bad sizes or max_words, or fewer entries than asked for.
    """
    from attnlab.data.sources import read_pairs

    if not isinstance(max_words, int) or max_words < 1:
        raise ValueError(f"max_words must be an int >= 1, got {max_words!r}")
    if isinstance(vocabulary, (str, os.PathLike)):
        vocabulary = set(Path(vocabulary).read_text(encoding="utf-8").split())
    if source is None:
        from attnlab.data.corpora import split_files

        source = split_files("de-en-lexicon")["train"]
    pairs = set()
    for en, de in read_pairs(source):
        words = en.split()
        if not 1 <= len(words) <= max_words or not all(_ENGLISH_WORD.fullmatch(w) for w in words):
            continue
        if vocabulary is None or all(w.lower() in vocabulary for w in re.findall(r"[A-Za-z']+", en)):
            pairs.add((en, de))
    return _write_pair_task(out_dir, sorted(pairs), str(source), seed=seed, sizes=_sizes(n_train, n_valid, n_test),
                            hard_fraction=hard_fraction, train_hard_fraction=None)


def _write_pair_task(out_dir: str | os.PathLike, pairs: list[tuple[str, str]], where: str, *, seed: int,
                     sizes: tuple[int, int, int], hard_fraction: float, train_hard_fraction: float | None
                     ) -> dict[str, Path]:
    """Split sorted distinct pairs by English sentence and write each split's rows (module docstring)."""
    train_hard = hard_fraction if train_hard_fraction is None else train_hard_fraction
    for name, value in (("hard_fraction", hard_fraction), ("train_hard_fraction", train_hard)):
        if not 0 <= value <= 1:
            raise ValueError(f"{name} must be in [0, 1], got {value}")
    if len(pairs) < sum(sizes):
        raise ValueError(f"{where} has {len(pairs)} distinct pairs; {sum(sizes)} requested")
    rng = random.Random(seed)
    chosen = rng.sample(pairs, sum(sizes))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths, start = {}, 0
    for split, n in zip(SPLITS, sizes):
        split_rng = random.Random(f"{seed}:{split}")  # a split's negatives do not depend on another's
        rows = make_pair_examples(chosen[start:start + n], split_rng, train_hard if split == "train" else hard_fraction)
        split_rng.shuffle(rows)
        paths[split] = _write_csv(out / f"{split}.csv", ("text", "text_pair", "label"), rows)
        start += n
    return paths


def _write_labelled_splits(out_dir: str | os.PathLike, splits: dict[str, list[tuple[str, str]]],
                           rng: random.Random) -> dict[str, Path]:
    """train.csv, valid.csv, test.csv (text,label), each split's rows shuffled with `rng`."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for split in SPLITS:
        rows = splits[split]
        rng.shuffle(rows)
        paths[split] = _write_csv(out / f"{split}.csv", ("text", "label"), rows)
    return paths


def play_lines(text: str, min_words: int = 6) -> list[str]:
    """Speech lines of one play's plain text: not headings (ACT/SCENE), speaker tags (NAME:)
    or stage directions (Enter/Exit/Exeunt/Re-enter), with at least `min_words` words."""
    skip = ("ACT ", "SCENE ", "Enter ", "Exit", "Exeunt", "Re-enter", "Flourish", "Alarum")
    out = []
    for line in text.splitlines()[1:]:
        line = line.strip()
        if len(line.split()) < min_words or line.endswith(":") or line.startswith(skip) or line.isupper():
            continue
        out.append(line)
    return out


def shakespeare_plays(out_dir: str | os.PathLike, *, plays: Sequence[str] = DEFAULT_PLAYS, seed: int = 0,
                      n_train: int = 400, n_valid: int = 60, n_test: int = 100, min_words: int = 6,
                      source: str | os.PathLike | None = None) -> dict[str, Path]:
    """Write the which-play task: per play, n_train/n_valid/n_test distinct lines (label = title).

    Args:
        out_dir: folder for train.csv, valid.csv, test.csv.
        plays: play titles as in the corpus (first line of each document).
        seed: picks the lines and the order.
        n_train, n_valid, n_test: lines per play per split.
        min_words: shortest line kept.
        source: the corpus' train.txt (default: the `shakespeare` corpus, fetched).

    Returns:
        {"train": path, "valid": path, "test": path}.

    Raises:
        ValueError: an unknown play (with the titles there are), or too few lines.
    """
    from attnlab.data.corpora import DOC_SEPARATOR

    sizes = _sizes(n_train, n_valid, n_test)
    if source is None:
        from attnlab.data.corpora import split_files

        source = split_files("shakespeare")["train"]
    docs = {d.strip().split("\n", 1)[0]: d.strip() for d in Path(source).read_text(encoding="utf-8").split(DOC_SEPARATOR)
            if d.strip()}
    if len(set(plays)) != len(plays) or len(plays) < 2:
        raise ValueError(f"plays must be at least 2 distinct titles, got {list(plays)}")
    rng = random.Random(seed)
    splits: dict[str, list[tuple[str, str]]] = {s: [] for s in SPLITS}
    for title in plays:
        if title not in docs:
            raise ValueError(f"play {title!r} is not in {source}; titles: {sorted(docs)}")
        lines = sorted(set(play_lines(docs[title], min_words)))
        if len(lines) < sum(sizes):
            raise ValueError(f"{title!r} has {len(lines)} lines of >= {min_words} words; {sum(sizes)} requested")
        chosen = rng.sample(lines, sum(sizes))
        start = 0
        for split, n in zip(SPLITS, sizes):
            splits[split].extend((line, title) for line in chosen[start:start + n])
            start += n
    return _write_labelled_splits(out_dir, splits, rng)


def debian_sections(out_dir: str | os.PathLike, *, sections: Sequence[str] = DEFAULT_SECTIONS, seed: int = 0,
                    n_train: int = 400, n_valid: int = 20, n_test: int = 40,
                    source: dict[str, str | os.PathLike] | None = None) -> dict[str, Path]:
    """Write the which-section task: per section, n_train descriptions from the corpus's training
    side, n_valid and n_test from its held-out side (no text on both sides; label = section).
    The held-out side is a tenth of the descriptions (graphics has 66 there), hence the small
    default valid and test sizes: 160 and 320 rows over the 8 default sections.

    Args:
        out_dir: folder for train.csv, valid.csv, test.csv.
        sections: Debian sections (at least 2, distinct).
        seed: picks the rows and the order.
        source: {"train": tsv, "valid": tsv} (`text<TAB>section` rows); default the
            `debian-sections` corpus, fetched.

    Returns:
        {"train": path, "valid": path, "test": path}.

    Raises:
        ValueError: fewer than 2 or repeated sections, or a section with too few descriptions
            (the message gives the counts).
    """
    if len(set(sections)) != len(sections) or len(sections) < 2:
        raise ValueError(f"sections must be at least 2 distinct names, got {list(sections)}")
    if source is None:
        from attnlab.data.corpora import split_files

        source = split_files("debian-sections")
    read = lambda path: [tuple(line.split("\t", 1)) for line in Path(path).read_text(encoding="utf-8").splitlines()]
    rng = random.Random(seed)
    splits: dict[str, list[tuple[str, str]]] = {s: [] for s in SPLITS}
    pools = {side: read(source[side]) for side in ("train", "valid")}
    for section in sections:
        train = sorted(t for t, label in pools["train"] if label == section)
        held = sorted(t for t, label in pools["valid"] if label == section)
        if len(train) < n_train or len(held) < n_valid + n_test:
            raise ValueError(f"section {section!r} has {len(train)} training and {len(held)} held-out descriptions; "
                             f"{n_train} and {n_valid + n_test} requested")
        splits["train"] += [(t, section) for t in rng.sample(train, n_train)]
        chosen = rng.sample(held, n_valid + n_test)
        splits["valid"] += [(t, section) for t in chosen[:n_valid]]
        splits["test"] += [(t, section) for t in chosen[n_valid:]]
    return _write_labelled_splits(out_dir, splits, rng)
