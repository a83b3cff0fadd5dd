"""Tiny HuggingFace `transformers` models, run the same way under PyTorch (`python hf_models.py`)
and under flambeau (`python -m flambeau.run hf_models.py`); tests/test_hf_transformers.py compares.

`python hf_models.py KIND WORKDIR [--init]`: KIND is gpt2, llama or bert. With --init (run it so
under PyTorch, first) the model built from its config with seed 0 first writes its weights to
WORKDIR/init.npz. Then the model is built from the config, its weights replaced by init.npz (so
both systems start from the same numbers), and the run records into WORKDIR/<system>.json: logits
on a padded batch (also with the eager and flex_attention implementations, and of `torch.compile(model)`
with the number of graphs it compiled), the losses of a few AdamW steps (and of the same steps with gradient
checkpointing on), the logits after training, those of the model reloaded with from_pretrained
from its own save_pretrained (safetensors) directory WORKDIR/<system>_saved, and (causal models)
the ids of greedy generate.
"""
import json
import os
import sys
import warnings

import numpy as np
import torch
import transformers

STEPS = 3
LR = 1e-2
VOCAB = 97
SEQ = 10
NEW_TOKENS = 6


def config(kind: str):
    if kind == "gpt2":
        return transformers.GPT2Config(vocab_size=VOCAB, n_positions=32, n_embd=32, n_layer=2, n_head=4,
                                       resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                       bos_token_id=1, eos_token_id=2, pad_token_id=0)
    if kind == "llama":
        return transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                        max_position_embeddings=64, bos_token_id=1, eos_token_id=2,
                                        pad_token_id=0)
    if kind == "bert":
        return transformers.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                                       num_attention_heads=4, intermediate_size=64, max_position_embeddings=64,
                                       hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, pad_token_id=0)
    raise SystemExit(f"unknown model kind {kind}")


# attention implementations besides the default ("sdpa") each model is also run with
OTHER_ATTENTION = {"gpt2": ["eager"], "llama": ["eager", "flex_attention"], "bert": ["eager", "flex_attention"]}


def build(kind: str, attention: str | None = None):
    cls = {"gpt2": transformers.GPT2LMHeadModel, "llama": transformers.LlamaForCausalLM,
           "bert": transformers.BertForMaskedLM}[kind]
    cfg = config(kind)
    if attention is not None:
        cfg._attn_implementation = attention
    return cls(cfg)


def batch():
    rng = np.random.default_rng(1)
    ids = rng.integers(3, VOCAB, size=(2, SEQ))
    mask = np.ones((2, SEQ), dtype=np.int64)
    mask[1, :3] = 0                      # left padding in the second row
    ids[1, :3] = 0
    return torch.tensor(ids), torch.tensor(mask)


def as_list(t) -> list:
    return t.detach().float().numpy().tolist()


def from_init(kind: str, workdir: str, attention: str | None = None):
    model = build(kind, attention)
    init = np.load(os.path.join(workdir, "init.npz"))
    model.load_state_dict({k: torch.tensor(init[k]) for k in init.files}, strict=False)
    model.tie_weights()
    return model


def train(model, ids, mask, labels) -> list:
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    losses = []
    for _ in range(STEPS):
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def compiled(model, ids, mask) -> dict:
    """Logits of `torch.compile(model)` (the default backend) and the number of graphs it compiled."""
    from torch._dynamo.utils import counters
    before = counters["stats"]["unique_graphs"]
    logits = torch.compile(model)(input_ids=ids, attention_mask=mask).logits
    return {"compiled_logits": as_list(logits), "compiled_graphs": counters["stats"]["unique_graphs"] - before}


def run(kind: str, workdir: str) -> dict:
    model = from_init(kind, workdir)
    ids, mask = batch()
    labels = ids.masked_fill(mask == 0, -100)
    out = {"system": torch.__name__}
    model.eval()
    with torch.no_grad():
        out["logits"] = as_list(model(input_ids=ids, attention_mask=mask).logits)
        for attention in OTHER_ATTENTION[kind]:
            other = from_init(kind, workdir, attention).eval()
            out[f"logits_{attention}"] = as_list(other(input_ids=ids, attention_mask=mask).logits)
        out.update(compiled(model, ids, mask))
    out["losses"] = train(model, ids, mask, labels)
    checkpointed = from_init(kind, workdir)
    checkpointed.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    out["checkpointed_losses"] = train(checkpointed, ids, mask, labels)
    model.eval()
    with torch.no_grad():
        out["trained_logits"] = as_list(model(input_ids=ids, attention_mask=mask).logits)
    saved = os.path.join(workdir, f"{torch.__name__}_saved")
    model.save_pretrained(saved, safe_serialization=True)
    out["saved_files"] = sorted(os.listdir(saved))
    reloaded = type(model).from_pretrained(saved)
    reloaded.eval()
    with torch.no_grad():
        out["reloaded_logits"] = as_list(reloaded(input_ids=ids, attention_mask=mask).logits)
    if kind != "bert":
        prompt = ids[:1, :4]
        gen = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=NEW_TOKENS,
                             do_sample=False, pad_token_id=0)
        out["generated"] = gen.tolist()
    return out


def main() -> None:
    warnings.simplefilter("ignore")
    transformers.logging.set_verbosity_error()
    kind, workdir = sys.argv[1], sys.argv[2]
    if "--init" in sys.argv:
        torch.manual_seed(0)
        model = build(kind)
        np.savez(os.path.join(workdir, "init.npz"),
                 **{k: v.detach().numpy() for k, v in model.state_dict().items()})
    result = run(kind, workdir)
    with open(os.path.join(workdir, f"{torch.__name__}.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
