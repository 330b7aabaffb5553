"""MkDocs hook: serve the studies' committed plots on the site without copying them into docs/.

Each study keeps its plots beside its results under examples/ (examples/studies/NAME/*.png,
examples/vit_digits/*.png). MkDocs only serves docs/, so this hook adds every such PNG to the
site's files as `studies/files/<path under examples/studies, or vit_digits/...>`: a studies page
links `files/rnn_vs_transformer/bleu_vs_time.png`, and a strict build checks that link like any
other. Registered under `hooks:` in mkdocs.yml.
"""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# where the studies live -> where their plots appear on the site
SOURCES = {ROOT / "examples" / "studies": "studies/files",
           ROOT / "examples" / "vit_digits": "studies/files/vit_digits"}


def study_plots():
    """(site path, file on disk) for every committed study plot, in a stable order."""
    for folder, prefix in SOURCES.items():
        for png in sorted(folder.rglob("*.png")):
            yield f"{prefix}/{png.relative_to(folder).as_posix()}", png


def on_files(files, config):
    from mkdocs.structure.files import File  # here, so that the tests import study_plots without MkDocs

    for src_uri, png in study_plots():
        files.append(File.generated(config, src_uri, abs_src_path=str(png)))
    return files
