"""``haystack_state.hayhooks`` without Hayhooks: the import fails, and says which extra installs it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]

WITHOUT_HAYHOOKS = """
import sys


class NoHayhooks:
    def find_spec(self, name, path=None, target=None):
        if name == "hayhooks" or name.startswith("hayhooks."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, NoHayhooks())
import haystack_state.hayhooks
"""


def test_the_import_error_names_the_extra() -> None:
    env = {**os.environ, "HAYSTACK_TELEMETRY_ENABLED": "False"}
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_HAYHOOKS], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        "ImportError: haystack_state.hayhooks needs Hayhooks, which the 'hayhooks' extra installs: "
        'pip install -e ".[hayhooks]" (in a clone of haystack-state).'
    )
