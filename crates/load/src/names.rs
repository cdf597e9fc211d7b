//! Indices in tensor names (`model.layers.{i}.…`, `blk.{i}.…`, `experts.{e}.…`), for the readers'
//! refusal of tensors beyond what a checkpoint's configuration accounts for.

/// `(i, rest)` when `name` is `{prefix}{i}.{rest}` with `i` decimal digits; an index past
/// `usize` reads as `usize::MAX` (beyond any count).
pub(crate) fn indexed<'a>(name: &'a str, prefix: &str) -> Option<(usize, &'a str)> {
    let (digits, rest) = name.strip_prefix(prefix)?.split_once('.')?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((digits.parse().unwrap_or(usize::MAX), rest))
}

/// The expert index of a per-expert module's tensor, `….experts.{e}.…` (Qwen-MoE's
/// `mlp.experts.{e}`, Mixtral's `block_sparse_moe.experts.{e}`); `None` for other names (gpt-oss's
/// fused `mlp.experts.gate_up_proj` among them).
pub(crate) fn expert_index(name: &str) -> Option<usize> {
    let at = name.find("experts.")?;
    let (e, _) = indexed(&name[at..], "experts.")?;
    // `…shared_experts.0…` would be another word's tail: the match must start a segment.
    (at == 0 || name[..at].ends_with('.')).then_some(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indices_are_read_from_whole_segments() {
        assert_eq!(indexed("model.layers.12.mlp.up_proj.weight", "model.layers."), Some((12, "mlp.up_proj.weight")));
        assert_eq!(indexed("blk.99999999999999999999999.attn_q.weight", "blk."), Some((usize::MAX, "attn_q.weight")));
        assert_eq!(indexed("blk.x.attn_q.weight", "blk."), None);
        assert_eq!(indexed("model.norm.weight", "model.layers."), None);
        assert_eq!(expert_index("mlp.experts.8.gate_proj.weight"), Some(8));
        assert_eq!(expert_index("block_sparse_moe.experts.0.w1.weight"), Some(0));
        assert_eq!(expert_index("mlp.experts.gate_up_proj"), None);
        assert_eq!(expert_index("mlp.shared_experts.0.up_proj.weight"), None);
    }
}
