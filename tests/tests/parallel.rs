//! The two ways the evaluation saves time must not change a single number:
//! - batches run side by side on the CPU backend (`ComputeDevice::parallel_batches`): generation
//!   and teacher forcing give bit-identical tokens and logits with 1, 2 or 3 batches at once;
//! - the reference's logits on its own text, or its final hidden states, kept across variants,
//!   give the same report as running the reference again in lockstep with every variant.

use burn::tensor::{DType, Tensor};
use qdrift_eval::evaluate;
use qdrift_generate::{BackendChoice, ComputeDevice, Forcing, GenerationConfig, generate, teacher_forced_pair};
use qdrift_model::Llama;
use qdrift_tests::{device, golden_cases, load_stories, stories_eval};

fn host(t: &Tensor<3>) -> Vec<f32> {
    t.to_data().convert::<f32>().try_into_vec::<f32>().expect("f32 logits")
}

/// Tokens and every step's logits of greedy generation, plus every teacher-forced chunk's logits
/// of a pair of models, keyed by (first prompt, position) so that the order of the observer's
/// calls does not matter.
type Run = (Vec<Vec<u32>>, Vec<((usize, usize), Vec<f32>)>, Vec<((usize, usize), Vec<f32>, Vec<f32>)>);

fn run(device: &ComputeDevice, dtype: DType) -> Run {
    let loaded = load_stories();
    let model = Llama::from_host(&loaded.model, dtype, &device.device).expect("model builds");
    let other = Llama::from_host(&loaded.model, DType::F32, &device.device).expect("model builds");
    // Six prompts (the golden ones, cycled; the repeats cut shorter) in batches of two: three
    // batches, with left padding.
    let golden: Vec<Vec<u32>> = golden_cases().into_iter().map(|c| c.prompt_tokens).collect();
    let prompts: Vec<Vec<u32>> = (0..6)
        .map(|i| {
            let p = &golden[i % golden.len()];
            p[..p.len() - (i / golden.len()).min(p.len() - 1)].to_vec()
        })
        .collect();
    let config_gen = GenerationConfig { max_new_tokens: 40, batch_size: 2, stop_at_eos: None };
    let mut steps = Vec::new();
    let tokens = generate(&model, device, &prompts, &config_gen, |s| {
        steps.push(((s.first_prompt, s.step), host(&s.logits.clone().unsqueeze())));
    })
    .expect("generation runs");
    let sequences: Vec<(Vec<u32>, Vec<u32>)> = prompts.iter().cloned().zip(tokens.iter().cloned()).collect();
    let mut chunks = Vec::new();
    teacher_forced_pair(&model, &other, Forcing { device, sequences: &sequences, batch_size: 2, chunk: 16 }, |p| {
        chunks.push(((p.first_prompt, p.start), host(p.reference), host(p.variant)));
    })
    .expect("teacher forcing runs");
    steps.sort_by_key(|(k, _)| *k);
    chunks.sort_by_key(|(k, _, _)| *k);
    (tokens, steps, chunks)
}

#[test]
fn batches_side_by_side_change_nothing() {
    let base = device(BackendChoice::Cpu);
    for dtype in [DType::F32, DType::F16] {
        let one = run(&ComputeDevice { parallel_batches: 1, ..base.clone() }, dtype);
        assert_eq!(one.1.len(), 3 * 40, "one logits row per batch and step");
        for threads in [2, 3] {
            let many = run(&ComputeDevice { parallel_batches: threads, ..base.clone() }, dtype);
            assert!(one == many, "{dtype:?}: {threads} batches at once differ from one at a time");
        }
    }
}

#[test]
fn kept_reference_logits_or_hidden_states_give_the_lockstep_report() {
    let mut cfg = stories_eval(6, 4, &["int8", "int4-g32"]);
    let kept = evaluate(&cfg, &mut |_| {}).expect("evaluation with kept reference logits");
    // 6 prompts × 30 positions: logits 368,640 bytes, f16 hidden states 23,040 bytes.
    cfg.reference_logits_budget = 100_000;
    let hidden = evaluate(&cfg, &mut |_| {}).expect("evaluation with kept reference hidden states");
    cfg.reference_logits_budget = 0;
    let lockstep = evaluate(&cfg, &mut |_| {}).expect("evaluation in lockstep");
    assert_eq!(kept.variants.len(), 3);
    assert!(
        kept.variants.iter().any(|v| v.horizons[1].metric("kld").is_some_and(|k| k.mean > 0.0)),
        "the schemes must diverge"
    );
    let json = |r: &qdrift_report::Report| serde_json::to_string(&r.variants).expect("serializes");
    assert_eq!(json(&kept), json(&lockstep));
    assert_eq!(json(&hidden), json(&lockstep), "logits from kept hidden states are the logits");
}
