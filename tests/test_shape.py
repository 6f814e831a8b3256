"""The shape the design card asks for: each script self-contained, its shared plumbing the same text everywhere,
common.py and rewards.py helpers only, and each script running from a folder that holds only what it says to copy."""

import ast
import re
import shutil
from collections import defaultdict

import pytest

from benchmarks.code_size import SCRIPTS, copy_set, density
from conftest import ROOT, run_script

BUDGETS = {
    "rloo.py": 900,
    "reinforce.py": 900,
    "grpo.py": 1080,
    "ppo.py": 1130,
    "sft.py": 720,
    "reward_model.py": 720,
    "common.py": 200,
    "rewards.py": 300,
}
# Size in characters, as benchmarks/code_size.py's `density` counts them: a baseline + 5%.
CHAR_BUDGETS = {
    "rloo.py": 42_700,
    "reinforce.py": 43_450,
    "grpo.py": 52_250,
    "ppo.py": 54_250,
    "sft.py": 32_850,
    "reward_model.py": 29_500,
}
COPY_SET_CHARS = 64_000  # rloo.py + common.py + rewards.py: what a copier takes
MEAN_LINE = 62  # the anchors' mean non-blank line: 46-52; whole error messages lengthen a few
LONG_LINES = 0.12  # the share of non-blank lines of 100+ characters; the anchors': 3-10%
HEADER = re.compile(r"^\s*# ---- (.+) ----$")


def blocks(script: str) -> dict[str, list[str]]:
    """The marked blocks of a script: from a `# ---- name ----` line to the next `# ----` or `# ====` line, `def main`
    or `if __name__`."""
    found, name = {}, None
    for line in (ROOT / script).read_text().splitlines():
        if line.lstrip().startswith(("# ----", "# ====")) or line.startswith(
            ("def main", "if __")
        ):
            header = HEADER.match(line)
            name = header.group(1) if header else None
            if name is not None:
                assert name not in found, f"{script}: two blocks are named {name!r}"
                found[name] = []
        if name is not None:
            found[name].append(line)
    return found


def test_every_shared_plumbing_block_is_the_same_text_in_every_script():
    """So that a fix in one is made in all, and `diff rloo.py grpo.py` shows the algorithm and little else."""
    texts = defaultdict(dict)
    for script in SCRIPTS:
        for name, lines in blocks(script).items():
            texts[name][script] = "\n".join(lines).rstrip()
    shared = {name: by_script for name, by_script in texts.items() if len(by_script) > 1}
    # the command line, data, models, evaluation, checkpoints, setup, resume, ...
    assert len(shared) >= 8
    for name, by_script in shared.items():
        assert len(set(by_script.values())) == 1, (
            f"the block {name!r} differs between {sorted(by_script)}"
        )


def imports(name: str) -> set[str]:
    tree = ast.parse((ROOT / name).read_text())
    found = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    }
    return found | {
        node.module.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module
    }


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_script_imports_only_common_and_rewards_from_the_project(script):
    assert imports(script) & {p.stem for p in ROOT.glob("*.py")} <= {
        "common",
        "rewards",
        "vllm_colocate",
    }


def test_the_helpers_hold_no_plumbing_and_the_files_fit_their_budgets():
    # common.py: no accelerate, no datasets, no files, no signals
    assert imports("common.py") == {"torch", "transformers"}
    assert not imports("rewards.py") & {p.stem for p in ROOT.glob("*.py")}  # it stands alone
    lines = {name: len((ROOT / name).read_text().splitlines()) for name in BUDGETS}
    over = [
        f"{name}: {n} lines, over {BUDGETS[name]}"
        for name, n in lines.items()
        if n > BUDGETS[name]
    ]
    assert not over, "; ".join(over)


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_script_fits_its_character_budget(script):
    chars = density(ROOT / script)[0]
    budget = CHAR_BUDGETS[script]
    assert chars <= budget, f"{script}: {chars:,} characters, over its budget of {budget:,}"


def test_the_rloo_copy_set_fits_its_character_budget():
    files = copy_set("rloo.py")
    chars = sum(density(path)[0] for path in files)
    names = " + ".join(path.name for path in files)
    assert chars <= COPY_SET_CHARS, f"{names}: {chars:,} characters, over {COPY_SET_CHARS:,}"


@pytest.mark.parametrize("name", [*SCRIPTS, "common.py", "rewards.py"])
def test_a_files_lines_are_as_short_as_the_anchors(name):
    """One idea per line: a mean line of at most 62 characters, few lines of 100 or more."""
    _, mean, long = density(ROOT / name)
    assert mean <= MEAN_LINE, (
        f"{name}: mean non-blank line {mean:.1f} characters, over {MEAN_LINE}"
    )
    assert long <= LONG_LINES, (
        f"{name}: {long:.1%} of lines are 100+ characters, over {LONG_LINES:.0%}"
    )


TESTS = sorted(f"tests/{path.name}" for path in (ROOT / "tests").glob("*.py"))
TESTS.remove("tests/test_shape.py")  # it names the marker


@pytest.mark.parametrize("name", [*SCRIPTS, "common.py", "rewards.py", *TESTS])
def test_no_file_turns_the_formatter_off(name):
    lines = (ROOT / name).read_text().splitlines()
    skipped = [number for number, line in enumerate(lines, 1) if "fmt: skip" in line]
    assert not skipped, (
        f"{name}: `# fmt: skip` on lines {skipped}; write one idea per line instead"
    )


def files_to_copy(script: str) -> list[str]:
    """The .py files the script's docstring says to copy with it, up to the optional vLLM engine."""
    docstring = ast.get_docstring(ast.parse((ROOT / script).read_text()))
    paragraph = docstring[docstring.index(f"Copy {script}") :].split("\n\n")[0]
    return re.findall(r"\w+\.py", paragraph.split("vllm_colocate.py")[0])


@pytest.mark.parametrize(
    "script", ["rloo.py", *(pytest.param(s, marks=pytest.mark.slow) for s in SCRIPTS[1:])]
)
def test_a_script_runs_from_a_folder_holding_only_its_copy_set_a_model_and_the_data(
    tmp_path, script
):
    files = files_to_copy(script)
    assert files == [script, "common.py", "rewards.py"]
    for name in files:
        shutil.copy(ROOT / name, tmp_path / name)
    shutil.copytree(ROOT / "models", tmp_path / "models")
    shutil.copytree(ROOT / "data", tmp_path / "data")
    flags = ["--max_steps", "1", "--eval_strategy", "no", "--output_dir", "out"]
    if script in ("rloo.py", "grpo.py", "reinforce.py", "ppo.py"):
        flags += ["--prompts_per_step", "4"]
    result = run_script(script, *flags, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert (tmp_path / "out" / "config.json").is_file()
