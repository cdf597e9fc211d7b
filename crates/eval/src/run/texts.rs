//! The text a model is teacher-forced on ([`Texts`]: per prompt, the prompt and a continuation
//! of it) and the tokens one chunk of it scores ([`chunk_tokens`]).

/// Per prompt, the prompt's tokens and a continuation of it: the text a model is teacher-forced
/// on.
pub(crate) type Texts = Vec<(Vec<u32>, Vec<u32>)>;

/// The continuation tokens a chunk scores: `positions` tokens from `start` of `rows` prompts from
/// `first_prompt`, row-major (`[rows, positions]`).
pub(crate) fn chunk_tokens(text: &Texts, first_prompt: usize, start: usize, rows: usize, positions: usize) -> Vec<u32> {
    text[first_prompt..first_prompt + rows]
        .iter()
        .flat_map(|(_, c)| c[start..start + positions].iter().copied())
        .collect()
}
