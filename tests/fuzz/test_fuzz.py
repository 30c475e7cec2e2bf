"""The fuzzing oracle: seeded workloads of every key kind, type, DML and DDL form against the real
pipeline, with the oracles after every loader run (see tests/fuzz/runner.py).

``make test`` runs ``FIXED_SEEDS``; ``make fuzz SEEDS=N FUZZ_START=S`` runs seeds S..S+N-1 (env
``FUZZ_SEEDS``, ``FUZZ_START``; ``FUZZ_ROUNDS`` rounds over ``FUZZ_TABLES`` tables each; ``FUZZ_GAPS=all`` or a comma list of
``KNOWN_GAPS`` also draws the hazards left out by default, each with why, and the oracle allows for
each: see tests/fuzz/nan_gap.py). ``pytest -rP`` shows each seed's timings and what the oracle allowed.
"""

from __future__ import annotations

import os
import time

import pytest

from tests.fuzz.runner import FuzzRun
from tests.fuzz.workload import generate, parse_gaps
from tests.harness import Env

#: Seeds ``make test`` runs: between them every table kind, a killed capture, an overlap and a
#: killed load or merge process.
FIXED_SEEDS = (5, 7, 10)


def seeds() -> list[int]:
    count = os.environ.get("FUZZ_SEEDS")
    if not count:
        return list(FIXED_SEEDS)
    start = int(os.environ.get("FUZZ_START", "1"))
    return list(range(start, start + int(count)))


# make test: small workloads (3 seeds in about 3 minutes on 2 cores); make fuzz sets larger ones.
ROUNDS = int(os.environ.get("FUZZ_ROUNDS", "3"))
TABLES = int(os.environ.get("FUZZ_TABLES", "4"))
GAPS = parse_gaps(os.environ.get("FUZZ_GAPS", ""))


@pytest.mark.parametrize("seed", seeds())
def test_fuzz_seed(env: Env, seed: int) -> None:
    workload = generate(seed, rounds=ROUNDS, gaps=GAPS, tables=TABLES)
    run = FuzzRun(env, workload, env.tmp)
    started = time.monotonic()
    run.run()
    spent = ", ".join(f"{k} {v:.0f}s" for k, v in sorted(run.timings.items()))
    print(f"fuzz seed {seed}: {len(workload.steps)} steps in {time.monotonic() - started:.0f}s ({spent})")
    if workload.pipelined_rounds:
        print(
            f"fuzz seed {seed}: pipelined capture in rounds of {workload.pipelined_rounds} rows:"
            f" {run.captured['pipelined']} rows, {run.captured['in columns']} decoded in columns"
        )
    if run.nan_parked:
        print(
            f"fuzz seed {seed}: parked for NaN in a numeric(p,s) column (accepted): {', '.join(sorted(run.nan_parked))}"
        )
    if run.nan_accepted:
        accepted = ", ".join(f"{t} {n}" for t, n in sorted(run.nan_accepted.items()))
        print(
            f"fuzz seed {seed}: lake NULLs accepted for NaN/±Infinity (gap nan_infinity), per table and oracle: {accepted}"
        )
