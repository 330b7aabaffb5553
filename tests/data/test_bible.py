"""The `bible-en-es` corpora: SWORD zText modules in the real file format (written here from a
few verses, laid out by pysword's versifications), read, cleaned, aligned by verse and split
with no held-out sentence in training."""

import shutil
import struct
import subprocess
import zlib

import pytest
from pysword.books import BibleStructure
from pysword.modules import SwordModules

from attnlab.data import corpora
from attnlab.data.bible import ZTextModule, osis_to_text, split_pairs, verse_pairs


def _indices(versification: str) -> dict[tuple[str, int, int], tuple[str, int]]:
    """(OSIS book, chapter, verse) -> (testament, entry index), as the module files lay them out."""
    structure = BibleStructure(versification)
    out = {}
    for testament, books in structure.get_books().items():
        for book in books:
            refs = [(book.osis_name, c, v) for c, n in enumerate(book.chapter_lengths, 1) for v in range(1, n + 1)]
            out.update(zip(refs, ((testament, i) for i in structure.ref_to_indicies(books=[book.name])[testament])))
    return out


def write_ztext(root, name: str, versification: str, verses: dict[tuple[str, int, int], str]) -> None:
    """A zText module (ZIP compression, one block per book) holding `verses` (OSIS text)."""
    index = _indices(versification.lower())
    folder = root / "modules" / "texts" / "ztext" / name
    folder.mkdir(parents=True)
    (root / "mods.d").mkdir(exist_ok=True)
    (root / "mods.d" / f"{name.lower()}.conf").write_text(
        f"[{name}]\nDataPath=./modules/texts/ztext/{name}/\nModDrv=zText\nSourceType=OSIS\nEncoding=UTF-8\n"
        f"CompressType=ZIP\nBlockType=BOOK\nVersification={versification}\n", encoding="utf-8")
    for testament in ("ot", "nt"):
        size = 1 + max(i for t, i in index.values() if t == testament)
        entries = [(0, 0, 0)] * size
        blocks, data = [], b""
        for book in dict.fromkeys(ref[0] for ref in verses if index[ref][0] == testament):
            plain = b""
            for ref, text in verses.items():
                if ref[0] == book:
                    raw = text.encode("utf-8")
                    entries[index[ref][1]] = (len(blocks), len(plain), len(raw))
                    plain += raw
            packed = zlib.compress(plain)
            blocks.append((len(data), len(packed), len(plain)))
            data += packed
        (folder / f"{testament}.bzv").write_bytes(b"".join(struct.pack("<IIH", *e) for e in entries))
        (folder / f"{testament}.bzs").write_bytes(b"".join(struct.pack("<III", *b) for b in blocks))
        (folder / f"{testament}.bzz").write_bytes(data)


def _held_out_reference(book: str, chapter: int) -> tuple[str, int, int]:
    """A verse of `book` `chapter` that the 1-in-30 verse split holds out."""
    for verse in range(1, 200):
        if zlib.crc32(f"{book} {chapter}:{verse}".encode()) % 30 == 0:
            return (book, chapter, verse)
    raise AssertionError("no held-out verse")


REFRAIN_EN, REFRAIN_ES = "for his loving kindness endures forever.", "porque para siempre es su misericordia."
HELD = _held_out_reference("Ps", 136)
OTHER = (HELD[0], HELD[1], HELD[2] % 26 + 1)  # other verses of Psalm 136 (26 verses), in training
REPEAT = (HELD[0], HELD[1], (HELD[2] + 1) % 26 + 1)
ENGLISH = {
    ("Gen", 1, 1): '<w lemma="strong:H7225">In the beginning</w>, <w>God</w><note placement="foot">'
                   '<reference>1:1 </reference>The Hebrew word is “Elohim”.</note><w>created</w> the heavens.',
    ("Gen", 1, 2): "The earth was formless and empty.",
    ("Ps", 3, 1): '<title canonical="true" type="psalm">A Psalm by David.</title> <title type="x-heading">'
                  'Trust</title>Yahweh, how my adversaries have increased!',
    HELD: f"Give thanks to Yahweh, {REFRAIN_EN}",
    OTHER: f"Give thanks to the God of gods, {REFRAIN_EN}",
    REPEAT: f"Give thanks to the Lord of lords, {REFRAIN_EN}",
    ("Ruth", 1, 1): "In the days when the judges judged, there was a famine in the land.",
    ("John", 3, 16): '<q who="Jesus">For God so loved the world</q> &amp; gave his Son .',
    ("Rev", 12, 17): "Then he stood on the sand of the sea.",  # Rev 12 is numbered differently in NRSVA and KJV
    ("Gen", 1, 3): "God said, “Let there be light,” and there was light. " * 5,  # one side 5x longer
    ("Tob", 1, 1): "The book of the words of Tobit.",  # deuterocanon: no Spanish side
}
SPANISH = {
    ("Gen", 1, 1): "EN el principio crió Dios los cielos.",
    ("Gen", 1, 2): "Y la tierra estaba desordenada y vacía.",
    ("Ps", 3, 1): "Salmo de David. ¡OH Jehová, cuánto se han multiplicado mis enemigos!",
    HELD: f"Alabad á Jehová, {REFRAIN_ES}",
    OTHER: f"Alabad al Dios de los dioses, {REFRAIN_ES}",
    REPEAT: f"Alabad á Jehová, {REFRAIN_ES}",  # the held-out verse's Spanish, word for word
    ("Ruth", 1, 1): "Y ACONTECIÓ en los días que gobernaban los jueces, que hubo hambre en la tierra.",
    ("John", 3, 16): "Porque de tal manera amó Dios al mundo.",
    ("Rev", 12, 17): "Y yo me paré sobre la arena del mar.",
    ("Gen", 1, 3): "Y dijo Dios: Sea la luz.",
}


@pytest.fixture
def sword_root(tmp_path):
    root = tmp_path / "sword"
    write_ztext(root, "engWEB2015eb", "NRSVA", ENGLISH)
    write_ztext(root, "spaRV1909eb", "KJV", SPANISH)
    return root


def test_osis_to_text_drops_notes_and_headings_and_keeps_spacing():
    assert osis_to_text(ENGLISH[("Gen", 1, 1)]) == "In the beginning, God created the heavens."
    assert osis_to_text(ENGLISH[("Ps", 3, 1)]) == "A Psalm by David. Yahweh, how my adversaries have increased!"
    assert osis_to_text(ENGLISH[("John", 3, 16)]) == "For God so loved the world & gave his Son."
    assert osis_to_text("<w>¡</w> <w>OH</w> “ Jehová ” !") == "¡OH “Jehová”!"


def test_reader_equals_pysword_on_every_written_verse(sword_root):
    """Our block-caching reader returns what pysword's own reader returns, entry for entry."""
    modules = SwordModules(str(sword_root))
    modules.parse_modules()
    for name, verses in (("engWEB2015eb", ENGLISH), ("spaRV1909eb", SPANISH)):
        ours, theirs = ZTextModule(sword_root, name), modules.get_bible_from_module(name)
        for (book, chapter, verse), osis in verses.items():
            reference = theirs.get(books=[book], chapters=[chapter], verses=[verse], clean=False)
            assert reference == osis
        assert ours.verses() == {ref: osis_to_text(osis) for ref, osis in verses.items()}


def test_pairs_keep_only_shared_books_equal_chapters_and_similar_lengths(sword_root):
    english, spanish = ZTextModule(sword_root, "engWEB2015eb"), ZTextModule(sword_root, "spaRV1909eb")
    lengths, other = english.chapter_lengths(), spanish.chapter_lengths()
    assert lengths[("Rev", 12)] != other[("Rev", 12)] and lengths[("Gen", 1)] == other[("Gen", 1)]
    same = {k for k, n in lengths.items() if other.get(k) == n}
    pairs = verse_pairs(english.verses(), spanish.verses(), same)
    refs = [ref for ref, _, _ in pairs]
    assert ("Tob", 1, 1) not in refs and ("Rev", 12, 17) not in refs and ("Gen", 1, 3) not in refs
    assert refs[:4] == [("Gen", 1, 1), ("Gen", 1, 2), ("Ruth", 1, 1), ("Ps", 3, 1)]  # canonical order
    assert len(refs) == 8


def test_splits_hold_out_verses_or_books_and_training_never_sees_a_held_out_sentence(sword_root):
    english, spanish = ZTextModule(sword_root, "engWEB2015eb").verses(), ZTextModule(sword_root, "spaRV1909eb").verses()
    pairs = verse_pairs(english, spanish)
    train, valid = split_pairs(pairs, by="verse")
    assert (english[HELD], spanish[HELD]) in valid and (english[REPEAT], spanish[REPEAT]) in train
    train = corpora.disjoint_pairs(train, valid)
    assert (english[REPEAT], spanish[REPEAT]) not in train and (english[OTHER], spanish[OTHER]) in train
    train, valid = split_pairs(pairs, by="book", books=("Ruth",))
    assert valid == [(english[("Ruth", 1, 1)], spanish[("Ruth", 1, 1)])]
    with pytest.raises(ValueError, match="by must be"):
        split_pairs(pairs, by="chapter")


def test_disjoint_pairs_drops_shared_sources_targets_and_repeats():
    train = [("a", "x"), ("b", "y"), ("c", "z"), ("c", "z"), ("e", "v")]
    assert corpora.disjoint_pairs(train, [("a", "w"), ("d", "y")]) == [("c", "z"), ("e", "v")]


def _deb(tmp_path, sword_root, package: str, module: str) -> "Path":
    root = tmp_path / package
    shutil.copytree(sword_root / "modules" / "texts" / "ztext" / module,
                    root / "usr/share/sword/modules/texts/ztext" / module)
    (root / "usr/share/sword/mods.d").mkdir(parents=True)
    shutil.copy(sword_root / "mods.d" / f"{module.lower()}.conf", root / "usr/share/sword/mods.d")
    (root / "DEBIAN").mkdir()
    (root / "DEBIAN/control").write_text(f"Package: {package}\nVersion: 1.0\nArchitecture: all\n"
                                         "Maintainer: test <t@example.org>\nDescription: test\n", encoding="utf-8")
    deb = tmp_path / f"{package}_1.0_all.deb"
    subprocess.run(["dpkg-deb", "--root-owner-group", "-b", str(root), str(deb)], check=True, capture_output=True)
    return deb


@pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="dpkg-deb (Debian/Ubuntu) is not installed")
@pytest.mark.parametrize("name", ["bible-en-es", "bible-en-es-books"])
def test_bible_corpus_is_built_from_the_two_packages(tmp_path, sword_root, monkeypatch, name):
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))
    debs = {"sword-text-web": _deb(tmp_path, sword_root, "sword-text-web", "engWEB2015eb"),
            "sword-text-sparv": _deb(tmp_path, sword_root, "sword-text-sparv", "spaRV1909eb")}
    asked = []

    def download(package, spec, into):
        asked.append(spec)
        deb = debs[package.name.partition(":")[2]]
        return shutil.copy(deb, into / deb.name) and into / deb.name

    monkeypatch.setattr(corpora, "_download", download)
    with pytest.raises(corpora.CorpusVerificationError, match="sword-text-web"):  # the real packages' hashes
        corpora.fetch(name)
    assert not corpora.corpus_path(name).exists()
    with pytest.warns(UserWarning, match="unverified"):
        folder = corpora.fetch(name, verify=False)
    assert asked[-2:] == ["sword-text-web=426.0-1", "sword-text-sparv=2.60-1"]
    read = {split: [line.split("\t") for line in (folder / f"{split}.tsv").read_text(encoding="utf-8").splitlines()]
            for split in ("train", "valid")}
    if name == "bible-en-es-books":
        assert read["valid"] == [[osis_to_text(ENGLISH[("Ruth", 1, 1)]), SPANISH[("Ruth", 1, 1)]]]
    else:
        assert [osis_to_text(ENGLISH[HELD]), SPANISH[HELD]] in read["valid"]
    valid_sentences = {s for pair in read["valid"] for s in pair}
    assert read["train"] and not valid_sentences & {s for pair in read["train"] for s in pair}
    meta = corpora.info(name)["meta"]
    assert [p["package"] for p in meta["packages"]] == ["apt:sword-text-web", "apt:sword-text-sparv"]
    assert meta["verified"] is False and meta["train_pairs"] == len(read["train"])
    assert meta["valid_pairs"] == len(read["valid"]) and meta["split"] == ("book" if "books" in name else "verse")
