"""Distillation tests: the triple loss, student init from teacher layers, a frozen teacher."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
import two_process_worker as setup

import bertjax
from bertjax import step
from bertjax.objectives import distill
from bertjax.training import checkpoint, sharding

LENGTH, PREDICTIONS, VOCAB = 16, 4, 128


def _cfg(layers):
    return bertjax.BertConfig.preset(
        "tiny",
        vocab_size=VOCAB,
        hidden_size=32,
        num_attention_heads=2,
        intermediate_size=64,
        num_hidden_layers=layers,
        max_position_embeddings=LENGTH,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )


def _batch(seed=0, batch=8):
    rs = np.random.RandomState(seed)
    attention_mask = np.ones((batch, LENGTH), np.int32)
    attention_mask[::3, LENGTH - 5 :] = 0
    weights = np.ones((batch, PREDICTIONS), np.float32)
    weights[::2, -1] = 0.0
    return dict(
        input_ids=rs.randint(5, VOCAB, (batch, LENGTH)).astype(np.int32),
        token_type_ids=np.zeros((batch, LENGTH), np.int32),
        attention_mask=attention_mask,
        masked_positions=rs.randint(0, LENGTH - 5, (batch, PREDICTIONS)).astype(np.int32),
        masked_ids=rs.randint(5, VOCAB, (batch, PREDICTIONS)).astype(np.int32),
        masked_weights=weights,
    )


def _distill_config(teacher=""):
    config = distill.add_distill_config(setup.step_config())
    config.batch_size = 8
    config.loss.teacher = teacher
    config.loss.student_layers = (3, 1)
    return config


def _leaves(tree):
    return {
        jax.tree_util.keystr(p): np.asarray(v) for p, v in jax.tree_util.tree_leaves_with_path(tree)
    }


def test_masked_only_loss_matches_a_numpy_reference():
    rs = np.random.RandomState(0)
    s_logits, t_logits = rs.randn(2, 3, 5).astype(np.float32), rs.randn(2, 3, 5).astype(np.float32)
    s_hidden, t_hidden = rs.randn(2, 4, 6).astype(np.float32), rs.randn(2, 4, 6).astype(np.float32)
    ids, weights = rs.randint(0, 5, (2, 3)), np.array([[1, 1, 0], [1, 0, 0]], np.float32)
    mask = np.array([[1, 1, 1, 0], [1, 1, 0, 0]], np.int32)
    batch = dict(
        input_ids=np.zeros((2, 4), np.int32),
        attention_mask=mask,
        masked_ids=ids,
        masked_weights=weights,
    )
    outputs = dict(
        mlm_logits=s_logits,
        teacher_mlm_logits=t_logits,
        sequence_output=s_hidden,
        teacher_sequence_output=t_hidden,
    )
    objective = distill.Distillation(
        temperature=2.0, alpha_ce=5.0, alpha_mlm=2.0, alpha_cos=1.0, restrict_ce_to_mask=True
    )
    metrics = objective.report(objective.sums(outputs, batch), objective.norms(batch))

    def log_softmax(x):
        x = x - x.max(-1, keepdims=True)
        return x - np.log(np.exp(x).sum(-1, keepdims=True))

    p_t, log_p_s = np.exp(log_softmax(t_logits / 2)), log_softmax(s_logits / 2)
    kl = (
        sum(
            weights[b, i] * np.sum(p_t[b, i] * (np.log(p_t[b, i]) - log_p_s[b, i]))
            for b in range(2)
            for i in range(3)
        )
        / weights.sum()
    )
    nll = -np.take_along_axis(log_softmax(s_logits), ids[..., None], -1)[..., 0]
    mlm = (nll * weights).sum() / weights.sum()
    cos = [
        1
        - s_hidden[b, t]
        @ t_hidden[b, t]
        / np.linalg.norm(s_hidden[b, t])
        / np.linalg.norm(t_hidden[b, t])
        for b in range(2)
        for t in range(4)
        if mask[b, t]
    ]
    cos = np.mean(cos)
    np.testing.assert_allclose(metrics["distill_kl"], kl, rtol=1e-5)
    np.testing.assert_allclose(metrics["mlm_loss"], mlm, rtol=1e-5)
    np.testing.assert_allclose(metrics["cosine_loss"], cos, rtol=1e-5)
    np.testing.assert_allclose(metrics["loss"], 5.0 * 4 * kl + 2.0 * mlm + cos, rtol=1e-5)


def test_width_mismatch_and_bad_layers_raise():
    objective = distill.Distillation(teacher_cfg=_cfg(4), teacher="t")
    with pytest.raises(ValueError, match="hidden_size"):
        objective.teacher_config(_cfg(2).replace(hidden_size=64))
    with pytest.raises(ValueError, match="student_layers"):
        distill.Distillation(teacher_cfg=_cfg(4), student_layers=(0, 4)).layers(_cfg(2))


def test_default_student_layers_are_extract_distilbert_s():
    """HF's scripts/extract_distilbert.py copies BERT-base layers 0, 2, 4, 7, 9, 11 into
    DistilBERT; the rule spreads layers from the first to the last teacher layer."""
    assert distill.default_student_layers(12, 6) == (0, 2, 4, 7, 9, 11)
    assert distill.default_student_layers(4, 2) == (0, 3)
    assert distill.default_student_layers(24, 6) == (0, 5, 9, 14, 18, 23)
    assert distill.default_student_layers(12, 12) == tuple(range(12))
    assert distill.default_student_layers(2, 1) == (0,)
    assert distill.Distillation(teacher_cfg=_cfg(12)).layers(_cfg(6)) == (0, 2, 4, 7, 9, 11)


def _hf_distiller_loss(s_logits, t_logits, s_hidden, t_hidden, attn_mask, lm_labels, restrict):
    """Numpy float64 port of HF's Distiller.step (MLM branch, distillation/distiller.py) with
    the README's DistilBERT weights: T = 2, alpha_ce 5, alpha_mlm 2, alpha_cos 1, alpha_clm 0."""
    temperature, alpha_ce, alpha_mlm, alpha_cos = 2.0, 5.0, 2.0, 1.0

    def log_softmax(x):
        x = x - x.max(-1, keepdims=True)
        return x - np.log(np.exp(x).sum(-1, keepdims=True))

    select = (lm_labels > -1) if restrict else attn_mask.astype(bool)
    s_slct, t_slct = s_logits[select], t_logits[select]  # torch.masked_select, (N, V)
    target = np.exp(log_softmax(t_slct / temperature))
    # nn.KLDivLoss(reduction="batchmean")(log_softmax(s / T), softmax(t / T)) * T^2
    loss_ce = np.sum(target * (np.log(target) - log_softmax(s_slct / temperature)))
    loss_ce = loss_ce / s_slct.shape[0] * temperature**2
    labelled = lm_labels > -1  # nn.CrossEntropyLoss(ignore_index=-100): mean over labels
    nll = -np.take_along_axis(log_softmax(s_logits[labelled]), lm_labels[labelled][:, None], -1)
    loss_mlm = nll.mean()
    real = attn_mask.astype(bool)  # nn.CosineEmbeddingLoss(target=1, "mean") at real tokens
    s_h, t_h = s_hidden[real], t_hidden[real]
    cos = np.sum(s_h * t_h, -1) / np.sqrt(
        (np.sum(s_h**2, -1) + 1e-12) * (np.sum(t_h**2, -1) + 1e-12)
    )
    loss_cos = np.mean(1.0 - cos)
    total = alpha_ce * loss_ce + alpha_mlm * loss_mlm + alpha_cos * loss_cos
    return {"loss": total, "distill_kl": loss_ce / temperature**2, "mlm_loss": loss_mlm}


def _unique_position_batch(seed=1, batch=4):
    """A batch whose masked positions are distinct within a row (HF keeps labels in a [B, T]
    array), with padding and a zero-weight slot."""
    out = _batch(seed, batch)
    rs = np.random.RandomState(seed)
    out["masked_positions"] = np.stack(
        [rs.choice(LENGTH - 5, PREDICTIONS, replace=False) for _ in range(batch)]
    ).astype(np.int32)
    return out


@pytest.fixture(scope="module")
def student_and_teacher():
    """A 2-layer student drawn from a random 4-layer teacher, and a forward that gives every
    position's MLM logits and last hidden states (the reference's inputs)."""
    objective = distill.Distillation(teacher_layers=4, student_layers=(3, 1))
    model = objective.model(_cfg(2))
    variables = nn.unbox(objective.init(model, {"params": jax.random.key(0)}, _batch()))
    rs = np.random.RandomState(0)  # distinct, peaked output distributions (KL of order 1)
    for tree in (variables["params"], variables["frozen"]):
        tree["mlm_head"]["bias"] = jnp.asarray(rs.randn(VOCAB) * 2.0, jnp.float32)
        kernel = tree["mlm_head"]["transform"]["kernel"]
        tree["mlm_head"]["transform"]["kernel"] = kernel * 20.0
    full = jax.jit(
        lambda params, cfg, batch: bertjax.BertForPreTraining(cfg, next_sentence=False).apply(
            {"params": params},
            batch["input_ids"],
            batch["token_type_ids"],
            batch["attention_mask"],
        ),
        static_argnums=1,
    )
    return model, variables, full


@pytest.mark.parametrize(
    "restrict,chunk", [(False, 0), (False, 5), (True, 128)], ids=["all", "chunked", "masked"]
)
def test_loss_matches_hf_distiller(student_and_teacher, restrict, chunk):
    """The objective on a real student/teacher pair equals a float64 port of HF's Distiller.step:
    the KL over every real token by default (chunks of 5 positions, the last one padded, give the
    same), over the masked positions with restrict_ce_to_mask."""
    model, variables, full = student_and_teacher
    objective = distill.Distillation(
        teacher_layers=4, student_layers=(3, 1), restrict_ce_to_mask=restrict, logits_chunk=chunk
    )
    batch = _unique_position_batch()
    outputs = objective.apply(model, variables, batch, None, True)
    metrics = objective.report(objective.sums(outputs, batch), objective.norms(batch))
    assert float(metrics["distill_kl"]) > 0.1  # distributions far enough apart to test
    student = full(variables["params"], _cfg(2), batch)
    teacher = full(variables["frozen"], _cfg(4), batch)
    lm_labels = np.full((4, LENGTH), -100)
    for b, p in np.argwhere(batch["masked_weights"] > 0):
        lm_labels[b, batch["masked_positions"][b, p]] = batch["masked_ids"][b, p]
    want = _hf_distiller_loss(
        *(np.asarray(x, np.float64) for x in (student["mlm_logits"], teacher["mlm_logits"])),
        *(
            np.asarray(x, np.float64)
            for x in (student["sequence_output"], teacher["sequence_output"])
        ),
        batch["attention_mask"],
        lm_labels,
        restrict,
    )
    for key, value in want.items():
        np.testing.assert_allclose(float(metrics[key]), value, rtol=2e-5, err_msg=key)


def test_chunked_kl_has_the_gradients_of_the_whole(student_and_teacher):
    model, variables, _ = student_and_teacher
    batch = _unique_position_batch()

    def loss(params, chunk):
        objective = distill.Distillation(
            teacher_layers=4, student_layers=(3, 1), logits_chunk=chunk
        )
        state = {"params": params, "frozen": variables["frozen"]}
        outputs = objective.apply(model, state, batch, None, True)
        return objective.loss(objective.sums(outputs, batch), objective.norms(batch))

    grad = jax.jit(jax.grad(loss), static_argnums=1)
    whole, chunked = grad(variables["params"], 0), grad(variables["params"], 6)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7), whole, chunked
    )
    assert float(jnp.abs(whole["mlm_head"]["bias"]).max()) > 0


@pytest.fixture(scope="module")
def distilled(tmp_path_factory):
    """A saved 4-layer pretraining (NSP) teacher and a 2-layer distill state, before/after loading
    it."""
    root = tmp_path_factory.mktemp("teacher")
    mesh = sharding.make_mesh(setup.step_config().mesh, jax.devices()[:1])
    teacher_config = setup.step_config()
    teacher_config.batch_size = 8
    teacher = step.init_train_state(teacher_config, _cfg(4), mesh, jax.random.key(1))
    ckpt = checkpoint.Checkpointer(str(root / "checkpoints"), async_save=False)
    ckpt.save(
        teacher,
        {
            "model_config": _cfg(4).to_dict(),
            "tokenizer_file": "spm.model",
            "tokenizer_bytes": "",
            "tokenizer_fingerprint": "none",
        },
    )
    ckpt.close()
    config = _distill_config(str(root))
    fresh = step.init_train_state(config, _cfg(2), mesh, jax.random.key(0))
    loaded = fresh.spec.objective.prepare_state(fresh, None)
    return mesh, config, _leaves(teacher.params), fresh, loaded


def _check_student(params, teacher):
    student = _leaves(params)
    for key, value in student.items():
        source = key.replace("['layer_0']", "['layer_3']")  # student_layers = (3, 1)
        np.testing.assert_array_equal(value, teacher[source], err_msg=key)
    assert any("embeddings" in k for k in student) and any("mlm_head" in k for k in student)


def test_student_starts_from_chosen_teacher_layers(distilled):
    _, _, saved, fresh, loaded = distilled
    _check_student(fresh.params, _leaves(fresh.frozen))  # random teacher made by init
    frozen = _leaves(loaded.frozen)
    assert set(frozen) == {k for k in saved if "pooler" not in k and "nsp_head" not in k}
    for key, value in frozen.items():
        np.testing.assert_array_equal(value, saved[key], err_msg=key)
    _check_student(loaded.params, frozen)


def test_teacher_is_frozen_through_a_train_step_and_checkpoint(distilled, tmp_path):
    mesh, config, _, _, loaded = distilled
    before_teacher, before_student = _leaves(loaded.frozen), _leaves(loaded.params)
    steps = step.jit_steps(loaded, mesh, step.FAST_COMPILE)
    state, metrics = steps.train(
        jax.tree.map(jnp.copy, loaded), sharding.global_batch(_batch(), mesh, 8), jax.random.key(0)
    )
    assert np.isfinite(float(metrics["loss"])) and float(metrics["nonfinite"]) == 0
    for key, value in _leaves(state.frozen).items():
        np.testing.assert_array_equal(value, before_teacher[key], err_msg=key)
    assert any(not np.array_equal(v, before_student[k]) for k, v in _leaves(state.params).items())
    ckpt = checkpoint.Checkpointer(str(tmp_path / "ckpt"), async_save=False)
    ckpt.save(state, {})
    abstract, _, _ = step.abstract_train_state(config, _cfg(2), mesh)
    restored, _ = ckpt.restore(abstract)
    ckpt.close()
    saved = ocp.StandardCheckpointer().metadata(tmp_path / "ckpt" / "1" / "state")
    assert "frozen" not in saved.item_metadata.tree and "params" in saved.item_metadata.tree
    restored = restored.spec.objective.resume_state(restored, None, None)  # reloads the teacher
    for key, value in _leaves(restored.frozen).items():
        np.testing.assert_array_equal(value, before_teacher[key], err_msg=key)
    for key, value in _leaves(restored.params).items():
        np.testing.assert_array_equal(value, _leaves(state.params)[key], err_msg=key)
