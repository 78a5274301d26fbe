"""MacBERT (Cui et al. 2020, "Revisiting Pre-Trained Models for Chinese NLP"): whole-word n-gram
masking (1-4 words at 40/30/20/10%), "MLM as correction" and SOP.

Correction, per the paper (§3; ymcui/MacBERT released no pretraining code): one 80/10/10 decision
per selected word (n-gram spans decide word by word); 80%: the word becomes ONE of its similar
words, all its pieces at once (a random word when it has none), 10%: a random word, 10%: kept.
The model predicts the original tokens at their positions. Choices where the paper is silent: a
similar word must have as many pieces as the word (others in the file are dropped, so rows keep
their length and targets their positions; with BERT's character vocabulary this is "as many
characters"); a random word is a word of the similarity file with as many pieces (random pieces
when it lists none of that length). See bertjax/data/corruption/similarity.py and
masking._correct_words.

Data:    sample_plan="sop": ALBERT's sentence-order pairs (the paper's input), planned per
         ~1 M-token piece of the store (bertjax/data/plans/piece_plans.py), so a sharded store of
         any size starts from its manifest and each host reads only its own pieces' index.
Slice:   v5p-32 (16 chips for batch 2560 x 128; the source trained on TPU v3)
         check it: python -m bertjax.compile --config=configs/macbert_zh.py --topology=v5p-32
Run:     pip install 'bertjax[zh]'
         python train.py --config=configs/macbert_zh.py --workdir=DIR \
             --config.data.corpus='/data/zh/*.txt' \
             --config.data.similar_words_file=/data/zh/similar.tsv
         (similar.tsv: "word<TAB>similar1 similar2 ..." per line, e.g. from the Synonyms toolkit
         MacBERT used; or a .npy [V, D] embedding matrix: one-piece words and their nearest pieces)
             --config.init_from=/models/bert-base-chinese   # Google's Chinese BERT (HF dir)
Expect:  no [MASK] token in the inputs: a masked word is wholly one similar word ~80% of the time
         (tests/data_masking_test.py measures 0.80 +- 0.02), a random word otherwise.

The schedule as HFL's recipes (ymcui/MacBERT and ymcui/Chinese-BERT-wwm READMEs): LAMB, from
Google's Chinese BERT (pretraining ``init_from``), 100K steps at 128 with batch 2560, then 100K
at 512 with batch 384. Word boundaries from jieba where HFL used LTP. Not in the READMEs,
chosen here: peak LR 1e-4, 10% warmup and linear decay in each phase (reset_time).
"""

from bertjax.trainer import default_run_config, model_config_dict, phase, recipe_variant


def get_config(variant=""):
    config = default_run_config()
    config.model = model_config_dict("base", dtype="bfloat16")
    config.mlm_bias_init = "zeros"  # BERT's init of the MLM decoder bias (the paper's)
    config.init_from = ""  # Google's Chinese BERT (an HF directory): the recipe starts from it
    config.batch_size = 2560
    config.num_train_steps = 200_000
    config.data.corpus = "data/zh/*.txt"  # your Chinese corpus
    config.data.language = "zh"
    config.data.vocab_size = 21128
    config.data.max_seq_length = 128
    config.data.max_predictions = 20
    config.data.sample_plan = "sop"
    config.data.masking = "ngram"
    config.data.ngram_max = 4
    config.data.ngram_weights = (0.4, 0.3, 0.2, 0.1)
    config.data.correction = True  # per word: one similar word, all its pieces
    config.data.similar_words_file = "data/zh/similar_words.tsv"  # your similarity table
    config.optim.name = "lamb"
    config.optim.learning_rate = 1e-4
    config.optim.base_batch_size = 2560
    config.optim.warmup_steps = 0
    config.optim.warmup_fraction = 0.1
    config.log_every = 100
    config.eval_every = 10_000
    config.checkpoint_every = 10_000
    config.phase_order = ("seq128", "seq512")
    config.phases.seq128 = phase(steps=100_000)
    config.phases.seq512 = phase(
        steps=100_000, batch_size=384, data={"max_seq_length": 512, "max_predictions": 80}
    )
    return recipe_variant(config, variant)
