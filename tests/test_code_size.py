"""docs/benchmarks.md's "Code size" table and lines are what benchmarks/code_size.py prints for the
scripts as they are now, and each script's copy set is the script, common.py and rewards.py."""

from benchmarks import code_size
from conftest import ROOT


def test_the_code_size_table_in_the_docs_is_current(capsys):
    code_size.main()
    printed = capsys.readouterr().out.strip().splitlines()
    table = [line for line in printed if line.startswith("|")]
    assert [row.split(" | ")[0] for row in table[2:]] == [f"| {s}" for s in code_size.SCRIPTS]
    section = (ROOT / "docs" / "benchmarks.md").read_text().partition("## Code size")[2]
    documented = [line for line in section.split("\n## ")[0].splitlines() if line.startswith("|")]
    assert documented == table, "\n".join(
        ["re-run python benchmarks/code_size.py; docs/benchmarks.md's table should be:", *table]
    )
    for line in [line for line in printed if line and not line.startswith("|")]:
        assert line in section, f"update docs/benchmarks.md: {line}"  # the diff, the read path


def test_a_scripts_copy_set_is_the_script_common_py_and_rewards_py():
    for script in code_size.SCRIPTS:
        assert [path.name for path in code_size.copy_set(script)] == [
            script,
            "common.py",
            "rewards.py",
        ]
