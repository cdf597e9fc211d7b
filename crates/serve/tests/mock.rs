//! The client against a small HTTP server in the test process, answering as vLLM, llama-server
//! and llama-cpp-python answer (their documented completions forms), and as broken servers do.
//! A real server (llama.cpp's) is the evaluation's concern, where a served variant is scored.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use qdrift_serve::{
    Completion, Endpoint, Prompt, Request, ServeError, Server, ServerInfo, ServerOptions, Token, run_bounded,
};
use serde_json::{Value, json};

/// One request as the server saw it.
#[derive(Debug, Clone)]
struct Seen {
    path: String,
    authorization: Option<String>,
    body: Value,
}

type Handler = dyn Fn(&Seen, usize) -> (u16, String) + Send + Sync;

/// Serves `handler` on a free port until the test ends; returns the base URL and what it saw.
fn serve(handler: Arc<Handler>) -> (String, Arc<Mutex<Vec<Seen>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/v1", listener.local_addr().unwrap());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&seen);
    let count = Arc::new(AtomicUsize::new(0));
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let handler = Arc::clone(&handler);
            let log = Arc::clone(&log);
            let n = count.fetch_add(1, Ordering::SeqCst);
            std::thread::spawn(move || answer(stream, &*handler, &log, n));
        }
    });
    (url, seen)
}

fn answer(mut stream: TcpStream, handler: &Handler, log: &Mutex<Vec<Seen>>, n: usize) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    let path = line.split_whitespace().nth(1).unwrap_or("/").to_owned();
    let mut length = 0;
    let mut authorization = None;
    loop {
        let mut header = String::new();
        reader.read_line(&mut header).unwrap();
        let header = header.trim_end();
        if header.is_empty() {
            break;
        }
        let (k, v) = header.split_once(':').unwrap();
        match k.to_ascii_lowercase().as_str() {
            "content-length" => length = v.trim().parse().unwrap(),
            "authorization" => authorization = Some(v.trim().to_owned()),
            _ => {}
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).unwrap();
    let seen = Seen { path, authorization, body: serde_json::from_slice(&body).unwrap_or(Value::Null) };
    log.lock().unwrap().push(seen.clone());
    let (status, text) = handler(&seen, n);
    let _ = write!(
        stream,
        "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
        text.len()
    );
}

fn models(names: &[&str]) -> String {
    json!({"object": "list", "data": names.iter().map(|n| json!({"id": n, "object": "model"})).collect::<Vec<_>>()})
        .to_string()
}

fn options() -> ServerOptions {
    ServerOptions {
        concurrency: 4,
        timeout: Duration::from_secs(5),
        retries: 2,
        backoff: Duration::from_millis(10),
        token: Some("sekrit".into()),
    }
}

/// vLLM with `return_tokens_as_token_ids`: the prompt ids echoed, then `max_tokens` ids.
fn vllm(seen: &Seen, _: usize) -> (u16, String) {
    if seen.path.ends_with("/models") {
        return (200, models(&["smol"]));
    }
    let prompt: Vec<u64> = seen.body["prompt"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
    let max = seen.body["max_tokens"].as_u64().unwrap();
    let echo = seen.body["echo"].as_bool().unwrap();
    let mut ids: Vec<u64> = if echo { prompt.clone() } else { vec![] };
    ids.extend((0..max).map(|i| 100 + i));
    let tokens: Vec<String> = ids.iter().map(|i| format!("token_id:{i}")).collect();
    let lps: Vec<Value> =
        ids.iter().enumerate().map(|(i, _)| if echo && i == 0 { Value::Null } else { json!(-0.25) }).collect();
    let tops: Vec<Value> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| {
            if echo && i == 0 {
                Value::Null
            } else {
                json!({format!("token_id:{id}"): -0.25, format!("token_id:{}", id + 1): -1.5})
            }
        })
        .collect();
    let answer = json!({"choices": [{"index": 0, "text": "…", "finish_reason": "length",
        "logprobs": {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": vec![0; ids.len()]}}]});
    (200, answer.to_string())
}

#[test]
fn a_vllm_style_server_gives_ids_logprobs_and_the_echoed_prompt() {
    let (url, seen) = serve(Arc::new(vllm));
    let server = Server::connect(url.parse().unwrap(), options()).unwrap();
    assert_eq!(server.model(), "smol");
    let request = Request { prompt: Prompt::Ids(vec![5, 6, 7]), max_tokens: 4, top_logprobs: 2, echo: true };
    let done = request.send(&server).unwrap();
    assert_eq!(done.prompt.iter().map(|s| s.token.clone()).collect::<Vec<_>>(), [5, 6, 7].map(Token::Id));
    assert_eq!(done.prompt[0].logprob, None);
    assert_eq!(done.generated.len(), 4);
    assert_eq!(done.generated[0].token, Token::Id(100));
    assert_eq!(done.generated[3].logprob, Some(-0.25));
    assert!(done.generated[3].top.contains(&(Token::Id(104), -1.5)));
    let seen = seen.lock().unwrap();
    let body = &seen.last().unwrap().body;
    assert_eq!(body["model"], "smol");
    assert_eq!(body["temperature"], 0.0);
    assert_eq!(body["ignore_eos"], true);
    assert_eq!(body["min_tokens"], 4);
    assert_eq!(body["logprobs"], 2);
    assert_eq!(seen.last().unwrap().authorization.as_deref(), Some("Bearer sekrit"));
}

#[test]
fn llama_servers_content_form_and_text_tokens_are_read() {
    let answer = json!({"choices": [{"finish_reason": "length", "logprobs": {"content": [
        {"id": 11, "token": " the", "logprob": -0.1, "top_logprobs": [{"id": 11, "token": " the", "logprob": -0.1}, {"id": 12, "token": " a", "logprob": -2.4}]},
        {"id": 13, "token": " cat", "logprob": -0.3, "top_logprobs": []}
    ]}}]});
    let request = Request { prompt: Prompt::Ids(vec![1]), max_tokens: 2, top_logprobs: 2, echo: false };
    let done = Completion::parse(&answer, &request).unwrap();
    assert_eq!(done.generated[1].token, Token::Id(13));
    assert_eq!(done.generated[0].top[1], (Token::Id(12), -2.4));
    // llama-cpp-python: text tokens, an echoed text prompt split by text_offset.
    let answer = json!({"choices": [{"finish_reason": "length", "logprobs": {
        "tokens": ["Once", " upon", " a", " time"], "token_logprobs": [null, -1.0, -0.5, -0.2],
        "top_logprobs": [null, {" upon": -1.0}, {" a": -0.5}, {" time": -0.2, " hill": -3.0}],
        "text_offset": [0, 4, 9, 11]}}]});
    let request = Request { prompt: Prompt::Text("Once upon".into()), max_tokens: 2, top_logprobs: 2, echo: true };
    let done = Completion::parse(&answer, &request).unwrap();
    assert_eq!(done.prompt.len(), 2);
    assert_eq!(done.generated[1].token, Token::Text(" time".into()));
    assert_eq!(done.generated[1].top.len(), 2);
}

#[test]
fn requests_run_concurrently_in_order() {
    let (url, _) = serve(Arc::new(vllm));
    let server = Server::connect(url.parse().unwrap(), options()).unwrap();
    let requests: Vec<Request> =
        (0..12).map(|i| Request { prompt: Prompt::Ids(vec![i]), max_tokens: 3, top_logprobs: 1, echo: true }).collect();
    let done = run_bounded(&requests, 4, |r| r.send(&server)).unwrap();
    for (i, c) in done.iter().enumerate() {
        assert_eq!(c.prompt[0].token, Token::Id(i as u32));
    }
}

#[test]
fn server_errors_are_retried_and_then_reported_with_the_url() {
    // Two 503s, then answers: the retries absorb them.
    let flaky = |seen: &Seen, n: usize| {
        if n < 2 { (503, "{\"error\":{\"message\":\"warming up\"}}".into()) } else { vllm(seen, n) }
    };
    let (url, seen) = serve(Arc::new(flaky));
    let server = Server::connect(url.parse().unwrap(), options()).unwrap();
    assert_eq!(server.model(), "smol");
    assert_eq!(seen.lock().unwrap().len(), 3);
    // Always 500: three attempts, then the server's own message.
    let (url, seen) = serve(Arc::new(|_: &Seen, _: usize| (500, "{\"detail\":\"CUDA error\"}".to_owned())));
    let err = Server::connect(url.parse().unwrap(), options()).unwrap_err();
    assert!(matches!(&err, ServeError::Status { status: 500, message, .. } if message == "CUDA error"), "{err}");
    assert!(err.to_string().contains(&url));
    assert_eq!(seen.lock().unwrap().len(), 3);
}

#[test]
fn each_broken_server_gives_one_clear_error() {
    // Nothing listening.
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let url = format!("http://127.0.0.1:{port}/v1");
    let err = Server::connect(url.parse().unwrap(), options()).unwrap_err();
    assert!(matches!(err, ServeError::Unreachable { attempts: 3, .. }), "{err}");
    assert!(err.to_string().contains(&url), "{err}");

    // A wrong model name, and a server of two models asked for none.
    let (url, _) = serve(Arc::new(|_: &Seen, _: usize| (200, models(&["a", "b"]))));
    let err = Server::connect(format!("{url}#c").parse().unwrap(), options()).unwrap_err();
    assert_eq!(err.to_string(), format!("{url}: the server serves no model named c (it serves: a, b)"));
    let err = Server::connect(url.parse().unwrap(), options()).unwrap_err();
    assert!(matches!(err, ServeError::WhichModel { count: 2, .. }), "{err}");

    // A server that stops early.
    let short = |seen: &Seen, n: usize| {
        let (status, text) = vllm(seen, n);
        if seen.path.ends_with("/models") {
            return (status, text);
        }
        let mut v: Value = serde_json::from_str(&text).unwrap();
        for key in ["tokens", "token_logprobs", "top_logprobs", "text_offset"] {
            v["choices"][0]["logprobs"][key].as_array_mut().unwrap().pop();
        }
        v["choices"][0]["finish_reason"] = json!("stop");
        (200, v.to_string())
    };
    let (url, _) = serve(Arc::new(short));
    let server = Server::connect(url.parse().unwrap(), options()).unwrap();
    let request = Request { prompt: Prompt::Ids(vec![1]), max_tokens: 5, top_logprobs: 1, echo: false };
    let err = request.send(&server).unwrap_err();
    assert!(matches!(err, ServeError::Truncated { got: 4, want: 5, .. }), "{err}");
    assert!(err.to_string().contains("finish_reason stop"), "{err}");

    // Garbage, and JSON without log-probabilities.
    for bad in
        ["<html>502 Bad Gateway</html>", "{\"choices\":[{\"text\":\"hi\",\"logprobs\":null}]}", "{\"choices\":[]}"]
    {
        let body = bad.to_owned();
        let (url, _) =
            serve(Arc::new(
                move |seen: &Seen, _: usize| {
                    if seen.path.ends_with("/models") { (200, models(&["m"])) } else { (200, body.clone()) }
                },
            ));
        let server = Server::connect(url.parse().unwrap(), options()).unwrap();
        let err = request.send(&server).unwrap_err();
        assert!(matches!(err, ServeError::Unusable { .. }), "{bad}: {err}");
    }
}

#[test]
fn the_server_describes_itself() {
    let handler = |seen: &Seen, n: usize| match seen.path.as_str() {
        "/version" => (200, "{\"version\":\"0.11.0\"}".to_owned()),
        "/props" => (200, "{\"model_path\":\"/m/smol.gguf\",\"chat_template\":\"{{x}}\"}".to_owned()),
        _ => vllm(seen, n),
    };
    let (url, _) = serve(Arc::new(handler));
    let endpoint: Endpoint = url.parse().unwrap();
    let server = Server::connect(endpoint, options()).unwrap();
    let info = ServerInfo::query(&server);
    assert_eq!(info.version.as_deref(), Some("0.11.0"));
    assert_eq!(info.model_entry["id"], "smol");
    let props = info.props.unwrap();
    assert_eq!(props["model_path"], "/m/smol.gguf");
    assert!(props.get("chat_template").is_none());
}
