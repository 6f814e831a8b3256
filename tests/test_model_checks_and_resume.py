"""Models that are not what the flag says, and resumes that change what the checkpoint means (issue 20, causes 3, 4).

Every model-taking flag goes through one loader (rewards.load_pretrained: common.load_causal_lm, the sequence
classifiers of reward_model.py, ppo.py's value model and --reward_model_path), every --lora_target_modules through
common.lora_config, every resume through common.resolve_checkpoint (against the checkpoint's args.json) and
common.load_training_state. Each mistake is one line naming the flag and what it got instead.

rloo.py's cases run in the fast subset; the other scripts' cases that train are marked slow.
"""

import json
import re
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from test_faults import RL, SCRIPTS, cli_error, every, run_tiny
from transformers import AutoConfig, AutoModelForSequenceClassification

import common
from common import ConfigError

CAUSAL = ("rloo.py", "grpo.py", "reinforce.py", "ppo.py", "sft.py")  # --model_name_or_path is a causal LM


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict:
    """Model folders that are not what a flag needs, made from the embedded model."""
    from peft import LoraConfig, get_peft_model

    root = tmp_path_factory.mktemp("models")
    tokenizer = common.load_tokenizer(common.EMBEDDED_MODEL)
    config = AutoConfig.from_pretrained(common.EMBEDDED_MODEL, num_labels=2)
    AutoModelForSequenceClassification.from_config(config).save_pretrained(root / "classifier")  # 2 labels
    adapter = get_peft_model(
        common.load_causal_lm(common.EMBEDDED_MODEL), LoraConfig(task_type="CAUSAL_LM", target_modules=["q_proj"])
    )
    torch.nn.init.normal_(adapter.base_model.model.model.layers[0].self_attn.q_proj.lora_B["default"].weight)
    adapter.save_pretrained(root / "adapter")  # of a causal LM
    reward_model = AutoModelForSequenceClassification.from_pretrained(common.EMBEDDED_MODEL, num_labels=1)
    get_peft_model(reward_model, LoraConfig(task_type="SEQ_CLS", target_modules=["q_proj"])).save_pretrained(
        root / "reward_adapter"
    )
    for name in ("classifier", "adapter", "reward_adapter", "tokenizer_only"):
        tokenizer.save_pretrained(root / name)
    (root / "empty").mkdir()
    (root / "a_file").write_text("not a model")
    shutil.copytree(common.EMBEDDED_MODEL, root / "missing_weight")
    weights = load_file(root / "missing_weight" / "model.safetensors")
    del weights["model.norm.weight"]
    save_file(weights, root / "missing_weight" / "model.safetensors", metadata={"format": "pt"})
    shutil.copytree(common.EMBEDDED_MODEL, root / "no_eos")
    tokenizer_config = root / "no_eos" / "tokenizer_config.json"
    tokenizer_config.write_text(json.dumps({**json.loads(tokenizer_config.read_text()), "eos_token": None}))
    return {path.name: str(path) for path in root.iterdir()}


def refused(script: str, tmp_path, message: str, **overrides):
    """The script's TINY run stops with a ConfigError matching `message` before it writes anything."""
    with pytest.raises(ConfigError, match=message):
        run_tiny(script, tmp_path / "out", **overrides)
    assert not (tmp_path / "out").exists()


# ----------------------------------------------------------------------------------------------------------------------
# Cause 3: models that are not what the flag says
# ----------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("script", SCRIPTS)
def test_a_two_label_classifier_as_the_model(tmp_path, folders, script):
    """Trained silently as a causal LM (its tied embeddings serve as an LM head; the score head is dropped), or a
    size-mismatch traceback in reward_model.py."""
    path = folders["classifier"]
    message = (
        f"--model_name_or_path: {path} is a Qwen2ForSequenceClassification, not a causal LM \\(Qwen2ForCausalLM\\)"
        if script in CAUSAL
        else f"--model_name_or_path: cannot load a reward model from '{path}': score.weight is \\(2, 128\\) in the "
        "checkpoint, not \\(1, 128\\): a classifier with 2 labels, where a reward model has 1"
    )
    refused(script, tmp_path, message, model_name_or_path=path)


CAUSAL_ADAPTER = "it is a LoRA adapter for CAUSAL_LM \\(its task_type\\), not for SEQ_CLS"
TWO_LABELS = "score.weight is \\(2, 128\\) in the checkpoint, not \\(1, 128\\): a classifier with 2 labels, where "


@pytest.mark.parametrize(
    "script, flag, model, message",
    [
        *[(s, "reward_model_path", "classifier", TWO_LABELS + "a reward model has 1") for s in RL],
        ("ppo.py", "value_model_path", "classifier", TWO_LABELS + "a value model has 1"),
        *[(s, "reward_model_path", "adapter", CAUSAL_ADAPTER) for s in RL],
        ("ppo.py", "value_model_path", "adapter", CAUSAL_ADAPTER),
        ("reward_model.py", "model_name_or_path", "adapter", CAUSAL_ADAPTER),
        ("rloo.py", "reward_model_path", "tokenizer_only", "no config.json, so no model in it"),
        ("ppo.py", "value_model_path", "empty", "the folder is empty"),
    ],
)
def test_a_reward_or_value_model_that_is_not_one(tmp_path, folders, script, flag, model, message):
    """A classifier with two labels was a size-mismatch traceback; a causal LM's LoRA adapter was scored (or trained)
    through a random score head, which transformers loads onto the adapter's base without a word."""
    refused(
        script,
        tmp_path,
        f"--{flag}: cannot load an? (reward|value) model from '{folders[model]}': {message}",
        **{flag: folders[model]},
    )


FOLDERS = {  # what each folder is said to be, for --model_name_or_path
    "tokenizer_only": "cannot load an? (reward )?model from '{path}': no config.json, so no model in it \\(it holds "
    "chat_template.jinja, tokenizer.json, tokenizer_config.json\\)",
    "empty": "cannot load a tokenizer from '{path}': the folder is empty",
    "a_file": "cannot load a tokenizer from '{path}': it is a file, not a model folder",
    "no_eos": "the tokenizer of {path} has no eos token, so no completion could end",
    "missing_weight": "1 weights of {path} are not in the checkpoint and would start random: model.norm.weight",
}


@pytest.mark.parametrize(
    "script, folder",
    [
        (script, folder)
        for script in SCRIPTS
        for folder in FOLDERS
        if not (script == "reward_model.py" and folder == "missing_weight")  # a new head: said as a warning
    ],
)
def test_a_folder_that_holds_no_usable_model(tmp_path, folders, script, folder):
    """Each was a misleading line (a tokenizer only: "should have a model_type key in its config.json"; an empty
    folder: "couldn't instantiate the backend tokenizer from one of:"; a file: "not a valid JSON file"), or training:
    on a weight that starts random, or with no end of completion."""
    path = folders[folder]
    refused(script, tmp_path, "--model_name_or_path: " + FOLDERS[folder].format(path=path), model_name_or_path=path)


def test_a_reward_model_that_is_not_one_is_one_line_on_the_command_line(tmp_path, folders, capsys):
    """No transformers load report and no traceback before it (a two-label classifier was a size-mismatch one)."""
    argv = ["--reward_model_path", folders["classifier"], "--output_dir", str(tmp_path / "out")]
    line = cli_error("grpo.py", argv, capsys)
    assert line.startswith(f"error: --reward_model_path: cannot load a reward model from '{folders['classifier']}'")


def test_a_lora_adapter_as_the_policy_is_its_merged_model(tmp_path, folders):
    """sft.py --use_peft writes an adapter; given as --model_name_or_path it is merged into its base model, so that the
    policy, the reference and the final save are full models (transformers' own loading kept the adapter's layers
    unmerged, and a full fine-tune saved only the adapter)."""
    from peft import AutoPeftModelForCausalLM

    policy = common.load_causal_lm(folders["adapter"])
    merged = AutoPeftModelForCausalLM.from_pretrained(folders["adapter"]).merge_and_unload()
    assert [name for name, _ in policy.named_parameters()] == [name for name, _ in merged.named_parameters()]
    assert all(torch.equal(a, b) for a, b in zip(policy.parameters(), merged.parameters()))
    assert not torch.equal(
        policy.model.layers[0].self_attn.q_proj.weight,
        common.load_causal_lm(common.EMBEDDED_MODEL).model.layers[0].self_attn.q_proj.weight,
    )
    run_tiny("rloo.py", tmp_path / "out", model_name_or_path=folders["adapter"], max_steps=1)
    assert (tmp_path / "out" / "model.safetensors").is_file() and not (
        tmp_path / "out" / "adapter_config.json"
    ).exists()


def test_a_lora_reward_model_as_the_value_model_is_merged_and_trained(folders):
    """reward_model.py --use_peft writes an adapter; ppo.py merged it into its base model but left every weight frozen,
    so that without --use_peft the value model never learned."""
    import ppo

    value_model = common.load_value_model(ppo.Args(value_model_path=folders["reward_adapter"]))
    assert all(p.requires_grad for p in value_model.parameters()) and not hasattr(value_model, "peft_config")
    assert value_model.score.weight.abs().sum() > 0  # the reward model's head, not a new one (zeroed)


@pytest.mark.parametrize("targets", ["q_proj,o_porj", "mlp"])
@pytest.mark.parametrize("script", SCRIPTS)
def test_lora_target_modules_must_name_layers_of_the_model(tmp_path, script, targets):
    """A misspelt name next to a right one was skipped without a word (LoRA on q_proj only); a block (mlp) was peft's
    ValueError, which prints the whole block."""
    kind, head = (
        ("Qwen2ForSequenceClassification", "score") if script == "reward_model.py" else ("Qwen2ForCausalLM", "lm_head")
    )
    layers = sorted(["down_proj", "embed_tokens", "gate_proj", "k_proj", head, "o_proj", "q_proj", "up_proj", "v_proj"])
    listed = f"\\(its layers: {', '.join(layers)}; or all-linear\\)"
    message = (
        f"--lora_target_modules: {kind} has no module 'o_porj' {listed}"
        if targets.startswith("q_proj")
        else f"--lora_target_modules: 'mlp' is a Qwen2MLP, not a layer LoRA adapts {listed}"
    )
    refused(script, tmp_path, message, use_peft=True, lora_target_modules=targets)


# ----------------------------------------------------------------------------------------------------------------------
# Cause 4: a resume that changes what the checkpoint means
# ----------------------------------------------------------------------------------------------------------------------
def first_run(script: str, out, **overrides):
    run_tiny(script, out, max_steps=1, save_steps=1, **overrides)
    return out / "checkpoint-1"


@pytest.mark.parametrize("script", every(SCRIPTS))
def test_the_checkpoint_records_the_runs_flags(tmp_path, script):
    checkpoint = first_run(script, tmp_path / "out", use_peft=True, lora_r=8)
    module = SCRIPTS[script]
    recorded = json.loads((checkpoint / "args.json").read_text())
    assert recorded == json.loads(json.dumps(common.dataclasses.asdict(module.Args(**recorded))))
    assert recorded["lora_r"] == 8 and recorded["use_peft"] and recorded["save_steps"] == 1
    assert common.checkpoint_problem(checkpoint) is None


@pytest.mark.parametrize("script", every(SCRIPTS))
def test_a_resume_with_other_lora_flags_is_one_line_naming_them(tmp_path, script):
    """Was a load_state_dict traceback (the adapter's shapes differ)."""
    out = tmp_path / "out"
    first_run(script, out, use_peft=True, lora_r=8)
    with pytest.raises(ConfigError) as error:
        run_tiny(script, out, resume_from_checkpoint="latest", use_peft=True, lora_r=4, lora_target_modules="q_proj")
    assert str(error.value).startswith(
        "--resume_from_checkpoint: checkpoint-1 was saved with other flags, which a resumed run cannot change: "
        "--lora_r 4 (the checkpoint's: 8); --lora_target_modules q_proj (the checkpoint's: all-linear). Resume with "
        f"its flags ({out / 'checkpoint-1' / 'args.json'}), or start a new run from its model (--model_name_or_path "
    )


CHANGED = {  # a flag of each script whose change would make the checkpoint another experiment, and its new value
    "rloo.py": ("beta", 0.5),
    "grpo.py": ("loss_type", "grpo"),
    "reinforce.py": ("num_generations", 4),
    "ppo.py": ("vf_coef", 0.5),
    "sft.py": ("max_length", 32),
    "reward_model.py": ("center_rewards_coefficient", 0.1),
}


@pytest.mark.parametrize("script", every(SCRIPTS))
def test_a_resume_with_another_objective_or_learning_rate_stops(tmp_path, hub_model, script):
    """Were silently carried on: another objective from the resumed step on, and a --learning_rate that the
    checkpoint's optimizer state overrules (it keeps its own). Another --model_name_or_path was a traceback."""
    out = tmp_path / "out"
    saved = json.loads((first_run(script, out) / "args.json").read_text())
    flag, value = CHANGED[script]
    for overrides, said in (
        ({flag: value}, f"--{flag} {value} (the checkpoint's: {saved[flag]})"),
        ({"learning_rate": 0.5}, f"--learning_rate 0.5 (the checkpoint's: {saved['learning_rate']})"),
        (
            {"model_name_or_path": hub_model},
            f"--model_name_or_path {hub_model} (the checkpoint's: {saved['model_name_or_path']})",
        ),
    ):
        with pytest.raises(ConfigError, match="which a resumed run cannot change: " + re.escape(said)):
            run_tiny(script, out, resume_from_checkpoint="latest", max_steps=2, **overrides)


@pytest.mark.parametrize("script", every(SCRIPTS))
def test_a_resume_that_runs_longer_and_logs_otherwise_carries_on_and_says_so(tmp_path, monkeypatch, capsys, script):
    """And says nothing of a flag that did not change: the same model by a relative path."""
    out = tmp_path / "out"
    first_run(script, out)
    capsys.readouterr()
    monkeypatch.chdir(common.ROOT)
    overrides = dict(model_name_or_path="models/tiny-arith", max_steps=3, logging_steps=2, save_steps=3)
    run_tiny(script, out, resume_from_checkpoint="latest", **overrides)
    assert (
        "--resume_from_checkpoint: carrying on from checkpoint-1 with --max_steps 3 (the checkpoint's: 1); "
        "--logging_steps 2 (the checkpoint's: 1); --save_steps 3 (the checkpoint's: 1)\n"
    ) in capsys.readouterr().out
    assert [r["step"] for r in common.read_metrics(out) if "step_time" in r] == [1, 2, 3]
    assert (out / "checkpoint-3").is_dir()


@pytest.mark.parametrize("script", every(SCRIPTS))
def test_a_checkpoint_without_a_record_that_does_not_fit_is_one_line(tmp_path, script):
    """A checkpoint saved before args.json resumes unchecked, as before; one whose model no longer fits (here: resumed
    with --use_peft added, and the checkpoint holds a full model, no adapter) is one line instead of a load_state_dict
    traceback."""
    out = tmp_path / "out"
    checkpoint = first_run(script, out)
    (checkpoint / "args.json").unlink(missing_ok=True)
    state = torch.load(checkpoint / "training_state.pt", weights_only=False)
    state["files"].pop("args.json", None)
    torch.save(state, checkpoint / "training_state.pt")
    with pytest.raises(ConfigError) as error:
        run_tiny(script, out, resume_from_checkpoint="latest", max_steps=2, use_peft=True)
    assert str(error.value).startswith(
        f"--resume_from_checkpoint: {checkpoint} does not fit this run's model and optimizer (was it saved with "
        f"another --model_name_or_path, --use_peft or --lora_* flags?): {checkpoint} holds no LoRA adapter"
    )
