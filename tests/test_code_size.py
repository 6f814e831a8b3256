"""docs/benchmarks.md's "Code size" table is what benchmarks/code_size.py prints for the scripts as they are now, and
each script's copy set is the script, common.py and rewards.py."""

import sys

from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import code_size  # noqa: E402


def test_the_code_size_table_in_the_docs_is_current(capsys):
    code_size.main()
    printed = capsys.readouterr().out
    rows = [line for line in printed.splitlines() if line.startswith("| ") and ".py |" in line]
    assert [row.split(" | ")[0] for row in rows] == [f"| {script}" for script in code_size.SCRIPTS]
    docs = (
        (ROOT / "docs" / "benchmarks.md").read_text().partition("## Code size")[2]
    )  # that section's table
    for line in [*rows, printed.strip().splitlines()[-1]]:  # the rows, then the diff's count
        assert line in docs, (
            f"re-run python benchmarks/code_size.py and update docs/benchmarks.md: {line}"
        )


def test_a_scripts_copy_set_is_the_script_common_py_and_rewards_py():
    for script in code_size.SCRIPTS:
        assert [path.name for path in code_size.copy_set(script)] == [
            script,
            "common.py",
            "rewards.py",
        ]
