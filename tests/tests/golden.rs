//! stories260K against llama2.c's reference C implementation (`golden_greedy_fp32.json`):
//! tokenization, next-token logits, greedy continuations, batch invariance and f16 agreement,
//! on the CPU backend and on wgpu (Mesa's lavapipe where there is no GPU).

use burn::tensor::DType;
use qdrift_generate::BackendChoice;
use qdrift_tests::{device, golden_cases, load_stories, run_greedy};

#[test]
fn tokenization_matches_llama2c() {
    let loaded = load_stories();
    for case in golden_cases() {
        assert_eq!(loaded.tokenizer.encode(&case.prompt), case.prompt_tokens, "prompt {:?}", case.prompt);
        let all: Vec<u32> = case.prompt_tokens.iter().chain(&case.greedy_tokens).copied().collect();
        assert_eq!(loaded.tokenizer.decode(&all), case.text, "decoded text of {:?}", case.prompt);
    }
}

fn golden_f32(choice: BackendChoice) {
    let loaded = load_stories();
    let dev = device(choice);
    let cases = golden_cases();
    let prompts: Vec<Vec<u32>> = cases.iter().map(|c| c.prompt_tokens.clone()).collect();
    let n = cases.iter().map(|c| c.greedy_tokens.len()).max().unwrap_or(0);
    let (tokens, logits) = run_greedy(&loaded, &dev, DType::F32, &prompts, n, prompts.len());
    for (i, case) in cases.iter().enumerate() {
        let max_abs = logits[i].iter().zip(&case.next_token_logits).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
        println!("{} {:?}: next-token logits max |Δ| = {max_abs:.2e}", dev.adapter, case.prompt);
        assert!(max_abs <= 1e-4, "{:?}: logits differ by {max_abs}", case.prompt);
        let got = &tokens[i][..case.greedy_tokens.len()];
        let first_diff = got.iter().zip(&case.greedy_tokens).position(|(a, b)| a != b);
        assert_eq!(first_diff, None, "{:?}: greedy tokens diverge at {first_diff:?}", case.prompt);
    }
}

#[test]
fn golden_f32_cpu() {
    golden_f32(BackendChoice::Cpu);
}

#[test]
fn golden_f32_wgpu() {
    golden_f32(BackendChoice::Wgpu);
}

fn batch_invariance(choice: BackendChoice) {
    let loaded = load_stories();
    let dev = device(choice);
    let prompts: Vec<Vec<u32>> = golden_cases().into_iter().map(|c| c.prompt_tokens).collect();
    let n = 128;
    let (batched, _) = run_greedy(&loaded, &dev, DType::F32, &prompts, n, prompts.len());
    for (i, p) in prompts.iter().enumerate() {
        let (alone, _) = run_greedy(&loaded, &dev, DType::F32, std::slice::from_ref(p), n, 1);
        assert_eq!(alone[0], batched[i], "prompt {i} alone vs in a batch of {}", prompts.len());
    }
}

#[test]
fn batch_invariance_cpu() {
    batch_invariance(BackendChoice::Cpu);
}

/// On the CPU, batches that would run side by side decode as one fused batch
/// (`generate_batches`); the observer must still see each batch of `batch_size` on its own, with
/// the logits and hidden states, bit for bit, of batches run one at a time.
#[test]
fn fused_decoding_hands_each_batch_to_the_observer_as_if_unfused() {
    use qdrift_generate::{GenerationConfig, generate};
    use qdrift_model::Llama;
    use std::collections::BTreeMap;
    let loaded = load_stories();
    let prompts: Vec<Vec<u32>> = golden_cases().into_iter().map(|c| c.prompt_tokens).collect();
    assert_eq!(prompts.len(), 5, "batches [0, 1] [2, 3] [4]: a fused pair, then a short batch alone");
    let config = GenerationConfig { max_new_tokens: 12, batch_size: 2, stop_at_eos: None };
    // (first prompt, step) → (rows, logits bits, hidden bits).
    type Calls = BTreeMap<(usize, usize), (usize, Vec<u32>, Vec<u32>)>;
    let run = |parallel_batches: usize| -> (Vec<Vec<u32>>, Calls) {
        let mut dev = device(BackendChoice::Cpu);
        dev.parallel_batches = parallel_batches;
        let model = Llama::from_host(&loaded.model, DType::F32, &dev.device).expect("model builds");
        let mut calls = Calls::new();
        let tokens = generate(&model, &dev, &prompts, &config, |s| {
            let bits = |v: Vec<f32>| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
            let logits = bits(s.logits.to_data().try_into_vec::<f32>().expect("f32 logits"));
            let hidden = bits(s.hidden.to_data().try_into_vec::<f32>().expect("f32 hidden"));
            let rows = s.logits.dims()[0];
            assert_eq!(s.hidden.dims()[0], rows);
            let again = calls.insert((s.first_prompt, s.step), (rows, logits, hidden));
            assert!(again.is_none(), "batch at prompt {} step {} observed twice", s.first_prompt, s.step);
        })
        .expect("generation runs");
        (tokens, calls)
    };
    let (one_at_a_time, want) = run(1);
    let (fused, got) = run(2);
    assert_eq!(fused, one_at_a_time);
    assert_eq!(want.len(), 3 * 12, "three batches, twelve steps");
    assert_eq!(got.keys().collect::<Vec<_>>(), want.keys().collect::<Vec<_>>());
    for (key, w) in &want {
        assert!(got[key] == *w, "batch at prompt {} step {}: rows or bits differ", key.0, key.1);
    }
}

#[test]
fn batch_invariance_wgpu() {
    batch_invariance(BackendChoice::Wgpu);
}

fn f16_agreement(choice: BackendChoice) {
    let loaded = load_stories();
    let dev = device(choice);
    let cases = golden_cases();
    let prompts: Vec<Vec<u32>> = cases.iter().map(|c| c.prompt_tokens.clone()).collect();
    let (tokens, _) = run_greedy(&loaded, &dev, DType::F16, &prompts, 100, prompts.len());
    for (i, case) in cases.iter().enumerate() {
        let same = tokens[i].iter().zip(&case.greedy_tokens).filter(|(a, b)| a == b).count();
        let prefix = tokens[i].iter().zip(&case.greedy_tokens).take_while(|(a, b)| a == b).count();
        println!(
            "f16 on {}: {:?}: {same}/100 of the first 100 tokens match the f32 golden (identical prefix {prefix})",
            dev.adapter, case.prompt
        );
        assert!(prefix >= 10, "{:?}: f16 diverges from the f32 golden at token {prefix}", case.prompt);
    }
}

#[test]
fn f16_agreement_cpu() {
    f16_agreement(BackendChoice::Cpu);
}

#[test]
fn f16_agreement_wgpu() {
    f16_agreement(BackendChoice::Wgpu);
}

/// Teacher forcing the golden continuation (one pass, in chunks) gives the same logits as
/// decoding it step by step, and its argmax reproduces llama2.c's greedy tokens.
fn teacher_forcing_matches_decoding(choice: BackendChoice) {
    use qdrift_generate::{Forcing, GenerationConfig, generate, teacher_forced};
    let loaded = load_stories();
    let dev = device(choice);
    let n = 40;
    let cases = golden_cases();
    let model = qdrift_model::Llama::from_host(&loaded.model, DType::F32, &dev.device).expect("model builds");
    let prompts: Vec<Vec<u32>> = cases.iter().map(|c| c.prompt_tokens.clone()).collect();
    let mut stepwise = vec![vec![Vec::new(); n]; prompts.len()];
    let config = GenerationConfig { max_new_tokens: n, batch_size: prompts.len(), stop_at_eos: None };
    generate(&model, &dev, &prompts, &config, |s| {
        let v = s.logits.dims()[1];
        let data = s.logits.to_data().try_into_vec::<f32>().expect("f32");
        for (b, row) in data.chunks(v).enumerate() {
            stepwise[s.first_prompt + b][s.step] = row.to_vec();
        }
    })
    .expect("generation");
    let sequences: Vec<(Vec<u32>, Vec<u32>)> =
        cases.iter().map(|c| (c.prompt_tokens.clone(), c.greedy_tokens[..n].to_vec())).collect();
    let mut worst = 0.0f32;
    let mut seen = 0;
    teacher_forced(&model, Forcing { device: &dev, sequences: &sequences, batch_size: 2, chunk: 7 }, |f| {
        let [b, t, v] = f.logits.dims();
        let data = f.logits.to_data().try_into_vec::<f32>().expect("f32");
        for i in 0..b {
            for j in 0..t {
                let row = &data[(i * t + j) * v..(i * t + j + 1) * v];
                let (p, pos) = (f.first_prompt + i, f.start + j);
                let argmax = row.iter().enumerate().fold(0, |m, (k, x)| if *x > row[m] { k } else { m });
                assert_eq!(argmax as u32, cases[p].greedy_tokens[pos], "prompt {p} position {pos}");
                let d = row.iter().zip(&stepwise[p][pos]).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
                worst = worst.max(d);
                seen += 1;
            }
        }
    })
    .expect("teacher forcing");
    println!("{}: teacher-forced vs step-by-step logits, max |Δ| = {worst:.2e}", dev.adapter);
    assert_eq!(seen, cases.len() * n);
    assert!(worst <= 1e-4, "teacher-forced logits differ by {worst}");
}

#[test]
fn teacher_forcing_matches_decoding_cpu() {
    teacher_forcing_matches_decoding(BackendChoice::Cpu);
}

#[test]
fn teacher_forcing_matches_decoding_wgpu() {
    teacher_forcing_matches_decoding(BackendChoice::Wgpu);
}
