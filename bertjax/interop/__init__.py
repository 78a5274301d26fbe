"""The bridges to what other tools and earlier runs wrote.

hf           weights to and from Hugging Face BERT, RoBERTa and ALBERT (`from_hf`, `to_hf`)
electra      ELECTRA discriminators and generators both ways (bertjax.convert picks by model type)
modernbert   ModernBERT and Ettin directories both ways
tiling       a smaller model's weights centre-tiled into a larger one (ModernBERT-large from base)
hf_keys      the HF key tables (BERT/RoBERTa/ALBERT) the converters build on
hf_files     an HF directory's config.json, tokenizer file and weight tensors
checkpoints  bertjax checkpoints read without the trainer; the tokenizer in their meta
pretrained   what a run starts from (fine-tuning init_from, a distillation teacher): either kind
"""
