"""A TRL user's recipe runs unchanged, and the run is recorded (issue 21, items 3 and 5).

`--config FILE` sets any flag from a YAML (or JSON) mapping and the command line overrides it; the run's
output_dir/args.json, written as it starts, reads back through `--config` as the same Args. The loading flags TRL users
type (--model_revision, --trust_remote_code, --attn_implementation, --dataset_config, --chat_template_kwargs) reach
what they name. A checkpoint holds each model's weights once (they were written twice: in HF format and again in
accelerate's state), and a resume restores them exactly from the HF files. --save_total_limit keeps the newest N
checkpoints and never the one a run resumed from.

rloo.py's cases run in the fast subset; the other scripts' cases that train are marked slow.
"""

import dataclasses
import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file
from test_faults import SCRIPTS, TINY, cli_error, every, run_tiny
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

import common
from common import ConfigError

NEW_FLAGS = (
    "config",
    "model_revision",
    "trust_remote_code",
    "attn_implementation",
    "dataset_config",
    "chat_template_kwargs",
    "save_total_limit",
    "lora_target_modules",
)


def checkpoints(out: Path) -> list[str]:
    return sorted((p.name for p in out.glob("checkpoint-*")), key=lambda name: int(name.split("-")[1]))


def listing(folder: Path) -> list[str]:
    return sorted(str(f.relative_to(folder)) for f in folder.rglob("*") if f.is_file())


# ----------------------------------------------------------------------------------------------------------------------
# --config and the run's record
# ----------------------------------------------------------------------------------------------------------------------
def test_a_config_file_sets_flags_and_the_command_line_overrides_it(tmp_path, monkeypatch):
    import rloo

    recipe = tmp_path / "run.yaml"
    recipe.write_text(
        "# a TRL-style recipe\n"
        "learning_rate: 1e-5  # YAML reads this as a string; argparse makes it the float\n"
        "use_peft: true\n"
        "disable_dropout: false\n"
        "lora_target_modules: [q_proj, v_proj]\n"
        "reward_clip_range: [-5, 5]\n"
        "chat_template_kwargs: {enable_thinking: false}\n"
        "vllm_max_model_length: null\n"
        "env: {RUN_RECORD_TEST: set by the recipe}\n"
    )
    monkeypatch.setenv("RUN_RECORD_TEST", "")  # restored after the test
    args = common.parse_args(rloo.Args, [f"--config={recipe}"])
    assert (args.learning_rate, args.use_peft, args.disable_dropout) == (1e-5, True, False)
    assert args.lora_target_modules == ["q_proj", "v_proj"] and args.reward_clip_range == [-5.0, 5.0]
    assert args.chat_template_kwargs == {"enable_thinking": False} and args.vllm_max_model_length is None
    assert common.os.environ["RUN_RECORD_TEST"] == "set by the recipe"  # TRL's `env:`
    overridden = ["--learning_rate", "3e-4", "--lora_target_modules", "q_proj,k_proj", "--use_peft", "false"]
    args = common.parse_args(rloo.Args, [overridden[0], overridden[1], "--config", str(recipe), *overridden[2:]])
    assert (args.learning_rate, args.lora_target_modules, args.use_peft) == (3e-4, ["q_proj,k_proj"], False)
    kwargs = common.parse_args(rloo.Args, ["--chat_template_kwargs", '{"enable_thinking": true}']).chat_template_kwargs
    assert kwargs == {"enable_thinking": True}


@pytest.mark.parametrize(
    "content, line",
    [
        ("learning_rat: 1e-5\n", "error: --config {file}: unknown key 'learning_rat' (did you mean --learning_rate?)"),
        ("per_device_train_batch_size: 8\n", "error: --config {file}: unknown key 'per_device_train_batch_size' ("),
        ("- 1\n", "error: --config {file}: expected a mapping of flag: value, got list"),
        ("use_peft: [\n", "error: --config {file}: not YAML (line 2): expected the node content, but found"),
        ("env: [A]\n", "error: --config {file}: env: expected a mapping of variable: value"),
        ("learning_rate: fast\n", "error: --learning_rate: invalid float value: 'fast'"),
        ("chat_template_kwargs: [1]\n", "error: --chat_template_kwargs: expected a JSON object such as"),
        (None, "error: --config: cannot read {file}: No such file or directory"),
    ],
)
def test_a_config_mistake_is_one_line_and_nothing_is_written(tmp_path, capsys, content, line):
    file = tmp_path / "run.yaml"
    if content is not None:
        file.write_text(content)
    said = cli_error("rloo.py", ["--config", str(file), "--output_dir", str(tmp_path / "out")], capsys)
    assert said.startswith(line.format(file=file))
    assert not (tmp_path / "out").exists()


def test_every_script_documents_the_new_flags_alike(capsys):
    """The same one-line help in every script that has the flag; --config in each --help."""
    for name in NEW_FLAGS[1:]:
        helps = {
            field.metadata["help"]
            for module in SCRIPTS.values()
            for field in dataclasses.fields(module.Args)
            if field.name == name
        }
        assert len(helps) == 1, (name, helps)
        having = [script for script, module in SCRIPTS.items() if name in module.Args.__dataclass_fields__]
        # reward_model.py renders pairs as the RL scripts' reward model scores them: no chat template arguments
        assert having == [s for s in SCRIPTS if s != "reward_model.py" or name != "chat_template_kwargs"], name
    for module in SCRIPTS.values():
        with pytest.raises(SystemExit):
            common.parse_args(module.Args, ["--help"])
        assert "--config FILE" in capsys.readouterr().out


@pytest.mark.parametrize("script", every(SCRIPTS, fast=("rloo.py", "reward_model.py")))
def test_the_run_record_reads_back_as_the_same_args(tmp_path, script):
    """output_dir/args.json holds every flag of the run (written as it starts, whole) and is what `--config` reads:
    the same Args again; each checkpoint records the same."""
    module, out = SCRIPTS[script], tmp_path / "out"
    overrides = dict(
        use_peft=True,
        lora_target_modules=["q_proj", "v_proj"],
        save_steps=1,
        save_total_limit=2,
        attn_implementation="eager",
        learning_rate=1e-5,
        **({} if script == "reward_model.py" else {"chat_template_kwargs": {"enable_thinking": False}}),
    )
    run_tiny(script, out, **overrides)
    ran = module.Args(output_dir=str(out), **{**TINY[script], **overrides})
    assert common.parse_args(module.Args, ["--config", str(out / "args.json")]) == ran
    assert (out / "checkpoint-2" / "args.json").read_text() == (out / "args.json").read_text()
    assert not list(out.glob(".args.json*"))


# ----------------------------------------------------------------------------------------------------------------------
# The loading flags
# ----------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("script", every(("rloo.py", "ppo.py")))
def test_the_loading_flags_reach_every_model_and_the_tokenizer(tmp_path, monkeypatch, script):
    """The policy, its reference and ppo.py's value model load with --model_revision, --trust_remote_code and
    --attn_implementation, as TRL's model_init_kwargs; the tokenizer with the first two."""
    calls = []
    for auto in (AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer):
        loaded = auto.from_pretrained

        def spy(path, *args, loaded=loaded, kind=auto.__name__, **kwargs):
            calls.append((kind, {k: kwargs.get(k) for k in ("revision", "trust_remote_code", "attn_implementation")}))
            return loaded(path, *args, **kwargs)

        monkeypatch.setattr(auto, "from_pretrained", spy)
    flags = {"beta": 0.05} if script == "rloo.py" else {"kl_coef": 0.05}
    run_tiny(script, tmp_path / "out", max_steps=1, attn_implementation="eager", model_revision="main", **flags)
    model = {"revision": "main", "trust_remote_code": False, "attn_implementation": "eager"}
    tokenizer = {**model, "attn_implementation": None}
    models = ["AutoModelForCausalLM"] * 2 + ["AutoModelForSequenceClassification"] * (script == "ppo.py")
    assert sorted(calls, key=str) == sorted([("AutoTokenizer", tokenizer), *((m, model) for m in models)], key=str)
    # a model from another repository (--value_model_path) loads at its own default branch
    args = SimpleNamespace(
        model_name_or_path="a", model_revision="v1", trust_remote_code=True, attn_implementation=None
    )
    assert common.loading_options(args) == {"revision": "v1", "trust_remote_code": True}
    assert common.loading_options(args, "b") == {"trust_remote_code": True}


def test_dataset_config_picks_a_configuration(tmp_path, monkeypatch):
    """load_dataset's `name`, for a hub dataset or a dataset folder with several configurations (here a local one,
    its configurations declared in its README.md as on the hub)."""
    data = tmp_path / "data"
    for name in ("easy", "hard"):
        (data / name).mkdir(parents=True)
        rows = [{"prompt": f"{name} {i} =", "ground_truth": str(i)} for i in range(4)]
        (data / name / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    configs = [
        f"- config_name: {n}\n  data_files:\n  - split: train\n    path: {n}/train.jsonl\n" for n in ("easy", "hard")
    ]
    (data / "README.md").write_text("---\nconfigs:\n" + "".join(configs) + "---\n")
    rendered = []
    prompt_text = common.prompt_text
    monkeypatch.setattr(common, "prompt_text", lambda *a: rendered.append(a[1]) or prompt_text(*a))
    run_tiny("rloo.py", tmp_path / "out", dataset_name=str(data), dataset_config="hard", max_steps=1)
    assert rendered and all(prompt.startswith("hard") for prompt in rendered)
    with pytest.raises(ConfigError, match="--dataset_name: cannot load .*: Config name is missing. \\(choose one with"):
        run_tiny("rloo.py", tmp_path / "no_config", dataset_name=str(data))
    with pytest.raises(ConfigError, match="--dataset_config: cannot load 'medium' of .*: BuilderConfig 'medium' not"):
        run_tiny("rloo.py", tmp_path / "no_such", dataset_name=str(data), dataset_config="medium")
    with pytest.raises(ConfigError, match="--dataset_config: arithmetic has no configurations"):
        run_tiny("rloo.py", tmp_path / "builtin", dataset_config="hard")


def test_chat_template_kwargs_reach_every_rendered_prompt(tmp_path, monkeypatch):
    """Training rollouts, the prompt-length check and the evaluation render prompts with them (Qwen3's
    enable_thinking, say): here a template that marks a prompt rendered with enable_thinking=False."""
    model = tmp_path / "model"
    shutil.copytree(common.EMBEDDED_MODEL, model)
    template = model / "chat_template.jinja"
    marked = "{% if enable_thinking is defined and not enable_thinking %}/no_think {% endif %}"
    template.write_text(marked + template.read_text())
    rendered = []
    prompt_text = common.prompt_text
    monkeypatch.setattr(common, "prompt_text", lambda *a: rendered.append(prompt_text(*a)) or rendered[-1])
    run_tiny(
        "rloo.py",
        tmp_path / "out",
        model_name_or_path=str(model),
        chat_template_kwargs={"enable_thinking": False},
        eval_steps=1,
        num_generations_eval=1,
    )
    assert len(rendered) > 100 and all(text.startswith("/no_think <|im_start|>user") for text in rendered)


def test_lora_target_modules_takes_trls_list_and_our_comma_form(tiny_model):
    lora = dict(lora_r=4, lora_alpha=8, lora_dropout=0.0)
    for targets in (["q_proj", "v_proj"], "q_proj,v_proj", ["q_proj,v_proj"], [" q_proj", "v_proj, "]):
        config = common.lora_config(SimpleNamespace(lora_target_modules=targets, **lora), tiny_model)
        assert config.target_modules == {"q_proj", "v_proj"}, targets
    assert common.lora_config(
        SimpleNamespace(lora_target_modules=["all-linear"], **lora), tiny_model
    ).target_modules == ("all-linear")
    with pytest.raises(ConfigError, match="--lora_target_modules: Qwen2ForCausalLM has no module 'o_porj'"):
        common.lora_config(SimpleNamespace(lora_target_modules=["q_proj", "o_porj"], **lora), tiny_model)


# ----------------------------------------------------------------------------------------------------------------------
# Checkpoints: the weights once, resumed exactly; --save_total_limit
# ----------------------------------------------------------------------------------------------------------------------
STATE = ["accelerator_state/custom_checkpoint_0.pkl", "accelerator_state/optimizer.bin"]
STATE += ["accelerator_state/random_states_0.pkl", "args.json", "training_state.pt"]
TOKENIZER = ["chat_template.jinja", "tokenizer.json", "tokenizer_config.json"]
FULL = ["config.json", "model.safetensors"]
ADAPTER = ["README.md", "adapter_config.json", "adapter_model.safetensors"]


@pytest.mark.parametrize(
    "script, use_peft",
    [
        ("rloo.py", False),
        ("rloo.py", True),
        *every(("grpo.py", "reinforce.py", "ppo.py", "sft.py", "reward_model.py"), False, fast=()),
        pytest.param("ppo.py", True, marks=pytest.mark.slow),
    ],
)
def test_a_checkpoint_holds_the_weights_once(tmp_path, script, use_peft):
    """Every file of checkpoint-1: the model (or adapter) in HF format and nothing of it in accelerator_state/, which
    holds the optimizer, the scheduler and the RNG; ppo.py's value model in value_model/, once too."""
    run_tiny(script, tmp_path / "out", max_steps=1, save_steps=1, use_peft=use_peft)
    model = ADAPTER if use_peft else FULL + ["generation_config.json"] * (script != "reward_model.py")
    expected = STATE + TOKENIZER + model
    if script == "ppo.py":
        expected += [f"value_model/{name}" for name in TOKENIZER + (ADAPTER if use_peft else FULL)]
    assert listing(tmp_path / "out" / "checkpoint-1") == sorted(expected)


@pytest.mark.parametrize("use_peft, accelerate_copy", [(True, False), (False, True)])
def test_a_resume_restores_the_weights_exactly(tmp_path, monkeypatch, use_peft, accelerate_copy):
    """From the adapter's HF file (the full model's: test_rloo's resume test); and from accelerate's copy, which a
    checkpoint keeps where transformers saves the weights under other names than it trains them (and every
    checkpoint saved before the weights were written once has)."""
    if accelerate_copy:
        monkeypatch.setattr(common, "hf_files_hold_weights", lambda accelerator, models: False)
    flags = dict(max_steps=3, save_steps=1, use_peft=use_peft, learning_rate=1e-3, beta=0.1)
    run_tiny("rloo.py", tmp_path / "out", **flags)
    state = tmp_path / "out" / "checkpoint-1" / "accelerator_state"
    assert (state / "model.safetensors").is_file() == accelerate_copy
    monkeypatch.undo()
    resume_from = str(tmp_path / "out" / "checkpoint-1")
    run_tiny("rloo.py", tmp_path / "resumed", resume_from_checkpoint=resume_from, **flags)
    weights = "adapter_model.safetensors" if use_peft else "model.safetensors"
    final, again = load_file(tmp_path / "out" / weights), load_file(tmp_path / "resumed" / weights)
    assert all(torch.equal(final[k], again[k]) for k in final)
    uninterrupted, resumed = [
        [{k: v for k, v in r.items() if k != "step_time"} for r in common.read_metrics(tmp_path / d) if "loss" in r]
        for d in ("out", "resumed")
    ]
    assert resumed == uninterrupted[1:]


def test_a_resumed_run_keeps_its_checkpoint_under_save_total_limit(tmp_path, capsys):
    out = tmp_path / "out"
    run_tiny("rloo.py", out, max_steps=3, save_steps=1, save_total_limit=2)
    assert checkpoints(out) == ["checkpoint-2", "checkpoint-3"]
    # resumed from an older checkpoint: it stays, beside the newest one
    older = str(out / "checkpoint-2")
    run_tiny("rloo.py", out, resume_from_checkpoint=older, max_steps=5, save_steps=1, save_total_limit=1)
    assert checkpoints(out) == ["checkpoint-2", "checkpoint-5"]
    assert "--save_total_limit 1 (the checkpoint's: 2)" in capsys.readouterr().out  # may change on resume
    # resumed from the newest (latest): checkpoint-2 is now merely old
    run_tiny("rloo.py", out, resume_from_checkpoint="latest", max_steps=6, save_steps=1, save_total_limit=1)
    assert checkpoints(out) == ["checkpoint-5", "checkpoint-6"]
    assert [r["step"] for r in common.read_metrics(out) if "loss" in r] == [1, 2, 3, 4, 5, 6]
    assert not list(out.glob(".checkpoint-*"))


def test_save_total_limit_counts_complete_checkpoints_only(tmp_path):
    """The newest N complete checkpoint-N folders are kept, and those `keep` names; a folder that is not a complete
    checkpoint (a copy cut short, checkpoint-best) is neither counted nor deleted."""
    for step in range(1, 6):  # complete ones, as save_checkpoint writes them (an empty accelerate state here)
        (tmp_path / f"checkpoint-{step}" / "accelerator_state").mkdir(parents=True)
        torch.save({"step": step, "files": {}}, tmp_path / f"checkpoint-{step}" / "training_state.pt")
    (tmp_path / "checkpoint-9").mkdir()  # no training_state.pt: incomplete
    (tmp_path / "checkpoint-best").mkdir()
    common.delete_old_checkpoints(str(tmp_path), 2, keep=[tmp_path / "checkpoint-5", tmp_path / "checkpoint-1"])
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "checkpoint-1",
        "checkpoint-4",
        "checkpoint-5",
        "checkpoint-9",
        "checkpoint-best",
    ]
    with pytest.raises(ConfigError, match="--save_total_limit: must be positive"):
        run_tiny("rloo.py", tmp_path / "out", save_total_limit=0)
