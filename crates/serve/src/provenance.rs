//! What a server says about itself, recorded in the report beside the numbers it produced.

use serde_json::Value;

use crate::client::Server;

/// The server's own account of itself: its model list, and the version or properties endpoints
/// that vLLM (`/version`) and `llama-server` (`/props`: the model path, the build) have. Servers
/// without them leave those `None`.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerInfo {
    /// The endpoint, as given (without credentials: [`crate::Endpoint`] refuses them).
    pub url: String,
    /// The model the requests name.
    pub model: String,
    /// The `/models` answer's entry for that model.
    pub model_entry: Value,
    /// `/version`'s `version`, where the server has one.
    pub version: Option<String>,
    /// `/props`, where the server has it (`llama-server`: `model_path`, `build_info`, …), without
    /// its chat template (long, and in the report through the model already).
    pub props: Option<Value>,
}

impl ServerInfo {
    /// Asks `server`; the optional endpoints are tried once each.
    pub fn query(server: &Server) -> ServerInfo {
        let root = server.endpoint().root();
        let model_entry = server.models()["data"]
            .as_array()
            .and_then(|list| list.iter().find(|m| m["id"].as_str() == Some(server.model())))
            .cloned()
            .unwrap_or(Value::Null);
        let version =
            server.get_optional(&format!("{root}/version")).and_then(|v| v["version"].as_str().map(str::to_owned));
        let props = server.get_optional(&format!("{root}/props")).filter(Value::is_object).map(|mut props| {
            if let Some(map) = props.as_object_mut() {
                map.remove("chat_template");
            }
            props
        });
        ServerInfo { url: server.endpoint().to_string(), model: server.model().to_owned(), model_entry, version, props }
    }
}
