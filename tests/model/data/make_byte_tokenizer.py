#!/usr/bin/env python3
"""Writes byte_tokenizer.json beside this file: the tokenizer src/model/hf_tokenizer.c
writes (`moefit init`), built with the `tokenizers` library itself and serialized by it
(Tokenizer.to_str(pretty=True)), so tests/model/hf_tokenizer_test.cc holds moefit's
bytes to what `tokenizers` writes for the same tokenizer.

The venv of .ci/run (transformers 4.57.6 pulls tokenizers 0.22.2), from the repository root:
  ~/.cache/moefit/hfvenv/bin/python tests/model/data/make_byte_tokenizer.py
"""
import os

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers.models.gpt2.tokenization_gpt2 import bytes_to_unicode

b2u = bytes_to_unicode()
tok = Tokenizer(models.BPE(vocab={b2u[b]: b for b in range(256)}, merges=[]))
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
tok.post_processor = processors.ByteLevel(trim_offsets=False)
tok.decoder = decoders.ByteLevel()
tok.add_special_tokens([AddedToken(s, special=True, normalized=False)
                        for s in ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]])
out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "byte_tokenizer.json")
with open(out, "w", encoding="utf-8") as f:
    f.write(tok.to_str(pretty=True))
print(f"wrote {out}")
