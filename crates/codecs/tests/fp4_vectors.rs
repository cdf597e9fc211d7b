//! The FP4 weight schemes `nvfp4`, `mxfp4-ct` and `mxfp4-ocp` against the reference libraries'
//! own quantize-then-dequantize, scale for scale and bit for bit.
//!
//! Provenance: `fp4_ref/generate.py` wrote `fp4_ref/vectors.txt` with compressed-tensors 0.20.1
//! (`generate_gparam`, `calculate_qparams`, `fake_quantize`; presets `NVFP4A16` and `MXFP4A16`)
//! and torchao 0.18.0 (`to_mx` with `ScaleCalculationMode.FLOOR`, the OCP rule, and `to_dtype`)
//! on torch 2.15.0 (CPU). Nine seeded matrices `[rows, 64]`: ordinary weights; rows of very
//! different magnitude (E4M3 block scales in the subnormal range); an all-zero block with a −0.0,
//! a row on every E2M1 tie (again in a matrix of amax 6, where NVFP4's scale is 1), blocks of amax 7.5 (OCP saturates, compressed-tensors rounds the
//! scale up) and amaxes just under and at 1.75 times a power of two; four heavy-tailed ones
//! (Student t, 3 degrees of freedom) with rows scaled by 2^-12 to 2^5; tiny values (E8M0 code 0,
//! compared with compressed-tensors only).

use qdrift_codecs::{Fp8Format, Mxfp4Rule, Scheme, fp8_decode, quantize};

/// The f32 values of space-separated hex bit patterns.
fn floats(s: &str) -> Vec<f32> {
    s.split(' ').map(|v| f32::from_bits(u32::from_str_radix(v, 16).expect("hex bits"))).collect()
}

/// Bytes of a hex string.
fn hex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex byte")).collect()
}

fn assert_bits(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (k, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.to_bits(), w.to_bits(), "{what}: value {k}: {g} vs {w}");
    }
}

/// The part named `name` of `q`'s parts.
fn part(q: &qdrift_codecs::QuantizedMatrix, name: &str) -> Vec<u8> {
    q.parts().into_iter().find(|p| p.name == name).map(|p| p.bytes).expect(name)
}

/// What the vectors exercise, counted: E2M1 saturation (`|w / d| > 6`), exact E2M1 ties, zero
/// blocks and subnormal block scales.
#[derive(Debug, Default, PartialEq)]
struct Cover {
    saturated: usize,
    ties: usize,
    zero_blocks: usize,
    subnormal_scales: usize,
}

impl Cover {
    /// Counts one block of values `x` whose f32 scale is `d`.
    fn block(&mut self, x: &[f32], d: f32) {
        for &v in x {
            let r = (v / d).abs();
            self.saturated += usize::from(r > 6.0);
            self.ties += usize::from([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0].contains(&r));
        }
        self.zero_blocks += usize::from(x.iter().all(|&v| v == 0.0));
    }
}

#[test]
fn fp4_schemes_match_compressed_tensors_and_torchao() {
    let text = include_str!("fp4_ref/vectors.txt");
    let mut lines = text.lines().filter(|l| !l.starts_with('#'));
    let (mut matrices, mut values) = (0, 0);
    let (mut nv, mut ct, mut ocp) = (Cover::default(), Cover::default(), Cover::default());
    while let Some(m) = lines.next() {
        let mut f = m.strip_prefix("matrix ").expect("a matrix line").splitn(3, ' ');
        let rows: usize = f.next().and_then(|x| x.parse().ok()).expect("rows");
        let cols: usize = f.next().and_then(|x| x.parse().ok()).expect("cols");
        let x = floats(f.next().expect("values"));
        assert_eq!(x.len(), rows * cols);

        let line = lines.next().and_then(|l| l.strip_prefix("nvfp4 ")).expect("nvfp4");
        let mut f = line.splitn(3, ' ');
        let global = floats(f.next().expect("global"))[0];
        let scales = hex(f.next().expect("scales"));
        let want = floats(f.next().expect("values"));
        let q = quantize(&Scheme::Nvfp4, &x, rows, cols).expect("finite");
        let what = format!("nvfp4, matrix {matrices}");
        assert_eq!(part(&q, "weight_global_scale"), global.to_le_bytes(), "{what}: global scale");
        assert_eq!(part(&q, "weight_scale"), scales, "{what}: E4M3 scales");
        assert_bits(&q.dequantize(), &want, &what);
        for (block, &s) in x.chunks(16).zip(&scales) {
            nv.block(block, fp8_decode(Fp8Format::E4M3, s) / global);
            nv.subnormal_scales += usize::from(s & 0x78 == 0 && s & 7 != 0);
        }

        for (prefix, rule) in [("mxfp4-ct ", Mxfp4Rule::CompressedTensors), ("mxfp4-ocp ", Mxfp4Rule::Ocp)] {
            let line = lines.next().and_then(|l| l.strip_prefix(prefix)).expect(prefix);
            if line == "-" {
                continue;
            }
            let (scales, want) = line.split_once(' ').expect("scales and values");
            let q = quantize(&Scheme::Mxfp4 { rule }, &x, rows, cols).expect("finite");
            let what = format!("{prefix}matrix {matrices}");
            assert_eq!(part(&q, "weight_scale"), hex(scales), "{what}: E8M0 scales");
            assert_bits(&q.dequantize(), &floats(want), &what);
            let cover = if rule == Mxfp4Rule::Ocp { &mut ocp } else { &mut ct };
            for (block, &e) in x.chunks(32).zip(&hex(scales)) {
                cover.block(block, 2f32.powi(i32::from(e) - 127));
            }
        }
        matrices += 1;
        values += x.len();
    }
    assert_eq!((matrices, values), (9, 2048));
    // Every case the module docs name is met by some vector.
    for (name, c) in [("nvfp4", &nv), ("mxfp4-ct", &ct), ("mxfp4-ocp", &ocp)] {
        assert!(c.ties > 0 && c.zero_blocks > 0 && c.saturated > 0, "{name}: {c:?}");
    }
    assert!(nv.subnormal_scales > 0, "{nv:?}");
    eprintln!("coverage: nvfp4 {nv:?}, mxfp4-ct {ct:?}, mxfp4-ocp {ocp:?}");
}
