//! `qdrift quantize --packed` with an FP4 scheme writes a compressed-tensors folder that
//! `qdrift eval --variant` reads back as the scheme's weights (the library side is tested in
//! `qdrift-quantize`'s `tests/ct_export.rs`, against compressed-tensors too).

use std::path::Path;

mod common;
use common::{qdrift, stories};
use qdrift_load::write::{WriteDtype, write_hf_folder};
use qdrift_load::{HostTensor, Llama2cTokenizer, open_model, read_llama2c_checkpoint};

/// stories260K with its FFN cut to 160 hidden units (whole FP4 groups), as a Hugging Face folder.
fn source(dir: &Path) {
    let s = stories();
    let mut m = read_llama2c_checkpoint(&s.join("stories260K.bin")).expect("stories260K");
    let cut = |t: &HostTensor, rows: bool| {
        let (r, c) = (t.shape[0], t.shape[1]);
        let (nr, nc) = if rows { (160, c) } else { (r, 160) };
        let data = (0..nr).flat_map(|i| t.data[i * c..i * c + nc].iter().copied()).collect();
        HostTensor::new(vec![nr, nc], data).expect("shape")
    };
    m.arch.hidden_dim = 160;
    for layer in &mut m.layers {
        let mlp = layer.mlp_mut().expect("dense");
        (mlp.gate, mlp.up, mlp.down) = (cut(&mlp.gate, true), cut(&mlp.up, true), cut(&mlp.down, false));
    }
    let tok = Llama2cTokenizer::read(&s.join("tok512.bin")).expect("tok512");
    write_hf_folder(dir, &m, &tok, WriteDtype::F16).expect("source folder");
}

#[test]
fn packed_fp4_schemes_write_compressed_tensors_folders() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let src = tmp.path().join("source");
    source(&src);
    for (scheme, format) in [("nvfp4", "nvfp4-pack-quantized"), ("mxfp4-ct", "mxfp4-pack-quantized")] {
        let out = tmp.path().join(scheme);
        let args = ["quantize", "--model", src.to_str().unwrap(), "--scheme", scheme, "--packed", "--out"];
        let run = qdrift(&[&args[..], &[out.to_str().unwrap()]].concat());
        assert!(run.status.success(), "{scheme}: {}", String::from_utf8_lossy(&run.stderr));
        let loaded = open_model(&out, None).unwrap_or_else(|e| panic!("{scheme}: {e}"));
        let q = loaded.quantization.expect("quantized");
        assert!(q.weights.contains(format), "{scheme}: {}", q.weights);
    }
    // From a llama2.c file there is no config.json to carry over: refused by name.
    let model = stories().join("stories260K.bin");
    let out = tmp.path().join("refused");
    let run = qdrift(&[
        "quantize",
        "--model",
        model.to_str().unwrap(),
        "--scheme",
        "nvfp4",
        "--packed",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(!run.status.success());
    assert!(String::from_utf8_lossy(&run.stderr).contains("from a Hugging Face folder"));
}
