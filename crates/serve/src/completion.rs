//! One completion request and its answer, in the dialects servers speak.
//!
//! The request is OpenAI's legacy completions body (`/v1/completions`), greedy and fixed-length:
//! `temperature` 0, `top_p` 1, `n` 1, `logprobs` K, `max_tokens` the horizon, plus the fields
//! that keep a server from stopping early or rewriting tokens where it has them: vLLM's and
//! `llama-server`'s `ignore_eos`, vLLM's `min_tokens`, `return_tokens_as_token_ids` and
//! `skip_special_tokens: false`. Servers ignore fields they do not know (vLLM, SGLang,
//! `llama-server` and llama-cpp-python's pydantic models all do).
//!
//! Three answer dialects are read:
//! - OpenAI's legacy `logprobs` (vLLM, SGLang, llama-cpp-python, TensorRT-LLM):
//!   `{tokens, token_logprobs, top_logprobs: [{token: logprob}], text_offset}`;
//! - the same with vLLM's `return_tokens_as_token_ids`: every token is `"token_id:N"`;
//! - `llama-server`'s: `{content: [{id, token, logprob, top_logprobs: [{id, token, logprob}]}]}`.
//!
//! A token is an id where the answer gives one ([`Token::Id`]), its text otherwise
//! ([`Token::Text`]); the legacy dialect's `top_logprobs` is a map from text, so two tokens with
//! the same text collapse into one entry there, which is why ids are asked for first.

use serde_json::{Value, json};

use crate::client::{Server, excerpt};
use crate::error::ServeError;

/// What the model is asked to continue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Prompt {
    /// Token ids of the server's tokenizer (vLLM, SGLang and `llama-server` accept a list of ids).
    Ids(Vec<u32>),
    /// Text, tokenized by the server (llama-cpp-python accepts only text).
    Text(String),
}

/// One completion to ask for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// The prompt.
    pub prompt: Prompt,
    /// Tokens to generate (at least 1: some servers refuse 0).
    pub max_tokens: usize,
    /// Log-probabilities per position: the top K (`logprobs` in the request).
    pub top_logprobs: usize,
    /// Whether the answer also scores the prompt's own tokens (`echo`), teacher-forced.
    pub echo: bool,
}

/// A token in an answer.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Token {
    /// The server's token id.
    Id(u32),
    /// The token's text, where the server gives no id.
    Text(String),
}

/// One position of an answer: the token there, its log-probability and the top K.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    /// The token at this position (generated, or the prompt's own with `echo`).
    pub token: Token,
    /// Its natural-log probability; `None` where the server gives none (the first prompt token).
    pub logprob: Option<f64>,
    /// The K most probable tokens and their log-probabilities, as listed.
    pub top: Vec<(Token, f64)>,
}

/// A server's answer to one [`Request`].
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    /// The prompt's positions (with `echo`; empty otherwise).
    pub prompt: Vec<Step>,
    /// The generated positions, in order.
    pub generated: Vec<Step>,
    /// Why the server stopped (`length`, `stop`, …).
    pub finish_reason: String,
}

impl Request {
    /// The JSON body for `model`.
    pub fn body(&self, model: &str) -> Value {
        let prompt = match &self.prompt {
            Prompt::Ids(ids) => json!(ids),
            Prompt::Text(text) => json!(text),
        };
        json!({
            "model": model,
            "prompt": prompt,
            "max_tokens": self.max_tokens,
            "min_tokens": self.max_tokens,
            "ignore_eos": true,
            "temperature": 0.0,
            "top_p": 1.0,
            "n": 1,
            "stream": false,
            "seed": 0,
            "logprobs": self.top_logprobs,
            "echo": self.echo,
            "return_tokens_as_token_ids": true,
            "skip_special_tokens": false,
        })
    }

    /// Sends it to `server` and reads the answer whole.
    ///
    /// # Errors
    /// As [`Server::post_json`]; [`ServeError::Unusable`] for an answer [`Completion::parse`]
    /// refuses; [`ServeError::Truncated`] when fewer than `max_tokens` tokens came back.
    pub fn send(&self, server: &Server) -> Result<Completion, ServeError> {
        let url = format!("{}/completions", server.endpoint().base);
        let answer = server.post_json(&url, &self.body(server.model()))?;
        let completion =
            Completion::parse(&answer, self).map_err(|problem| ServeError::Unusable { url: url.clone(), problem })?;
        if completion.generated.len() < self.max_tokens {
            return Err(ServeError::Truncated {
                url,
                got: completion.generated.len(),
                want: self.max_tokens,
                reason: completion.finish_reason,
            });
        }
        Ok(completion)
    }
}

impl Completion {
    /// Reads one answer to `request`: its first choice's log-probabilities, split into the
    /// echoed prompt and the generated tokens. A server that generated more tokens than asked
    /// keeps only the first `max_tokens`.
    ///
    /// # Errors
    /// A one-line reason when the answer lacks a field, has lists of different lengths, a
    /// log-probability that is not a finite number ≤ 0 (a little above 0 is rounding and is
    /// capped), or fewer echoed positions than the prompt has.
    pub fn parse(answer: &Value, request: &Request) -> Result<Completion, String> {
        let choice =
            answer["choices"].get(0).ok_or_else(|| format!("no choices in {}", excerpt(&answer.to_string())))?;
        let finish_reason = choice["finish_reason"].as_str().unwrap_or("none").to_owned();
        let logprobs = &choice["logprobs"];
        if logprobs.is_null() {
            return Err("no logprobs in the answer: does the server return log-probabilities for completions?".into());
        }
        let (steps, offsets) =
            if logprobs["content"].is_array() { content_steps(logprobs)? } else { legacy_steps(logprobs)? };
        let prompt_len = if request.echo { echoed_prompt_len(request, &steps, offsets.as_deref())? } else { 0 };
        let mut steps = steps;
        let mut generated = steps.split_off(prompt_len);
        generated.truncate(request.max_tokens);
        Ok(Completion { prompt: steps, generated, finish_reason })
    }
}

/// How many leading positions of an echoed answer are the prompt's.
fn echoed_prompt_len(request: &Request, steps: &[Step], offsets: Option<&[usize]>) -> Result<usize, String> {
    let len = match (&request.prompt, offsets) {
        (Prompt::Ids(ids), _) => ids.len(),
        (Prompt::Text(text), Some(offsets)) => offsets.iter().take_while(|&&o| o < text.len()).count(),
        (Prompt::Text(_), None) => return Err("an echoed text prompt without text_offset".into()),
    };
    if len > steps.len() {
        return Err(format!("{} positions for an echoed prompt of {len} tokens", steps.len()));
    }
    Ok(len)
}

/// A log-probability as a server writes it: `null` is `None`; else a finite number, capped at 0.
fn logprob(value: &Value, at: &str) -> Result<Option<f64>, String> {
    if value.is_null() {
        return Ok(None);
    }
    let v = value.as_f64().ok_or_else(|| format!("{at}: log-probability {value} is not a number"))?;
    if !v.is_finite() || v > 1e-3 {
        return Err(format!("{at}: log-probability {v} is not a finite number ≤ 0"));
    }
    Ok(Some(v.min(0.0)))
}

/// A log-probability that must be present.
fn required_logprob(value: &Value, at: &str) -> Result<f64, String> {
    logprob(value, at)?.ok_or_else(|| format!("{at}: log-probability missing"))
}

/// A token written as text, or as vLLM's `token_id:N`.
fn token_of_text(text: &str) -> Token {
    match text.strip_prefix("token_id:").and_then(|n| n.parse().ok()) {
        Some(id) => Token::Id(id),
        None => Token::Text(text.to_owned()),
    }
}

type Steps = (Vec<Step>, Option<Vec<usize>>);

/// OpenAI's legacy form (module docs).
fn legacy_steps(logprobs: &Value) -> Result<Steps, String> {
    let list = |key: &str| logprobs[key].as_array().ok_or_else(|| format!("logprobs has no `{key}` list"));
    let tokens = list("tokens")?;
    let token_logprobs = list("token_logprobs")?;
    let tops = list("top_logprobs")?;
    if token_logprobs.len() != tokens.len() || tops.len() != tokens.len() {
        return Err(format!(
            "logprobs lists differ in length: {} tokens, {} token_logprobs, {} top_logprobs",
            tokens.len(),
            token_logprobs.len(),
            tops.len()
        ));
    }
    let mut steps = Vec::with_capacity(tokens.len());
    for (i, ((token, lp), top)) in tokens.iter().zip(token_logprobs).zip(tops).enumerate() {
        let at = format!("position {i}");
        let token = token.as_str().ok_or_else(|| format!("{at}: token {token} is not a string"))?;
        let top = match top {
            Value::Null => Vec::new(),
            Value::Object(map) => map
                .iter()
                .map(|(t, lp)| Ok((token_of_text(t), required_logprob(lp, &at)?)))
                .collect::<Result<Vec<_>, String>>()?,
            other => return Err(format!("{at}: top_logprobs entry {} is not a map", excerpt(&other.to_string()))),
        };
        steps.push(Step { token: token_of_text(token), logprob: logprob(lp, &at)?, top });
    }
    let offsets = logprobs["text_offset"]
        .as_array()
        .map(|o| o.iter().map(|v| v.as_u64().map(|v| v as usize).ok_or("a text_offset is not a count")).collect())
        .transpose()?;
    Ok((steps, offsets))
}

/// `llama-server`'s form (module docs).
fn content_steps(logprobs: &Value) -> Result<Steps, String> {
    let entry = |e: &Value, at: &str| -> Result<(Token, Option<f64>), String> {
        let token = match (e["id"].as_u64(), e["token"].as_str()) {
            (Some(id), _) => Token::Id(u32::try_from(id).map_err(|_| format!("{at}: token id {id} is too large"))?),
            (None, Some(text)) => token_of_text(text),
            (None, None) => return Err(format!("{at}: an entry with neither id nor token")),
        };
        Ok((token, logprob(&e["logprob"], at)?))
    };
    let content = logprobs["content"].as_array().ok_or("logprobs has no `content` list")?;
    let mut steps = Vec::with_capacity(content.len());
    for (i, position) in content.iter().enumerate() {
        let at = format!("position {i}");
        let (token, lp) = entry(position, &at)?;
        let top = position["top_logprobs"]
            .as_array()
            .map(|top| {
                top.iter()
                    .map(|e| {
                        let (t, lp) = entry(e, &at)?;
                        Ok((t, lp.ok_or_else(|| format!("{at}: a top_logprobs entry without logprob"))?))
                    })
                    .collect::<Result<Vec<_>, String>>()
            })
            .transpose()?
            .unwrap_or_default();
        steps.push(Step { token, logprob: lp, top });
    }
    Ok((steps, None))
}
