"""Writes the built-in data of sft.py and reward_model.py from the arithmetic problems of data/arithmetic:

    python tools/make_data.py

- data/arithmetic_sft: a noisy demonstrator's answers. Half the time it guesses at a glance and is off by ±1 or ±2
  (`<answer>54</answer>` for 7 × 8); otherwise it shows its work and is right (`7 × 8 = 56 <answer>56</answer>`). train:
  200 demonstrations of every problem, the RL scripts' held-out ones too, as a pretrained model has seen the facts (the
  RL scripts never train on them); test: one of each held-out problem, with its ground_truth.
- data/arithmetic_preferences: 8 pairs per problem of the split. chosen is the demonstrator's worked right answer;
  rejected is its guess (half the pairs), another number (a quarter) or a broken format (a quarter): form separates
  them.
- data/arithmetic_preferences_number: 8 pairs per problem, chosen and rejected in the same form (bare or worked, half
  each) and differing only in the number: off by ±1 or ±2 (half) or any other. Only arithmetic separates them.
"""

import gzip
import json
import random
import re
from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "data"


def problems(split: str) -> list[tuple]:
    """(prompt, a, op, b, answer) of each row of data/arithmetic/{split}.jsonl."""
    rows = [
        json.loads(line)
        for line in (DATA / "arithmetic" / f"{split}.jsonl").read_text().splitlines()
    ]
    parsed = [
        re.match(r"Compute (\d+) (\S) (\d+)\.", row["prompt"][0]["content"]).groups()
        for row in rows
    ]
    return [
        (row["prompt"], int(a), op, int(b), int(row["ground_truth"]))
        for row, (a, op, b) in zip(rows, parsed)
    ]


def demonstrations(problems: list[tuple], per_problem: int, rng: random.Random) -> list[dict]:
    rows = []
    for prompt, a, op, b, answer in problems:
        for _ in range(per_problem):
            guess = rng.random() < 0.5
            content = (
                f"<answer>{answer + rng.choice([-2, -1, 1, 2])}</answer>"
                if guess
                else worked(a, op, b, answer)
            )
            completion = [{"role": "assistant", "content": content}]
            rows.append({"prompt": prompt, "completion": completion, "ground_truth": str(answer)})
    return rows


def worked(a, op, b, n) -> str:
    return f"{a} {op} {b} = {n} <answer>{n}</answer>"


def pairs(problems: list[tuple], number: bool, rng: random.Random) -> list[dict]:
    rows = []
    for prompt, a, op, b, answer in problems:
        for _ in range(8):
            others = [n for n in range(-9, 82) if n != answer]
            if number:
                wrong = (
                    answer + rng.choice([-2, -1, 1, 2])
                    if rng.random() < 0.5
                    else rng.choice(others)
                )
                shown = rng.choice([False, True])  # the work, or the bare answer
                chosen, rejected = (
                    worked(a, op, b, n) if shown else f"<answer>{n}</answer>"
                    for n in (answer, wrong)
                )
            else:
                chosen, kind = worked(a, op, b, answer), rng.random()
                if kind < 0.5:
                    rejected = f"<answer>{answer + rng.choice([-2, -1, 1, 2])}</answer>"
                elif kind < 0.75:
                    rejected = f"<answer>{rng.choice(others)}</answer>"
                else:
                    broken = [
                        f"{a} {op} {b} = {answer}",
                        f"<answer>{answer}",
                        f"answer: {answer}",
                        "<answer></answer>",
                    ]
                    rejected = rng.choice(broken)
            rows.append({"prompt": prompt, "chosen": [{"role": "assistant", "content": chosen}],
                         "rejected": [{"role": "assistant", "content": rejected}]})  # fmt: skip
    return rows


def write(path: Path, rows: list[dict]):
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows).encode()
    path.write_bytes(gzip.compress(text, mtime=0) if path.suffix == ".gz" else text)


def datasets() -> dict[str, list[dict]]:
    """Every file's rows, by its path in data/."""
    train, test = problems("train"), problems("test")
    # the demonstrations cover every problem in the order +, -, ×, ÷, then by a and b (÷: by the quotient, then b)
    every = sorted(
        train + test, key=lambda p: ("+-×÷".index(p[2]), p[4] if p[2] == "÷" else p[1], p[3])
    )
    files = {"arithmetic_sft/train.jsonl.gz": demonstrations(every, 200, random.Random(0)),
             "arithmetic_sft/test.jsonl": demonstrations(test, 1, random.Random(0))}  # fmt: skip
    for split, split_problems in (("train", train), ("test", test)):
        for folder, number in (
            ("arithmetic_preferences", False),
            ("arithmetic_preferences_number", True),
        ):
            files[f"{folder}/{split}.jsonl"] = pairs(
                split_problems, number, random.Random(f"0-{split}")
            )
    return files


if __name__ == "__main__":
    for path, rows in datasets().items():
        write(DATA / path, rows)
