//! Chat templates: a user request rendered the way an instruction-tuned model was trained to see
//! it, with the Jinja template the checkpoint ships (GGUF `tokenizer.chat_template`, Hugging Face
//! `tokenizer_config.json` `chat_template`), rendered by minijinja (a Jinja2 implementation in
//! Rust by Jinja's author) with the variables Hugging Face's `apply_chat_template` passes:
//! `messages`, `add_generation_prompt`, `bos_token`, `eos_token`.

use minijinja::{Environment, context};

use crate::error::EvalError;

/// Renders one user message followed by the generation prompt (the assistant turn's header).
pub fn apply_chat_template(template: &str, user: &str, bos: &str, eos: &str) -> Result<String, EvalError> {
    let bad = EvalError::ChatTemplate;
    let mut env = Environment::new();
    // HF templates call raise_exception on unsupported conversations.
    env.add_function("raise_exception", |msg: String| -> Result<String, minijinja::Error> {
        Err(minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, msg))
    });
    env.add_template("chat", template).map_err(bad)?;
    let t = env.get_template("chat").map_err(bad)?;
    t.render(context! {
        messages => vec![context! { role => "user", content => user }],
        add_generation_prompt => true,
        bos_token => bos,
        eos_token => eos,
    })
    .map_err(bad)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SmolLM2-135M-Instruct's template (from its GGUF), and the text Hugging Face's
    /// `apply_chat_template(..., add_generation_prompt=True)` produces for one user message.
    #[test]
    fn smollm2_template_renders_as_hugging_face_does() {
        let template = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";
        let got = apply_chat_template(template, "What is 2+2?", "<|im_start|>", "<|im_end|>").unwrap();
        assert_eq!(
            got,
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn a_broken_template_is_an_error() {
        let e = apply_chat_template("{% for x in %}", "hi", "", "").unwrap_err();
        assert!(e.to_string().starts_with("the model's chat template:"), "{e}");
        let e = apply_chat_template("{{ raise_exception('only user turns') }}", "hi", "", "").unwrap_err();
        assert!(e.to_string().contains("only user turns"), "{e}");
    }
}
