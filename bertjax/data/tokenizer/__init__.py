"""Stage 2, the tokenizer: SentencePiece (trained here or loaded) or a Hugging Face vocabulary,
with word starts (tokenizer.py)."""

from bertjax.data.tokenizer.tokenizer import SPECIALS, Tokenizer, train_sentencepiece

__all__ = ["SPECIALS", "Tokenizer", "train_sentencepiece"]
