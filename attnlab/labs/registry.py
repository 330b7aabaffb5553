"""The labs, by name, in the order of the lectures (`attnlab lab list` shows them in this order).

Adding a lab: a file under attnlab/labs/ with its `LAB` (stub, solution, checks; `plug` when the
piece has a seam to plug into) and its line here; tests/labs/test_labs.py then checks that its
solution passes and its stub fails.
"""

from __future__ import annotations

from attnlab.labs import beam_search, bpe_merge, pre_ln_layer, rotary, sdpa
from attnlab.labs.base import Lab, LabError

LABS: dict[str, Lab] = {lab.name: lab for lab in (sdpa.LAB, pre_ln_layer.LAB, rotary.LAB, bpe_merge.LAB,
                                                  beam_search.LAB)}


def get_lab(name: str) -> Lab:
    """The lab called `name`.

    Raises:
        LabError: an unknown name, listing the known ones.
    """
    if name not in LABS:
        raise LabError(f"no lab named {name!r}; the labs are: {', '.join(LABS)}")
    return LABS[name]
