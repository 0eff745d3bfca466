"""Hypothesis profiles for the parser fuzzers.

The fuzzers take their example count from the active profile. A plain ``pytest`` run uses
Hypothesis' default (100 examples per fuzzer: a few seconds in all). The long job, opt-in::

    pytest tests/fuzz --hypothesis-profile=fuzz-long

runs each fuzzer for 20,000 examples (see docs/security.md). Pass the ``tests/fuzz`` path so
that pytest loads this file, which registers the profile, before Hypothesis reads the option.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings

settings.register_profile(
    "fuzz-long",
    max_examples=20_000,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    print_blob=True,
)
