"""The classical statistical aligner of the study: eflomal (Östling & Tiedemann 2016: IBM model
1 + HMM + fertility, Bayesian, trained by Gibbs sampling) on the same pairs the models train on,
plus the held-out ones (it learns without labels, as aligners are used), over the same words
(`align.WORD` runs, lowercased). Its two directions are combined by intersection and by
grow-diag-final-and (Koehn et al. 2003).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Sequence

from align import Link

NEIGHBOURS = ((-1, 0), (0, -1), (1, 0), (0, 1), (-1, -1), (-1, 1), (1, -1), (1, 1))


def parse_links(line: str) -> set[Link]:
    """One line of Pharaoh-format links ("0-0 1-2 ...", source-target) as a set."""
    return {(int(a), int(b)) for a, b in (x.split("-") for x in line.split())}


def grow_diag_final_and(forward: set[Link], reverse: set[Link]) -> set[Link]:
    """Koehn et al.'s symmetrisation: start from the intersection, add union links next to
    (also diagonally) a link while either of their words is unaligned, then add union links of
    which both words are unaligned ("final-and")."""
    union = forward | reverse
    links = forward & reverse
    aligned_s = {i for i, _ in links}
    aligned_t = {j for _, j in links}
    grown = True
    while grown:
        grown = False
        for i, j in sorted(links):
            for di, dj in NEIGHBOURS:
                k = (i + di, j + dj)
                if k in union and k not in links and (k[0] not in aligned_s or k[1] not in aligned_t):
                    links.add(k)
                    aligned_s.add(k[0])
                    aligned_t.add(k[1])
                    grown = True
    for direction in (forward, reverse):
        for i, j in sorted(direction):
            if i not in aligned_s and j not in aligned_t:
                links.add((i, j))
                aligned_s.add(i)
                aligned_t.add(j)
    return links


def eflomal_align(pairs: Sequence[tuple[Sequence[str], Sequence[str]]], seed_dir: Path | None = None,
                  samplers: int = 2) -> list[dict[str, set[Link]]]:
    """eflomal's forward and reverse links for every pair of word lists (each side non-empty), and
    their intersection and grow-diag-final-and."""
    import eflomal

    with tempfile.TemporaryDirectory(dir=seed_dir) as tmp:
        fwd, rev = Path(tmp) / "fwd", Path(tmp) / "rev"
        aligner = eflomal.Aligner(n_samplers=samplers)
        aligner.align([" ".join(w.lower() for w in s) + "\n" for s, _ in pairs],
                      [" ".join(w.lower() for w in t) + "\n" for _, t in pairs],
                      links_filename_fwd=str(fwd), links_filename_rev=str(rev), quiet=True)
        forward = [parse_links(x) for x in fwd.read_text().splitlines()]
        reverse = [parse_links(x) for x in rev.read_text().splitlines()]
    if len(forward) != len(pairs) or len(reverse) != len(pairs):
        raise RuntimeError(f"eflomal returned {len(forward)}/{len(reverse)} alignments for {len(pairs)} pairs")
    return [{"forward": f, "reverse": r, "intersection": f & r, "grow-diag-final-and": grow_diag_final_and(f, r)}
            for f, r in zip(forward, reverse)]
