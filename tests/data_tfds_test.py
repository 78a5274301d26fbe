"""tfds corpora: a tiny ArrayRecord dataset built offline with tfds' own builder, read without
TensorFlow."""

import ml_collections
import numpy as np
import pytest
import tensorflow_datasets as tfds

from bertjax.data import default_data_config, make_pipeline
from bertjax.data.text import corpus
from bertjax.data.text import sentences as text


class BertjaxTinyText(tfds.core.GeneratorBasedBuilder):
    """Forty short documents of three sentences each."""

    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
        return tfds.core.DatasetInfo(
            builder=self,
            features=tfds.features.FeaturesDict({"body": tfds.features.Text(), "number": np.int64}),
        )

    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples(40), "validation": self._generate_examples(4)}

    def _generate_examples(self, count):
        for i in range(count):
            yield (
                i,
                {
                    "body": f"Document {i} opens here. It talks about item {i}!\nDoes it end? Yes "
                    "it does.",
                    "number": i,
                },
            )


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("tfds"))
    BertjaxTinyText(data_dir=directory, file_format="array_record").download_and_prepare()
    return directory


def test_documents_come_from_the_text_feature(data_dir):
    stats = text.CorpusStats()
    docs = list(
        corpus.iter_documents(
            "tfds:bertjax_tiny_text", text_feature="body", tfds_data_dir=data_dir, stats=stats
        )
    )
    assert len(docs) == 40 and stats.documents == 40
    numbers = sorted(int(d[0].split()[1]) for _, d in docs)
    assert numbers == list(range(40))
    assert all(
        d[1:] == [f"It talks about item {d[0].split()[1]}!", "Does it end?", "Yes it does."]
        for _, d in docs
    )
    validation = list(
        corpus.iter_documents(
            "tfds:bertjax_tiny_text:validation", text_feature="body", tfds_data_dir=data_dir
        )
    )
    assert len(validation) == 4 and validation[0][0].startswith(
        "tfds:bertjax_tiny_text:validation#"
    )


def test_bad_tfds_specs_are_explained(data_dir):
    with pytest.raises(ValueError, match=r"no feature 'text'.*body"):
        list(corpus.iter_documents("tfds:bertjax_tiny_text", tfds_data_dir=data_dir))
    with pytest.raises(FileNotFoundError, match="no_such_dataset_xyz"):
        list(corpus.iter_documents("tfds:no_such_dataset_xyz", tfds_data_dir=data_dir))


def test_pipeline_over_a_tfds_corpus(data_dir, tmp_path):
    config = ml_collections.ConfigDict()
    config.seed, config.batch_size = 0, 8
    config.data = default_data_config()
    config.data.update(
        dict(
            corpus="tfds:bertjax_tiny_text",
            text_feature="body",
            tfds_data_dir=data_dir,
            vocab_size=120,
            max_seq_length=32,
            max_predictions=5,
            prefetch=0,
            heldout_fraction=0.1,
        )
    )
    p = make_pipeline(config, str(tmp_path), process_index=0, process_count=1)
    b = p.batch(0)
    assert b["input_ids"].shape == (8, 32)
    original = b["input_ids"].copy()
    rows, slots = np.nonzero(b["masked_weights"])
    original[rows, b["masked_positions"][rows, slots]] = b["masked_ids"][rows, slots]
    text = " ".join(p.tokenizer.decode(r) for r in original)
    assert sum(text.count(word) for word in ("opens", "item", "Does it end", "Yes it does")) >= 8
    meta = p.store.meta
    assert meta["corpus"].startswith("tfds:bertjax_tiny_text feature=body")
    assert meta["splits"]["train"]["documents"] + meta["splits"]["eval"]["documents"] == 40
