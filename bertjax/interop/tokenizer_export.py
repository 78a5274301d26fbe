"""A bertjax tokenizer as Hugging Face tokenizer files: ``tokenizer.json`` (the `tokenizers`
library's form, which transformers' ``AutoTokenizer`` and sentence-transformers load),
``tokenizer_config.json`` and ``special_tokens_map.json``; a WordPiece vocabulary keeps its
``vocab.txt`` beside them.

Whatever the source (a SentencePiece model bertjax trained, a ``tokenizer.json``, a
``vocab.txt``), the written tokenizer gives the ids bertjax's `Tokenizer` gives, and frames rows
as bertjax's tasks do: ``[CLS] a [SEP]`` and ``[CLS] a [SEP] b [SEP]`` with token type 1 on the
second text. A SentencePiece unigram model is rebuilt from its own file: pieces and scores, the
normalizer spec's precompiled character map (read from the model's protobuf bytes by their field
numbers, sentencepiece_model.proto: ModelProto.trainer_spec = 2, .normalizer_spec = 3, .pieces =
1; so no protobuf runtime is needed), whitespace handling as SentencePiece's, its control and
user-defined pieces as special added tokens. SentencePiece and `tokenizers` break ties between
equally scored segmentations differently (a run of ``=`` as ``==`` + ``=`` or ``=`` + ``==``): such
texts can get other ids of the same total score; every other text gets the same ids. A special
token spelled out in a text ("The answer is [MASK].") is that token in place of a word, as in
Hugging Face's BERT tokenizers: the text after it gets no "▁" of its own (SentencePiece would put
a bare "▁" piece before the token), so "is [MASK]." frames a masked word as "is Paris." is.
"""

from __future__ import annotations

import json
import os
import tempfile

from bertjax import paths

# SentencePiece piece types (sentencepiece_model.proto SentencePiece.Type) that are tokens of
# their own: UNKNOWN, CONTROL, USER_DEFINED.
_SPECIAL_PIECE_TYPES = (2, 3, 4)
_UNIGRAM = 1


def _varint(data: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, i


def _fields(data: bytes):
    """(field number, value) of a protobuf message's wire form: ints for varints, bytes for
    length-delimited and fixed-width fields."""
    i = 0
    while i < len(data):
        key, i = _varint(data, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(data, i)
        elif wire == 2:
            size, i = _varint(data, i)
            value, i = data[i : i + size], i + size
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
            value, i = data[i : i + size], i + size
        else:
            raise ValueError(f"protobuf wire type {wire} at byte {i}")
        yield number, value


def sentencepiece_to_tokenizers(model_file: str):
    """A `tokenizers.Tokenizer` that encodes as the SentencePiece unigram model in
    ``model_file`` (see the module docstring), no special tokens added."""
    import sentencepiece as spm
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers
    from tokenizers.models import Unigram

    data = paths.Path(model_file).read_bytes()
    processor = spm.SentencePieceProcessor(model_proto=data)
    trainer, normalizer, types = b"", b"", []
    for number, value in _fields(data):
        if number == 1:
            types.append(dict(_fields(value)).get(3, 1))
        elif number == 2:
            trainer = value
        elif number == 3:
            normalizer = value
    trainer_spec, normalizer_spec = dict(_fields(trainer)), dict(_fields(normalizer))
    if trainer_spec.get(3, _UNIGRAM) != _UNIGRAM:
        raise ValueError(
            f"{model_file}: a SentencePiece BPE model has no tokenizer.json form here; export "
            "needs a unigram model (what bertjax trains) or a tokenizer.json / vocab.txt"
        )
    pieces = [(processor.id_to_piece(i), processor.get_score(i)) for i in range(len(types))]
    byte_fallback = bool(trainer_spec.get(35, 0))
    tokenizer = Tokenizer(Unigram(pieces, unk_id=processor.unk_id(), byte_fallback=byte_fallback))
    steps = []
    if normalizer_spec.get(2):  # the character map of nmt_nfkc and the like
        steps.append(normalizers.Precompiled(normalizer_spec[2]))
    if normalizer_spec.get(4, 1):  # remove_extra_whitespaces: trailing ones, runs of them
        strip = normalizers.Strip(left=False, right=True)
        steps += [strip, normalizers.Replace(Regex(" {2,}"), "▁")]
    if steps:
        tokenizer.normalizer = normalizers.Sequence(steps)
    # add_dummy_prefix: a "▁" before the text, not again after a special token in it
    prepend = "first" if normalizer_spec.get(3, 1) else "never"
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme=prepend)
    tokenizer.decoder = decoders.Metaspace(replacement="▁", prepend_scheme=prepend)
    tokenizer.add_special_tokens(
        [
            AddedToken(piece, normalized=False, special=True)
            for (piece, _), kind in zip(pieces, types)
            if kind in _SPECIAL_PIECE_TYPES
        ]
    )
    return tokenizer


def _tokenizers_object(tokenizer):
    """The `tokenizers.Tokenizer` of a bertjax `Tokenizer`, padding and truncation off."""
    from tokenizers import Tokenizer

    if tokenizer.path.endswith(".model"):
        return sentencepiece_to_tokenizers(tokenizer.path)
    copy = Tokenizer.from_str(tokenizer.hf_json())
    copy.no_padding()
    copy.no_truncation()
    return copy


def write_tokenizer(
    tokenizer, directory: str, *, max_length: int, token_types: bool = True
) -> list[str]:
    """Writes ``tokenizer`` (a bertjax `Tokenizer`) into ``directory`` as Hugging Face files;
    ``max_length``: the longest row the model takes; ``token_types``: whether the model reads
    token type ids (ModernBERT does not). Returns the names written."""
    from tokenizers import processors

    hf = _tokenizers_object(tokenizer)
    cls, sep = tokenizer.pieces[tokenizer.cls_id], tokenizer.pieces[tokenizer.sep_id]
    hf.post_processor = processors.TemplateProcessing(
        single=f"{cls} $A {sep}",
        pair=f"{cls} $A {sep} $B:1 {sep}:1",
        special_tokens=[(cls, tokenizer.cls_id), (sep, tokenizer.sep_id)],
    )
    special = {
        "cls_token": cls,
        "sep_token": sep,
        "pad_token": tokenizer.pieces[tokenizer.pad_id],
        "unk_token": tokenizer.pieces[tokenizer.unk_id],
        "mask_token": tokenizer.pieces[tokenizer.mask_id],
    }
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": int(max_length),
        "clean_up_tokenization_spaces": False,
        "model_input_names": ["input_ids", "attention_mask"]
        + (["token_type_ids"] if token_types else []),
        **special,
    }
    names = ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"]
    paths.makedirs(directory)
    with tempfile.TemporaryDirectory() as tmp:
        local = os.path.join(tmp, "tokenizer.json")
        hf.save(local)
        paths.upload(local, paths.join(directory, "tokenizer.json"))
    if tokenizer.path.endswith(".txt"):  # WordPiece: its vocabulary too (BertTokenizer reads it)
        paths.upload(tokenizer.path, paths.join(directory, "vocab.txt"))
        config["do_lower_case"] = bool(tokenizer.lowercase)
        names.append("vocab.txt")
    for name, value in (("tokenizer_config.json", config), ("special_tokens_map.json", special)):
        paths.write_text(paths.join(directory, name), json.dumps(value, indent=2) + "\n")
    return names
