"""wal2json before 2.6 prints numeric/float NaN and ±Infinity as null, which a NULL also is: capture
names the exposed tables. The note is durable (the landing area's source state), written before a
table's first change of a run is landed: a capture killed once its files are published still names
the tables it landed, in the next run's summary and in ``loader status`` (it named them only in the
summary of a run that finished: the re-run skips what is already landed, and never said it)."""

from __future__ import annotations

import signal

import pytest

from tests.fuzz.nan_gap import flagged_tables
from tests.harness import Env, run_killed


def test_a_capture_killed_after_publishing_still_names_the_tables_whose_nan_became_null(env: Env) -> None:
    env.sql("CREATE TABLE public.measures (id int PRIMARY KEY, n numeric, f double precision, note text)")
    env.sql("CREATE TABLE public.words (id int PRIMARY KEY, note text)")
    if env.capture().numeric_special_values:
        pytest.skip("this wal2json keeps NaN (numeric-data-types-as-string)")
    env.sql("INSERT INTO public.measures VALUES (1, 'NaN', '-Infinity', 'x'), (2, 1.5, 2.5, 'y')")
    env.sql("INSERT INTO public.words VALUES (1, 'x')")
    rc, out = run_killed(env, "capture", "capture-after-publish")
    assert rc == -signal.SIGKILL, out
    # The re-run finds the killed run's files landed: it skips those changes, and still names the table.
    cap = env.capture()
    assert cap.skipped_already_landed and "public.measures" not in cap.tables, cap.tables
    assert flagged_tables(cap.summary()) == {"public.measures"}, cap.summary()
    status = env.status()
    assert set(status.lossy_specials) == {"public.measures"}, status.lossy_specials
    assert status.lossy_specials["public.measures"]["columns"] == ["f", "n"]
    assert "public.measures: f, n (changes since" in status.render()
    # Named once; the status keeps it.
    assert flagged_tables(env.capture().summary()) == set()
    env.sql("UPDATE public.measures SET n = 'Infinity' WHERE id = 2")
    assert flagged_tables(env.capture().summary()) == {"public.measures"}
    assert set(env.status().lossy_specials) == {"public.measures"}
