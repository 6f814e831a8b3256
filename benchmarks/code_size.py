"""How minimal the scripts are: the figures of docs/benchmarks.md's "Code size" table.

    python benchmarks/code_size.py

For each of rloo.py, grpo.py, reinforce.py, ppo.py, sft.py and reward_model.py:
- lines: the file's lines, docstrings and worked examples included;
- chars: its characters, blank lines and indentation left out (test_shape.py's budgets);
- mean line: the mean length of its non-blank lines, indentation included;
- ≥100: the share of its non-blank lines that are 100 characters or longer;
- loop: the line where the training loop starts (`for step in ...` in main), and its
  statement lines;
- algorithm: the share of the loop's statement lines that are the algorithm: those under a
  numbered phase header (`# ==== 3. ... ====`), but the log phase (`# ==== 7. log: ...`), the
  non-finite check, the `logging_step` flag, and the bookkeeping that only feeds the log
  (appends to the clip and loss lists, sums of `.item()` losses). The rest: the plumbing blocks
  (`# ---- ... ----`: log, evaluate, save, stop) and the lines before the first phase;
- names: distinct names a reader looks up in other project files (`common.X`, and what
  `from common import` and `from rewards import` bring);
- copy set: the script plus every project file it imports at the top, transitively (common.py
  and rewards.py; vllm_colocate.py, imported only with --use_vllm, is not counted);
- copy set chars: the chars of the copy set's files.
And `diff rloo.py grpo.py`: its changed lines; and the lines a learner reads to follow one update of
rloo.py: the whole script, and each common.py and rewards.py function that a run with the default flags
calls (traced in a one-step run of the embedded model, without evaluation, which calls no other
function), from its `def` to its last line.
"""

import ast
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ["rloo.py", "grpo.py", "reinforce.py", "ppo.py", "sft.py", "reward_model.py"]
PHASE = re.compile(r"# ==== \d[\d-]*\. (.*)")  # "3." or "1-2."
BOOKKEEPING = (
    "clip_low.append",
    "clip_high.append",
    "losses.append",
    "_sum +=",
    "token_sums",
    "isfinite",
    "fail(",
)


def project_imports(path: Path) -> set[str]:
    """The project modules `path` imports at its top level."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        modules = [a.name for a in node.names] if isinstance(node, ast.Import) else []
        modules += [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
        names |= {m for m in modules if (ROOT / f"{m}.py").exists()}
    return names


def copy_set(script: str) -> list[Path]:
    """The script first, then the project files it needs, in name order."""
    todo, seen = [script.removesuffix(".py")], set()
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo += project_imports(ROOT / f"{module}.py")
    return [ROOT / script] + sorted(ROOT / f"{m}.py" for m in seen if f"{m}.py" != script)


def density(path: Path) -> tuple[int, float, float]:
    """chars, mean line and the ≥100 share of a file, as the docstring above counts them."""
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    chars = sum(len(line.strip()) for line in lines)
    mean = sum(len(line) for line in lines) / len(lines)
    long = sum(len(line) >= 100 for line in lines) / len(lines)
    return chars, mean, long


def outside_names(tree: ast.Module) -> set[str]:
    attributes = [n for n in ast.walk(tree) if isinstance(n, ast.Attribute)]
    on_common = [a for a in attributes if isinstance(a.value, ast.Name) and a.value.id == "common"]
    names = {f"common.{a.attr}" for a in on_common}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module in ("common", "rewards"):
            names |= {a.name for a in node.names}
    return names


def leaf_statements(statements):
    for node in statements:
        bodies = [
            getattr(node, field)
            for field in ("body", "orelse", "finalbody")
            if getattr(node, field, None)
        ]
        if bodies and not isinstance(node, ast.FunctionDef):
            yield node, True  # the compound statement's own header line
            for body in bodies:
                yield from leaf_statements(body)
        else:
            yield node, False


def loop_figures(path: Path) -> tuple[int, int, float]:
    """The training loop's first line, its statement lines, and the algorithm's share of them."""
    source = path.read_text()
    lines = source.splitlines()
    main = next(
        n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name == "main"
    )
    loop = next(
        n for n in ast.walk(main) if isinstance(n, ast.For) and ast.unparse(n.target) == "step"
    )
    algorithm = other = 0
    for node, header in leaf_statements(loop.body):
        span = range(node.lineno, (node.lineno if header else node.end_lineno) + 1)
        text = "\n".join(lines[i - 1] for i in span)
        marks = [
            line.strip()
            for line in lines[loop.lineno : node.lineno]
            if line.strip().startswith(("# ====", "# ----"))
        ]
        phase = PHASE.match(marks[-1]) if marks else None
        plumbing = (
            phase is None
            or phase.group(1).startswith("log:")
            or any(b in text for b in BOOKKEEPING)
            or "logging_step =" in text
            or "if logging_step" in text
        )
        if plumbing:
            other += len(span)
        else:
            algorithm += len(span)
    statements = algorithm + other + 1  # + 1: the `for` line
    return loop.lineno, statements, algorithm / statements


TRACE = """
import json, runpy, sys
files, script, *flags = sys.argv[1:]
called = set()
def record(frame, event, arg):
    if event == "call" and frame.f_code.co_filename in files.split(","):
        called.add((frame.f_code.co_filename, frame.f_code.co_firstlineno))
sys.argv = [script, *flags]
sys.setprofile(record)
runpy.run_path(script, run_name="__main__")
sys.setprofile(None)
print(json.dumps(sorted(called)))
"""


def read_path(script: str = "rloo.py") -> dict[str, int]:
    """The lines a learner reads for one update: the script, and the common.py and rewards.py
    functions (whole, from `def` to the last line) that a one-step run with the defaults calls."""
    helpers = [ROOT / "common.py", ROOT / "rewards.py"]
    with tempfile.TemporaryDirectory() as out:
        flags = [ROOT / script, "--max_steps", "1", "--eval_strategy", "no", "--output_dir", out]
        command = [sys.executable, "-c", TRACE, ",".join(map(str, helpers)), *map(str, flags)]
        result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=True)
    called = json.loads(result.stdout.splitlines()[-1])
    lines = {script: len((ROOT / script).read_text().splitlines())}
    for path in helpers:
        tree = ast.parse(path.read_text())
        lines[path.name] = 0
        for node in tree.body:
            if not isinstance(node, ast.FunctionDef):
                continue
            # a decorated function's code object starts at its decorator
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            if any(f == str(path) and first <= line <= node.end_lineno for f, line in called):
                lines[path.name] += node.end_lineno - first + 1
    return lines


def main():
    columns = [
        "script",
        "lines",
        "chars",
        "mean line",
        "≥100",
        "loop starts at",
        "loop lines",
        "algorithm",
        "names from project files",
        "copy set",
        "copy set chars",
    ]
    print("| " + " | ".join(columns) + " |")
    print("|---" * len(columns) + "|")
    for script in SCRIPTS:
        path = ROOT / script
        total = len(path.read_text().splitlines())
        chars, mean, long = density(path)
        start, loop, share = loop_figures(path)
        names = len(outside_names(ast.parse(path.read_text())))
        files = copy_set(script)
        copied = sum(len(f.read_text().splitlines()) for f in files)
        listed = " + ".join(f.name for f in files)
        copied_chars = sum(density(f)[0] for f in files)
        row = [
            script,
            total,
            f"{chars:,}",
            f"{mean:.1f}",
            f"{long:.1%}",
            start,
            loop,
            f"{share:.0%}",
            names,
            f"{copied} ({listed})",
            f"{copied_chars:,}",
        ]
        print("| " + " | ".join(map(str, row)) + " |")
    diff = subprocess.run(
        ["diff", ROOT / "rloo.py", ROOT / "grpo.py"], capture_output=True, text=True
    ).stdout
    changed = sum(line[:1] in "<>" for line in diff.splitlines())
    print(f"\n`diff rloo.py grpo.py`: {changed} changed lines")
    path = read_path()
    parts = ", ".join(f"{name} {n}" for name, n in path.items())
    print(f"\nLines to read one update of rloo.py: {sum(path.values()):,} ({parts})")


if __name__ == "__main__":
    sys.exit(main())
