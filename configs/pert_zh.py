"""PERT (Cui, Yang & Liu 2022, "PERT: Pre-training BERT with Permuted Language Model", arXiv
2203.06906; ymcui/PERT): a BERT-base encoder trained only with the permuted language model.

From the paper (§3) and the ymcui/PERT README:
- the input keeps every token: no [MASK]; no NSP/SOP;
- whole-word + n-gram selection of 15% of the input, spans of 1-4 words at 40/30/20/10%;
- of the selected tokens 90% are shuffled among themselves, 10% stay (negative samples);
- at each selected position the model predicts the position of the original token in the
  shuffled input (README: "位置2（明）→位置3（表）"): a softmax over the row's positions;
- BERT-base (12 layers, 768 wide), Google's Chinese vocabulary (21128), sequences of 512, the
  EXT corpus of MacBERT (Wikipedia, encyclopedias, news, QA: 5.4B words), released as an
  ordinary BERT checkpoint (fine-tune with --config.init_from=WORKDIR, as any other).
Not verified in this session (the paper's §4 table could not be read here): optimizer, batch
size, steps and learning rate; the keys below repeat configs/macbert_zh.py's (LAMB 1e-4, batch
256, 10k warmup, 1M steps); check them against §4 before a full run.
- rows are `[CLS] A [SEP] B [SEP]` with segment embeddings (the README's figure, pics/pert.png),
  so token type B trains for pair tasks; PERT has no sentence-pair task, so B is always the
  continuation of A in one document (sample_plan "pairs": SOP's pairs, never swapped).
Choice of this project: the position head is BERT's MLM transform scored against every
position's final hidden state (bertjax/objectives/pert.py).

Data:    sample_plan="pairs": consecutive [CLS] A [SEP] B [SEP] pairs (PERT's input), planned per ~1
         M-token piece of the store (bertjax/data/plans/piece_plans.py), so a sharded store of any
         size starts from its manifest and each host reads only its own pieces' index.
Slice:   v5e-16 (16 chips for batch 256 x 512)
         check it: python -m bertjax.compile --config=configs/pert_zh.py --topology=v5e-16
Run:     pip install 'bertjax[zh]'
         python train.py --config=configs/pert_zh.py --workdir=DIR \\
             --config.data.corpus='/data/zh/*.txt'
         then fine-tune: python train.py --config=configs/finetune_glue.py \\
             --config.init_from=DIR --workdir=FT
Expect:  eval/pert_loss below the best text-blind guess (own position with the share of
         targets that point at themselves, else uniform). Measured only at toy scale: the tiny
         English run of tests/pert_test.py (2 layers, width 32, T=64, 150 steps, 3 seeds; measured
         with single-segment rows, before rows became A/B pairs) goes
         from pert_loss 8.4-9.2 (first 10 steps) to held-out 3.23 (median; 3.11-3.31) against
         the guess's 3.46; its held-out pert_accuracy 0.22 (0.22-0.27) is about the 0.25 of
         targets that point at themselves: it learns which tokens moved, not yet where to.
"""

from bertjax.trainer import default_run_config, model_config_dict, recipe_variant


def get_config(variant=""):
    config = default_run_config()
    config.model = model_config_dict("base", dtype="bfloat16")
    config.loss.objective = "pert"  # the permuted LM: logits over positions
    config.mlm_bias_init = "zeros"  # PERT has no MLM head
    config.batch_size = 256
    config.num_train_steps = 1_000_000
    config.data.corpus = "data/zh/*.txt"  # your Chinese corpus
    config.data.language = "zh"
    config.data.vocab_size = 21128
    config.data.max_seq_length = 512
    config.data.max_predictions = 80  # 15% of 512
    config.data.sample_plan = "pairs"  # [CLS] A [SEP] B [SEP], B consecutive; no NSP/SOP
    config.data.masking = "pert"
    config.data.mask_rate = 0.15
    config.data.ngram_max = 4
    config.data.ngram_weights = (0.4, 0.3, 0.2, 0.1)
    config.data.permute_prob = 0.9  # 90% shuffled, 10% kept
    config.optim.name = "lamb"
    config.optim.learning_rate = 1e-4
    config.optim.base_batch_size = 256
    config.optim.warmup_steps = 10_000
    config.log_every = 100
    config.eval_every = 10_000
    config.checkpoint_every = 10_000
    return recipe_variant(config, variant)
