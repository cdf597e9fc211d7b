//! The bf16 reference (`--dtype bf16`) on stories260K against the independent f64 forward pass
//! with the same bf16 roundings (`qdrift_tests::reference64::Compute::Bf16`, which lists them:
//! where `transformers`' bf16 inference rounds), on 64 seeded sequences of 8 tokens, each run as
//! generation runs it (4 tokens in one pass, then one at a time through the KV cache).
//!
//! The model accumulates in f32 and rounds once per operation; the f64 pass rounds the exact
//! value. They agree bit for bit unless the two straddle a bf16 rounding boundary somewhere (one
//! value in tens of thousands), which sends them to neighbours one bf16 ulp apart, and that
//! difference then travels on through every later position. So the check counts sequences and
//! positions whose logits are bit-identical. A rounding in the wrong place, one missing or one
//! extra, changes nearly every logit of every position past the first: with Burn's scalar
//! multiply (the attention scale rounded to bf16 first) 2 of 64 such sequences were exact.

use burn::tensor::{DType, Device};
use qdrift_model::{AttentionKernel, Llama};
use qdrift_quantize::{ReferenceFormat, round_to_reference};
use qdrift_tests::load_stories;
use qdrift_tests::reference64::{Compute, Rounding, naive_logits};

/// Sequences and their length.
const SEQUENCES: usize = 64;
const LENGTH: usize = 8;

/// Measured: 50 of 64 sequences and 475 of 512 positions bit-identical.
const MIN_EXACT_SEQUENCES: usize = 40;
const MIN_EXACT_POSITIONS: usize = 440;

#[test]
fn stories260k_in_bf16_is_the_f64_pass_with_bf16_roundings_bit_for_bit() {
    let mut loaded = load_stories();
    round_to_reference(&mut loaded.model, ReferenceFormat::Bf16);
    let device = Device::flex();
    let model = Llama::from_host(&loaded.model, DType::BF16, &device).expect("bf16 model");
    assert_eq!(model.dtype(), DType::BF16);
    let vocab = loaded.model.arch.vocab_size as u64;
    let (mut exact_sequences, mut exact_positions, mut exact_plain) = (0, 0, 0);
    let mut worst = 0.0f64;
    for s in 0..SEQUENCES as u64 {
        let tokens: Vec<u32> =
            (0..LENGTH as u64).map(|i| ((s * 7919 + i * 104_729 + 13) % (vocab - 1) + 1) as u32).collect();
        let got = qdrift_tests::cached_logits(&model, &device, &tokens, (LENGTH / 2, 1), AttentionKernel::Host);
        // Every logit is a bf16 value: the output layer rounds, as a bf16 `nn.Linear` does.
        assert!(got.iter().flatten().all(|v| v.to_bits() & 0xFFFF == 0), "a logit is not a bf16 value");
        let want = naive_logits(&loaded.model, &tokens, &Rounding { compute: Compute::Bf16, ..Default::default() });
        let plain = naive_logits(&loaded.model, &tokens, &Rounding::default());
        let same = |g: &[f32], w: &[f64]| g.iter().zip(w).all(|(&g, &w)| f64::from(g) == w);
        let exact = got.iter().zip(&want).filter(|(g, w)| same(g, w)).count();
        exact_positions += exact;
        exact_sequences += usize::from(exact == LENGTH);
        exact_plain += got.iter().zip(&plain).filter(|(g, w)| same(g, w)).count();
        worst =
            got.iter().flatten().zip(want.iter().flatten()).fold(worst, |m, (&g, &w)| m.max((f64::from(g) - w).abs()));
    }
    println!(
        "stories260K in bf16 against the f64 pass with bf16 roundings: {exact_sequences}/{SEQUENCES} sequences and \
         {exact_positions}/{} positions bit-identical (max |Δlogit| elsewhere {worst:.2e}); against the plain f64 pass \
         {exact_plain} positions",
        SEQUENCES * LENGTH
    );
    assert!(exact_sequences >= MIN_EXACT_SEQUENCES, "{exact_sequences} sequences bit-identical");
    assert!(exact_positions >= MIN_EXACT_POSITIONS, "{exact_positions} positions bit-identical");
    assert_eq!(exact_plain, 0, "the bf16 model gives the plain f64 pass's logits");
}

/// The roundings are where they are said to be: with the model's own weights, the f64 pass
/// without them is a plain f64 forward pass (each rounding is the identity), and the bf16
/// one changes every position.
#[test]
fn the_bf16_roundings_change_the_f64_pass_and_only_under_bf16() {
    let mut loaded = load_stories();
    round_to_reference(&mut loaded.model, ReferenceFormat::Bf16);
    let tokens = loaded.tokenizer.encode("Once upon a time");
    let plain = naive_logits(&loaded.model, &tokens, &Rounding::default());
    let f64_mode = naive_logits(&loaded.model, &tokens, &Rounding { compute: Compute::F64, ..Default::default() });
    assert_eq!(plain, f64_mode);
    let bf16 = naive_logits(&loaded.model, &tokens, &Rounding { compute: Compute::Bf16, ..Default::default() });
    assert!(plain.iter().zip(&bf16).all(|(a, b)| a != b), "a position is unchanged by bf16's roundings");
    assert!(bf16.iter().flatten().all(|&v| v == Compute::Bf16.round(v)), "a logit is not a bf16 value");
}
