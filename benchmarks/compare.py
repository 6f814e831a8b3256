"""Compare the algorithms of this repository at an equal sample budget: "Back to Basics" Table 1 in miniature.

What is compared. Six estimators on the same task, the same reward, the same seeds and the same budget, each run by
its own script as a subprocess, with that script's own defaults for everything but the budget:

    RLOO k=4            rloo.py --num_generations 4               leave-one-out baseline over 4 samples per prompt
    RLOO k=2            rloo.py --num_generations 2               ... over 2 samples per prompt
    REINFORCE w/ b_MA   reinforce.py --baseline moving_average    1 sample per prompt, the running mean of past rewards
    Vanilla PG          ppo.py --lam 1.0 --num_ppo_epochs 1 --num_mini_batches 1 --whiten_advantages False
                                                                  token-level return-to-go minus a learned value
    PPO                 ppo.py                                    GAE (λ = 0.95), 4 clipped epochs per batch
    GRPO                grpo.py --num_generations 8               group-normalized advantage, no KL term (β = 0)

The budget is counted in sampled completions, the expensive part of online RL: every algorithm samples the same
C = completions_per_step completions per step (C / G prompts × G completions each) for the same max_steps steps, so
every run has sampled C · max_steps completions when it ends. Algorithms that reuse a batch (PPO: 4 epochs) take more
optimizer steps on the same samples; that is part of what is compared. Every run evaluates on the same held-out
prompts at the same steps (every eval_steps, and at 0 and the end), so the curves share their x points.

What Back to Basics found (Ahmadian et al. 2024, Table 1: win rate against the reference completions, TL;DR with
Pythia-6.9B, HH with Pythia-6.9B and Llama-7B): RLOO k=4 ≥ RLOO k=2 ≥ REINFORCE w/ b_MA ≥ Vanilla PG ≥ PPO, e.g.
77.9 / 74.2 / 70.7 / 70.4 / 67.6 on TL;DR, with one exception (HH Pythia: k=2 47.6 beat k=4 43.7). GRPO is not in
the paper; it is here because it is the other group baseline people use.

Measured for each (algorithm, seed) run:
    eval/accuracy        held-out accuracy, sampled at the training temperature (the script's own evaluation)
    KL                   KL to the reference per completion, Σ_t kl_t averaged over the batch (k1 by default). From the
                         training log: ppo.py's `objective/kl` as it is, the others' token-mean `kl` times
                         `completions/mean_length`. GRPO with β = 0 has no reference model and logs none, so the table
                         also has one uniform measurement, taken here after each run: Σ_t log π_final − log π_ref on
                         num_generations_eval samples of the final policy per held-out prompt
    reward variance      the batch variance of the reward (`reward_std` squared, unbiased), averaged over the run's
                         logged steps; "—" for a script that logs no reward_std (ppo.py)
    all-equal groups     `frac_reward_zero_std` (G ≥ 2 only): the share of prompts whose G rewards are all equal, whose
                         group baseline therefore leaves no reward signal
    wall time, memory    of the child process: wall clock from start to exit, and its peak resident set size
                         (os.wait4's ru_maxrss; CPU memory, not GPU memory; on Linux at least compare.py's own resident
                         size at the fork, which the child's exceeds in practice: compare.py trains nothing)

A second comparison, --experiment reward_model, puts the algorithms under Back to Basics' own condition: a learned
reward and a separate judge. compare.py first trains a reward model with reward_model.py on pairs that differ only in
the number (data/arithmetic_preferences_number; --reward_model_args), then every algorithm optimizes that proxy alone
(--reward_funcs none --reward_model_path DIR) with the same KL coefficient β = 0.05 (GRPO's own default is 0; it gets
0.05 as a k3 term in its loss). The gold metric is the exact-match accuracy on held-out problems, which no algorithm
sees. Every run saves a checkpoint at each evaluation; on each, and on the reference for step 0, compare.py samples
held-out prompts and measures the KL to the reference per completion, the proxy reward and the gold accuracy of the
same samples, then deletes the checkpoints. Gold and proxy are plotted against that KL (the frontier) and read off each
run's curve at the --frontier_kls (linear between evaluations; a run that never reaches a KL is counted out).

Runs go one at a time, so that their wall times and memory are comparable. --model_name_or_path, --dataset_name,
--reward_funcs and the other passed-through flags of Args reach every script; --script_args passes any other flag of
the scripts (but not the budget, which is compare.py's to set). Run it from the repository root:

    python benchmarks/compare.py                            # 6 algorithms × 3 seeds on the embedded model: 29 min on a
                                                            # 2-core CPU shared with other jobs (results/compare.md)
    python benchmarks/compare.py --quick --output_dir /tmp/compare     # a smoke test: 6 runs of 2 steps, 1.5–2 min
    python benchmarks/compare.py --algorithms rloo_k2,ppo --seeds 0,1,2,3,4 --max_steps 100
    python benchmarks/compare.py --experiment reward_model --max_steps 80   # the proxy and 18 runs: compare_rm.md
"""

import dataclasses
import importlib
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, HfArgumentParser

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the scripts, common.py and rewards.py

import common  # noqa: E402
from bench import BadInput, arg, fail, flag_message, parse_args, read_metrics, require, split_list  # noqa: E402
from rewards import (  # noqa: E402
    RewardError,
    accuracy_reward,
    as_completion,
    extract_answer,
    reward_model_function,
)
from rloo import completion_logprobs, load_split  # noqa: E402

ALGORITHMS = {
    # name: (label, script, completions per prompt G, the flags that make it this algorithm)
    "rloo_k4": ("RLOO k=4", "rloo.py", 4, ["--num_generations", "4"]),
    "rloo_k2": ("RLOO k=2", "rloo.py", 2, ["--num_generations", "2"]),
    "reinforce_ma": ("REINFORCE w/ b_MA", "reinforce.py", 1, ["--baseline", "moving_average"]),
    "vanilla_pg": (
        "Vanilla PG",
        "ppo.py",
        1,
        [
            "--lam",
            "1.0",
            "--num_ppo_epochs",
            "1",
            "--num_mini_batches",
            "1",
            "--whiten_advantages",
            "False",
        ],
    ),
    "ppo": ("PPO", "ppo.py", 1, []),
    "grpo": ("GRPO", "grpo.py", 8, ["--num_generations", "8"]),
}
PASSED_THROUGH = (
    "model_name_or_path",
    "dataset_name",
    "dataset_config",
    "dataset_train_split",
    "dataset_test_split",
    "reward_funcs",
    "reward_weights",
    "reward_model_path",
    "max_completion_length",
)
QUICK = dict(seeds="0", completions_per_step=8, max_steps=2, eval_steps=2, num_generations_eval=1)
NUMBER_PAIRS = "data/arithmetic_preferences_number"  # pairs that only arithmetic separates (tools/make_data.py)
QUICK_REWARD_MODEL = (
    f"--dataset_name {NUMBER_PAIRS} --max_steps 2 --train_batch_size 8 --eval_strategy no"
)
EXPERIMENTS = {
    # name: (report file stem, run folders under output_dir)
    "accuracy": ("compare", "runs"),
    "reward_model": ("compare_rm", "runs/rm"),
}


@dataclass
class Args:
    # what is compared
    algorithms: str = arg(
        ",".join(ALGORITHMS),
        f"comma-separated algorithms, in the order of the report ({', '.join(ALGORITHMS)})",
    )
    seeds: str = arg("0,1,2", "comma-separated seeds; every algorithm runs once with each")
    # the budget, the same for every algorithm
    completions_per_step: int = arg(
        32, "completions sampled per step by every algorithm (C / G prompts × G completions)"
    )
    max_steps: int = arg(
        50, "steps per run: every run samples completions_per_step × max_steps completions"
    )
    eval_steps: int = arg(
        10,
        "held-out evaluation every this many steps for every algorithm (also at step 0 and the end)",
    )
    num_generations_eval: int = arg(
        4, "completions sampled per held-out prompt for eval/accuracy and the final KL"
    )
    # the reward every algorithm optimizes
    experiment: str = arg(
        "accuracy",
        "'accuracy': the exact-match reward; 'reward_model': a learned reward model only (the proxy), "
        "exact-match held-out accuracy as the gold metric, both read against the KL to the reference",
    )
    beta: float | None = arg(
        None,
        "KL coefficient of every script (ppo.py: --kl_coef); default: each script's own (GRPO's is 0), "
        "but 0.05 for all under --experiment reward_model, GRPO included, so that every run has a KL to trade",
    )
    reward_model_args: str = arg(
        f"--dataset_name {NUMBER_PAIRS} --max_steps 400",
        "--experiment reward_model without --reward_model_path: "
        "the flags of the reward_model.py run that trains the proxy (into {output_dir}/runs/rm/reward_model)",
    )
    frontier_kls: str = arg(
        "0.5,1.5",
        "--experiment reward_model: the KLs to the reference (nats per completion) at which gold accuracy "
        "and proxy reward are read off each run's curve",
    )
    # passed to every script when given (None: each script's own default)
    model_name_or_path: str | None = arg(
        None, "policy to train (default: the scripts' default, the embedded model)"
    )
    dataset_name: str | None = arg(
        None, "dataset (default: the scripts' default, data/arithmetic)"
    )
    dataset_config: str | None = arg(None, "the configuration of a dataset that has several")
    dataset_train_split: str | None = arg(None, "split to train on")
    dataset_test_split: str | None = arg(None, "held-out split with a ground_truth column")
    reward_funcs: str | None = arg(
        None, "comma-separated reward functions (default: the scripts' default, accuracy)"
    )
    reward_weights: str | None = arg(None, "comma-separated weights, one per reward")
    reward_model_path: str | None = arg(
        None, "a sequence-classification reward model added to the rewards"
    )
    max_completion_length: int | None = arg(None, "max generated tokens per completion")
    script_args: str = arg(
        "", "more flags for every script, e.g. --script_args='--bf16 --micro_batch_size 16'"
    )
    # running and reporting
    quick: bool = arg(
        False,
        "a smoke test (1.5–2 min on a CPU): seed 0, 2 steps of 8 completions, 1 eval sample per prompt (overrides "
        "those flags); under --experiment reward_model also a 2-step reward model",
    )
    output_dir: str = arg(
        "results",
        "compare.{md,png,json} (compare_rm.* under --experiment reward_model) go here; each run in "
        "{output_dir}/runs/<algorithm>/seed<k> (runs/rm/... under --experiment reward_model)",
    )
    report_only: bool = arg(
        False,
        "rebuild the report from the run folders of an earlier comparison with the same flags, training nothing",
    )


# ----------------------------------------------------------------------------------------------------------------------
# The command line: compare.py's flags, and each script's flags parsed and checked by that script's own rules
# ----------------------------------------------------------------------------------------------------------------------
def check_args(args: Args):
    names = split_list(args.algorithms)
    require(bool(names), "--algorithms: none selected")
    for name in names:
        require(
            name in ALGORITHMS,
            f"--algorithms: unknown algorithm {name!r} (choose from {', '.join(ALGORITHMS)})",
        )
    require(
        len(set(names)) == len(names),
        f"--algorithms: an algorithm is listed twice in {args.algorithms!r}",
    )
    try:
        seeds = split_list(args.seeds, int)
    except ValueError:
        raise BadInput(f"--seeds: expected comma-separated integers, got {args.seeds!r}") from None
    require(
        bool(seeds) and len(set(seeds)) == len(seeds),
        f"--seeds: expected distinct comma-separated integers, got {args.seeds!r}",
    )
    require(
        args.completions_per_step > 0,
        f"--completions_per_step: must be positive, got {args.completions_per_step}",
    )
    for name in names:
        G = ALGORITHMS[name][2]
        require(
            args.completions_per_step % G == 0,
            f"--completions_per_step: {args.completions_per_step} is not a multiple of {G}, the completions per "
            f"prompt of {name}",
        )
    require(args.max_steps > 0, f"--max_steps: must be positive, got {args.max_steps}")
    require(args.eval_steps > 0, f"--eval_steps: must be positive, got {args.eval_steps}")
    require(
        args.num_generations_eval > 0,
        f"--num_generations_eval: must be positive, got {args.num_generations_eval}",
    )
    require(
        args.experiment in EXPERIMENTS,
        f"--experiment: expected one of {', '.join(EXPERIMENTS)}, got {args.experiment!r}",
    )
    require(args.beta is None or args.beta >= 0, f"--beta: must be ≥ 0, got {args.beta}")
    try:
        kls = split_list(args.frontier_kls, float)
    except ValueError:
        raise BadInput(
            f"--frontier_kls: expected comma-separated numbers, got {args.frontier_kls!r}"
        ) from None
    require(
        bool(kls) and all(k > 0 for k in kls),
        f"--frontier_kls: expected positive comma-separated numbers, got {args.frontier_kls!r}",
    )
    if args.experiment == "reward_model":
        require(
            args.beta is None or args.beta > 0,
            "--beta: must be > 0 under --experiment reward_model (the frontier needs a reference model)",
        )
        if args.reward_model_path is None:
            require(
                "--output_dir" not in args.reward_model_args,
                "--reward_model_args: the output folder is ours to set",
            )
            script_config(
                "reward_model.py", shlex.split(args.reward_model_args), flag="--reward_model_args"
            )


def resolve_experiment(args: Args) -> Args:
    """Under --experiment reward_model: the reward is the reward model alone (--reward_funcs none unless given), the one
    trained into {output_dir}/runs/rm/reward_model unless --reward_model_path is given, and β = 0.05 for every
    script."""
    if args.experiment != "reward_model":
        return args
    return dataclasses.replace(
        args,
        reward_funcs=args.reward_funcs or "none",
        reward_model_path=args.reward_model_path
        or str(Path(args.output_dir) / EXPERIMENTS["reward_model"][1] / "reward_model"),
        beta=0.05 if args.beta is None else args.beta,
    )


def run_flags(args: Args, name: str, seed: int) -> list[str]:
    """The script's flags for one run: the algorithm's own, the budget, the evaluation schedule, the passed-through
    ones."""
    G = ALGORITHMS[name][2]
    flags = [
        *ALGORITHMS[name][3],
        "--prompts_per_step",
        str(args.completions_per_step // G),
        "--max_steps",
        str(args.max_steps),
        "--eval_steps",
        str(args.eval_steps),
        "--num_generations_eval",
        str(args.num_generations_eval),
    ]
    for passed in PASSED_THROUGH:
        if getattr(args, passed) is not None:
            flags += [f"--{passed}", str(getattr(args, passed))]
    if args.beta is not None:
        flags += ["--kl_coef" if ALGORITHMS[name][1] == "ppo.py" else "--beta", str(args.beta)]
    flags += shlex.split(args.script_args)
    # under --experiment reward_model, a checkpoint at every evaluation, for compare.py to measure KL and proxy
    # reward on
    save_steps = args.eval_steps if args.experiment == "reward_model" else 0
    run_dir = Path(args.output_dir) / EXPERIMENTS[args.experiment][1] / name / f"seed{seed}"
    return flags + [
        "--save_steps",
        str(save_steps),
        "--seed",
        str(seed),
        "--output_dir",
        str(run_dir),
        "--overwrite_output_dir",
    ]


def script_config(script: str, flags: list[str], flag: str = "--script_args"):
    """The script's Args after its flags, as its own command line parses them, checked by its own check_args: a bad
    flag stops here, before any run."""
    module = importlib.import_module(script.removesuffix(".py"))
    parser = HfArgumentParser(module.Args, allow_abbrev=False)

    def error(message: str):
        raise BadInput(f"{flag}: {script}: {flag_message(message)}")

    parser.error = error
    for action in parser._actions:  # --chat_template_kwargs '{"enable_thinking": false}'
        action.type = json.loads if action.type is dict else action.type
    config = module.Args(**vars(parser.parse_args(flags)))
    try:
        module.check_args(config)
    except module.BadInput as error:
        raise BadInput(f"{script}: {error}") from None
    return config


def kl_coefficient(config) -> float:
    return config.beta if hasattr(config, "beta") else config.kl_coef


def updates_per_batch(config) -> int:
    """Optimizer steps taken on each batch of completions."""
    if hasattr(config, "num_ppo_epochs"):
        return config.num_ppo_epochs * config.num_mini_batches
    return getattr(config, "num_iterations", 1)


# ----------------------------------------------------------------------------------------------------------------------
# One run: a subprocess, its wall time and peak memory, then its metrics.jsonl
# ----------------------------------------------------------------------------------------------------------------------
def run_script(script: str, flags: list[str]) -> dict:
    """Run `python script flags`, its output passing through. Returns its exit status, wall time and peak RSS."""
    start = time.perf_counter()
    process = subprocess.Popen([sys.executable, str(ROOT / script), *flags])
    _, status, rusage = os.wait4(
        process.pid, 0
    )  # the child's own rusage, not the sum over every child so far
    process.returncode = os.waitstatus_to_exitcode(status)
    peak_kib = rusage.ru_maxrss / (
        1024 if sys.platform == "darwin" else 1
    )  # bytes on macOS, KiB on Linux
    return {
        "returncode": process.returncode,
        "wall_s": time.perf_counter() - start,
        "peak_mib": peak_kib / 1024,
    }


def sequence_kl(record: dict) -> float:
    """KL to the reference per completion (Σ_t kl_t, mean over the batch) from a training record of any script."""
    if "objective/kl" in record:  # ppo.py logs it per completion already
        return record["objective/kl"]
    return (
        record["kl"] * record["completions/mean_length"]
    )  # token mean × tokens per completion = Σ_t kl_t / B


def read_run(run_dir: str, config, frontier: dict | None = None) -> dict:
    """The curves and end points of one run from its metrics.jsonl; under --experiment reward_model, whose runs
    optimize the proxy alone and so log no accuracy, the gold accuracy from compare.py's measurement (`frontier`)."""
    records = read_metrics(run_dir)
    evals = [r for r in records if "eval/accuracy" in r]
    if frontier is not None:
        evals = [
            {"step": s, "eval/accuracy": gold}
            for s, gold in zip(frontier["steps"], frontier["gold"])
        ]
    train = [r for r in records if "step_time" in r]
    has_kl = kl_coefficient(config) > 0 and any(
        "kl" in r or "objective/kl" in r for r in train
    )  # GRPO at β = 0: none
    kl = [sequence_kl(r) for r in train] if has_kl else []
    zero_std = [
        r["frac_reward_zero_std"] for r in train if r.get("frac_reward_zero_std") is not None
    ]  # G ≥ 2 only
    variances = [r["reward_std"] ** 2 for r in train if r.get("reward_std") is not None]
    return {
        "eval_steps": [r["step"] for r in evals],
        "accuracy": [r["eval/accuracy"] for r in evals],
        "accuracy_greedy": [r.get("eval/accuracy_greedy") for r in evals],
        "kl_steps": [r["step"] for r in train] if has_kl else [],
        "kl": kl,
        "final_accuracy": evals[-1]["eval/accuracy"] if evals else None,
        "final_accuracy_greedy": evals[-1].get("eval/accuracy_greedy") if evals else None,
        "final_train_kl": kl[-1] if kl else None,
        "frac_reward_zero_std": sum(zero_std) / len(zero_std) if zero_std else None,
        "reward_variance": sum(variances) / len(variances) if variances else None,
    }


@torch.no_grad()
def heldout_kl(run_dir: str, config) -> float | None:
    """KL(π_final ‖ π_ref) per completion on held-out prompts: the mean over num_generations_eval samples y ~ π_final
    per prompt of Σ_t log π_final(y_t) − log π_ref(y_t) (k1). The same measurement for every algorithm."""
    measured = heldout_measurements([run_dir], config)
    return None if measured is None else measured[0]["kl"]


@torch.no_grad()
def heldout_measurements(
    policy_paths: list[str], config, reward_model_path: str | None = None
) -> list[dict] | None:
    """For each policy: num_generations_eval samples y ~ π per held-out prompt (seeded by config.seed), and over them
    the mean KL per completion Σ_t log π(y_t) − log π_ref(y_t) (k1), with a reward model the mean proxy reward
    r_φ(x, y), and the exact-match accuracy on these same samples. None when the dataset has no held-out split."""
    eval_dataset = load_split(config, config.dataset_test_split)  # as the scripts read it
    if eval_dataset is None:
        return None
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    tokenizer = common.load_tokenizer(config.model_name_or_path)
    reference = AutoModelForCausalLM.from_pretrained(config.model_name_or_path).to(device).eval()
    proxy = (
        reward_model_function(reward_model_path, device) if reward_model_path else None
    )  # the scripts' scorer
    prompts = [p for p in eval_dataset["prompt"] for _ in range(config.num_generations_eval)]
    truths = None
    if "ground_truth" in eval_dataset.column_names:
        truths = [
            t for t in eval_dataset["ground_truth"] for _ in range(config.num_generations_eval)
        ]
    texts = [common.prompt_text(tokenizer, p, config.chat_template_kwargs) for p in prompts]
    generation_config = common.sampling_config(reference, tokenizer, config)
    measured = []
    for path in policy_paths:
        policy = (
            AutoModelForCausalLM.from_pretrained(path).to(device).eval()
        )  # a LoRA run's adapter: on its base
        sums, completions = [], []
        with torch.random.fork_rng(
            devices=[torch.cuda.current_device()] if torch.cuda.is_available() else []
        ):
            torch.manual_seed(config.seed)
            for start in range(0, len(texts), config.per_device_eval_batch_size):
                batch = texts[start : start + config.per_device_eval_batch_size]
                out = common.generate(policy, tokenizer, batch, generation_config)
                completion_mask, _ = common.end_of_completion(
                    out["completion_ids"], generation_config.eos_token_id
                )
                completion_ids = out["completion_ids"].masked_fill(
                    completion_mask == 0, tokenizer.pad_token_id
                )
                input_ids = torch.cat([out["prompt_ids"], completion_ids], 1)
                attention_mask = torch.cat([out["prompt_mask"], completion_mask], 1)
                T = completion_ids.shape[1]
                logprobs = completion_logprobs(
                    policy, input_ids, attention_mask, T, config.temperature
                )[0]
                ref_logprobs = completion_logprobs(
                    reference, input_ids, attention_mask, T, config.temperature
                )[0]
                sums += ((logprobs - ref_logprobs) * completion_mask).sum(1).tolist()
                completions += common.decode(tokenizer, completion_ids, completion_mask)[0]
        shown, completions = map(
            list, zip(*(as_completion(p, c) for p, c in zip(prompts, completions)))
        )  # as TRL
        record = {"kl": sum(sums) / len(sums), "prompts": len(eval_dataset)}
        if proxy is not None:
            record["proxy"] = statistics.mean(proxy(prompts=shown, completions=completions))
        if truths is not None:
            record["gold"] = statistics.mean(accuracy_reward(completions, ground_truth=truths))
        measured.append(record)
    return measured


def frontier(run_dir: str, config, eval_steps: list[int]) -> dict:
    """KL, proxy reward and exact-match accuracy of the policy at every evaluation step, measured on held-out prompts:
    at step 0 the reference itself (KL 0), then the checkpoints the run saved at its evaluations (checkpoint-N), and
    its final model (output_dir). The checkpoints are deleted afterwards (the numbers are kept in compare_run.json)."""
    paths = [
        config.model_name_or_path
        if s == 0
        else run_dir
        if s == config.max_steps
        else str(Path(run_dir) / f"checkpoint-{s}")
        for s in eval_steps
    ]
    measured = heldout_measurements(paths, config, config.reward_model_path)
    for checkpoint in Path(run_dir).glob("checkpoint-*"):
        shutil.rmtree(checkpoint)
    keys = ("kl", "proxy", "gold")
    return {
        "steps": eval_steps,
        "prompts": measured[0]["prompts"],
        **{k: [m.get(k) for m in measured] for k in keys},
    }


def value_at_kl(kls: list[float], values: list[float], kl: float) -> float | None:
    """The value where a run's curve, followed in step order from KL 0, first reaches this KL, interpolated linearly
    between the two evaluations around it; None when the run never reaches it."""
    for k0, v0, k1, v1 in zip(kls, values, kls[1:], values[1:]):
        if min(k0, k1) <= kl <= max(k0, k1):
            return v0 if k1 == k0 else v0 + (v1 - v0) * (kl - k0) / (k1 - k0)
    return None


def reward_model_accuracy(path: str, pairs_per_problem: int = 8) -> dict:
    """The reward model's pair accuracy (r_c > r_r, ties one half), scored as the RL scripts score
    (rewards.reward_model_function), on the built-in pairs of held-out and of training problems, by kind: same-form
    pairs that differ only in the number (data/arithmetic_preferences_number: bare or worked, off by ±1/±2 or another
    number), and the demonstrator's pairs (data/arithmetic_preferences), which form alone separates. The files hold 8
    pairs per problem, in order; the first `pairs_per_problem` of each are scored."""
    score = reward_model_function(path, "cuda" if torch.cuda.is_available() else "cpu")
    kinds = {
        "number pairs, all": lambda chosen, rejected: True,
        "bare answers off by ±1 or ±2": lambda chosen, rejected: (
            chosen.startswith("<answer>") and near(chosen, rejected)
        ),
        "worked answers off by ±1 or ±2": lambda chosen, rejected: (
            not chosen.startswith("<answer>") and near(chosen, rejected)
        ),
        "another number": lambda chosen, rejected: not near(chosen, rejected),
    }
    accuracies = {}
    for split in ("test", "train"):
        for folder in (NUMBER_PAIRS, "data/arithmetic_preferences"):
            lines = (ROOT / folder / f"{split}.jsonl").read_text().splitlines()
            rows = [json.loads(line) for i, line in enumerate(lines) if i % 8 < pairs_per_problem]
            prompts = [row["prompt"] for row in rows]
            chosen = torch.tensor(
                score(prompts=prompts, completions=[row["chosen"] for row in rows])
            )
            rejected = torch.tensor(
                score(prompts=prompts, completions=[row["rejected"] for row in rows])
            )
            correct = (chosen > rejected).float() + 0.5 * (chosen == rejected).float()
            texts = [(row["chosen"][0]["content"], row["rejected"][0]["content"]) for row in rows]
            selected = (
                kinds.items()
                if folder == NUMBER_PAIRS
                else [("demonstrator pairs (form separates them)", None)]
            )
            for kind, keep in selected:
                index = [i for i, (c, r) in enumerate(texts) if keep is None or keep(c, r)]
                accuracies.setdefault(kind, {})[split] = {
                    "accuracy": correct[index].mean().item(),
                    "pairs": len(index),
                }
    return accuracies


def near(chosen: str, rejected: str) -> bool:
    return abs(int(extract_answer(chosen)) - int(extract_answer(rejected))) <= 2


# ----------------------------------------------------------------------------------------------------------------------
# The report: compare.json (every number), compare.md (the table and the settings), compare.png (the curves)
# ----------------------------------------------------------------------------------------------------------------------
def mean_std(values: list[float], digits: int = 3) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "—"
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.{digits}f} ± {std:.{digits}f}"


def display_path(path: str) -> str:
    """A path inside the repository relative to it, so the report reads the same on every clone; anything else as is."""
    resolved = Path(path).resolve()
    return (
        str(resolved.relative_to(ROOT))
        if Path(path).exists() and resolved.is_relative_to(ROOT)
        else path
    )


def display_command(script: str, flags: list[str]) -> str:
    return " ".join(["python", script, *map(shlex.quote, flags)])


def summarize(name: str, runs: list[dict]) -> dict:
    label, script, G, _ = ALGORITHMS[name]
    variances = [
        r["reward_variance"] for r in runs if r["reward_variance"] is not None
    ]  # none: ppo.py logs no std
    accuracies = [r["final_accuracy"] for r in runs if r["final_accuracy"] is not None]
    return {
        "label": label,
        "accuracy_mean": statistics.mean(accuracies) if accuracies else None,
        "accuracy": mean_std([r["final_accuracy"] for r in runs]),
        "accuracy_greedy": mean_std([r["final_accuracy_greedy"] for r in runs]),
        "accuracy_per_seed": " / ".join(
            "—" if r["final_accuracy"] is None else f"{r['final_accuracy']:.3f}" for r in runs
        ),
        "heldout_kl": mean_std([r["heldout_kl"] for r in runs], 2),
        "train_kl": mean_std([r["final_train_kl"] for r in runs], 2),
        "frac_reward_zero_std": mean_std([r["frac_reward_zero_std"] for r in runs], 2),
        "reward_variance": f"{statistics.mean(variances):.3f}" if variances else "—",
        "wall_s": mean_std([r["wall_s"] for r in runs], 0),
        "peak_mib": f"{max(r['peak_mib'] for r in runs):.0f}",
        "completions": runs[0]["completions"],
        "optimizer_steps": runs[0]["optimizer_steps"],
    }


def summarize_frontier(runs: list[dict], kls: list[float]) -> dict:
    """Per algorithm under --experiment reward_model: gold (exact-match accuracy) and proxy reward at the end and where
    each run's curve reaches each of the KLs, and how far gold fell from its best evaluation by the end."""
    out = {
        "proxy": mean_std([r["frontier"]["proxy"][-1] for r in runs]),
        "proxy_start": mean_std([r["frontier"]["proxy"][0] for r in runs]),
    }
    for kl in kls:
        for key, values_of in (
            ("gold", lambda r: r["accuracy"]),
            ("proxy", lambda r: r["frontier"]["proxy"]),
        ):
            values = [value_at_kl(r["frontier"]["kl"], values_of(r), kl) for r in runs]
            reached = [v for v in values if v is not None]
            out[f"{key}_at_kl"] = {
                **out.get(f"{key}_at_kl", {}),
                str(kl): {
                    "mean": statistics.mean(reached) if reached else None,
                    "per_seed": values,
                    "text": mean_std(reached)
                    + (
                        ""
                        if len(reached) == len(values)
                        else f" ({len(reached)} of {len(values)} seeds)"
                    ),
                },
            }
    peaks = [max(r["accuracy"]) for r in runs]
    out["gold_peak"] = mean_std(peaks)
    out["gold_drop"] = mean_std([peak - r["accuracy"][-1] for peak, r in zip(peaks, runs)])
    out["proxy_after_peak"] = mean_std(
        [
            r["frontier"]["proxy"][-1]
            - r["frontier"]["proxy"][r["accuracy"].index(max(r["accuracy"]))]
            for r in runs
        ]
    )
    return out


def write_markdown_rm(
    path: Path,
    args: Args,
    command: str,
    summaries: dict,
    settings: dict,
    runs: list[dict],
    total_wall_s: float,
    proxy: dict,
    kls: list[float],
):
    first = runs[0]
    n_eval = (
        first["frontier"]["prompts"] * args.num_generations_eval
    )  # the samples of one gold number
    finals = [r["final_accuracy"] for r in runs if r["final_accuracy"] is not None]
    p = statistics.mean(finals) if finals else 0.5
    standard_error = f"{(p * (1 - p) / n_eval) ** 0.5:.3f}" if n_eval else "—"
    accuracy = proxy["accuracy"]
    lines = [
        "# Online RL algorithms on a learned reward: proxy, gold and the KL frontier",
        "",
        "Written by `benchmarks/compare.py --experiment reward_model`. Back to Basics (Ahmadian et al. 2024) "
        "optimized a learned reward model and judged the result separately; here every algorithm optimizes a reward "
        "model trained by `reward_model.py` (the proxy, `--reward_funcs none`), with its KL penalty, and exact-match "
        "accuracy on held-out problems (which no algorithm sees as reward) is the gold metric.",
        "",
        f"Command: `{command}` — the reward model and {len(runs)} runs, {total_wall_s / 60:.1f} min in all (runs are "
        "sequential; "
        f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}, device: "
        f"{'cuda' if torch.cuda.is_available() else 'cpu'}).",
        "",
        f"Budget: every algorithm samples {args.completions_per_step} completions per step for {args.max_steps} steps "
        f"= {args.completions_per_step * args.max_steps} completions per run; seeds {args.seeds}; KL coefficient "
        f"{args.beta:g} for every algorithm. "
        f"Held-out evaluation at steps {', '.join(map(str, first['eval_steps']))}: {args.num_generations_eval} "
        "sample(s) per held-out prompt at the training temperature.",
        "",
        "## The proxy: the reward model",
        "",
        f"`{proxy.get('command', proxy['path'])}`"
        + (f" ({format_duration(proxy['wall_s'])})" if "wall_s" in proxy else "")
        + ". "
        "Pair accuracy (r_chosen > r_rejected, ties one half) on built-in pairs; held-out problems are the RL runs' "
        "held-out problems, "
        "training problems are the ones the RL runs train on:",
        "",
        "| pairs | held-out problems | training problems |",
        "|---|---|---|",
    ]
    for kind, splits in accuracy.items():
        lines.append(
            f"| {kind} | {splits['test']['accuracy']:.3f} ({splits['test']['pairs']} pairs) | "
            f"{splits['train']['accuracy']:.3f} ({splits['train']['pairs']} pairs) |"
        )
    lines += [
        "",
        "## Gold and proxy against the KL to the reference",
        "",
        "Gold = held-out exact-match accuracy (sampled); proxy = mean reward-model score of the policy's samples on "
        "held-out prompts; KL per "
        'completion on held-out prompts. "At KL k": read off each run\'s curve where it first reaches KL k '
        "(linear between evaluations), mean ± std "
        f"over the seeds that reach it. Evaluation standard error of one gold number ≈ {standard_error} (binomial, "
        f"{n_eval} samples, "
        "samples of one prompt counted as independent).",
        "",
        "| algorithm | gold, final (mean ± std) | per seed | "
        + " | ".join(f"gold at KL {k:g}" for k in kls)
        + " | best gold during the run "
        "| gold lost from its best to the end | proxy change over that span | proxy, final (start "
        + summaries[next(iter(summaries))]["proxy_start"]
        + ") | "
        + " | ".join(f"proxy at KL {k:g}" for k in kls)
        + " | KL, final | groups with all-equal rewards | wall time (s) | optimizer steps |",
        "|---|---|---|"
        + "---|" * len(kls)
        + "---|---|---|---|"
        + "---|" * len(kls)
        + "---|---|---|---|",
    ]
    for s in summaries.values():
        lines.append(
            f"| {s['label']} | {s['accuracy']} | {s['accuracy_per_seed']} | "
            + " | ".join(s["gold_at_kl"][str(k)]["text"] for k in kls)
            + f" | {s['gold_peak']} | {s['gold_drop']} | {s['proxy_after_peak']} | {s['proxy']} | "
            + " | ".join(s["proxy_at_kl"][str(k)]["text"] for k in kls)
            + f" | {s['heldout_kl']} | {s['frac_reward_zero_std']} | {s['wall_s']} | {s['optimizer_steps']} |"
        )
    ranked = sorted(
        (s for s in summaries.values() if s["accuracy_mean"] is not None),
        key=lambda s: -s["accuracy_mean"],
    )
    lines += [
        "",
        f"Before training (step 0, every run): gold {mean_std([r['accuracy'][0] for r in runs])}, proxy "
        f"{summaries[next(iter(summaries))]['proxy_start']}.",
        "Order by mean final gold: "
        + " > ".join(f"{s['label']} {s['accuracy_mean']:.3f}" for s in ranked)
        + ".",
    ]
    for k in kls:
        reached = sorted(
            (
                (s["gold_at_kl"][str(k)]["mean"], s["label"])
                for s in summaries.values()
                if s["gold_at_kl"][str(k)]["mean"] is not None
            ),
            reverse=True,
        )
        lines.append(
            f"Order by gold at KL {k:g}: "
            + (
                " > ".join(f"{label} {value:.3f}" for value, label in reached)
                or "no run reached it"
            )
            + "."
        )
    lines += [
        "Differences smaller than the seeds' standard deviations and the evaluation's standard error are not evidence "
        "of an order.",
        "",
        f"![]({path.stem}.png)",
        "",
        "## How each column is computed",
        "",
        "- gold: the exact-match accuracy of the samples below (the accuracy reward on the held-out split's "
        "ground_truth), measured by compare.py; ± is the sample standard deviation over seeds.",
        "- KL and proxy: measured by compare.py at every evaluation step on the checkpoint the run saved there (step "
        "0: the reference "
        f"itself), the same way for every algorithm: {args.num_generations_eval} sample(s) y ~ π per held-out prompt, "
        "Σ_t log π(y_t) − log π_ref(y_t) (k1) per completion, and the reward model's score r(x, y) as the scripts "
        "compute it, averaged. "
        "The checkpoints are deleted after the measurement.",
        "- gold lost from its best to the end: max over evaluations of gold minus final gold, per seed; the proxy "
        "change is the final proxy "
        "minus the proxy at that best evaluation. Proxy up while gold falls is over-optimization of the proxy.",
        "- groups with all-equal rewards: `frac_reward_zero_std` averaged over the logged steps (G ≥ 2 only).",
        "",
        "## Settings",
        "",
        *settings_table(summaries, settings),
        "",
        f"Shared by all: model `{first['model_name_or_path']}`, dataset `{first['dataset_name']}`, reward "
        f"`{first['reward_funcs']}` plus the reward model "
        f"`{proxy['path']}`, max_completion_length {first['max_completion_length']}, temperature "
        f"{first['temperature']}. ppo.py's value model starts "
        "from the reward model. Raw numbers, every run's curves and every script's full settings: "
        f"`{path.stem}.json`.",
        "",
    ]
    path.write_text("\n".join(lines))


def settings_table(summaries: dict, settings: dict) -> list[str]:
    """The markdown table of each algorithm's command and effective settings, for both reports."""
    lines = [
        "| algorithm | command (seed 0 shown; the others differ only in --seed and --output_dir) | learning rate "
        "(schedule) | KL coefficient | prompts × completions per step | updates per batch |",
        "|---|---|---|---|---|---|",
    ]
    for name, s in settings.items():
        lines.append(
            f"| {summaries[name]['label']} | `{s['command']}` | {s['learning_rate']:g} ({s['schedule']}) | "
            f"{s['kl_coefficient']:g} ({s['kl_place']}) | {s['prompts_per_step']} × {s['num_generations']} | "
            f"{s['updates_per_batch']} |"
        )
    return lines


def write_markdown(
    path: Path,
    args: Args,
    command: str,
    summaries: dict,
    settings: dict,
    runs: list[dict],
    total_wall_s: float,
):
    first = runs[0]
    lines = [
        "# Online RL algorithms at an equal sample budget",
        "",
        "Written by `benchmarks/compare.py`. Back to Basics (Ahmadian et al. 2024, Table 1) found RLOO k=4 ≥ "
        "RLOO k=2 ≥ REINFORCE w/ b_MA ≥ Vanilla PG ≥ PPO; this is the same comparison on this repository's task, "
        "at this repository's scale.",
        "",
        f"Command: `{command}` — {len(runs)} runs, {total_wall_s / 60:.1f} min in all (runs are sequential; "
        f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}, device: "
        f"{'cuda' if torch.cuda.is_available() else 'cpu'}).",
        "",
        f"Budget: every algorithm samples {args.completions_per_step} completions per step for {args.max_steps} steps "
        f"= {args.completions_per_step * args.max_steps} completions per run; seeds {args.seeds}. Held-out evaluation "
        "at steps "
        f"{', '.join(map(str, first['eval_steps']))}: {args.num_generations_eval} sample(s) per held-out prompt at "
        "the training temperature, and greedy.",
        "",
        "| algorithm | held-out accuracy, sampled (mean ± std over seeds) | per seed | greedy | KL, final policy on "
        "held-out prompts (nats/completion) "
        "| KL, last training step | reward variance | groups with all-equal rewards | wall time (s) | peak memory "
        "(MiB) | completions sampled | optimizer steps |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in summaries.values():
        lines.append(
            f"| {s['label']} | {s['accuracy']} | {s['accuracy_per_seed']} | {s['accuracy_greedy']} | "
            f"{s['heldout_kl']} | {s['train_kl']} "
            f"| {s['reward_variance']} | {s['frac_reward_zero_std']} | {s['wall_s']} | {s['peak_mib']} | "
            f"{s['completions']} | {s['optimizer_steps']} |"
        )
    ranked = sorted(
        (s for s in summaries.values() if s["accuracy_mean"] is not None),
        key=lambda s: -s["accuracy_mean"],
    )
    lines += [
        "",
        f"Before training (step 0, every run): held-out accuracy {mean_std([r['accuracy'][0] for r in runs])} sampled, "
        f"{mean_std([r['accuracy_greedy'][0] for r in runs])} greedy.",
        "Order by mean final held-out accuracy: "
        + " > ".join(f"{s['label']} {s['accuracy_mean']:.3f}" for s in ranked)
        + ". Differences smaller than the seeds' standard deviations are not evidence of an order.",
        "",
        "![](compare.png)",
        "",
        "## How each column is computed",
        "",
        "- held-out accuracy: `eval/accuracy` at the last step, the script's own evaluation (the mean accuracy reward "
        "of samples at the "
        "training temperature on the held-out split); ± is the sample standard deviation over seeds; greedy: "
        "`eval/accuracy_greedy`.",
        "- KL, final policy: measured by compare.py after each run, the same way for every algorithm: Σ_t log "
        "π_final(y_t) − log π_ref(y_t) "
        f"(k1) for {args.num_generations_eval} sample(s) y ~ π_final per held-out prompt, averaged. GRPO logs no KL "
        "with its default β = 0.",
        "- KL, last training step: from metrics.jsonl at the last logged step, per completion: ppo.py's "
        "`objective/kl`; rloo.py and "
        "reinforce.py's token-mean `kl` × `completions/mean_length`. It is measured on that step's training batch "
        "with the policy before its update.",
        "- reward variance: the variance over a step's batch of the reward (`reward_std` squared, unbiased), "
        "averaged over the logged steps (every `logging_steps`), then over seeds; — for a script that logs no "
        "`reward_std` (ppo.py). For a 0/1 reward it is about p(1 − p) of the training reward p, so it falls as the "
        "policy improves.",
        "- groups with all-equal rewards: `frac_reward_zero_std` averaged over the logged steps, for the algorithms "
        "that sample a group per "
        "prompt (G ≥ 2): the share of prompts whose G raw rewards are all equal, so that the group baseline leaves no "
        "reward signal in their advantages.",
        "- wall time: of the child process, start to exit (Python start-up, model loading and evaluations included); "
        "mean ± std over seeds. "
        "Peak memory: the child's own peak resident set size (`os.wait4` ru_maxrss), the largest over seeds; CPU "
        "memory only.",
        "- optimizer steps: steps × updates per batch (PPO: num_ppo_epochs × num_mini_batches).",
        "",
        "## Settings",
        "",
        "Each script runs with its own defaults except the flags shown (the budget, the evaluation schedule, "
        "`--save_steps 0` to write no "
        "checkpoints, the seed and the output folder). The effective values that differ between algorithms:",
        "",
        *settings_table(summaries, settings),
        "",
        f"Shared by all: model `{first['model_name_or_path']}`, dataset `{first['dataset_name']}`, reward "
        f"`{first['reward_funcs']}`, "
        f"max_completion_length {first['max_completion_length']}, temperature {first['temperature']}, each script's "
        "gradient clipping. Raw numbers, every run's curves and every script's full settings: `compare.json`.",
        "",
    ]
    path.write_text("\n".join(lines))


def plot(
    path: Path, names: list[str], runs: list[dict], completions_per_step: int, max_steps: int
):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    figure, (ax_accuracy, ax_kl) = plt.subplots(1, 2, figsize=(12, 4.5))
    for i, name in enumerate(names):
        seed_runs = [r for r in runs if r["algorithm"] == name]
        color, label = f"C{i}", ALGORITHMS[name][0]
        for ax, steps_key, values_key in (
            (ax_accuracy, "eval_steps", "accuracy"),
            (ax_kl, "kl_steps", "kl"),
        ):
            n = min(len(r[values_key]) for r in seed_runs)
            if n == 0:
                continue
            x = np.array(seed_runs[0][steps_key][:n]) * completions_per_step
            values = np.array([r[values_key][:n] for r in seed_runs])  # (seeds, points)
            ax.plot(
                x,
                values.mean(0),
                color=color,
                label=label if ax is ax_accuracy else None,
                marker="o" if ax is ax_accuracy else None,
                markersize=3,
            )
            ax.fill_between(x, values.min(0), values.max(0), color=color, alpha=0.15, linewidth=0)
        final_kls = [r["heldout_kl"] for r in seed_runs if r["heldout_kl"] is not None]
        if final_kls:
            ax_kl.scatter(
                [max_steps * completions_per_step],
                [sum(final_kls) / len(final_kls)],
                color=color,
                marker="x",
                s=40,
            )
    ax_accuracy.set(
        xlabel="completions sampled",
        ylabel="held-out accuracy (sampled)",
        title="held-out accuracy: mean, band = min–max over seeds",
    )
    ax_kl.set(
        xlabel="completions sampled",
        ylabel="KL to reference (nats per completion)",
        title="KL: training batches (lines), final policy on held-out (×)",
    )
    ax_kl.plot([], [], color="gray", label="training batches, as logged (GRPO with β = 0: none)")
    ax_kl.scatter(
        [], [], color="gray", marker="x", label="final policy on held-out prompts, mean over seeds"
    )
    ax_accuracy.legend(fontsize=8)
    ax_kl.legend(fontsize=8)
    for ax in (ax_accuracy, ax_kl):
        ax.set_xlim(left=0)
        ax.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def plot_frontier(
    path: Path, names: list[str], runs: list[dict], completions_per_step: int, kls: list[float]
):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    figure, (ax_gold, ax_proxy, ax_steps) = plt.subplots(1, 3, figsize=(17, 4.8))
    for i, name in enumerate(names):
        seed_runs = [r for r in runs if r["algorithm"] == name]
        color, label = f"C{i}", ALGORITHMS[name][0]
        n = min(len(r["frontier"]["kl"]) for r in seed_runs)
        kl = np.array([r["frontier"]["kl"][:n] for r in seed_runs])  # (seeds, evaluations)
        gold = np.array([r["accuracy"][:n] for r in seed_runs])
        proxy = np.array([r["frontier"]["proxy"][:n] for r in seed_runs])
        for ax, values in ((ax_gold, gold), (ax_proxy, proxy)):
            for run_kl, run_values in zip(kl, values):  # every seed, thin
                ax.plot(run_kl, run_values, color=color, alpha=0.25, linewidth=0.8)
            ax.plot(kl.mean(0), values.mean(0), color=color, marker="o", markersize=3, label=label)
        x = np.array(seed_runs[0]["eval_steps"][:n]) * completions_per_step
        ax_steps.plot(x, gold.mean(0), color=color, marker="o", markersize=3, label=label)
        ax_steps.fill_between(x, gold.min(0), gold.max(0), color=color, alpha=0.12, linewidth=0)
    for ax in (ax_gold, ax_proxy):
        for k in kls:
            ax.axvline(k, color="gray", linestyle=":", linewidth=1)
        ax.set_xlim(left=0)
    ax_gold.set(
        xlabel="KL to the reference on held-out prompts (nats per completion)",
        ylabel="gold: held-out exact-match accuracy",
        title="gold against KL (bold: mean over seeds at each evaluation)",
    )
    ax_proxy.set(
        xlabel="KL to the reference on held-out prompts (nats per completion)",
        ylabel="proxy: reward-model score, held-out prompts",
        title="proxy against KL (thin: each seed)",
    )
    ax_steps.set(
        xlabel="completions sampled",
        ylabel="gold: held-out exact-match accuracy",
        title="gold against samples (band: min–max over seeds)",
    )
    ax_gold.legend(fontsize=8)
    for ax in (ax_gold, ax_proxy, ax_steps):
        ax.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def format_duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


def command_line(args: Args) -> str:
    """The command that makes this comparison: the flags that differ from their defaults, --report_only aside."""
    flags = []
    for f in dataclasses.fields(Args):
        value = getattr(args, f.name)
        if value != f.default and f.name != "report_only":
            flags += [f"--{f.name}"] + ([] if value is True else [str(value)])
    return display_command("benchmarks/compare.py", flags)


def main(args: Args):
    command = command_line(args)
    if args.quick:
        args = dataclasses.replace(
            args,
            **QUICK,
            **(
                {"reward_model_args": QUICK_REWARD_MODEL}
                if args.experiment == "reward_model"
                else {}
            ),
        )
    check_args(args)
    train_reward_model = args.experiment == "reward_model" and args.reward_model_path is None
    args = resolve_experiment(args)
    stem, _ = EXPERIMENTS[args.experiment]
    names = split_list(args.algorithms)
    seeds = split_list(args.seeds, int)
    plan = [
        (name, seed, run_flags(args, name, seed)) for seed in seeds for name in names
    ]  # seed-major: the first seed finishes first
    configs = {
        (name, seed): script_config(ALGORITHMS[name][1], flags) for name, seed, flags in plan
    }  # every bad flag stops here
    for (name, _seed), config in configs.items():
        budget = (
            config.prompts_per_step * getattr(config, "num_generations", 1),
            config.max_steps,
            config.eval_steps,
            config.num_generations_eval,
        )
        require(
            budget
            == (
                args.completions_per_step,
                args.max_steps,
                args.eval_steps,
                args.num_generations_eval,
            ),
            f"--script_args: changes the budget or the evaluation of {name} (set them with compare.py's own flags)",
        )

    # ---- the runs, one at a time: their wall time and memory are only comparable on an otherwise idle machine ----
    output_dir = Path(args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    walls = {}
    proxy = None
    if (
        args.experiment == "reward_model"
    ):  # first the proxy: trained here unless --reward_model_path names one
        proxy_record = Path(args.reward_model_path) / "compare_reward_model.json"
        if args.report_only:
            require(
                proxy_record.is_file(),
                f"--report_only: no measured reward model in {args.reward_model_path}",
            )
        else:
            proxy = {
                "path": display_path(args.reward_model_path),
                "trained_here": train_reward_model,
            }
            if train_reward_model:
                flags = [
                    *shlex.split(args.reward_model_args),
                    "--output_dir",
                    args.reward_model_path,
                ]
                print(f"[reward model] {display_command('reward_model.py', flags)}", flush=True)
                result = run_script("reward_model.py", flags)
                if result["returncode"] != 0:
                    print(
                        f"[reward model]: stopped (exit status {result['returncode']}); its output is above",
                        file=sys.stderr,
                    )
                    sys.exit(result["returncode"] if result["returncode"] in (2, 130, 143) else 1)
                proxy.update(
                    command=display_command("reward_model.py", flags), wall_s=result["wall_s"]
                )
            proxy["accuracy"] = reward_model_accuracy(
                args.reward_model_path, pairs_per_problem=1 if args.quick else 8
            )
            proxy_record.write_text(json.dumps(proxy, indent=1))
            held_out = proxy["accuracy"]["number pairs, all"]["test"]["accuracy"]
            print(
                f"[reward model] held-out pair accuracy {held_out:.3f} (pairs that differ only in the number)",
                flush=True,
            )
        proxy = json.loads(proxy_record.read_text())
    for index, (name, seed, flags) in enumerate(plan):
        config = configs[name, seed]
        record_path = Path(config.output_dir) / "compare_run.json"
        tag = f"[{index + 1}/{len(plan)}] {ALGORITHMS[name][0]} seed {seed}"
        if args.report_only:
            require(
                record_path.is_file(), f"--report_only: no finished run in {config.output_dir}"
            )
            continue
        print(f"{tag}: {display_command(ALGORITHMS[name][1], flags)}", flush=True)
        result = run_script(ALGORITHMS[name][1], flags)
        if (
            result["returncode"] != 0
        ):  # 2: the script has printed its one line; 130, 143: stopped by a signal
            print(
                f"{tag}: stopped (exit status {result['returncode']}); its output is above",
                file=sys.stderr,
            )
            sys.exit(result["returncode"] if result["returncode"] in (2, 130, 143) else 1)
        if args.experiment == "reward_model":
            eval_steps = [r["step"] for r in read_metrics(config.output_dir) if "eval/reward" in r]
            result["frontier"] = frontier(config.output_dir, config, eval_steps)
            result["heldout_kl"] = result["frontier"]["kl"][-1]
        else:
            result["heldout_kl"] = heldout_kl(config.output_dir, config)
        record_path.write_text(
            json.dumps(
                {**result, "command": display_command(ALGORITHMS[name][1], flags)}, indent=1
            )
        )
        walls.setdefault(name, []).append(result["wall_s"])
        done = [w for ws in walls.values() for w in ws]
        left = sum(statistics.mean(walls.get(n, done)) for n, _, _ in plan[index + 1 :])
        final_accuracy = (
            read_run(config.output_dir, config, result.get("frontier"))["final_accuracy"] or 0.0
        )
        print(
            f"{tag}: done in {format_duration(result['wall_s'])}, held-out accuracy {final_accuracy:.3f}, KL "
            f"{result['heldout_kl'] or 0:.2f}, peak memory {result['peak_mib']:.0f} MiB; {index + 1} of {len(plan)} "
            f"runs done, about {format_duration(left)} left",
            flush=True,
        )

    # ---- read every run back, summarize per algorithm, write the report ----
    runs = []
    for name, seed, _flags in plan:
        config = configs[name, seed]
        record = json.loads((Path(config.output_dir) / "compare_run.json").read_text())
        runs.append(
            {
                "algorithm": name,
                "seed": seed,
                **record,
                **read_run(config.output_dir, config, record.get("frontier")),
                "completions": args.completions_per_step * args.max_steps,
                "optimizer_steps": args.max_steps * updates_per_batch(config),
                "model_name_or_path": display_path(config.model_name_or_path),
                "dataset_name": display_path(config.dataset_name),
                **{k: getattr(config, k) for k in ("max_completion_length", "temperature")},
                "reward_funcs": ",".join(config.reward_funcs),
            }
        )
    summaries = {
        name: summarize(name, [r for r in runs if r["algorithm"] == name]) for name in names
    }
    kls = split_list(args.frontier_kls, float)
    if args.experiment == "reward_model":
        for name in names:
            summaries[name].update(
                summarize_frontier([r for r in runs if r["algorithm"] == name], kls)
            )
    settings = {}
    for name in names:
        config = configs[name, seeds[0]]
        settings[name] = {
            "command": display_command(ALGORITHMS[name][1], run_flags(args, name, seeds[0])),
            "learning_rate": config.learning_rate,
            "schedule": f"{getattr(config.lr_scheduler_type, 'value', config.lr_scheduler_type)}, "
            f"{config.warmup_ratio:.0%} warm-up",
            "kl_coefficient": kl_coefficient(config),
            "kl_place": {
                "rloo.py": "in the reward",
                "reinforce.py": "in the reward",
                "ppo.py": "per-token reward",
                "grpo.py": "k3 in the loss",
            }[ALGORITHMS[name][1]],
            "prompts_per_step": config.prompts_per_step,
            "num_generations": getattr(config, "num_generations", 1),
            "updates_per_batch": updates_per_batch(config),
            "config": {
                **{
                    k: v
                    for k, v in dataclasses.asdict(config).items()
                    if k not in ("seed", "output_dir")
                },
                "model_name_or_path": display_path(config.model_name_or_path),
            },
        }
    total_wall_s = time.perf_counter() - start
    if (
        args.report_only
    ):  # the comparison's own time, as an earlier report recorded it, else the runs' alone
        earlier = output_dir / f"{stem}.json"
        total_wall_s = (
            json.loads(earlier.read_text())["total_wall_s"]
            if earlier.is_file()
            else sum(r["wall_s"] for r in runs) + (proxy or {}).get("wall_s", 0)
        )
    report = {
        "command": command,
        "args": dataclasses.asdict(args),
        "total_wall_s": total_wall_s,
        "summary": summaries,
        "settings": settings,
        "runs": runs,
    }
    if proxy is not None:
        report["reward_model"] = proxy
    (output_dir / f"{stem}.json").write_text(json.dumps(report, indent=1))
    if args.experiment == "reward_model":
        write_markdown_rm(
            output_dir / f"{stem}.md",
            args,
            command,
            summaries,
            settings,
            runs,
            total_wall_s,
            proxy,
            kls,
        )
        plot_frontier(output_dir / f"{stem}.png", names, runs, args.completions_per_step, kls)
    else:
        write_markdown(
            output_dir / f"{stem}.md", args, command, summaries, settings, runs, total_wall_s
        )
        plot(output_dir / f"{stem}.png", names, runs, args.completions_per_step, args.max_steps)
    print(
        f"wrote {output_dir / stem}.md, {output_dir / stem}.png and {output_dir / stem}.json "
        f"({format_duration(total_wall_s)} in all)"
    )


def cli(argv: list[str] | None = None):
    """`python benchmarks/compare.py argv`: a bad flag is one line `error: ...` on stderr, exit status 2."""
    try:
        main(parse_args(Args, argv))
    except (BadInput, RewardError) as error:
        fail(str(error))


if __name__ == "__main__":
    cli()
