"""The README and every page of docs/ point into the code by line, and each pointer names what it points at:

- `name` (rloo.py:N) or `name`, rloo.py:N lands on `def name(` (or `class name`) in that file;
- the README's steps, **Step** (rloo.py:A-B), run from the phase comment `# ==== k.` to the phase's last line.

A pointer in any other form fails. When the code moves, each failure names the pointer (page:line) and the line it
should have, so re-pointing is a find-and-replace. Every relative link lands on a file (and a heading, where it names
one), and the README stays a guide of at most 150 lines: tables of results and speed go to docs/."""

import re
from pathlib import Path

import pytest

from conftest import ROOT

PAGES = ["README.md"] + sorted(
    str(path.relative_to(ROOT)) for path in (ROOT / "docs").glob("*.md")
)
POINTER = re.compile(r"\b([\w/]+\.py):(\d+)(?:[-–](\d+))?")
FUNCTION_POINTER = re.compile(r"`(\w+)`(?:,\s+|\s+\()([\w/]+\.py):(\d+)\b(?![-–]\d)")
STEP_POINTER = re.compile(r"\*\*([^*]+)\*\* \(([\w/]+\.py):(\d+)-(\d+)\)")
LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.DOTALL | re.MULTILINE)
README = (ROOT / "README.md").read_text()


def code_lines(file: str) -> list[str]:
    return (ROOT / file).read_text().splitlines()


def page_line(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def definitions(lines: list[str], name: str) -> list[int]:
    pattern = re.compile(rf"\s*(?:async\s+)?(?:def {name}\(|class {name}\b)")
    return [number for number, line in enumerate(lines, 1) if pattern.match(line)]


def phase_span(lines: list[str], k: int) -> tuple[int, int] | None:
    """The lines of phase k: its `# ==== k.` comment to the last non-blank line before the next marked block."""
    starts = [
        number for number, line in enumerate(lines, 1) if line.strip().startswith(f"# ==== {k}.")
    ]
    if len(starts) != 1:
        return None
    end = starts[0]
    while end < len(lines) and not lines[end].strip().startswith(("# ====", "# ----")):
        end += 1
    while not lines[end - 1].strip():
        end -= 1
    return starts[0], end


def outside_code_blocks(text: str) -> str:
    """The text with each fenced block blanked, its newlines kept, so that page_line still holds."""
    return FENCE.sub(lambda block: "\n" * block.group().count("\n"), text)


def heading_anchors(page: Path) -> set[str]:
    """GitHub's anchors: a heading in lower case, punctuation dropped, spaces as hyphens; -1, -2 on repeats."""
    anchors = set()
    counts = {}
    text = outside_code_blocks(page.read_text())
    for heading in re.findall(r"^#{1,6} (.+)$", text, re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        repeat = counts.get(slug, 0)
        counts[slug] = repeat + 1
        anchors.add(f"{slug}-{repeat}" if repeat else slug)
    return anchors


def fail_if(misses: list[str], heading: str = "re-point"):
    if misses:
        pytest.fail(f"{heading}:\n" + "\n".join(misses), pytrace=False)


def test_readme_steps_are_the_seven_phases():
    steps = [step for step, *_ in STEP_POINTER.findall(README)]
    phases = [
        "Rollout",
        "Score",
        "Log-probs",
        "KL-shaped reward",
        "Leave-one-out advantage",
        "Loss and update",
        "Log",
    ]
    assert steps == phases


def test_each_step_spans_its_phase():
    misses = []
    for k, match in enumerate(STEP_POINTER.finditer(README), 1):
        step, file, start, end = match.groups()
        span = phase_span(code_lines(file), k)
        if span != (int(start), int(end)):
            where = f"{file}:{span[0]}-{span[1]}" if span else f"no single `# ==== {k}.` in {file}"
            misses.append(
                f"README.md:{page_line(README, match.start())}: **{step}** ({file}:{start}-{end}) -> {where}"
            )
    fail_if(misses)


@pytest.mark.parametrize("page", PAGES)
def test_each_function_pointer_lands_on_its_definition(page):
    text = (ROOT / page).read_text()
    misses = []
    for match in FUNCTION_POINTER.finditer(text):
        name, file, number = match.groups()
        found = definitions(code_lines(file), name)
        if int(number) not in found:
            where = " or ".join(f"{file}:{n}" for n in found) or f"no `def {name}(` in {file}"
            misses.append(
                f"{page}:{page_line(text, match.start())}: `{name}` ({file}:{number}) -> {where}"
            )
    fail_if(misses)


@pytest.mark.parametrize("page", PAGES)
def test_every_pointer_names_what_it_points_at(page):
    text = (ROOT / page).read_text()
    checked = [match.span(2) for match in FUNCTION_POINTER.finditer(text)]
    if page == "README.md":
        checked += [(match.start(2), match.end(4)) for match in STEP_POINTER.finditer(text)]
    unchecked = [
        f"{page}:{page_line(text, match.start())}: {match.group()}"
        for match in POINTER.finditer(text)
        if not any(start <= match.start() < end for start, end in checked)
    ]
    fail_if(unchecked, "write these as `name`, file.py:N (one name per pointer)")


def test_readme_is_a_guide_of_at_most_150_lines():
    lines = len(README.splitlines())
    assert lines <= 150, (
        f"README.md has {lines} lines: move tables and figures to docs/, link them"
    )


@pytest.mark.parametrize("page", PAGES)
def test_every_relative_link_lands(page):
    text = outside_code_blocks((ROOT / page).read_text())
    misses = []
    for match in LINK.finditer(text):
        target = match.group(1)
        if re.match(r"[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        destination = (ROOT / page).parent / file if file else ROOT / page
        if not destination.exists():
            misses.append(f"{page}:{page_line(text, match.start())}: ({target}) -> no {file}")
        elif anchor and destination.suffix == ".md" and anchor not in heading_anchors(destination):
            misses.append(
                f"{page}:{page_line(text, match.start())}: ({target}) -> no heading #{anchor}"
            )
    fail_if(misses, "fix these links")
