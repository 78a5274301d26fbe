"""Which objective wins when the data runs out: MLM, ELECTRA, masked diffusion, CLM and CLM->MLM
on one backbone and tokenizer, a fixed set of U unique tokens repeated for E epochs, equal FLOPs.

The seed's question, after Prabhudesai et al. 2025 ("Diffusion Beats Autoregressive in
Data-Constrained Settings": AR ahead at few epochs, diffusion ahead after many) and
Gisserot-Boukhlef et al. 2026 (CLM then MLM beats MLM at a fixed budget), at toy scale:

- Data: the first documents of the built-in corpus, written to one file, about U tokens in its
  train split (the store's count is printed); a fixed 30% of its documents held out (at
  least 32 rows of 128 at the default U). One
  SentencePiece model of the whole built-in corpus for every run.
- Backbone: configs/bert_tiny.py's encoder (2 layers of 128), rows of contiguous text
  (full_sentences, T=128, B=32) for every objective.
- Budget: E x the FLOPs of one MLM pass over the train split (the "epochs" axis counts MLM
  epochs); each objective gets that many FLOPs (the trainer's count of what its step computes:
  ELECTRA's generator and discriminator, the head at all T positions for CLM and diffusion), so
  its steps = budget / its FLOPs per step. CLM->MLM spends 25% of the steps on CLM (phases).
- Held-out loss in comparable units where the objective defines a likelihood: CLM's exact NLL per
  predicted token, diffusion's ELBO bound per maskable token (nats); MLM's and ELECTRA's masked
  CE at 15% is reported as their own loss, not a likelihood.
- Fine-tuning: configs/finetune_glue.py from each encoder (bidirectional attention, also for CLM)
  on the built-in task stdlib_families (4 classes; --tasks adds stdlib_word_order), dev accuracy
  at the end of training; one fine-tuning per pretraining seed; and the same fine-tuning from the
  backbone at its random initialization (the floor every objective must clear).
- Per objective: the fraction of real tokens carrying loss and the FLOPs per loss-carrying token,
  from its training batches.
- Medians and ranges over --seeds; a PNG (held-out loss and dev accuracy against epochs, one line
  per objective) next to docs/results/comparisons.md; the table appended to
  docs/results/comparisons.md unless
  --no-record.

  # the full grid (not on a shared CPU): prints its own wall-time estimate at the end
  flock /tmp/bertjax-heavy.lock python benchmarks/comparisons/data_constrained.py
  # more epochs for two objectives, then the table and plot of every cell run with all seeds
  python benchmarks/comparisons/data_constrained.py --epochs 1,4,16,64,256 \\
      --objectives clm,diffusion --no-record
  python benchmarks/comparisons/data_constrained.py --epochs 1,4,16,64,256 --from-runs
  # smoke size (a few minutes): the pipeline end to end and the grid's estimate, records nothing
  python benchmarks/comparisons/data_constrained.py --epochs 1,2 --seeds 0 --objectives mlm,clm \\
      --finetune-steps 20 --tasks stdlib_families --no-record
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

import jax  # noqa: E402

from bertjax import trainer  # noqa: E402
from bertjax.data import make_pipeline  # noqa: E402
from bertjax.data.text import corpus  # noqa: E402
from bertjax.data.tokenizer import Tokenizer, train_sentencepiece  # noqa: E402
from bertjax.diffusion import add_diffusion_config  # noqa: E402
from bertjax.objectives import make_objective  # noqa: E402
from bertjax.objectives.causal_lm import add_clm_config  # noqa: E402
from bertjax.objectives.electra import add_electra_config  # noqa: E402
from bertjax.training import metrics as metrics_lib  # noqa: E402
from bertjax.training.phases import phase  # noqa: E402
from bertjax.training.run_config import model_config  # noqa: E402

BATCH, LENGTH, VOCAB, HELDOUT = 32, 128, 4000, 0.3
OBJECTIVES = ("mlm", "electra", "diffusion", "clm", "clm_mlm")
CLM_SHARE = 0.25  # of CLM->MLM's steps (configs/clm_mlm_base.py)
DEFAULT_GRID = dict(unique_tokens=32768, epochs=(1, 4, 16, 64), seeds=3, tasks=1, finetune=100)
RUNS = "runs.jsonl"  # finished runs under --root, reused by a rerun with the same settings
FINETUNE_TIMES: list[tuple[float, int, float]] = []  # (seconds, steps, steady step seconds)


def _load_runs(root: str) -> dict:
    """Finished runs of earlier invocations with this --root: key -> {row, finetune}."""
    path = os.path.join(root, RUNS)
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return {r["key"]: r for r in map(json.loads, filter(str.strip, f))}


def prepare_data(root: str, unique_tokens: int) -> tuple[str, str]:
    """(SentencePiece model of the whole built-in corpus, a corpus file of its first documents
    whose train split holds at least ``unique_tokens`` tokens: documents are held out by a hash
    of their id, so the file grows until the train split is large enough)."""
    spm = os.path.join(root, "spm")
    model = os.path.join(spm, "spm.model")
    if not os.path.exists(model):
        sentences = (s for _, d in corpus.iter_documents("builtin") for s in d)
        model = train_sentencepiece(sentences, spm, vocab_size=VOCAB)
    tokenizer = Tokenizer(model)
    path = os.path.join(root, f"corpus_{unique_tokens}.txt")
    if os.path.exists(path):
        return model, path
    wanted = unique_tokens / (1.0 - HELDOUT)
    best = None  # (train tokens, text) of the smallest file whose train split is large enough
    for _ in range(8):
        total, docs = 0, []
        for _, sentences in corpus.iter_documents("builtin"):
            docs.append(sentences)
            total += sum(len(t) for t in tokenizer.encode(sentences)) + 1
            if total >= wanted:
                break
        else:
            raise ValueError(f"--unique-tokens={unique_tokens}: the built-in corpus is smaller")
        text = "\n\n".join("\n".join(d) for d in docs) + "\n"
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            f.write(text)
        got = train_split_tokens(model, path + ".tmp", root)
        if got >= unique_tokens and (best is None or got < best[0]):
            best = (got, text)
        if unique_tokens <= got <= 1.15 * unique_tokens:
            break  # documents are held out whole, by a hash of their id: aim within 15%
        wanted *= unique_tokens / max(got, 1)
    if best is None:
        raise ValueError(f"could not make a corpus with {unique_tokens} train tokens")
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        f.write(best[1])
    os.replace(path + ".tmp", path)
    return model, path


def train_split_tokens(spm: str, corpus_file: str, root: str) -> int:
    """Tokens in the train split of ``corpus_file``'s store."""
    data = make_pipeline(run_config("mlm", 0, spm, corpus_file), os.path.join(root, "n"))
    try:
        return int(data.store.tokens.shape[0])
    finally:
        data.close()


def run_config(name: str, seed: int, spm: str, corpus_file: str):
    """The objective's run config on the shared backbone and data."""
    config = trainer.load_config_file(os.path.join(ROOT, "configs", "bert_tiny.py"))
    config.seed, config.batch_size = seed, BATCH
    config.data.corpus, config.data.tokenizer_model = corpus_file, spm
    config.data.heldout_fraction = HELDOUT
    config.data.max_seq_length = LENGTH
    config.data.sample_plan = "full_sentences"
    config.data.mask_rate, config.data.max_predictions = 0.15, 20
    config.data.eval_mask_rate, config.data.eval_max_predictions = 0.15, 20
    config.loss.next_sentence = None
    if name == "electra":
        add_electra_config(config)
        config.loss.discriminator_weight = 50.0
        config.loss.generator_hidden_size = 0.25
    elif name == "diffusion":
        add_diffusion_config(config)
    elif name == "clm":
        add_clm_config(config)
    config.progress_bar = False
    config.checkpoint_every, config.keep_checkpoints = 0, 1
    return config


def flops_per_step(config, workdir: str) -> tuple[float, float]:
    """(training FLOPs of one step, fraction of real tokens carrying loss), the FLOPs counted on
    the step's batch shapes and the fraction measured on a few training batches."""
    data = make_pipeline(config, workdir)
    try:
        batches = [data.batch(s) for s in range(4)]
        cfg = model_config(config, data.tokenizer)
    finally:
        data.close()
    objective = make_objective(config)
    width = batches[0]["masked_positions"].shape[1]
    per_row = objective.train_flops_per_sequence(
        cfg, LENGTH, float(width), width, metrics_lib.train_flops_per_sequence
    )
    real = sum(float(b["attention_mask"].sum()) for b in batches)
    carrying = sum(float((b["masked_weights"] > 0).sum()) for b in batches)
    if config.loss.objective == "electra":  # replaced-token detection at every real token
        carrying = real
    return BATCH * per_row, carrying / real


def pretrain(config, steps: int, workdir: str, clm_mlm: bool) -> dict:
    """Trains ``steps`` steps (CLM->MLM: two phases), evaluating at the end; the last eval row."""
    config.num_train_steps = config.optim.total_steps = steps
    config.optim.warmup_steps = max(1, steps // 10)
    config.eval_every = steps
    config.log_every = max(1, steps // 4)  # the last windows time steady steps (no compile)
    if clm_mlm:
        clm_steps = max(1, round(steps * CLM_SHARE))
        config.phase_order = ("clm", "mlm")
        config.phases.clm = phase(
            steps=clm_steps,
            reset_time=False,
            loss={"objective": "clm"},
            data={"masking": "causal"},
            optim={"total_steps": steps},
        )
        config.phases.mlm = phase(
            steps=steps - clm_steps, reset_time=False, optim={"total_steps": steps}
        )
        config.eval_every = min(clm_steps, steps - clm_steps) or 1
        config.log_every = max(1, config.eval_every // 2)
    shutil.rmtree(workdir, ignore_errors=True)
    start = time.perf_counter()
    trainer.train_and_evaluate(config, workdir)
    seconds = time.perf_counter() - start
    rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
    evals = [r for r in rows if any(k.startswith("eval/") for k in r)]
    out = {k: v for r in evals for k, v in r.items()}  # the last phase's values win
    return {**out, "seconds": seconds, "steps": steps, "step_seconds": _step_seconds(rows)}


def _step_seconds(rows: list[dict], tokens_per_step: int = BATCH * LENGTH) -> float:
    """Seconds of one steady step: the last log window's tokens/s (padding counted as a token)."""
    speeds = [r["perf/tokens_per_second"] for r in rows if "perf/tokens_per_second" in r]
    return tokens_per_step / speeds[-1] if speeds else float("nan")


def finetune(init_from: str, task: str, seed: int, steps: int, workdir: str) -> float:
    config = trainer.load_config_file(os.path.join(ROOT, "configs", "finetune_glue.py"))
    config.init_from, config.seed = init_from, seed
    config.task.source = f"builtin:{task}"
    config.loss.num_labels = 2 if task == "stdlib_word_order" else 4
    config.num_train_steps = config.optim.total_steps = steps
    config.eval_every = max(1, min(config.eval_every, steps))
    config.log_every = max(1, steps // 4)  # the last window times steady steps
    config.progress_bar = False
    shutil.rmtree(workdir, ignore_errors=True)
    start = time.perf_counter()
    trainer.train_and_evaluate(config, workdir)
    seconds = time.perf_counter() - start
    rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
    step_seconds = _step_seconds(rows, config.batch_size * config.data.max_seq_length)
    FINETUNE_TIMES.append((seconds, steps, step_seconds))
    return [r["eval/accuracy"] for r in rows if "eval/accuracy" in r][-1]  # end of training


def held_out_loss(name: str, row: dict) -> tuple[float | None, float]:
    """(likelihood loss per token where the objective defines one, the objective's own loss)."""
    if name == "clm":
        return row["eval/clm_loss"], row["eval/clm_loss"]
    if name == "diffusion":
        return row["eval/nll_bound"], row["eval/nll_bound"]
    return None, row.get("eval/mlm_loss", row.get("eval/loss", float("nan")))


def _stat(values) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"


def plot(results: dict, epochs: list[int], tasks: list[str], path: str, baseline: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [
        "held-out loss, nats/token (CLM NLL, diffusion bound)",
        *[f"dev accuracy: {t}" for t in tasks],
    ]
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    for name, by_epoch in results.items():
        xs = [e for e in epochs if e in by_epoch]
        likely = all(None not in by_epoch[e]["likelihood"] for e in xs)
        series = [[by_epoch[e]["likelihood" if likely else "own"] for e in xs]]
        series += [[by_epoch[e]["finetune"][t] for e in xs] for t in tasks]
        label = name if likely else f"{name} (masked CE, not a likelihood)"
        for ax, ys in zip(axes[0], series):
            med = [statistics.median(y) for y in ys]
            ax.plot(xs, med, marker="o", label=label)
            ax.fill_between(xs, [min(y) for y in ys], [max(y) for y in ys], alpha=0.15)
    for ax, title in zip(axes[0], panels):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("epochs over U unique tokens (MLM-FLOP equivalent)")
        ax.set_title(title)
    for ax, task in zip(axes[0][1:], tasks):
        if not baseline[task]:
            continue
        floor = statistics.median(baseline[task])
        ax.axhline(floor, color="gray", linestyle="--", label="random init, fine-tuned")
        ax.legend(fontsize=8)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def estimate(args, train_tokens, budget_per_epoch, per_step_of, timings) -> str:
    """The default grid's wall time from this run's measurements: per objective its steady step
    time and per run its start-up (compile, data, checkpoint: run time less steady steps), the
    budget scaled from the measured U to the default; fine-tuning likewise."""
    grid = DEFAULT_GRID
    budget = budget_per_epoch * grid["unique_tokens"] / max(1, args.unique_tokens)
    startups, total = [], 0.0
    for name, runs in timings.items():
        step = statistics.median(t[2] for t in runs)
        startups += [max(0.0, seconds - steps * step) for steps, seconds, _ in runs]
        for epochs in grid["epochs"]:
            total += grid["seeds"] * round(epochs * budget / per_step_of[name]) * step
    runs = len(OBJECTIVES) * len(grid["epochs"]) * grid["seeds"]
    pretraining = total * len(OBJECTIVES) / max(1, len(timings)) + runs * statistics.median(
        startups
    )
    finetuning = 0.0
    if FINETUNE_TIMES:
        startup = statistics.median(max(0.0, s - n * t) for s, n, t in FINETUNE_TIMES)
        step = statistics.median(t for _, _, t in FINETUNE_TIMES)
        finetuning = runs * grid["tasks"] * (startup + grid["finetune"] * step)
    return (
        f"estimate for the default grid (U={grid['unique_tokens']}, E={grid['epochs']}, "
        f"{grid['seeds']} seeds, {len(OBJECTIVES)} objectives, {grid['tasks']} tasks x "
        f"{grid['finetune']} fine-tuning steps) at this machine's measured speed: pretraining "
        f"{pretraining / 3600:.1f} h, fine-tuning {finetuning / 3600:.1f} h"
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--unique-tokens", type=int, default=DEFAULT_GRID["unique_tokens"])
    parser.add_argument("--epochs", default="1,4,16,64")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--objectives", default=",".join(OBJECTIVES))
    parser.add_argument("--tasks", default="stdlib_families")
    parser.add_argument("--finetune-steps", type=int, default=DEFAULT_GRID["finetune"])
    parser.add_argument("--root", default="/tmp/bertjax-data-constrained")
    parser.add_argument("--no-record", action="store_true")
    parser.add_argument(
        "--from-runs",
        action="store_true",
        help="run nothing: table and plot from the runs under --root (cells run with every seed)",
    )
    args = parser.parse_args()
    args.epochs = [int(e) for e in args.epochs.split(",")]
    args.seeds = [int(s) for s in args.seeds.split(",")]
    args.objectives = args.objectives.split(",")
    args.tasks = args.tasks.split(",")
    unknown = set(args.objectives) - set(OBJECTIVES)
    if unknown:
        parser.error(f"--objectives: unknown {sorted(unknown)}; choose from {OBJECTIVES}")
    os.makedirs(args.root, exist_ok=True)
    # Runs that differ only in seed or fine-tuning source compile the same programs: compile once.
    jax.config.update("jax_compilation_cache_dir", os.path.join(args.root, "xla-cache"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    spm, corpus_file = prepare_data(args.root, args.unique_tokens)

    # FLOPs per step and loss-carrying fraction of each objective (CLM->MLM: its two parts).
    steps_of, fraction_of, per_step_of = {}, {}, {}
    for name in {*args.objectives, "mlm", "clm"} - {"clm_mlm"}:
        config = run_config(name, 0, spm, corpus_file)
        per_step_of[name], fraction_of[name] = flops_per_step(config, os.path.join(args.root, "n"))
    train_tokens = train_split_tokens(spm, corpus_file, args.root)
    mlm_epoch_steps = train_tokens / (BATCH * LENGTH)
    budget_per_epoch = per_step_of["mlm"] * mlm_epoch_steps
    if "clm_mlm" in args.objectives:
        per_step_of["clm_mlm"] = (
            CLM_SHARE * per_step_of["clm"] + (1 - CLM_SHARE) * per_step_of["mlm"]
        )
        fraction_of["clm_mlm"] = (
            CLM_SHARE * fraction_of["clm"] + (1 - CLM_SHARE) * fraction_of["mlm"]
        )
    print(
        f"U = {train_tokens} train tokens ({mlm_epoch_steps:.1f} MLM steps of {BATCH}x{LENGTH} "
        f"per epoch); one epoch's budget {budget_per_epoch / 1e12:.3f} TFLOP",
        flush=True,
    )

    # Seeds outermost: a grid stopped early has every cell at fewer seeds. Each finished run is
    # appended to runs.jsonl under --root, and a rerun with the same settings reuses it.
    done = _load_runs(args.root)
    timings: dict = {}  # objective -> [(steps, seconds, steady step seconds)]
    for seed in args.seeds:
        for epochs in args.epochs:
            for name in args.objectives:
                steps = max(2, round(epochs * budget_per_epoch / per_step_of[name]))
                steps_of[(name, epochs)] = steps
                key = f"{name}/e{epochs}/s{seed}/{steps}/{train_tokens}/{args.finetune_steps}"
                if args.from_runs or (
                    key in done and set(args.tasks) <= set(done[key]["finetune"])
                ):
                    continue
                workdir = os.path.join(args.root, f"{name}_e{epochs}_s{seed}")
                config = run_config("mlm" if name == "clm_mlm" else name, seed, spm, corpus_file)
                row = pretrain(config, steps, workdir, name == "clm_mlm")
                timings.setdefault(name, []).append((steps, row["seconds"], row["step_seconds"]))
                accuracies = {
                    task: finetune(workdir, task, seed, args.finetune_steps, f"{workdir}_ft_{task}")
                    for task in args.tasks
                }
                done[key] = {"row": row, "finetune": accuracies}
                with open(os.path.join(args.root, RUNS), "a") as f:
                    f.write(json.dumps({"key": key, **done[key]}) + "\n")
                print(f"{name} E={epochs} seed={seed}: {json.dumps(done[key])}", flush=True)
    # The floor: the same backbone at its random init (two steps at a vanishing LR), fine-tuned.
    baseline = {t: [] for t in args.tasks}
    for seed in args.seeds:
        key = f"none/s{seed}/{train_tokens}/{args.finetune_steps}"
        if not args.from_runs and (
            key not in done or not set(args.tasks) <= set(done[key]["finetune"])
        ):
            workdir = os.path.join(args.root, f"none_s{seed}")
            config = run_config("mlm", seed, spm, corpus_file)
            config.optim.learning_rate = 1e-12  # must be > 0; moves no weight measurably
            row = pretrain(config, 2, workdir, False)
            accuracies = {
                task: finetune(workdir, task, seed, args.finetune_steps, f"{workdir}_ft_{task}")
                for task in args.tasks
            }
            done[key] = {"row": row, "finetune": accuracies}
            with open(os.path.join(args.root, RUNS), "a") as f:
                f.write(json.dumps({"key": key, **done[key]}) + "\n")
        for task in args.tasks:
            if key in done:
                baseline[task].append(done[key]["finetune"][task])
    results: dict = {name: {} for name in args.objectives}
    for name in args.objectives:
        for epochs in args.epochs:
            cell = {"likelihood": [], "own": [], "finetune": {t: [] for t in args.tasks}}
            keys = [
                f"{name}/e{epochs}/s{seed}/{steps_of[(name, epochs)]}/{train_tokens}/"
                f"{args.finetune_steps}"
                for seed in args.seeds
            ]
            if not all(k in done for k in keys):  # --from-runs: a cell not run with every seed
                continue
            for run in (done[k] for k in keys):
                likelihood, own = held_out_loss(name, run["row"])
                cell["likelihood"].append(likelihood)
                cell["own"].append(own)
                for task in args.tasks:
                    cell["finetune"][task].append(run["finetune"][task])
            cell["likelihood"] = (
                cell["likelihood"] if None not in cell["likelihood"] else [None] * len(args.seeds)
            )
            results[name][epochs] = cell
    if timings:
        print(estimate(args, train_tokens, budget_per_epoch, per_step_of, timings), flush=True)

    lines = [
        f"U = {train_tokens} unique train tokens (built-in corpus, first documents), "
        f"B={BATCH}, T={LENGTH}, bert_tiny's encoder, vocab {VOCAB}; budget = E x one MLM epoch "
        f"({budget_per_epoch / 1e12:.3f} TFLOP); seeds {args.seeds}; fine-tuning "
        f"{args.finetune_steps} steps. Median (range).",
        "",
        "| objective | loss-carrying fraction | GFLOP per loss token | "
        + " | ".join(
            f"E={e}: steps, NLL/token, own loss, " + ", ".join(f"{t} acc" for t in args.tasks)
            for e in args.epochs
        )  # fmt: skip
        + " |",
        "|---|---|---|" + "---|" * len(args.epochs),
    ]
    for name in args.objectives:
        per_token = per_step_of[name] / (BATCH * LENGTH * fraction_of[name])
        cells = []
        for e in args.epochs:
            if e not in results[name]:
                cells.append("-")
                continue
            c = results[name][e]
            accs = ", ".join(_stat(c["finetune"][t]) for t in args.tasks)
            cells.append(
                f"{steps_of[(name, e)]}, {_stat(c['likelihood'])}, {_stat(c['own'])}, {accs}"
            )
        lines.append(
            f"| {name} | {fraction_of[name]:.3f} | {per_token / 1e9:.3f} | "
            + " | ".join(cells)
            + " |"
        )
    lines += [
        "",
        "The same fine-tuning from the backbone at its random initialization (no pretraining): "
        + ", ".join(f"{t} acc {_stat(baseline[t])}" for t in args.tasks)
        + ".",
    ]
    print("\n".join(lines))
    png = os.path.join(ROOT, "docs", "results", "data_constrained.png")
    if not args.no_record:
        plot(results, args.epochs, args.tasks, png, baseline)
        today = datetime.date.today().isoformat()
        with open(os.path.join(ROOT, "docs", "results", "comparisons.md"), "a") as f:
            f.write(
                f"\n## Data-constrained objectives ({today}, "
                "benchmarks/comparisons/data_constrained.py)\n\n"
                + "\n".join(lines)
                + "\n\n![loss and dev accuracy against epochs](data_constrained.png)\n"
            )
    else:
        plot(results, args.epochs, args.tasks, os.path.join(args.root, "data_constrained.png"),
             baseline)  # fmt: skip


if __name__ == "__main__":
    main()
