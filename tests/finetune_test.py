"""Fine-tuning: task metrics, BIO alignment, best checkpoint, FGM, init_from (bertjax and HF)."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax import BertConfig, trainer
from bertjax import step as step_lib
from bertjax.data.tokenizer import Tokenizer
from bertjax.interop.checkpoints import tokenizer_meta
from bertjax.interop.pretrained import PretrainedSource
from bertjax.objectives import fgm, finetune
from bertjax.tasks import task_metrics as evaluation
from bertjax.tasks import tasks as tasks_data
from bertjax.training import checkpoint as checkpoint_lib
from bertjax.training import sharding
from bertjax.training import step as step_internals
from bertjax.training.best import BestCheckpoint

WORDS = (
    "the a is of to and file socket thread lock read write open close send receive data "
    "path line loop task wait run start stop error value name call"
).split()
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
PIECES = SPECIALS + WORDS + ["##s", "##ing", "##ed", ".", ","] + [f"w{i}" for i in range(40)]


# ---- metrics against hand-computed values ----


def test_classification_metrics_by_hand():
    pred, gold = [1, 1, 0, 0, 1, 0], [1, 0, 0, 1, 1, 0]  # tp=2 fp=1 fn=1 tn=2
    assert evaluation.accuracy(pred, gold) == pytest.approx(4 / 6)
    assert evaluation.f1_binary(pred, gold) == pytest.approx(2 * 2 / (2 * 2 + 1 + 1))
    # MCC = (tp*tn - fp*fn) / sqrt((tp+fp)(tp+fn)(tn+fp)(tn+fn)) = (4-1)/sqrt(3*3*3*3) = 1/3
    assert evaluation.matthews_corrcoef(pred, gold) == pytest.approx(1 / 3)
    assert evaluation.matthews_corrcoef([1, 1, 1], [1, 0, 1]) == 0.0  # constant prediction
    assert evaluation.matthews_corrcoef([0, 1, 2], [0, 1, 2]) == pytest.approx(1.0)


def test_correlations_by_hand():
    x, y = [1.0, 2.0, 3.0, 4.0], [2.0, 4.0, 5.0, 9.0]
    # mean-centred: x' = -1.5,-.5,.5,1.5; y' = -3,-1,0,4; sum x'y' = 4.5+.5+0+6 = 11
    expected = 11 / np.sqrt(5.0 * (9 + 1 + 0 + 16))
    assert evaluation.pearson(x, y) == pytest.approx(expected)
    np.testing.assert_allclose(evaluation.average_ranks([10, 20, 20, 5]), [2, 3.5, 3.5, 1])
    # ranks x: 1,2,3,4; ranks y with a tie: 1, 2.5, 2.5, 4 -> Pearson of those
    ranks_y = np.array([1, 2.5, 2.5, 4])
    assert evaluation.spearman(x, [1, 3, 3, 7]) == pytest.approx(
        evaluation.pearson([1, 2, 3, 4], ranks_y)
    )
    assert evaluation.spearman(x, [1, 3, 3, 7]) == pytest.approx(4.5 / np.sqrt(5 * 4.5))
    assert evaluation.pearson([1, 1, 1], [1, 2, 3]) == 0.0


def test_entity_f1_exact_span_match():
    assert evaluation.bio_spans(["B-PER", "I-PER", "O", "B-LOC", "I-ORG"]) == {
        (0, 2, "PER"),
        (3, 4, "LOC"),
        (4, 5, "ORG"),
    }
    assert evaluation.bio_spans(["I-LOC", "I-LOC"]) == {(0, 2, "LOC")}  # seqeval's lenient start
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "O"]]
    pred = [["B-PER", "O", "O", "B-LOC"], ["B-ORG", "O"]]  # PER span cut short: a miss
    result = evaluation.entity_f1(pred, gold)
    assert result["entity_precision"] == pytest.approx(2 / 3)
    assert result["entity_recall"] == pytest.approx(2 / 3)
    assert result["entity_f1"] == pytest.approx(2 / 3)


def test_sequence_metrics_and_better():
    assert set(evaluation.sequence_metrics([0, 1], [0, 1], 2)) == {"accuracy", "matthews", "f1"}
    assert set(evaluation.sequence_metrics([0.1, 0.9], [0, 1], 1)) == {"pearson", "spearman", "mse"}
    assert evaluation.better("accuracy", 0.6, 0.5) and not evaluation.better("loss", 0.6, 0.5)


# ---- data ----


@pytest.fixture(scope="module")
def vocab_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    path.write_text("\n".join(PIECES) + "\n")
    return str(path)


def test_bio_first_piece_labelling(vocab_file):
    tok = Tokenizer(vocab_file)
    words, tags = ["reading", "files", "now"], [1, 2, 0]  # "now" is unknown: one [UNK] piece
    rows = tasks_data.encode_words(tok, [words], [tags], 12)
    ids = list(rows["input_ids"][0])
    read, ing, file, s = (tok.pieces.index(p) for p in ("read", "##ing", "file", "##s"))
    assert ids[:7] == [tok.cls_id, read, ing, file, s, tok.unk_id, tok.sep_id]
    np.testing.assert_array_equal(rows["label_weights"][0][:8], [0, 1, 0, 1, 0, 1, 0, 0])
    np.testing.assert_array_equal(rows["labels"][0][[1, 3, 5]], tags)
    np.testing.assert_array_equal(rows["word_positions"][0][:4], [1, 3, 5, -1])
    cut = tasks_data.encode_words(
        tok, [words], [tags], 5
    )  # [CLS] read ##ing [SEP]: only word 1 fits
    assert cut["label_weights"][0].sum() == 1 and cut["input_ids"][0][3] == tok.sep_id


def test_pairs_cut_longest_first(vocab_file):
    tok = Tokenizer(vocab_file)
    rows = tasks_data.encode_pairs(tok, ["the file is open and data"], ["lock"], 8)
    ids, types = rows["input_ids"][0], rows["token_type_ids"][0]
    assert (
        ids[0] == tok.cls_id
        and list(ids).count(tok.sep_id) == 2
        and rows["attention_mask"][0].sum() == 8
    )
    np.testing.assert_array_equal(types, [0, 0, 0, 0, 0, 0, 1, 1])


def test_builtin_code_span_tags():
    words = "Raises ValueError when os.path.join() or read_file fails.".split()
    assert tasks_data.code_span_tags(words) == ["O", "B-EXC", "O", "B-CODE", "O", "B-CODE", "O"]
    assert tasks_data.code_span_tags(["call", "foo_bar", "x.y", "now"])[1:3] == ["B-CODE", "I-CODE"]
    assert tasks_data.family_of("doc:json.decoder.JSONDecoder.decode") == "text"
    assert tasks_data.family_of("doc:asyncio.tasks.gather") == "concurrency"
    assert tasks_data.family_of("topic:if") is None


# ---- best checkpoint ----


class _State:
    def __init__(self, step):
        self.step, self.params, self.opt_state = (
            jnp.int32(step),
            {"w": jnp.full((2,), step, jnp.float32)},
            {},
        )

    def replace(self, **kw):
        new = _State(0)
        new.__dict__.update(self.__dict__, **kw)
        return new


def test_best_checkpoint_keeps_the_best_dev_metric(tmp_path):
    best = BestCheckpoint(str(tmp_path), "accuracy")
    written = []

    def writer(path):
        written.append(path)
        with open(path, "w") as f:
            f.write(f"{len(written)}\n")

    for step, acc in ((1, 0.5), (2, 0.7), (3, 0.6)):
        best.update(step, {"eval/accuracy": acc, "eval/loss": 1.0}, _State(step), {"x": 1}, writer)
    best.close()
    assert len(written) == 2
    info = json.load(open(tmp_path / "best" / "best.json"))
    assert info["step"] == 2 and info["value"] == 0.7
    assert open(tmp_path / "best" / "dev_predictions.tsv").read() == "2\n"
    ckpt = checkpoint_lib.Checkpointer(str(tmp_path / "best"), async_save=False)
    assert ckpt.all_steps() == [2]
    state, _ = ckpt.restore(_State(0))
    np.testing.assert_array_equal(state.params["w"], [2, 2])
    ckpt.close()
    again = BestCheckpoint(str(tmp_path), "accuracy")  # a resumed run remembers it
    assert again.value == 0.7 and not again.update(
        4, {"eval/accuracy": 0.65}, _State(4), {}, writer
    )
    with pytest.raises(KeyError, match="config.task.metric"):
        again.update(5, {"eval/f1": 0.9}, _State(5), {}, writer)
    again.close()


# ---- FGM ----

TINY = dict(
    vocab_size=len(PIECES),
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=64,
    max_position_embeddings=32,
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
)


def _ft_config(objective="classification", num_labels=3, **loss):
    config = finetune.add_finetune_config(trainer.default_run_config(), objective, num_labels)
    config.batch_size, config.num_train_steps, config.progress_bar = 8, 2, False
    config.peak_flops_per_device = 1e12  # skip measuring the CPU for MFU
    config.loss.update(loss)
    return config


@pytest.fixture(scope="module")
def tiny_state():
    cfg = BertConfig.preset("tiny", **TINY)
    mesh = sharding.make_mesh(_ft_config().mesh, devices=jax.devices()[:1])
    state = step_lib.init_train_state(_ft_config(), cfg, mesh, jax.random.key(0))
    rng = np.random.default_rng(0)
    batch = {
        "input_ids": jnp.asarray(rng.integers(5, len(PIECES), (4, 10)), jnp.int32),
        "token_type_ids": jnp.zeros((4, 10), jnp.int32),
        "attention_mask": jnp.ones((4, 10), jnp.int32),
        "labels": jnp.asarray([0, 1, 2, 1], jnp.int32),
        "label_weights": jnp.ones(4),
    }
    return cfg, state, batch


@jax.jit
def _fgm_grads(state, batch):
    """(step gradients at eps=0, plain jax.grad of the loss, step gradients at eps=0.5): one
    compile."""

    def step_grads(epsilon):
        spec = step_lib.StepSpec(
            state.spec.model_cfg, finetune.Classification(num_labels=3, fgm_epsilon=epsilon)
        )
        return step_internals._gradients(state.replace(spec=spec), batch, jax.random.key(1))[0]

    objective = finetune.Classification(num_labels=3, fgm_epsilon=0.0)
    direct = jax.grad(
        lambda p: objective.total_loss(
            objective.loss_sums(
                objective.apply(state.spec.model(), {"params": p}, batch, None, True), batch
            ),
            objective.normalizers(batch),
        )
    )(state.params)
    return step_grads(0.0), direct, step_grads(0.5)


def test_fgm_changes_the_gradient_and_is_off_at_zero(tiny_state):
    _, state, batch = tiny_state
    clean, direct, adversarial = _fgm_grads(state, batch)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), clean, direct)
    zero = fgm.fgm_perturbation(clean, 0.0)  # the adversarial pass at eps=0 is the clean pass
    assert all(float(jnp.abs(z).max()) == 0 for z in jax.tree.leaves(zero))
    r = fgm.fgm_perturbation(clean, 0.5)["bert"]["embeddings"]["word_embeddings"]
    assert float(jnp.linalg.norm(r)) == pytest.approx(0.5, rel=1e-4)
    diff = jax.tree.map(lambda a, b: float(jnp.abs(a - 2 * b).max()), adversarial, clean)
    assert max(jax.tree.leaves(diff)) > 1e-6  # clean + adversarial != 2 x clean


# ---- init_from ----


def _assert_tree_equal(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    jax.tree.map(lambda x, y: np.testing.assert_array_equal(np.asarray(x), np.asarray(y)), a, b)


def test_init_from_bertjax_checkpoint_loads_exactly_the_encoder(tmp_path, vocab_file, tiny_state):
    cfg, ft_state, _ = tiny_state
    tok = Tokenizer(vocab_file)
    pre_cfg = cfg
    pre_config = trainer.default_run_config()
    mesh = sharding.make_mesh(pre_config.mesh, devices=jax.devices()[:1])
    pre_state = step_lib.init_train_state(pre_config, pre_cfg, mesh, jax.random.key(7))
    ckpt = checkpoint_lib.Checkpointer(str(tmp_path / "pre" / "checkpoints"), async_save=False)
    ckpt.save(pre_state, {"model_config": pre_cfg.to_dict(), **tokenizer_meta(tok)})
    ckpt.close()
    source = PretrainedSource(str(tmp_path / "pre"), "config.init_from")
    tokenizer = Tokenizer(source.tokenizer_file(str(tmp_path / "ft")))
    assert source.model_config() == pre_cfg and tokenizer.fingerprint() == tok.fingerprint()

    def load():
        return source.params()["bert"]

    merged = finetune.merge_encoder(ft_state.params, load(), "pre")
    _assert_tree_equal(merged["bert"], pre_state.params["bert"])
    _assert_tree_equal(merged["classifier"], ft_state.params["classifier"])
    no_pooler = {
        **ft_state.params,
        "bert": {k: v for k, v in ft_state.params["bert"].items() if k != "pooler"},
    }  # a token-classification model
    assert "pooler" not in finetune.merge_encoder(no_pooler, load(), "pre")["bert"]
    wrong = load()
    wrong["embeddings"]["word_embeddings"] = wrong["embeddings"]["word_embeddings"][:10]
    with pytest.raises(ValueError, match="embeddings.*has shape"):
        finetune.merge_encoder(ft_state.params, wrong, "pre")


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory, vocab_file):
    import torch
    import transformers

    path = tmp_path_factory.mktemp("hf_bert")
    vocab = open(vocab_file).read().split("\n")[:-1]
    hf_cfg = transformers.BertConfig(
        vocab_size=len(vocab),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=40,
        num_labels=2,
    )
    torch.manual_seed(0)
    transformers.BertForSequenceClassification(hf_cfg).save_pretrained(str(path))
    (path / "vocab.txt").write_text(open(vocab_file).read())
    return str(path)


@pytest.mark.slow
def test_hf_checkpoint_fine_tunes_end_to_end(tmp_path, hf_dir):
    rng = np.random.default_rng(0)
    for split, n in (("train", 24), ("dev", 10)):
        with open(tmp_path / f"{split}.tsv", "w") as f:
            f.write("sentence\tother\tlabel\n")
            for _ in range(n):
                label = int(rng.integers(2))
                words = rng.choice(WORDS[6:12] if label else WORDS[12:18], 5)
                other = " ".join(rng.choice(WORDS, 3))
                f.write(f"{' '.join(words)}\t{other}\t{'yes' if label else 'no'}\n")
    config = _ft_config(num_labels=2)
    config.init_from = hf_dir
    config.task.update(
        source="files",
        train_file=str(tmp_path / "train.tsv"),
        dev_file=str(tmp_path / "dev.tsv"),
        text_column="sentence",
        text_pair_column="other",
    )
    config.data.max_seq_length = 16
    config.eval_every, config.checkpoint_every, config.log_every = 2, 0, 1
    summary = trainer.train_and_evaluate(config, str(tmp_path / "run"))
    assert summary["step"] == 2 and 0.0 <= summary["eval/accuracy"] <= 1.0
    assert {"eval/f1", "eval/matthews"} <= set(summary)
    lines = open(tmp_path / "run" / "best" / "dev_predictions.tsv").read().splitlines()
    assert len(lines) == 11 and lines[0].split("\t") == ["text", "text_pair", "predicted", "gold"]
    source = PretrainedSource(hf_dir, "config.init_from")
    tokenizer = Tokenizer(source.tokenizer_file(str(tmp_path / "x")))
    from bertjax import convert

    _assert_tree_equal(source.params()["bert"], convert.from_hf(hf_dir)[1]["bert"])
    cfg = source.model_config()
    assert tokenizer.path.endswith("vocab.txt") and cfg.vocab_size == tokenizer.vocab_size
