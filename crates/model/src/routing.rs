//! [`RoutingRecord`]: which experts a forward pass's mixture-of-experts layers chose, recorded
//! by `moe.rs` when a caller asks (`Llama::forward_hidden_recording`), for the routing metrics.

/// The experts chosen in one MoE layer's forward pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerRoutes {
    /// The block.
    pub layer: usize,
    /// `[batch, seq, top_k]`: the pass's rows and columns, and experts per token.
    pub shape: [usize; 3],
    /// Each position's experts in order of weight (the largest first), row-major over `shape`
    /// (padding columns included).
    pub experts: Vec<u32>,
}

/// The experts a forward pass's MoE layers chose: one [`LayerRoutes`] per MoE layer and pass,
/// appended in the order they ran (a generation's decoding steps append one entry per layer
/// each; their columns follow the earlier ones').
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RoutingRecord {
    /// The entries, in the order the layers ran.
    pub layers: Vec<LayerRoutes>,
}
