"""Probe: per-forward shapes and times in an SD K 4 batch-4 run, against the same shapes without inner holes."""
import json, sys, time, statistics as st
import torch
sys.path.insert(0, "/work/main")
from engine import LLM, SamplingParams, SpeculativeConfig
from engine import kv_cache

LOG = []
orig = kv_cache.KVState.extend
def extend(self, tokens, valid=None, logits_to_keep=0):
    B, T = tokens.shape
    L = self.mask.shape[1]
    real = int(self.lengths.max()) if self.lengths.numel() else 0
    t0 = time.perf_counter()
    out = orig(self, tokens, valid, logits_to_keep)
    LOG.append(dict(model=type(self.model).__name__ + str(id(self.model) % 1000), B=B, T=T, width=L, real=real,
                    holes=int((self.mask[:, :L] == 0).sum()), ms=(time.perf_counter() - t0) * 1e3,
                    keep=int(logits_to_keep) if not torch.is_tensor(logits_to_keep) else -1))
    return out
kv_cache.KVState.extend = extend

prompts = [json.loads(l)["prompt"] for l in open("/work/main/reports/cpu-default-pair-validation/prompts.jsonl")][:int(sys.argv[1])]
B = int(sys.argv[2])
with LLM("qwen-coder-1.5b", "qwen-coder-0.5b", strategy="sd", dtype="bfloat16", draft_int8=True, threads=1,
         speculative=SpeculativeConfig(K=4), max_num_seqs=B) as llm:
    llm.generate(prompts[:1], SamplingParams(temperature=0, max_new_tokens=8, stop_on_eos=False))
    LOG.clear()
    out = llm.generate(prompts, SamplingParams(temperature=0, max_new_tokens=128, stop_on_eos=False))
json.dump(LOG, open(sys.argv[3], "w"))
print(len(LOG), "forwards")
