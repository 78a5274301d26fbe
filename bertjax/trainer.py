"""`train_and_evaluate(config, workdir)`: the pretraining loop behind `train.py`.

The loop only moves data and calls the jitted step: batch `s` comes from the data
pipeline as a pure function of the step, metrics stay on device until a log step,
checkpoints are written asynchronously, and a restart resumes from the last complete
checkpoint with bit-identical results. SIGTERM/SIGINT save the current step and stop.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import time

import jax
import ml_collections
import numpy as np

from bertjax import checkpoint as checkpoint_lib
from bertjax import metrics as metrics_lib
from bertjax import objectives, sharding
from bertjax import step as step_lib
from bertjax.config import BertConfig
from bertjax.data import make_pipeline
from bertjax.data.config import PAIR_OBJECTIVES

# Model fields the tokenizer decides; a run config never sets them.
_TOKENIZER_FIELDS = (
    "vocab_size",
    "pad_token_id",
    "unk_token_id",
    "cls_token_id",
    "sep_token_id",
    "mask_token_id",
)


def model_config_dict(preset: str, **overrides) -> ml_collections.ConfigDict:
    """``config.model``: every BertConfig field of a preset except the tokenizer's ids/size."""
    fields = BertConfig.preset(preset, **overrides).to_dict()
    return ml_collections.ConfigDict(
        {k: v for k, v in fields.items() if k not in _TOKENIZER_FIELDS}
    )


def default_run_config() -> ml_collections.ConfigDict:
    """Every key a pretraining run reads, with defaults; configs/*.py start from this."""
    from bertjax.data import default_data_config

    config = step_lib.default_step_config()  # seed, batch_size, skip_nonfinite, optim, mesh, loss
    config.num_train_steps = 1000  # optimizer steps; the LR schedule spans them
    config.optim.total_steps = config.get_ref("num_train_steps")
    config.model = model_config_dict("tiny")  # BertConfig fields (vocab and special ids: tokenizer)
    config.data = default_data_config()
    config.log_every = 50  # steps between train-metric fetches (the only host syncs)
    config.eval_every = 500  # steps between held-out evals (0: no eval)
    config.eval_batches = 8  # held-out batches per eval (fixed, same every eval)
    config.checkpoint_every = 500  # steps between checkpoints (0: only at the end)
    config.keep_checkpoints = 3  # complete checkpoints kept
    config.async_checkpoints = True  # save in the background while training continues
    config.mlm_bias_init = (
        "unigram"  # new models: "unigram" (log token frequencies) | "zeros" (BERT)
    )
    config.peak_flops_per_device = 0.0  # for MFU; 0 = by device kind, CPU measured at start
    config.progress_bar = True  # tqdm bar with loss, tokens/s, MFU and ETA (process 0)
    return config


def model_config(config: ml_collections.ConfigDict, tokenizer) -> BertConfig:
    """The BertConfig of a run: ``config.model`` plus the tokenizer's vocabulary and ids."""
    fields = dict(config.model.to_dict())
    fields.update(
        vocab_size=tokenizer.vocab_size,
        pad_token_id=tokenizer.pad_id,
        unk_token_id=tokenizer.unk_id,
        cls_token_id=tokenizer.cls_id,
        sep_token_id=tokenizer.sep_id,
        mask_token_id=tokenizer.mask_id,
    )
    try:
        return BertConfig.from_dict(fields)
    except ValueError as error:
        raise ValueError(f"config.model: {error}") from error


def validate_run_config(config: ml_collections.ConfigDict) -> None:
    """Cross-field checks that no single sub-config can make."""
    for key in ("num_train_steps", "batch_size", "log_every", "checkpoint_every", "eval_every"):
        if int(config[key]) < 0 or (
            key in ("num_train_steps", "batch_size", "log_every") and int(config[key]) == 0
        ):
            raise ValueError(f"config.{key}={config[key]!r}: must be positive")
    if config.get("mlm_bias_init", "zeros") not in ("unigram", "zeros"):
        raise ValueError(
            f"config.mlm_bias_init={config.mlm_bias_init!r}: must be 'unigram' or 'zeros'"
        )
    pairs = config.data.objective in PAIR_OBJECTIVES
    if config.loss.objective == "pretraining" and bool(config.loss.next_sentence) != pairs:
        raise ValueError(
            f"config.loss.next_sentence={config.loss.next_sentence} but config.data.objective="
            f"{config.data.objective!r} {'has' if pairs else 'has no'} sentence pairs: set "
            f"--config.loss.next_sentence={pairs}"
        )
    if config.optim.total_steps != config.num_train_steps:
        logging.warning(
            "config.optim.total_steps=%s differs from num_train_steps=%s",
            config.optim.total_steps,
            config.num_train_steps,
        )


def init_mlm_bias(state, log_prior: np.ndarray):
    """Sets the MLM decoder bias of a new model to the corpus' log unigram frequencies (a model
    then starts at the unigram loss; a zero bias spends hundreds of Adam steps of ~lr each getting
    there). Works on any mesh and process count; a state without an MLM head is returned as is."""
    head = state.params.get("mlm_head", {})
    if "bias" not in head:
        return state
    bias = head["bias"]
    if bias.shape != log_prior.shape:
        raise ValueError(
            f"unigram prior of shape {log_prior.shape} does not fit the MLM bias "
            f"{bias.shape}: tokenizer and model disagree on the vocabulary size"
        )
    values = np.asarray(log_prior, bias.dtype)
    new_bias = jax.make_array_from_callback(bias.shape, bias.sharding, lambda index: values[index])
    return state.replace(params={**state.params, "mlm_head": {**head, "bias": new_bias}})


def _prepare_workdir(workdir: str) -> str:
    workdir = os.path.abspath(workdir)
    try:
        os.makedirs(workdir, exist_ok=True)
        probe = os.path.join(workdir, f".write-test-{os.getpid()}")
        with open(probe, "w") as f:
            f.write("ok")
        os.remove(probe)
    except OSError as error:
        raise ValueError(f"workdir {workdir!r} is not writable: {error}") from error
    return workdir


class _StopSignal:
    """Turns SIGTERM/SIGINT into a flag the loop checks after each step."""

    def __init__(self):
        self.received: int | None = None
        self._previous = {}
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread: leave signals alone
                pass

    def _handle(self, signum, frame):
        self.received = signum

    def restore(self):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def evaluate(steps, state, pipeline, mesh, config) -> dict:
    """Held-out metrics over fixed eval batches: the objective's metrics of the summed loss
    sums and normalizers (exact averages), MLM perplexity, and the majority baseline."""
    totals = None
    counts: dict[int, int] = {}
    predictions = []
    for batch in pipeline.eval_batches(int(config.eval_batches)):
        if "masked_ids" in batch:
            ids = batch["masked_ids"][batch["masked_weights"] > 0]
            for token, count in zip(*np.unique(ids, return_counts=True)):
                counts[int(token)] = counts.get(int(token), 0) + int(count)
        out = steps.eval(state, sharding.global_batch(batch, mesh, config.batch_size))
        parts = jax.device_get({"sums": out["sums"], "norms": out["norms"]})
        if "predictions" in out:  # fine-tuning: task metrics need every dev prediction on host
            predictions.append(jax.device_get(out["predictions"]))
        totals = parts if totals is None else jax.tree.map(np.add, totals, parts)
    if totals is None:
        return {}
    result = {
        k: float(v)
        for k, v in state.spec.objective.metrics(totals["sums"], totals["norms"]).items()
    }
    if "mlm_loss" in result:
        result["perplexity"] = math.exp(min(result["mlm_loss"], 50.0))
    if counts:  # guessing the single most frequent masked token: the floor to beat
        result["majority_baseline"] = max(counts.values()) / sum(counts.values())
    if predictions:
        result.update(pipeline.score(np.concatenate(predictions)))
    return result


def _meta(config, model_cfg, pipeline) -> dict:
    return {
        "config": config.to_dict(),
        "model_config": model_cfg.to_dict(),
        "store_fingerprint": pipeline.store.fingerprint,
        **checkpoint_lib.tokenizer_meta(pipeline.tokenizer),
    }


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict:
    """Pretrains as configured, resuming from ``workdir`` if it holds checkpoints."""
    validate_run_config(config)
    workdir = _prepare_workdir(workdir)
    is_chief = jax.process_index() == 0
    # A fine-tuning objective brings its task data, which knows an init_from checkpoint's model.
    objective = objectives.make_objective(config.loss)
    pipeline = (objective.make_data if hasattr(objective, "make_data") else make_pipeline)(
        config, workdir
    )
    model_cfg = getattr(pipeline, "model_cfg", None) or model_config(config, pipeline.tokenizer)
    mesh = sharding.make_mesh(config.mesh)
    abstract, shardings, init_fn = step_lib.abstract_train_state(config, model_cfg, mesh)
    ckpt = checkpoint_lib.Checkpointer(
        os.path.join(workdir, "checkpoints"),
        keep=int(config.keep_checkpoints),
        async_save=bool(config.async_checkpoints),
    )
    if ckpt.latest_step() is not None:
        meta = ckpt.read_meta()
        checkpoint_lib.check_compatible(
            meta, model_cfg, pipeline.tokenizer.fingerprint(), ckpt.directory
        )
        state, _ = ckpt.restore(abstract)
        logging.info("resumed from step %d in %s", int(state.step), ckpt.directory)
    else:
        state = jax.jit(init_fn, out_shardings=shardings)(jax.random.key(config.seed))
        if config.get("mlm_bias_init", "zeros") == "unigram" and hasattr(
            pipeline, "unigram_log_prior"
        ):
            state = init_mlm_bias(state, pipeline.unigram_log_prior())
        if hasattr(pipeline, "pretrained_params"):  # fine-tuning: config.init_from's encoder
            state = state.replace(params=pipeline.pretrained_params(state.params))
        if hasattr(pipeline, "teacher_state"):  # distillation: the teacher, and the student from it
            state = pipeline.teacher_state(state)
    steps = step_lib.jit_steps(state, mesh)
    model = state.spec.model()

    def last_layer_rows(host_batch):  # for the FLOP count: rows a sparse last layer computes
        if not hasattr(model, "last_layer_rows") or "masked_positions" not in host_batch:
            return None
        return model.last_layer_rows(host_batch["masked_positions"].shape[1])

    meta = _meta(config, model_cfg, pipeline)
    writer = metrics_lib.MetricWriter(workdir, enabled=is_chief)
    stop = _StopSignal()
    dropout_rng = jax.random.key(config.seed + 1)
    peak = metrics_lib.peak_flops(float(config.peak_flops_per_device))
    num_devices = jax.device_count()
    total = int(config.num_train_steps)
    start = int(jax.device_get(state.step))
    progress = None
    if is_chief and config.progress_bar and start < total:
        from tqdm.auto import tqdm

        progress = tqdm(total=total, initial=start, unit="step", dynamic_ncols=True)
    history, unchecked, summary = [], [], {}
    tokens = flops = 0.0
    window_start = time.perf_counter()

    def check_finite():
        """Fetches pending non-finite flags; stops the run before bad params are saved."""
        flags = jax.device_get([m["nonfinite"] for m in unchecked])
        unchecked.clear()
        bad = int(np.sum(flags))
        if bad and not config.skip_nonfinite_updates:
            ckpt.wait()
            raise FloatingPointError(
                f"non-finite loss or gradient before step {current}; the last good checkpoint "
                f"({ckpt.latest_step()}) in {ckpt.directory} is kept. Lower the learning rate, "
                "check the data, or set --config.skip_nonfinite_updates=True"
            )
        return bad

    current = start
    try:
        for current in range(start, total):
            host_batch = pipeline.batch(current)
            batch_tokens = float(np.sum(host_batch["attention_mask"])) * jax.process_count()
            masked = float(np.sum(host_batch.get("masked_weights", 0) > 0)) * jax.process_count()
            length = host_batch["input_ids"].shape[1]
            tokens += batch_tokens
            flops += config.batch_size * metrics_lib.train_flops_per_sequence(
                model_cfg, length, masked / config.batch_size, last_layer_rows(host_batch)
            )
            batch = sharding.global_batch(host_batch, mesh, config.batch_size)
            state, step_metrics = steps.train(state, batch, dropout_rng)
            history.append(step_metrics)
            unchecked.append(step_metrics)
            done = current + 1
            last = done == total or stop.received is not None
            if done % config.log_every == 0 or last:
                fetched = jax.device_get(history)
                history = []
                skipped = check_finite()
                elapsed = time.perf_counter() - window_start
                scalars = {f"train/{k}": v for k, v in metrics_lib.mean_metrics(fetched).items()}
                scalars.update(
                    {
                        "train/skipped_updates": skipped,
                        "perf/tokens_per_second": tokens / elapsed,
                        "perf/steps_per_second": len(fetched) / elapsed,
                        "perf/mfu": metrics_lib.mfu(
                            flops / len(fetched), elapsed / len(fetched), num_devices, peak
                        ),
                    }
                )
                writer.write_scalars(done, scalars)
                summary.update(scalars)
                if progress is not None:
                    progress.set_postfix(
                        loss=f"{scalars['train/loss']:.3f}",
                        tok_s=f"{scalars['perf/tokens_per_second']:.0f}",
                        mfu=f"{scalars['perf/mfu']:.1%}",
                    )
                tokens = flops = 0.0
                window_start = time.perf_counter()
            if progress is not None:
                progress.update(1)
            if config.eval_every and (done % config.eval_every == 0 or done == total):
                result = {
                    f"eval/{k}": v
                    for k, v in evaluate(steps, state, pipeline, mesh, config).items()
                }
                writer.write_scalars(done, result)
                summary.update(result)
                if result and is_chief:
                    line = " ".join(f"{k[5:]}={v:.4g}" for k, v in result.items())
                    (progress.write if progress is not None else print)(f"step {done}: {line}")
                if result and hasattr(pipeline, "after_eval"):  # fine-tuning: keep WORKDIR/best
                    pipeline.after_eval(done, result, state, meta)
                window_start = time.perf_counter()  # eval time is not training throughput
            # Read the signal once: one that lands after this line is handled at the next step,
            # so a stop always saves first.
            stopping = stop.received is not None
            if (
                (config.checkpoint_every and done % config.checkpoint_every == 0)
                or done == total
                or stopping
            ):
                check_finite()
                ckpt.save(state, meta, force=True)
            if stopping:
                logging.warning("signal %d: saved step %d, stopping", stop.received, done)
                break
        if start >= total and config.eval_every:  # already trained: report the held-out metrics
            summary.update(
                {f"eval/{k}": v for k, v in evaluate(steps, state, pipeline, mesh, config).items()}
            )
    finally:
        stop.restore()
        if progress is not None:
            progress.close()
        ckpt.close()
        writer.close()
        pipeline.close()
    summary["step"] = int(jax.device_get(state.step))
    summary["stopped_by_signal"] = stop.received is not None
    return summary
