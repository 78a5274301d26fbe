"""A tiny trained-model directory for the inference and command tests: a bertjax workdir (one
checkpoint, written directly) of a 1-layer BERT with an MLM head over a cased WordPiece
vocabulary, its run config saying ``config.data.lowercase=False`` as a cased run's does."""

import os
import types

import numpy as np

# Words whose case tells them apart: a lowercasing tokenizer maps the capitalised ones (and the
# accented one, stripping accents) onto others' ids.
CASED_WORDS = ("Apple", "apple", "Paris", "paris", "café", "cafe", "The", "the", "is", "in")
SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def write_cased_workdir(root: str, max_seq_length: int = 16) -> str:
    """Writes ``root/vocab.txt`` and the workdir ``root/run``; returns the workdir."""
    import jax
    from flax import linen as nn

    from bertjax.data.tokenizer import Tokenizer
    from bertjax.interop.checkpoints import tokenizer_meta
    from bertjax.modeling.bert_config import BertConfig
    from bertjax.modeling.heads import BertForPreTraining
    from bertjax.training.checkpoint import Checkpointer

    vocab = os.path.join(root, "vocab.txt")
    with open(vocab, "w", encoding="utf-8") as f:
        f.write("\n".join([*SPECIALS, *CASED_WORDS]) + "\n")
    tokenizer = Tokenizer(vocab, lowercase=False)
    cfg = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=32,
        pad_token_id=tokenizer.pad_id,
        unk_token_id=tokenizer.unk_id,
        cls_token_id=tokenizer.cls_id,
        sep_token_id=tokenizer.sep_id,
        mask_token_id=tokenizer.mask_id,
    )
    ids = np.full((1, 8), tokenizer.cls_id, np.int32)
    model = BertForPreTraining(cfg, next_sentence=False)
    params = nn.unbox(jax.jit(model.init)(jax.random.key(0), ids)["params"])
    run = {
        "data": {"lowercase": False, "language": "en", "max_seq_length": max_seq_length},
        "loss": {"objective": "pretraining"},
    }
    meta = {"config": run, "model_config": cfg.to_dict(), "data_fingerprint": "-"}
    workdir = os.path.join(root, "run")
    checkpoints = Checkpointer(os.path.join(workdir, "checkpoints"), keep=1, async_save=False)
    state = types.SimpleNamespace(step=np.int32(1), params=jax.device_get(params), opt_state={})
    checkpoints.save(state, {**meta, **tokenizer_meta(tokenizer)}, force=True)
    checkpoints.close()
    return workdir
