"""llama.cpp peer of `cargo xtask bench speed`: single-stream greedy decoding of the same prompts
as `qdrift generate --timing-json`, timed the same way, through llama-cpp-python.

Input: one JSON argument {"model": GGUF path, "prompts": [str], "new_tokens": int,
"threads": int}. Output: one JSON line on stdout.

Each prompt is tokenized by llama.cpp (BOS added as the GGUF says), then
`Llama.generate(..., top_k=1, temp=0)` decodes greedily: the first token's time covers the
prompt pass, `decode_tokens_per_s` counts the other `new_tokens - 1` tokens over their time,
`tokens_per_s` all new tokens over the whole time (as qdrift's fields). One untimed warm-up
prompt first. llama.cpp's CPU matmuls quantize activations (Q8_1 against Q4_1 weights), so its
tokens may differ from qdrift's FP16 reference; only the speed is compared.
"""

import json
import sys
import time

import llama_cpp
from llama_cpp import Llama


def run(llm, prompt, new_tokens):
    tokens = llm.tokenize(prompt.encode("utf-8"), add_bos=True, special=False)
    start = time.perf_counter()
    first = None
    n = 0
    for _ in llm.generate(tokens, top_k=1, top_p=1.0, temp=0.0, reset=True):
        n += 1
        if first is None:
            first = time.perf_counter()
        if n == new_tokens:
            break
    return len(tokens), first - start, time.perf_counter() - start, n


def main():
    args = json.loads(sys.argv[1])
    llm = Llama(
        model_path=args["model"],
        n_ctx=2048,
        n_batch=512,
        n_threads=args["threads"],
        n_threads_batch=args["threads"],
        logits_all=False,
        verbose=False,
    )
    # The instruction sets ggml was built with (AMX must read 0: see xtask/src/speed.rs).
    print("system_info: " + llama_cpp.llama_print_system_info().decode("utf-8", "replace").strip())
    run(llm, args["prompts"][0], 8)
    prompt_tokens = first_s = total_s = decoded = 0
    for p in args["prompts"]:
        t, first, total, n = run(llm, p, args["new_tokens"])
        prompt_tokens += t
        first_s += first
        total_s += total
        decoded += n
    streams = len(args["prompts"])
    print(
        json.dumps(
            {
                "timing": "llama-cpp-python",
                "prompts": streams,
                "prompt_tokens": prompt_tokens,
                "new_tokens": args["new_tokens"],
                "threads": args["threads"],
                "first_token_s": first_s / streams,
                "total_s": total_s,
                "tokens_per_s": decoded / total_s,
                "decode_tokens_per_s": (decoded - streams) / (total_s - first_s),
            }
        )
    )


if __name__ == "__main__":
    main()
