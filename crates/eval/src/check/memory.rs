//! An evaluation's memory, planned before any model is built: each model it runs (the reference,
//! the noise floor, every variant) one at a time, as [`qdrift_generate::model_footprint`] sizes
//! it, and the largest against the memory available. On a device that uses host memory (the CPU
//! backend, software adapters) a plan past it is refused in one line naming the model that peaks,
//! what it holds, and the batch size that would fit. wgpu reports no adapter memory, so a GPU's
//! plan is checked only buffer by buffer (`check_request`).
//!
//! When the plan is checked a Hugging Face folder or a GGUF file has been read through once and
//! holds nothing (`qdrift_load::open_source`); a llama2.c checkpoint is read and held at 16 bits,
//! and the memory available then is what is left beside it.

use burn::tensor::DType;
use qdrift_generate::{ComputeDevice, GenerationConfig, ModelFootprint, bytes_per_weight, format_gib, model_footprint};
use qdrift_load::ModelArch;

use crate::check::config::EvalConfig;
use crate::check::config::{VariantSpec, other_precision};
use crate::check::plan::Plan;
use crate::error::EvalError;
use crate::types::reference_name;

/// One model of the plan: its name in the report, its compute dtype and its footprint.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedModel {
    /// `fp16`/`bf16` (the reference), `noise-floor-f32`, a variant's name.
    pub name: String,
    /// What it computes in.
    pub dtype: DType,
    /// What it holds at its peak.
    pub footprint: ModelFootprint,
}

/// Every model of the evaluation `cfg` describes (its dtype and variants), for `arch` with
/// `parameters` weights, generating for `prompts` on `device` as `generation` batches them.
pub fn planned_models(
    cfg: &EvalConfig,
    device: &ComputeDevice,
    prompts: &[Vec<u32>],
    (arch, parameters): (&ModelArch, usize),
    generation: &GenerationConfig,
) -> Vec<PlannedModel> {
    // The FP16 reference's weights are f16 values (an f32 model on the CPU keeps them in f16);
    // a bf16 reference's, and a variant's dequantized weights, in general are not.
    let f16_valued = cfg.dtype != DType::BF16;
    let model = |name: String, dtype: DType, f16_valued: bool| {
        let bytes = bytes_per_weight(dtype, device, f16_valued);
        let footprint = model_footprint((arch, parameters), (dtype, bytes), device, prompts, generation);
        PlannedModel { name, dtype, footprint }
    };
    let mut models = vec![
        model(reference_name(cfg.dtype).to_string(), cfg.dtype, f16_valued),
        model(VariantSpec::NoiseFloor.name(cfg.dtype), other_precision(cfg.dtype), f16_valued),
    ];
    models.extend(cfg.variants.iter().map(|v| model(v.name(cfg.dtype), cfg.dtype, false)));
    models
}

/// The model that peaks highest.
pub fn largest(models: &[PlannedModel]) -> Option<&PlannedModel> {
    models.iter().max_by_key(|m| m.footprint.peak())
}

/// Refuses a plan whose largest model would not fit in `available` bytes (`None`: the device's
/// memory is not the host's, or unknown: not checked), naming the model, what it holds, and the
/// largest batch size that fits, if any does.
///
/// # Errors
/// [`EvalError::Memory`].
pub(crate) fn check_plan_memory(
    cfg: &EvalConfig,
    plan: &Plan,
    arch: &ModelArch,
    parameters: usize,
    available: Option<u128>,
) -> Result<(), EvalError> {
    let Some(available) = available else {
        return Ok(());
    };
    let models = planned_models(cfg, &plan.device, &plan.prompts, (arch, parameters), &plan.generation);
    let Some(peak) = largest(&models).filter(|m| m.footprint.peak() > available) else {
        return Ok(());
    };
    let f = &peak.footprint;
    let batch_size = plan.batch_size();
    let fits = (1..batch_size).rev().find(|&b| {
        let generation = GenerationConfig { batch_size: b, ..plan.generation };
        let models = planned_models(cfg, &plan.device, &plan.prompts, (arch, parameters), &generation);
        largest(&models).is_none_or(|m| m.footprint.peak() <= available)
    });
    let advice = match fits {
        Some(b) => format!("--batch-size {b} (or --prompts {b}) would fit"),
        None if f.weights + f.build > available => {
            "its weights alone do not fit, at any batch size: use a machine with more memory, or a \
             smaller model"
                .to_string()
        }
        None => "even one prompt at a time does not fit: use shorter prompts or --horizons (the prompt pass's \
                 attention grows with the square of the prompt's length)"
            .to_string(),
    };
    Err(EvalError::Memory(format!(
        "this evaluation needs {} at its peak ({} in {}: weights {}, key-value caches {} and workspace {} for {} \
         prompts in batches of {batch_size}), more than the {} of memory available; {advice}",
        format_gib(f.peak()),
        peak.name,
        crate::dtype_name(peak.dtype),
        format_gib(f.weights),
        format_gib(f.kv),
        format_gib(f.workspace),
        plan.prompts.len(),
        format_gib(available),
    )))
}

/// The memory this process may still allocate on a device that uses host memory (`None`
/// elsewhere): the host's available memory.
pub(crate) fn available_for(plan: &Plan) -> Option<u128> {
    plan.device.uses_host_memory.then(qdrift_generate::available_host_memory)
}

#[cfg(test)]
mod tests {
    use super::*;
    use qdrift_generate::{BackendChoice, select_device};

    /// An f16 evaluation of `synthetic:llama-1b` with int8, `prompts` prompts of 8 tokens in
    /// batches of `batch`, 10 new tokens: its config, architecture and plan on the CPU.
    fn llama_1b(prompts: usize, batch: usize) -> (EvalConfig, ModelArch, Plan) {
        let mut cfg = EvalConfig::new("synthetic:llama-1b".into());
        cfg.variants = vec![VariantSpec::Scheme("int8".parse().expect("int8"))];
        cfg.batch_size = Some(batch);
        let device = select_device(BackendChoice::Cpu).expect("cpu");
        let arch = qdrift_load::synthetic_arch("llama-1b").expect("preset");
        let plan = Plan::new(&cfg, vec![10], &arch, vec![vec![1u32; 8]; prompts], device).expect("plan");
        (cfg, arch, plan)
    }

    /// `synthetic:llama-1b` as `bench scale` runs it: f16, 2 prompts of 8 tokens × 10 new, one
    /// batch. Its reference holds 2.47 GB of weights plus the tied table's second copy, one
    /// 61M-weight block in f32 while it is built (its measured peak RSS: docs/BENCHMARKS.md,
    /// '`bench scale`').
    #[test]
    fn llama_1b_is_its_weights_its_tied_table_and_a_block() {
        let (cfg, arch, plan) = llama_1b(2, 2);
        assert_eq!(cfg.dtype, DType::F16);
        let models =
            planned_models(&cfg, &plan.device, &plan.prompts, (&arch, arch.parameter_count()), &plan.generation);
        let names: Vec<&str> = models.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(names, ["fp16", "noise-floor-f32", "int8"]);
        let f = models[0].footprint;
        assert_eq!(f.weights, (1_235_814_400 + 262_668_288) * 2);
        assert_eq!(f.build, 60_821_504 * 4);
        // 2 sequences × 18 positions × 8 heads × 64 × 2 (k, v) × 16 layers × 2 bytes.
        assert_eq!(f.kv, 2 * 18 * 8 * 64 * 2 * 16 * 2);
        assert_eq!(f.workspace, 2 * 128_256 * 4);
        let peak = f.peak() as f64 / (1u64 << 30) as f64;
        assert!((2.9..3.19).contains(&peak), "{peak} GiB");
        // The noise floor in f32 keeps the f16 weights in f16 on the CPU; its caches are f32.
        assert_eq!(models[1].footprint.weights, f.weights);
        assert_eq!(models[1].footprint.kv, 2 * f.kv);
        // A variant's dequantized weights in f16: the same as the reference's.
        assert_eq!(models[2].footprint.weights, f.weights);
    }

    #[test]
    fn a_plan_past_the_memory_is_refused_with_a_batch_size_that_fits() {
        // 16 prompts in one batch of 16, 1000 + 8 positions.
        let (cfg, arch, mut plan) = llama_1b(16, 16);
        let params = arch.parameter_count();
        plan.generation.max_new_tokens = 1000;
        let all = planned_models(&cfg, &plan.device, &plan.prompts, (&arch, params), &plan.generation);
        let need = all.iter().map(|m| m.footprint.peak()).max().expect("models");
        assert!(check_plan_memory(&cfg, &plan, &arch, params, Some(need)).is_ok());
        assert!(check_plan_memory(&cfg, &plan, &arch, params, None).is_ok(), "a GPU's memory is not known");
        let e = check_plan_memory(&cfg, &plan, &arch, params, Some(need - 1)).expect_err("too large").to_string();
        assert!(
            e.contains("noise-floor-f32 in f32") && e.contains("--batch-size 15 (or --prompts 15) would fit"),
            "{e}"
        );
        // Room for the weights and a quarter of the caches: batches of 4 would hold a quarter
        // each, but two of them (264 MB of f32 caches each) run side by side on 2 cores, and
        // batches of 5 to 15 hold more than a quarter: batches of 2 (two side by side) fit.
        let f = all[1].footprint;
        let quarter = f.weights + (f.kv + f.workspace) / 4;
        let e = check_plan_memory(&cfg, &plan, &arch, params, Some(quarter)).expect_err("too large").to_string();
        let side_by_side = qdrift_generate::SIDE_BY_SIDE_CACHE_BYTES >= 2 * f.kv / 4;
        let fits = if side_by_side && plan.device.parallel_batches >= 2 { 2 } else { 4 };
        assert!(e.contains(&format!("--batch-size {fits} (or --prompts {fits}) would fit")), "{e}");
        let e = check_plan_memory(&cfg, &plan, &arch, params, Some(f.weights)).expect_err("too large").to_string();
        assert!(e.contains("its weights alone do not fit"), "{e}");
    }
}
