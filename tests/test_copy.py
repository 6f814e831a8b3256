"""A copier's path: each algorithm script runs from an empty folder holding only the files its docstring names."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def files_to_copy(script: str) -> list[str]:
    """The files the script's docstring says to copy with it: the `.py` names of its 'Copy ...' paragraph, up to the
    optional vLLM engine."""
    docstring = (ROOT / script).read_text().split('"""')[1]
    paragraph = docstring[docstring.index("\nCopy ") :].split("\n\n")[0]
    return re.findall(r"\w+\.py", paragraph.split("vllm_colocate.py")[0])


SLOW = pytest.mark.slow  # one script in the fast subset is enough to catch a missing file; all four in the full suite


@pytest.mark.parametrize(
    "script", ["rloo.py", *(pytest.param(s, marks=SLOW) for s in ("grpo.py", "reinforce.py", "ppo.py"))]
)
def test_a_script_copied_with_the_files_its_docstring_names_runs_alone(tmp_path, script):
    files = files_to_copy(script)
    assert files == [script, "common.py", "rewards.py"]
    for name in files:
        shutil.copy(ROOT / name, tmp_path / name)
    shutil.copytree(ROOT / "models" / "tiny-arith", tmp_path / "my-model")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"HF_HUB_OFFLINE": "1"}
    command = [
        sys.executable,
        script,
        "--model_name_or_path",
        "my-model",
        "--max_steps",
        "1",
        "--prompts_per_step",
        "4",
        "--eval_steps",
        "0",
        "--output_dir",
        "out",
    ]
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert (tmp_path / "out" / "config.json").is_file()
