"""`moe export hf`'s directory loaded by transformers itself, against `moe logits` (tests/cli/test_hf_interop.sh).

Usage: check_hf_interop.py EXPORT_DIR LOGITS_JSON TEXT_FILE TEXT_JSON [--bf16]

- AutoModelForCausalLM.from_pretrained(EXPORT_DIR) is the architecture config.json names; its logits on the tokens of
  LOGITS_JSON agree with `moe logits`'s: fp32 max |a - b| / max |b| <= 1e-4 and KL(moe || hf) <= 1e-8 per
  token; bf16 (--bf16, the weights rounded once, computed in fp32 here): max relative difference <= 2^-8 * 8.
- the language-model loss of the tokens (mean cross-entropy of each next token) from transformers
  (`labels=`) equals the one from `moe logits`'s logits within 1e-5 (fp32 only);
- model.generate(greedy, 32 new tokens) equals `moe logits --generate 32`'s "generated" (fp32 only).
- AutoTokenizer.from_pretrained(EXPORT_DIR) encodes TEXT_FILE to the ids the project's tokenizer gives it
  (TEXT_JSON: `moe logits --text-file TEXT_FILE`'s "tokens"), adding no special token, and decodes them back to
  the text; TEXT_FILE "-" for a directory without a tokenizer (one transformers made).
Exits 1 with the figures on any failure.
"""

import json
import os
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def fail(message):
    print("FAIL: " + message, file=sys.stderr)
    sys.exit(1)


def main():
    export_dir, logits_json, text_file, text_json = sys.argv[1:5]
    bf16 = "--bf16" in sys.argv[5:]
    ours = json.load(open(logits_json))
    model = AutoModelForCausalLM.from_pretrained(export_dir, dtype=torch.float32)
    model.eval()
    architecture = json.load(open(os.path.join(export_dir, "config.json")))["architectures"][0]
    if type(model).__name__ != architecture:
        fail(f"transformers loaded a {type(model).__name__}, not the {architecture} of config.json")
    tokens = torch.tensor([ours["tokens"]])
    with torch.no_grad():
        theirs = model(tokens).logits[0].double()
    expected = torch.tensor(ours["logits"], dtype=torch.float64)
    if theirs.shape != expected.shape:
        fail(f"logits of shape {tuple(theirs.shape)} from transformers, {tuple(expected.shape)} from moe logits")
    relative = ((theirs - expected).abs().max() / expected.abs().max()).item()
    p = torch.log_softmax(expected, -1)
    q = torch.log_softmax(theirs, -1)
    kl = (p.exp() * (p - q)).sum(-1).max().item()
    bound, kl_bound = (2.0**-8 * 8, 1e-3) if bf16 else (1e-4, 1e-8)
    print(f"logits: max relative difference {relative:.3e} (bound {bound:.1e}), max KL {kl:.3e} (bound {kl_bound:.0e})")
    if not relative <= bound or not kl <= kl_bound:
        fail(f"logits differ: max relative difference {relative:.3e}, KL {kl:.3e}")

    if not bf16:
        with torch.no_grad():
            their_loss = model(tokens, labels=tokens).loss.item()
        targets = tokens[0, 1:]
        our_loss = torch.nn.functional.cross_entropy(expected[:-1], targets).item()
        print(f"loss: transformers {their_loss:.8f}, moe logits {our_loss:.8f}")
        if not abs(their_loss - our_loss) <= 1e-5:
            fail(f"the language-model loss differs: transformers {their_loss}, moe logits {our_loss}")
        # `moe logits --generate` does not stop at an end-of-text token: neither does this (a model transformers
        # made has eos_token_id 2, and min_new_tokens would suppress that token instead of continuing through it).
        model.generation_config.eos_token_id = None
        generated = model.generate(tokens, max_new_tokens=len(ours["generated"]), do_sample=False, pad_token_id=0)
        new = generated[0, tokens.shape[1]:].tolist()
        print(f"greedy generation: {len(new)} tokens, equal: {new == ours['generated']}")
        if new != ours["generated"]:
            fail(f"greedy generation differs: transformers {new}, moe logits {ours['generated']}")

    if text_file == "-":
        return
    text = open(text_file, encoding="utf-8", newline="").read()  # newline="": "\r\n" stays as it is
    expected_ids = json.load(open(text_json))["tokens"]
    tokenizer = AutoTokenizer.from_pretrained(export_dir)
    ids = tokenizer(text)["input_ids"]
    if ids != expected_ids:
        first = next((i for i, (a, b) in enumerate(zip(ids, expected_ids)) if a != b), min(len(ids), len(expected_ids)))
        fail(f"the tokenizer encodes {len(ids)} ids, the project's {len(expected_ids)}; first difference at {first}: "
             f"{ids[first:first + 5]} against {expected_ids[first:first + 5]}")
    if tokenizer.decode(ids) != text:
        fail("the tokenizer's decode does not give the text back")
    print(f"tokenizer: {len(ids)} ids, as the project's tokenizer gives them, decoded back exactly")


if __name__ == "__main__":
    main()
