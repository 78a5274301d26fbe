"""bertjax.inference: a trained model turned into labels, tags, vectors or fill-mask tokens; the
wing behind `python -m bertjax.predict` and `python -m bertjax.embed` (their faces, with the
flags, stay at the package's top level).

batching        length-sorted buckets of a few compiled shapes, or packed rows (numpy only)
sorted_apply    a jitted model run over texts of mixed lengths through those batches, results put
                back in input order; `windows` streams any number of texts
embedder        `Embedder`: an encoder with its pooling and normalization, `encode` -> vectors;
                BEIR metrics, a corpus's vectors, the sentence-transformers export
predictors      the predictors of each task (classify, tag, embed, fill_mask)
beam            `python -m bertjax.predict --runner=...`: the same predictions on Apache Beam
"""
