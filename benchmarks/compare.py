"""Compare the algorithms of this repository at an equal sample budget: "Back to Basics" Table 1 in miniature.

Six estimators on the same task, reward and seeds, each run by its own script in a subprocess, with that script's own
defaults for everything but the budget (ALGORITHMS has the flags that make each one): RLOO k=4 and k=2 (rloo.py),
REINFORCE with a moving-average baseline (reinforce.py), Vanilla PG (ppo.py with λ = 1, one epoch, no whitening), PPO
(ppo.py) and GRPO (grpo.py, G = 8, β = 0).

The budget is counted in sampled completions: every algorithm samples completions_per_step completions per step (C / G
prompts × G completions) for max_steps steps, and is evaluated on the same held-out prompts at the same steps. One that
reuses a batch (PPO: 4 epochs) takes more optimizer steps on the same samples. After each run compare.py measures the
final policy's KL to the reference on held-out prompts, the same way for every algorithm; the report says how each of
its columns is computed.

--experiment reward_model is Back to Basics' own condition: reward_model.py trains a reward model (the proxy), every
algorithm optimizes it alone with β = 0.05, and exact-match accuracy on held-out problems, which no algorithm sees, is
the gold metric, measured with the KL to the reference and the proxy on the checkpoint of every evaluation.

Runs go one at a time, so that their wall times and memory are comparable. A run's settings come from the args.json
that its script writes, its curves from its metrics.jsonl. From the repository root:

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
KL_PLACE = {
    "rloo.py": "in the reward",
    "reinforce.py": "in the reward",
    "grpo.py": "k3 in the loss",
}
KL_PLACE["ppo.py"] = "per-token reward"
QUICK = dict(seeds="0", completions_per_step=8, max_steps=2, eval_steps=2, num_generations_eval=1)
NUMBER_PAIRS = "data/arithmetic_preferences_number"  # pairs that only arithmetic separates
QUICK_PROXY = (
    f"--dataset_name {NUMBER_PAIRS} --max_steps 2 --train_batch_size 8 --eval_strategy no"
)
EXPERIMENTS = {"accuracy": ("compare", "runs"), "reward_model": ("compare_rm", "runs/rm")}


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
    reward_model_args: str = arg(
        f"--dataset_name {NUMBER_PAIRS} --max_steps 400", "the flags of the proxy's training run"
    )
    frontier_kls: str = arg("0.5,1.5", "the KLs at which gold and proxy are read off each run")
    script_args: str = arg("", "more flags for every script, e.g. --script_args='--bf16'")
    quick: bool = arg(False, "a smoke test: seed 0, 2 steps of 8 completions (a 2-step proxy)")
    output_dir: str = arg("results", "the report goes here, each run in runs/<algorithm>/seed<k>")


# ---- the flags of compare.py and of each run ----
def numbers(flag: str, text: str, kind) -> list:
    try:
        return split_list(text, kind)
    except ValueError:
        raise BadInput(f"--{flag}: expected comma-separated numbers, got {text!r}") from None


def check_args(args: Args):
    """compare.py's own flags; each script checks its own when it starts."""
    for name in split_list(args.algorithms):
        choices = ", ".join(ALGORITHMS)
        unknown = f"unknown algorithm {name!r} (choose from {choices})"
        require(name in ALGORITHMS, f"--algorithms: {unknown}")
        G = ALGORITHMS[name][2]
        multiple = f"{args.completions_per_step} is not a multiple of {G}"
        of = f"the completions per prompt of {name}"
        require(args.completions_per_step % G == 0, f"--completions_per_step: {multiple}, {of}")
    numbers("seeds", args.seeds, int)
    kls = numbers("frontier_kls", args.frontier_kls, float)
    require(
        min(kls, default=0) > 0, f"--frontier_kls: must be positive, got {args.frontier_kls!r}"
    )
    unknown = f"expected one of {', '.join(EXPERIMENTS)}, got {args.experiment!r}"
    require(args.experiment in EXPERIMENTS, f"--experiment: {unknown}")


def resolve_experiment(args: Args) -> Args:
    """Under --experiment reward_model: the proxy trained into runs/rm/reward_model unless --reward_model_path names
    one, and β = 0.05 unless --beta is given."""
    if args.experiment != "reward_model":
        return args
    trained_here = str(Path(args.output_dir) / "runs" / "rm" / "reward_model")
    beta = 0.05 if args.beta is None else args.beta
    path = args.reward_model_path or trained_here
    return dataclasses.replace(args, reward_model_path=path, beta=beta)


def run_dir(args: Args, name: str, seed: int) -> Path:
    return Path(args.output_dir) / EXPERIMENTS[args.experiment][1] / name / f"seed{seed}"


def run_flags(args: Args, name: str, seed: int) -> list[str]:
    """One run's flags. --script_args come first, so that compare.py's own flags win: the algorithm's, the budget,
    the evaluation schedule, the reward, the KL coefficient, the seed and the output folder."""
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


def read_config(folder: Path) -> SimpleNamespace:
    """A finished run's flags, from the args.json that its script saves with the model."""
    return SimpleNamespace(**json.loads((folder / "args.json").read_text()))


def kl_coefficient(config) -> float:
    return config.kl_coef if hasattr(config, "kl_coef") else config.beta


def updates_per_batch(config) -> int:
    """Optimizer steps taken on each batch of completions."""
    if hasattr(config, "num_ppo_epochs"):
        return config.num_ppo_epochs * config.num_mini_batches
    return getattr(config, "num_iterations", 1)


# ---- one run: a subprocess, then what it logged and what compare.py measures on it ----
def run_script(script: str, flags: list[str], tag: str) -> dict:
    """`python script flags`, its output passing through: its wall time and peak RSS. A run that fails stops the
    comparison, with exit status 2 for a bad flag (the script has said it in one line)."""
    start = time.perf_counter()
    process = subprocess.Popen([sys.executable, str(ROOT / script), *flags])
    _, status, rusage = os.wait4(process.pid, 0)  # the child's own rusage, not every child's
    returncode = os.waitstatus_to_exitcode(status)
    if returncode != 0:
        print(f"{tag}: stopped (exit status {returncode}); its output is above", file=sys.stderr)
        sys.exit(returncode if returncode in (2, 130, 143) else 1)
    peak_mib = rusage.ru_maxrss / 1024  # Linux counts KiB
    return {"returncode": 0, "wall_s": time.perf_counter() - start, "peak_mib": peak_mib}


def sequence_kl(record: dict) -> float:
    """KL to the reference per completion (Σ_t kl_t, mean over the batch) from a training record of any script."""
    if "objective/kl" in record:  # ppo.py logs it per completion already
        return record["objective/kl"]
    return record["kl"] * record["completions/mean_length"]  # token mean × tokens per completion


def read_run(folder: Path, config, frontier: dict | None) -> dict:
    """One run's curves and end points from its metrics.jsonl. Under --experiment reward_model, whose runs log no
    accuracy (they optimize the proxy alone), the gold accuracy is compare.py's measurement (`frontier`)."""
    records = read_metrics(folder)
    evals = [r for r in records if "eval/accuracy" in r]
    if frontier is not None:
        evals = [
            {"step": s, "eval/accuracy": g} for s, g in zip(frontier["steps"], frontier["gold"])
        ]
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


def completion_logprobs(model, input_ids, attention_mask, T: int, temperature: float):
    """log π(y_t | x, y_<t) (B, T) of the last T tokens under softmax(logits / temperature), position ids from the
    attention mask (the prompts are padded on the left), as the scripts compute them."""
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    inputs = dict(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids)
    logits = model(**inputs, logits_to_keep=T + 1).logits[:, :-1]  # position t predicts token t
    logprobs = torch.log_softmax(logits.float() / temperature, -1)
    return logprobs.gather(-1, input_ids[:, -T:, None])[..., 0]


@torch.no_grad()
def heldout_measurements(policy_paths: list[str], config) -> list[dict]:
    """For each policy, num_generations_eval samples y ~ π per held-out prompt (seeded by the run's seed), and over
    them the mean KL per completion Σ_t log π(y_t) − log π_ref(y_t) (k1), their exact-match accuracy (gold) and,
    with a reward model, its mean score (the proxy)."""
    splits = load_dataset(config.dataset_name, config.dataset_config)
    held_out = splits[config.dataset_test_split]
    tokenizer = common.load_tokenizer(config.model_name_or_path)
    reference = AutoModelForCausalLM.from_pretrained(config.model_name_or_path).to(DEVICE).eval()
    n = config.num_generations_eval
    prompts = [p for p in held_out["prompt"] for _ in range(n)]
    truths = [t for t in held_out["ground_truth"] for _ in range(n)]
    texts = [common.prompt_text(tokenizer, p, config.chat_template_kwargs) for p in prompts]
    sampling = common.sampling_config(reference, tokenizer, config)
    B = config.per_device_eval_batch_size
    measured = []
    for path in policy_paths:
        policy = AutoModelForCausalLM.from_pretrained(path).to(DEVICE).eval()
        torch.manual_seed(config.seed)  # every policy of a run samples with the same seed
        kls, completions = [], []
        for start in range(0, len(texts), B):
            out = common.generate(policy, tokenizer, texts[start : start + B], sampling)
            mask, _ = common.end_of_completion(out["completion_ids"], sampling.eos_token_id)
            completion_ids = out["completion_ids"].masked_fill(mask == 0, tokenizer.pad_token_id)
            input_ids = torch.cat([out["prompt_ids"], completion_ids], 1)
            attention_mask = torch.cat([out["prompt_mask"], mask], 1)
            T = completion_ids.shape[1]
            logprobs = completion_logprobs(
                policy, input_ids, attention_mask, T, config.temperature
            )
            ref = completion_logprobs(reference, input_ids, attention_mask, T, config.temperature)
            kls += ((logprobs - ref) * mask).sum(1).tolist()
            completions += common.decode(tokenizer, completion_ids, mask)[0]
        gold = rewards.accuracy_reward(completions, ground_truth=truths)
        record = {
            "kl": statistics.mean(kls),
            "prompts": len(held_out),
            "gold": statistics.mean(gold),
        }
        if (
            config.reward_model_path
        ):  # scored as the scripts score, on what TRL hands reward functions
            proxy = rewards.reward_model_function(config.reward_model_path, DEVICE)
            pairs = [rewards.as_completion(p, c) for p, c in zip(prompts, completions)]
            scores = proxy(prompts=[p for p, _ in pairs], completions=[c for _, c in pairs])
            record["proxy"] = statistics.mean(scores)
        measured.append(record)
    return measured


def frontier(folder: Path, config) -> dict:
    """KL, proxy and gold at every evaluation step, on held-out prompts: at step 0 of the reference (KL 0), then of
    the checkpoint the run saved there, at the end of its final model. The checkpoints are deleted afterwards."""
    steps = [r["step"] for r in read_metrics(folder) if "eval/reward" in r]
    paths = {0: config.model_name_or_path, config.max_steps: str(folder)}
    policies = [paths.get(s, str(folder / f"checkpoint-{s}")) for s in steps]
    measured = heldout_measurements(policies, config)
    for checkpoint in folder.glob("checkpoint-*"):
        shutil.rmtree(checkpoint)
    curves = {k: [m[k] for m in measured] for k in ("kl", "proxy", "gold")}
    return {"steps": steps, "prompts": measured[0]["prompts"], **curves}


def value_at_kl(kls: list[float], values: list[float], kl: float) -> float | None:
    """The value where a run's curve, followed in step order from KL 0, first reaches this KL, linear between the two
    evaluations around it; None when the run never reaches it."""
    for k0, v0, k1, v1 in zip(kls, values, kls[1:], values[1:]):
        if min(k0, k1) <= kl <= max(k0, k1):
            if k1 == k0:
                return v0
            return v0 + (v1 - v0) * (kl - k0) / (k1 - k0)
    return None


def reward_model_accuracy(path: str, pairs_per_problem: int) -> dict:
    """The proxy's pair accuracy (r_chosen > r_rejected, ties one half), scored as the RL scripts score, on the
    built-in pairs of held-out and of training problems, by kind: pairs that differ only in the number (bare or
    worked, off by ±1/±2 or another number), and the demonstrator's pairs, which form alone separates. The files hold
    8 pairs per problem, in order; the first `pairs_per_problem` of each are scored."""
    score = rewards.reward_model_function(path, DEVICE)
    kinds = {
        "number pairs, all": lambda bare, near: True,
        "bare answers off by ±1 or ±2": lambda bare, near: bare and near,
        "worked answers off by ±1 or ±2": lambda bare, near: not bare and near,
        "another number": lambda bare, near: not near,
    }
    accuracies = {}
    for split in ("test", "train"):
        for folder in (NUMBER_PAIRS, "data/arithmetic_preferences"):
            lines = (ROOT / folder / f"{split}.jsonl").read_text().splitlines()
            rows = [json.loads(line) for i, line in enumerate(lines) if i % 8 < pairs_per_problem]
            prompts = [row["prompt"] for row in rows]
            chosen = torch.tensor(score(prompts=prompts, completions=[r["chosen"] for r in rows]))
            rejected = torch.tensor(
                score(prompts=prompts, completions=[r["rejected"] for r in rows])
            )
            correct = (chosen > rejected).float() + 0.5 * (chosen == rejected).float()
            if folder != NUMBER_PAIRS:
                kind = "demonstrator pairs (form separates them)"
                accuracy = {"accuracy": correct.mean().item(), "pairs": len(rows)}
                accuracies.setdefault(kind, {})[split] = accuracy
                continue
            answers = [[r[k][0]["content"] for k in ("chosen", "rejected")] for r in rows]
            bare = [c.startswith("<answer>") for c, _ in answers]
            numbers = [[int(rewards.extract_answer(text)) for text in pair] for pair in answers]
            near = [abs(c - r) <= 2 for c, r in numbers]
            for kind, keep in kinds.items():
                index = [i for i in range(len(rows)) if keep(bare[i], near[i])]
                accuracy = {"accuracy": correct[index].mean().item(), "pairs": len(index)}
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


def display_command(script: str, flags: list[str]) -> str:
    return " ".join(["python", script, *map(shlex.quote, flags)])


def summarize(name: str, runs: list[dict]) -> dict:
    finals = [r["final_accuracy"] for r in runs]
    measured = [a for a in finals if a is not None]
    variances = [r["reward_variance"] for r in runs if r["reward_variance"] is not None]
    return {
        "label": ALGORITHMS[name][0],
        "accuracy_mean": statistics.mean(measured) if measured else None,
        "accuracy": mean_std(finals),
        "accuracy_greedy": mean_std([r["final_accuracy_greedy"] for r in runs]),
        "accuracy_per_seed": " / ".join("—" if a is None else f"{a:.3f}" for a in finals),
        "heldout_kl": mean_std([r["heldout_kl"] for r in runs], 2),
        "train_kl": mean_std([r["final_train_kl"] for r in runs], 2),
        "frac_reward_zero_std": mean_std([r["frac_reward_zero_std"] for r in runs], 2),
        # none: ppo.py logs no reward_std
        "reward_variance": f"{statistics.mean(variances):.3f}" if variances else "—",
        "wall_s": mean_std([r["wall_s"] for r in runs], 0),
        "peak_mib": f"{max(r['peak_mib'] for r in runs):.0f}",
        "completions": runs[0]["completions"],
        "optimizer_steps": runs[0]["optimizer_steps"],
    }


def summarize_frontier(runs: list[dict], kls: list[float]) -> dict:
    """Under --experiment reward_model: gold and proxy at the end and where each run's curve reaches each of the
    KLs, and how far gold fell from its best evaluation by the end."""
    out = {
        "proxy": mean_std([r["frontier"]["proxy"][-1] for r in runs]),
        "proxy_start": mean_std([r["frontier"]["proxy"][0] for r in runs]),
        "gold_at_kl": {},
        "proxy_at_kl": {},
    }
    for kl in kls:
        for key in ("gold", "proxy"):
            values = [value_at_kl(r["frontier"]["kl"], r["frontier"][key], kl) for r in runs]
            reached = [v for v in values if v is not None]
            text = mean_std(reached)
            if len(reached) < len(values):
                text += f" ({len(reached)} of {len(values)} seeds)"
            mean = statistics.mean(reached) if reached else None
            out[f"{key}_at_kl"][str(kl)] = {"mean": mean, "per_seed": values, "text": text}
    best = [r["accuracy"].index(max(r["accuracy"])) for r in runs]
    out["gold_peak"] = mean_std([r["accuracy"][i] for i, r in zip(best, runs)])
    out["gold_drop"] = mean_std([r["accuracy"][i] - r["accuracy"][-1] for i, r in zip(best, runs)])
    proxy_change = [
        r["frontier"]["proxy"][-1] - r["frontier"]["proxy"][i] for i, r in zip(best, runs)
    ]
    out["proxy_after_peak"] = mean_std(proxy_change)
    return out


def settings_of(args: Args, name: str, seed: int) -> dict:
    """One algorithm's command and effective settings, from its first seed's run."""
    config = read_config(run_dir(args, name, seed))
    script = ALGORITHMS[name][1]
    full = {k: v for k, v in vars(config).items() if k not in ("seed", "output_dir")}
    return {
        "command": display_command(script, run_flags(args, name, seed)),
        "learning_rate": config.learning_rate,
        "schedule": f"{config.lr_scheduler_type}, {config.warmup_ratio:.0%} warm-up",
        "kl_coefficient": kl_coefficient(config),
        "kl_place": KL_PLACE[script],
        "prompts_per_step": config.prompts_per_step,
        "num_generations": getattr(config, "num_generations", 1),
        "updates_per_batch": updates_per_batch(config),
        "config": full | {"model_name_or_path": display_path(config.model_name_or_path)},
    }


def row(cells) -> str:
    return "| " + " | ".join(map(str, cells)) + " |"


def ranked(summaries: dict, key=lambda s: s["accuracy_mean"]) -> str:
    """The algorithms by a mean, highest first, those without one left out."""
    measured = [s for s in summaries.values() if key(s) is not None]
    order = sorted(measured, key=lambda s: -key(s))
    return " > ".join(f"{s['label']} {key(s):.3f}" for s in order)


SHARED = "model_name_or_path dataset_name reward_funcs max_completion_length temperature".split()
COLUMNS = "label accuracy accuracy_per_seed accuracy_greedy heldout_kl train_kl reward_variance"
COLUMNS += " frac_reward_zero_std wall_s peak_mib completions optimizer_steps"
HEADER = """\
Command: `{command}` — {proxy_and}{runs} runs, {minutes:.1f} min in all (runs are sequential; \
OMP_NUM_THREADS={threads}, device: {device}).

Budget: every algorithm samples {C} completions per step for {max_steps} steps = {completions} completions per run; \
seeds {seeds}"""
SETTINGS = """\
## Settings

{intro}| algorithm | command (seed 0 shown; the others differ only in --seed and --output_dir) \
| learning rate (schedule) | KL coefficient | prompts × completions per step | updates per batch |
|---|---|---|---|---|---|
{rows}
"""


def report_fields(args: Args, command: str, summaries, settings, runs, total_wall_s) -> dict:
    """What both reports fill in: the command, its time and budget, the settings, the shared ones."""
    rows = []
    for name, s in settings.items():
        schedule = f"{s['learning_rate']:g} ({s['schedule']})"
        kl = f"{s['kl_coefficient']:g} ({s['kl_place']})"
        batch = f"{s['prompts_per_step']} × {s['num_generations']}"
        cells = [summaries[name]["label"], f"`{s['command']}`", schedule, kl, batch]
        rows.append(row(cells + [s["updates_per_batch"]]))
    fields = {k: runs[0][k] for k in SHARED}
    return fields | {
        "command": command,
        "runs": len(runs),
        "minutes": total_wall_s / 60,
        "threads": os.environ.get("OMP_NUM_THREADS", "unset"),
        "device": DEVICE,
        "C": args.completions_per_step,
        "max_steps": args.max_steps,
        "completions": args.completions_per_step * args.max_steps,
        "seeds": args.seeds,
        "steps": ", ".join(map(str, runs[0]["eval_steps"])),
        "n": args.num_generations_eval,
        "rows": "\n".join(rows),
    }


REPORT = """\
# Online RL algorithms at an equal sample budget

Written by `benchmarks/compare.py`. Back to Basics (Ahmadian et al. 2024, Table 1) found RLOO k=4 ≥ RLOO k=2 ≥ \
REINFORCE w/ b_MA ≥ Vanilla PG ≥ PPO; this is the same comparison on this repository's task, at its scale.

{header}. Held-out evaluation at steps {steps}: {n} sample(s) per held-out prompt at the training temperature, and \
greedy.

| algorithm | held-out accuracy, sampled (mean ± std over seeds) | per seed | greedy | KL, final policy on held-out \
prompts (nats/completion) | KL, last training step | reward variance | groups with all-equal rewards | wall time (s) \
| peak memory (MiB) | completions sampled | optimizer steps |
|---|---|---|---|---|---|---|---|---|---|---|---|
{table}

Before training (step 0, every run): held-out accuracy {start} sampled, {start_greedy} greedy.
Order by mean final held-out accuracy: {order}. Differences smaller than the seeds' standard deviations are not \
evidence of an order.

![](compare.png)

## How each column is computed

- held-out accuracy: `eval/accuracy` at the last step, the script's own evaluation (samples at the training \
temperature on the held-out split); ± is the standard deviation over seeds; greedy: `eval/accuracy_greedy`.
- KL, final policy: measured by compare.py after each run, the same way for every algorithm: Σ_t log π_final(y_t) \
− log π_ref(y_t) (k1) for {n} sample(s) y ~ π_final per held-out prompt, averaged.
- KL, last training step: per completion, from metrics.jsonl: ppo.py's `objective/kl`, the others' token-mean `kl` \
× `completions/mean_length`, on that step's batch before its update. GRPO logs none with its default β = 0.
- reward variance: `reward_std` squared, averaged over the logged steps, then over seeds; — for ppo.py, which logs \
none. For a 0/1 reward it is about p(1 − p), so it falls as the policy improves.
- groups with all-equal rewards: `frac_reward_zero_std` averaged over the logged steps (G ≥ 2): the share of \
prompts whose group baseline leaves no reward signal.
- wall time: of the child process, start to exit, mean ± std over seeds. Peak memory: its own peak resident set \
size (`os.wait4` ru_maxrss), the largest over seeds; CPU memory only.
- optimizer steps: steps × updates per batch (PPO: num_ppo_epochs × num_mini_batches).

{settings}
Shared by all: model `{model_name_or_path}`, dataset `{dataset_name}`, reward `{reward_funcs}`, \
max_completion_length {max_completion_length}, temperature {temperature}, each script's gradient clipping. Raw \
numbers, every run's curves and every script's full settings: `compare.json`.
"""
SETTINGS_INTRO = """\
Each script runs with its own defaults except the flags shown (the budget, the evaluation schedule, \
`--save_steps 0`, the seed and the output folder). The effective values that differ:

"""


def write_markdown(path: Path, args: Args, command: str, summaries, settings, runs, total_wall_s):
    fields = report_fields(args, command, summaries, settings, runs, total_wall_s)
    fields["header"] = HEADER.format(proxy_and="", **fields)
    fields["table"] = "\n".join(row(s[k] for k in COLUMNS.split()) for s in summaries.values())
    fields["start"] = mean_std([r["accuracy"][0] for r in runs])
    fields["start_greedy"] = mean_std([r["accuracy_greedy"][0] for r in runs])
    fields["order"] = ranked(summaries)
    fields["settings"] = SETTINGS.format(intro=SETTINGS_INTRO, rows=fields["rows"])
    path.write_text(REPORT.format(**fields))


RM_REPORT = """\
# Online RL algorithms on a learned reward: proxy, gold and the KL frontier

Written by `benchmarks/compare.py --experiment reward_model`. As in Back to Basics (Ahmadian et al. 2024), every \
algorithm optimizes a reward model trained by `reward_model.py` (the proxy, `--reward_funcs none`) with its KL \
penalty; exact-match accuracy on held-out problems, which no algorithm sees as reward, is the gold metric.

{header}; KL coefficient {beta:g} for every algorithm. Held-out evaluation at steps {steps}: {n} sample(s) per \
held-out prompt at the training temperature.

## The proxy: the reward model

{proxy_run}. Pair accuracy (r_chosen > r_rejected, ties one half) on built-in pairs of the RL runs' held-out and \
training problems:

| pairs | held-out problems | training problems |
|---|---|---|
{proxy_table}

## Gold and proxy against the KL to the reference

Gold = held-out exact-match accuracy (sampled); proxy = mean reward-model score of the same samples; KL per \
completion. "At KL k": read off each run's curve where it first reaches KL k (linear between evaluations), mean ± \
std over the seeds that reach it. Standard error of one gold number ≈ {standard_error:.3f} (binomial, {n_eval} \
samples).

{table}

Before training (step 0, every run): gold {start}, proxy {proxy_start}.
Order by mean final gold: {order}.
{orders_at_kl}
Differences smaller than the seeds' standard deviations and the evaluation's standard error are not evidence of an \
order.

![]({stem}.png)

## How each column is computed

- gold, KL and proxy: measured by compare.py at every evaluation on the checkpoint the run saved there (step 0: the \
reference), the same way for every algorithm: {n} sample(s) y ~ π per held-out prompt, their exact-match accuracy, \
Σ_t log π(y_t) − log π_ref(y_t) (k1) and the reward model's score, averaged; ± is the standard deviation over seeds.
- gold lost from its best to the end: per seed; the proxy change is over the same span. Proxy up while gold falls \
is over-optimization of the proxy.
- groups with all-equal rewards: `frac_reward_zero_std` averaged over the logged steps (G ≥ 2).

{settings}
Shared by all: model `{model_name_or_path}`, dataset `{dataset_name}`, reward `{reward_funcs}` plus the reward \
model `{proxy_path}`, max_completion_length {max_completion_length}, temperature {temperature}. ppo.py's value model \
starts from the reward model. Raw numbers, every run's curves and every script's full settings: `{stem}.json`.
"""


def frontier_table(summaries: dict, kls: list[float]) -> list[str]:
    """The reward-model report's table: gold and proxy at the end, at the KLs, and around gold's best."""
    proxy_start = next(iter(summaries.values()))["proxy_start"]
    header = ["algorithm", "gold, final (mean ± std)", "per seed"]
    header += [f"gold at KL {k:g}" for k in kls]
    header += ["best gold during the run", "gold lost from its best to the end"]
    header += ["proxy change over that span", f"proxy, final (start {proxy_start})"]
    header += [f"proxy at KL {k:g}" for k in kls]
    header += ["KL, final", "groups with all-equal rewards", "wall time (s)", "optimizer steps"]
    table = [row(header), "|" + "---|" * len(header)]
    for s in summaries.values():
        cells = [s["label"], s["accuracy"], s["accuracy_per_seed"]]
        cells += [s["gold_at_kl"][str(k)]["text"] for k in kls]
        cells += [s["gold_peak"], s["gold_drop"], s["proxy_after_peak"], s["proxy"]]
        cells += [s["proxy_at_kl"][str(k)]["text"] for k in kls]
        cells += [s["heldout_kl"], s["frac_reward_zero_std"], s["wall_s"], s["optimizer_steps"]]
        table.append(row(cells))
    return table


def write_markdown_rm(path, args: Args, command, summaries, settings, runs, total_wall_s, proxy):
    fields = report_fields(args, command, summaries, settings, runs, total_wall_s)
    kls = split_list(args.frontier_kls, float)
    n_eval = runs[0]["frontier"]["prompts"] * args.num_generations_eval  # the samples of one gold
    p = statistics.mean(r["final_accuracy"] for r in runs)
    proxy_run = f"`{proxy.get('command', proxy['path'])}`"
    if "wall_s" in proxy:
        proxy_run += f" ({proxy['wall_s'] / 60:.1f} min)"
    proxy_rows = []
    for kind, split in proxy["accuracy"].items():
        test, train = split["test"], split["train"]
        held_out = f"{test['accuracy']:.3f} ({test['pairs']} pairs)"
        proxy_rows.append(
            row([kind, held_out, f"{train['accuracy']:.3f} ({train['pairs']} pairs)"])
        )
    orders = []
    for k in kls:
        order = ranked(summaries, lambda s, k=k: s["gold_at_kl"][str(k)]["mean"])
        orders.append(f"Order by gold at KL {k:g}: {order or 'no run reached it'}.")
    fields |= {
        "header": HEADER.format(proxy_and="the reward model and ", **fields),
        "beta": args.beta,
        "proxy_run": proxy_run,
        "proxy_table": "\n".join(proxy_rows),
        "standard_error": (p * (1 - p) / n_eval) ** 0.5,
        "n_eval": n_eval,
        "table": "\n".join(frontier_table(summaries, kls)),
        "start": mean_std([r["accuracy"][0] for r in runs]),
        "proxy_start": next(iter(summaries.values()))["proxy_start"],
        "order": ranked(summaries),
        "orders_at_kl": "\n".join(orders),
        "stem": path.stem,
        "proxy_path": proxy["path"],
        "settings": SETTINGS.format(intro="", rows=fields["rows"]),
    }
    path.write_text(RM_REPORT.format(**fields))


SAMPLES = "completions sampled"
GOLD = "gold: held-out exact-match accuracy"
HELD_OUT_KL = "KL to the reference on held-out prompts (nats per completion)"


def band(ax, x, values, color, **style):
    """The mean over seeds as a line, the min–max over seeds as a band; `values` is (seeds, points)."""
    ax.plot(x, values.mean(0), color=color, markersize=3, **style)
    ax.fill_between(x, values.min(0), values.max(0), color=color, alpha=0.15, linewidth=0)


def save(figure: Figure, path: Path):
    for ax in figure.axes:
        ax.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def plot(path: Path, names: list[str], runs: list[dict], args: Args):
    figure = Figure(figsize=(12, 4.5))
    ax_accuracy, ax_kl = figure.subplots(1, 2)
    for i, name in enumerate(names):
        seed_runs = [r for r in runs if r["algorithm"] == name]
        n = min(len(r["accuracy"]) for r in seed_runs)
        x = np.array(seed_runs[0]["eval_steps"][:n]) * args.completions_per_step
        accuracy = np.array([r["accuracy"][:n] for r in seed_runs])
        band(ax_accuracy, x, accuracy, f"C{i}", label=ALGORITHMS[name][0], marker="o")
        n = min(len(r["kl"]) for r in seed_runs)
        if n > 0:  # GRPO with β = 0 logs no KL
            x = np.array(seed_runs[0]["kl_steps"][:n]) * args.completions_per_step
            band(ax_kl, x, np.array([r["kl"][:n] for r in seed_runs]), f"C{i}")
        final_kls = [r["heldout_kl"] for r in seed_runs]
        x = args.max_steps * args.completions_per_step
        ax_kl.scatter([x], [statistics.mean(final_kls)], color=f"C{i}", marker="x", s=40)
    ax_accuracy.set(xlabel=SAMPLES, ylabel="held-out accuracy (sampled)")
    ax_accuracy.set_title("held-out accuracy: mean, band = min–max over seeds")
    ax_kl.set(xlabel=SAMPLES, ylabel="KL to reference (nats per completion)")
    ax_kl.set_title("KL: training batches (lines), final policy on held-out (×)")
    ax_kl.plot([], [], color="gray", label="training batches, as logged (GRPO with β = 0: none)")
    held_out = "final policy on held-out prompts, mean over seeds"
    ax_kl.scatter([], [], color="gray", marker="x", label=held_out)
    for ax in (ax_accuracy, ax_kl):
        ax.legend(fontsize=8)
        ax.set_xlim(left=0)
    save(figure, path)


def plot_frontier(path: Path, names: list[str], runs: list[dict], args: Args):
    figure = Figure(figsize=(17, 4.8))
    ax_gold, ax_proxy, ax_steps = figure.subplots(1, 3)
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
        x = np.array(seed_runs[0]["eval_steps"][:n]) * args.completions_per_step
        band(ax_steps, x, gold, color, label=label, marker="o")
    for ax in (ax_gold, ax_proxy):
        for k in split_list(args.frontier_kls, float):
            ax.axvline(k, color="gray", linestyle=":", linewidth=1)
        ax.set_xlim(left=0)
    ax_gold.set(xlabel=HELD_OUT_KL, ylabel=GOLD)
    ax_gold.set_title("gold against KL (bold: mean over seeds at each evaluation)")
    ax_proxy.set(xlabel=HELD_OUT_KL, ylabel="proxy: reward-model score, held-out prompts")
    ax_proxy.set_title("proxy against KL (thin: each seed)")
    ax_steps.set(xlabel=SAMPLES, ylabel=GOLD)
    ax_steps.set_title("gold against samples (band: min–max over seeds)")
    ax_gold.legend(fontsize=8)
    save(figure, path)


# ---- main: the proxy (under --experiment reward_model), the runs one at a time, the report ----
def command_line(args: Args) -> str:
    """The command that makes this comparison: the flags that differ from their defaults."""
    flags = []
    for f in dataclasses.fields(Args):
        value = getattr(args, f.name)
        if value != f.default:
            flags.append(f"--{f.name}")
            if value is not True:
                flags.append(str(value))
    return display_command("benchmarks/compare.py", flags)


def measure_proxy(args: Args, trained_here: bool) -> dict:
    """The proxy, trained by reward_model.py unless --reward_model_path names one, and its pair accuracy."""
    proxy = {"path": display_path(args.reward_model_path), "trained_here": trained_here}
    if trained_here:
        flags = [*shlex.split(args.reward_model_args), "--output_dir", args.reward_model_path]
        proxy["command"] = display_command("reward_model.py", flags)
        print(f"[reward model] {proxy['command']}", flush=True)
        proxy["wall_s"] = run_script("reward_model.py", flags, "[reward model]")["wall_s"]
    pairs_per_problem = 1 if args.quick else 8
    proxy["accuracy"] = reward_model_accuracy(args.reward_model_path, pairs_per_problem)
    held_out = proxy["accuracy"]["number pairs, all"]["test"]["accuracy"]
    which = "pairs that differ only in the number"
    print(f"[reward model] held-out pair accuracy {held_out:.3f} ({which})", flush=True)
    return proxy


def run_all(args: Args, plan: list[tuple[str, int]]) -> list[dict]:
    """Every run in turn, then compare.py's measurements on it: its record for the report."""
    runs = []
    for index, (name, seed) in enumerate(plan):
        label, script = ALGORITHMS[name][:2]
        folder = run_dir(args, name, seed)
        tag = f"[{index + 1}/{len(plan)}] {label} seed {seed}"
        flags = run_flags(args, name, seed)
        print(f"{tag}: {display_command(script, flags)}", flush=True)
        run = {"algorithm": name, "seed": seed, **run_script(script, flags, tag)}
        config = read_config(folder)
        if args.experiment == "reward_model":
            run["frontier"] = frontier(folder, config)
            run["heldout_kl"] = run["frontier"]["kl"][-1]
        else:
            run["heldout_kl"] = heldout_measurements([str(folder)], config)[0]["kl"]
        run["command"] = display_command(script, flags)
        run |= read_run(folder, config, run.get("frontier"))
        run["completions"] = args.completions_per_step * args.max_steps
        run["optimizer_steps"] = args.max_steps * updates_per_batch(config)
        run["model_name_or_path"] = display_path(config.model_name_or_path)
        run["dataset_name"] = display_path(config.dataset_name)
        run["max_completion_length"] = config.max_completion_length
        run["temperature"] = config.temperature
        run["reward_funcs"] = ",".join(config.reward_funcs)
        runs.append(run)
        print(
            f"{tag}: done in {run['wall_s']:.0f} s, held-out accuracy {run['final_accuracy']:.3f}, "
            f"KL {run['heldout_kl']:.2f}, peak memory {run['peak_mib']:.0f} MiB; {index + 1} of "
            f"{len(plan)} runs done",
            flush=True,
        )
    return runs


def main(args: Args):
    command = command_line(args)
    if args.quick:
        args = dataclasses.replace(args, **QUICK)
        if args.experiment == "reward_model":
            args.reward_model_args = QUICK_PROXY
    check_args(args)
    trained_here = args.experiment == "reward_model" and args.reward_model_path is None
    args = resolve_experiment(args)
    names = split_list(args.algorithms)
    seeds = split_list(args.seeds, int)
    plan = [(name, seed) for seed in seeds for name in names]  # seed-major: seed 0 finishes first
    start = time.perf_counter()
    proxy = None
    if args.experiment == "reward_model":
        proxy = measure_proxy(args, trained_here)
    runs = run_all(args, plan)
    summaries = {n: summarize(n, [r for r in runs if r["algorithm"] == n]) for n in names}
    if args.experiment == "reward_model":
        kls = split_list(args.frontier_kls, float)
        for n in names:
            summaries[n] |= summarize_frontier([r for r in runs if r["algorithm"] == n], kls)
    settings = {name: settings_of(args, name, seeds[0]) for name in names}
    total_wall_s = time.perf_counter() - start
    report = {"command": command, "args": dataclasses.asdict(args), "total_wall_s": total_wall_s}
    report |= {"summary": summaries, "settings": settings, "runs": runs}
    if proxy is not None:
        report["reward_model"] = proxy
    output = Path(args.output_dir) / EXPERIMENTS[args.experiment][0]
    output.with_suffix(".json").write_text(json.dumps(report, indent=1))
    table = (args, command, summaries, settings, runs, total_wall_s)
    if args.experiment == "reward_model":
        write_markdown_rm(output.with_suffix(".md"), *table, proxy)
        plot_frontier(output.with_suffix(".png"), names, runs, args)
    else:
        write_markdown(output.with_suffix(".md"), *table)
        plot(output.with_suffix(".png"), names, runs, args)
    print(
        f"wrote {output}.md, {output}.png and {output}.json ({total_wall_s / 60:.1f} min in all)"
    )


def cli(argv: list[str] | None = None):
    """`python benchmarks/compare.py argv`: a bad flag is one line `error: ...` on stderr, exit status 2."""
    try:
        main(parse_args(Args, argv))
    except (BadInput, rewards.RewardError) as error:
        fail(str(error))


if __name__ == "__main__":
    cli()
