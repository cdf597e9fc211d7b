//! `nvfp4_quantize` (checkpoint NVFP4: E4M3 scale per 16, global scale) against the reference
//! libraries' own quantizers, code for code and bit for bit.
//!
//! Provenance: `nvfp4_ref/generate.py` wrote `nvfp4_ref/vectors.txt` with compressed-tensors
//! 0.20.1 (`generate_gparam`, `calculate_qparams`, `quantize`, `pack_fp4_to_uint8`; preset
//! `NVFP4A16`) and nvidia-modelopt 0.47.0 (`NVFP4QTensor.quantize`) on torch 2.15.0 (CPU): seeded
//! matrices, one with an all-zero block (compressed-tensors gives it scale 0.125, ModelOpt 1.0)
//! and one whose values sit on every E2M1 tie once scaled.

mod common;

use common::hex;
use qdrift_ggml::{GlobalScale, Nvfp4Tool, e2m1_decode, e4m3_decode, nvfp4_dequantize, nvfp4_quantize};

/// The f32 values of space-separated hex bit patterns.
fn floats(s: &str) -> Vec<f32> {
    s.split(' ').map(|v| f32::from_bits(u32::from_str_radix(v, 16).expect("hex bits"))).collect()
}

#[test]
fn nvfp4_quantize_matches_compressed_tensors_and_modelopt() {
    let text = include_str!("nvfp4_ref/vectors.txt");
    let mut lines = text.lines().filter(|l| !l.starts_with('#'));
    let mut matrices = 0;
    while let Some(m) = lines.next() {
        let mut f = m.strip_prefix("matrix ").expect("a matrix line").splitn(3, ' ');
        let rows: usize = f.next().and_then(|x| x.parse().ok()).expect("rows");
        let cols: usize = f.next().and_then(|x| x.parse().ok()).expect("cols");
        let x = floats(f.next().expect("values"));
        assert_eq!(x.len(), rows * cols);
        for (tool, prefix) in [(Nvfp4Tool::CompressedTensors, "ct "), (Nvfp4Tool::ModelOpt, "modelopt ")] {
            let line = lines.next().and_then(|l| l.strip_prefix(prefix)).expect(prefix);
            let mut f = line.split(' ');
            let global = floats(f.next().expect("global"))[0];
            let scales = hex(f.next().expect("scales"));
            let codes: Vec<u8> =
                f.next().expect("codes").chars().map(|c| c.to_digit(16).expect("hex digit") as u8).collect();
            let got = nvfp4_quantize(tool, &x, cols).expect("whole groups");
            assert_eq!(got.global.stored().to_bits(), global.to_bits(), "{prefix}global of matrix {matrices}");
            assert_eq!(got.scales, scales, "{prefix}scales of matrix {matrices}");
            assert_eq!(got.codes, codes, "{prefix}codes of matrix {matrices}");
            // Dequantizing is e2m1 · block scale, the block scale in the tool's direction.
            let w = nvfp4_dequantize(&got.codes, &got.scales, got.global, cols).expect("dequantizes");
            for (k, v) in w.iter().enumerate() {
                let s = e4m3_decode(scales[k / 16]);
                let d = match tool {
                    Nvfp4Tool::CompressedTensors => s / global,
                    Nvfp4Tool::ModelOpt => s * global,
                };
                assert_eq!(v.to_bits(), (e2m1_decode(codes[k]) * d).to_bits());
            }
            assert!(matches!(
                (tool, got.global),
                (Nvfp4Tool::CompressedTensors, GlobalScale::Divide(_))
                    | (Nvfp4Tool::ModelOpt, GlobalScale::Multiply(_))
            ));
        }
        matrices += 1;
    }
    assert_eq!(matrices, 3);
}
