//! Loading: model checkpoints and tokenizers into host memory.
//!
//! This crate is the first stage of qdrift's pipeline (load → quantize → generate → score →
//! report → gate). It turns files into [`HostModel`] (an architecture description plus f32
//! weights in a fixed, documented layout; the types live in `qdrift-weights` and are re-exported
//! here) and a [`Tokenizer`]. It does no tensor computation and
//! depends on no tensor library, so the quantizers and the tests can use it cheaply.
//!
//! [`open_model`] picks the format from the path:
//!
//! | path | format | reader | tokenizer |
//! |---|---|---|---|
//! | `*.bin` | llama2.c legacy checkpoint | [`read_llama2c_checkpoint`] | llama2.c `tokenizer.bin` ([`Llama2cTokenizer`]) |
//! | `*.gguf` | GGUF v2/v3 `llama` or `qwen2`, dequantized with `qdrift-ggml` | [`read_gguf`] | embedded: `gpt2` byte-level BPE or `llama` SentencePiece ([`gguf_tokenizer`]) |
//! | a folder | Hugging Face `config.json` + safetensors (F32/F16/BF16, sharded or not; GPTQ, AWQ, compressed-tensors and FP8 quantized folders dequantized on load): Llama, Mistral, Qwen2 | [`read_hf_folder`] | `tokenizer.json` via the `tokenizers` crate ([`HfTokenizer`]) |
//! | `synthetic:NAME[:SEED]` | seeded random weights of a real shape | [`synthetic_model`] | byte level ([`byte_tokenizer`]) |
//!
//! Every reader checks the file against its spec (cited in each module) before allocating, and
//! every bad input is a [`LoadError`] naming the file and, where it applies, the tensor and its
//! expected shape. Before a file is opened its type is checked (a named pipe, a device or a
//! socket is refused unopened); small files read whole (JSON, tokenizers) have a size cap;
//! declared counts are checked against the file's length before anything is allocated; every
//! weight is checked to be finite after decoding. [`LoadedModel`] also carries the source dtypes, the chat template, the
//! [`ModelFormat`] (which says whether the weights are synthetic) and, for a quantized Hugging
//! Face folder, its [`CheckpointQuant`] (stored format and declared dynamic activations) for
//! reports and `qdrift eval`.
//!
//! Beside the readers: [`write`](mod@write) writes a model as a Hugging Face folder or a GGUF file (fixtures
//! for round-trip tests, and `qdrift quantize --format gguf`'s writer, which stores ggml blocks as
//! the caller packed them with the source's tokenizer metadata, a Hugging Face `tokenizer.json`
//! converted to GGUF's vocabulary), [`hf::quant`] packs codes in each Hugging Face quantized layout
//! (the fixture writer of `qdrift-quantize` uses it), and [`inspect`] accounts parameters, weight
//! memory per storage scheme, KV-cache memory, FLOPs per token and a GGUF file's stored bytes and
//! bits per weight per tensor type.
//!
//! **Architecture invariant:** weights leave this crate as f32 in [`HostModel`]'s layout
//! (`[out, in]` linears, q/k rows and biases in the interleaved RoPE layout) whatever the source
//! format; a checkpoint feature that [`HostModel`] cannot carry (another RoPE scaling, other
//! biases, partial rotary dimensions) is refused by its reader, never dropped.

//!
//! The modules, by format (each format's module lists its files):
//!
//! | module | contents |
//! |---|---|
//! | [`gguf`] | GGUF: `read`, `tokenizer` (embedded tokenizer, both ways), `hf_vocab` (a `tokenizer.json` as GGUF metadata), `write` |
//! | `arch/` | one table of the architectures (`table.rs`, one entry per family: names, block features, `config.json` rules, experts, GGUF rules) that the readers and the GGUF writer look up |
//! | [`hf`] | Hugging Face folders: `read`, `config`, `shards` (safetensors), `quant/` (one file per quantized layout, unpacking and packing side by side), `tokenizer`, `write` |
//! | `llama2c.rs` | llama2.c checkpoints ([`read_llama2c_checkpoint`]) |
//! | `synthetic.rs` | seeded random models ([`synthetic_model`]) and the byte-level tokenizer |
//! | `open.rs` | [`open_model`]: the format from the path |
//! | `loaded.rs` | [`LoadedModel`], [`ModelFormat`], [`CheckpointQuant`]: what every reader returns |
//! | `tokenizer.rs` | the [`Tokenizer`] trait; [`Llama2cTokenizer`] (llama2.c's SentencePiece-style encoder, also GGUF `llama` and synthetic) |
//! | [`inspect`], `storage.rs` | resource accounting; the stored size per tensor type ([`inspect::SourceStorage`]) |
//! | [`write`](mod@write) | the writers, gathered: [`hf::write_hf_folder`], [`gguf::write_gguf`], [`gguf::write_gguf_with`] and the GGUF tokenizer metadata |
//! | `input.rs`, `floats.rs`, `names.rs`, `rope_layout.rs`, `rope_values.rs`, [`ofp8`], `error.rs` | reading files within a budget and the finiteness check; little-endian floats; layer and expert indices in tensor names; the RoPE row orders; the check that RoPE's derived frequencies are numbers; OCP FP8 decoding; [`LoadError`] |
//!
//! Module imports run one way: `open` → the formats → `arch`, `loaded`, `tokenizer`, `storage`
//! and the helpers; `gguf` uses `hf` (GGUF's byte-level BPE is built with the `tokenizers` crate, and a
//! Hugging Face folder is written as GGUF), never the reverse.

#![forbid(unsafe_code)]

mod arch;
mod error;
mod floats;
pub mod gguf;
pub mod hf;
mod input;
pub mod inspect;
mod llama2c;
mod loaded;
mod names;
pub mod ofp8;
mod open;
mod rope_layout;
mod rope_values;
mod storage;
mod synthetic;
mod tokenizer;

pub mod write {
    //! The writers: a [`HostModel`](crate::HostModel) as a Hugging Face folder ([`write_hf_folder`])
    //! or a GGUF file ([`write_gguf`], [`write_gguf_with`]), and the GGUF tokenizer metadata of a
    //! loaded model ([`gguf_tokenizer_keys`]; a Hugging Face `tokenizer.json` converted by
    //! [`hf_tokenizer_keys`]).
    //!
    //! The Hugging Face writer and [`write_gguf`] exist so that the readers can be tested against a
    //! known model (stories260K) without downloading checkpoints; [`write_gguf_with`] is also
    //! `qdrift quantize --format gguf`'s writer.

    pub use crate::gguf::{
        GgufMatrix, GgufStored, UNMERGED_SCORE, gguf_tokenizer_keys, hf_tokenizer_keys, llama2c_tokenizer_keys,
        write_gguf, write_gguf_with,
    };
    pub use crate::hf::{WriteDtype, write_hf_folder};
}

pub use error::LoadError;
pub use gguf::{
    GgufModel, GgufTensorSize, GgufTokenizerMetadata, GgufValue, gguf_tokenizer, read_gguf, read_gguf_metadata,
};
pub use hf::{HfTokenizer, read_hf_folder};
pub use llama2c::read_llama2c_checkpoint;
pub use loaded::{
    ActivationFormat, ActivationGranularity, CheckpointActivations, CheckpointQuant, LoadedModel, ModelFormat,
};
pub use open::{open_model, open_source};
pub use qdrift_weights::{
    Activation, ArchShape, BlockSpec, Experts, Ffn, HeldModel, HostModel, HostTensor, LayerWeights, LinearName, Mlp,
    ModelArch, MoeSpec, NormStyle, RopeScaling, Routing, SharedExpert, SourceError, WeightSource,
};
pub use rope_layout::{rotate_half_row_order, rotate_half_row_order_partial};
pub use synthetic::{
    SYNTHETIC_PRESETS, SYNTHETIC_STD, SyntheticSource, byte_tokenizer, synthetic_arch, synthetic_model,
    synthetic_source,
};
pub use tokenizer::{Llama2cTokenizer, SpecialIds, Tokenizer};
