"""Exactly on-policy on a checkpoint that looks like a hub model (tests/hub_like.py): the sampler draws from the
softmax(logits / temperature) that the log-probs describe, whatever generation_config.json ships; no dropout between
passes that must agree; "not applicable" rewards as in TRL; a run that cannot learn says so."""

import copy
import dataclasses
import json
import math

import pytest
import torch

import common
import grpo
import ppo
import reinforce
import reward_model
import rloo
import sft
from grpo import group_relative_advantages
from reinforce import reinforce_advantages
from rewards import compute_rewards
from rloo import leave_one_out_advantages

TWO_STEPS = dict(
    max_steps=2, eval_steps=0, logging_steps=1, save_steps=0, num_generations_eval=1, max_completion_length=8
)
ALL_SCRIPTS = [rloo, grpo, reinforce, ppo, sft, reward_model]
# sft.py and reward_model.py tokenize their whole built-in data set before the first step (sft's default, 78k
# demonstrations, takes ~25 s): two per problem, one pair per problem, is enough for two steps
SMALL_DATA = dict(samples_per_problem=2, pairs_per_problem=1)
RL_SCRIPTS = {
    rloo: dict(prompts_per_step=2, num_generations=2),
    grpo: dict(prompts_per_step=2, num_generations=2),
    reinforce: dict(prompts_per_step=4),
    ppo: dict(prompts_per_step=4, num_ppo_epochs=1),
}


# ---- 1. the sampled distribution is the one the log-probs assume
# ------------------------------------------------------
def sampled_and_computed_logprobs(model, tokenizer, monkeypatch, **sampling):
    """Sample through common.generate while recording the scores generate sampled from; return the sampler's
    log-probs of the sampled tokens and completion_logprobs of the same tokens, both (B, T), and the mask."""
    recorded = []
    generate = model.generate

    def generate_recording_scores(**kwargs):
        config = copy.deepcopy(kwargs.pop("generation_config"))
        config.output_scores, config.return_dict_in_generate = True, True
        out = generate(generation_config=config, **kwargs)
        recorded.append(torch.stack(out.scores, 1))  # (B, T, V): the processed logits each token was drawn from
        return out.sequences

    monkeypatch.setattr(model, "generate", generate_recording_scores)
    args = type("Args", (), {"temperature": 0.9, "top_p": 1.0, "top_k": 0, "max_completion_length": 12, **sampling})
    prompts = [
        [{"role": "user", "content": common.arithmetic_question(a, op, b)}]
        for a, op, b, _ in common.arithmetic_split("train")[:8]
    ]
    config = common.sampling_config(model, tokenizer, args)
    out = common.generate(model, tokenizer, [common.prompt_text(tokenizer, p) for p in prompts], config)
    T = out["completion_ids"].shape[1]
    completion_mask, _ = rloo.end_of_completion(out["completion_ids"], config.eos_token_id)
    sampler = torch.log_softmax(recorded[0].float(), -1).gather(-1, out["completion_ids"][..., None]).squeeze(-1)
    input_ids = torch.cat([out["prompt_ids"], out["completion_ids"]], 1)
    attention_mask = torch.cat([out["prompt_mask"], completion_mask], 1)
    computed = rloo.completion_logprobs(model, input_ids, attention_mask, T, args.temperature)[0]
    return sampler, computed, completion_mask.bool()


def test_a_hub_generation_config_cannot_change_what_is_sampled(hub_model, monkeypatch):
    """The checkpoint ships temperature 0.7, top-k 20, top-p 0.8, repetition penalty 1.3, no-repeat n-grams,
    min_new_tokens, min_p, typical_p, a banned and a suppressed token: none of it may reach the sampler."""
    tokenizer = common.load_tokenizer(hub_model)
    model = common.disable_dropout(common.load_causal_lm(hub_model)).eval()
    sampler, computed, mask = sampled_and_computed_logprobs(model, tokenizer, monkeypatch)
    assert mask.sum() > 20
    torch.testing.assert_close(sampler[mask], computed[mask], atol=1e-4, rtol=0)
    assert (
        model.generation_config.repetition_penalty == 1.3
    )  # the checkpoint's own config is left as it was (saved as is)


def test_top_k_makes_sampling_off_policy_as_documented(hub_model, monkeypatch):
    """With --top_k the sampler draws from a truncated distribution; the log-probs stay those of the full softmax."""
    tokenizer = common.load_tokenizer(hub_model)
    model = common.disable_dropout(common.load_causal_lm(hub_model)).eval()
    sampler, computed, mask = sampled_and_computed_logprobs(model, tokenizer, monkeypatch, top_k=3)
    assert (sampler[mask] > computed[mask] + 1e-3).all()  # renormalized over 3 tokens: every sampled token gains


# ---- 2. no dropout in passes that must agree
# --------------------------------------------------------------------------
def test_disable_dropout_covers_attention_and_lora_dropout(hub_model):
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(
        common.load_causal_lm(hub_model), LoraConfig(r=4, lora_dropout=0.5, target_modules="all-linear")
    )
    model.train()
    ids = torch.randint(5, 300, (2, 16))
    torch.manual_seed(0)
    assert not torch.equal(model(ids).logits, model(ids).logits)  # the fixture has dropout to turn off
    common.disable_dropout(model)
    torch.testing.assert_close(model(ids).logits, model(ids).logits, atol=0, rtol=0)


@pytest.mark.parametrize(
    "config",
    [
        # attention dropout as a float attribute of the attention layer: Llama's `attention_dropout`, OPT's `dropout`
        dict(model_type="llama", attention_dropout=0.5, num_key_value_heads=2),
        dict(model_type="opt", dropout=0.5, attention_dropout=0.5, ffn_dim=64, word_embed_proj_dim=32),
        dict(model_type="gpt2", attn_pdrop=0.5, resid_pdrop=0.5, embd_pdrop=0.5, n_embd=32, n_layer=2, n_head=4),
    ],
    ids=lambda config: config["model_type"],
)
def test_disable_dropout_covers_the_dropout_rates_layers_keep_as_floats(config):
    """Not every architecture holds its dropout in nn.Dropout modules: the attention layers of Llama, Qwen2 and OPT
    pass a float attribute to F.dropout themselves. Each of these tiny models gives bit-equal outputs twice in train
    mode once disable_dropout has run."""
    from transformers import AutoConfig, AutoModelForCausalLM

    sizes = dict(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=32,
    )
    config = dict(config)
    model_type = config.pop("model_type")
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **sizes, **config))
    model.train()
    ids = torch.randint(0, 64, (2, 16))
    torch.manual_seed(0)
    assert not torch.equal(model(ids).logits, model(ids).logits)
    common.disable_dropout(model)
    torch.testing.assert_close(model(ids).logits, model(ids).logits, atol=0, rtol=0)


def test_ppo_with_lora_starts_every_update_at_ratio_one(tmp_path, hub_model):
    """One PPO epoch over one mini-batch: the update pass sees the rollout pass's function, so ρ ≡ 1 and nothing is
    clipped. With LoRA's dropout on (the old behaviour) tokens left the clip range before any update."""
    ppo.main(
        ppo.Args(
            output_dir=str(tmp_path),
            model_name_or_path=hub_model,
            use_peft=True,
            lora_dropout=0.3,
            **{**TWO_STEPS, **RL_SCRIPTS[ppo]},
            num_mini_batches=1,
            cliprange=0.01,
        )
    )
    for record in [r for r in common.read_metrics(tmp_path) if "policy/approxkl_avg" in r]:
        assert record["policy/approxkl_avg"] == 0 and record["policy/clipfrac_avg"] == 0


@pytest.mark.parametrize("disable_dropout", [True, False])
@pytest.mark.parametrize("script", [rloo, grpo, reinforce, ppo, reward_model], ids=lambda m: m.__name__)
def test_what_a_script_trains_has_no_dropout_unless_asked(tmp_path, hub_model, monkeypatch, script, disable_dropout):
    """Every model the script hands to accelerator.prepare (the ones it trains: PPO's value model too) gives the same
    output twice in train mode; with --disable_dropout False the fixture's attention and LoRA dropout stay on."""
    from accelerate import Accelerator

    trained = []
    prepare = Accelerator.prepare
    monkeypatch.setattr(
        Accelerator,
        "prepare",
        lambda self, *objects: (
            trained.extend(o for o in objects if isinstance(o, torch.nn.Module)) or prepare(self, *objects)
        ),
    )
    fields = {f.name for f in dataclasses.fields(script.Args)}
    small = {**TWO_STEPS, **RL_SCRIPTS.get(script, {}), **SMALL_DATA, "max_steps": 1, "train_batch_size": 8}
    script.main(
        script.Args(
            model_name_or_path=hub_model,
            output_dir=str(tmp_path),
            use_peft=True,
            lora_dropout=0.5,
            disable_dropout=disable_dropout,
            eval_strategy="no",
            **{k: v for k, v in small.items() if k in fields},
        )
    )
    assert len(trained) == (2 if script is ppo else 1)
    ids = torch.randint(5, 300, (1, 16))
    for model in trained:
        # LoRA's B and PPO's value head start at zero and one step on a random model (no reward signal) leaves them
        # there, which would hide the dropout before them: give them weights
        with torch.no_grad():
            for parameter in model.parameters():
                if not parameter.any():
                    parameter.normal_()
        model.train()
        assert torch.equal(model(input_ids=ids).logits, model(input_ids=ids).logits) == disable_dropout


# ---- 3. "not applicable" rewards, as TRL
# ------------------------------------------------------------------------------
def none_rewards():
    """Two reward functions returning [1, None, 0, 3] and [None, None, 1, None]: completion 1 is unscorable."""
    first = lambda completions, **kwargs: [1.0, None, 0.0, 3.0]
    second = lambda completions, **kwargs: [None, None, 1.0, None]
    rewards, per_func = compute_rewards(
        {"first": first, "second": second}, torch.ones(2), ["p"] * 4, ["c"] * 4, [[1]] * 4, {}
    )
    return rewards, per_func


def test_an_unscorable_completion_has_reward_nan_not_zero():
    rewards, per_func = none_rewards()
    assert rewards[[0, 2, 3]].tolist() == [1.0, 1.0, 3.0] and math.isnan(rewards[1])
    assert per_func[:, 0].isnan().tolist() == [False, True, False, False]


def test_unscorable_completions_stay_out_of_baselines_and_get_advantage_zero():
    rewards, _ = none_rewards()  # [1, NaN, 1, 3]
    # RLOO: the baselines average the other scorable completions: b = (1+3)/2, ·, (1+3)/2, (1+1)/2
    loo = leave_one_out_advantages(rewards, 4)
    assert math.isnan(loo[1]) and loo[[0, 2, 3]].tolist() == [-1.0, -1.0, 2.0]
    # GRPO: mean and std of the scorable three; advantage 0 for the unscorable one
    std = torch.tensor([1.0, 1.0, 3.0]).std()
    expected = torch.tensor([1 - 5 / 3, 0.0, 1 - 5 / 3, 3 - 5 / 3]) / (std + 1e-4)
    torch.testing.assert_close(group_relative_advantages(rewards, 4, "group"), expected)
    torch.testing.assert_close(group_relative_advantages(rewards, 4, "batch"), expected)
    # REINFORCE: moving average and REINFORCE++ skip it, and it gets A = 0
    assert reinforce_advantages(
        rewards, baseline="moving_average", reward_sum=2.0, reward_count=4, batch_rewards=None
    ).tolist() == [0.5, 0.0, 0.5, 2.5]
    torch.testing.assert_close(
        reinforce_advantages(rewards, baseline="reinforce_pp", reward_sum=0.0, reward_count=0, batch_rewards=None),
        expected,
    )


@pytest.mark.parametrize("script", list(RL_SCRIPTS), ids=lambda m: m.__name__)
def test_a_batch_no_reward_applies_to_teaches_nothing(tmp_path, script):
    """Every completion unscorable: the logged reward is NaN (null), not 0, and the policy gets no gradient."""
    module = tmp_path / "never.py"
    module.write_text("def never(completions, **kwargs):\n    return [None] * len(completions)\n")
    script.main(
        script.Args(
            output_dir=str(tmp_path / "out"),
            reward_funcs=f"{module}:never",
            beta=0.0,
            **TWO_STEPS,
            **RL_SCRIPTS[script],
        )
        if script is not ppo
        else ppo.Args(
            output_dir=str(tmp_path / "out"),
            reward_funcs=f"{module}:never",
            kl_coef=0.0,
            **TWO_STEPS,
            **RL_SCRIPTS[ppo],
        )
    )
    records = [r for r in common.read_metrics(tmp_path / "out") if "grad_norm" in r]
    assert len(records) == 2
    for record in records:
        assert record["grad_norm"] == 0.0
        assert record.get("reward", record.get("objective/scores")) is None


def test_ppo_unscorable_rows_change_nothing_the_scorable_rows_learn(tmp_path, monkeypatch, recorded_gradients):
    """Six prompts, the reward function returns None for two: the first update (policy and value gradient, with both
    whitenings on) and the logged score are those of a run on the four scorable prompts alone. The completions are
    fixed texts per prompt (tests/fixed_rollouts.py), so both runs train on the same scorable rows."""
    from fixed_rollouts import fixed_generate

    monkeypatch.setattr(common, "generate", fixed_generate)
    module = tmp_path / "some.py"
    module.write_text(
        "def some(completions, scorable, **kwargs):\n"
        "    return [len(c[-1]['content']) % 7 if s else None for c, s in zip(completions, scorable)]\n"
    )
    problems = common.arithmetic_split("train")[:6]
    scorable = [True, False, True, True, False, True]
    runs = {}
    for name, keep in (("mixed", [True] * 6), ("scorable", scorable)):
        rows = [
            {"prompt": [{"role": "user", "content": common.arithmetic_question(a, op, b)}], "scorable": s}
            for (a, op, b, _), s, k in zip(problems, scorable, keep)
            if k
        ]
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
        start = len(recorded_gradients)
        ppo.main(
            ppo.Args(
                output_dir=str(tmp_path / name),
                dataset_name=str(tmp_path / f"{name}.jsonl"),
                reward_funcs=f"{module}:some",
                whiten_rewards=True,
                **{**TWO_STEPS, "max_steps": 1},
                prompts_per_step=len(rows),
                num_ppo_epochs=1,
            )
        )
        (record,) = [r for r in common.read_metrics(tmp_path / name) if "objective/scores" in r]
        runs[name] = recorded_gradients[start : start + 2], record  # the policy's gradient, then the value model's
    (mixed_policy, mixed_value), mixed = runs["mixed"]
    (policy, value), alone = runs["scorable"]
    assert mixed["objective/scores"] == pytest.approx(alone["objective/scores"])
    torch.testing.assert_close(mixed_policy, policy)
    torch.testing.assert_close(mixed_value, value)
    assert policy.abs().max() > 0 and value.abs().max() > 0


# ---- 4. PPO evaluates with its training end tokens
# --------------------------------------------------------------------
def test_ppo_evaluation_ends_completions_where_training_does(tmp_path, monkeypatch):
    ends = []
    generate = common.generate
    monkeypatch.setattr(
        common,
        "generate",
        lambda model, tokenizer, texts, config, **kwargs: (
            ends.append(config.eos_token_id) or generate(model, tokenizer, texts, config, **kwargs)
        ),
    )
    tokenizer = common.load_tokenizer(common.EMBEDDED_MODEL)
    stop_id = tokenizer.encode("<", add_special_tokens=False)[0]
    ppo.main(ppo.Args(output_dir=str(tmp_path), stop_token="<", **{**TWO_STEPS, "max_steps": 1}, **RL_SCRIPTS[ppo]))
    assert len(ends) >= 2 and all(stop_id in e and tokenizer.eos_token_id in e for e in ends)


# ---- 5. a run that cannot learn says so; evaluation can be switched off
# -----------------------------------------------
@pytest.mark.parametrize("script", list(RL_SCRIPTS), ids=lambda m: m.__name__)
def test_a_run_without_reward_signal_says_so_once(tmp_path, capsys, script):
    """Every completion scores 0: after NO_SIGNAL_STEPS training steps in a row (logged or not: this run logs every
    5th step), one warning naming the functions."""
    module = tmp_path / "zero.py"
    module.write_text("def zero(completions, **kwargs):\n    return [0.0] * len(completions)\n")
    script.main(
        script.Args(
            output_dir=str(tmp_path / "out"),
            reward_funcs=f"accuracy,{module}:zero",
            reward_weights="0,1",
            eval_strategy="no",
            **{**TWO_STEPS, "max_steps": common.NO_SIGNAL_STEPS + 2, "logging_steps": 5},
            **RL_SCRIPTS[script],
        )
    )
    err = capsys.readouterr().err
    assert err.count("no reward signal") == 1 and "accuracy_reward, zero" in err
    assert not any(key.startswith("eval/") for r in common.read_metrics(tmp_path / "out") for key in r)


@pytest.mark.parametrize("script", ALL_SCRIPTS, ids=lambda m: getattr(m, "__name__", None))
def test_eval_strategy_no_never_evaluates(tmp_path, script, monkeypatch):
    monkeypatch.setattr(common, "evaluate", lambda *a, **k: pytest.fail("evaluated"))
    fields = {f.name for f in dataclasses.fields(script.Args)}
    small = {**TWO_STEPS, **RL_SCRIPTS.get(script, {}), **SMALL_DATA, "max_steps": 1, "train_batch_size": 8}
    overrides = {k: v for k, v in small.items() if k in fields}
    script.main(script.Args(output_dir=str(tmp_path), eval_strategy="no", **overrides))
    assert not any(key.startswith("eval/") for r in common.read_metrics(tmp_path) for key in r)


# ---- 6. every script runs on the hub-like checkpoint
# ------------------------------------------------------------------
@pytest.mark.parametrize("script", ALL_SCRIPTS, ids=lambda m: getattr(m, "__name__", None))
def test_every_script_trains_two_steps_on_a_hub_like_checkpoint(tmp_path, hub_model, script):
    fields = {f.name for f in dataclasses.fields(script.Args)}
    overrides = {
        k: v
        for k, v in {**TWO_STEPS, **RL_SCRIPTS.get(script, {}), **SMALL_DATA, "train_batch_size": 8}.items()
        if k in fields
    }
    script.main(script.Args(model_name_or_path=hub_model, output_dir=str(tmp_path), **overrides))
    assert [r["step"] for r in common.read_metrics(tmp_path) if "learning_rate" in r] == [1, 2]
    assert (tmp_path / "config.json").is_file()
