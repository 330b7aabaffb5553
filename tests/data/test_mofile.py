"""The .mo reader: Python's own gettext and GNU msgfmt as references, both byte orders, bad files."""

import gettext
import io
import shutil
import subprocess

import pytest

from attnlab.data.mofile import Message, read_mo, read_mo_file, write_mo

MESSAGES = [
    Message("Open", "Öffnen"),
    Message("Date", "Datum", context="FLD_DATE_STD"),
    Message("Date", "Datum (fix)", context="FLD_DATE_FIX"),
    Message("%1 file", "%1 Datei", plural="%1 files"),
    Message("Save ~As...", "Speichern ~unter..."),
    Message("Untranslated", ""),
]


@pytest.mark.parametrize("order", ["<", ">"])
def test_written_catalogue_reads_the_same_with_read_mo_and_python_gettext(order):
    data = write_mo(MESSAGES, byte_order=order)
    got = read_mo(data)
    assert sorted(got, key=repr) == sorted(MESSAGES, key=repr)
    ref = gettext.GNUTranslations(io.BytesIO(data))  # the standard library's reader
    for m in MESSAGES:
        if m.context is not None:
            assert ref.pgettext(m.context, m.msgid) == m.msgstr
        elif m.plural is None and m.msgstr:
            assert ref.gettext(m.msgid) == m.msgstr


@pytest.mark.skipif(shutil.which("msgfmt") is None, reason="GNU msgfmt (gettext) is not installed")
def test_reads_what_gnu_msgfmt_writes(tmp_path):
    po = tmp_path / "de.po"
    po.write_text('msgid ""\nmsgstr "Content-Type: text/plain; charset=UTF-8\\nPlural-Forms: nplurals=2; '
                  'plural=(n != 1);\\n"\n\n'
                  'msgctxt "FLD_DATE_FIX"\nmsgid "Date (fixed)"\nmsgstr "Datum (fix)"\n\n'
                  'msgid "Keywords"\nmsgstr "Schlüsselwörter"\n\n'
                  'msgid "%1 row"\nmsgid_plural "%1 rows"\nmsgstr[0] "%1 Zeile"\nmsgstr[1] "%1 Zeilen"\n\n'
                  'msgid "Tab\\there"\nmsgstr "Tab\\thier"\n', encoding="utf-8")
    subprocess.run(["msgfmt", "-o", str(tmp_path / "de.mo"), str(po)], check=True)
    got = {(m.context, m.msgid): m for m in read_mo_file(tmp_path / "de.mo")}
    assert got[("FLD_DATE_FIX", "Date (fixed)")].msgstr == "Datum (fix)"
    assert got[(None, "Keywords")].msgstr == "Schlüsselwörter"
    assert got[(None, "%1 row")].plural == "%1 rows" and got[(None, "%1 row")].msgstr == "%1 Zeile"
    assert got[(None, "Tab\there")].msgstr == "Tab\thier"
    assert len(got) == 4  # the header is not a message


def test_bad_files_are_named_errors():
    with pytest.raises(ValueError, match="not a .mo file"):
        read_mo(b"\x00" * 40, source="x.mo")
    with pytest.raises(ValueError, match="too short"):
        read_mo(b"\xde\x12\x04\x95", source="x.mo")
    data = bytearray(write_mo(MESSAGES[:1]))
    data[28 + 8 + 4: 28 + 8 + 8] = (10**6).to_bytes(4, "little")  # string 1's offset far past the end
    with pytest.raises(ValueError, match="outside the file"):
        read_mo(bytes(data), source="x.mo")
    with pytest.raises(ValueError, match="byte_order"):
        write_mo(MESSAGES, byte_order="=")
