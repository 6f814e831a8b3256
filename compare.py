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
    reward variance      the batch variance of each reward function's raw reward (`rewards/<f>/std` squared,
                         unbiased), averaged over the run's logged steps
    all-equal groups     `frac_reward_zero_std` (G ≥ 2 only): the share of prompts whose G rewards are all equal, whose
                         group baseline therefore leaves no reward signal
    wall time, memory    of the child process: wall clock from start to exit, and its own peak resident set size
                         (os.wait4's ru_maxrss; CPU memory, not GPU memory)

Runs go one at a time, so that their wall times and memory are comparable. --model_name_or_path, --dataset_name,
--reward_funcs and the other passed-through flags of Args reach every script; --script_args passes any other flag of
the scripts (but not the budget, which is compare.py's to set).

    python compare.py                                       # 6 algorithms × 3 seeds on the embedded model: 29 min on a
                                                               # 2-core CPU shared with other jobs (results/compare.md)
    python compare.py --quick --output_dir /tmp/compare        # a smoke test: 6 runs of 2 steps, 1.5–2 min
    python compare.py --algorithms rloo_k2,ppo --seeds 0,1,2,3,4 --max_steps 100
"""

import dataclasses
import importlib
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

import common
from common import ConfigError, arg, require
from rloo import completion_logprobs, end_of_completion

ALGORITHMS = {
    # name: (label, script, completions per prompt G, the flags that make it this algorithm)
    "rloo_k4": ("RLOO k=4", "rloo.py", 4, ["--num_generations", "4"]),
    "rloo_k2": ("RLOO k=2", "rloo.py", 2, ["--num_generations", "2"]),
    "reinforce_ma": ("REINFORCE w/ b_MA", "reinforce.py", 1, ["--baseline", "moving_average"]),
    "vanilla_pg": (
        "Vanilla PG",
        "ppo.py",
        1,
        ["--lam", "1.0", "--num_ppo_epochs", "1", "--num_mini_batches", "1", "--whiten_advantages", "False"],
    ),
    "ppo": ("PPO", "ppo.py", 1, []),
    "grpo": ("GRPO", "grpo.py", 8, ["--num_generations", "8"]),
}
PASSED_THROUGH = (
    "model_name_or_path",
    "dataset_name",
    "dataset_train_split",
    "dataset_test_split",
    "reward_funcs",
    "reward_weights",
    "reward_model_path",
    "max_completion_length",
)
QUICK = dict(seeds="0", completions_per_step=8, max_steps=2, eval_steps=2, num_generations_eval=1)


@dataclass
class Args:
    # what is compared
    algorithms: str = arg(
        ",".join(ALGORITHMS), f"comma-separated algorithms, in the order of the report ({', '.join(ALGORITHMS)})"
    )
    seeds: str = arg("0,1,2", "comma-separated seeds; every algorithm runs once with each")
    # the budget, the same for every algorithm
    completions_per_step: int = arg(
        32, "completions sampled per step by every algorithm (C / G prompts × G completions)"
    )
    max_steps: int = arg(50, "steps per run: every run samples completions_per_step × max_steps completions")
    eval_steps: int = arg(
        10, "held-out evaluation every this many steps for every algorithm (also at step 0 and the end)"
    )
    num_generations_eval: int = arg(4, "completions sampled per held-out prompt for eval/accuracy and the final KL")
    # passed to every script when given (None: each script's own default)
    model_name_or_path: str | None = arg(
        None, "policy to train (default: the scripts' default, the embedded tiny model)"
    )
    dataset_name: str | None = arg(None, "dataset (default: the scripts' default, 'arithmetic')")
    dataset_train_split: str | None = arg(None, "split to train on")
    dataset_test_split: str | None = arg(None, "held-out split with a ground_truth column")
    reward_funcs: str | None = arg(None, "comma-separated reward functions (default: the scripts' default, accuracy)")
    reward_weights: str | None = arg(None, "comma-separated weights, one per reward")
    reward_model_path: str | None = arg(None, "a sequence-classification reward model added to the rewards")
    max_completion_length: int | None = arg(None, "max generated tokens per completion")
    script_args: str = arg("", "more flags for every script, e.g. --script_args='--bf16 --micro_batch_size 16'")
    # running and reporting
    quick: bool = arg(
        False,
        "a smoke test (1.5–2 min on a CPU): seed 0, 2 steps of 8 completions, 1 eval sample per prompt (overrides "
        "those flags)",
    )
    output_dir: str = arg(
        "results", "compare.md, compare.png and compare.json go here; each run in {output_dir}/runs/<algorithm>/seed<k>"
    )
    report_only: bool = arg(
        False, "rebuild the report from the run folders of an earlier comparison with the same flags, training nothing"
    )


def check_args(args: Args):
    names = common.split_list(args.algorithms)
    require(bool(names), "--algorithms: none selected")
    for name in names:
        require(name in ALGORITHMS, f"--algorithms: unknown algorithm {name!r} (choose from {', '.join(ALGORITHMS)})")
    require(len(set(names)) == len(names), f"--algorithms: an algorithm is listed twice in {args.algorithms!r}")
    try:
        seeds = common.split_list(args.seeds, int)
    except ValueError:
        raise ConfigError(f"--seeds: expected comma-separated integers, got {args.seeds!r}") from None
    require(
        bool(seeds) and len(set(seeds)) == len(seeds),
        f"--seeds: expected distinct comma-separated integers, got {args.seeds!r}",
    )
    require(args.completions_per_step > 0, f"--completions_per_step: must be positive, got {args.completions_per_step}")
    for name in names:
        G = ALGORITHMS[name][2]
        require(
            args.completions_per_step % G == 0,
            f"--completions_per_step: {args.completions_per_step} is not a multiple of {G}, the completions per "
            f"prompt of {name}",
        )
    require(args.max_steps > 0, f"--max_steps: must be positive, got {args.max_steps}")
    require(args.eval_steps > 0, f"--eval_steps: must be positive, got {args.eval_steps}")
    require(args.num_generations_eval > 0, f"--num_generations_eval: must be positive, got {args.num_generations_eval}")


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
    for field in PASSED_THROUGH:
        if getattr(args, field) is not None:
            flags += [f"--{field}", str(getattr(args, field))]
    flags += shlex.split(args.script_args)
    run_dir = Path(args.output_dir) / "runs" / name / f"seed{seed}"  # a rerun replaces the run there
    return flags + ["--save_steps", "0", "--seed", str(seed), "--output_dir", str(run_dir), "--overwrite_output_dir"]


def script_config(script: str, flags: list[str]):
    """The script's Args after its flags, checked by its own check_args: a bad flag stops here, before any run."""
    module = importlib.import_module(script.removesuffix(".py"))
    try:
        config = common.parse_args(module.Args, flags)  # the script's own parser: no abbreviations, one-line errors
    except ConfigError as error:
        raise ConfigError(f"--script_args: {script}: {error}") from None
    module.check_args(config)
    return config


def kl_coefficient(config) -> float:
    return config.beta if hasattr(config, "beta") else config.kl_coef


def updates_per_batch(config) -> int:
    """Optimizer steps taken on each batch of completions."""
    return (
        config.num_ppo_epochs * config.num_mini_batches if hasattr(config, "num_ppo_epochs") else config.num_iterations
    )


# ----------------------------------------------------------------------------------------------------------------------
# One run: a subprocess, its wall time and peak memory, then its metrics.jsonl
# ----------------------------------------------------------------------------------------------------------------------
def run_script(script: str, flags: list[str]) -> dict:
    """Run `python script flags`, its output passing through. Returns its exit status, wall time and peak RSS."""
    start = time.perf_counter()
    process = subprocess.Popen([sys.executable, str(common.ROOT / script), *flags])
    _, status, rusage = os.wait4(process.pid, 0)  # the child's own rusage, not the sum over every child so far
    process.returncode = os.waitstatus_to_exitcode(status)
    peak_kib = rusage.ru_maxrss / (1024 if sys.platform == "darwin" else 1)  # bytes on macOS, KiB on Linux
    return {
        "returncode": process.returncode,
        "wall_s": time.perf_counter() - start,
        "peak_mib": peak_kib / 1024,
        "load_average": os.getloadavg()[0],
    }


def sequence_kl(record: dict) -> float:
    """KL to the reference per completion (Σ_t kl_t, mean over the batch) from a training record of any script."""
    if "objective/kl" in record:  # ppo.py logs it per completion already
        return record["objective/kl"]
    return record["kl"] * record["completions/mean_length"]  # token mean × tokens per completion = Σ_t kl_t / B


def read_run(run_dir: str, config) -> dict:
    """The curves and end points of one run from its metrics.jsonl."""
    records = common.read_metrics(run_dir)
    evals = [r for r in records if "eval/accuracy" in r]
    train = [r for r in records if "step_time" in r]
    has_kl = kl_coefficient(config) > 0 and any(
        "kl" in r or "objective/kl" in r for r in train
    )  # GRPO with β = 0 logs none
    kl = [sequence_kl(r) for r in train] if has_kl else []
    zero_std = [
        r["frac_reward_zero_std"] for r in train if r.get("frac_reward_zero_std") is not None
    ]  # group methods only
    variances = {
        key.split("/")[1]: [r[key] ** 2 for r in train if r.get(key) is not None]
        for key in train[0]
        if key.startswith("rewards/") and key.endswith("/std")
    }
    return {
        "eval_steps": [r["step"] for r in evals],
        "accuracy": [r["eval/accuracy"] for r in evals],
        "accuracy_greedy": [r["eval/accuracy_greedy"] for r in evals],
        "kl_steps": [r["step"] for r in train] if has_kl else [],
        "kl": kl,
        "final_accuracy": evals[-1]["eval/accuracy"] if evals else None,
        "final_accuracy_greedy": evals[-1]["eval/accuracy_greedy"] if evals else None,
        "final_train_kl": kl[-1] if kl else None,
        "frac_reward_zero_std": sum(zero_std) / len(zero_std) if zero_std else None,
        "reward_variance": {name: sum(values) / len(values) for name, values in variances.items() if values},
    }


@torch.no_grad()
def heldout_kl(run_dir: str, config) -> float | None:
    """KL(π_final ‖ π_ref) per completion on held-out prompts: the mean over num_generations_eval samples y ~ π_final
    per prompt of Σ_t log π_final(y_t) − log π_ref(y_t) (k1). The same measurement for every algorithm."""
    eval_dataset = common.load_split(
        config.dataset_name, config.dataset_test_split, {"arithmetic": common.arithmetic_dataset}
    )
    if eval_dataset is None:
        return None
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    tokenizer = common.load_tokenizer(config.model_name_or_path)
    policy = common.load_causal_lm(run_dir).to(device).eval()
    reference = common.load_causal_lm(config.model_name_or_path).to(device).eval()
    texts = [
        common.prompt_text(tokenizer, p) for p in eval_dataset["prompt"] for _ in range(config.num_generations_eval)
    ]
    generation_config = common.sampling_config(tokenizer, config)
    sums = []
    with torch.random.fork_rng(devices=[torch.cuda.current_device()] if torch.cuda.is_available() else []):
        torch.manual_seed(config.seed)
        for start in range(0, len(texts), config.per_device_eval_batch_size):
            out = common.generate(
                policy, tokenizer, texts[start : start + config.per_device_eval_batch_size], generation_config
            )
            completion_mask, _ = end_of_completion(out["completion_ids"], generation_config.eos_token_id)
            input_ids = torch.cat([out["prompt_ids"], out["completion_ids"]], 1)
            attention_mask = torch.cat([out["prompt_mask"], completion_mask], 1)
            T = out["completion_ids"].shape[1]
            logprobs = completion_logprobs(policy, input_ids, attention_mask, T, config.temperature)
            ref_logprobs = completion_logprobs(reference, input_ids, attention_mask, T, config.temperature)
            sums += ((logprobs - ref_logprobs) * completion_mask).sum(1).tolist()
    return sum(sums) / len(sums)


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
        str(resolved.relative_to(common.ROOT)) if Path(path).exists() and resolved.is_relative_to(common.ROOT) else path
    )


def display_command(script: str, flags: list[str]) -> str:
    return " ".join(["python", script, *map(shlex.quote, flags)])


def summarize(name: str, runs: list[dict]) -> dict:
    label, script, G, _ = ALGORITHMS[name]
    variance_names = runs[0]["reward_variance"].keys()
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
        "reward_variance": ", ".join(
            f"{f} {statistics.mean(r['reward_variance'][f] for r in runs):.3f}" for f in variance_names
        )
        or "—",
        "wall_s": mean_std([r["wall_s"] for r in runs], 0),
        "peak_mib": f"{max(r['peak_mib'] for r in runs):.0f}",
        "completions": runs[0]["completions"],
        "optimizer_steps": runs[0]["optimizer_steps"],
    }


def write_markdown(
    path: Path, args: Args, command: str, summaries: dict, settings: dict, runs: list[dict], total_wall_s: float
):
    first = runs[0]
    loads = [r["load_average"] for r in runs if "load_average" in r]
    load = (
        f", 1-minute load average at the end of each run {min(loads):.1f}–{max(loads):.1f} on {os.cpu_count()} CPUs"
        if loads
        else ""
    )
    lines = [
        "# Online RL algorithms at an equal sample budget",
        "",
        "Written by `compare.py`. Back to Basics (Ahmadian et al. 2024, Table 1) found RLOO k=4 ≥ RLOO k=2 ≥ "
        "REINFORCE w/ b_MA ≥ "
        "Vanilla PG ≥ PPO; this is the same comparison on this repository's task, at this repository's scale.",
        "",
        f"Command: `{command}` — {len(runs)} runs, {total_wall_s / 60:.1f} min in all (runs are sequential; "
        f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}, device: "
        f"{'cuda' if torch.cuda.is_available() else 'cpu'}{load}).",
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
        (s for s in summaries.values() if s["accuracy_mean"] is not None), key=lambda s: -s["accuracy_mean"]
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
        "- reward variance: the variance over a step's batch of each reward function's raw reward "
        "(`rewards/<function>/std` squared, "
        "unbiased), averaged over the logged steps (every `logging_steps`), then over seeds. For a 0/1 reward it is "
        "about p(1 − p) of the training "
        "reward p, so it falls as the policy improves.",
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
        "| algorithm | command (seed 0 shown; the others differ only in --seed and --output_dir) | learning rate | KL "
        "coefficient | prompts × completions per step | updates per batch |",
        "|---|---|---|---|---|---|",
    ]
    for name, s in settings.items():
        lines.append(
            f"| {summaries[name]['label']} | `{s['command']}` | {s['learning_rate']:g} | {s['kl_coefficient']:g} "
            f"({s['kl_place']}) "
            f"| {s['prompts_per_step']} × {s['num_generations']} | {s['updates_per_batch']} |"
        )
    lines += [
        "",
        f"Shared by all: model `{first['model_name_or_path']}`, dataset `{first['dataset_name']}`, reward "
        f"`{first['reward_funcs']}`, "
        f"max_completion_length {first['max_completion_length']}, temperature {first['temperature']}, each script's "
        "learning-rate schedule "
        "(constant after a 3% warm-up) and gradient clipping (1.0). Raw numbers, every run's curves and every "
        "script's full settings: `compare.json`.",
        "",
    ]
    path.write_text("\n".join(lines))


def plot(path: Path, names: list[str], runs: list[dict], completions_per_step: int, max_steps: int):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    figure, (ax_accuracy, ax_kl) = plt.subplots(1, 2, figsize=(12, 4.5))
    for i, name in enumerate(names):
        seed_runs = [r for r in runs if r["algorithm"] == name]
        color, label = f"C{i}", ALGORITHMS[name][0]
        for ax, steps_key, values_key in ((ax_accuracy, "eval_steps", "accuracy"), (ax_kl, "kl_steps", "kl")):
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
                [max_steps * completions_per_step], [sum(final_kls) / len(final_kls)], color=color, marker="x", s=40
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
    ax_kl.scatter([], [], color="gray", marker="x", label="final policy on held-out prompts, mean over seeds")
    ax_accuracy.legend(fontsize=8)
    ax_kl.legend(fontsize=8)
    for ax in (ax_accuracy, ax_kl):
        ax.set_xlim(left=0)
        ax.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def format_duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


def main(args: Args):
    if args.quick:
        args = dataclasses.replace(args, **QUICK)
    check_args(args)
    names = common.split_list(args.algorithms)
    seeds = common.split_list(args.seeds, int)
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
            budget == (args.completions_per_step, args.max_steps, args.eval_steps, args.num_generations_eval),
            f"--script_args: changes the budget or the evaluation of {name} (set them with compare.py's own flags)",
        )
    command = " ".join(["python compare.py", *map(shlex.quote, [a for a in sys.argv[1:] if a != "--report_only"])])

    # ---- the runs, one at a time: their wall time and memory are only comparable on an otherwise idle machine ----
    output_dir = Path(args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    walls = {}
    with common.graceful_interrupt() as interrupted:
        for index, (name, seed, flags) in enumerate(plan):
            config = configs[name, seed]
            record_path = Path(config.output_dir) / "compare_run.json"
            tag = f"[{index + 1}/{len(plan)}] {ALGORITHMS[name][0]} seed {seed}"
            if args.report_only:
                require(record_path.is_file(), f"--report_only: no finished run in {config.output_dir}")
                continue
            print(f"{tag}: {display_command(ALGORITHMS[name][1], flags)}", flush=True)
            result = run_script(ALGORITHMS[name][1], flags)
            if result["returncode"] == 2:
                sys.exit(2)  # the script has printed its one line naming the flag
            if result["returncode"] != 0 or interrupted.is_set():
                print(f"{tag}: stopped (exit status {result['returncode']}); its output is above", file=sys.stderr)
                sys.exit(130 if interrupted.is_set() else 1)
            result["heldout_kl"] = heldout_kl(config.output_dir, config)
            record_path.write_text(
                json.dumps({**result, "command": display_command(ALGORITHMS[name][1], flags)}, indent=1)
            )
            if interrupted.is_set():
                sys.exit(130)
            walls.setdefault(name, []).append(result["wall_s"])
            done = [w for ws in walls.values() for w in ws]
            left = sum(statistics.mean(walls.get(n, done)) for n, _, _ in plan[index + 1 :])
            final_accuracy = common.read_metrics(config.output_dir)[-1].get("eval/accuracy")
            print(
                f"{tag}: done in {format_duration(result['wall_s'])}, held-out accuracy {final_accuracy:.3f}, KL "
                f"{result['heldout_kl'] or 0:.2f}, "
                f"peak memory {result['peak_mib']:.0f} MiB; {index + 1} of {len(plan)} runs done, about "
                f"{format_duration(left)} left",
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
                **read_run(config.output_dir, config),
                "completions": args.completions_per_step * args.max_steps,
                "optimizer_steps": args.max_steps * updates_per_batch(config),
                "model_name_or_path": display_path(config.model_name_or_path),
                **{
                    k: getattr(config, k)
                    for k in ("dataset_name", "reward_funcs", "max_completion_length", "temperature")
                },
            }
        )
    summaries = {name: summarize(name, [r for r in runs if r["algorithm"] == name]) for name in names}
    settings = {}
    for name in names:
        config = configs[name, seeds[0]]
        settings[name] = {
            "command": display_command(ALGORITHMS[name][1], run_flags(args, name, seeds[0])),
            "learning_rate": config.learning_rate,
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
                **{k: v for k, v in dataclasses.asdict(config).items() if k not in ("seed", "output_dir")},
                "model_name_or_path": display_path(config.model_name_or_path),
            },
        }
    total_wall_s = time.perf_counter() - start
    if args.report_only:  # the comparison's own time, as an earlier report recorded it, else the runs' alone
        earlier = output_dir / "compare.json"
        total_wall_s = (
            json.loads(earlier.read_text())["total_wall_s"] if earlier.is_file() else sum(r["wall_s"] for r in runs)
        )
    report = {
        "command": command,
        "args": dataclasses.asdict(args),
        "total_wall_s": total_wall_s,
        "summary": summaries,
        "settings": settings,
        "runs": runs,
    }
    (output_dir / "compare.json").write_text(json.dumps(report, indent=1))
    write_markdown(output_dir / "compare.md", args, command, summaries, settings, runs, total_wall_s)
    plot(output_dir / "compare.png", names, runs, args.completions_per_step, args.max_steps)
    print(
        f"wrote {output_dir / 'compare.md'}, {output_dir / 'compare.png'} and {output_dir / 'compare.json'} "
        f"({format_duration(total_wall_s)} in all)"
    )


if __name__ == "__main__":
    common.cli(main, Args)
