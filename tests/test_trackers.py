"""--report_to: the metrics go through accelerate's trackers, metrics.jsonl being one of them. TensorBoard writes under
output_dir, a list or commas name several trackers, `all` every installed one; an unknown name, a missing package or
a tracker that fails is one line. --log_completions also sends a completions table to the trackers that take one (a
fake one here, registered with accelerate as a user's own would be)."""

import math
from pathlib import Path

import pytest
from accelerate.tracking import LOGGER_TYPE_TO_CLASS, GeneralTracker, get_available_trackers
from accelerate.utils import LoggerType

import common
import grpo
import ppo
import reinforce
import rloo

SCRIPTS = {"rloo.py": rloo, "grpo.py": grpo, "reinforce.py": reinforce, "ppo.py": ppo}
FAST = {  # two logged steps of 8 completions each
    "rloo.py": dict(prompts_per_step=4),
    "grpo.py": dict(prompts_per_step=2, num_generations=4),
    "reinforce.py": dict(prompts_per_step=8),
    "ppo.py": dict(prompts_per_step=8, num_ppo_epochs=1),
}


def run(script: str, tmp_path, **overrides) -> Path:
    module = SCRIPTS[script]
    flags = dict(max_steps=2, eval_strategy="no", logging_steps=1, save_steps=0, **FAST[script])
    module.main(module.Args(output_dir=str(tmp_path / "out"), **{**flags, **overrides}))
    return tmp_path / "out"


class FakeTracker(GeneralTracker):
    """A tracker that keeps what it is sent, and takes tables as W&B's does."""

    name = "fake"
    requires_logging_directory = False
    runs = []  # every instance, newest last

    fail_at_step = None  # a step whose record it cannot take

    def __init__(self, run_name: str):
        super().__init__()
        self.project = run_name
        self.config, self.records, self.tables, self.finished = None, [], [], False
        FakeTracker.runs.append(self)

    @property
    def tracker(self):
        return self

    def store_init_configuration(self, values: dict):
        self.config = values

    def log(self, values: dict, step: int | None = None, **kwargs):
        if step == self.fail_at_step:
            raise RuntimeError("the server went away")
        self.records.append({"step": step, **values})

    def log_table(self, table_name, columns=None, data=None, dataframe=None, step=None, **kwargs):
        self.tables.append({"name": table_name, "columns": columns, "data": data, "step": step})

    def finish(self):
        self.finished = True


@pytest.fixture
def fake_tracker(monkeypatch):
    monkeypatch.setitem(LOGGER_TYPE_TO_CLASS, "fake", FakeTracker)
    monkeypatch.setattr(FakeTracker, "runs", [])
    return FakeTracker


def same_record(sent: dict, written: dict) -> bool:
    """A record as a tracker got it and as metrics.jsonl holds it (floats, and null for what is not finite)."""
    return sent.keys() == written.keys() and all(
        written[k] is None if isinstance(v, float) and not math.isfinite(v) else written[k] == pytest.approx(v)
        for k, v in sent.items()
    )


def test_tensorboard_writes_its_events_under_output_dir(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = run("rloo.py", tmp_path, report_to=["tensorboard"])
    (events,) = (out / "runs" / common.PROJECT).glob("events.out.tfevents.*")
    scalars = EventAccumulator(str(events)).Reload()
    written = [r for r in common.read_metrics(out) if "reward" in r]
    assert [(e.step, e.value) for e in scalars.Scalars("reward")] == [
        (r["step"], pytest.approx(r["reward"])) for r in written
    ]
    assert list(out.glob(f"runs/{common.PROJECT}/*/hparams.yml"))  # the run's flags


def test_two_trackers_get_every_record_metrics_jsonl_gets(tmp_path, fake_tracker):
    out = run("rloo.py", tmp_path, report_to=["tensorboard", "fake"], eval_strategy="steps", eval_steps=1)
    (fake,) = fake_tracker.runs
    written = common.read_metrics(out)
    assert len(fake.records) == len(written) == 5  # the evaluations at steps 0, 1 and 2, the training records of 1, 2
    assert all(same_record(sent, record) for sent, record in zip(fake.records, written))
    assert fake.project == common.PROJECT and fake.config["learning_rate"] == 2e-4 and fake.finished
    assert fake.config["report_to"] == "['tensorboard', 'fake']"  # a list, as a string: tensorboard takes no lists
    assert list((out / "runs" / common.PROJECT).glob("events.out.tfevents.*"))
    assert fake.tables == []  # no --log_completions


@pytest.mark.parametrize("script", [pytest.param(s, marks=() if s == "rloo.py" else pytest.mark.slow) for s in SCRIPTS])
def test_log_completions_sends_a_table_to_a_tracker_that_takes_one(tmp_path, fake_tracker, capsys, script):
    out = run(script, tmp_path, report_to=["fake"], log_completions=True, num_completions_to_print=3)
    (fake,) = fake_tracker.runs
    assert [(t["name"], t["columns"], t["step"]) for t in fake.tables] == [
        ("completions", ["step", "prompt", "completion", "reward"], step) for step in (1, 2)
    ]
    for table in fake.tables:
        assert len(table["data"]) == 8  # the step's whole batch
        assert all(row[0] == table["step"] and "Compute" in row[1] and isinstance(row[2], str) for row in table["data"])
    rewards = [row[3] for row in fake.tables[-1]["data"]]
    record = [r for r in common.read_metrics(out) if r["step"] == 2 and "step_time" in r][0]
    mean = record["reward"] if "reward" in record else record["objective/scores"]
    assert sum(rewards) / len(rewards) == pytest.approx(mean, abs=1e-5)
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[step 2] ")]
    assert len(printed) == 3


def test_report_to_takes_a_list_commas_and_all():
    parsed = common.parse_args(rloo.Args, ["--report_to", "tensorboard", "tensorboard,trackio"])
    assert parsed.report_to == ["tensorboard", "tensorboard,trackio"]
    installed = [str(tracker) for tracker in get_available_trackers()]
    assert "tensorboard" in installed
    assert common.tracker_names("all") == common.tracker_names(["all"]) == installed
    assert common.tracker_names("none") == common.tracker_names(["none"]) == common.tracker_names([]) == []
    assert common.tracker_names(["tensorboard", "tensorboard"]) == ["tensorboard"]
    assert rloo.Args().report_to == ["none"]


def cli_error(argv: list[str], capsys) -> str:
    """rloo.py's command line in this process: exit status 2, and stderr ends with its one error line: that line."""
    with pytest.raises(SystemExit) as exit_info:
        common.cli(rloo.main, rloo.Args, argv)
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert [line for line in lines if "error" in line.lower() or "Traceback" in line] == lines[-1:], lines
    return lines[-1]


def test_unknown_trackers_and_missing_packages_are_one_line(tmp_path, capsys):
    missing = [str(t) for t in LoggerType if t != LoggerType.ALL and t not in get_available_trackers()]
    cases = [
        (["tensorbord"], "error: --report_to: unknown tracker 'tensorbord' (accelerate's: aim, clearml, comet_ml,"),
        (["none", "tensorboard"], "error: --report_to: none stands alone, got none tensorboard"),
        (["all,wandb"], "error: --report_to: all stands alone, got all wandb"),
    ]
    cases += [([name], f"error: --report_to {name}: the {name} package is not installed") for name in missing[:1]]
    for flags, line in cases:
        assert cli_error(["--report_to", *flags, "--output_dir", str(tmp_path / "out")], capsys).startswith(line)
        assert not (tmp_path / "out").exists()


def test_a_tracker_that_cannot_start_is_one_line(tmp_path, fake_tracker, monkeypatch, capsys):
    def refuse(self, values):
        raise PermissionError("not logged in")

    monkeypatch.setattr(FakeTracker, "store_init_configuration", refuse)
    line = cli_error(["--report_to", "fake", "--output_dir", str(tmp_path / "out")], capsys)
    assert line == "error: --report_to: cannot start the trackers: PermissionError: not logged in"


@pytest.mark.parametrize("fail_at_step", [2, 3])
def test_a_tracker_that_fails_stops_the_run_with_one_line_after_a_checkpoint(
    tmp_path, fake_tracker, monkeypatch, capsys, fail_at_step
):
    """Mid-run or at the last step: the run stops with one line and a checkpoint of the step that failed to log."""
    monkeypatch.setattr(FakeTracker, "fail_at_step", fail_at_step)
    out = tmp_path / "out"
    flags = ["--prompts_per_step", "4", "--max_steps", "3", "--logging_steps", "1", "--eval_strategy", "no"]
    line = cli_error([*flags, "--report_to", "fake", "--output_dir", str(out)], capsys)
    assert line.startswith("error: --report_to: a tracker failed: RuntimeError: the server went away")
    assert f"(at step {fail_at_step}); saved {out / f'checkpoint-{fail_at_step}'}: after fixing it" in line
    assert [r["step"] for r in common.read_metrics(out)] == list(range(1, fail_at_step + 1))  # metrics.jsonl first
    assert fake_tracker.runs[0].finished and not (out / "model.safetensors").exists()  # no final model
