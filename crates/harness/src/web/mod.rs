//! The `promptforge/web` Plugin (chapter 13): a fetch tool that keeps to the public internet
//! and a search tool over the search backend the Host configures.
//!
//! - [`policy`]: URL admission, the blocked address ranges, the redirect check, the limits.
//! - [`network`]: the seam: the [`Network`] trait and the real network.
//! - [`scripted`]: the scripted network of `--web-script`.
//! - `fetch`: the fetch pipeline; `content`: content types, charsets, decompression and
//!   extraction; [`search`]: search validation, backends and response checks.
//!
//! [`WebPlugin`] ties them together: the Plugin's registry entry for prepare, and the call of
//! either tool. Its output is untrusted ([`ToolInfo::untrusted`]), so the section VM wraps every
//! result in the untrusted envelope before a script or a model sees it.

mod content;
mod fetch;
pub mod network;
pub mod policy;
pub mod scripted;
pub mod search;

use std::sync::Arc;

use promptforge_protocol::host::{PluginInfo, ToolInfo};
use serde_json::{Value as Json, json};

pub use network::{Network, RealNetwork};
pub use policy::FetchPolicy;
pub use scripted::ScriptedNetwork;
pub use search::SearchBackend;

/// The Plugin id.
pub const PLUGIN_ID: &str = "promptforge/web";
/// The fetch tool's catalog description.
pub const FETCH_DESCRIPTION: &str = "Fetch a web page and return its main content as markdown.";
/// The search tool's catalog description.
pub const SEARCH_DESCRIPTION: &str =
    "Search the web and return a list of results (title, url, description).";
/// The requirements line when the Host has no search provider.
pub const NO_SEARCH_PROVIDER: &str =
    "promptforge/web needs promptforge/search-provider, and this host provides none";

/// A web tool's own class of failure (a script sees every one as error kind `tool`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolErrorKind {
    /// A problem with the arguments or the address.
    InvalidArguments,
    /// The search request or its response body failed on the network.
    Transport,
    /// The search backend answered with an error or a bad response.
    Backend,
}

/// A failed web tool call: its class and its model-safe message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolFailure {
    /// The tool's class for the failure.
    pub kind: ToolErrorKind,
    /// The message (`tool call failure: {message}` in a script).
    pub message: String,
}

impl ToolFailure {
    /// A failure of this kind.
    pub fn new(kind: ToolErrorKind, message: impl Into<String>) -> Self {
        ToolFailure {
            kind,
            message: message.into(),
        }
    }
}

/// The web Plugin: a network, the fetch policy and the search backend, if any.
#[derive(Debug, Clone)]
pub struct WebPlugin {
    network: Arc<dyn Network>,
    policy: FetchPolicy,
    search: Option<SearchBackend>,
    /// Why the Plugin cannot start on this Host (a bad `[search]` table, say): reported to a
    /// prompt that declares it, and to nothing else.
    setup_failure: Option<String>,
}

impl WebPlugin {
    /// The Plugin over `network`, with the default fetch policy and this search backend.
    pub fn new(network: Arc<dyn Network>, search: Option<SearchBackend>) -> Self {
        WebPlugin {
            network,
            policy: FetchPolicy::default(),
            search,
            setup_failure: None,
        }
    }

    /// A Plugin that cannot start, for this reason (its activation fails with
    /// `promptforge/web cannot start: {reason}`).
    pub fn unavailable(reason: impl Into<String>) -> Self {
        WebPlugin {
            network: Arc::new(ScriptedNetwork::empty()),
            policy: FetchPolicy::default(),
            search: None,
            setup_failure: Some(reason.into()),
        }
    }

    /// The same Plugin under another fetch policy.
    pub fn with_policy(mut self, policy: FetchPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Whether every call finishes without waiting on the outside world (a scripted network),
    /// so a Host may run it on the spot, in issue order.
    pub fn is_immediate(&self) -> bool {
        self.network.is_immediate()
    }

    /// The Plugin's registry entry: its two tools, and the missing-service line when the Host
    /// provides no search backend.
    pub fn info(&self) -> PluginInfo {
        PluginInfo {
            id: PLUGIN_ID.to_owned(),
            tools: vec![
                ToolInfo {
                    name: "fetch".to_owned(),
                    description: FETCH_DESCRIPTION.to_owned(),
                    parameters: fetch_schema(self.policy.max_chars).to_string(),
                    untrusted: true,
                },
                ToolInfo {
                    name: "search".to_owned(),
                    description: SEARCH_DESCRIPTION.to_owned(),
                    parameters: search_schema().to_string(),
                    untrusted: true,
                },
            ],
            conflicts: Vec::new(),
            activation_failure: match &self.setup_failure {
                Some(reason) => Some(format!("{PLUGIN_ID} cannot start: {reason}")),
                None => self.search.is_none().then(|| NO_SEARCH_PROVIDER.to_owned()),
            },
        }
    }

    /// Whether `path` names one of this Plugin's tools.
    pub fn owns(path: &str) -> bool {
        path == "promptforge/web/fetch" || path == "promptforge/web/search"
    }

    /// Call the tool at `path` with `args`: `Ok` is its result text (soft failures included),
    /// `Err` a failed call.
    pub async fn call(&self, path: &str, args: &Json) -> Result<String, ToolFailure> {
        match path {
            "promptforge/web/fetch" => {
                fetch::fetch(self.network.as_ref(), &self.policy, args).await
            }
            "promptforge/web/search" => match &self.search {
                Some(backend) => search::search(self.network.as_ref(), backend, args).await,
                None => Err(ToolFailure::new(
                    ToolErrorKind::Transport,
                    "web_search: request failed",
                )),
            },
            other => Err(ToolFailure::new(
                ToolErrorKind::InvalidArguments,
                format!("promptforge/web has no tool at {other}"),
            )),
        }
    }
}

/// The fetch tool's argument schema.
fn fetch_schema(max_chars: usize) -> Json {
    json!({
        "type": "object",
        "properties": {
            "url": {"type": "string", "description": "The https:// URL of the page to fetch."},
            "max_chars": {
                "type": "integer", "minimum": 1, "maximum": max_chars,
                "description": "The most characters of text to return."
            },
            "raw": {
                "type": "boolean",
                "description": "Convert the whole page instead of extracting its main article."
            }
        },
        "required": ["url"],
        "additionalProperties": false
    })
}

/// The search tool's eight-field argument schema.
fn search_schema() -> Json {
    let hostnames = json!({
        "type": "array", "maxItems": 20,
        "items": {"type": "string", "minLength": 1, "maxLength": 128}
    });
    json!({
        "type": "object",
        "properties": {
            "query": {"type": "string", "minLength": 1, "maxLength": 400,
                      "description": "The search text."},
            "count": {"type": "integer", "minimum": 1, "maximum": 20,
                      "description": "How many results to return."},
            "freshness": {"type": "string", "enum": ["pd", "pw", "pm", "py"],
                          "description": "Only results from the past day, week, month or year."},
            "country": {"type": "string", "minLength": 1, "maxLength": 128,
                        "description": "A country code to target."},
            "search_lang": {"type": "string", "minLength": 1, "maxLength": 128,
                            "description": "A language code for the results."},
            "safesearch": {"type": "string", "enum": ["off", "moderate", "strict"]},
            "include_domains": hostnames.clone(),
            "exclude_domains": hostnames
        },
        "required": ["query"],
        "additionalProperties": false
    })
}
#[cfg(test)]
mod tests;
