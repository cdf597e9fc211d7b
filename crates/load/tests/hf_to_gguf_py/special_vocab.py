#!/usr/bin/env python3
"""gguf-py's own SpecialVocab on a Hugging Face folder, for crates/load/tests/hf_to_gguf_tokenizer.rs.

Usage: special_vocab.py DIR merges|N_VOCAB

Runs `gguf.SpecialVocab(DIR, load_merges=True)` (as convert_hf_to_gguf.py's `_set_vocab_gpt2`
does) or `gguf.SpecialVocab(DIR, n_vocab=N_VOCAB)` (as `_set_vocab_llama_hf` does), writes what
its `add_to_gguf` adds into a GGUF file with gguf-py's `GGUFWriter`, reads the file back with
`GGUFReader`, and prints its `tokenizer.*` keys as one JSON object (strings, booleans, integers,
lists). This covers the merges, the special token ids, the add_*_token flags and the chat
template(s); the tokens, token types and scores come from `LlamaHfVocab` / `get_vocab_base`,
which need `transformers`, and are not covered here.

Run by the test when QDRIFT_GGUF_PY names a Python with gguf-py (opt-in; skipped otherwise):

    python3 -m venv /var/tmp/gguf-venv && /var/tmp/gguf-venv/bin/pip install gguf==0.19.0 numpy
    QDRIFT_GGUF_PY=/var/tmp/gguf-venv/bin/python \
        cargo test --release --workspace --test hf_to_gguf_tokenizer
"""

import json
import logging
import os
import sys
import tempfile

import gguf

logging.disable(logging.WARNING)


def main() -> None:
    folder, mode = sys.argv[1], sys.argv[2]
    if mode == "merges":
        vocab = gguf.SpecialVocab(folder, load_merges=True)
    else:
        vocab = gguf.SpecialVocab(folder, n_vocab=int(mode))
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "special.gguf")
        writer = gguf.GGUFWriter(path, "llama")
        vocab.add_to_gguf(writer, quiet=True)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        reader = gguf.GGUFReader(path)
        out = {}
        for name, field in reader.fields.items():
            if not name.startswith("tokenizer."):
                continue
            if field.types[0] == gguf.GGUFValueType.ARRAY:
                out[name] = [field.contents(i) for i in range(len(field.data))]
            else:
                out[name] = field.contents()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
