#!/usr/bin/env python3
"""Regenerates chat_tiny.tokens and chat_tiny.expected beside this file.

Needs transformers, tokenizers, jinja2 and numpy (no network: the tokenizer is
trained here). Usage, from the repository root:
  /tmp/tokvenv/bin/python tests/tokens/data/make_fixture.py [WORKDIR]

1. trains a tiny byte-level BPE tokenizer and saves it in WORKDIR/tok with a ChatML
   chat template (PreTrainedTokenizerFast.save_pretrained);
2. writes WORKDIR/chat_tiny.jsonl (conversations and one plain-text record);
3. runs tools/prepare_data.py on it -> chat_tiny.tokens;
4. writes chat_tiny.expected: the ids the tokenizer gives for each rendered document
   and the assistant mask found by scanning the ChatML markers in those ids — not
   the script's method — which tests/tokens/tokens_test.cc compares with what the
   C reader gets from chat_tiny.tokens.
"""

import json
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

CONVERSATIONS = [
    [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4."},
    ],
    [
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": "Blue."},
        {"role": "user", "content": "Another one?"},
        {"role": "assistant", "content": "Green, like grass."},
    ],
]
TEXT = "Plain text counts everywhere."

CORPUS = [
    "You are terse. What is 2+2? 4. Name a colour. Blue. Another one? Green, like grass.",
    "The quick brown fox jumps over the lazy dog.",
    "Plain text counts everywhere, and every token of it is trained.",
]


def main():
    work = sys.argv[1] if len(sys.argv) > 1 else "/tmp/tokfix"
    os.makedirs(work, exist_ok=True)
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(CORPUS * 4, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    fast.chat_template = CHATML
    tok_dir = os.path.join(work, "tok")
    shutil.rmtree(tok_dir, ignore_errors=True)
    fast.save_pretrained(tok_dir)

    jsonl = os.path.join(work, "chat_tiny.jsonl")
    with open(jsonl, "w") as f:
        for c in CONVERSATIONS:
            f.write(json.dumps({"messages": c}) + "\n")
        f.write(json.dumps({"text": TEXT}) + "\n")

    out = os.path.join(HERE, "chat_tiny.tokens")
    subprocess.run([sys.executable, os.path.join(ROOT, "tools", "prepare_data.py"), "--tokenizer", tok_dir,
                    jsonl, "--out", out], check=True)

    # The expectation, independently: tokenize each rendered document whole, then
    # mark the assistant turns by walking the ChatML markers in the ids.
    tok = AutoTokenizer.from_pretrained(tok_dir, local_files_only=True)
    start, end = tok.convert_tokens_to_ids("<|im_start|>"), tok.convert_tokens_to_ids("<|im_end|>")
    newline = tok("\n", add_special_tokens=False)["input_ids"]
    ids, mask, starts = [], [], []
    for c in CONVERSATIONS:
        text = tok.apply_chat_template(c, tokenize=False)
        d = tok(text, add_special_tokens=False)["input_ids"]
        m = [0] * len(d)
        i = 0
        while i < len(d):
            if d[i] != start:
                i += 1
                continue
            j = i + 1
            while d[j : j + len(newline)] != newline:  # the role name
                j += 1
            role = tok.decode(d[i + 1 : j])
            k = j + len(newline)
            while d[k] != end:
                k += 1
            stop = k + 1 + len(newline)  # <|im_end|> and its newline belong to the turn
            if role == "assistant":
                for q in range(j + len(newline), stop):
                    m[q] = 1
            i = stop
        starts.append(len(ids))
        ids += d
        mask += m
    d = tok(TEXT, add_special_tokens=True)["input_ids"] + [tok.eos_token_id]
    starts.append(len(ids))
    ids += d
    mask += [1] * len(d)

    with open(os.path.join(HERE, "chat_tiny.expected"), "w") as f:
        f.write("# written by make_fixture.py: what chat_tiny.tokens must hold\n")
        f.write(f"vocab {len(tok)}\nwidth 2\ncount {len(ids)}\ndocs {len(starts)}\n")
        f.write("ids " + " ".join(map(str, ids)) + "\n")
        f.write("mask " + "".join(map(str, mask)) + "\n")
        f.write("starts " + " ".join(map(str, starts)) + "\n")
    print(f"make_fixture.py: {len(ids)} tokens, {sum(mask)} in the loss, {len(starts)} documents")


if __name__ == "__main__":
    main()
