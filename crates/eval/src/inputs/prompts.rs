//! The prompts an evaluation runs: the first N of the eval set, encoded with the model's
//! tokenizer, and wrapped in the model's chat template when the set holds chat requests.
//!
//! **Invariant: prompts are the first N of the set, in file order (no sampling), so that two
//! evaluations of the same set and N run the same prompts.**

use qdrift_generate::{PromptTooLong, check_prompt_text, check_prompt_tokens};
use qdrift_load::{LoadedModel, WeightSource};

use crate::error::EvalError;
use crate::inputs::chat::{render_all, template_file};
use crate::inputs::evalset::{EvalPrompt, EvalSet};

/// The prompts of a set that run, and their tokens.
pub(crate) struct EncodedPrompts<'s> {
    /// The set they come from.
    pub set: &'s EvalSet,
    /// The tokens of its first N prompts, in set order; none is empty.
    pub tokens: Vec<Vec<u32>>,
    /// Whether they were wrapped in the model's chat template.
    pub chat_template: bool,
}

/// Encodes the first `count` prompts of `set` (all when `None`) for `loaded`'s tokenizer.
///
/// # Errors
/// `count` of 0 or beyond the set, a chat template that does not render, a prompt that encodes
/// to no tokens, a prompt too long for the model's trained context (in bytes before encoding, see
/// [`check_prompt_text`]; in tokens after, unless `allow_long`, see [`check_prompt_tokens`]).
pub(crate) fn encode_prompts<'s, W: WeightSource>(
    loaded: &LoadedModel<W>,
    set: &'s EvalSet,
    count: Option<usize>,
    allow_long: bool,
) -> Result<EncodedPrompts<'s>, EvalError> {
    let n = count.unwrap_or(set.prompts.len());
    if n == 0 || n > set.prompts.len() {
        let problem = format!("{n}: the eval set {} has {} prompts", set.name, set.prompts.len());
        return Err(EvalError::Option { option: "--prompts", problem });
    }
    let chosen = &set.prompts[..n];
    let trained = loaded.model.arch().max_seq_len;
    let too_long = |p: &EvalPrompt, e: PromptTooLong| EvalError::Prompt {
        id: p.id.clone(),
        problem: format!("(in {}) {e}", set.name),
    };
    // Before tokenizing: a prompt no tokenization could fit in the context is never encoded.
    for p in chosen {
        check_prompt_text(&p.prompt, trained).map_err(|e| too_long(p, e))?;
    }
    let template = loaded.chat_template.as_deref().filter(|_| is_chat_set(set));
    let tokens = match template {
        None => chosen.iter().map(|p| loaded.tokenizer.encode(&p.prompt)).collect(),
        Some(t) => encode_chat(loaded, t, chosen)?,
    };
    if let Some(i) = tokens.iter().position(Vec::is_empty) {
        return Err(EvalError::Prompt { id: chosen[i].id.clone(), problem: "encodes to no tokens".into() });
    }
    for (p, t) in chosen.iter().zip(&tokens) {
        check_prompt_tokens(t, trained, allow_long).map_err(|e| too_long(p, e))?;
    }
    Ok(EncodedPrompts { set, tokens, chat_template: template.is_some() })
}

impl<'s> EncodedPrompts<'s> {
    /// The prompts of the set that run: the first N.
    pub fn chosen(&self) -> &'s [EvalPrompt] {
        &self.set.prompts[..self.tokens.len()]
    }
}

/// Whether a set holds chat requests (to be wrapped in the model's chat template): the built-in
/// `chat` set, or a file named `chat*.jsonl`.
fn is_chat_set(set: &EvalSet) -> bool {
    let name = set.name.rsplit('/').next().unwrap_or(&set.name);
    name.starts_with("chat")
}

/// Each prompt as the user's message of a chat rendered with `template`, then encoded.
fn encode_chat<W>(loaded: &LoadedModel<W>, template: &str, prompts: &[EvalPrompt]) -> Result<Vec<Vec<u32>>, EvalError> {
    let tokenizer = &loaded.tokenizer;
    let piece = |id: Option<u32>| id.map(|i| tokenizer.decode(&[i])).unwrap_or_default();
    let (bos, eos) = (piece(tokenizer.bos_id()), piece(tokenizer.eos_id()));
    let users: Vec<&str> = prompts.iter().map(|p| p.prompt.as_str()).collect();
    let file = template_file(loaded);
    let texts = render_all(Some(&file), template, &users, (&bos, &eos))?;
    Ok(texts.iter().map(|t| tokenizer.encode(t)).collect())
}
