#!/usr/bin/env python3
"""Checks a LoRA adapter directory with PEFT itself: base + adapter logits vs a fixture.

    ~/fixvenv/bin/python tools/check_peft_adapter.py --base tests/fixtures/mixtral \\
        --adapter DIR --fixture tests/fixtures/lora/mixtral/fixture.safetensors [--logits FILE]

Loads the base with AutoModelForCausalLM.from_pretrained (float32, eager attention),
the adapter with PeftModel.from_pretrained (adapter_config.json +
adapter_model.safetensors, as an exporter wrote them), runs the fixture's input_ids
and compares the logits with the fixture's "logits", or with the tensor "logits" of
--logits (e.g. what moefit computed for the same adapter). Before that it insists
that PEFT consumed the adapter file whole: its tensor names are exactly the
PeftModel's adapter tensors (less the adapter name), with the same shapes and values,
so an exporter cannot pass by writing names PEFT silently ignores.

Prints the max abs error and the relative error max|got - ref| / max|ref| (normwise:
an elementwise ratio is meaningless for logits near 0); exits 1 when that is >= 1e-5
(or the adapter does not load whole), 0 otherwise. Uses make_fixtures' determinism
settings (one thread, ATen baseline kernels, MKL_CBWR) and its safetensors reader.
"""

import argparse
import os
import sys

os.environ["HF_HUB_OFFLINE"] = "1"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_fixtures as mfx  # noqa: E402  (sets MKL_CBWR etc. before torch loads)

import torch  # noqa: E402
import transformers  # noqa: E402
from peft import PeftModel  # noqa: E402
from peft.utils import get_peft_model_state_dict  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

REL_TOL = 1e-5


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", required=True, help="base model directory (config.json, model.safetensors)")
    ap.add_argument("--adapter", required=True,
                    help="adapter directory (adapter_config.json, adapter_model.safetensors)")
    ap.add_argument("--fixture", required=True, help="fixture.safetensors with input_ids (and logits)")
    ap.add_argument("--logits", help="safetensors file whose tensor 'logits' is the reference instead")
    args = ap.parse_args()

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    transformers.logging.set_verbosity_error()

    fx, _ = mfx.read_st(args.fixture)
    ids = torch.from_numpy(fx["input_ids"].astype("int64"))
    if args.logits:
        ref_t, _ = mfx.read_st(args.logits)
        if "logits" not in ref_t:
            sys.exit(f"check_peft_adapter: {args.logits} has no tensor 'logits'")
        ref = torch.from_numpy(ref_t["logits"].copy())
    else:
        ref = torch.from_numpy(fx["logits"].copy())

    base = AutoModelForCausalLM.from_pretrained(args.base, torch_dtype=torch.float32, attn_implementation="eager")
    model = PeftModel.from_pretrained(base, args.adapter)
    model.eval()

    # The adapter file must be what PEFT expects, tensor for tensor.
    ok = True
    sd = get_peft_model_state_dict(model, save_embedding_layers=False)
    saved = load_file(os.path.join(args.adapter, "adapter_model.safetensors"))
    for k in sorted(set(saved) - set(sd)):
        print(f"not used by PEFT: {k}")
        ok = False
    for k in sorted(set(sd) - set(saved)):
        print(f"missing from the adapter (PEFT's init used): {k}")
        ok = False
    for k in sorted(set(sd) & set(saved)):
        if saved[k].shape != sd[k].shape or saved[k].dtype != sd[k].dtype:
            print(f"shape/dtype: {k} file {list(saved[k].shape)} {saved[k].dtype}, "
                  f"PEFT {list(sd[k].shape)} {sd[k].dtype}")
            ok = False
        elif not torch.equal(saved[k], sd[k].to(saved[k].dtype)):
            print(f"loaded value differs: {k}")
            ok = False
    print(f"adapter tensors: {len(saved)} in the file, {len(sd)} in the PeftModel")

    with torch.no_grad():
        got = model(input_ids=ids, use_cache=False).logits.float()
    if got.shape != ref.shape:
        print(f"logits shape {list(got.shape)} != reference {list(ref.shape)}")
        sys.exit(1)
    abs_err = (got - ref).abs().max().item()
    rel_err = abs_err / max(ref.abs().max().item(), 1e-30)
    print(f"logits {list(got.shape)}: max abs error {abs_err:.3e}, relative error (max|d|/max|ref|) {rel_err:.3e}")
    ok = ok and rel_err < REL_TOL
    print("OK" if ok else f"FAILED (relative error must be < {REL_TOL:g} and the adapter load whole)")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
