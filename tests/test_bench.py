"""bench.py end to end on a tiny config (two algorithms, three steps, the embedded model), and its bad inputs."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1"}


def bench(*flags):
    return subprocess.run(
        [sys.executable, "bench.py", *flags], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300
    )


def test_tiny_bench_prints_a_table_and_writes_positive_figures(tmp_path):
    output_json = tmp_path / "bench.json"
    result = bench(
        "--algorithms",
        "rloo,reinforce",
        "--configs",
        "embedded",
        "--steps",
        "3",
        "--warmup_steps",
        "1",
        "--completions_per_step",
        "8",
        "--work_dir",
        str(tmp_path / "work"),
        "--output_json",
        str(output_json),
    )
    assert result.returncode == 0, result.stderr[-2000:]
    table = [line for line in result.stdout.splitlines() if line.startswith("| embedded |")]
    assert [line.split(" | ")[1] for line in table] == ["rloo", "reinforce"]
    report = json.loads(output_json.read_text())
    assert [(row["config"], row["algorithm"]) for row in report["summary"]] == [
        ("embedded", "rloo"),
        ("embedded", "reinforce"),
    ]
    for row in report["summary"]:
        for name in [
            "median_step_time_s",
            "median_step_cpu_time_s",
            "completions_per_s",
            "generated_tokens_per_s",
            "mean_completion_length",
            "peak_rss_mb",
            "baseline_rss_mb",
            "rss_above_baseline_mb",
        ]:
            assert row[name] > 0, (row["algorithm"], name)
        assert row["peak_rss_mb"] > row["baseline_rss_mb"]
        assert row["parameters"] > 0 and row["repeats"] == 1
    for run in report["runs"]:
        assert len(run["step_times_s"]) == 3  # every step logged; the median is over the last two
        # the resident size at each step's log, and between steps once freed heap pages are returned
        assert len(run["rss_by_step_mb"]) == len(run["rss_between_steps_mb"]) == 3
        assert all(0 < kept <= logged + 16 for kept, logged in zip(run["rss_between_steps_mb"], run["rss_by_step_mb"]))
        assert run["completions_per_s"] == pytest.approx(8 / run["median_step_time_s"])
    assert report["settings"]["num_threads"] == 1


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--algorithms", "sft"], "error: --algorithms: unknown algorithm 'sft'"),
        (["--configs", "huge"], "error: --configs: unknown config 'huge'"),
        (["--steps", "2", "--warmup_steps", "2"], "error: --steps: 2 leaves no measured step after --warmup_steps 2"),
        (
            ["--completions_per_step", "30"],
            "error: --completions_per_step: 30 is not a multiple of --num_generations 4",
        ),
        (
            ["--algorithms", "trl_rloo", "--trl_python", "/nonexistent/python"],
            "error: --trl_python: /nonexistent/python cannot import trl",
        ),
    ],
)
def test_bad_input_prints_one_line_and_exits_2(tmp_path, flags, message):
    result = bench(*flags, "--work_dir", str(tmp_path / "work"), "--output_json", str(tmp_path / "bench.json"))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(message), result.stderr
    assert not (tmp_path / "work").exists()  # nothing written before the inputs are checked
