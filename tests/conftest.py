"""Top-level test configuration: hypothesis profiles.

``HYPOTHESIS_PROFILE`` picks how hard property tests search:

- ``dev`` (default): quick feedback while editing.
- ``ci``: fixed seed (``derandomize``), reproduction blobs printed, sized so the
  whole suite fits the CI budget on 2 cores.
- ``deep``: long searches for a night run.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, Phase, settings

settings.register_profile("dev", max_examples=50, deadline=None)
settings.register_profile(
    "ci",
    max_examples=100,
    deadline=None,
    derandomize=True,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "deep",
    max_examples=2000,
    deadline=None,
    print_blob=True,
    phases=list(Phase),
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))
