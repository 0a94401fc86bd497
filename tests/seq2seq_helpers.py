"""A tiny BART over digit strings for the sequence-to-sequence fine-tuning tests: a word-level tokenizer built with
the ``tokenizers`` library (``<s> 1 2 3 </s>``), a random ``BartForConditionalGeneration`` made with transformers'
PyTorch classes, both saved with ``save_pretrained``, and a synthetic task (reverse a digit string) as local JSONL."""

import json
import random

import tokenizers
import torch
import transformers

SPECIALS = ["<s>", "<pad>", "</s>", "<unk>"]
DIGITS = [str(d) for d in range(10)]


def digit_tokenizer() -> transformers.PreTrainedTokenizerFast:
    """Word-level tokens ``<s> <pad> </s> <unk> 0 ... 9`` (ids 0-13), whitespace-split, BART's ``<s> x </s>``."""
    vocab = {t: i for i, t in enumerate(SPECIALS + DIGITS)}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    tok.post_processor = tokenizers.processors.TemplateProcessing(
        single="<s> $A </s>", special_tokens=[("<s>", 0), ("</s>", 2)]
    )
    tok.decoder = tokenizers.decoders.WordPiece(prefix="##", cleanup=False)
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", pad_token="<pad>", eos_token="</s>", unk_token="<unk>"
    )


def tiny_bart(path, *, seed: int = 0, max_positions: int = 24, **sizes) -> str:
    """A random tiny BART over the digit vocabulary, saved with its tokenizer in ``path``; returns ``path``."""
    torch.manual_seed(seed)
    cfg = transformers.BartConfig(
        **{
            **dict(
                vocab_size=14,
                d_model=32,
                encoder_layers=1,
                decoder_layers=1,
                encoder_attention_heads=2,
                decoder_attention_heads=2,
                encoder_ffn_dim=64,
                decoder_ffn_dim=64,
                max_position_embeddings=max_positions,
                pad_token_id=1,
                bos_token_id=0,
                eos_token_id=2,
                decoder_start_token_id=2,
                forced_eos_token_id=2,
                dropout=0.0,
                attention_dropout=0.0,
                activation_dropout=0.0,
            ),
            **sizes,
        }
    )
    transformers.BartForConditionalGeneration(cfg).save_pretrained(str(path))
    digit_tokenizer().save_pretrained(str(path))
    return str(path)


def reversal_task(directory, *, train: int = 256, dev: int = 32, seed: int = 0, lengths=(3, 6)) -> str:
    """``train.jsonl`` / ``validation.jsonl`` with ``source`` a digit string and ``target`` its reverse."""
    rng = random.Random(seed)
    for split, n in (("train", train), ("validation", dev)):
        with open(f"{directory}/{split}.jsonl", "w") as f:
            for _ in range(n):
                digits = [rng.choice(DIGITS) for _ in range(rng.randint(*lengths))]
                f.write(json.dumps({"source": " ".join(digits), "target": " ".join(reversed(digits))}) + "\n")
    return str(directory)
