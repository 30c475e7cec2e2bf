"""A landing area's listing: files in commit order however the area changed since the last listing
(files added after, before or between the listed ones, files retired, names that are not landing
files, files of the same range complete and partial), each name parsed once."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from loader.landing.store import LandingFile, LocalLandingStore
from loader.lsn import ChangePosition

_FORMATS = ["jsonl", "changes", "tables", "arrow"]


@st.composite
def _names(draw: st.DrawFn) -> str:
    if draw(st.integers(0, 15)) == 0:
        return draw(st.sampled_from(["README", "notes.txt", "zz-not-a-landing-file"]))
    lsn = draw(st.integers(0, 40))
    first = ChangePosition(lsn, draw(st.integers(1, 3)))
    last = ChangePosition(lsn + draw(st.integers(0, 2)), draw(st.integers(1, 3)))
    return LandingFile.name_for(first, last, draw(st.booleans()), draw(st.sampled_from(_FORMATS)))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.lists(_names(), max_size=8), st.lists(st.integers(0, 30), max_size=4)), max_size=6))
def test_files_are_in_commit_order_after_any_change_of_the_area(tmp_path_factory: object, steps: list) -> None:
    root = Path(tmp_path_factory.mktemp("land"))  # type: ignore[attr-defined]
    store = LocalLandingStore(root)
    for added, removed in steps:
        for name in added:
            (root / name).write_bytes(b"")
        present = sorted(p.name for p in root.iterdir())
        for i in removed:  # retired, or deleted by a snapshot that restarted
            if present:
                (root / present[i % len(present)]).unlink(missing_ok=True)
        expected = sorted(f for f in map(LandingFile.parse, (p.name for p in root.iterdir())) if f is not None)
        assert store.files() == expected
        assert store.files() == expected  # and again, from what the last listing kept


def test_a_complete_and_a_partial_file_of_one_range_keep_the_dataclass_order(tmp_path: Path) -> None:
    """The one case where text order is not commit order: 'c' sorts before 'p' as text, a partial
    file before a complete one as LandingFile."""
    first, last = ChangePosition(5, 1), ChangePosition(5, 9)
    store = LocalLandingStore(tmp_path)
    (tmp_path / LandingFile.name_for(first, last, True, "tables")).write_bytes(b"")
    assert [f.complete for f in store.files()] == [True]
    (tmp_path / LandingFile.name_for(first, last, False, "tables")).write_bytes(b"")
    assert [f.complete for f in store.files()] == [False, True]
