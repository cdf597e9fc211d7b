//! The FP4 activation roundings (`dynamic.rs`: `mxfp4`, `mxfp4-ocp`, `nvfp4`) and NVFP4's global
//! input scale against vectors written by the reference implementations.
//!
//! Provenance: `fp4_act_py/generate.py` wrote `fp4_act_py/vectors.txt` with compressed-tensors
//! 0.20.1 (`forward_quantize` of a Linear layer's input under the presets `MXFP4` and `NVFP4`, and
//! `generate_gparam`) and torchao 0.18.0 (`to_mx` with the OCP spec's `FLOOR` scale rule); see
//! its docstring for the functions and the planted cases (E2M1 ties, saturation, all-zero
//! blocks, subnormal and zero E4M3 block scales, the MX scale rounding's threshold).

use qdrift_codecs::{ActivationQuant, DynamicFormat, Mxfp4Rule, nvfp4_global_scale};

fn bits(words: &[&str]) -> Vec<f32> {
    words.iter().map(|w| f32::from_bits(u32::from_str_radix(w, 16).expect("hex f32 bits"))).collect()
}

/// Bit-for-bit equality, except that every NaN equals every NaN.
fn same(got: &[f32], want: &[f32]) -> Vec<(usize, f32, f32)> {
    got.iter()
        .zip(want)
        .enumerate()
        .filter(|(_, (g, w))| g.to_bits() != w.to_bits() && !(g.is_nan() && w.is_nan()))
        .map(|(i, (g, w))| (i, *g, *w))
        .collect()
}

#[test]
fn fp4_activations_are_bit_exact_with_compressed_tensors_and_torchao() {
    let text = include_str!("fp4_act_py/vectors.txt");
    let (mut matrix, mut cols) = (Vec::new(), 0);
    let mut checked = [0usize; 4];
    // The two MX scale rules' results, which the planted blocks (amax mantissa ≥ 1.75) tell apart.
    let mut rules: [Vec<f32>; 2] = Default::default();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let words: Vec<&str> = line.split_whitespace().collect();
        let (kind, rest) = words.split_first().expect("a record");
        let round = |q: ActivationQuant, global: Option<f32>| {
            let mut x = matrix.clone();
            q.round_host_global(&mut x, cols, global);
            x
        };
        match *kind {
            "matrix" => {
                cols = rest[1].parse().expect("cols");
                matrix = bits(&rest[2..]);
                assert_eq!(matrix.len(), rest[0].parse::<usize>().expect("tokens") * cols);
            }
            "mxfp4" | "mxfp4-ocp" => {
                let rule = if *kind == "mxfp4" { Mxfp4Rule::CompressedTensors } else { Mxfp4Rule::Ocp };
                let got = round(ActivationQuant::fp4(DynamicFormat::Mxfp4(rule)), None);
                let bad = same(&got, &bits(rest));
                assert!(
                    bad.is_empty(),
                    "{kind}: {} of {} differ: {:?}",
                    bad.len(),
                    got.len(),
                    &bad[..bad.len().min(8)]
                );
                checked[usize::from(rule == Mxfp4Rule::Ocp)] += got.len();
                rules[usize::from(rule == Mxfp4Rule::Ocp)].extend(got);
            }
            "nvfp4" => {
                let global = (rest[0] != "none").then(|| bits(&rest[..1])[0]);
                let got = round(ActivationQuant::fp4(DynamicFormat::Nvfp4), global);
                let bad = same(&got, &bits(&rest[1..]));
                assert!(bad.is_empty(), "nvfp4 {global:?}: {} differ: {:?}", bad.len(), &bad[..bad.len().min(8)]);
                checked[2] += got.len();
            }
            "gparam" => {
                let [amax, g] = bits(rest)[..] else { panic!("gparam amax scale") };
                assert_eq!(nvfp4_global_scale(amax).to_bits(), g.to_bits(), "generate_gparam({amax:e})");
                checked[3] += 1;
            }
            other => panic!("unknown record {other}"),
        }
    }
    assert!(!same(&rules[0], &rules[1]).is_empty(), "the vectors tell the two MX scale rules apart");
    assert_eq!(checked, [768, 768, 3840, 8], "values checked: mxfp4, mxfp4-ocp, nvfp4; global scales");
}
