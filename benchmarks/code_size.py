"""How minimal the scripts are: the figures of docs/benchmarks.md's "Code size" table.

    python benchmarks/code_size.py

For each of rloo.py, grpo.py, reinforce.py, ppo.py, sft.py and reward_model.py:
- lines: the file's lines, docstrings and worked examples included;
- loop: the line where the training loop starts (`for step in ...` in main), and its statement lines;
- algorithm: the share of the loop's statement lines that are the algorithm: those under a numbered phase header
  (`# ==== 3. ... ====`), but the log phase (`# ==== 7. log: ...`), the non-finite check, the `logging_step` flag,
  and the bookkeeping that only feeds the log (appends to the clip and loss lists, sums of `.item()` losses). The
  rest: the plumbing blocks (`# ---- ... ----`: log, evaluate, save, stop) and the lines before the first phase;
- names: distinct names a reader looks up in other project files (`common.X`, and what `from common import` and
  `from rewards import` bring);
- copy set: the script plus every project file it imports at the top, transitively (common.py and rewards.py;
  vllm_colocate.py, imported only with --use_vllm, is not counted).
And `diff rloo.py grpo.py`: its changed lines.
"""

import ast
import re
import subprocess
import sys
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


def outside_names(tree: ast.Module) -> set[str]:
    names = {f"common.{n.attr}" for n in ast.walk(tree) if isinstance(n, ast.Attribute)
             and isinstance(n.value, ast.Name) and n.value.id == "common"}  # fmt: skip
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
    """The training loop's first line, its statement lines, and the share of them that are the algorithm."""
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
    return (
        loop.lineno,
        algorithm + other + 1,
        algorithm / (algorithm + other + 1),
    )  # + 1: the `for` line


def main():
    print(
        "| script | lines | loop starts at | loop lines | algorithm | names from project files | copy set |"
    )
    print("|---|---|---|---|---|---|---|")
    for script in SCRIPTS:
        path = ROOT / script
        start, loop, share = loop_figures(path)
        names = len(outside_names(ast.parse(path.read_text())))
        files = copy_set(script)
        copied = sum(len(f.read_text().splitlines()) for f in files)
        total = len(path.read_text().splitlines())
        listed = " + ".join(f.name for f in files)
        print(
            f"| {script} | {total} | {start} | {loop} | {share:.0%} | {names} | {copied} ({listed}) |"
        )
    diff = subprocess.run(
        ["diff", ROOT / "rloo.py", ROOT / "grpo.py"], capture_output=True, text=True
    ).stdout
    changed = sum(line[:1] in "<>" for line in diff.splitlines())
    print(f"\n`diff rloo.py grpo.py`: {changed} changed lines")


if __name__ == "__main__":
    sys.exit(main())
