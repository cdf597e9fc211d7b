//! Chat templates: a user request rendered the way an instruction-tuned model was trained to see
//! it, with the Jinja template the checkpoint ships (GGUF `tokenizer.chat_template`, Hugging Face
//! `tokenizer_config.json` `chat_template`), rendered by minijinja (a Jinja2 implementation in
//! Rust by Jinja's author) with the variables Hugging Face's `apply_chat_template` passes:
//! `messages`, `add_generation_prompt`, `bos_token`, `eos_token`.
//!
//! A template comes from a downloaded file, so it is untrusted input: it renders with a budget of
//! [`CHAT_TEMPLATE_FUEL`] instructions (minijinja's fuel: nested loops cannot run on) and a cap
//! of [`CHAT_TEMPLATE_MAX_BYTES`] on what it renders; past either it is refused, naming the file
//! and the limit. Neither bounds the memory a template takes without writing: a string doubled in
//! a `{% set %}` a dozen times, or `'%3000000000s'|format`, asks for gigabytes in a few
//! instructions, and an allocation that fails aborts the process. So a program that sets a
//! [`ChatSandbox`] (the `qdrift` binary does) renders an evaluation's templates in a child
//! process whose address space is capped ([`CHAT_TEMPLATE_MEMORY`], `RLIMIT_AS`): a template
//! that needs more is refused in one line and the evaluation ends cleanly. Without one (a library
//! user), templates render in the calling process.

use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use minijinja::{Environment, ErrorKind, context};
use qdrift_load::{LoadedModel, ModelFormat};

use crate::error::EvalError;

/// The instructions one rendering may execute (minijinja's fuel). The real templates measured
/// (SmolLM2, Llama 3, Llama 3.1, Qwen2, Qwen2.5, Mistral, Gemma, Phi-3; each prompt of the
/// built-in `chat` set as the one user message) take at most 102 (Llama 3.1's, with its date
/// and tools preamble; `chat_templates_render_the_chat_set_within_a_hundredth_of_the_fuel`).
/// This is about 500 times that, so that templates not measured here (longer preambles, tool
/// branches) keep a 100-fold margin; two nested loops of 9000 stop after a few thousand turns.
pub const CHAT_TEMPLATE_FUEL: u64 = 50_000;

/// The most a chat template may render for one prompt, in bytes: a prompt of the eval set plus
/// its turn headers is a few kilobytes.
pub const CHAT_TEMPLATE_MAX_BYTES: usize = 1 << 20;

/// The address space of the child process a [`ChatSandbox`] renders in: the program's own mapped
/// code and a few templates' working memory fit many times over (real templates render a prompt
/// in kilobytes), a memory bomb does not.
pub const CHAT_TEMPLATE_MEMORY: u64 = 1 << 30;

/// How to start the child process that renders chat templates ([`set_chat_sandbox`]): a program
/// and arguments that run [`serve_chat_request`] on their standard input and output.
#[derive(Clone, Debug)]
pub struct ChatSandbox {
    /// The program (the `qdrift` binary itself).
    pub program: PathBuf,
    /// Its arguments (a hidden subcommand).
    pub args: Vec<String>,
}

static SANDBOX: OnceLock<ChatSandbox> = OnceLock::new();

/// Renders every chat template of this process's evaluations in a child process started as
/// `sandbox` says, its address space capped at [`CHAT_TEMPLATE_MEMORY`]; the first call wins.
pub fn set_chat_sandbox(sandbox: ChatSandbox) {
    let _ = SANDBOX.set(sandbox);
}

/// What a child renders: one template, each user message alone, with the generation prompt.
#[derive(serde::Serialize, serde::Deserialize)]
pub(crate) struct ChatRequest {
    template: String,
    users: Vec<String>,
    bos: String,
    eos: String,
}

/// What a child answers: every rendering, or why the first that failed did.
#[derive(serde::Serialize, serde::Deserialize)]
enum ChatReply {
    Rendered(Vec<String>),
    /// A limit ([`EvalError::ChatTemplateLimit`]'s words).
    Limit(String),
    /// Any other error's message.
    Failed(String),
}

/// The child's side of a [`ChatSandbox`]: reads a request (JSON: the template, the user messages,
/// BOS and EOS) from `input`, renders it and writes the reply (JSON) to `output`.
///
/// # Errors
/// Reading or writing failed, or the request is not one.
pub fn serve_chat_request(mut input: impl Read, mut output: impl Write) -> io::Result<()> {
    let mut bytes = Vec::new();
    input.read_to_end(&mut bytes)?;
    let request: ChatRequest = serde_json::from_slice(&bytes).map_err(io::Error::other)?;
    let rendered: Result<Vec<String>, EvalError> = request
        .users
        .iter()
        .map(|u| render_measured(None, &request.template, u, &request.bos, &request.eos).map(|(t, _)| t))
        .collect();
    let reply = match rendered {
        Ok(texts) => ChatReply::Rendered(texts),
        Err(EvalError::ChatTemplateLimit { limit, .. }) => ChatReply::Limit(limit),
        Err(e) => ChatReply::Failed(e.to_string()),
    };
    serde_json::to_writer(&mut output, &reply).map_err(io::Error::other)?;
    output.flush()
}

/// Each of `users` as the one user message of a chat rendered with `template`, in the
/// [`ChatSandbox`] when there is one; a refusal names `file`.
pub(crate) fn render_all(
    file: Option<&Path>,
    template: &str,
    users: &[&str],
    (bos, eos): (&str, &str),
) -> Result<Vec<String>, EvalError> {
    let Some(sandbox) = SANDBOX.get() else {
        return users.iter().map(|u| render_measured(file, template, u, bos, eos).map(|(t, _)| t)).collect();
    };
    let request = ChatRequest {
        template: template.to_string(),
        users: users.iter().map(|u| (*u).to_string()).collect(),
        bos: bos.to_string(),
        eos: eos.to_string(),
    };
    let limit = |limit: String| EvalError::ChatTemplateLimit { file: file.map(Path::to_path_buf), limit };
    let output = run_capped(sandbox, &request)?;
    match serde_json::from_slice::<ChatReply>(&output.stdout) {
        Ok(ChatReply::Rendered(texts)) if texts.len() == users.len() => Ok(texts),
        Ok(ChatReply::Limit(words)) => Err(limit(words)),
        Ok(ChatReply::Failed(message)) => {
            Err(EvalError::ChatTemplateFailed { file: file.map(Path::to_path_buf), message })
        }
        // No reply: the child ran out of its address space (an allocation that fails aborts).
        _ => Err(limit(format!(
            "needs more than {} MiB of memory to render one prompt (the process rendering it ended: {})",
            CHAT_TEMPLATE_MEMORY >> 20,
            output.status
        ))),
    }
}

/// Runs the sandbox's program with `request` on its standard input, its address space capped.
fn run_capped(sandbox: &ChatSandbox, request: &ChatRequest) -> Result<std::process::Output, EvalError> {
    use std::os::unix::process::CommandExt;
    let io_error = |source| EvalError::Io { path: sandbox.program.clone(), source };
    let mut command = std::process::Command::new(&sandbox.program);
    command.args(&sandbox.args).stdin(std::process::Stdio::piped()).stdout(std::process::Stdio::piped());
    command.stderr(std::process::Stdio::null());
    // SAFETY: the closure runs in the child between fork and exec, and calls only setrlimit, which
    // is async-signal-safe; it allocates nothing and touches no lock.
    unsafe {
        command.pre_exec(|| {
            let cap = libc::rlimit { rlim_cur: CHAT_TEMPLATE_MEMORY, rlim_max: CHAT_TEMPLATE_MEMORY };
            if libc::setrlimit(libc::RLIMIT_AS, &cap) == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
        });
    }
    let mut child = command.spawn().map_err(io_error)?;
    let bytes = serde_json::to_vec(request).map_err(|e| io_error(io::Error::other(e)))?;
    if let Some(mut stdin) = child.stdin.take() {
        // The child reads its whole request before it writes: no deadlock. A child that died
        // early closes the pipe; its status tells why.
        let _ = stdin.write_all(&bytes);
    }
    child.wait_with_output().map_err(io_error)
}

/// Renders one user message followed by the generation prompt (the assistant turn's header), in
/// this process; past a limit (see the module doc) the error names no file (an evaluation renders
/// through `render_all`, which names it).
pub fn apply_chat_template(template: &str, user: &str, bos: &str, eos: &str) -> Result<String, EvalError> {
    render_measured(None, template, user, bos, eos).map(|(text, _)| text)
}

/// The file a model's chat template comes from: the GGUF file, or a Hugging Face folder's
/// `tokenizer_config.json`.
pub fn template_file<W>(loaded: &LoadedModel<W>) -> PathBuf {
    match loaded.format {
        ModelFormat::HfSafetensors => loaded.path.join("tokenizer_config.json"),
        _ => loaded.tokenizer_path.clone(),
    }
}

/// What [`apply_chat_template`] renders and the fuel it took.
fn render_measured(
    file: Option<&Path>,
    template: &str,
    user: &str,
    bos: &str,
    eos: &str,
) -> Result<(String, u64), EvalError> {
    let bad = EvalError::ChatTemplate;
    let mut env = Environment::new();
    env.set_fuel(Some(CHAT_TEMPLATE_FUEL));
    // HF templates call raise_exception on unsupported conversations.
    env.add_function("raise_exception", |msg: String| -> Result<String, minijinja::Error> {
        Err(minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, msg))
    });
    env.add_template("chat", template).map_err(bad)?;
    let t = env.get_template("chat").map_err(bad)?;
    let mut out = Capped { bytes: Vec::new(), over: false };
    let ctx = context! {
        messages => vec![context! { role => "user", content => user }],
        add_generation_prompt => true,
        bos_token => bos,
        eos_token => eos,
    };
    let limit = |limit: String| EvalError::ChatTemplateLimit { file: file.map(Path::to_path_buf), limit };
    let fuel = match t.render_captured_to(ctx, &mut out) {
        Ok(done) => done.state().fuel_levels().map_or(0, |(used, _)| used),
        Err(_) if out.over => {
            return Err(limit(format!("renders more than {CHAT_TEMPLATE_MAX_BYTES} bytes for one prompt")));
        }
        Err(e) if e.kind() == ErrorKind::OutOfFuel => {
            return Err(limit(format!(
                "runs past {CHAT_TEMPLATE_FUEL} instructions for one prompt (its fuel; real templates take about a hundred)"
            )));
        }
        Err(e) => return Err(bad(e)),
    };
    let text = String::from_utf8(out.bytes)
        .map_err(|_| bad(minijinja::Error::new(ErrorKind::BadSerialization, "rendered text is not UTF-8")))?;
    Ok((text, fuel))
}

/// Collects what a template renders, refusing to grow past [`CHAT_TEMPLATE_MAX_BYTES`].
struct Capped {
    bytes: Vec<u8>,
    /// Whether a write was refused for the cap.
    over: bool,
}

impl io::Write for Capped {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.bytes.len().saturating_add(buf.len()) > CHAT_TEMPLATE_MAX_BYTES {
            self.over = true;
            return Err(io::Error::other("the chat template's rendered size limit"));
        }
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SmolLM2-135M-Instruct's template (from its GGUF).
    const SMOLLM2: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    /// SmolLM2's template and the text Hugging Face's
    /// `apply_chat_template(..., add_generation_prompt=True)` produces for one user message.
    #[test]
    fn smollm2_template_renders_as_hugging_face_does() {
        let got = apply_chat_template(SMOLLM2, "What is 2+2?", "<|im_start|>", "<|im_end|>").unwrap();
        assert_eq!(
            got,
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    /// Chat templates of real instruction-tuned checkpoints (their `tokenizer_config.json`
    /// `chat_template`), by name.
    const REAL_TEMPLATES: &[(&str, &str)] = &[
        (
            "llama3",
            "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}",
        ),
        (
            "llama3.1",
            "{{- bos_token }}\n{%- if custom_tools is defined %}\n    {%- set tools = custom_tools %}\n{%- endif %}\n{%- if not tools_in_user_message is defined %}\n    {%- set tools_in_user_message = true %}\n{%- endif %}\n{%- if not date_string is defined %}\n    {%- set date_string = \"26 Jul 2024\" %}\n{%- endif %}\n{%- if not tools is defined %}\n    {%- set tools = none %}\n{%- endif %}\n\n{#- This block extracts the system message, so we can slot it into the right place. #}\n{%- if messages[0]['role'] == 'system' %}\n    {%- set system_message = messages[0]['content']|trim %}\n    {%- set messages = messages[1:] %}\n{%- else %}\n    {%- set system_message = \"\" %}\n{%- endif %}\n\n{#- System message + builtin tools #}\n{{- \"<|start_header_id|>system<|end_header_id|>\\n\\n\" }}\n{%- if builtin_tools is defined or tools is not none %}\n    {{- \"Environment: ipython\\n\" }}\n{%- endif %}\n{%- if builtin_tools is defined %}\n    {{- \"Tools: \" + builtin_tools | reject('equalto', 'code_interpreter') | join(\", \") + \"\\n\\n\"}}\n{%- endif %}\n{{- \"Cutting Knowledge Date: December 2023\\n\" }}\n{{- \"Today Date: \" + date_string + \"\\n\\n\" }}\n{%- if tools is not none and not tools_in_user_message %}\n    {{- \"You have access to the following functions. To call a function, please respond with JSON for a function call.\" }}\n    {{- 'Respond in the format {\"name\": function name, \"parameters\": dictionary of argument name and its value}.' }}\n    {{- \"Do not use variables.\\n\\n\" }}\n    {%- for t in tools %}\n        {{- t | tojson(indent=4) }}\n        {{- \"\\n\\n\" }}\n    {%- endfor %}\n{%- endif %}\n{{- system_message }}\n{{- \"<|eot_id|>\" }}\n\n{%- for message in messages %}\n    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}\n        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}\n    {%- elif 'tool_calls' in message %}\n        {{- raise_exception(\"tool calls are not rendered here\") }}\n    {%- endif %}\n{%- endfor %}\n{%- if add_generation_prompt %}\n    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}\n{%- endif %}\n",
        ),
        (
            "qwen2",
            "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}",
        ),
        (
            "qwen2.5",
            "{%- if tools %}\n    {{- '<|im_start|>system\\n' }}\n    {%- if messages[0]['role'] == 'system' %}\n        {{- messages[0]['content'] }}\n    {%- else %}\n        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}\n    {%- endif %}\n    {{- \"\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>\" }}\n    {%- for tool in tools %}\n        {{- \"\\n\" }}\n        {{- tool | tojson }}\n    {%- endfor %}\n    {{- \"\\n</tools><|im_end|>\\n\" }}\n{%- else %}\n    {%- if messages[0]['role'] == 'system' %}\n        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n    {%- else %}\n        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}\n    {%- endif %}\n{%- endif %}\n{%- for message in messages %}\n    {%- if (message.role == \"user\") or (message.role == \"system\" and not loop.first) or (message.role == \"assistant\" and not message.tool_calls) %}\n        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n    {%- elif message.role == \"assistant\" %}\n        {{- '<|im_start|>' + message.role }}\n        {%- if message.content %}\n            {{- '\\n' + message.content }}\n        {%- endif %}\n        {{- '<|im_end|>\\n' }}\n    {%- elif message.role == \"tool\" %}\n        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != \"tool\") %}\n            {{- '<|im_start|>user' }}\n        {%- endif %}\n        {{- '\\n<tool_response>\\n' }}\n        {{- message.content }}\n        {{- '\\n</tool_response>' }}\n        {%- if loop.last or (messages[loop.index0 + 1].role != \"tool\") %}\n            {{- '<|im_end|>\\n' }}\n        {%- endif %}\n    {%- endif %}\n{%- endfor %}\n{%- if add_generation_prompt %}\n    {{- '<|im_start|>assistant\\n' }}\n{%- endif %}\n",
        ),
        (
            "mistral",
            "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}",
        ),
        (
            "gemma",
            "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}",
        ),
        (
            "phi3",
            "{% for message in messages %}{% if message['role'] == 'system' %}{{'<|system|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'assistant' %}{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}",
        ),
    ];

    #[test]
    fn chat_templates_render_the_chat_set_within_a_hundredth_of_the_fuel() {
        let set = crate::inputs::evalset::EvalSet::built_in("chat").expect("built in");
        let mut most = 0;
        for (name, template) in REAL_TEMPLATES.iter().chain([&("smollm2", SMOLLM2)]) {
            for p in &set.prompts {
                let (text, fuel) = render_measured(None, template, &p.prompt, "<s>", "</s>").expect(name);
                assert!(text.contains(p.prompt.trim()), "{name}: {text}");
                most = most.max(fuel);
            }
            eprintln!("{name}: fuel up to {most} so far");
        }
        assert!(most > 0 && most * 100 <= CHAT_TEMPLATE_FUEL, "largest fuel {most}");
    }

    #[test]
    fn nested_loops_run_out_of_fuel_at_once() {
        let template = "{% for i in range(9000) %}{% for j in range(9000) %}{{ i + j }}{% endfor %}{% endfor %}";
        let t = std::time::Instant::now();
        let e = apply_chat_template(template, "hi", "", "").unwrap_err();
        assert!(matches!(e, EvalError::ChatTemplateLimit { .. }), "{e}");
        assert!(e.to_string().contains("50000 instructions"), "{e}");
        assert!(t.elapsed().as_secs() < 2, "{:?}", t.elapsed());
    }

    #[test]
    fn a_template_rendering_past_a_mebibyte_is_refused() {
        let e = apply_chat_template("{{ 'x' * 2000000 }}", "hi", "", "").unwrap_err();
        assert!(e.to_string().contains("renders more than 1048576 bytes"), "{e}");
        let e = apply_chat_template("{% for i in range(40) %}{{ 'x' * 30000 }}{% endfor %}", "hi", "", "").unwrap_err();
        assert!(e.to_string().contains("renders more than 1048576 bytes"), "{e}");
        // Just under the cap renders.
        assert_eq!(apply_chat_template("{{ 'x' * 1048576 }}", "hi", "", "").expect("renders").len(), 1 << 20);
    }

    #[test]
    fn a_broken_template_is_an_error() {
        let e = apply_chat_template("{% for x in %}", "hi", "", "").unwrap_err();
        assert!(e.to_string().starts_with("the model's chat template:"), "{e}");
        let e = apply_chat_template("{{ raise_exception('only user turns') }}", "hi", "", "").unwrap_err();
        assert!(e.to_string().contains("only user turns"), "{e}");
    }
}
