//! The device-side per-position reductions (`qdrift_score::device`) against their host
//! definitions (`qdrift_score::logprob`), on real logits: stories260K in f32 as the reference and
//! its int4-g32 variant, teacher-forced on llama2.c's golden continuations.

use burn::tensor::{DType, Tensor};
use qdrift_generate::{BackendChoice, teacher_forced};
use qdrift_model::LlamaConfig;
use qdrift_quantize::{QuantizeOptions, Scheme, quantize_model};
use qdrift_score::{position_metrics, position_metrics_on_device};
use qdrift_tests::{device, golden_cases, load_stories};

fn logits_chunks(choice: BackendChoice, scheme: Option<&str>, sequences: &[(Vec<u32>, Vec<u32>)]) -> Vec<Tensor<3>> {
    let loaded = load_stories();
    let dev = device(choice);
    let mut weights = loaded.model.clone();
    if let Some(s) = scheme {
        weights.round_to_f16();
        let scheme: Scheme = s.parse().expect("scheme");
        weights = quantize_model(&weights, &scheme, &QuantizeOptions::default()).expect("quantizes").dequantized;
    }
    let model = LlamaConfig::from_arch(&weights.arch).init_from_host(&weights, DType::F32, &dev.device).expect("builds");
    let mut chunks = Vec::new();
    teacher_forced(&model, &dev, sequences, sequences.len(), 16, |f| chunks.push(f.logits.clone())).expect("runs");
    chunks
}

fn device_matches_host(choice: BackendChoice) {
    let n = 33;
    let sequences: Vec<(Vec<u32>, Vec<u32>)> =
        golden_cases().iter().map(|c| (c.prompt_tokens.clone(), c.greedy_tokens[..n].to_vec())).collect();
    let reference = logits_chunks(choice, None, &sequences);
    let variant = logits_chunks(choice, Some("int4-g32"), &sequences);
    let (mut worst, mut checked, mut flips) = (0.0f64, 0, 0);
    let mut start = 0;
    for (r, q) in reference.into_iter().zip(variant) {
        let [b, t, v] = r.dims();
        let tokens: Vec<u32> =
            (0..b).flat_map(|i| sequences[i].1[start..start + t].iter().copied().collect::<Vec<_>>()).collect();
        let host_r = r.to_data().try_into_vec::<f32>().expect("f32");
        let host_q = q.to_data().try_into_vec::<f32>().expect("f32");
        let d = position_metrics_on_device(r, q, &tokens).expect("device metrics");
        for k in 0..b * t {
            let h = position_metrics(&host_r[k * v..(k + 1) * v], &host_q[k * v..(k + 1) * v], tokens[k] as usize)
                .expect("host metrics");
            assert_eq!(d.top1_agree[k], h.top1_agree, "position {k}");
            flips += usize::from(!h.top1_agree);
            for (got, want) in [
                (d.kld[k], h.kld),
                (d.ref_entropy[k], h.ref_entropy),
                (d.logp_ref_of_token[k], h.logp_ref_of_token),
                (d.logp_var_of_token[k], h.logp_var_of_token),
            ] {
                let err = (f64::from(got) - want).abs() / want.abs().max(1.0);
                worst = worst.max(err);
            }
            checked += 1;
        }
        start += t;
    }
    println!("{choice:?}: {checked} positions, {flips} top-1 flips, worst error vs f64 host {worst:.2e}");
    assert_eq!(checked, sequences.len() * n);
    assert!(worst < 1e-5, "device metrics differ from the host definitions by {worst}");
}

#[test]
fn device_metrics_match_host_cpu() {
    device_matches_host(BackendChoice::Cpu);
}

#[test]
fn device_metrics_match_host_wgpu() {
    device_matches_host(BackendChoice::Wgpu);
}
