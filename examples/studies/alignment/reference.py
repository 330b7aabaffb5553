"""The reference alignment of the held-out verses and the check of the corpus's verse pairing, both
from the Strong's numbers the two Bible modules carry (`Feature=StrongsNumbers` in both modules'
conf: every word of the World English Bible and of the Reina-Valera 1909 sits in a
`<w lemma="strong:H0776">` element naming the Hebrew or Greek word it translates).

The modules come from the same two Debian packages, at the same recorded versions and hashes, as
the `bible-en-es` corpus (`attnlab.data.corpora.SWORD_BIBLES`).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from align import osis_words, overlap
from attnlab.data.bible import ZTextModule, held_out_verse, osis_to_text, verse_pairs

Reference = tuple[str, int, int]
ENGLISH, SPANISH = "engWEB2015eb", "spaRV1909eb"


def sword_root(out: Path) -> Path:
    """The two modules unpacked under `out/sword` (downloaded and hash-checked once)."""
    from attnlab.data.corpora import download_packages

    root = out / "sword" / "usr" / "share" / "sword"
    if not root.exists():
        tmp = out / "sword.partial"
        shutil.rmtree(tmp, ignore_errors=True)
        for path in download_packages("bible-en-es", out / "sword-debs"):
            subprocess.run(["dpkg-deb", "-x", str(path), str(tmp)], check=True)
        tmp.rename(out / "sword")
    return root


def raw_verses(module: ZTextModule) -> dict[Reference, str]:
    """Every verse's OSIS (unstripped), keyed as `ZTextModule.verses` keys it."""
    verses = {}
    for testament, books in module.structure.get_books().items():
        for book in books:
            refs = [(book.osis_name, c, v) for c, n in enumerate(book.chapter_lengths, start=1) for v in range(1, n + 1)]
            for ref, index in zip(refs, module.structure.ref_to_indicies(books=[book.name])[testament]):
                verses[ref] = module.entry(testament, index)
    return verses


def tagged_verses(root: Path) -> dict[str, dict[Reference, str]]:
    """{"en": {ref: OSIS}, "es": {ref: OSIS}, "pairs": the corpus's verse pairs (ref -> (en, es) plain text)}."""
    english, spanish = ZTextModule(root, ENGLISH), ZTextModule(root, SPANISH)
    lengths, other = english.chapter_lengths(), spanish.chapter_lengths()
    same = {key for key, count in lengths.items() if other.get(key) == count}
    en, es = raw_verses(english), raw_verses(spanish)
    plain_en = {r: t for r, x in en.items() if (t := osis_to_text(x))}
    plain_es = {r: t for r, x in es.items() if (t := osis_to_text(x))}
    pairs = {ref: (s, t) for ref, s, t in verse_pairs(plain_en, plain_es, same)}
    return {"en": en, "es": es, "pairs": pairs}


def held_out(verses: dict, valid: list[tuple[str, str]], every: int = 30) -> list[dict]:
    """The held-out verse pairs (the corpus's 1 in `every`) that are in `valid` (the corpus's
    valid.tsv), each with its reference and both sides' words with their Strong's numbers.
    A verse whose tagged words are not its plain text's words is left out (counted by the caller)."""
    wanted = set(valid)
    out = []
    for ref, (s, t) in verses["pairs"].items():
        if not held_out_verse(ref, every) or (s, t) not in wanted:
            continue
        out.append({"ref": f"{ref[0]} {ref[1]}:{ref[2]}", "source": s, "target": t,
                    "source_words": osis_words(verses["en"][ref]), "target_words": osis_words(verses["es"][ref])})
    return out


def verse_shifts(verses: dict, margin: float = 0.1) -> dict:
    """Where the corpus pairs an English verse with the wrong Spanish one: for every pair, the
    Strong's overlap of the English verse with its own Spanish verse and with the Spanish verses
    one before and one after; a pair is flagged when a neighbour overlaps more than its own by
    `margin`. Returns the count, the flagged references grouped by chapter, and the overlaps."""
    en = {ref: osis_words(x) for ref, x in verses["en"].items() if ref in verses["pairs"]}
    es_cache: dict = {}

    def es(ref):
        if ref not in es_cache:
            es_cache[ref] = osis_words(verses["es"].get(ref, ""))
        return es_cache[ref]

    flagged, chapters = [], {}
    for ref in verses["pairs"]:
        book, c, v = ref
        src = [n for _, n in en[ref]]
        own = overlap(src, [n for _, n in es(ref)])
        near = {d: overlap(src, [n for _, n in es((book, c, v + d))]) for d in (-1, 1)}
        d = max(near, key=near.get)
        if near[d] > own + margin:
            flagged.append({"ref": f"{book} {c}:{v}", "own": round(own, 3), "neighbour": d,
                            "neighbour_overlap": round(near[d], 3)})
            chapters.setdefault(f"{book} {c}", []).append(v)
    return {"pairs": len(verses["pairs"]), "flagged": len(flagged), "margin": margin,
            "chapters": chapters, "examples": flagged[:40]}
