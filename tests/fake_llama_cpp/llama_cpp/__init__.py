"""A stand-in for llama-cpp-python (which builds llama.cpp, so CI does not install it).

It answers the calls `mlxcel_py.bench.peer_llama_cpp` makes, so the peer's plumbing (worker protocol,
configurations, timing, the bench table) is tested without llama.cpp: it "generates" the prompt's
tokens in a loop, at about one token per millisecond, and logs each request's drafter width to
the file named by FAKE_LLAMA_LOG so a test can check what the worker asked for.
"""

import json
import os
import sys
import time

llama_cpp = sys.modules[__name__]  # the real package exposes its ctypes layer as llama_cpp.llama_cpp


class _Params:
    use_extra_bufts = True


def llama_model_default_params():
    return _Params()


class Llama:
    def __init__(self, model_path, logits_all=False, **kwargs):
        if not os.path.isfile(model_path):
            raise ValueError(f"Model path does not exist: {model_path}")
        self.draft_model = None
        self.logits_all = logits_all

    def token_eos(self):
        return -1

    def reset(self):
        pass

    def generate(self, tokens, **kwargs):
        with open(os.environ["FAKE_LLAMA_LOG"], "a") as log:
            width = self.draft_model.num_pred_tokens if self.draft_model else None
            log.write(json.dumps({"width": width, "prompt": len(tokens), "temp": kwargs.get("temp"),
                                  "logits_all": self.logits_all}) + "\n")
        i = 0
        while True:
            time.sleep(0.001)
            yield tokens[i % len(tokens)]
            i += 1
