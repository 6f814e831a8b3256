"""docs/benchmarks.md's "Code size" table is what tools/code_size.py prints for the scripts as they are now."""

import subprocess
import sys

from conftest import ROOT


def test_the_code_size_table_in_the_docs_is_current():
    printed = subprocess.run(
        [sys.executable, ROOT / "tools" / "code_size.py"], capture_output=True, text=True, check=True
    ).stdout
    rows = [line for line in printed.splitlines() if line.startswith("| ") and ".py |" in line]
    assert [row.split(" | ")[0] for row in rows] == ["| rloo.py", "| grpo.py", "| reinforce.py", "| ppo.py"]
    docs = (ROOT / "docs" / "benchmarks.md").read_text().partition("## Code size")[2]  # that section's table
    for line in [*rows, printed.strip().splitlines()[-1]]:  # the rows, then the diff's count
        assert line in docs, f"re-run python tools/code_size.py and update docs/benchmarks.md: {line}"
