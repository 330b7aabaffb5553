"""Self-grading exercises: the student writes a piece of attnlab (a kernel, a position scheme, a
BPE merge step, beam search, a pre-LN layer) from a stub; `check` runs the properties and parity
tests attnlab's own implementation passes against it; a passing piece plugs into attnlab's
registries, so `attnlab train` and `attnlab generate` run with it (`attnlab --lab DIR ...`).

    attnlab lab list                       each lab, what the student writes, its state
    attnlab lab start sdpa [--dir labs]    writes labs/sdpa.py
    attnlab lab check sdpa [--dir labs]    one line per property; exit 0 when all pass
    attnlab --lab labs train run.yaml      with model.attention.kernel: lab-sdpa

In Python: `attnlab.labs.check("sdpa", "labs")`, `attnlab.labs.use("labs")`.
"""

from attnlab.labs.base import Check, CheckFailed, Lab, LabError
from attnlab.labs.registry import LABS, get_lab
from attnlab.labs.runner import DEFAULT_DIR, Report, Result, check, forget, start, state, use

__all__ = ["DEFAULT_DIR", "LABS", "Check", "CheckFailed", "Lab", "LabError", "Report", "Result", "check", "forget",
           "get_lab", "start", "state", "use"]
