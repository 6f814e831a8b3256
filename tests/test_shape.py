"""The shape the design card asks for: each script self-contained, its shared plumbing the same text everywhere,
common.py and rewards.py helpers only, and each script running from a folder that holds only what it says to copy."""

import ast
import re
import shutil
from collections import defaultdict

import pytest

from conftest import ROOT, run_script

SCRIPTS = ["rloo.py", "grpo.py", "reinforce.py", "ppo.py", "sft.py", "reward_model.py"]
BUDGETS = {
    "rloo.py": 900,
    "reinforce.py": 900,
    "grpo.py": 1030,
    "ppo.py": 1130,
    "sft.py": 720,
    "reward_model.py": 720,
    "common.py": 200,
    "rewards.py": 300,
}
HEADER = re.compile(r"^\s*# ---- (.+) ----$")


def blocks(script: str) -> dict[str, list[str]]:
    """The marked blocks of a script: from a `# ---- name ----` line to the next `# ----` or `# ====` line, `def main`
    or `if __name__`."""
    found, name = {}, None
    for line in (ROOT / script).read_text().splitlines():
        if (
            HEADER.match(line)
            or line.lstrip().startswith(("# ----", "# ===="))
            or line.startswith(("def main", "if __"))
        ):
            name = HEADER.match(line).group(1) if HEADER.match(line) else None
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
    assert (
        len(shared) >= 8
    )  # the command line, data, models, evaluation, checkpoints, setup, resume, ...
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
    assert imports("common.py") == {
        "torch",
        "transformers",
    }  # no accelerate, no datasets, no files, no signals
    assert not imports("rewards.py") & {p.stem for p in ROOT.glob("*.py")}  # it stands alone
    for name, budget in BUDGETS.items():
        assert len((ROOT / name).read_text().splitlines()) <= budget, name


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
