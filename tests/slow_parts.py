"""Run a training script with one part slowed down, for the tests that send a signal while that part runs:

    python tests/slow_parts.py checkpoint|first_evaluation|final_evaluation FLAG_FILE script.py [flags]

checkpoint: each model write of a checkpoint touches FLAG_FILE, then takes 3 s more. first_evaluation and
final_evaluation: the evaluation before the first step, or after the last one (the second, with --eval_steps 0), touches
FLAG_FILE, then takes 60 s more.
"""

import importlib
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import common  # noqa: E402


def slowed(function, flag_file: str, seconds: float, skip: int = 0):
    calls = []

    def slow(*args, **kwargs):
        calls.append(1)
        if len(calls) > skip:
            Path(flag_file).touch()
            time.sleep(seconds)
        return function(*args, **kwargs)

    return slow


def main():
    part, flag_file, script = sys.argv[1:4]
    if part == "checkpoint":
        common.save_model = slowed(common.save_model, flag_file, 3)
    else:
        common.evaluate = slowed(common.evaluate, flag_file, 60, skip=0 if part == "first_evaluation" else 1)
    module = importlib.import_module(Path(script).stem)
    common.cli(module.main, module.Args, sys.argv[4:])


if __name__ == "__main__":
    main()
