"""Load a LoRA adapter saved by Trainer onto the tiny base model; compare logits with a file.

``python peft_load_script.py ADAPTER_DIR EXPECTED_LOGITS.pt TOKEN_IDS`` prints a RESULT line:
the largest absolute difference and the number of LoRA layers loaded.
"""

from __future__ import annotations

import json
import sys

import torch


def main() -> None:
    import tiny
    from peft import PeftModel

    adapter, expected_file, tokens = sys.argv[1:4]
    model = PeftModel.from_pretrained(tiny.causal_lm(), adapter).eval()
    probe = torch.tensor([[int(t) for t in tokens.split(",")]])
    with torch.no_grad():
        logits = model(input_ids=probe).logits
    expected = torch.load(expected_file, weights_only=True)
    layers = sum(1 for name, _ in model.named_modules() if name.endswith("lora_A"))
    result = {"max_abs_diff": float((logits - expected).abs().max()), "lora_layers": layers}
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
