//! The Host's model catalog: config files, quick ids, and resolving an id to a ready provider.
//!
//! # Where models come from
//!
//! 1. **Config files** (TOML). Two layers are read, the nearer one winning:
//!    - the user file: `$XDG_CONFIG_HOME/promptforge/config.toml` when `XDG_CONFIG_HOME` is
//!      set to an absolute path, otherwise `promptforge/config.toml` under the platform config
//!      directory (`~/.config` on Linux, `~/Library/Application Support` on macOS,
//!      `%APPDATA%` on Windows);
//!    - the project file: `promptforge.toml` in the working directory, or else in the nearest
//!      parent directory that has one (so a command run in a subfolder finds the project's).
//!
//!    A missing file is skipped; a file that exists but cannot be read or parsed is an error.
//!    Entries merge **by id, whole entry**: a project entry replaces the user entry with the same
//!    id outright (no field-by-field merge), and the project `default` replaces the user one.
//! 2. **Quick ids** `KIND:NAME` (`openai:gpt-4.1`, `anthropic:claude-sonnet-4-6`,
//!    `ollama:qwen3:8b`, `vllm:…`, `llamacpp:…`, `gateway:…`) work with no file: `NAME` is the
//!    model name sent on the wire and every other setting is the kind's default. A config entry
//!    whose id is a quick id overrides it.
//!
//! ```toml
//! default = "sonnet"            # the model used when no --model is given (optional)
//!
//! [models.sonnet]
//! provider = "anthropic"        # openai | anthropic | ollama | vllm | llamacpp | gateway
//! model = "claude-sonnet-4-6"   # the name sent on the wire (default: the id)
//! base_url = "https://api.anthropic.com"   # default: the kind's (see below)
//! api_key_env = "ANTHROPIC_API_KEY"        # the variable's NAME; "" for no key
//! context = 200000              # context window in tokens
//! thinking = "Switchable"       # Never | Always | Switchable
//! description = "Claude Sonnet for drafting"
//! ```
//!
//! Keys are never read from files or flags: an entry names the environment variable that holds
//! its key. The key must be set (non-empty) unless the base URL's host is loopback
//! (`127.0.0.1`, `::1`, `localhost`), where it is optional and sent when set.
//!
//! # Kind defaults
//!
//! | kind | base URL | key variable | context | thinking | switch sent as |
//! |---|---|---|---|---|---|
//! | `openai` | `$OPENAI_BASE_URL` or `https://api.openai.com/v1` | `OPENAI_API_KEY` | 128000 | by name (below) | `reasoning_effort` |
//! | `anthropic` | `$ANTHROPIC_BASE_URL` or `https://api.anthropic.com` | `ANTHROPIC_API_KEY` | 200000 | Switchable | `thinking` (native) |
//! | `ollama` | `$OLLAMA_HOST` + `/v1` or `http://127.0.0.1:11434/v1` | none | `$OLLAMA_CONTEXT_LENGTH` or 4096 | Switchable | `reasoning_effort` |
//! | `vllm` | `http://127.0.0.1:8000/v1` | `VLLM_API_KEY` | 32768 | Switchable | `chat_template_kwargs` |
//! | `llamacpp` | `http://127.0.0.1:8080/v1` | `LLAMA_API_KEY` | 32768 | Switchable | `chat_template_kwargs` |
//! | `gateway` | `$PROMPTFORGE_GATEWAY_URL` (required) | `PROMPTFORGE_GATEWAY_API_KEY` | 128000 | Switchable | `reasoning_effort` |
//!
//! OpenAI thinking by model name: `gpt-5…` is Switchable, `o1…`/`o3…`/`o4…` Always, anything
//! else Never. Set `context` and `thinking` in an entry whenever the default is wrong for your
//! model. The switch is only ever sent to a Switchable model.

use super::http::is_loopback;
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use reqwest::Url;
use serde::{Deserialize, Serialize};

use super::anthropic::{AnthropicOptions, AnthropicProvider};
use super::error::ModelError;
use super::openai::{MaxTokensField, OpenAiOptions, OpenAiProvider, OpenAiThinking};
use super::provider::{ModelLimits, ModelProvider};
use super::types::{
    ChatRequest, Message, ModelDescription, Price, ProviderKind, ThinkingCapability,
};

/// How an OpenAI-compatible entry spells the thinking switch (config `thinking_param`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ThinkingParam {
    /// `reasoning_effort`: `thinking_on` (default `medium`) / `thinking_off` (default `none`,
    /// or `minimal` for `gpt-5` and `gpt-5-…`).
    ReasoningEffort,
    /// `chat_template_kwargs: {thinking_kwarg: bool}` (`thinking_kwarg` default
    /// `enable_thinking`).
    ChatTemplateKwargs,
    /// Send no switch.
    None,
}

/// One `[models."ID"]` table of a config file.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelEntry {
    /// The protocol and defaults: `openai`, `anthropic`, `ollama`, `vllm`, `llamacpp`,
    /// `gateway`.
    pub provider: Option<ProviderKind>,
    /// The model name sent on the wire; default: the entry's id.
    pub model: Option<String>,
    /// The endpoint's base URL; default: the kind's.
    pub base_url: Option<String>,
    /// The name of the environment variable holding the API key; `""` for none.
    pub api_key_env: Option<String>,
    /// The context window in tokens (at least 1).
    pub context: Option<u64>,
    /// `Never`, `Always` or `Switchable`.
    pub thinking: Option<ThinkingCapability>,
    /// What the model is, for listings and for roles without a description.
    pub description: Option<String>,
    /// OpenAI-compatible: how the switch is sent.
    pub thinking_param: Option<ThinkingParam>,
    /// OpenAI-compatible, `reasoning_effort`: the effort for thinking on.
    pub thinking_on: Option<String>,
    /// OpenAI-compatible, `reasoning_effort`: the effort for thinking off.
    pub thinking_off: Option<String>,
    /// OpenAI-compatible, `chat_template_kwargs`: the template variable.
    pub thinking_kwarg: Option<String>,
    /// OpenAI-compatible: `max_tokens` or `max_completion_tokens`.
    pub max_tokens_field: Option<String>,
    /// OpenAI-compatible: ask for the usage chunk (`stream_options`); default true.
    pub stream_usage: Option<bool>,
    /// Anthropic: `max_tokens` when a round sets none; default 8192.
    pub max_output_tokens: Option<u32>,
    /// Anthropic: `budget_tokens` with thinking on; default 4096 (at least 1024).
    pub thinking_budget: Option<u32>,
    /// The longest one round may take, in seconds (at least 1); default 600.
    pub round_timeout: Option<u64>,
    /// How many times a round is retried after a 429 or 5xx; default 2, 0 for none.
    pub retries: Option<u32>,
    /// US dollars per million prompt tokens, for the cost a Host shows (with `output_price`).
    pub input_price: Option<f64>,
    /// US dollars per million completion tokens (with `input_price`).
    pub output_price: Option<f64>,
    /// The file the entry came from (`None` for a quick id).
    #[serde(skip)]
    pub source: Option<PathBuf>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigFile {
    default: Option<String>,
    #[serde(default)]
    models: BTreeMap<String, ModelEntry>,
    search: Option<SearchEntry>,
    mcp: Option<crate::mcp::McpTable>,
}

/// The `[search]` table: the search backend behind the web Plugin's search tool (see
/// `docs/web.md`). Like a model entry, it names the environment variable holding its key.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SearchEntry {
    /// `brave`, `searxng`, `tavily` or `gateway`.
    pub provider: String,
    /// The endpoint (default: the provider's own; required for `searxng`).
    pub base_url: Option<String>,
    /// The name of the variable holding the key ("" for none).
    pub api_key_env: Option<String>,
    /// The file the table came from.
    #[serde(skip)]
    pub source: Option<PathBuf>,
}

/// A catalog failure: a setup problem the Host reports before any run starts.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CatalogError {
    /// A config file exists but cannot be read.
    #[error("cannot read the model config {path}: {message}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        message: String,
    },
    /// A config file is not valid TOML or has unknown keys or wrong types.
    #[error("invalid model config {path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The TOML reader's message.
        message: String,
    },
    /// An entry's values are unusable.
    #[error("model `{id}`{}: {message}", origin(.file))]
    InvalidEntry {
        /// The entry id.
        id: String,
        /// The file it came from.
        file: Option<PathBuf>,
        /// What is wrong and what to set.
        message: String,
    },
    /// Neither a catalog entry nor a quick id.
    #[error(
        "unknown model `{id}`: it is not in the model catalog ({}) and is not a quick id; use `openai:NAME`, `anthropic:NAME`, `ollama:NAME`, `vllm:NAME`, `llamacpp:NAME` or `gateway:NAME`, or add a [models.\"{id}\"] table to promptforge.toml",
        searched_text(.searched)
    )]
    UnknownModel {
        /// The id asked for.
        id: String,
        /// The config files that were read.
        searched: Vec<PathBuf>,
    },
    /// A required environment variable is unset or empty.
    #[error("missing environment variable: {name}{}", purpose_text(.purpose))]
    MissingEnv {
        /// The variable.
        name: String,
        /// What it is for (absent for the gateway variables, whose message the spec fixes).
        purpose: Option<String>,
    },
    /// The `[search]` table cannot be used.
    #[error("the [search] table{}: {message}", origin(.file))]
    InvalidSearch {
        /// The file it came from.
        file: Option<PathBuf>,
        /// What is wrong and what to set.
        message: String,
    },
    /// An environment variable holds something other than Unicode text.
    #[error("environment variable is set but not valid Unicode: {name}")]
    NotUnicode {
        /// The variable.
        name: String,
    },
    /// The HTTP client could not be set up.
    #[error("cannot set up the model client: {0}")]
    Client(String),
}

fn origin(file: &Option<PathBuf>) -> String {
    match file {
        Some(path) => format!(" in {}", path.display()),
        None => String::new(),
    }
}

fn searched_text(searched: &[PathBuf]) -> String {
    if searched.is_empty() {
        "no config file was found".to_owned()
    } else {
        let files: Vec<String> = searched.iter().map(|p| p.display().to_string()).collect();
        format!("read {}", files.join(", "))
    }
}

fn purpose_text(purpose: &Option<String>) -> String {
    match purpose {
        Some(p) => format!(" ({p})"),
        None => String::new(),
    }
}

/// Where environment variables come from: the process, or a fixed map (tests, embedding).
#[derive(Debug, Clone, Default)]
pub enum Environment {
    /// The process environment.
    #[default]
    Process,
    /// A fixed set of variables; anything else is unset.
    Fixed(BTreeMap<String, String>),
}

impl Environment {
    /// A fixed environment holding these pairs.
    pub fn fixed<I, K, V>(pairs: I) -> Self
    where
        I: IntoIterator<Item = (K, V)>,
        K: Into<String>,
        V: Into<String>,
    {
        Self::Fixed(
            pairs
                .into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
        )
    }

    /// The variable's value; unset and empty both read as `None`.
    pub fn get(&self, name: &str) -> Result<Option<String>, CatalogError> {
        let value = match self {
            Self::Process => match std::env::var_os(name) {
                None => None,
                Some(raw) => {
                    Some(
                        raw.into_string()
                            .map_err(|_: OsString| CatalogError::NotUnicode {
                                name: name.to_owned(),
                            })?,
                    )
                }
            },
            Self::Fixed(map) => map.get(name).cloned(),
        };
        Ok(value.filter(|v| !v.is_empty()))
    }
}

/// The two config files the catalog reads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConfigSources {
    /// The user file (read first).
    pub user: Option<PathBuf>,
    /// The project file (read second; wins).
    pub project: Option<PathBuf>,
}

impl ConfigSources {
    /// The standard locations: the user file under `$XDG_CONFIG_HOME` (absolute) or the
    /// platform config directory, and `promptforge.toml` in `working_dir` or else in its
    /// nearest ancestor that has one (`working_dir/promptforge.toml` when none has).
    pub fn standard(working_dir: &Path, env: &Environment) -> Result<Self, CatalogError> {
        let xdg = env
            .get("XDG_CONFIG_HOME")?
            .map(PathBuf::from)
            .filter(|p| p.is_absolute());
        let user_dir = xdg.or_else(dirs::config_dir);
        Ok(Self {
            user: user_dir.map(|d| d.join("promptforge").join("config.toml")),
            project: Some(
                working_dir
                    .ancestors()
                    .map(|dir| dir.join("promptforge.toml"))
                    .find(|file| file.is_file())
                    .unwrap_or_else(|| working_dir.join("promptforge.toml")),
            ),
        })
    }
}

/// Whether an API key is available, for listings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum KeyStatus {
    /// The model uses no key, or its endpoint is loopback and the key is unset.
    NotNeeded,
    /// The key variable is set.
    Set {
        /// The variable.
        env: String,
    },
    /// The key variable is unset: resolving the model fails until it is set.
    Missing {
        /// The variable.
        env: String,
    },
}

/// One line of `promptforge models`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ListedModel {
    /// The model as the catalog describes it (kind defaults filled in).
    pub description: ModelDescription,
    /// The config file it comes from.
    pub source: Option<PathBuf>,
    /// Whether it is the config's `default`.
    pub is_default: bool,
    /// Whether its key is available.
    pub key: KeyStatus,
    /// Why it cannot be used as configured, if so.
    pub problem: Option<String>,
}

/// One quick-id kind, for `promptforge models`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct QuickKind {
    /// The kind: `KIND:NAME` ids use it.
    pub kind: ProviderKind,
    /// The base URL a quick id of this kind uses, if it can be worked out.
    pub base_url: Option<String>,
    /// Where the base URL comes from, or why there is none.
    pub origin: String,
    /// The key variable's status.
    pub key: KeyStatus,
}

/// A model ready to run rounds: its description and a provider bound to it.
#[derive(Debug, Clone)]
pub struct ResolvedModel {
    /// What the catalog knows about the model.
    pub description: ModelDescription,
    /// The provider that answers its rounds.
    pub provider: Arc<dyn ModelProvider>,
}

impl ResolvedModel {
    /// A request for this model (its wire name filled in) with these messages.
    pub fn request(&self, messages: Vec<Message>) -> ChatRequest {
        ChatRequest::new(self.description.model.clone(), messages)
    }
}

/// The Host's model catalog.
#[derive(Debug, Clone, Default)]
pub struct Catalog {
    entries: BTreeMap<String, ModelEntry>,
    default: Option<String>,
    search: Option<SearchEntry>,
    mcp_servers: BTreeMap<String, crate::mcp::McpServerEntry>,
    searched: Vec<PathBuf>,
    limits: ModelLimits,
}

/// Everything resolution decides before the key is looked up.
struct Plan {
    description: ModelDescription,
    key_env: Option<String>,
    key_optional: bool,
    setup: Setup,
    hint: String,
}

enum Setup {
    OpenAi(OpenAiOptions),
    Anthropic(AnthropicOptions),
}

fn check_id(id: &str) -> Result<(), String> {
    if id.is_empty() {
        return Err("a model id must not be empty".to_owned());
    }
    if id.chars().any(char::is_control) {
        return Err("a model id must not contain control characters".to_owned());
    }
    Ok(())
}

impl Catalog {
    /// A catalog with no config files: only quick ids resolve.
    pub fn empty() -> Self {
        Self::default()
    }

    /// Read the config files that exist, the user file first and the project file over it.
    pub fn load(sources: &ConfigSources) -> Result<Self, CatalogError> {
        let mut catalog = Self::empty();
        for path in [&sources.user, &sources.project].into_iter().flatten() {
            let text = match crate::limits::read_capped(path, crate::limits::CONFIG_FILE_CAP) {
                Ok(bytes) => String::from_utf8(bytes).map_err(|_| CatalogError::Read {
                    path: path.clone(),
                    message: "the file is not valid UTF-8".to_owned(),
                })?,
                Err(crate::limits::ReadError::Io(err))
                    if err.kind() == std::io::ErrorKind::NotFound =>
                {
                    continue;
                }
                Err(crate::limits::ReadError::Io(err)) => {
                    return Err(CatalogError::Read {
                        path: path.clone(),
                        message: err.to_string(),
                    });
                }
                Err(other) => {
                    return Err(CatalogError::Read {
                        path: path.clone(),
                        message: other.describe(path),
                    });
                }
            };
            catalog = catalog.layer(&text, path)?;
        }
        Ok(catalog)
    }

    /// Read the standard config files for `working_dir` from the process environment.
    pub fn load_standard(working_dir: &Path) -> Result<Self, CatalogError> {
        Self::load(&ConfigSources::standard(
            working_dir,
            &Environment::Process,
        )?)
    }

    /// Lay the config `text` (read from `origin`) over this catalog: its entries replace
    /// same-id entries whole, and its `default`, when set, replaces the current one.
    pub fn layer(mut self, text: &str, origin: &Path) -> Result<Self, CatalogError> {
        let file: ConfigFile = toml::from_str(text).map_err(|e| CatalogError::Parse {
            path: origin.to_path_buf(),
            message: e.to_string().trim_end().to_owned(),
        })?;
        for (id, mut entry) in file.models {
            check_id(&id).map_err(|message| CatalogError::InvalidEntry {
                id: id.clone(),
                file: Some(origin.to_path_buf()),
                message,
            })?;
            if entry.provider.is_none() {
                return Err(CatalogError::InvalidEntry {
                    id,
                    file: Some(origin.to_path_buf()),
                    message: "set `provider` to one of: openai, anthropic, ollama, vllm, llamacpp, gateway".to_owned(),
                });
            }
            entry.source = Some(origin.to_path_buf());
            self.entries.insert(id, entry);
        }
        if let Some(default) = file.default {
            self.default = Some(default);
        }
        if let Some(mut search) = file.search {
            search.source = Some(origin.to_path_buf());
            self.search = Some(search);
        }
        for (name, mut server) in file.mcp.map(|t| t.servers).unwrap_or_default() {
            if !crate::mcp::names::is_segment(&name) {
                return Err(CatalogError::Parse {
                    path: origin.to_path_buf(),
                    message: format!(
                        "[mcp.servers.{name}]: a server name becomes the Plugin id `mcp/NAME`, so it may contain only lowercase ASCII letters, digits, '-', '_', '.'"
                    ),
                });
            }
            server.source = Some(origin.to_path_buf());
            self.mcp_servers.insert(name, server);
        }
        self.searched.push(origin.to_path_buf());
        Ok(self)
    }

    /// The `[mcp.servers.NAME]` tables, by name (a project file's table replaces a user
    /// file's of the same name).
    pub fn mcp_servers(&self) -> &BTreeMap<String, crate::mcp::McpServerEntry> {
        &self.mcp_servers
    }

    /// Use these limits for every provider the catalog builds (defaults: 120 s, 16 MiB).
    pub fn with_limits(mut self, limits: ModelLimits) -> Self {
        self.limits = limits;
        self
    }

    /// The search backend the `[search]` table configures, if any, with its key read from
    /// the environment. A table that cannot be used is an error naming what to set.
    pub fn search_backend(
        &self,
        env: &Environment,
    ) -> Result<Option<crate::web::SearchBackend>, CatalogError> {
        use crate::web::SearchBackend;
        let Some(entry) = &self.search else {
            return Ok(None);
        };
        let fail = |message: String| CatalogError::InvalidSearch {
            file: entry.source.clone(),
            message,
        };
        let (default_url, default_key) = match entry.provider.as_str() {
            "brave" => (
                Some("https://api.search.brave.com/res/v1/web/search".to_owned()),
                "BRAVE_SEARCH_API_KEY",
            ),
            "tavily" => (
                Some("https://api.tavily.com/search".to_owned()),
                "TAVILY_API_KEY",
            ),
            "searxng" => (None, ""),
            "gateway" => (
                env.get("PROMPTFORGE_GATEWAY_URL")?
                    .map(|base| format!("{}/search", base.trim_end_matches('/'))),
                "PROMPTFORGE_GATEWAY_API_KEY",
            ),
            other => {
                return Err(fail(format!(
                    "unknown search provider `{other}`: set `provider` to one of: brave, searxng, tavily, gateway"
                )));
            }
        };
        let url_text = entry.base_url.clone().or(default_url).ok_or_else(|| {
            fail(format!(
                "set `base_url` to the {} search endpoint (for SearXNG, the instance's /search URL)",
                entry.provider
            ))
        })?;
        let url = Url::parse(&url_text)
            .map_err(|e| fail(format!("`base_url` {url_text:?} is not a URL: {e}")))?;
        let key_env = entry.api_key_env.as_deref().unwrap_or(default_key);
        let key = if key_env.is_empty() {
            None
        } else {
            env.get(key_env)?
        };
        if let Some(key) = &key {
            crate::secrets::register(key);
        }
        let need_key = |key: Option<String>| {
            key.ok_or_else(|| {
                fail(format!(
                    "the {} search key is not set: export {key_env}",
                    entry.provider
                ))
            })
        };
        // A key never travels in cleartext, except to a server on this machine.
        let loopback = is_loopback(&url);
        let keyed = key.is_some() || matches!(entry.provider.as_str(), "brave" | "tavily");
        if keyed && url.scheme() != "https" && !loopback {
            return Err(fail(format!(
                "`base_url` {url_text:?} must use https: the search key would travel in cleartext"
            )));
        }
        Ok(Some(match entry.provider.as_str() {
            "brave" => SearchBackend::Brave {
                url,
                key: need_key(key)?,
            },
            "tavily" => SearchBackend::Tavily {
                url,
                key: need_key(key)?,
            },
            "searxng" => SearchBackend::Searxng { url, key },
            _ => SearchBackend::Gateway { url, key },
        }))
    }

    /// The config files this catalog was read from, in reading order (the user file, then
    /// the project file; a file that does not exist is not listed).
    pub fn files_read(&self) -> &[PathBuf] {
        &self.searched
    }

    /// Every quick-id kind (`KIND:NAME` works with no config entry), with the base URL it
    /// would use and where that comes from, and its key variable's status.
    pub fn quick_kinds(env: &Environment) -> Vec<QuickKind> {
        [
            ProviderKind::OpenAi,
            ProviderKind::Anthropic,
            ProviderKind::Ollama,
            ProviderKind::Vllm,
            ProviderKind::LlamaCpp,
            ProviderKind::Gateway,
        ]
        .into_iter()
        .map(|kind| {
            let (base_url, origin) = match kind_base_url(kind, env) {
                Ok((url, origin)) => (Some(url), origin),
                Err(err) => (None, err.to_string()),
            };
            let key = match kind_key_env(kind) {
                None => KeyStatus::NotNeeded,
                Some(var) => match env.get(var) {
                    Ok(Some(_)) => KeyStatus::Set {
                        env: var.to_owned(),
                    },
                    _ => {
                        let loopback = base_url
                            .as_deref()
                            .and_then(|u| parse_base_url(u).ok())
                            .is_some_and(|u| is_loopback(&u));
                        if loopback {
                            KeyStatus::NotNeeded
                        } else {
                            KeyStatus::Missing {
                                env: var.to_owned(),
                            }
                        }
                    }
                },
            };
            QuickKind {
                kind,
                base_url,
                origin,
                key,
            }
        })
        .collect()
    }

    /// The config's `default` model id, if one is set.
    pub fn default_id(&self) -> Option<&str> {
        self.default.as_deref()
    }

    /// The configured entries by id.
    pub fn entries(&self) -> &BTreeMap<String, ModelEntry> {
        &self.entries
    }

    /// The catalog for `promptforge models`: every configured entry in id order, with kind
    /// defaults filled in, whether its key is available, and what is wrong with it if it
    /// cannot be used. Quick ids are not listed (any `KIND:NAME` works).
    pub fn list(&self, env: &Environment) -> Vec<ListedModel> {
        self.entries
            .iter()
            .map(|(id, entry)| {
                let is_default = self.default.as_deref() == Some(id.as_str());
                match self.plan(id, entry, env) {
                    Ok(plan) => {
                        let (key, problem) = match key_status(&plan, env) {
                            Ok(KeyStatus::Missing { env: var }) => {
                                let problem = format!("missing environment variable: {var}");
                                (KeyStatus::Missing { env: var }, Some(problem))
                            }
                            Ok(status) => (status, None),
                            Err(err) => (KeyStatus::NotNeeded, Some(err.to_string())),
                        };
                        ListedModel {
                            description: plan.description,
                            source: entry.source.clone(),
                            is_default,
                            key,
                            problem,
                        }
                    }
                    Err(err) => ListedModel {
                        description: ModelDescription {
                            id: id.clone(),
                            provider: entry.provider.unwrap_or(ProviderKind::OpenAi),
                            model: entry.model.clone().unwrap_or_else(|| id.clone()),
                            base_url: entry.base_url.clone(),
                            api_key_env: entry.api_key_env.clone().filter(|k| !k.is_empty()),
                            context: entry.context.unwrap_or(1).max(1),
                            thinking: entry.thinking.unwrap_or(ThinkingCapability::Never),
                            description: entry.description.clone().unwrap_or_default(),
                            price: None,
                        },
                        source: entry.source.clone(),
                        is_default,
                        key: KeyStatus::NotNeeded,
                        problem: Some(err.to_string()),
                    },
                }
            })
            .collect()
    }

    /// Describe `id` without building a provider or reading its key.
    pub fn describe(&self, id: &str, env: &Environment) -> Result<ModelDescription, CatalogError> {
        let (id, entry) = self.lookup(id)?;
        Ok(self.plan(&id, &entry, env)?.description)
    }

    /// Resolve `--model ID` (a catalog id or a quick id) to its description and a ready
    /// provider. Fails, saying what to set, when the id is unknown, a required variable
    /// (key or URL) is missing, or a URL is unusable. Reachability is not probed here: an
    /// endpoint that is down fails the first round as a transport failure whose
    /// [`detail`](ModelError::detail) names the URL and where it came from.
    pub fn resolve(&self, id: &str, env: &Environment) -> Result<ResolvedModel, CatalogError> {
        let (id, entry) = self.lookup(id)?;
        let plan = self.plan(&id, &entry, env)?;
        let key = match &plan.key_env {
            None => None,
            Some(var) => match env.get(var)? {
                Some(key) => {
                    crate::secrets::register(&key);
                    Some(key)
                }
                None if plan.key_optional => None,
                None => {
                    let purpose = if plan.description.provider == ProviderKind::Gateway {
                        None
                    } else {
                        Some(format!(
                            "the API key for model `{id}`; keys are read only from the environment"
                        ))
                    };
                    return Err(CatalogError::MissingEnv {
                        name: var.clone(),
                        purpose,
                    });
                }
            },
        };
        let base = plan.description.base_url.clone().unwrap_or_default();
        let mut limits = self.limits;
        if let Some(seconds) = entry.round_timeout {
            if seconds == 0 {
                return Err(CatalogError::InvalidEntry {
                    id: id.clone(),
                    file: entry.source.clone(),
                    message: "`round_timeout` is in seconds and must be at least 1".to_owned(),
                });
            }
            limits.round_timeout = std::time::Duration::from_secs(seconds);
        }
        if let Some(retries) = entry.retries {
            limits.retries = retries.min(10);
        }
        let provider: Arc<dyn ModelProvider> = match plan.setup {
            Setup::OpenAi(options) => Arc::new(
                OpenAiProvider::new(&base, key, options, limits)
                    .map_err(client_error)?
                    .with_hint(plan.hint),
            ),
            Setup::Anthropic(options) => Arc::new(
                AnthropicProvider::new(&base, key, options, limits)
                    .map_err(client_error)?
                    .with_hint(plan.hint),
            ),
        };
        Ok(ResolvedModel {
            description: plan.description,
            provider,
        })
    }

    fn lookup(&self, id: &str) -> Result<(String, ModelEntry), CatalogError> {
        if let Some(entry) = self.entries.get(id) {
            return Ok((id.to_owned(), entry.clone()));
        }
        if let Some((kind, name)) = id.split_once(':')
            && let Some(kind) = ProviderKind::from_name(kind)
            && !name.is_empty()
            && check_id(id).is_ok()
        {
            let entry = ModelEntry {
                provider: Some(kind),
                model: Some(name.to_owned()),
                ..ModelEntry::default()
            };
            return Ok((id.to_owned(), entry));
        }
        Err(CatalogError::UnknownModel {
            id: id.to_owned(),
            searched: self.searched.clone(),
        })
    }

    fn plan(&self, id: &str, entry: &ModelEntry, env: &Environment) -> Result<Plan, CatalogError> {
        let invalid = |message: String| CatalogError::InvalidEntry {
            id: id.to_owned(),
            file: entry.source.clone(),
            message,
        };
        let kind = entry.provider.unwrap_or(ProviderKind::OpenAi);
        if kind == ProviderKind::Scripted {
            return Err(invalid(
                "the scripted model comes from --script, not from the catalog".to_owned(),
            ));
        }
        let model = entry.model.clone().unwrap_or_else(|| id.to_owned());
        if model.is_empty() {
            return Err(invalid("`model` must not be empty".to_owned()));
        }

        // Base URL: the entry's, else the kind's (from its variable or its fixed default).
        let (raw_url, url_origin) = match &entry.base_url {
            Some(url) => (url.clone(), "`base_url`".to_owned()),
            None => kind_base_url(kind, env)?,
        };
        let url = parse_base_url(&raw_url).map_err(|reason| {
            invalid(format!("base URL `{raw_url}` (from {url_origin}) {reason}"))
        })?;
        let base_url = url.as_str().trim_end_matches('/').to_owned();

        let key_env = match &entry.api_key_env {
            Some(var) if var.is_empty() => None,
            Some(var) => Some(var.clone()),
            None => kind_key_env(kind).map(str::to_owned),
        };
        let key_optional = is_loopback(&url);

        let context = match entry.context {
            Some(0) => return Err(invalid("`context` must be at least 1".to_owned())),
            Some(n) => n,
            None => kind_context(kind, env),
        };
        let thinking = entry
            .thinking
            .unwrap_or_else(|| kind_thinking(kind, &model));
        let description = entry
            .description
            .clone()
            .unwrap_or_else(|| format!("{model} via {}", kind_title(kind)));

        let price = match (entry.input_price, entry.output_price) {
            (None, None) => None,
            (Some(input), Some(output)) => Some(Price::new(input, output).ok_or_else(|| {
                invalid("`input_price` and `output_price` must be non-negative numbers".to_owned())
            })?),
            _ => {
                return Err(invalid(
                    "set both `input_price` and `output_price` (dollars per million tokens), or neither"
                        .to_owned(),
                ));
            }
        };

        let setup = match kind {
            ProviderKind::Anthropic => Setup::Anthropic(AnthropicOptions {
                default_max_tokens: match entry.max_output_tokens {
                    Some(0) => {
                        return Err(invalid("`max_output_tokens` must be at least 1".to_owned()));
                    }
                    Some(n) => n,
                    None => AnthropicOptions::default().default_max_tokens,
                },
                thinking_budget: entry
                    .thinking_budget
                    .unwrap_or(AnthropicOptions::default().thinking_budget)
                    .max(1024),
                thinking,
            }),
            _ => Setup::OpenAi(openai_options(kind, &model, thinking, entry).map_err(invalid)?),
        };
        let hint = format!(
            "check that the model server is running and reachable at {base_url}; the URL comes from {url_origin}"
        );
        Ok(Plan {
            description: ModelDescription {
                id: id.to_owned(),
                provider: kind,
                model,
                base_url: Some(base_url),
                api_key_env: key_env.clone(),
                context,
                thinking,
                description,
                price,
            },
            key_env,
            key_optional,
            setup,
            hint,
        })
    }
}

fn client_error(err: ModelError) -> CatalogError {
    CatalogError::Client(err.detail().unwrap_or_default().to_owned())
}

fn key_status(plan: &Plan, env: &Environment) -> Result<KeyStatus, CatalogError> {
    Ok(match &plan.key_env {
        None => KeyStatus::NotNeeded,
        Some(var) => match env.get(var)? {
            Some(_) => KeyStatus::Set { env: var.clone() },
            None if plan.key_optional => KeyStatus::NotNeeded,
            None => KeyStatus::Missing { env: var.clone() },
        },
    })
}

fn kind_title(kind: ProviderKind) -> &'static str {
    match kind {
        ProviderKind::OpenAi => "OpenAI",
        ProviderKind::Anthropic => "Anthropic",
        ProviderKind::Ollama => "Ollama",
        ProviderKind::Vllm => "vLLM",
        ProviderKind::LlamaCpp => "llama.cpp",
        ProviderKind::Gateway => "the PromptForge gateway",
        ProviderKind::Scripted => "a script",
    }
}

/// The kind's base URL and where it came from, when the entry sets none.
fn kind_base_url(kind: ProviderKind, env: &Environment) -> Result<(String, String), CatalogError> {
    let from_var = |var: &str, fallback: &str| -> Result<(String, String), CatalogError> {
        Ok(match env.get(var)? {
            Some(url) => (url, format!("the environment variable {var}")),
            None => (
                fallback.to_owned(),
                format!("the {} default; set {var} to change it", kind.as_str()),
            ),
        })
    };
    match kind {
        ProviderKind::OpenAi => from_var("OPENAI_BASE_URL", "https://api.openai.com/v1"),
        ProviderKind::Anthropic => from_var("ANTHROPIC_BASE_URL", "https://api.anthropic.com"),
        ProviderKind::Ollama => Ok(match env.get("OLLAMA_HOST")? {
            Some(host) => (
                ollama_base(&host),
                "the environment variable OLLAMA_HOST".to_owned(),
            ),
            None => (
                "http://127.0.0.1:11434/v1".to_owned(),
                "the ollama default; set OLLAMA_HOST to change it".to_owned(),
            ),
        }),
        ProviderKind::Vllm => Ok((
            "http://127.0.0.1:8000/v1".to_owned(),
            "the vllm default; set base_url in a [models] entry to change it".to_owned(),
        )),
        ProviderKind::LlamaCpp => Ok((
            "http://127.0.0.1:8080/v1".to_owned(),
            "the llamacpp default; set base_url in a [models] entry to change it".to_owned(),
        )),
        ProviderKind::Gateway => match env.get("PROMPTFORGE_GATEWAY_URL")? {
            Some(url) => Ok((
                url,
                "the environment variable PROMPTFORGE_GATEWAY_URL".to_owned(),
            )),
            None => Err(CatalogError::MissingEnv {
                name: "PROMPTFORGE_GATEWAY_URL".to_owned(),
                purpose: None,
            }),
        },
        ProviderKind::Scripted => Ok((String::new(), "the script".to_owned())),
    }
}

/// `OLLAMA_HOST` as Ollama's own client reads it: scheme `http` and port 11434 unless given
/// (443 for `https`), an unspecified bind address meaning this machine; then `/v1`.
fn ollama_base(host: &str) -> String {
    let host = host.trim().trim_end_matches('/');
    let with_scheme = if host.contains("://") {
        host.to_owned()
    } else {
        format!("http://{host}")
    };
    let Ok(mut url) = Url::parse(&with_scheme) else {
        // Left for parse_base_url to reject with the variable named.
        return with_scheme;
    };
    let unspecified = match url.host() {
        Some(url::Host::Ipv4(ip)) => ip.is_unspecified(),
        Some(url::Host::Ipv6(ip)) => ip.is_unspecified(),
        Some(url::Host::Domain(d)) => d.is_empty(),
        None => true,
    };
    if unspecified {
        let _ = url.set_host(Some("127.0.0.1"));
    }
    if url.port().is_none() && url.scheme() == "http" {
        let _ = url.set_port(Some(11434));
    }
    format!("{}/v1", url.as_str().trim_end_matches('/'))
}

fn parse_base_url(raw: &str) -> Result<Url, String> {
    let url = Url::parse(raw.trim()).map_err(|e| format!("is not a valid URL: {e}"))?;
    if url.scheme() != "http" && url.scheme() != "https" {
        return Err(format!("must use http or https, not `{}`", url.scheme()));
    }
    if url.host().is_none() {
        return Err("has no host".to_owned());
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(
            "must not carry credentials; name the key's variable in `api_key_env`".to_owned(),
        );
    }
    Ok(url)
}

fn kind_key_env(kind: ProviderKind) -> Option<&'static str> {
    match kind {
        ProviderKind::OpenAi => Some("OPENAI_API_KEY"),
        ProviderKind::Anthropic => Some("ANTHROPIC_API_KEY"),
        ProviderKind::Vllm => Some("VLLM_API_KEY"),
        ProviderKind::LlamaCpp => Some("LLAMA_API_KEY"),
        ProviderKind::Gateway => Some("PROMPTFORGE_GATEWAY_API_KEY"),
        ProviderKind::Ollama | ProviderKind::Scripted => None,
    }
}

fn kind_context(kind: ProviderKind, env: &Environment) -> u64 {
    match kind {
        ProviderKind::OpenAi | ProviderKind::Gateway | ProviderKind::Scripted => 128_000,
        ProviderKind::Anthropic => 200_000,
        ProviderKind::Ollama => env
            .get("OLLAMA_CONTEXT_LENGTH")
            .ok()
            .flatten()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .filter(|n| *n > 0)
            .unwrap_or(4096),
        ProviderKind::Vllm | ProviderKind::LlamaCpp => 32_768,
    }
}

fn kind_thinking(kind: ProviderKind, model: &str) -> ThinkingCapability {
    match kind {
        ProviderKind::OpenAi => {
            let name = model.to_ascii_lowercase();
            if name.starts_with("gpt-5") {
                ThinkingCapability::Switchable
            } else if ["o1", "o3", "o4"].iter().any(|p| name.starts_with(p)) {
                ThinkingCapability::Always
            } else {
                ThinkingCapability::Never
            }
        }
        _ => ThinkingCapability::Switchable,
    }
}

fn openai_options(
    kind: ProviderKind,
    model: &str,
    thinking: ThinkingCapability,
    entry: &ModelEntry,
) -> Result<OpenAiOptions, String> {
    let param = entry.thinking_param.unwrap_or(match kind {
        ProviderKind::Vllm | ProviderKind::LlamaCpp => ThinkingParam::ChatTemplateKwargs,
        _ => ThinkingParam::ReasoningEffort,
    });
    let switch = match (thinking, param) {
        // The switch only goes to a model that can switch.
        (ThinkingCapability::Never | ThinkingCapability::Always, _) | (_, ThinkingParam::None) => {
            OpenAiThinking::Unsupported
        }
        (ThinkingCapability::Switchable, ThinkingParam::ReasoningEffort) => {
            let lower = model.to_ascii_lowercase();
            let gpt5 =
                kind == ProviderKind::OpenAi && (lower == "gpt-5" || lower.starts_with("gpt-5-"));
            OpenAiThinking::ReasoningEffort {
                on: entry
                    .thinking_on
                    .clone()
                    .unwrap_or_else(|| "medium".to_owned()),
                off: entry
                    .thinking_off
                    .clone()
                    .unwrap_or_else(|| if gpt5 { "minimal" } else { "none" }.to_owned()),
            }
        }
        (ThinkingCapability::Switchable, ThinkingParam::ChatTemplateKwargs) => {
            OpenAiThinking::ChatTemplateKwargs {
                key: entry
                    .thinking_kwarg
                    .clone()
                    .unwrap_or_else(|| "enable_thinking".to_owned()),
            }
        }
    };
    let max_tokens_field = match entry.max_tokens_field.as_deref() {
        Some("max_tokens") => MaxTokensField::MaxTokens,
        Some("max_completion_tokens") => MaxTokensField::MaxCompletionTokens,
        Some(other) => {
            return Err(format!(
                "`max_tokens_field` must be \"max_tokens\" or \"max_completion_tokens\", got \"{other}\""
            ));
        }
        None if kind == ProviderKind::OpenAi => MaxTokensField::MaxCompletionTokens,
        None => MaxTokensField::MaxTokens,
    };
    Ok(OpenAiOptions {
        max_tokens_field,
        thinking: switch,
        include_usage: entry.stream_usage.unwrap_or(true),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ollama_host_forms() {
        assert_eq!(ollama_base("127.0.0.1"), "http://127.0.0.1:11434/v1");
        assert_eq!(ollama_base("0.0.0.0:9999"), "http://127.0.0.1:9999/v1");
        assert_eq!(
            ollama_base("http://gpu-box:11434/"),
            "http://gpu-box:11434/v1"
        );
        assert_eq!(
            ollama_base("https://ollama.example.com"),
            "https://ollama.example.com/v1"
        );
        assert_eq!(ollama_base("[::1]:11434"), "http://[::1]:11434/v1");
    }

    #[test]
    fn openai_thinking_defaults_by_name() {
        assert_eq!(
            kind_thinking(ProviderKind::OpenAi, "gpt-5.1"),
            ThinkingCapability::Switchable
        );
        assert_eq!(
            kind_thinking(ProviderKind::OpenAi, "o3-mini"),
            ThinkingCapability::Always
        );
        assert_eq!(
            kind_thinking(ProviderKind::OpenAi, "gpt-4.1"),
            ThinkingCapability::Never
        );
        let entry = ModelEntry::default();
        let gpt5 = openai_options(
            ProviderKind::OpenAi,
            "gpt-5",
            ThinkingCapability::Switchable,
            &entry,
        );
        assert_eq!(
            gpt5.map(|o| o.thinking),
            Ok(OpenAiThinking::ReasoningEffort {
                on: "medium".into(),
                off: "minimal".into()
            })
        );
        let never = openai_options(
            ProviderKind::OpenAi,
            "gpt-4.1",
            ThinkingCapability::Never,
            &entry,
        );
        assert_eq!(never.map(|o| o.thinking), Ok(OpenAiThinking::Unsupported));
    }

    #[test]
    fn scripted_entries_are_refused() {
        let entry = ModelEntry {
            provider: Some(ProviderKind::Scripted),
            ..ModelEntry::default()
        };
        let err = Catalog::empty().plan(
            "s",
            &entry,
            &Environment::fixed(Vec::<(String, String)>::new()),
        );
        assert!(err.is_err_and(|e| e.to_string().contains("--script")));
    }
}
