"""The README's Python example runs, from the repository's root."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from conftest import REPO


def test_the_readme_example_runs(tmp_path):
    readme = (REPO / "README.md").read_text()
    section = readme.split("## From Python", 1)[1].split("\n## ", 1)[0]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    # The model's claim histogram goes to a cache directory of the test's.
    env = {**os.environ, "SMOE_CACHE_DIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert sorted(line.split()[0] for line in lines[:3]) == ["2", "5", "9"]
    assert all("float16 (32, 64)" in line for line in lines[:3])
    assert lines[3].startswith("3 claims, ")


def test_the_readme_says_what_the_example_needs():
    """Issue 47, item 8: the example calls ``lease.numpy()``, which needs
    numpy, and the README's install line did not say so."""
    readme = (REPO / "README.md").read_text()
    section = readme.split("## From Python", 1)[1].split("\n## ", 1)[0]
    assert ".numpy(" in section
    assert "pip install './python[numpy]'" in section
