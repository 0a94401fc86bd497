"""One process of a fine-tuning run for tests/test_train_multihost.py: ``isojax.train.cli`` with two probes.

    python tests/multihost_worker.py STALL RECORDS finetune ...

* ``STALL > 0``: once the checkpoint of step STALL is written, print ``STALLED`` and wait to be killed.
* ``RECORDS``: a directory where this process appends, for every tokenizer call of :mod:`isojax.train.feed`, one
  JSON line with the first texts of the rows it tokenised (``tokenised_<process>.jsonl``), and writes the final
  parameters of the run (``final_<process>.npz``, leaves in tree order).
"""
import json
import os
import sys
import time

import jax

jax.config.update("jax_default_matmul_precision", "highest")

import numpy as np  # noqa: E402

from isojax.train import checkpoint, feed, loop  # noqa: E402
from isojax.train.cli import main  # noqa: E402

stall, records = int(sys.argv[1]), sys.argv[2]


def recording_tokenize(tokenizer, texts_a, texts_b=None, **kwargs):
    with open(os.path.join(records, f"tokenised_{jax.process_index()}.jsonl"), "a") as f:
        f.write(json.dumps(texts_a) + "\n")
    return tokenize(tokenizer, texts_a, texts_b, **kwargs)


tokenize, feed.tokenize = feed.tokenize, recording_tokenize

if stall:
    save = checkpoint.Checkpoints.save

    def stalling_save(self, step, *args, **kwargs):
        started = save(self, step, *args, **kwargs)
        if step == stall:
            self.wait()
            print("STALLED", flush=True)
            time.sleep(600)
        return started

    checkpoint.Checkpoints.save = stalling_save

fit = loop.fit


def fit_and_save(config):
    result = fit(config)
    np.savez(os.path.join(records, f"final_{jax.process_index()}.npz"), *jax.tree.leaves(result.params))
    return result


loop.fit = fit_and_save
sys.exit(main(sys.argv[3:]))
