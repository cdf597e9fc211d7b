//! Run-time roundings (activations, KV cache) on the device against their host definitions, and
//! stories260K variants with them against the independent f64 forward pass, on CPU and wgpu.

use burn::tensor::{DType, Tensor, TensorData};
use qdrift_generate::{BackendChoice, ComputeDevice, Forcing, GenerationConfig, generate, teacher_forced};
use qdrift_load::HostModel;
use qdrift_model::{Llama, RoundingPath, RuntimeQuant, round_activations, round_activations_global, round_kv};
use qdrift_quantize::{
    ActivationQuant, ActivationScale, DynamicFormat, KvQuant, QuantizeOptions, Recipe, quantize_model,
    round_to_fp16_reference,
};
use qdrift_tests::reference64::{Rounding, naive_logits};
use qdrift_tests::{device, golden_cases, load_stories};

/// Values of widely varying magnitude (2^-14 … 2^6) from a seeded LCG (Knuth's MMIX constants).
fn values(seed: u64, n: usize) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = || {
        s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (s >> 40) as f32 / (1u64 << 24) as f32
    };
    (0..n).map(|_| (next() - 0.5) * 2f32.powi((next() * 20.0) as i32 - 14)).collect()
}

/// Half-way cases planted where the scale is 1: int8 ties (amax 127), E4M3 ties (amax 448),
/// E5M2 ties (amax 57344), and a value equal to the amax with either sign.
fn plant_ties(row: &mut [f32], amax: f32) {
    let ties: [f32; 8] = [0.5, 1.5, -2.5, 17.0, -1.0625, 0.3125 + 0.015625, 40.5, 5120.0];
    row[0] = amax;
    row[1] = -amax;
    for (v, t) in row[2..].iter_mut().zip(ties) {
        *v = t.clamp(-amax, amax);
    }
}

fn tensor<const D: usize>(data: Vec<f32>, shape: [usize; D], dtype: DType, dev: &ComputeDevice) -> Tensor<D> {
    Tensor::<D>::from_data(TensorData::new(data, shape), (&dev.device, DType::F32)).cast(dtype)
}

fn read<const D: usize>(x: Tensor<D>) -> Vec<f32> {
    x.into_data().convert::<f32>().try_into_vec::<f32>().expect("f32")
}

/// The values a tensor of `dtype` holds (f16 rounds them).
fn in_dtype(v: &mut [f32], dtype: DType) {
    if dtype == DType::F16 {
        v.iter_mut().for_each(|x| *x = half::f16::from_f32(*x).to_f32());
    }
}

/// Indices where two results differ (−0 and +0 count as equal: they multiply alike).
fn mismatches(got: &[f32], want: &[f32], only: impl Fn(usize) -> bool) -> Vec<(usize, f32, f32)> {
    got.iter().zip(want).enumerate().filter(|(i, (g, w))| only(*i) && g != w).map(|(i, (g, w))| (i, *g, *w)).collect()
}

fn device_roundings_equal_host_definitions(choice: BackendChoice) {
    let dev = device(choice);
    let (b, t, cols) = (3, 5, 64);
    let pad = [0usize, 2, 4];
    let mut x = values(1, b * t * cols);
    plant_ties(&mut x[..cols], 127.0);
    plant_ties(&mut x[cols..2 * cols], 448.0);
    plant_ties(&mut x[2 * cols..3 * cols], 57344.0);
    x[(t + 2) * cols..(t + 3) * cols].fill(0.0); // row 1, token 2: an all-zero token
    // Row 2, token 4: a group of 16 below vLLM's eps (1e-10; f16 flushes it to zero), then a
    // group with the amax tied at 448.
    let tiny = (2 * t + 4) * cols;
    x[tiny..tiny + 16].iter_mut().enumerate().for_each(|(i, v)| *v = (i as f32 - 7.5) * 1e-12);
    plant_ties(&mut x[tiny + 16..tiny + 32], 448.0);
    // Per-token groups of 16, 32 and 64 (the whole row) besides every listed part whose group
    // divides the 64 columns.
    let mut parts: Vec<ActivationQuant> =
        ActivationQuant::all().into_iter().filter(|q| q.check_width(cols).is_ok()).collect();
    for group in [16, 32, 64] {
        for q in ActivationQuant::all() {
            if q.scale == ActivationScale::Token {
                parts.push(ActivationQuant { scale: ActivationScale::TokenGroup(group), ..q });
            }
        }
    }
    let real: Vec<f32> = pad.iter().flat_map(|&p| (0..t).map(move |c| if c >= p { 1.0 } else { 0.0 })).collect();
    let mut checked = 0;
    for dtype in [DType::F32, DType::F16] {
        let mut x = x.clone();
        in_dtype(&mut x, dtype);
        for &q in &parts {
            let got = read(round_activations(
                tensor(x.clone(), [b, t, cols], dtype, &dev),
                q,
                Some(&tensor(real.clone(), [b, t, 1], DType::F32, &dev)),
            ));
            let mut want = x.clone();
            for (row, values) in want.chunks_mut(t * cols).enumerate() {
                let per_tensor = q.scale == ActivationScale::Tensor;
                q.round_host(&mut values[if per_tensor { pad[row] * cols } else { 0 }..], cols);
            }
            in_dtype(&mut want, dtype);
            // Padding tokens share a per-tensor scale they do not contribute to: not compared.
            let is_real = |i: usize| q.scale != ActivationScale::Tensor || real[i / cols] == 1.0;
            let bad = mismatches(&got, &want, is_real);
            assert!(
                bad.is_empty(),
                "{} activations {q} {dtype:?}: {} differ, first {:?}",
                dev.adapter,
                bad.len(),
                &bad[..bad.len().min(4)]
            );
            assert_ne!(want, x, "{q} changes the values");
            checked += got.len();
        }
        // NVFP4 under static global input scales: calibrated on these values (448·6/amax), on
        // values 100 times smaller (block scales saturate at 448) and 10^4 times larger (block
        // scales fall into E4M3's subnormals and to zero).
        let nv = ActivationQuant::fp4(DynamicFormat::Nvfp4);
        let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        for calibrated in [amax, amax / 100.0, amax * 1e4] {
            let global = Some(2688.0 * (1.0 / calibrated));
            let got = read(round_activations_global(tensor(x.clone(), [b, t, cols], dtype, &dev), nv, None, global));
            let mut want = x.clone();
            nv.round_host_global(&mut want, cols, global);
            in_dtype(&mut want, dtype);
            let bad = mismatches(&got, &want, |_| true);
            assert!(
                bad.is_empty(),
                "{} nvfp4 {global:?} {dtype:?}: {} differ, first {:?}",
                dev.adapter,
                bad.len(),
                &bad[..bad.len().min(4)]
            );
            checked += got.len();
        }
        for (kvh, hd) in [(4, 8), (3, 64)] {
            let n = 2 * 3 * kvh * hd;
            let mut k = values(2 + hd as u64, n);
            plant_ties(&mut k[..kvh * hd], 127.0);
            // q4_0's signed maximum: −a before +a in one block, +a before −a in the next.
            k[kvh * hd..kvh * hd + 4].copy_from_slice(&[-3.0, 1.0, 3.0, 0.5]);
            k[kvh * hd + 32..kvh * hd + 36].copy_from_slice(&[3.0, 1.0, -3.0, 0.5]);
            for i in (kvh * hd + 4..kvh * hd + 32).chain(kvh * hd + 36..kvh * hd + 64) {
                k[i] = k[i].clamp(-2.9, 2.9);
            }
            in_dtype(&mut k, dtype);
            for q in KvQuant::all() {
                let got = read(round_kv(tensor(k.clone(), [2, 3, kvh, hd], dtype, &dev), q));
                let mut want = k.clone();
                for row in want.chunks_mut(kvh * hd) {
                    q.round_host(row, hd).expect("whole blocks");
                }
                in_dtype(&mut want, dtype);
                let bad = mismatches(&got, &want, |_| true);
                assert!(
                    bad.is_empty(),
                    "{} KV {q} {kvh}×{hd} {dtype:?}: {} differ, first {:?}",
                    dev.adapter,
                    bad.len(),
                    &bad[..bad.len().min(4)]
                );
                assert_ne!(want, k, "{q} changes the values");
                checked += got.len();
            }
        }
    }
    println!("{}: {checked} device-rounded values equal their host definitions", dev.adapter);
}

#[test]
fn device_roundings_equal_host_definitions_cpu() {
    device_roundings_equal_host_definitions(BackendChoice::Cpu);
}

#[test]
fn device_roundings_equal_host_definitions_wgpu() {
    device_roundings_equal_host_definitions(BackendChoice::Wgpu);
}

/// The FP16 reference's weights with `recipe`'s weight scheme applied (what eval runs).
fn variant_weights(recipe: &Recipe) -> HostModel {
    let mut reference = load_stories().model;
    round_to_fp16_reference(&mut reference);
    quantize_model(&reference, &recipe.weights, &QuantizeOptions::default()).expect("quantizes").dequantized
}

/// Largest |a − b| of each predicted position of every sequence, sorted.
fn row_errors(got: &[Vec<Vec<f32>>], want: &[Vec<Vec<f64>>]) -> Vec<f64> {
    let mut e: Vec<f64> = got
        .iter()
        .zip(want)
        .flat_map(|(g, w)| g.iter().zip(w))
        .map(|(g, w)| g.iter().zip(w).fold(0.0f64, |m, (g, w)| m.max((f64::from(*g) - w).abs())))
        .collect();
    e.sort_by(f64::total_cmp);
    e
}

/// Positions whose logits all agree with the f64 pass within this (stories260K's logits are of
/// order 10; f32 against f64 agrees to ~1e-5 when every rounding decision is the same).
const AGREE: f64 = 1e-4;

/// Fraction of positions within [`AGREE`].
fn agreeing(errors: &[f64]) -> f64 {
    errors.iter().filter(|e| **e <= AGREE).count() as f64 / errors.len() as f64
}

/// stories260K variants with run-time rounding, decoded and teacher-forced, against the f64
/// forward pass with the same roundings (`reference64`).
///
/// Tolerance: a position agrees when every logit is within [`AGREE`] of the f64 pass. Not every
/// position can: where f32 and f64 put an activation or cached value on opposite sides of a
/// rounding boundary, it moves by a whole quantization step, and the change reaches every later
/// position through the cache. Measured (CPU; lavapipe decoding / teacher forcing): w8a8-int8
/// 98% of positions agree (65% / 74% under fusion on wgpu, 80% / 74% without), fp16+kv-q8_0 87% (100% / 82%), w8a8-fp8 50% (50% / 71%;
/// one E4M3 step is 1/8 of a value), int4-g32+kv-q4_0 100% (87% / 100%),
/// int8+a-int8-tensor+kv-int8 80% (66% / 66%), fp8-e4m3+a-fp8-g4 78% (68% / 68%); the median position differs by ≤ 2e-4. So the test asks that at least `min_agree` of the positions
/// agree, and that the roundings themselves move at least 90% of the positions beyond
/// [`AGREE`] — a rounding applied at the wrong place or with the wrong scale would leave almost
/// no position agreeing.
fn variants_match_the_f64_forward_pass(choice: BackendChoice) {
    let dev = device(choice);
    let cases = golden_cases();
    let prompts: Vec<Vec<u32>> = cases.iter().map(|c| c.prompt_tokens.clone()).collect();
    let n = 40;
    let mut short = Vec::new();
    for (name, min_agree) in [
        ("w8a8-int8", 0.6),
        ("fp16+kv-q8_0", 0.66),
        ("w8a8-fp8", 0.4),
        ("int4-g32+kv-q4_0", 0.66),
        ("int8+a-int8-tensor+kv-int8", 0.4),
        // Block-FP8 checkpoints' per-token-group activations, with a group dividing both the 64
        // and the 172 (down_proj) inputs.
        ("fp8-e4m3+a-fp8-g4", 0.4),
    ] {
        let recipe: Recipe = name.parse().expect("recipe");
        let weights = variant_weights(&recipe);
        let mut model = Llama::from_host(&weights, DType::F32, &dev.device).expect("model builds");
        model.apply_runtime(&recipe).expect("fits stories260K");
        // Decoding, step by step.
        let mut decoded = vec![vec![Vec::new(); n]; prompts.len()];
        let config = GenerationConfig { max_new_tokens: n, batch_size: prompts.len(), stop_at_eos: None };
        let tokens = generate(&model, &dev, &prompts, &config, |s| {
            let v = s.logits.dims()[1];
            for (b, row) in read(s.logits.clone()).chunks(v).enumerate() {
                decoded[s.first_prompt + b][s.step] = row.to_vec();
            }
        })
        .expect("generation");
        // Teacher forcing the same tokens, two sequences a batch, seven positions a pass.
        let sequences: Vec<(Vec<u32>, Vec<u32>)> = prompts.iter().cloned().zip(tokens.iter().cloned()).collect();
        let mut forced = vec![vec![Vec::new(); n]; prompts.len()];
        teacher_forced(&model, Forcing { device: &dev, sequences: &sequences, batch_size: 2, chunk: 7 }, |f| {
            let [b, t, v] = f.logits.dims();
            let data = read(f.logits.clone());
            for i in 0..b {
                for j in 0..t {
                    forced[f.first_prompt + i][f.start + j] = data[(i * t + j) * v..(i * t + j + 1) * v].to_vec();
                }
            }
        })
        .expect("teacher forcing");
        let f64_logits = |r: &Rounding| -> Vec<Vec<Vec<f64>>> {
            sequences
                .iter()
                .map(|(p, c)| {
                    let r = Rounding { prompt: p.len(), ..*r };
                    naive_logits(&weights, &[p.clone(), c.clone()].concat(), &r)[p.len() - 1..][..n].to_vec()
                })
                .collect()
        };
        let want =
            f64_logits(&Rounding { activations: recipe.activations, kv_cache: recipe.kv_cache, ..Default::default() });
        let unrounded: Vec<Vec<Vec<f32>>> = f64_logits(&Rounding::default())
            .into_iter()
            .map(|s| s.into_iter().map(|r| r.into_iter().map(|v| v as f32).collect()).collect())
            .collect();
        let (dec, tf, moved) = (row_errors(&decoded, &want), row_errors(&forced, &want), row_errors(&unrounded, &want));
        println!(
            "{} {name}: positions within {AGREE:e} of f64: decoding {:.0}%, teacher forcing {:.0}% (median |Δ| {:.1e}, {:.1e}); \
             without the run-time rounding {:.0}% (median |Δ| {:.1e})",
            dev.adapter,
            100.0 * agreeing(&dec),
            100.0 * agreeing(&tf),
            dec[dec.len() / 2],
            tf[tf.len() / 2],
            100.0 * agreeing(&moved),
            moved[moved.len() / 2],
        );
        if agreeing(&dec) < min_agree || agreeing(&tf) < min_agree {
            short.push(format!("{name}: too few positions agree"));
        }
        assert!(agreeing(&moved) <= 0.1, "{name}: the rounding leaves the logits unchanged");
    }
    assert!(short.is_empty(), "{}", short.join("; "));
}

#[test]
fn variants_match_the_f64_forward_pass_cpu() {
    variants_match_the_f64_forward_pass(BackendChoice::Cpu);
}

#[test]
fn variants_match_the_f64_forward_pass_wgpu() {
    variants_match_the_f64_forward_pass(BackendChoice::Wgpu);
}

/// On the CPU an f16 model's rounded activations (`q × scale`) reach the next linear layer as the
/// f16 values a tensor of its dtype holds, whether they are rounded on the host (the default,
/// where attention and the feed-forward layer run wholly on the host) or by Burn's ops: the
/// generated tokens and their logits are the same either way.
#[test]
fn f16_activation_rounding_is_the_same_on_the_host_and_device_paths() {
    let dev = device(BackendChoice::Cpu);
    let prompts: Vec<Vec<u32>> = golden_cases().iter().map(|c| c.prompt_tokens.clone()).collect();
    let config = GenerationConfig { max_new_tokens: 20, batch_size: prompts.len(), stop_at_eos: None };
    for name in ["w8a8-int8", "w8a8-fp8", "fp8-e4m3+a-fp8-g4"] {
        let recipe: Recipe = name.parse().expect("recipe");
        let weights = variant_weights(&recipe);
        let run = |path: RoundingPath| {
            let mut model = Llama::from_host(&weights, DType::F16, &dev.device).expect("builds");
            model
                .set_runtime_quant(RuntimeQuant { activations: recipe.activations, kv_cache: None, path })
                .expect("fits stories260K");
            let mut logits = Vec::new();
            let tokens =
                generate(&model, &dev, &prompts, &config, |s| logits.push(read(s.logits.clone()))).expect("generation");
            (tokens, logits)
        };
        let (host, device_path) = (run(RoundingPath::Host), run(RoundingPath::Device));
        assert_eq!(host.0, device_path.0, "{name}: tokens");
        let differing = host.1.iter().flatten().zip(device_path.1.iter().flatten()).filter(|(a, b)| a != b).count();
        assert_eq!(differing, 0, "{name}: logits differ between the host and device rounding paths");
    }
}
