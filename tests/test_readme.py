"""The README's guide points into rloo.py by line: each pointer lands on the phase comment or the function it names."""

import re

from conftest import ROOT

LINES = (ROOT / "rloo.py").read_text().splitlines()
README = (ROOT / "README.md").read_text()


def line(number: str) -> str:
    return LINES[int(number) - 1]


def test_each_step_points_at_its_phase_comment():
    steps = dict(re.findall(r"\*\*([^*]+)\*\* \(rloo\.py:(\d+)-\d+", README))
    phases = {"Rollout": "1. rollout", "Score": "2. score", "Log-probs": "3. ", "KL-shaped reward": "4. "}
    phases |= {"Leave-one-out advantage": "5. ", "Loss and update": "6. ", "Log": "7. log"}
    for step, phase in phases.items():
        assert f"# ==== {phase}" in line(steps[step]), step
    loop = re.search(r"training loop \(rloo\.py:(\d+)-", README).group(1)
    assert "# ==== the training loop" in line(loop)


def test_each_function_pointer_lands_on_its_definition():
    pointers = re.findall(r"`(\w+)` \(rloo\.py:(\d+)\)", README)
    assert len(pointers) >= 5
    for name, number in pointers:
        assert line(number).startswith(f"def {name}("), name
