"""Compare the algorithms of this repository at an equal sample budget: "Back to Basics" Table 1 in miniature.

RLOO k=4 and k=2, REINFORCE with a moving-average baseline, Vanilla PG (ppo.py with λ = 1, one epoch, no whitening),
PPO and GRPO (G = 8, β = 0), each by its own script in a subprocess, one at a time, with its own defaults but for the
flags in ALGORITHMS and the budget: the same completions per step, steps, seeds and held-out evaluation. Then
compare.py measures each final policy's KL to the reference. --experiment reward_model is the paper's own condition:
every algorithm optimizes a reward model trained by reward_model.py (the proxy) with β = 0.05, and held-out
exact-match accuracy is the gold metric. From the repository root:

    python benchmarks/compare.py                            # 6 algorithms × 3 seeds (results/compare.md)
    python benchmarks/compare.py --quick --output_dir /tmp/compare     # a smoke test: 6 runs of 2 steps
    python benchmarks/compare.py --experiment reward_model  # the proxy and 18 runs (results/compare_rm.md)
"""

import dataclasses
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
from types import SimpleNamespace

import numpy as np
import torch
from datasets import load_dataset
from matplotlib.figure import Figure
from transformers import AutoModelForCausalLM

from bench import BadInput, arg, fail, parse_args, read_metrics, require, split_list

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # common.py and rewards.py

import common  # noqa: E402
import rewards  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
VANILLA_PG = "--lam 1.0 --num_ppo_epochs 1 --num_mini_batches 1 --whiten_advantages False"
ALGORITHMS = {
    # name: (label, script, completions per prompt G, the flags that make it this algorithm)
    "rloo_k4": ("RLOO k=4", "rloo.py", 4, "--num_generations 4"),
    "rloo_k2": ("RLOO k=2", "rloo.py", 2, "--num_generations 2"),
    "reinforce_ma": ("REINFORCE w/ b_MA", "reinforce.py", 1, "--baseline moving_average"),
    "vanilla_pg": ("Vanilla PG", "ppo.py", 1, VANILLA_PG),
    "ppo": ("PPO", "ppo.py", 1, ""),
    "grpo": ("GRPO", "grpo.py", 8, "--num_generations 8"),
}
KL_PLACE = {"rloo.py": "in the reward", "reinforce.py": "in the reward"}
KL_PLACE |= {"ppo.py": "per-token reward", "grpo.py": "k3 in the loss"}
NUMBER_PAIRS = "data/arithmetic_preferences_number"  # pairs that only arithmetic separates
PROXY_ARGS = f"--dataset_name {NUMBER_PAIRS} --max_steps 400"
QUICK = dict(seeds="0", completions_per_step=8, max_steps=2, eval_steps=2, num_generations_eval=1)
QUICK["reward_model_args"] = f"--dataset_name {NUMBER_PAIRS} --max_steps 2 --train_batch_size 8"
QUICK["reward_model_args"] += " --eval_strategy no"
EXPERIMENTS = {"accuracy": ("compare", "runs"), "reward_model": ("compare_rm", "runs/rm")}
SAMPLES = "completions sampled"
GOLD = "gold: held-out exact-match accuracy"
HELD_OUT_KL = "KL to the reference on held-out prompts (nats per completion)"


@dataclass
class Args:
    algorithms: str = arg(",".join(ALGORITHMS), "comma-separated, in the report's order")
    seeds: str = arg("0,1,2", "comma-separated; every algorithm runs once with each")
    completions_per_step: int = arg(32, "completions sampled per step by every algorithm")
    max_steps: int = arg(50, "steps per run, the same for every algorithm")
    eval_steps: int = arg(10, "held-out evaluation every this many steps (and at 0 and the end)")
    num_generations_eval: int = arg(4, "samples per held-out prompt, for the accuracy and the KL")
    experiment: str = arg("accuracy", "accuracy (exact-match reward) or reward_model (a proxy)")
    beta: float | None = arg(None, "every script's KL coefficient (reward_model: 0.05 for all)")
    reward_model_path: str | None = arg(None, "the proxy (default: trained by reward_model.py)")
    reward_model_args: str = arg(PROXY_ARGS, "the flags of the proxy's training run")
    frontier_kls: str = arg("0.5,1.5", "the KLs at which gold and proxy are read off each run")
    script_args: str = arg("", "more flags for every script, e.g. --script_args='--bf16'")
    quick: bool = arg(False, "a smoke test: seed 0, 2 steps of 8 completions (a 2-step proxy)")
    output_dir: str = arg("results", "the report goes here, each run in runs/<algorithm>/seed<k>")


# ---- the flags of compare.py and of each run ----
def check_args(args: Args):
    """compare.py's own flags; each script checks its own when it starts."""
    for name in split_list(args.algorithms):
        unknown = f"unknown algorithm {name!r} (choose from {', '.join(ALGORITHMS)})"
        require(name in ALGORITHMS, f"--algorithms: {unknown}")
        G = ALGORITHMS[name][2]
        multiple = f"{args.completions_per_step} is not a multiple of {G}"
        of = f"the completions per prompt of {name}"
        require(args.completions_per_step % G == 0, f"--completions_per_step: {multiple}, {of}")
    for flag, kind in (("seeds", int), ("frontier_kls", float)):
        text = getattr(args, flag)
        try:
            split_list(text, kind)
        except ValueError:
            raise BadInput(f"--{flag}: expected comma-separated numbers, got {text!r}") from None
    positive = min(split_list(args.frontier_kls, float), default=0) > 0
    require(positive, f"--frontier_kls: must be positive, got {args.frontier_kls!r}")
    unknown = f"expected one of {', '.join(EXPERIMENTS)}, got {args.experiment!r}"
    require(args.experiment in EXPERIMENTS, f"--experiment: {unknown}")


def resolve_experiment(args: Args) -> Args:
    """reward_model: the proxy in runs/rm/reward_model unless given, and β = 0.05 unless given."""
    if args.experiment != "reward_model":
        return args
    path = args.reward_model_path
    if path is None:
        path = str(Path(args.output_dir) / "runs" / "rm" / "reward_model")
    beta = 0.05 if args.beta is None else args.beta
    return dataclasses.replace(args, reward_model_path=path, beta=beta)


def run_dir(args: Args, name: str, seed: int) -> Path:
    return Path(args.output_dir) / EXPERIMENTS[args.experiment][1] / name / f"seed{seed}"


def run_flags(args: Args, name: str, seed: int) -> list[str]:
    """One run's flags; --script_args first, so that compare.py's own win."""
    _, script, G, algorithm = ALGORITHMS[name]
    flags = shlex.split(args.script_args) + algorithm.split()
    flags += ["--prompts_per_step", str(args.completions_per_step // G)]
    flags += ["--max_steps", str(args.max_steps), "--eval_steps", str(args.eval_steps)]
    flags += ["--num_generations_eval", str(args.num_generations_eval)]
    save_steps = 0  # no checkpoints, but under --experiment reward_model one at every evaluation
    if args.experiment == "reward_model":  # the proxy alone
        flags += ["--reward_funcs", "none", "--reward_model_path", args.reward_model_path]
        save_steps = args.eval_steps
    if args.beta is not None:
        flags += ["--kl_coef" if script == "ppo.py" else "--beta", str(args.beta)]
    flags += ["--save_steps", str(save_steps), "--seed", str(seed)]
    return flags + ["--output_dir", str(run_dir(args, name, seed)), "--overwrite_output_dir"]


def kl_coefficient(config) -> float:
    return config.kl_coef if hasattr(config, "kl_coef") else config.beta


def updates_per_batch(config) -> int:
    """Optimizer steps taken on each batch of completions."""
    if hasattr(config, "num_ppo_epochs"):
        return config.num_ppo_epochs * config.num_mini_batches
    return getattr(config, "num_iterations", 1)


# ---- one run: a subprocess, then what it logged and what compare.py measures on it ----
def run_script(script: str, flags: list[str], tag: str) -> dict:
    """`python script flags`, its output passing through: its wall time and peak RSS, or stop."""
    start = time.perf_counter()
    process = subprocess.Popen([sys.executable, str(ROOT / script), *flags])
    _, status, rusage = os.wait4(process.pid, 0)  # the child's own rusage, not every child's
    returncode = os.waitstatus_to_exitcode(status)
    if returncode != 0:  # 2: a bad flag, which the script has said in one line
        print(f"{tag}: stopped (exit status {returncode}); its output is above", file=sys.stderr)
        sys.exit(returncode if returncode in (2, 130, 143) else 1)
    peak_mib = rusage.ru_maxrss / 1024  # Linux counts KiB
    return {"returncode": 0, "wall_s": time.perf_counter() - start, "peak_mib": peak_mib}


def sequence_kl(record: dict) -> float:
    """KL to the reference per completion (Σ_t kl_t, mean over the batch) from any script's record."""
    if "objective/kl" in record:  # ppo.py logs it per completion already
        return record["objective/kl"]
    return record["kl"] * record["completions/mean_length"]  # token mean × tokens per completion


def read_run(folder: Path, config, frontier: dict | None) -> dict:
    """One run's curves and end points; under reward_model, gold is compare.py's `frontier`."""
    records = read_metrics(folder)
    evals = [r for r in records if "eval/accuracy" in r]
    if frontier is not None:  # the run optimized the proxy alone and logged no accuracy
        pairs = zip(frontier["steps"], frontier["gold"])
        evals = [{"step": step, "eval/accuracy": gold} for step, gold in pairs]
    train = [r for r in records if "step_time" in r]
    logged = [r for r in train if "kl" in r or "objective/kl" in r]
    if kl_coefficient(config) == 0:  # GRPO at β = 0 has no reference model
        logged = []
    zero_std = [r["frac_reward_zero_std"] for r in train if "frac_reward_zero_std" in r]
    variances = [r["reward_std"] ** 2 for r in train if "reward_std" in r]
    kl = [sequence_kl(r) for r in logged]
    return {
        "eval_steps": [r["step"] for r in evals],
        "accuracy": [r["eval/accuracy"] for r in evals],
        "accuracy_greedy": [r.get("eval/accuracy_greedy") for r in evals],
        "kl_steps": [r["step"] for r in logged],
        "kl": kl,
        "final_accuracy": evals[-1]["eval/accuracy"],
        "final_accuracy_greedy": evals[-1].get("eval/accuracy_greedy"),
        "final_train_kl": kl[-1] if kl else None,
        "frac_reward_zero_std": statistics.mean(zero_std) if zero_std else None,
        "reward_variance": statistics.mean(variances) if variances else None,
    }


def completion_logprobs(model, inputs: dict, T: int, temperature: float):
    """log π(y_t | x, y_<t) (B, T) of the last T tokens at this temperature, as the scripts compute it."""
    position_ids = (inputs["attention_mask"].cumsum(-1) - 1).clamp(min=0)  # left-padded prompts
    logits = model(**inputs, position_ids=position_ids, logits_to_keep=T + 1).logits[:, :-1]
    logprobs = torch.log_softmax(logits.float() / temperature, -1)  # position t predicts token t
    return logprobs.gather(-1, inputs["input_ids"][:, -T:, None])[..., 0]


@torch.no_grad()
def heldout_measurements(policy_paths: list[str], config) -> list[dict]:
    """Per policy, over its held-out samples: the KL Σ_t log π − log π_ref (k1), gold and proxy."""
    name, split = config.dataset_name, config.dataset_test_split
    missing = f"--dataset_name {name}: no held-out split {split!r} with a ground_truth column"
    require(not Path(name).is_file(), missing)  # a file is a train split alone
    splits = load_dataset(name, config.dataset_config)
    require(split in splits and "ground_truth" in splits[split].column_names, missing)
    dataset = splits[split]
    tokenizer = common.load_tokenizer(config.model_name_or_path)
    reference = AutoModelForCausalLM.from_pretrained(config.model_name_or_path).to(DEVICE).eval()
    n = config.num_generations_eval
    prompts = [p for p in dataset["prompt"] for _ in range(n)]
    truths = [t for t in dataset["ground_truth"] for _ in range(n)]
    texts = [common.prompt_text(tokenizer, p, config.chat_template_kwargs) for p in prompts]
    sampling = common.sampling_config(reference, tokenizer, config)
    B = config.per_device_eval_batch_size
    proxy = None
    if config.reward_model_path:  # scored as the scripts score it
        proxy = rewards.reward_model_function(config.reward_model_path, DEVICE)
    measured = []
    for path in policy_paths:
        policy = AutoModelForCausalLM.from_pretrained(path).to(DEVICE).eval()
        torch.manual_seed(config.seed)  # every policy of a run samples with the same seed
        kls, completions = [], []
        for start in range(0, len(texts), B):
            out = common.generate(policy, tokenizer, texts[start : start + B], sampling)
            mask, _ = common.end_of_completion(out["completion_ids"], sampling.eos_token_id)
            completion_ids = out["completion_ids"].masked_fill(mask == 0, tokenizer.pad_token_id)
            ids = torch.cat([out["prompt_ids"], completion_ids], 1)
            inputs = dict(input_ids=ids, attention_mask=torch.cat([out["prompt_mask"], mask], 1))
            T = completion_ids.shape[1]
            logprobs = completion_logprobs(policy, inputs, T, config.temperature)
            ref = completion_logprobs(reference, inputs, T, config.temperature)
            kls += ((logprobs - ref) * mask).sum(1).tolist()
            completions += common.decode(tokenizer, completion_ids, mask)[0]
        gold = statistics.mean(rewards.accuracy_reward(completions, ground_truth=truths))
        record = {"kl": statistics.mean(kls), "prompts": len(dataset), "gold": gold}
        if proxy is not None:
            pairs = [rewards.as_completion(p, c) for p, c in zip(prompts, completions)]
            scores = proxy(prompts=[p for p, _ in pairs], completions=[c for _, c in pairs])
            record["proxy"] = statistics.mean(scores)
        measured.append(record)
    return measured


def frontier(folder: Path, config) -> dict:
    """KL, proxy and gold of the reference (step 0), of each checkpoint the run saved, and of its final model."""
    saved = [int(path.name.removeprefix("checkpoint-")) for path in folder.glob("checkpoint-*")]
    steps = sorted({0, *saved, config.max_steps})  # the reference, the checkpoints, the end
    paths = {0: config.model_name_or_path, config.max_steps: str(folder)}
    policies = [paths.get(s, str(folder / f"checkpoint-{s}")) for s in steps]
    with torch.autocast(DEVICE, torch.bfloat16, enabled=config.bf16):  # as the run's own sampling
        measured = heldout_measurements(policies, config)
    for checkpoint in folder.glob("checkpoint-*"):  # measured: no longer needed
        shutil.rmtree(checkpoint)
    curves = {k: [m[k] for m in measured] for k in ("kl", "proxy", "gold")}
    return {"steps": steps, "prompts": measured[0]["prompts"], **curves}


def value_at_kl(kls: list[float], values: list[float], kl: float) -> float | None:
    """Where a run's curve, in step order, first reaches this KL (linear between evaluations); or None."""
    for k0, v0, k1, v1 in zip(kls, values, kls[1:], values[1:]):
        if min(k0, k1) <= kl <= max(k0, k1):
            if k1 == k0:
                return v0
            return v0 + (v1 - v0) * (kl - k0) / (k1 - k0)
    return None


def reward_model_accuracy(path: str, pairs_per_problem: int) -> dict:
    """The proxy's pair accuracy (ties one half) on the first pairs of each problem in the built-in files, by kind."""
    score = rewards.reward_model_function(path, DEVICE)
    accuracies = {}
    for split in ("test", "train"):
        for folder in (NUMBER_PAIRS, "data/arithmetic_preferences"):
            lines = (ROOT / folder / f"{split}.jsonl").read_text().splitlines()
            rows = [json.loads(line) for i, line in enumerate(lines) if i % 8 < pairs_per_problem]
            prompts = [row["prompt"] for row in rows]
            chosen = score(prompts=prompts, completions=[r["chosen"] for r in rows])
            rejected = score(prompts=prompts, completions=[r["rejected"] for r in rows])
            chosen, rejected = torch.tensor(chosen), torch.tensor(rejected)
            correct = (chosen > rejected).float() + 0.5 * (chosen == rejected).float()
            kinds = {"demonstrator pairs (form separates them)": torch.ones(len(rows), dtype=bool)}
            if folder == NUMBER_PAIRS:  # bare or worked answers, off by ±1/±2 or another number
                answers = [[r[k][0]["content"] for k in ("chosen", "rejected")] for r in rows]
                bare = torch.tensor([text.startswith("<answer>") for text, _ in answers])
                numbers = [[int(rewards.extract_answer(t)) for t in pair] for pair in answers]
                near = torch.tensor([abs(c - r) <= 2 for c, r in numbers])
                kinds = {"number pairs, all": torch.ones_like(bare)}
                kinds["bare answers off by ±1 or ±2"] = bare & near
                kinds["worked answers off by ±1 or ±2"] = ~bare & near
                kinds["another number"] = ~near
            for kind, keep in kinds.items():
                accuracy = {"accuracy": correct[keep].mean().item(), "pairs": int(keep.sum())}
                accuracies.setdefault(kind, {})[split] = accuracy
    return accuracies


# ---- the report: compare.json (every number), compare.md (the tables), compare.png (the curves) ----
def mean_std(values: list, digits: int = 3) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "—"
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.{digits}f} ± {std:.{digits}f}"


def display_path(path: str) -> str:
    """A path inside the repository relative to it, so the report reads the same on every clone."""
    resolved = Path(path).resolve()
    if Path(path).exists() and resolved.is_relative_to(ROOT):
        return str(resolved.relative_to(ROOT))
    return path


def summarize(name: str, runs: list[dict], kls: list[float]) -> dict:
    """One algorithm's figures over its seeds, as the tables show them."""
    finals = [r["final_accuracy"] for r in runs]
    variances = [r["reward_variance"] for r in runs if r["reward_variance"] is not None]
    summary = {
        "label": ALGORITHMS[name][0],
        "accuracy_mean": statistics.mean(finals),
        "accuracy": mean_std(finals),
        "accuracy_greedy": mean_std([r["final_accuracy_greedy"] for r in runs]),
        "accuracy_per_seed": " / ".join(f"{a:.3f}" for a in finals),
        "heldout_kl": mean_std([r["heldout_kl"] for r in runs], 2),
        "train_kl": mean_std([r["final_train_kl"] for r in runs], 2),
        "frac_reward_zero_std": mean_std([r["frac_reward_zero_std"] for r in runs], 2),
        "reward_variance": f"{statistics.mean(variances):.3f}" if variances else "—",
        "wall_s": mean_std([r["wall_s"] for r in runs], 0),
        "peak_mib": f"{max(r['peak_mib'] for r in runs):.0f}",
        "completions": runs[0]["completions"],
        "optimizer_steps": runs[0]["optimizer_steps"],
    }
    if "frontier" not in runs[0]:
        return summary
    curves = [r["frontier"] for r in runs]  # gold and proxy at the KLs, and after gold's best
    summary["proxy"] = mean_std([c["proxy"][-1] for c in curves])
    summary["proxy_start"] = mean_std([c["proxy"][0] for c in curves])
    for key in ("gold", "proxy"):
        summary[f"{key}_at_kl"] = {}
        for kl in kls:
            values = [value_at_kl(c["kl"], c[key], kl) for c in curves]
            reached = [v for v in values if v is not None]
            text = mean_std(reached)
            if len(reached) < len(values):
                text += f" ({len(reached)} of {len(values)} seeds)"
            mean = statistics.mean(reached) if reached else None
            summary[f"{key}_at_kl"][str(kl)] = {"mean": mean, "per_seed": values, "text": text}
    best = [r["accuracy"].index(max(r["accuracy"])) for r in runs]
    peaks = [r["accuracy"][i] for i, r in zip(best, runs)]
    summary["gold_peak"] = mean_std(peaks)
    summary["gold_drop"] = mean_std([peak - r["accuracy"][-1] for peak, r in zip(peaks, runs)])
    proxy_change = [c["proxy"][-1] - c["proxy"][i] for i, c in zip(best, curves)]
    summary["proxy_after_peak"] = mean_std(proxy_change)
    return summary


def settings_of(script: str, flags: list[str], config) -> dict:
    """One algorithm's command and effective settings, from its first seed's run."""
    full = {k: v for k, v in vars(config).items() if k not in ("seed", "output_dir")}
    return {
        "command": shlex.join(["python", script, *flags]),
        "learning_rate": config.learning_rate,
        "schedule": f"{config.lr_scheduler_type}, {config.warmup_ratio:.0%} warm-up",
        "kl_coefficient": kl_coefficient(config),
        "kl_place": KL_PLACE[script],
        "prompts_per_step": config.prompts_per_step,
        "num_generations": getattr(config, "num_generations", 1),
        "updates_per_batch": updates_per_batch(config),
        "config": full | {"model_name_or_path": display_path(config.model_name_or_path)},
    }


def table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(map(str, cells)) + " |" for cells in [header, *rows]]
    return "\n".join([lines[0], "|" + "---|" * len(header), *lines[1:]])


def ranked(summaries: dict, key=lambda s: s["accuracy_mean"]) -> str:
    """The algorithms by a mean, highest first, those without one left out."""
    measured = [s for s in summaries.values() if key(s) is not None]
    order = sorted(measured, key=lambda s: -key(s))
    if not order:
        return "no run reached it"
    return " > ".join(f"{s['label']} {key(s):.3f}" for s in order)


COLUMNS = "label accuracy accuracy_per_seed accuracy_greedy heldout_kl train_kl reward_variance"
COLUMNS += " frac_reward_zero_std wall_s peak_mib completions optimizer_steps"
HEADINGS = """algorithm | held-out accuracy, sampled (mean ± std over seeds) | per seed | greedy | KL, final \
policy on held-out prompts (nats/completion) | KL, last training step | reward variance | groups with all-equal \
rewards | wall time (s) | peak memory (MiB) | completions sampled | optimizer steps"""
SETTINGS = """algorithm | command (seed 0 shown; the others differ only in --seed and --output_dir) | learning \
rate (schedule) | KL coefficient | prompts × completions per step | updates per batch"""
HEADER = """\
Command: `{command}` — {proxy_and}{runs} runs, {minutes:.1f} min in all (one at a time; {machine}).

Budget: every algorithm samples {completions_per_step} completions per step for {max_steps} steps = {completions} \
completions per run; seeds {seeds}. Held-out evaluation at steps {steps}: {num_generations_eval} sample(s) per \
held-out prompt at the training temperature"""
FOOTER = """\
## Settings

Each script runs with its own defaults but for the flags shown:

{settings}

Shared by all: model `{model_name_or_path}`, dataset `{dataset_name}`, reward `{reward_funcs}`{proxy_note}, \
max_completion_length {max_completion_length}, temperature {temperature}. Every number, run and setting: `{stem}.json`.
"""
REPORT = """\
# Online RL algorithms at an equal sample budget

Written by `benchmarks/compare.py`. Back to Basics (Ahmadian et al. 2024, Table 1) found RLOO k=4 ≥ RLOO k=2 ≥ \
REINFORCE w/ b_MA ≥ Vanilla PG ≥ PPO; this is the same comparison on this repository's task, at its scale.

{header}, and greedy.

{table}

Before training (step 0, every run): held-out accuracy {start} sampled, {start_greedy} greedy.
Order by mean final held-out accuracy: {order}. Gaps within the seeds' spread are no evidence of an order.

![](compare.png)

## How each column is computed

- held-out accuracy: `eval/accuracy` (sampled) and `eval/accuracy_greedy` at the last step; ± is the std over seeds.
- KL, final policy: compare.py's Σ_t log π(y_t) − log π_ref(y_t) (k1), the same held-out samples for all.
- KL, last training step: ppo.py's `objective/kl`, the others' `kl` × `completions/mean_length` (none at β = 0).
- reward variance: `reward_std` squared, averaged over steps (ppo.py logs none); about p(1 − p) for a 0/1 reward.
- groups with all-equal rewards: `frac_reward_zero_std` (G ≥ 2), where a group baseline leaves no signal.
- wall time: the child process's; peak memory: its largest peak RSS over seeds (`os.wait4` ru_maxrss), CPU only.
- optimizer steps: steps × updates per batch (PPO: num_ppo_epochs × num_mini_batches).

{footer}"""
RM_REPORT = """\
# Online RL algorithms on a learned reward: proxy, gold and the KL frontier

Written by `benchmarks/compare.py --experiment reward_model`. As in Back to Basics (Ahmadian et al. 2024), every \
algorithm optimizes a reward model trained by `reward_model.py` (the proxy, `--reward_funcs none`) with a KL \
penalty; held-out exact-match accuracy, which no algorithm sees, is the gold metric.

{header}. KL coefficient {beta:g} for every algorithm; ppo.py's value model starts from the reward model.

## The proxy: the reward model

{proxy_run}. Pair accuracy (r_chosen > r_rejected, ties one half) on built-in pairs of the RL runs' problems:

{proxy_table}

## Gold and proxy against the KL to the reference

"At KL k": where a run's curve first reaches KL k, mean ± std over the seeds that reach it. Standard error of one \
gold number ≈ {standard_error:.3f} (binomial, {n_eval} samples).

{table}

Before training (step 0, every run): gold {start}, proxy {proxy_start}.
Order by mean final gold: {order}.
{orders_at_kl}
Gaps within the seeds' standard deviations and the standard error are no evidence of an order.

![]({stem}.png)

## How each column is computed

- gold, KL and proxy: compare.py's exact-match accuracy, Σ_t log π(y_t) − log π_ref(y_t) (k1) and reward-model \
score of the same held-out samples, on the checkpoint of each evaluation (step 0: the reference).
- gold lost from its best to the end, and the proxy's change over that span: proxy up while gold falls is \
over-optimization. ± is the standard deviation over seeds.

{footer}"""


def frontier_table(summaries: dict, kls: list[float]) -> str:
    """The reward-model report's table: gold and proxy at the end, at the KLs, and around gold's best."""
    proxy_start = next(iter(summaries.values()))["proxy_start"]
    header = ["algorithm", "gold, final (mean ± std)", "per seed"]
    header += [f"gold at KL {k:g}" for k in kls]
    header += ["best gold during the run", "gold lost from its best to the end"]
    header += ["proxy change over that span", f"proxy, final (start {proxy_start})"]
    header += [f"proxy at KL {k:g}" for k in kls]
    header += ["KL, final", "groups with all-equal rewards", "wall time (s)", "optimizer steps"]
    rows = []
    for s in summaries.values():
        cells = [s["label"], s["accuracy"], s["accuracy_per_seed"]]
        cells += [s["gold_at_kl"][str(k)]["text"] for k in kls]
        cells += [s["gold_peak"], s["gold_drop"], s["proxy_after_peak"], s["proxy"]]
        cells += [s["proxy_at_kl"][str(k)]["text"] for k in kls]
        cells += [s["heldout_kl"], s["frac_reward_zero_std"], s["wall_s"], s["optimizer_steps"]]
        rows.append(cells)
    return table(header, rows)


def write_markdown(path: Path, args: Args, report: dict):
    """compare.md (or compare_rm.md) from the numbers of compare.json."""
    summaries, runs, proxy = report["summary"], report["runs"], report.get("reward_model")
    settings = []
    for name, s in report["settings"].items():
        schedule = f"{s['learning_rate']:g} ({s['schedule']})"
        kl = f"{s['kl_coefficient']:g} ({s['kl_place']})"
        batch = f"{s['prompts_per_step']} × {s['num_generations']}"
        cells = [summaries[name]["label"], f"`{s['command']}`", schedule, kl, batch]
        settings.append(cells + [s["updates_per_batch"]])
    fields = vars(args) | runs[0]  # the settings shared by all runs, among others
    fields |= {
        "command": report["command"],
        "proxy_and": "" if proxy is None else "the reward model and ",
        "runs": len(runs),
        "minutes": report["total_wall_s"] / 60,
        "machine": f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}, device: {DEVICE}",
        "steps": ", ".join(map(str, runs[0]["eval_steps"])),
        "settings": table(SETTINGS.split(" | "), settings),
        "start": mean_std([r["accuracy"][0] for r in runs]),
        "order": ranked(summaries),
        "stem": path.stem,
    }
    fields["proxy_note"] = ""
    if proxy is not None:
        fields["proxy_note"] = f" plus the reward model `{proxy['path']}`"
    fields["header"] = HEADER.format(**fields)
    fields["footer"] = FOOTER.format(**fields)
    if proxy is None:
        rows = [[s[key] for key in COLUMNS.split()] for s in summaries.values()]
        fields["table"] = table(HEADINGS.split(" | "), rows)
        fields["start_greedy"] = mean_std([r["accuracy_greedy"][0] for r in runs])
        path.write_text(REPORT.format(**fields))
        return
    kls = split_list(args.frontier_kls, float)
    n_eval = runs[0]["frontier"]["prompts"] * args.num_generations_eval  # the samples of one gold
    p = statistics.mean(r["final_accuracy"] for r in runs)
    proxy_run = f"`{proxy.get('command', proxy['path'])}`"
    if "wall_s" in proxy:
        proxy_run += f" ({proxy['wall_s'] / 60:.1f} min)"
    pairs = lambda a: f"{a['accuracy']:.3f} ({a['pairs']} pairs)"
    proxy_rows = [[k, pairs(a["test"]), pairs(a["train"])] for k, a in proxy["accuracy"].items()]
    orders = []
    for k in kls:
        order = ranked(summaries, lambda s, k=k: s["gold_at_kl"][str(k)]["mean"])
        orders.append(f"Order by gold at KL {k:g}: {order}.")
    fields |= {
        "proxy_run": proxy_run,
        "proxy_table": table(["pairs", "held-out problems", "training problems"], proxy_rows),
        "standard_error": (p * (1 - p) / n_eval) ** 0.5,
        "n_eval": n_eval,
        "table": frontier_table(summaries, kls),
        "proxy_start": next(iter(summaries.values()))["proxy_start"],
        "orders_at_kl": "\n".join(orders),
    }
    path.write_text(RM_REPORT.format(**fields))


def band(ax, seed_runs: list[dict], steps: str, key: str, C: int, color: str, **style) -> int:
    """The mean over seeds as a line, the min–max as a band, against completions sampled."""
    n = min(len(r[key]) for r in seed_runs)  # the points that every seed has
    x = np.array(seed_runs[0][steps][:n]) * C
    values = np.array([r[key][:n] for r in seed_runs])  # (seeds, points)
    ax.plot(x, values.mean(0), color=color, markersize=3, **style)
    ax.fill_between(x, values.min(0), values.max(0), color=color, alpha=0.15, linewidth=0)
    return n


def plot(path: Path, groups: dict, args: Args):
    """compare.png: accuracy and KL against samples; compare_rm.png: gold and proxy against KL too."""
    frontier = args.experiment == "reward_model"
    figure = Figure(figsize=(17, 4.8) if frontier else (12, 4.5))
    axes = figure.subplots(1, 3 if frontier else 2)
    ax_steps = axes[-1] if frontier else axes[0]  # held-out accuracy against completions sampled
    C = args.completions_per_step
    for i, (name, seed_runs) in enumerate(groups.items()):
        color, label = f"C{i}", ALGORITHMS[name][0]
        n = band(ax_steps, seed_runs, "eval_steps", "accuracy", C, color, label=label, marker="o")
        if frontier:  # gold and proxy against the KL: every seed thin, the mean over seeds bold
            kl = np.array([r["frontier"]["kl"][:n] for r in seed_runs])
            for ax, key in zip(axes, ("gold", "proxy")):
                values = np.array([r["frontier"][key][:n] for r in seed_runs])
                ax.plot(kl.T, values.T, color=color, alpha=0.25, linewidth=0.8)  # each seed
                ax.plot(kl.mean(0), values.mean(0), "o-", color=color, markersize=3, label=label)
            continue
        band(axes[1], seed_runs, "kl_steps", "kl", C, color)  # none for GRPO at β = 0
        final_kl = statistics.mean(r["heldout_kl"] for r in seed_runs)
        axes[1].scatter([args.max_steps * C], [final_kl], color=color, marker="x", s=40)
    if frontier:
        for k in split_list(args.frontier_kls, float):
            axes[0].axvline(k, color="gray", linestyle=":", linewidth=1)
            axes[1].axvline(k, color="gray", linestyle=":", linewidth=1)
        axes[0].set(xlabel=HELD_OUT_KL, ylabel=GOLD)
        axes[0].set_title("gold against KL (bold: mean over seeds at each evaluation)")
        axes[1].set(xlabel=HELD_OUT_KL, ylabel="proxy: reward-model score, held-out prompts")
        axes[1].set_title("proxy against KL (thin: each seed)")
        ax_steps.set(xlabel=SAMPLES, ylabel=GOLD)
        ax_steps.set_title("gold against samples (band: min–max over seeds)")
        axes[0].legend(fontsize=8)
    else:
        ax_steps.set(xlabel=SAMPLES, ylabel="held-out accuracy (sampled)")
        ax_steps.set_title("held-out accuracy: mean, band = min–max over seeds")
        axes[1].set(xlabel=SAMPLES, ylabel="KL to reference (nats per completion)")
        axes[1].set_title("KL: training batches (lines), final policy on held-out (×)")
        logged = "training batches, as logged (GRPO with β = 0: none)"
        axes[1].plot([], [], color="gray", label=logged)
        held_out = "final policy on held-out prompts, mean over seeds"
        axes[1].scatter([], [], color="gray", marker="x", label=held_out)
        axes[0].legend(fontsize=8)
        axes[1].legend(fontsize=8)
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.set_xlim(left=0)
    figure.tight_layout()
    figure.savefig(path, dpi=120)


# ---- main: the proxy (under --experiment reward_model), the runs one at a time, the report ----
def main(args: Args, command: str):
    if args.quick:
        args = dataclasses.replace(args, **QUICK)
    check_args(args)
    trained_here = args.experiment == "reward_model" and args.reward_model_path is None
    args = resolve_experiment(args)
    names = split_list(args.algorithms)
    seeds = split_list(args.seeds, int)
    plan = [(name, seed) for seed in seeds for name in names]  # seed-major: seed 0 finishes first
    start = time.perf_counter()
    proxy = None
    if args.experiment == "reward_model":  # the proxy, trained here unless given; its accuracy
        proxy = {"path": display_path(args.reward_model_path), "trained_here": trained_here}
        if trained_here:
            flags = [*shlex.split(args.reward_model_args), "--output_dir", args.reward_model_path]
            proxy["command"] = shlex.join(["python", "reward_model.py", *flags])
            print(f"[reward model] {proxy['command']}", flush=True)
            proxy["wall_s"] = run_script("reward_model.py", flags, "[reward model]")["wall_s"]
        pairs_per_problem = 1 if args.quick else 8
        proxy["accuracy"] = reward_model_accuracy(args.reward_model_path, pairs_per_problem)
        held_out = proxy["accuracy"]["number pairs, all"]["test"]["accuracy"]
        which = "pairs that differ only in the number"
        print(f"[reward model] held-out pair accuracy {held_out:.3f} ({which})", flush=True)
    runs, settings = [], {}
    for index, (name, seed) in enumerate(plan):
        label, script = ALGORITHMS[name][:2]
        tag = f"[{index + 1}/{len(plan)}] {label} seed {seed}"
        folder = run_dir(args, name, seed)
        flags = run_flags(args, name, seed)
        run_command = shlex.join(["python", script, *flags])
        print(f"{tag}: {run_command}", flush=True)
        run = {"algorithm": name, "seed": seed, **run_script(script, flags, tag)}
        config = SimpleNamespace(**json.loads((folder / "args.json").read_text()))  # its flags
        if proxy is not None:  # KL, proxy and gold at every evaluation
            run["frontier"] = frontier(folder, config)
            run["heldout_kl"] = run["frontier"]["kl"][-1]
        else:
            run["heldout_kl"] = heldout_measurements([str(folder)], config)[0]["kl"]
        run["command"] = run_command
        run |= read_run(folder, config, run.get("frontier"))
        run["completions"] = args.completions_per_step * args.max_steps
        run["optimizer_steps"] = args.max_steps * updates_per_batch(config)
        run["model_name_or_path"] = display_path(config.model_name_or_path)
        run["dataset_name"] = display_path(config.dataset_name)
        run["max_completion_length"] = config.max_completion_length
        run["temperature"] = config.temperature
        run["reward_funcs"] = ",".join(config.reward_funcs)
        runs.append(run)
        if seed == seeds[0]:
            settings[name] = settings_of(script, flags, config)
        figures = f"held-out accuracy {run['final_accuracy']:.3f}, KL {run['heldout_kl']:.2f}"
        memory = f"peak memory {run['peak_mib']:.0f} MiB; {index + 1} of {len(plan)} runs done"
        print(f"{tag}: done in {run['wall_s']:.0f} s, {figures}, {memory}", flush=True)
    groups = {name: [r for r in runs if r["algorithm"] == name] for name in names}
    kls = split_list(args.frontier_kls, float)
    summaries = {name: summarize(name, group, kls) for name, group in groups.items()}
    total_wall_s = time.perf_counter() - start
    report = {"command": command, "args": dataclasses.asdict(args), "total_wall_s": total_wall_s}
    report |= {"summary": summaries, "settings": settings, "runs": runs}
    if proxy is not None:
        report["reward_model"] = proxy
    output = Path(args.output_dir) / EXPERIMENTS[args.experiment][0]
    output.with_suffix(".json").write_text(json.dumps(report, indent=1))
    write_markdown(output.with_suffix(".md"), args, report)
    plot(output.with_suffix(".png"), groups, args)
    wrote = f"wrote {output}.md, {output}.png and {output}.json"
    print(f"{wrote} ({total_wall_s / 60:.1f} min in all)")


def cli(argv: list[str] | None = None):
    """`python benchmarks/compare.py argv`: a bad flag is one line `error: ...` on stderr, exit status 2."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        main(parse_args(Args, argv), shlex.join(["python", "benchmarks/compare.py", *argv]))
    except (BadInput, rewards.RewardError) as error:
        fail(str(error))


if __name__ == "__main__":
    cli()
