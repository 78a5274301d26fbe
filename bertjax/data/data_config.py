"""The data sub-config (`config.data`) and the checks that reject bad values by key."""

from __future__ import annotations

import ml_collections

SAMPLE_PLANS = ("nsp", "sop", "pairs", "full_sentences", "doc_sentences", "mlm", "token_windows")
MASKINGS = ("token", "whole_word", "ngram", "diffusion", "pert", "causal")
PAIR_PLANS = ("nsp", "sop")  # plans whose rows are sentence pairs with a label
MASK_TOKEN_WEIGHTINGS = ("uniform", "smoothed_unigram")
CORPUS_FORMATS = ("sentences", "documents", "jsonl", "parquet")


def default_data_config() -> ml_collections.ConfigDict:
    """The data sub-config with defaults: `config.data`, beside `config.seed` and `batch_size`."""
    c = ml_collections.ConfigDict()
    c.corpus = "builtin"  # "builtin" | file path or glob (comma-separated ok) | "tfds:NAME[:SPLIT]"
    # files: "sentences" (line = sentence, blank line = new doc) | "documents" (line = doc) |
    # "jsonl" | "parquet" (record = doc, its text_feature field)
    c.corpus_format = "sentences"
    c.text_feature = "text"  # tfds, jsonl, parquet: the string field that holds a document
    # hf://datasets/OWNER/NAME[@REVISION] without a glob: the files of this subset ("" = the
    # dataset card's default) and split of the card's configs (docs/hub.md)
    c.hf_subset = ""
    c.hf_split = "train"  # the card's split of that subset whose files are read
    # Read the corpus's files directly as the batches need them (token_windows rows, tokenized on
    # the fly, each process its own files): no store is prepared; Colab and small runs
    # (bertjax/data/stream/)
    c.stream = False
    # A store prepared by `python -m bertjax.data.prepare` (path or gs://, s3:// URL): train from
    # it, reading only this host's rows; "" = tokenize the corpus into the local cache
    c.store = ""
    # Several stores with sampling weights, ((URL, weight), ...), and weight changes,
    # ((step, (weight, ...)), ...): bertjax/data/mixture.py (the rule for changes on resume)
    c.mixture = ()  # ((URL, weight), ...); () = the one store or corpus above
    c.mixture_changes = ()  # ((step, (weight, ...)), ...): new weights from that step on
    # store: bound of the in-memory caches of blocks of one host, all together: train and eval
    # splits, a mixture's stores and config.data.workers processes (an equal share a process; -1:
    # chosen from the batch's bytes, bertjax/data/read_settings.py)
    c.store_cache_bytes = -1
    c.shard_bytes = 512 << 20  # prepare: token data per shard (0.5 GiB)
    c.block_tokens = 16 << 10  # prepare: tokens per read and checksum unit of a shard (48 KiB)
    c.tfds_data_dir = ""  # tfds: data_dir passed to tfds.data_source ("" = tfds default)
    c.language = "en"  # "en" | "zh" (zh: word boundaries from jieba, `pip install bertjax[zh]`)
    # path to a SentencePiece .model ("" = train one into WORKDIR/tokenizer/)
    c.tokenizer_model = ""
    # path to a Hugging Face vocab.txt or tokenizer.json (overrides tokenizer_model)
    c.hf_vocab = ""
    c.lowercase = True  # hf vocab.txt only: lowercase + strip accents (uncased BERT)
    c.vocab_size = 8000  # size of the SentencePiece model trained when none is given
    c.tokenizer_type = "unigram"  # "unigram" | "bpe" for the trained SentencePiece model
    c.max_seq_length = 128  # longest row length T, [CLS] and [SEP]s included
    # How rows are formed (bertjax/data/plans/samples.py): "nsp" | "sop" (sentence pairs with a
    # label), "pairs" (consecutive A, B of one document, no label: PERT), "full_sentences" |
    # "doc_sentences" (RoBERTa) | "mlm" (doc_sentences, short-sequence noise) | "token_windows"
    # (the token stream cut every T - 2 tokens, rows by index). Every plan starts a store of
    # any size; the sentence plans read the index of the pieces their rows fall in
    c.sample_plan = "nsp"
    # sentence plans: a plan per piece of about this many tokens of whole documents, so start-up
    # and memory do not grow with the store (bertjax/data/plans/piece_plans.py); token_windows:
    # rows read in windows of pieces of this many tokens (at most a quarter of a shard)
    c.piece_tokens = 1 << 20
    # a global batch is cut into lanes of this many rows, each reading its own pieces, so that a
    # host plans and reads about its own rows whatever the host count (bertjax/data/plans/
    # epoch_order.py; 0 = one lane; lanes only where it divides config.batch_size). Before its
    # first batch a host plans the 4 pieces of each lane its rows fall in (one host of 256 rows:
    # 4; in lanes of 32 rows it planned 32, up to 32 M tokens); a host of fewer rows than a lane
    # plans the lane's pieces as they turn over (results.md, 2026-12-06)
    c.lane_rows = 256
    c.short_seq_prob = 0.1  # nsp/sop/mlm: chance a document targets a random shorter length
    # "token" | "whole_word" | "ngram" | "diffusion" | "pert" (PERT: n-gram selection, a share
    # of it shuffled, targets are positions; needs config.loss.objective="pert") | "causal" (no
    # selection: every position's target is the next token, bertjax/data/corruption/causal.py;
    # objective clm)
    c.masking = "token"
    c.mask_rate = 0.15  # fraction of maskable (real, non-special) tokens to predict
    c.max_predictions = 20  # P, width of masked_positions/ids/weights (diffusion: always T)
    # held-out batches: mask rate (0 = mask_rate; BERT's 0.15 keeps evals comparable)
    c.eval_mask_rate = 0.0
    c.eval_max_predictions = 0  # held-out batches: P (0 = max_predictions)
    # of predicted tokens: replaced by [MASK] (or a similar token if correction)
    c.mask_token_prob = 0.8
    # of predicted tokens: replaced by a random token (the rest stay as is)
    c.random_token_prob = 0.1
    # token masking, training batches: "uniform" | "smoothed_unigram" (DistilBERT: a token is
    # picked with probability proportional to max(count, 1) ** -mask_token_smoothing, counts of the
    # training split); held-out batches stay uniform so evals compare across recipes
    c.mask_token_weighting = "uniform"
    c.mask_token_smoothing = 0.7  # smoothed_unigram: the exponent (HF distillation's mlm_smoothing)
    c.ngram_max = 3  # ngram masking: spans of 1..ngram_max whole words
    c.ngram_weights = ()  # ngram masking: weight per n (() = proportional to 1/n, as ALBERT)
    # MacBERT (whole_word/ngram masking): one 80/10/10 decision per selected word; the word
    # becomes one of its similar words (same number of pieces) instead of [MASK], else a random word
    c.correction = False
    # correction: TSV "word<TAB>sim1 sim2 ..." or .npy embedding matrix [V, D]
    c.similar_words_file = ""
    c.diffusion_eps = 1e-3  # diffusion: t ~ U(eps, 1) per row
    # causal: share of input tokens replaced by [MASK] in training rows (targets stay; 0 = none)
    c.input_mask_rate = 0.0
    c.permute_prob = 0.9  # pert: share of the selected tokens shuffled (the rest stay in place)
    c.pack_rows = False  # pack several short samples per row (segment_ids 1, 2, ...; 0 = pad)
    c.length_schedule = ()  # () = always max_seq_length; else ((fraction_of_steps, length), ...)
    # False: schedule is consecutive phases; True: per-step choice by fraction
    c.mixed_lengths = False
    c.heldout_fraction = 0.02  # fraction of documents (by hash of their id) kept for eval
    # local cache of token stores and downloaded files ("" = $BERTJAX_CACHE_DIR, else
    # bertjax-cache under the system temp dir); see bertjax/data/prepare.py
    c.cache_dir = ""
    c.num_workers = 0  # tokenization processes while preparing the store (0 = in-process)
    # How a sharded store is read (-1: chosen from the store and the batch, logged once:
    # bertjax/data/read_settings.py; a local store: 2 batches ahead on one thread, as before)
    c.prefetch = -1  # batches computed ahead in the background (0 = none)
    c.prefetch_threads = -1  # reads (of read_steps batches each) computed and in flight at once
    c.read_steps = -1  # consecutive batches whose rows are read together, in one round of ranges
    c.read_threads = -1  # threads sending one read's ranges on a synchronous filesystem (gcsfuse)
    c.read_gap_bytes = -1  # bytes read between two needed blocks of a shard rather than a range
    # processes computing prefetched batches instead (0 = threads of this process); each opens
    # the store itself: more cores for planning and masking (benchmarks/data/reader_throughput.py)
    c.workers = 0
    # resume from a checkpoint saved with another data plan version (bertjax/data/
    # plan_version.py): the remaining steps then read this bertjax's rows, not the saved run's
    c.allow_plan_change = False
    c.lock()  # a misspelled key is an error, not a new field
    return c


def _fail(key: str, value, why: str):
    raise ValueError(f"config.data.{key}={value!r}: {why}")


def _check_prob(c, key):
    v = c[key]
    if not 0.0 <= v <= 1.0:
        _fail(key, v, "must be in [0, 1]")


def validate(config) -> None:
    """Raises ValueError naming the key for any invalid data-config value."""
    if "data" not in config:
        raise ValueError(
            "config has no `data` field: set config.data = bertjax.data.default_data_config()"
        )
    for key in ("seed", "batch_size"):
        if key not in config:
            raise ValueError(
                f"config.{key} is missing: the data pipeline needs config.seed and "
                "config.batch_size"
            )
    if config.batch_size < 1:
        raise ValueError(f"config.batch_size={config.batch_size!r}: must be >= 1")
    c = config.data
    if c.corpus_format not in CORPUS_FORMATS:
        _fail("corpus_format", c.corpus_format, f"must be one of {CORPUS_FORMATS}")
    if c.language not in ("en", "zh"):
        _fail("language", c.language, "must be 'en' or 'zh'")
    if c.tokenizer_type not in ("unigram", "bpe"):
        _fail("tokenizer_type", c.tokenizer_type, "must be 'unigram' or 'bpe'")
    if c.vocab_size < 16:
        _fail("vocab_size", c.vocab_size, "must be >= 16")
    if c.max_seq_length < 8:
        _fail("max_seq_length", c.max_seq_length, "must be >= 8")
    if c.sample_plan not in SAMPLE_PLANS:
        _fail("sample_plan", c.sample_plan, f"must be one of {SAMPLE_PLANS}")
    if int(c.piece_tokens) < 1:
        _fail("piece_tokens", c.piece_tokens, "must be >= 1 (tokens per piece of a sentence plan)")
    if c.sample_plan == "token_windows" and c.pack_rows:
        _fail("pack_rows", c.pack_rows, "token_windows rows are full already: set it False")
    if c.masking not in MASKINGS:
        _fail("masking", c.masking, f"must be one of {MASKINGS}")
    if c.masking == "diffusion" and c.sample_plan in PAIR_PLANS:
        _fail(
            "sample_plan",
            c.sample_plan,
            "diffusion masking needs single-segment rows (e.g. 'full_sentences')",
        )
    for key in (
        "short_seq_prob",
        "mask_rate",
        "mask_token_prob",
        "random_token_prob",
        "heldout_fraction",
        "permute_prob",
    ):
        _check_prob(c, key)
    if c.mask_rate == 0:
        _fail("mask_rate", c.mask_rate, "must be > 0")
    if c.mask_token_prob + c.random_token_prob > 1.0 + 1e-9:
        _fail(
            "random_token_prob",
            c.random_token_prob,
            "mask_token_prob + random_token_prob must be <= 1",
        )
    if c.max_predictions < 1:
        _fail("max_predictions", c.max_predictions, "must be >= 1")
    if not 0.0 <= c.eval_mask_rate <= 1.0:
        _fail("eval_mask_rate", c.eval_mask_rate, "must be in [0, 1] (0: use mask_rate)")
    if c.eval_max_predictions < 0:
        _fail(
            "eval_max_predictions", c.eval_max_predictions, "must be >= 0 (0: use max_predictions)"
        )
    if c.mask_token_weighting not in MASK_TOKEN_WEIGHTINGS:
        _fail(
            "mask_token_weighting",
            c.mask_token_weighting,
            f"must be one of {MASK_TOKEN_WEIGHTINGS}",
        )
    if c.mask_token_weighting != "uniform" and c.masking != "token":
        _fail(
            "mask_token_weighting",
            c.mask_token_weighting,
            f"weights tokens for masking='token', not {c.masking!r}",
        )
    if c.mask_token_smoothing < 0:
        _fail("mask_token_smoothing", c.mask_token_smoothing, "must be >= 0")
    if c.ngram_max < 1:
        _fail("ngram_max", c.ngram_max, "must be >= 1")
    weights = tuple(c.ngram_weights)
    if weights and (len(weights) != c.ngram_max or min(weights) < 0 or sum(weights) <= 0):
        _fail(
            "ngram_weights",
            weights,
            f"need {c.ngram_max} non-negative weights (one per n) with a positive sum",
        )
    if not 0.0 <= c.input_mask_rate < 1.0:
        _fail("input_mask_rate", c.input_mask_rate, "must be in [0, 1)")
    if c.input_mask_rate and c.masking != "causal":
        _fail("input_mask_rate", c.input_mask_rate, f"masks causal rows, not masking={c.masking!r}")
    if not 0.0 < c.diffusion_eps < 1.0:
        _fail("diffusion_eps", c.diffusion_eps, "must be in (0, 1)")
    if c.correction and c.masking not in ("whole_word", "ngram"):
        _fail(
            "correction",
            c.correction,
            f"MacBERT's correction replaces whole words: needs masking 'whole_word' or 'ngram', "
            f"not {c.masking!r}",
        )
    if c.correction and not c.similar_words_file:
        _fail(
            "similar_words_file",
            c.similar_words_file,
            "correction=True needs a similarity file (TSV or .npy)",
        )
    if c.pack_rows and c.masking == "pert":
        _fail(
            "pack_rows",
            c.pack_rows,
            "pert masking shuffles tokens within a row: packed samples would trade tokens",
        )
    if c.pack_rows and c.sample_plan in (*PAIR_PLANS, "pairs"):
        _fail(
            "pack_rows",
            c.pack_rows,
            f"sample_plan={c.sample_plan!r} makes [CLS] A [SEP] B [SEP] rows; packing needs "
            "single-segment rows",
        )
    schedule = tuple(tuple(p) for p in c.length_schedule)
    if schedule:
        if any(len(p) != 2 for p in schedule):
            _fail("length_schedule", schedule, "must be pairs (fraction_of_steps, length)")
        fractions = [f for f, _ in schedule]
        if min(fractions) <= 0 or abs(sum(fractions) - 1.0) > 1e-6:
            _fail("length_schedule", schedule, "fractions must be positive and sum to 1")
        for _, length in schedule:
            if not 8 <= length <= c.max_seq_length:
                _fail(
                    "length_schedule",
                    schedule,
                    f"every length must be in [8, max_seq_length={c.max_seq_length}]",
                )
    if c.mixture and c.store:
        _fail("store", c.store, "set config.data.store or config.data.mixture, not both")
    if c.stream:
        if c.store or c.mixture:
            _fail("stream", c.stream, "reads config.data.corpus: leave store and mixture unset")
        if c.corpus == "builtin" or c.corpus.startswith("tfds:"):
            _fail("stream", c.stream, "reads files (paths, URLs, hf://): not builtin or tfds:")
        if c.sample_plan != "token_windows" or c.pack_rows or c.length_schedule:
            _fail(
                "stream",
                c.stream,
                "gives token_windows rows of max_seq_length: set config.data.sample_plan="
                "token_windows (no pack_rows, no length_schedule)",
            )
        if c.mask_token_weighting != "uniform" or c.correction or c.workers:
            _fail(
                "stream",
                c.stream,
                "masks uniformly in this process: leave mask_token_weighting='uniform', "
                "correction=False and workers=0",
            )
    for entry in tuple(c.mixture):
        if len(entry) != 2 or not isinstance(entry[0], str) or not float(entry[1]) > 0:
            _fail("mixture", tuple(c.mixture), "must be pairs (store URL, weight > 0)")
    for entry in tuple(c.mixture_changes):
        if len(entry) != 2 or min(entry[1], default=0) < 0 or sum(entry[1]) <= 0:
            _fail("mixture_changes", tuple(c.mixture_changes), "must be pairs (step, weights)")
    for key in ("shard_bytes", "block_tokens"):
        if c[key] <= 0:
            _fail(key, c[key], "must be > 0")
    for key in ("store_cache_bytes", "prefetch_threads", "read_steps", "read_threads"):
        if c[key] != -1 and c[key] < 1:
            _fail(key, c[key], "must be >= 1, or -1 (chosen from the store)")
    for key in ("prefetch", "read_gap_bytes"):
        if c[key] < -1:
            _fail(key, c[key], "must be >= 0, or -1 (chosen from the store)")
    if c.lane_rows < 0:
        _fail("lane_rows", c.lane_rows, "must be >= 0 (0: one lane)")
    if c.num_workers < 0:
        _fail("num_workers", c.num_workers, "must be >= 0")
    if c.workers < 0 or (c.workers and 0 <= c.prefetch < c.workers):
        _fail("workers", c.workers, "must be >= 0 and at most config.data.prefetch")


def ngram_probabilities(c) -> tuple[float, ...]:
    """Probability of each span length n = 1..ngram_max (1/n-proportional unless weighted)."""
    weights = tuple(c.ngram_weights) or tuple(1.0 / n for n in range(1, c.ngram_max + 1))
    total = float(sum(weights))
    return tuple(float(w) / total for w in weights)
