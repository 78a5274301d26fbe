"""Masked-diffusion language models: the public face of `bertjax.objectives.diffusion` (the
objective, SFT batches) and `bertjax.objectives.diffusion_sampling` (LLaDA's sampler).

Run: python -m bertjax.diffusion --workdir=DIR --prompt="..." [--answer_length=32 --steps=32]
"""

from bertjax.objectives.diffusion import MaskedDiffusion, add_diffusion_config, sft_batch
from bertjax.objectives.diffusion_sampling import generate, generate_text, load, main

__all__ = [
    "MaskedDiffusion",
    "add_diffusion_config",
    "generate",
    "generate_text",
    "load",
    "main",
    "sft_batch",
]

if __name__ == "__main__":
    main()
