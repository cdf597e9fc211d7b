//! The device-side per-position reductions (`qdrift_score::device`) against their host
//! definitions (`qdrift_score::logprob`), on real logits: stories260K in f32 as the reference and
//! its int4-g32 variant, teacher-forced on llama2.c's golden continuations; and the compact
//! (top-K + tail) reference against its host definitions.

use burn::tensor::{DType, Tensor};
use qdrift_generate::{BackendChoice, Forcing, teacher_forced, teacher_forced_pair};
use qdrift_model::Llama;
use qdrift_quantize::{QuantizeOptions, Scheme, quantize_model};
use qdrift_score::{
    compact_kl, compact_position, compact_reference_on_device, kl_divergence, position_metrics,
    position_metrics_against_compact, position_metrics_on_device, token_logprobs_on_device, variant_on_compact,
};
use qdrift_tests::{device, golden_cases, load_stories};

/// How far one quantity computed by two device graphs may differ, relative to `max(1, |x|)`: on
/// wgpu, Burn's fusion compiles each graph's reductions and elementwise chains into its own
/// kernels, so a sum over the vocabulary may be taken in another order (ARCHITECTURE.md, "Fusion
/// and autotune on wgpu"). A few f32 roundings; the CPU backend computes both bit for bit alike.
const SAME_QUANTITY: f64 = 1e-6;

/// The largest relative difference between two vectors of one quantity from two device graphs.
fn graph_difference(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len(), "lengths");
    a.iter()
        .zip(b)
        .map(|(&x, &y)| (f64::from(x) - f64::from(y)).abs() / f64::from(y).abs().max(1.0))
        .fold(0.0, f64::max)
}

/// `a` and `b` hold one quantity from two device graphs: equal on the CPU backend, within
/// [`SAME_QUANTITY`] on wgpu.
fn assert_same_quantity(choice: BackendChoice, a: &[f32], b: &[f32], what: &str) {
    match choice {
        BackendChoice::Cpu => assert_eq!(a, b, "{what}"),
        _ => {
            let d = graph_difference(a, b);
            assert!(d <= SAME_QUANTITY, "{what}: differ by {d:e}");
        }
    }
}

fn build(choice: BackendChoice, scheme: Option<&str>) -> qdrift_model::Llama {
    let loaded = load_stories();
    let dev = device(choice);
    let mut weights = loaded.model.clone();
    if let Some(s) = scheme {
        weights.round_to_f16();
        let scheme: Scheme = s.parse().expect("scheme");
        weights = quantize_model(&weights, &scheme, &QuantizeOptions::default()).expect("quantizes").dequantized;
    }
    Llama::from_host(&weights, DType::F32, &dev.device).expect("builds")
}

fn logits_chunks(choice: BackendChoice, scheme: Option<&str>, sequences: &[(Vec<u32>, Vec<u32>)]) -> Vec<Tensor<3>> {
    let dev = device(choice);
    let model = build(choice, scheme);
    let mut chunks = Vec::new();
    teacher_forced(&model, Forcing { device: &dev, sequences, batch_size: sequences.len(), chunk: 16 }, |f| {
        chunks.push(f.logits.clone())
    })
    .expect("runs");
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
        let tokens: Vec<u32> = (0..b).flat_map(|i| sequences[i].1[start..start + t].to_vec()).collect();
        let host_r = r.to_data().try_into_vec::<f32>().expect("f32");
        let host_q = q.to_data().try_into_vec::<f32>().expect("f32");
        let lp = token_logprobs_on_device(r.clone(), &tokens).expect("device log-probabilities");
        let d = position_metrics_on_device(r, q, &tokens).expect("device metrics");
        assert_same_quantity(
            choice,
            &lp,
            &d.logp_ref_of_token,
            "token_logprobs_on_device and position_metrics_on_device's",
        );
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

/// The compact reference on the device ([`compact_reference_on_device`],
/// [`position_metrics_against_compact`]) against its host definitions (`qdrift_score::compact`):
/// same top-K set, same tail, same lower-bound KL; the reference against itself gives exactly 0.
fn compact_matches_host(choice: BackendChoice) {
    let (n, k) = (33, 16);
    let sequences: Vec<(Vec<u32>, Vec<u32>)> =
        golden_cases().iter().map(|c| (c.prompt_tokens.clone(), c.greedy_tokens[..n].to_vec())).collect();
    let reference = logits_chunks(choice, None, &sequences);
    let variant = logits_chunks(choice, Some("int4-g32"), &sequences);
    let (mut worst, mut checked, mut ratio_min) = (0.0f64, 0, f64::INFINITY);
    let mut start = 0;
    for (r, q) in reference.into_iter().zip(variant) {
        let [b, t, v] = r.dims();
        let tokens: Vec<u32> = (0..b).flat_map(|i| sequences[i].1[start..start + t].to_vec()).collect();
        let host_r = r.to_data().try_into_vec::<f32>().expect("f32");
        let host_q = q.to_data().try_into_vec::<f32>().expect("f32");
        let c = compact_reference_on_device(r.clone(), &tokens, k).expect("compact reference");
        let exact = position_metrics_on_device(r.clone(), q.clone(), &tokens).expect("exact metrics");
        let d = position_metrics_against_compact(&c, q, &tokens).expect("compact metrics");
        let same = position_metrics_against_compact(&c, r, &tokens).expect("compact metrics");
        let zeros = vec![0.0; same.kld.len()];
        assert_same_quantity(choice, &same.kld, &zeros, "the reference against its own compact self");
        assert_eq!(d.top1_agree, exact.top1_agree, "top-1 is kept exactly");
        assert_same_quantity(choice, &d.logp_ref_of_token, &exact.logp_ref_of_token, "log p of the reference");
        assert_same_quantity(choice, &d.logp_var_of_token, &exact.logp_var_of_token, "log p of the variant");
        assert_same_quantity(choice, &d.ref_entropy, &exact.ref_entropy, "reference entropy");
        for i in 0..b * t {
            let (rl, ql) = (&host_r[i * v..(i + 1) * v], &host_q[i * v..(i + 1) * v]);
            let h = compact_position(rl, k).expect("host compact");
            let mut ids = c.top_ids[i * k..(i + 1) * k].to_vec();
            let mut host_ids = h.top_ids.clone();
            ids.sort_unstable();
            host_ids.sort_unstable();
            assert_eq!(ids, host_ids, "top-{k} set at position {i}");
            let (top_q, tail_q) = variant_on_compact(ql, &h.top_ids).expect("host variant");
            let want = compact_kl(&h.top_logp, h.tail_logp, &top_q, tail_q).expect("host kl");
            let full = kl_divergence(rl, ql).expect("host exact kl");
            assert!(want <= full + 1e-12, "KL_K {want} above the exact {full}");
            if full > 1e-6 {
                ratio_min = ratio_min.min(want / full);
            }
            worst = worst.max((f64::from(c.tail_logp[i]) - h.tail_logp).abs() / h.tail_logp.abs().max(1.0));
            worst = worst.max((f64::from(d.kld[i]) - want).abs() / want.abs().max(1.0));
            checked += 1;
        }
        start += t;
    }
    println!(
        "{choice:?}: {checked} positions, K = {k} of 512: worst error vs f64 host {worst:.2e}, smallest KL_K/KL {ratio_min:.4}"
    );
    assert_eq!(checked, sequences.len() * n);
    assert!(worst < 1e-5, "compact device values differ from the host definitions by {worst}");
}

#[test]
fn compact_reference_matches_host_cpu() {
    compact_matches_host(BackendChoice::Cpu);
}

#[test]
fn compact_reference_matches_host_wgpu() {
    compact_matches_host(BackendChoice::Wgpu);
}

/// Scoring two models in lockstep gives each model exactly the logits it gives alone.
#[test]
fn paired_teacher_forcing_equals_separate_runs() {
    let choice = BackendChoice::Cpu;
    let dev = device(choice);
    let sequences: Vec<(Vec<u32>, Vec<u32>)> =
        golden_cases().iter().map(|c| (c.prompt_tokens.clone(), c.greedy_tokens[..20].to_vec())).collect();
    let (r, q) = (build(choice, None), build(choice, Some("int8")));
    let alone_r = logits_chunks(choice, None, &sequences);
    let alone_q = logits_chunks(choice, Some("int8"), &sequences);
    let mut paired = Vec::new();
    teacher_forced_pair(
        &r,
        &q,
        Forcing { device: &dev, sequences: &sequences, batch_size: sequences.len(), chunk: 16 },
        |p| paired.push((p.start, p.reference.clone(), p.variant.clone())),
    )
    .expect("runs");
    assert_eq!(paired.len(), alone_r.len());
    for ((start, pr, pq), (ar, aq)) in paired.into_iter().zip(alone_r.into_iter().zip(alone_q)) {
        let f = |t: Tensor<3>| t.into_data().try_into_vec::<f32>().expect("f32");
        assert_eq!(f(pr), f(ar), "reference chunk at {start}");
        assert_eq!(f(pq), f(aq), "variant chunk at {start}");
    }
}
