"""Sample texts shared by the tokenizer tests (imported by name: pytest puts this folder on
``sys.path``)."""

#: Text that exercises every branch of pre-tokenization and normalization.
VARIED_TEXTS = [
    "Hello world!",
    "The quick brown fox jumps over the lazy dog. It's 3:14pm; we'll see, won't we?",
    "I'm sure they've said they'd go—'twas ALL CAPS & MiXeD cAsE.",
    "def f(x):\n    return x ** 2  # square\n\nprint(f(12345678901234567890))\n",
    "if (a != b && c >= 0) { x[i] += y->z; }  /* C */ // comment",
    "whitespace   runs\t\ttabs\n\n\nnewlines \r\n crlf      trailing   ",
    "   leading spaces",
    "numbers 1 12 123 1,234,567.89 3.14159 1e-10 0x1F -42 ½ ² ٣ ๓",
    "emoji 😀😃😄 👍🏽 👨‍👩‍👧‍👦 🇫🇷 ❤️ 🤖",
    "CJK 中文字符 日本語のテキスト 한국어 텍스트 漢字かなカナ",
    "accents café naïve résumé Ångström Straße façade São Paulo Dvořák İstanbul ΟΔΟΣ",
    "other scripts: Привет мир, γειά σου κόσμε, مرحبا بالعالم, नमस्ते दुनिया, สวัสดีชาวโลก",
    "combining e\u0301 a\u0308 n\u0303 and zero\u200bwidth\u200djoiners\ufeffbom",
    "control\x00chars\x01\x07\x1b[31m and \x7f del \u0085 nel \u2028 line sep \u3000 ideographic space",
    "punctuation!!! ??? ... --- ___ *** ((( ))) [[[ ]]] {{{ }}} <<< >>> ''' \"\"\" ``` ~~~ ^^^ |||",
    "url https://example.com/path?query=1&x=y#frag email someone@example.org",
    "supercalifragilisticexpialidocious" * 4,
    "a" * 150 + " " + "ab" * 60,
    "ﬁ ligature ＦＵＬＬＷＩＤＴＨ ｈａｌｆ №℡™ ① ⅷ",
    "",
    " ",
    "\n",
]


def training_corpus() -> list[str]:
    """~150 kB of lines: Python standard library sources (code, comments, docstrings) and the
    varied texts above; the same for attnlab and the reference in each test."""
    import argparse
    import inspect
    import json
    import textwrap

    lines: list[str] = []
    for module in (argparse, json.decoder, json.encoder, textwrap):
        lines.extend(inspect.getsource(module).splitlines(keepends=True))
    for text in VARIED_TEXTS:
        lines.extend([text + "\n"] * 3)
    return lines
