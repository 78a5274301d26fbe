"""Trains the tiny default recipe from a token store (a test helper, run as a script).

    python store_worker.py PORT PROCESS_ID NUM_PROCESSES DEVICES WORKDIR STORE SPM STEPS

joins a localhost `jax.distributed` run when NUM_PROCESSES > 1, with DEVICES CPU devices per
process, and trains STEPS steps from the sharded store STORE ("" = the built-in local-cache path
on the same corpus files) into WORKDIR, with a checkpoint every STEPS // 2 steps.
"""

import os
import sys

CORPUS_ENV = "BERTJAX_TEST_CORPUS"  # the corpus files of the local-cache path


def main(port, process_id, num_processes, devices, workdir, store, spm, steps) -> None:
    import jax

    jax.config.update("jax_num_cpu_devices", int(devices))
    jax.config.update("jax_default_matmul_precision", "highest")
    if int(num_processes) > 1:
        jax.distributed.initialize(
            f"127.0.0.1:{port}", num_processes=int(num_processes), process_id=int(process_id),
            initialization_timeout=60,
        )  # fmt: skip
    from bertjax import trainer

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    config = trainer.load_config_file(os.path.join(root, "configs", "bert_tiny.py"))
    config.batch_size, config.num_train_steps = 8, int(steps)
    config.data.max_seq_length, config.data.max_predictions = 32, 5
    config.data.store, config.data.tokenizer_model = store, spm
    config.data.corpus, config.data.heldout_fraction = os.environ[CORPUS_ENV], 0.05
    config.model.hidden_size, config.model.num_attention_heads = 32, 2
    config.model.intermediate_size = 64
    config.optim.warmup_steps, config.log_every, config.eval_every = 1, 1, 0
    config.checkpoint_every, config.progress_bar = int(steps) // 2, False
    config.fast_compile = True
    config.peak_flops_per_device = 1e12  # no CPU matmul peak measured at start (~1 s)
    trainer.train_and_evaluate(config, workdir)
    if int(num_processes) > 1:
        jax.distributed.shutdown()


if __name__ == "__main__":
    main(*sys.argv[1:9])
