//! The speculative-decoding metrics against a direct simulation: greedy speculative decoding run
//! for real on stories260K, an int8 and an int4-g128 variant drafting and the FP16 reference
//! verifying, takes the steps that `qdrift_score::greedy_speculative_steps` computes from the
//! teacher-forced top-1 agreement on the reference's text; speculative sampling run for real
//! accepts drafts as the teacher-forced acceptance `Σ min(p_ref, p_var)` predicts.

use burn::tensor::DType;
use qdrift_generate::{BackendChoice, Forcing, GenerationConfig, generate, teacher_forced_pair};
use qdrift_model::Llama;
use qdrift_quantize::{QuantizeOptions, Scheme, quantize_model, round_to_fp16_reference};
use qdrift_score::greedy_speculative_steps;
use qdrift_tests::{device, load_stories};

/// Generated positions per prompt.
const H: usize = 100;
/// Prompts simulated.
const PROMPTS: usize = 12;

/// Index of the largest value (the first on ties, as greedy decoding picks).
fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in row.iter().enumerate() {
        if x > row[best] {
            best = i;
        }
    }
    best as u32
}

#[test]
fn teacher_forced_agreement_gives_the_steps_of_real_greedy_speculative_decoding() {
    for scheme in ["int8", "int4-g128"] {
        simulate(scheme);
    }
}

/// The FP16 reference of stories260K, its `scheme` variant (FP16 compute, CPU), the device, and
/// the first [`PROMPTS`] prompts of the stories set, encoded.
fn models(scheme: &str) -> (Llama, Llama, qdrift_generate::ComputeDevice, Vec<Vec<u32>>) {
    let mut loaded = load_stories();
    round_to_fp16_reference(&mut loaded.model);
    let dev = device(BackendChoice::Cpu);
    let s: Scheme = scheme.parse().expect("scheme");
    let draft_weights = quantize_model(&loaded.model, &s, &QuantizeOptions::default()).expect("quantizes").dequantized;
    let reference = Llama::from_host(&loaded.model, DType::F16, &dev.device).expect("reference builds");
    let draft = Llama::from_host(&draft_weights, DType::F16, &dev.device).expect("variant builds");
    let set = qdrift_eval::EvalSet::built_in("stories").expect("stories set");
    let prompts: Vec<Vec<u32>> = set.prompts[..PROMPTS].iter().map(|p| loaded.tokenizer.encode(&p.prompt)).collect();
    (reference, draft, dev, prompts)
}

/// The simulation and the computation for one variant, at γ = 1 and 4.
fn simulate(scheme: &str) {
    let (reference, draft, dev, prompts) = models(scheme);

    // The reference's greedy continuation: what greedy verification always keeps.
    let config = GenerationConfig { max_new_tokens: H, batch_size: PROMPTS, stop_at_eos: None };
    let continuation = generate(&reference, &dev, &prompts, &config, |_| {}).expect("reference generates");

    // Teacher forcing on it, as an evaluation does: where the two models' argmax agree.
    let text: Vec<(Vec<u32>, Vec<u32>)> = prompts.iter().cloned().zip(continuation.iter().cloned()).collect();
    let mut agree = vec![vec![false; H]; PROMPTS];
    teacher_forced_pair(
        &reference,
        &draft,
        Forcing { device: &dev, sequences: &text, batch_size: PROMPTS, chunk: 25 },
        |pair| {
            let [b, t, v] = pair.reference.dims();
            let r = pair.reference.to_data().try_into_vec::<f32>().expect("f32");
            let d = pair.variant.to_data().try_into_vec::<f32>().expect("f32");
            for i in 0..b {
                for j in 0..t {
                    let row = (i * t + j) * v..(i * t + j + 1) * v;
                    agree[pair.first_prompt + i][pair.start + j] = argmax(&r[row.clone()]) == argmax(&d[row]);
                }
            }
        },
    )
    .expect("teacher forcing");

    for gamma in [1, 4] {
        let (mut same, mut simulated_steps, mut computed_steps) = (0, 0, 0);
        for (p, prompt) in prompts.iter().enumerate() {
            // The real thing: the draft proposes γ tokens greedily from the text so far (its own
            // KV cache, decoding one token at a time); the verifier keeps the drafts up to the
            // first that is not its own greedy token, then its own token there.
            let (mut t, mut steps) = (0, 0);
            while t < H {
                let mut prefix = prompt.clone();
                prefix.extend_from_slice(&continuation[p][..t]);
                let drafted = GenerationConfig { max_new_tokens: gamma, batch_size: 1, stop_at_eos: None };
                let proposal = generate(&draft, &dev, &[prefix], &drafted, |_| {}).expect("draft generates");
                let verified = &continuation[p][t..(t + gamma).min(H)];
                let accepted = proposal[0].iter().zip(verified).take_while(|(a, b)| a == b).count();
                steps += 1;
                t += accepted + 1;
            }
            let computed = greedy_speculative_steps(&agree[p], gamma, H).expect("steps");
            same += usize::from(steps == computed);
            simulated_steps += steps;
            computed_steps += computed;
        }
        let (sim, tf) = ((PROMPTS * H) as f64 / simulated_steps as f64, (PROMPTS * H) as f64 / computed_steps as f64);
        println!(
            "{scheme}, γ = {gamma}: {same} of {PROMPTS} prompts take the same steps; tokens per step {sim:.4} simulated, {tf:.4} \
             from teacher-forced agreement"
        );
        // Both are the same greedy decisions; only a near-tie between the draft's two most
        // likely tokens, rounded differently by incremental decoding and by a teacher-forced
        // chunk, could part them.
        assert!(same + 1 >= PROMPTS, "{scheme}, γ = {gamma}: {same} of {PROMPTS} prompts agree");
        assert!((sim - tf).abs() <= 0.02 * tf, "{scheme}, γ = {gamma}: {sim} simulated against {tf}");
    }
}

/// Tokens each sampled speculative-decoding run produces per prompt.
const SAMPLED: usize = 48;
/// Runs per prompt, each with its own seed.
const RUNS: usize = 3;
/// Draft length of the sampling simulation.
const GAMMA: usize = 4;

/// A seeded uniform draw in `[0, 1)` (splitmix64).
struct Draws(u64);

impl Draws {
    fn uniform(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        (z ^ (z >> 31)) as f64 / 2f64.powi(64)
    }

    /// A token drawn from the (unnormalised, non-negative) weights `w`.
    fn pick(&mut self, w: &[f64]) -> u32 {
        let total: f64 = w.iter().sum();
        let mut u = self.uniform() * total;
        for (i, &wi) in w.iter().enumerate() {
            if u < wi {
                return i as u32;
            }
            u -= wi;
        }
        (w.len() - 1) as u32
    }
}

/// Probabilities of one position's logits, in f64.
fn softmax(logits: &[f32]) -> Vec<f64> {
    qdrift_score::log_softmax(logits).expect("finite logits").iter().map(|l| l.exp()).collect()
}

/// The logits of the last position of `tokens`, and of the `n` before it: `[n + 1][vocab]`.
fn last_logits(model: &Llama, dev: &qdrift_generate::ComputeDevice, tokens: &[u32], n: usize) -> Vec<Vec<f32>> {
    let all = qdrift_tests::cached_logits(
        model,
        &dev.device,
        tokens,
        (tokens.len(), 1),
        qdrift_model::AttentionKernel::for_device(&dev.device, model.dtype()),
    );
    all[all.len() - 1 - n..].to_vec()
}

/// Speculative sampling at temperature 1 (Leviathan et al. 2023, Algorithm 1) run for real on
/// stories260K, an int4-g128 and an int8 variant drafting γ = 4 tokens per step and the FP16
/// reference verifying, against what qdrift computes from teacher-forced distributions:
/// - every draft is accepted with probability `Σ min(p_ref, p_var)` at its position (the
///   acceptance qdrift reports per position): the accepted share of the drafts examined equals
///   the mean of that sum over them, within 4 standard errors;
/// - the tokens per verification step equal `(1 − α^(γ+1)) / (1 − α)` (the reported
///   `spec_sampling_tokens_per_step_g4`), with `α` the acceptance qdrift's host reduction computes
///   teacher-forced on the text the runs produced, within 10% (the formula takes the drafts to be
///   accepted independently, which they are not).
#[test]
fn sampled_speculative_decoding_accepts_as_the_acceptance_predicts() {
    for scheme in ["int4-g128", "int8"] {
        simulate_sampling(scheme);
    }
}

fn simulate_sampling(scheme: &str) {
    let (reference, draft, dev, prompts) = models(scheme);

    let (mut produced, mut steps) = (0usize, 0usize);
    let (mut examined, mut accepted, mut beta_sum, mut beta_sq) = (0usize, 0usize, 0.0f64, 0.0f64);
    let (mut alpha_sum, mut alpha_positions) = (0.0f64, 0usize);
    for (p, prompt) in prompts.iter().enumerate() {
        for run in 0..RUNS {
            let mut draws = Draws(1000 * p as u64 + run as u64);
            let mut text = prompt.clone();
            while text.len() < prompt.len() + SAMPLED {
                // The draft samples γ tokens from its own distribution, one at a time.
                let mut q_rows = Vec::with_capacity(GAMMA);
                for _ in 0..GAMMA {
                    let q = softmax(&last_logits(&draft, &dev, &text, 0)[0]);
                    text.push(draws.pick(&q));
                    q_rows.push(q);
                }
                let drafts = text.split_off(text.len() - GAMMA);
                // The reference's distributions at the γ drafted positions and the one after.
                let mut full = text.clone();
                full.extend_from_slice(&drafts);
                let p_rows: Vec<Vec<f64>> =
                    last_logits(&reference, &dev, &full, GAMMA).iter().map(|l| softmax(l)).collect();
                let mut n = 0;
                while n < GAMMA {
                    let (pr, qr, x) = (&p_rows[n], &q_rows[n], drafts[n] as usize);
                    let beta: f64 = pr.iter().zip(qr).map(|(a, b)| a.min(*b)).sum();
                    (examined, beta_sum, beta_sq) = (examined + 1, beta_sum + beta, beta_sq + beta * beta);
                    if draws.uniform() < (pr[x] / qr[x]).min(1.0) {
                        n += 1;
                    } else {
                        break;
                    }
                }
                accepted += n;
                text.extend_from_slice(&drafts[..n]);
                let last = if n < GAMMA {
                    // Rejected: the reference's token from the normalised max(0, p − q).
                    let residual: Vec<f64> = p_rows[n].iter().zip(&q_rows[n]).map(|(a, b)| (a - b).max(0.0)).collect();
                    draws.pick(&residual)
                } else {
                    draws.pick(&p_rows[GAMMA])
                };
                text.push(last);
                (produced, steps) = (produced + n + 1, steps + 1);
            }
            // What qdrift computes: both models teacher-forced on that text, the host reduction.
            let h = text.len() - prompt.len();
            // The distributions that predict the generated tokens: those of the positions before
            // each (the last position's predicts nothing generated).
            let (r, d) = (last_logits(&reference, &dev, &text, h), last_logits(&draft, &dev, &text, h));
            let v = r[0].len();
            let flat = |rows: &[Vec<f32>]| rows[..h].concat();
            let dims = [1, h, v];
            let tokens = text[prompt.len()..].to_vec();
            let m = qdrift_score::position_metrics_on_host(&flat(&r), &flat(&d), dims, &tokens).expect("reduces");
            alpha_sum += m.accept.iter().map(|&a| f64::from(a)).sum::<f64>();
            alpha_positions += m.accept.len();
        }
    }
    let rate = accepted as f64 / examined as f64;
    let mean_beta = beta_sum / examined as f64;
    // Each examination is a Bernoulli(β_i) draw: the variance of their sum is Σ β_i (1 − β_i).
    let se = ((beta_sum - beta_sq) / (examined * examined) as f64).sqrt();
    let simulated = produced as f64 / steps as f64;
    let alpha = alpha_sum / alpha_positions as f64;
    let predicted = qdrift_score::expected_tokens(alpha, GAMMA).expect("α in [0, 1]");
    println!(
        "{scheme}, sampling γ = {GAMMA}: {accepted} of {examined} drafts accepted ({rate:.4}), mean Σ min(p, q) over them \
         {mean_beta:.4} (standard error {se:.4}); tokens per step {simulated:.4} simulated over {steps} steps, {predicted:.4} \
         from the teacher-forced α = {alpha:.4} on the same text"
    );
    assert!(
        (rate - mean_beta).abs() <= 4.0 * se,
        "{scheme}: accepted {rate} against Σ min(p, q) {mean_beta} (se {se})"
    );
    assert!((simulated - predicted).abs() <= 0.1 * predicted, "{scheme}: {simulated} simulated against {predicted}");
}
