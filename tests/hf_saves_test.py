"""Hugging Face checkpoints as people save them: base models (keys without the ``bert.``
prefix, as every sentence-transformers model), task models and pretraining models of BERT,
RoBERTa and ALBERT, each with its WordPiece/BPE tokenizer saved beside it, convert and give
transformers' outputs within 1e-5; such a directory fine-tunes through ``init_from`` with its own
tokenizer; a head the params lack gets one clear error."""

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from helpers import COMMON
from helpers import assert_close as _assert_close
from helpers import hf_batch as _batch
from helpers import randomize as _randomize

import bertjax
from bertjax import convert, trainer
from bertjax.data.text import corpus
from bertjax.data.tokenizer import Tokenizer
from bertjax.objectives.finetune import add_finetune_config

SPECIALS = {  # family -> (tokenizer kind, special tokens in id order)
    "bert": ("wordpiece", ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]),
    "albert": ("wordpiece", ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]),
    "roberta": ("bpe", ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]),
}
MODELS = {  # family -> (config class, extra config, {save kind: model class})
    "bert": (
        transformers.BertConfig,
        {},
        {
            "base": transformers.BertModel,
            "sequence": transformers.BertForSequenceClassification,
            "token": transformers.BertForTokenClassification,
            "pretraining": transformers.BertForPreTraining,
        },
    ),
    "roberta": (
        transformers.RobertaConfig,
        dict(pad_token_id=1, bos_token_id=0, eos_token_id=2, max_position_embeddings=42),
        {
            "base": transformers.RobertaModel,
            "sequence": transformers.RobertaForSequenceClassification,
            "token": transformers.RobertaForTokenClassification,
            "pretraining": transformers.RobertaForMaskedLM,
        },
    ),
    "albert": (
        transformers.AlbertConfig,
        dict(embedding_size=16, num_hidden_groups=1, hidden_act="gelu_new"),
        {
            "base": transformers.AlbertModel,
            "sequence": transformers.AlbertForSequenceClassification,
            "token": transformers.AlbertForTokenClassification,
            "pretraining": transformers.AlbertForPreTraining,
        },
    ),
}


@pytest.fixture(scope="module")
def sentences():
    return [s for _, d in corpus.iter_documents("builtin") for s in d][:4000]


@pytest.fixture(scope="module")
def tokenizers_by_family(sentences):
    """A small WordPiece (BERT, ALBERT) or byte-level BPE (RoBERTa) tokenizer of the built-in
    corpus, as transformers' fast tokenizer object."""
    import tokenizers

    made = {}
    for family, (kind, specials) in SPECIALS.items():
        if kind == "wordpiece":
            tok = tokenizers.BertWordPieceTokenizer(lowercase=True)
            tok.train_from_iterator(sentences, vocab_size=300, special_tokens=specials)
            fast = transformers.PreTrainedTokenizerFast(
                tokenizer_object=tok._tokenizer,
                pad_token="[PAD]",
                unk_token="[UNK]",
                cls_token="[CLS]",
                sep_token="[SEP]",
                mask_token="[MASK]",
            )
        else:
            tok = tokenizers.ByteLevelBPETokenizer()
            tok.train_from_iterator(sentences, vocab_size=400, special_tokens=specials)
            fast = transformers.PreTrainedTokenizerFast(
                tokenizer_object=tok._tokenizer,
                bos_token="<s>",
                eos_token="</s>",
                pad_token="<pad>",
                unk_token="<unk>",
                mask_token="<mask>",
            )
        made[family] = fast
    return made


def _save(family, kind, tokenizers_by_family, directory, num_labels=3):
    config_cls, extra, classes = MODELS[family]
    fast = tokenizers_by_family[family]
    labels = 2 if kind == "pretraining" else num_labels  # ALBERT's SOP head has num_labels
    hf_cfg = config_cls(**{**COMMON, **extra, "vocab_size": len(fast), "num_labels": labels})
    model = _randomize(classes[kind](hf_cfg), seed=len(family) + len(kind))
    model.save_pretrained(str(directory))
    fast.save_pretrained(str(directory))
    return model


@pytest.mark.parametrize("kind", ["base", "sequence", "token", "pretraining"])
@pytest.mark.parametrize("family", sorted(MODELS))
def test_every_save_converts_with_equal_outputs(family, kind, tokenizers_by_family, tmp_path):
    hf_model = _save(family, kind, tokenizers_by_family, tmp_path)
    cfg, params = convert.from_hf(str(tmp_path))
    fast = tokenizers_by_family[family]
    assert (cfg.cls_token_id, cfg.sep_token_id, cfg.mask_token_id) == tuple(
        fast.convert_tokens_to_ids(
            [fast.cls_token or fast.bos_token, fast.sep_token or fast.eos_token, fast.mask_token]
        )
    )
    pad = fast.pad_token_id
    ids, types, mask = _batch(pad, cfg.vocab_size, seed=7)
    if family == "roberta":
        types = np.zeros_like(types)
    kwargs = dict(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask))
    if family != "roberta":
        kwargs["token_type_ids"] = torch.tensor(types)
    with torch.no_grad():
        out = hf_model(**kwargs, output_hidden_states=True)
    inputs = (jnp.asarray(ids), jnp.asarray(types), jnp.asarray(mask))
    if kind == "base":
        assert set(params) == {"bert"}
        sequence, pooled = bertjax.BertModel(cfg).apply({"params": params["bert"]}, *inputs)
        _assert_close(sequence, out.last_hidden_state.numpy(), mask, f"{family} base hidden")
        _assert_close(pooled, out.pooler_output.numpy(), what=f"{family} pooler")
    elif kind == "sequence":
        got = bertjax.BertForSequenceClassification(cfg, num_labels=3).apply(
            {"params": params}, *inputs
        )
        _assert_close(got, out.logits.numpy(), what=f"{family} sequence logits")
    elif kind == "token":
        assert "pooler" not in params["bert"]
        got = bertjax.BertForTokenClassification(cfg, num_labels=3).apply(
            {"params": params}, *inputs
        )
        _assert_close(got, out.logits.numpy(), mask, f"{family} token logits")
    else:
        nsp = family != "roberta"
        got = bertjax.BertForPreTraining(cfg, next_sentence=nsp).apply({"params": params}, *inputs)
        logits = out.logits if family == "roberta" else out.prediction_logits
        _assert_close(got["mlm_logits"], logits.numpy(), mask, f"{family} MLM logits")
        _assert_close(got["sequence_output"], out.hidden_states[-1].numpy(), mask, family)


def test_conversion_names_the_heads_present_and_absent(tokenizers_by_family, tmp_path, caplog):
    _save("bert", "base", tokenizers_by_family, tmp_path)
    with caplog.at_level(logging.INFO):
        cfg, params = convert.from_hf(str(tmp_path))
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "base-model save" in said and "absent: MLM head, NSP/SOP head, classifier" in said


def test_a_missing_head_gets_one_clear_error(tokenizers_by_family, tmp_path):
    _save("roberta", "pretraining", tokenizers_by_family, tmp_path / "roberta")
    cfg, params = convert.from_hf(str(tmp_path / "roberta"))
    ids = jnp.ones((1, 6), jnp.int32)
    with pytest.raises(ValueError, match="next_sentence=False"):
        bertjax.BertForPreTraining(cfg).apply({"params": params}, ids)
    assert bertjax.BertForPreTraining(cfg, next_sentence=False).apply({"params": params}, ids)
    _save("bert", "base", tokenizers_by_family, tmp_path / "base")
    cfg, params = convert.from_hf(str(tmp_path / "base"))
    with pytest.raises(ValueError, match="BertModel"):
        bertjax.BertForPreTraining(cfg).apply({"params": params}, ids)


def test_a_saved_directory_fine_tunes_with_its_own_tokenizer(tokenizers_by_family, tmp_path):
    """init_from an HF directory (a RoBERTa base-model save: keys without a prefix, a
    byte-level BPE tokenizer.json): its tokenizer encodes the task, its encoder is loaded, the
    run trains. (A BERT save with vocab.txt: tests/finetune_test.py.)"""
    family = "roberta"
    _save(family, "base", tokenizers_by_family, tmp_path / "hf")
    config = add_finetune_config(trainer.default_run_config(), "classification", num_labels=4)
    config.init_from = str(tmp_path / "hf")
    config.batch_size, config.num_train_steps, config.progress_bar = 8, 2, False
    config.data.max_seq_length = 24
    config.optim.warmup_steps, config.log_every, config.eval_every = 1, 1, 2
    config.eval_batches, config.checkpoint_every = 2, 0
    config.peak_flops_per_device = 1e12
    summary = trainer.train_and_evaluate(config, str(tmp_path / "run"))
    assert summary["step"] == 2 and 0.0 <= summary["eval/accuracy"] <= 1.0
    fast = tokenizers_by_family[family]
    tokenizer = Tokenizer(str(tmp_path / "hf" / "tokenizer.json"))
    text = "Return the value of the socket."
    assert list(tokenizer.encode([text])[0]) == fast(text, add_special_tokens=False)["input_ids"]


def test_an_export_carries_its_sentencepiece_tokenizer(small_spm, tmp_path):
    """to_hf(tokenizer_file=spm.model) writes spiece.model beside the weights: from_hf reads the
    special ids from it, and fine-tuning's init_from finds it."""
    from bertjax.interop import hf_files

    tokenizer = Tokenizer(small_spm)
    cfg = bertjax.BertConfig.preset(
        "tiny", **{**COMMON, "vocab_size": tokenizer.vocab_size, "num_hidden_layers": 1}
    )
    params = bertjax.BertForPreTraining(cfg).init(jax.random.key(0), jnp.ones((1, 8), jnp.int32))
    convert.to_hf(cfg, params["params"], str(tmp_path), tokenizer_file=small_spm)
    again, _ = convert.from_hf(str(tmp_path))
    ids = (again.pad_token_id, again.unk_token_id, again.cls_token_id, again.sep_token_id)
    assert ids + (again.mask_token_id,) == (
        tokenizer.pad_id,
        tokenizer.unk_id,
        tokenizer.cls_id,
        tokenizer.sep_id,
        tokenizer.mask_id,
    )
    found = hf_files.tokenizer_file(str(tmp_path), "config.init_from")
    assert (
        found.endswith("spiece.model") and Tokenizer(found).fingerprint() == tokenizer.fingerprint()
    )
    transformers.BertForPreTraining.from_pretrained(str(tmp_path))
