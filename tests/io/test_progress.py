"""The one progress line: counts, rate, ETA and free text; nothing when disabled."""

import io

from attnlab.io.progress import Progress, format_count, format_seconds


def test_progress_writes_one_line():
    stream = io.StringIO()
    progress = Progress(10, unit="merge", desc="merges", stream=stream)
    progress._last = -100.0  # force a redraw
    progress.update(5, "half")
    progress.close("done")
    lines = stream.getvalue().splitlines()
    assert lines[0].startswith("merges |  50.0% 5/10") and lines[0].endswith("| half")
    assert "merge/s" in lines[0] and "ETA" in lines[0]
    assert lines[-1].startswith("merges | 50.0% 5/10".replace("| 5", "|  5")) and lines[-1].endswith("| done")
    assert stream.getvalue().endswith("\n")
    quiet = io.StringIO()
    Progress(desc="x", enabled=False, stream=quiet).close()
    assert quiet.getvalue() == ""


def test_formats():
    assert format_seconds(75.2) == "1m15s" and format_seconds(3725) == "1h02m" and format_seconds(5) == "5s"
    assert format_count(1234567) == "1.23M" and format_count(12) == "12"
