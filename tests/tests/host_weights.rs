//! `Llama::host_weights` gives back the host model a `Llama` was built from, bit for bit, when
//! its values are all values of the compute dtype: every storage (host panels, f16 panels of an
//! f32 model, Burn's `[in, out]` linear weights, an f16 embedding table), tied and untied output
//! layers, q/k/v biases.

use burn::tensor::{DType, Device};
use qdrift_load::{HostModel, HostTensor, RopeScaling, synthetic_model};
use qdrift_model::{LinearKernel, Llama};
use qdrift_tests::uniform;

/// Every tensor of a host model with its name, optional ones marked present or absent.
fn tensors(m: &HostModel) -> Vec<(String, Option<&HostTensor>)> {
    let mut out = vec![("token_embedding".to_string(), Some(&m.token_embedding))];
    for (i, l) in m.layers.iter().enumerate() {
        out.push((format!("{i}.attn_norm"), Some(&l.attn_norm)));
        out.push((format!("{i}.ffn_norm"), Some(&l.ffn_norm)));
        for (name, w) in l.linears() {
            out.push((format!("{i}.{name}"), Some(w)));
        }
        for (name, b) in [("bq", &l.bq), ("bk", &l.bk), ("bv", &l.bv)] {
            out.push((format!("{i}.{name}"), b.as_ref()));
        }
    }
    out.push(("final_norm".to_string(), Some(&m.final_norm)));
    out.push(("output".to_string(), m.output.as_ref()));
    out
}

/// Field by field, the f32 data bit for bit (−0.0 is not 0.0).
fn assert_same(got: &HostModel, want: &HostModel, what: &str) {
    assert_eq!(got.arch, want.arch, "{what}: architecture");
    assert_eq!(got.layers.len(), want.layers.len(), "{what}: layers");
    for ((name, g), (_, w)) in tensors(got).into_iter().zip(tensors(want)) {
        match (g, w) {
            (None, None) => {}
            (Some(g), Some(w)) => {
                assert_eq!(g.shape, w.shape, "{what}: {name} shape");
                let bits = |t: &HostTensor| t.data.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                assert!(bits(g) == bits(w), "{what}: {name} values differ");
            }
            (g, w) => panic!("{what}: {name} present {} vs {}", g.is_some(), w.is_some()),
        }
    }
}

/// The tiny preset, tied, as given.
fn tied() -> HostModel {
    synthetic_model("tiny", 3).expect("tiny").model
}

/// The tiny preset with an output layer of its own, q/k/v biases (Qwen2), scaled RoPE, and
/// −0.0 in a few places.
fn untied_with_biases() -> HostModel {
    let mut m = synthetic_model("tiny", 4).expect("tiny").model;
    let (vocab, dim) = (m.arch.vocab_size, m.arch.dim);
    m.output = Some(HostTensor::new(vec![vocab, dim], uniform(99, vocab * dim)).expect("shape"));
    m.arch.tied_embeddings = false;
    m.arch.rope_scaling = Some(RopeScaling::FreqFactors { factors: vec![1.0, 2.5, 8.0, 8.0] });
    let (q, kv) = (m.arch.n_heads * m.arch.head_dim(), m.arch.kv_dim());
    for (i, l) in m.layers.iter_mut().enumerate() {
        let b = |k: u64, n: usize| Some(HostTensor::new(vec![n], uniform(10 * i as u64 + k, n)).expect("shape"));
        (l.bq, l.bk, l.bv) = (b(1, q), b(2, kv), b(3, kv));
        l.wq.data[5] = -0.0;
        l.bk.as_mut().expect("bias").data[1] = -0.0;
    }
    m.token_embedding.data[7] = -0.0;
    m
}

fn rounded(mut m: HostModel) -> HostModel {
    m.round_to_f16();
    m
}

const KERNELS: [LinearKernel; 2] = [LinearKernel::Host, LinearKernel::Burn];

#[test]
fn f16_valued_models_round_trip_in_every_storage() {
    for (what, h) in [("tied", rounded(tied())), ("untied with biases", rounded(untied_with_biases()))] {
        for dtype in [DType::F32, DType::F16] {
            for kernel in KERNELS {
                let model = Llama::from_host_with(&h, dtype, &Device::flex(), kernel).expect("model builds");
                assert_same(&model.host_weights(), &h, &format!("{what}, {dtype:?}, {kernel:?}"));
            }
        }
    }
}

#[test]
fn other_values_come_back_as_the_model_holds_them() {
    let h = untied_with_biases();
    for kernel in KERNELS {
        let build = |dtype| Llama::from_host_with(&h, dtype, &Device::flex(), kernel).expect("builds");
        // f32 holds every value as given; f16 holds their f16 roundings.
        assert_same(&build(DType::F32).host_weights(), &h, &format!("f32, {kernel:?}"));
        assert_same(&build(DType::F16).host_weights(), &rounded(h.clone()), &format!("f16, {kernel:?}"));
    }
}

/// On wgpu q/k/v and gate/up are stacked, q/k/v in key/value head groups (`Projections`): the
/// layers come back apart, rows, biases and −0.0 as given.
#[test]
fn stacked_projections_on_wgpu_round_trip() {
    let device = qdrift_tests::device(qdrift_generate::BackendChoice::Wgpu).device;
    for (what, h) in [("tied", rounded(tied())), ("untied with biases", rounded(untied_with_biases()))] {
        let model = Llama::from_host_with(&h, DType::F16, &device, LinearKernel::Burn).expect("model builds");
        let attn = &model.layers[0].attn;
        assert!(matches!(attn.qkv, qdrift_model::Projections::Stacked(_)), "q/k/v stacked on wgpu");
        assert_eq!(attn.qkv.has_bias(1), h.layers[0].bk.is_some(), "{what}");
        assert_same(&model.host_weights(), &h, &format!("{what}, wgpu"));
    }
}
