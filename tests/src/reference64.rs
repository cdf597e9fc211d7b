//! An independent float64 forward pass of the Llama family, written from the definitions:
//! RMSNorm, q/k/v projections with biases, interleaved RoPE (with Llama 3.1's scaling and with
//! per-pair divisors), grouped-query causal attention, SwiGLU. It shares no code with
//! `qdrift-model`; what the model computes in f32 or f16 is checked against it.
//!
//! [`Rounding`] adds a variant's run-time roundings where `qdrift-model` applies them: the input
//! of every linear layer (q/k/v, o, gate/up, down; per token, or per tensor over the prompt and
//! then per token) and every key (after RoPE) and
//! value as it enters the cache. Each rounding is the host definition (`round_host` of
//! `qdrift_quantize`) applied to the f64 values cast to f32, then cast back.

use qdrift_load::{HostModel, HostTensor, RopeScaling};
use qdrift_quantize::{ActivationQuant, ActivationScale, KvQuant};

/// The run-time roundings of a variant (none by default).
#[derive(Debug, Clone, Copy, Default)]
pub struct Rounding {
    /// Activation quantization of every linear layer's input.
    pub activations: Option<ActivationQuant>,
    /// Rounding of every cached key and value.
    pub kv_cache: Option<KvQuant>,
    /// Positions that form the prompt: a per-tensor activation scale covers them together (the
    /// prompt pass); every later position is scaled alone.
    pub prompt: usize,
}

impl Rounding {
    /// A linear layer's inputs, one row per position.
    fn inputs(&self, rows: &mut [Vec<f64>]) {
        let Some(q) = self.activations else { return };
        let cols = rows.first().map_or(1, Vec::len);
        let split = if q.scale == ActivationScale::Tensor { self.prompt.min(rows.len()) } else { 0 };
        let (prompt, rest) = rows.split_at_mut(split);
        if !prompt.is_empty() {
            let mut flat: Vec<f64> = prompt.concat();
            through_f32(&mut flat, |v| q.round_host(v, cols));
            prompt.iter_mut().zip(flat.chunks(cols)).for_each(|(r, f)| r.copy_from_slice(f));
        }
        // After the prompt pass a per-tensor scale covers one token; other scales are per token
        // (or per token and group) already.
        let later = match q.scale {
            ActivationScale::Tensor => ActivationQuant { scale: ActivationScale::Token, ..q },
            _ => q,
        };
        rest.iter_mut().for_each(|r| through_f32(r, |v| later.round_host(v, cols)));
    }

    /// One position's keys or values, `[kv_heads * head_dim]`.
    fn cached(&self, x: &mut [f64], head_dim: usize) {
        if let Some(q) = self.kv_cache {
            through_f32(x, |v| q.round_host(v, head_dim).expect("KV rows of whole blocks"));
        }
    }
}

/// Rounds f64 values through f32 with a host definition.
fn through_f32(x: &mut [f64], round: impl FnOnce(&mut [f32])) {
    let mut v: Vec<f32> = x.iter().map(|&a| a as f32).collect();
    round(&mut v);
    x.iter_mut().zip(v).for_each(|(a, b)| *a = f64::from(b));
}

/// `w · x` for a `[out, in]` host weight, plus the bias.
fn matvec(w: &HostTensor, b: Option<&HostTensor>, x: &[f64]) -> Vec<f64> {
    let (out, inp) = (w.shape[0], w.shape[1]);
    (0..out)
        .map(|r| {
            let dot: f64 = (0..inp).map(|c| f64::from(w.data[r * inp + c]) * x[c]).sum();
            dot + b.map_or(0.0, |b| f64::from(b.data[r]))
        })
        .collect()
}

fn rms_norm(x: &[f64], w: &HostTensor, eps: f64) -> Vec<f64> {
    let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
    let inv = 1.0 / (ms + eps).sqrt();
    x.iter().zip(&w.data).map(|(v, &g)| v * inv * f64::from(g)).collect()
}

/// Rotates pairs `(2i, 2i+1)` of every head by `pos · inv_freq[i]`.
fn rope(x: &mut [f64], head_dim: usize, pos: usize, inv_freq: &[f64]) {
    for head in x.chunks_mut(head_dim) {
        for (i, f) in inv_freq.iter().enumerate() {
            let (s, c) = (pos as f64 * f).sin_cos();
            let (a, b) = (head[2 * i], head[2 * i + 1]);
            head[2 * i] = a * c - b * s;
            head[2 * i + 1] = a * s + b * c;
        }
    }
}

/// The inverse frequencies from the definitions (f64): `theta^(-2i/d)`, Llama 3.1's bands,
/// or per-pair divisors.
fn inv_freq(m: &HostModel) -> Vec<f64> {
    let (hd, theta) = (m.arch.head_dim(), f64::from(m.arch.rope_theta));
    let plain = (0..hd / 2).map(|i| theta.powf(-((2 * i) as f64) / hd as f64));
    match &m.arch.rope_scaling {
        None => plain.collect(),
        Some(RopeScaling::Linear { .. } | RopeScaling::Yarn { .. }) => panic!("not in this reference yet"),
        Some(RopeScaling::FreqFactors { factors }) => plain.zip(factors).map(|(f, &d)| f / f64::from(d)).collect(),
        Some(RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position_embeddings }) => {
            let (factor, low, high) = (f64::from(*factor), f64::from(*low_freq_factor), f64::from(*high_freq_factor));
            let old = *original_max_position_embeddings as f64;
            plain
                .map(|f| {
                    let wavelen = 2.0 * std::f64::consts::PI / f;
                    if wavelen < old / high {
                        f
                    } else if wavelen > old / low {
                        f / factor
                    } else {
                        let smooth = (old / wavelen - low) / (high - low);
                        (1.0 - smooth) * f / factor + smooth * f
                    }
                })
                .collect()
        }
    }
}

/// Logits `[position][vocab]` of one sequence, every position, with `rounding` applied.
pub fn naive_logits(m: &HostModel, tokens: &[u32], rounding: &Rounding) -> Vec<Vec<f64>> {
    let a = &m.arch;
    let (dim, hd, heads, kv_heads) = (a.dim, a.head_dim(), a.n_heads, a.n_kv_heads);
    let eps = f64::from(a.norm_eps);
    let freqs = inv_freq(m);
    let emb = &m.token_embedding;
    let mut xs: Vec<Vec<f64>> =
        tokens.iter().map(|&t| emb.data[t as usize * dim..][..dim].iter().map(|&v| f64::from(v)).collect()).collect();
    for l in &m.layers {
        let mut xn: Vec<Vec<f64>> = xs.iter().map(|x| rms_norm(x, &l.attn_norm, eps)).collect();
        rounding.inputs(&mut xn);
        let (mut qs, mut ks, mut vs) = (Vec::new(), Vec::new(), Vec::new());
        for (pos, xn) in xn.iter().enumerate() {
            let mut q = matvec(&l.wq, l.bq.as_ref(), xn);
            let mut k = matvec(&l.wk, l.bk.as_ref(), xn);
            let mut v = matvec(&l.wv, l.bv.as_ref(), xn);
            rope(&mut q, hd, pos, &freqs);
            rope(&mut k, hd, pos, &freqs);
            rounding.cached(&mut k, hd);
            rounding.cached(&mut v, hd);
            qs.push(q);
            ks.push(k);
            vs.push(v);
        }
        let mut attended: Vec<Vec<f64>> = (0..xs.len())
            .map(|t| {
                let mut out = vec![0.0; heads * hd];
                for h in 0..heads {
                    let kvh = h / (heads / kv_heads);
                    let q = &qs[t][h * hd..][..hd];
                    let scores: Vec<f64> = (0..=t)
                        .map(|s| {
                            q.iter().zip(&ks[s][kvh * hd..][..hd]).map(|(a, b)| a * b).sum::<f64>() / (hd as f64).sqrt()
                        })
                        .collect();
                    let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let e: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                    let z: f64 = e.iter().sum();
                    for (s, w) in e.iter().enumerate() {
                        for j in 0..hd {
                            out[h * hd + j] += w / z * vs[s][kvh * hd + j];
                        }
                    }
                }
                out
            })
            .collect();
        rounding.inputs(&mut attended);
        for (x, a) in xs.iter_mut().zip(&attended) {
            for (xi, o) in x.iter_mut().zip(matvec(&l.wo, None, a)) {
                *xi += o;
            }
        }
        let mut xn: Vec<Vec<f64>> = xs.iter().map(|x| rms_norm(x, &l.ffn_norm, eps)).collect();
        rounding.inputs(&mut xn);
        let mut act: Vec<Vec<f64>> = xn
            .iter()
            .map(|xn| {
                let m = l.mlp().expect("a dense FFN");
                let (g, u) = (matvec(&m.gate, None, xn), matvec(&m.up, None, xn));
                g.iter().zip(&u).map(|(g, u)| g / (1.0 + (-g).exp()) * u).collect()
            })
            .collect();
        rounding.inputs(&mut act);
        for (x, a) in xs.iter_mut().zip(&act) {
            for (xi, o) in x.iter_mut().zip(matvec(&l.mlp().expect("a dense FFN").down, None, a)) {
                *xi += o;
            }
        }
    }
    xs.iter().map(|x| matvec(m.output_weight(), None, &rms_norm(x, &m.final_norm, eps))).collect()
}
