"""A short slice of the compatibility suite (tests/compat) under pytest: real public programs run
unmodified under PyTorch and `flambeau.run`, losses compared. The sources come only from a local
copy (`FLAMBEAU_COMPAT_SRC`, `FLAMBEAU_COMPAT_MIRRORS` or the cache that `python -m tests.compat`
fills); without one the test is skipped, never fetched from GitHub here."""
from __future__ import annotations

import pytest

from tests.compat.programs import by_name
from tests.compat.runner import run_program

CI_SLICE = ["word-lm-lstm", "nanogpt-train-char"]


@pytest.mark.parametrize("name", CI_SLICE)
def test_public_program_matches_pytorch(name, tmp_path):
    (program,) = [p for p in by_name([name], slow=False) if p.name == name]
    outcome = run_program(program, tmp_path, network=False)
    if outcome.status == "skip":
        pytest.skip(outcome.detail)
    assert outcome.status == "pass", f"{name}: {outcome.detail} (logs: {tmp_path})"
