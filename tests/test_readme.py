"""The README's guide points into rloo.py by line: each pointer lands on the phase comment or the function it names."""

import re

from conftest import ROOT

LINES = (ROOT / "rloo.py").read_text().splitlines()
README = (ROOT / "README.md").read_text()


def test_each_step_points_at_its_phase():
    steps = dict(re.findall(r"\*\*([^*]+)\*\* \(rloo\.py:(\d+)-\d+\)", README))
    assert list(steps) == ["Rollout", "Score", "Log-probs", "KL-shaped reward", "Leave-one-out advantage",
                           "Loss and update", "Log"]  # fmt: skip
    for number, (step, line) in enumerate(steps.items(), 1):
        assert LINES[int(line) - 1].strip().startswith(f"# ==== {number}."), step


def test_each_function_pointer_lands_on_its_definition():
    pointers = re.findall(r"`(\w+)` \(rloo\.py:(\d+)\)", README)
    assert len(pointers) >= 4
    for name, number in pointers:
        assert LINES[int(number) - 1].startswith(f"def {name}("), name
