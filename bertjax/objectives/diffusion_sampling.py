"""Text generation from a masked-diffusion encoder (LLaDA's semi-autoregressive remasking sampler).

The answer starts as `answer_length` [MASK]s after the prompt and is split into blocks of
`block_length`, filled left to right; each block gets steps·block_length/answer_length denoising
steps. A step predicts every masked position of the sequence, then commits k of the current block's
masked positions, k = ceil(masked in block / steps left in block): the block's masks spread evenly
over its steps, the remainder one per step first (LLaDA's `get_num_transfer_tokens`). Which ones:
the most confident predictions (`low_confidence` remasking) or random ones (`random`). Predictions
are argmax(logits/temperature + Gumbel), greedy at temperature 0 (`sample_tokens`). The prompt is
never changed, and [PAD]/[UNK]/[CLS]/[MASK] are never generated ([SEP] may be: it ends the text).

Precision of the Gumbel draw. LLaDA's ``generate.py`` samples in float64 on purpose: following
Zheng et al. 2024 (arXiv:2409.02908), low-precision Gumbel-max truncates the noise's upper tail,
which lowers the effective temperature and the diversity of samples. Here the uniform u of
-log(-log u) is built from 64 random bits (two 32-bit draws), with -log u taken as log1p of the
exact 1 - u on the upper half, so the noise reaches ~45 (2^-65 from 1) on every platform, where
float32 uniforms stop at ~16 (`gumbel_from_bits`). With ``jax_enable_x64`` on a CPU or GPU the
noise and the scores logits/T + G are float64, as LLaDA's; with x64 off (JAX's default) and on
TPUs (no float64) they are float32: the same tail, rounded to float32 (2^-24 relative).

Run: python -m bertjax.diffusion --workdir=DIR --prompt="..." [--answer_length=32 --steps=32
--block_length=8]
"""

from __future__ import annotations

import functools
import tempfile

import jax
import jax.numpy as jnp
import numpy as np

from bertjax.data.tokenizer import Tokenizer
from bertjax.interop.checkpoints import CheckpointReader
from bertjax.modeling.bert_config import BertConfig
from bertjax.modeling.heads import BertForPreTraining

Array = jax.Array
REMASKING = ("low_confidence", "random")


def step_schedule(answer_length: int, steps: int, block_length: int) -> tuple[int, int]:
    """(blocks, steps per block); raises ValueError naming the argument that does not divide."""
    if answer_length < 1 or block_length < 1 or steps < 1:
        raise ValueError(
            f"answer_length={answer_length}, block_length={block_length}, steps={steps}: "
            "all must be >= 1"
        )
    if answer_length % block_length:
        raise ValueError(f"block_length={block_length} must divide answer_length={answer_length}")
    blocks = answer_length // block_length
    if steps % blocks:
        raise ValueError(
            f"steps={steps} must be a multiple of the number of blocks "
            f"answer_length/block_length={blocks}"
        )
    return blocks, steps // blocks


def _forbidden(cfg: BertConfig) -> Array:
    """[V] bool: ids never generated ([PAD], [UNK], [CLS], [MASK])."""
    ids = [
        i
        for i in (cfg.pad_token_id, cfg.unk_token_id, cfg.cls_token_id, cfg.mask_token_id)
        if i is not None
    ]
    return jnp.zeros((cfg.vocab_size,), bool).at[jnp.asarray(ids, jnp.int32)].set(True)


def sampling_dtype():
    """float64 where JAX has it (x64 enabled, not a TPU), else float32: see the module docstring."""
    if jax.config.jax_enable_x64 and jax.default_backend() != "tpu":
        return jnp.float64
    return jnp.float32


def gumbel_from_bits(high: Array, low: Array, dtype=jnp.float32) -> Array:
    """Gumbel noise -log(-log u), u = (high * 2^32 + low + 1/2) / 2^64 from two uint32 arrays.

    u never reaches 0 or 1 and has 64 bits of resolution; -log u is computed from u itself below
    1/2 and as -log1p(-(1 - u)) above, with 1 - u built exactly from the complemented bits, so
    the tail near u = 1 keeps its resolution in float32 too.
    """
    two32, two64 = 2.0**32, 2.0**-64
    upper = high >= jnp.uint32(1 << 31)
    u = (high.astype(dtype) * two32 + low.astype(dtype) + 0.5) * two64
    one_minus_u = ((~high).astype(dtype) * two32 + (~low).astype(dtype) + 0.5) * two64
    minus_log_u = jnp.where(
        upper, -jnp.log1p(-jnp.where(upper, one_minus_u, 0.0)), -jnp.log(jnp.where(upper, 0.5, u))
    )
    return -jnp.log(minus_log_u)


def sample_tokens(logits_BTV: Array, temperature, rng) -> Array:
    """argmax(logits / T + Gumbel) per position (a draw from softmax(logits / T)); argmax at T=0."""
    dtype = sampling_dtype()
    bits = jax.random.bits(rng, (2, *logits_BTV.shape), jnp.uint32)
    gumbel_BTV = gumbel_from_bits(bits[0], bits[1], dtype)
    logits_BTV = logits_BTV.astype(dtype)
    noisy_BTV = jnp.where(
        temperature > 0, logits_BTV / jnp.maximum(temperature, 1e-6) + gumbel_BTV, logits_BTV
    )
    return jnp.argmax(noisy_BTV, axis=-1)


def _denoise_step(
    cfg,
    params,
    x_BT,
    rng,
    temperature,
    index,
    *,
    prompt_length,
    block_length,
    steps_per_block,
    remasking,
):
    """One denoising step `index` (0-based over all steps): returns the new x [B, L]."""
    mask_id = cfg.mask_token_id
    length = x_BT.shape[1]
    block = index // steps_per_block
    steps_left = steps_per_block - index % steps_per_block
    block_start = prompt_length + block * block_length
    logits_BTV = (
        BertForPreTraining(cfg, next_sentence=False)
        .apply({"params": params}, x_BT, deterministic=True)["mlm_logits"]
        .astype(jnp.float32)
    )
    logits_BTV = jnp.where(_forbidden(cfg), -jnp.inf, logits_BTV)
    noise_rng, pick_rng = jax.random.split(rng)
    x0_BT = sample_tokens(logits_BTV, temperature, noise_rng).astype(x_BT.dtype)
    if remasking == "low_confidence":
        probs_BTV = jax.nn.softmax(logits_BTV, axis=-1)
        confidence_BT = jnp.take_along_axis(probs_BTV, x0_BT[..., None], -1)[..., 0]
    else:
        confidence_BT = jax.random.uniform(pick_rng, x_BT.shape)
    position = jnp.arange(length)[None, :]
    in_block = (position >= block_start) & (position < block_start + block_length)
    candidate_BT = (x_BT == mask_id) & in_block
    masked_B = jnp.sum(candidate_BT, -1)
    commit_B = (masked_B + steps_left - 1) // steps_left  # ceil: the schedule's share of this step
    score_BT = jnp.where(candidate_BT, confidence_BT, -jnp.inf)
    rank_BT = jnp.argsort(jnp.argsort(-score_BT, axis=-1, stable=True), axis=-1, stable=True)
    commit_BT = candidate_BT & (rank_BT < commit_B[:, None])
    return jnp.where(commit_BT, x0_BT, x_BT)


@functools.partial(
    jax.jit,
    static_argnames=(
        "cfg",
        "answer_length",
        "steps",
        "block_length",
        "remasking",
        "return_history",
    ),
)
def _generate(
    cfg,
    params,
    prompt_ids,
    rng,
    temperature,
    *,
    answer_length,
    steps,
    block_length,
    remasking,
    return_history,
):
    blocks, steps_per_block = step_schedule(answer_length, steps, block_length)
    batch, prompt_length = prompt_ids.shape
    x = jnp.concatenate(
        [
            prompt_ids.astype(jnp.int32),
            jnp.full((batch, answer_length), cfg.mask_token_id, jnp.int32),
        ],
        axis=1,
    )
    step = functools.partial(
        _denoise_step,
        cfg,
        params,
        prompt_length=prompt_length,
        block_length=block_length,
        steps_per_block=steps_per_block,
        remasking=remasking,
    )

    def body(x, index):
        x = step(x, jax.random.fold_in(rng, index), temperature, index)
        return x, (x if return_history else None)

    x, history = jax.lax.scan(body, x, jnp.arange(blocks * steps_per_block))
    return (x, history) if return_history else x


def generate(
    model_cfg: BertConfig,
    params,
    prompt_ids,
    *,
    answer_length: int,
    steps: int,
    block_length: int,
    remasking: str = "low_confidence",
    temperature: float = 0.0,
    rng=None,
    mask_id: int | None = None,
    return_history: bool = False,
):
    """Samples answers after `prompt_ids` [B, Lp]: [B, Lp + answer_length] ids (+ [steps, B, L]
    history).

    Jitted once per (config, shapes, answer_length, steps, block_length, remasking); temperature and
    rng are traced. `mask_id` defaults to the config's [MASK] id.
    """
    if remasking not in REMASKING:
        raise ValueError(f"remasking={remasking!r}: must be one of {REMASKING}")
    if temperature < 0:
        raise ValueError(f"temperature={temperature}: must be >= 0")
    step_schedule(answer_length, steps, block_length)
    prompt_ids = jnp.asarray(prompt_ids, jnp.int32)
    if prompt_ids.ndim != 2:
        raise ValueError(
            f"prompt_ids has shape {prompt_ids.shape}: expected [batch, prompt_length]"
        )
    total = prompt_ids.shape[1] + answer_length
    if total > model_cfg.max_position_embeddings - model_cfg.position_offset:
        raise ValueError(
            f"prompt ({prompt_ids.shape[1]}) + answer_length ({answer_length}) = {total} tokens "
            f"exceeds the model's {model_cfg.max_position_embeddings - model_cfg.position_offset} "
            "positions"
        )
    if mask_id is not None and mask_id != model_cfg.mask_token_id:
        model_cfg = model_cfg.replace(mask_token_id=int(mask_id))
    if model_cfg.mask_token_id is None:
        raise ValueError(
            "generate needs a [MASK] id: pass mask_id= or set BertConfig.mask_token_id"
        )
    rng = jax.random.key(0) if rng is None else rng
    return _generate(
        model_cfg,
        params,
        prompt_ids,
        rng,
        jnp.float32(temperature),
        answer_length=answer_length,
        steps=steps,
        block_length=block_length,
        remasking=remasking,
        return_history=return_history,
    )


def load(workdir: str):
    """(model config, params, tokenizer) of the latest checkpoint in WORKDIR/checkpoints."""
    reader = CheckpointReader(workdir, "--workdir")
    model_cfg = reader.model_config()
    params = reader.params()
    reader.close()
    path = reader.write_tokenizer(tempfile.mkdtemp(prefix="bertjax-tokenizer-"))
    data = reader.meta.get("config", {}).get("data", {})  # the run's case handling too
    tokenizer = Tokenizer(
        path, language=data.get("language", "en"), lowercase=data.get("lowercase", True)
    )
    return model_cfg, params, tokenizer


def generate_text(model_cfg, params, tokenizer, prompts, *, seed: int = 0, **kwargs) -> list[str]:
    """Continuations of text prompts (`[CLS] prompt` then the answer); prompts of one length share a
    batch."""
    encoded = [
        np.concatenate([[tokenizer.cls_id], ids]).astype(np.int32)
        for ids in tokenizer.encode(prompts)
    ]
    out: list[str] = [""] * len(prompts)
    for length in sorted({len(e) for e in encoded}):
        rows = [i for i, e in enumerate(encoded) if len(e) == length]
        ids = generate(
            model_cfg,
            params,
            np.stack([encoded[i] for i in rows]),
            rng=jax.random.key(seed),
            **kwargs,
        )
        for i, row in zip(rows, np.asarray(ids)):
            out[i] = tokenizer.decode(row[length:])
    return out


def main(argv=None):
    """`python -m bertjax.diffusion --workdir=DIR --prompt=...`: one continuation per prompt."""
    from bertjax import cli

    parser = cli.ArgumentParser(prog="python -m bertjax.diffusion", description=main.__doc__)
    parser.add_argument(
        "--workdir", required=True, help="training workdir (its checkpoints/ and tokenizer)"
    )
    parser.add_argument("--prompt", action="append", required=True, help="prompt text (repeatable)")
    parser.add_argument("--answer_length", type=int, default=32)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--block_length", type=int, default=8)
    parser.add_argument("--remasking", choices=REMASKING, default="low_confidence")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    with cli.input_errors(args.verbosity >= cli.VERBOSE):  # bad input: one line (bertjax/cli.py)
        model_cfg, params, tokenizer = load(args.workdir)
    texts = generate_text(
        model_cfg,
        params,
        tokenizer,
        args.prompt,
        seed=args.seed,
        answer_length=args.answer_length,
        steps=args.steps,
        block_length=args.block_length,
        remasking=args.remasking,
        temperature=args.temperature,
    )
    for prompt, text in zip(args.prompt, texts):
        print(f"{prompt} ||| {text}")
    return texts
