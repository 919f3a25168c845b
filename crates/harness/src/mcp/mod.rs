//! MCP servers as Plugins: each `[mcp.servers.NAME]` table of the Host's config is the Plugin
//! `mcp/NAME`, whose tools are the server's tools at `mcp/NAME/TOOL` (names mapped by
//! [`names`]). A server starts when a run first activates its Plugin (a prompt declares it),
//! over stdio or streamable HTTP, and stays up for every later run of the same Host.
//!
//! What the Harness decides here is only transport: starting the server, listing and calling
//! its tools, timeouts and cancellation. The tool results are text like any other tool's;
//! the engine wraps them as untrusted unless the table marks the server trusted.

pub mod config;
pub mod names;
pub mod oauth;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use promptforge_protocol::host::{PluginInfo, ToolInfo};
use rmcp::model::{
    CallToolRequestParams, CallToolResult, ClientConfig, ContentBlock, Implementation,
    ProtocolVersion,
};
use rmcp::service::RunningService;
use rmcp::transport::{
    StreamableHttpClientTransport, TokioChildProcess,
    streamable_http_client::StreamableHttpClientTransportConfig,
};
use rmcp::{RoleClient, ServiceExt};
use serde_json::Value as Json;
use tokio::io::AsyncBufReadExt;

pub use config::{McpServerEntry, McpTable, Transport};
pub use oauth::OAuthSetup;

/// The namespace of every MCP Plugin id.
pub const NAMESPACE: &str = "mcp";

/// The server name of an MCP Plugin id (`mcp/NAME`), if it is one.
pub fn server_of_plugin(id: &str) -> Option<&str> {
    id.strip_prefix("mcp/").filter(|rest| !rest.contains('/'))
}

/// One tool of a server, with the segment it is bound by.
#[derive(Debug, Clone, PartialEq)]
pub struct MappedTool {
    /// The tool-path segment (`get_tiny_image`).
    pub segment: String,
    /// The server's own name for it (`getTinyImage`).
    pub name: String,
    /// Its description (the title when it has none).
    pub description: String,
    /// Its input schema (a JSON object schema).
    pub input_schema: Json,
}

/// A started server.
struct Connection {
    /// Where requests go.
    peer: rmcp::Peer<RoleClient>,
    /// The service itself, taken out to close it.
    service: tokio::sync::Mutex<Option<RunningService<RoleClient, ClientConfig>>>,
    tools: Vec<MappedTool>,
    timeout: Duration,
    trusted: bool,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("tools", &self.tools.len())
            .field("timeout", &self.timeout)
            .field("trusted", &self.trusted)
            .finish_non_exhaustive()
    }
}

/// One server's connection, or the reason it has none, behind its own lock.
type Slot = tokio::sync::Mutex<Option<Result<Arc<Connection>, String>>>;

/// The Host's MCP Plugins: the configured servers, each started on first use.
#[derive(Debug, Default)]
pub struct McpPlugins {
    servers: BTreeMap<String, McpServerEntry>,
    /// Each server's slot: its connection once started (or why it could not be). A slot has
    /// a lock of its own, so one server starting (or waiting for a person to authorize it)
    /// never holds up another.
    started: std::sync::Mutex<BTreeMap<String, Arc<Slot>>>,
    /// Where OAuth tokens live and how a person authorizes (servers with `oauth = true`).
    oauth: Option<OAuthSetup>,
}

/// How long a server may take to start and list its tools, at least.
const MIN_START: Duration = Duration::from_secs(30);

impl McpPlugins {
    /// The Plugins of these `[mcp.servers]` tables.
    pub fn new(servers: BTreeMap<String, McpServerEntry>) -> Self {
        McpPlugins {
            servers,
            started: std::sync::Mutex::new(BTreeMap::new()),
            oauth: None,
        }
    }

    /// Authorize servers with `oauth = true` this way.
    pub fn with_oauth(mut self, setup: OAuthSetup) -> Self {
        self.oauth = Some(setup);
        self
    }

    /// Whether a server of this name is configured.
    pub fn configured(&self, name: &str) -> bool {
        self.servers.contains_key(name)
    }

    /// The configured server names.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.servers.keys().map(String::as_str)
    }

    /// Whether the tool at `path` belongs to an MCP Plugin.
    pub fn owns(path: &str) -> bool {
        path.starts_with("mcp/")
    }

    /// The registry entry of the Plugin `mcp/NAME`: the server is started (once per Host) and
    /// its tools listed; a server that cannot be started, or cannot be used, fails activation
    /// with a line saying why and where it is configured. `None` when no table names it.
    pub async fn plugin_info(&self, name: &str) -> Option<PluginInfo> {
        let entry = self.servers.get(name)?;
        let id = format!("{NAMESPACE}/{name}");
        Some(match self.connection(name).await {
            Ok(connection) => PluginInfo {
                id,
                tools: connection
                    .tools
                    .iter()
                    .map(|tool| ToolInfo {
                        name: tool.segment.clone(),
                        description: tool.description.clone(),
                        parameters: tool.input_schema.to_string(),
                        untrusted: !connection.trusted,
                    })
                    .collect(),
                conflicts: Vec::new(),
                activation_failure: None,
            },
            Err(why) => PluginInfo {
                id: id.clone(),
                tools: Vec::new(),
                conflicts: Vec::new(),
                activation_failure: Some(format!(
                    "{id} failed to activate: {why}{}",
                    where_set(name, entry)
                )),
            },
        })
    }

    /// The tools of server `name`, started if it is not yet (for `promptforge mcp tools`).
    pub async fn tools(&self, name: &str) -> Result<Vec<MappedTool>, String> {
        let Some(entry) = self.servers.get(name) else {
            return Err(format!(
                "no MCP server `{name}` is configured: add a [mcp.servers.{name}] table to promptforge.toml"
            ));
        };
        match self.connection(name).await {
            Ok(connection) => Ok(connection.tools.clone()),
            Err(why) => Err(format!("{why}{}", where_set(name, entry))),
        }
    }

    /// Call the tool at `path` (`mcp/NAME/TOOL`) with `args`: its result text, or the
    /// failure text the prompt (or the model) reads.
    pub async fn call(&self, path: &str, args: &Json) -> Result<String, String> {
        let mut parts = path.splitn(3, '/');
        let (Some(NAMESPACE), Some(name), Some(segment)) =
            (parts.next(), parts.next(), parts.next())
        else {
            return Err(format!("{path} is not an MCP tool path"));
        };
        let connection = self.connection(name).await?;
        let Some(tool) = connection.tools.iter().find(|t| t.segment == segment) else {
            return Err(format!("the MCP server {name} has no tool {segment}"));
        };
        let arguments = match args {
            Json::Object(map) => map.clone(),
            Json::Null => serde_json::Map::new(),
            other => return Err(format!("arguments must be a JSON object, got {other}")),
        };
        let request = CallToolRequestParams::new(tool.name.clone()).with_arguments(arguments);
        // Dropping the call (a timeout here, or the run withdrawing it) sends the server
        // notifications/cancelled.
        let mut called = tokio::time::timeout(
            connection.timeout,
            connection.peer.call_tool(request.clone()),
        )
        .await;
        // A server behind OAuth that wants more (a token it no longer takes, or a scope the
        // call needs: step-up) is authorized again with its challenge, once, and the call
        // made again on a fresh connection.
        if let Ok(Err(e)) = &called
            && let Some(challenge) = oauth::challenge_in_service(e)
            && let (Some(entry), Some(setup)) = (self.servers.get(name), &self.oauth)
            && entry.oauth
            && let Some(url) = &entry.url
        {
            let identity = oauth::ClientIdentity::of(entry)?;
            let fresh = self
                .reauthorize(name, &connection, setup, url, challenge, &identity)
                .await?;
            called = tokio::time::timeout(fresh.timeout, fresh.peer.call_tool(request)).await;
        }
        match called {
            Err(_) => Err(format!(
                "{} timed out after {} s",
                tool.name,
                connection.timeout.as_secs_f64()
            )),
            Ok(Err(e)) => Err(format!("{} failed: {e}", tool.name)),
            Ok(Ok(result)) => {
                let text = result_text(&result);
                if result.is_error == Some(true) {
                    Err(if text.is_empty() {
                        format!("{} failed", tool.name)
                    } else {
                        text
                    })
                } else {
                    Ok(text)
                }
            }
        }
    }

    /// Stop every started server: each is closed (its stdin, for a child process, after
    /// which an MCP server exits) and given a second to go; a child still running then is
    /// killed when its handle drops.
    pub async fn shutdown(&self) {
        let slots: Vec<Arc<Slot>> =
            std::mem::take(&mut *self.started.lock().unwrap_or_else(|e| e.into_inner()))
                .into_values()
                .collect();
        let closing = slots.into_iter().map(|slot| async move {
            if let Some(Ok(connection)) = slot.lock().await.take()
                && let Some(mut service) = connection.service.lock().await.take()
            {
                let _ = service.close_with_timeout(Duration::from_secs(1)).await;
            }
        });
        futures_util::future::join_all(closing).await;
    }

    /// The slot of server `name`.
    fn slot(&self, name: &str) -> Arc<Slot> {
        let mut started = self.started.lock().unwrap_or_else(|e| e.into_inner());
        started.entry(name.to_owned()).or_default().clone()
    }

    /// Authorize server `name` again with the challenge a call on `used` met, and connect
    /// anew, unless another call did so meanwhile (then its connection serves): one
    /// authorization at a time per server, however many calls meet the challenge at once.
    async fn reauthorize(
        &self,
        name: &str,
        used: &Arc<Connection>,
        setup: &OAuthSetup,
        url: &str,
        challenge: String,
        identity: &oauth::ClientIdentity,
    ) -> Result<Arc<Connection>, String> {
        let slot = self.slot(name);
        let mut current = slot.lock().await;
        if let Some(Ok(newer)) = current.as_ref()
            && !Arc::ptr_eq(newer, used)
        {
            return Ok(newer.clone());
        }
        oauth::authorize(setup, name, url, Some(challenge), identity).await?;
        if let Some(Ok(old)) = current.take()
            && let Some(service) = old.service.lock().await.take()
        {
            let _ = service.cancel().await;
        }
        self.start_in(name, &mut current).await
    }

    /// The server's connection, started on first use. A failure to start is kept, so every
    /// run of this Host reports the same line without trying again, except an OAuth
    /// server's (the person may authorize on the next try).
    async fn connection(&self, name: &str) -> Result<Arc<Connection>, String> {
        let slot = self.slot(name);
        let mut current = slot.lock().await;
        if let Some(known) = current.as_ref() {
            return known.clone();
        }
        self.start_in(name, &mut current).await
    }

    /// Start server `name` into its (locked) slot.
    async fn start_in(
        &self,
        name: &str,
        current: &mut Option<Result<Arc<Connection>, String>>,
    ) -> Result<Arc<Connection>, String> {
        let entry = self.servers.get(name);
        let result = match entry {
            Some(entry) => start(name, entry, self.oauth.as_ref()).await.map(Arc::new),
            None => Err(format!("no MCP server `{name}` is configured")),
        };
        let keep = result.is_ok() || !entry.is_some_and(|e| e.oauth);
        if keep {
            *current = Some(result.clone());
        }
        result
    }
}

/// Connect to a server behind OAuth: with the stored token when there is one (refreshed as
/// needed); when the server refuses (401, or 403 for more scope), authorize once with its
/// challenge, and connect again.
async fn connect_with_oauth(
    name: &str,
    entry: &McpServerEntry,
    url: &str,
    setup: &OAuthSetup,
    config: StreamableHttpClientTransportConfig,
    client_info: ClientConfig,
    limit: Duration,
) -> Result<
    (
        RunningService<RoleClient, ClientConfig>,
        Vec<rmcp::model::Tool>,
    ),
    String,
> {
    let identity = oauth::ClientIdentity::of(entry)?;
    let mut authorized = false;
    loop {
        let manager = oauth::manager(setup, name, url).await?;
        let client =
            rmcp::transport::auth::AuthClient::new(reqwest_mcp::Client::default(), manager);
        let transport = StreamableHttpClientTransport::with_client(client, config.clone());
        match tokio::time::timeout(limit, client_info.clone().serve(transport)).await {
            Ok(Ok(service)) => {
                // A server may let the handshake through and want authorization for its
                // tools: listing them is part of connecting.
                match tokio::time::timeout(limit, service.list_all_tools()).await {
                    Ok(Ok(listed)) => return Ok((service, listed)),
                    Ok(Err(e)) => match oauth::challenge_in_service(&e) {
                        Some(challenge) if !authorized => {
                            let _ = service.cancel().await;
                            oauth::authorize(setup, name, url, Some(challenge), &identity).await?;
                            authorized = true;
                        }
                        _ => return Err(format!("cannot list the server's tools: {e}")),
                    },
                    Err(_) => return Err("the server did not list its tools in time".to_owned()),
                }
            }
            Ok(Err(e)) => match oauth::challenge_in(&e) {
                Some(challenge) if !authorized => {
                    oauth::authorize(setup, name, url, Some(challenge), &identity).await?;
                    authorized = true;
                }
                Some(_) => {
                    return Err(format!(
                        "the MCP server at {url} refused the authorization it was given: {e}"
                    ));
                }
                None => return Err(format!("the MCP server at {url} did not answer: {e}")),
            },
            Err(_) => {
                return Err(format!(
                    "the MCP server at {url} did not answer within {} s",
                    limit.as_secs_f64()
                ));
            }
        }
    }
}

/// Where the server's table is, for a failure line.
fn where_set(name: &str, entry: &McpServerEntry) -> String {
    match &entry.source {
        Some(file) => format!(" (check [mcp.servers.{name}] in {})", file.display()),
        None => String::new(),
    }
}

/// Start a server and list its tools.
async fn start(
    name: &str,
    entry: &McpServerEntry,
    oauth: Option<&OAuthSetup>,
) -> Result<Connection, String> {
    let transport = entry.transport()?;
    let timeout = entry.timeout()?;
    let mut client_info = ClientConfig::new(
        Default::default(),
        Implementation::new("promptforge", env!("CARGO_PKG_VERSION")),
    );
    // The newest version with the initialize handshake, which the servers in use speak; a
    // server that knows only an older one answers with it and rmcp goes along.
    client_info.protocol_version = ProtocolVersion::V_2025_11_25;
    let limit = timeout.max(MIN_START);
    // Tools listed while connecting (a server behind OAuth), else listed below.
    let mut listed = None;
    let service = match &transport {
        Transport::Command { program, args } => {
            let mut command = tokio::process::Command::new(program);
            command.args(args).env_clear().kill_on_drop(true);
            for var in config::INHERITED_VARS
                .iter()
                .chain(config::INHERITED_NETWORK_VARS)
            {
                if let Some(value) = std::env::var_os(var) {
                    command.env(var, value);
                }
            }
            for var in &entry.env_vars {
                match std::env::var_os(var) {
                    Some(value) if !value.is_empty() => {
                        // `env_vars` is where a server's secrets come from.
                        if let Some(text) = value.to_str() {
                            crate::secrets::register(text);
                        }
                        command.env(var, value);
                    }
                    _ => {
                        return Err(format!(
                            "the environment variable {var} (named in `env_vars`) is not set"
                        ));
                    }
                }
            }
            command.envs(&entry.env);
            if let Some(cwd) = &entry.cwd {
                // A relative `cwd` is read from the config file's folder, since the file is
                // found by walking up from wherever the Host was started.
                let folder = entry.source.as_deref().and_then(std::path::Path::parent);
                command.current_dir(match folder {
                    Some(folder) if cwd.is_relative() => folder.join(cwd),
                    _ => cwd.clone(),
                });
            }
            let shown = std::iter::once(program.as_str())
                .chain(args.iter().map(String::as_str))
                .collect::<Vec<_>>()
                .join(" ");
            let (child, stderr) = TokioChildProcess::builder(command)
                .stderr(std::process::Stdio::piped())
                .spawn()
                .map_err(|e| format!("cannot start `{shown}`: {e}"))?;
            let tail = Arc::new(std::sync::Mutex::new(StderrTail::default()));
            if let Some(stderr) = stderr {
                let tail = tail.clone();
                tokio::spawn(async move {
                    let mut lines = tokio::io::BufReader::new(stderr).lines();
                    while let Ok(Some(line)) = lines.next_line().await {
                        tracing::debug!(target: "promptforge::mcp", "server stderr: {line}");
                        tail.lock().unwrap_or_else(|e| e.into_inner()).push(line);
                    }
                });
            }
            let served = tokio::time::timeout(limit, client_info.serve(child)).await;
            match served {
                Ok(Ok(service)) => service,
                Ok(Err(e)) => {
                    // Give the server's last words a moment to arrive.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    let said = tail.lock().unwrap_or_else(|e| e.into_inner()).text();
                    return Err(format!(
                        "`{shown}` did not start as an MCP server: {e}{said}"
                    ));
                }
                Err(_) => {
                    return Err(format!(
                        "`{shown}` did not answer the MCP handshake within {} s",
                        limit.as_secs_f64()
                    ));
                }
            }
        }
        Transport::Http { url } => {
            // rmcp's HTTP client is reqwest 0.13 built without a TLS provider of its own;
            // it uses the process default, which is ring, as for the model providers. (An
            // error here means one is installed already.)
            let _ = rustls::crypto::ring::default_provider().install_default();
            let mut config = StreamableHttpClientTransportConfig::with_uri(url.clone());
            if let Some(var) = &entry.bearer_token_env {
                match std::env::var(var) {
                    Ok(token) if !token.is_empty() => {
                        crate::secrets::register(&token);
                        config = config.auth_header(token);
                    }
                    _ => {
                        return Err(format!(
                            "the bearer token variable {var} (named in `bearer_token_env`) is not set"
                        ));
                    }
                }
            }
            if entry.oauth {
                let Some(setup) = oauth else {
                    return Err(
                        "`oauth = true` needs a place for its tokens, and this Host has none (no user data directory)"
                            .to_owned(),
                    );
                };
                let (service, tools) =
                    connect_with_oauth(name, entry, url, setup, config, client_info, limit).await?;
                listed = Some(tools);
                service
            } else {
                let transport = StreamableHttpClientTransport::from_config(config);
                match tokio::time::timeout(limit, client_info.serve(transport)).await {
                    Ok(Ok(service)) => service,
                    Ok(Err(e)) => {
                        return Err(format!("the MCP server at {url} did not answer: {e}"));
                    }
                    Err(_) => {
                        return Err(format!(
                            "the MCP server at {url} did not answer within {} s",
                            limit.as_secs_f64()
                        ));
                    }
                }
            }
        }
    };
    let listed = match listed {
        Some(tools) => tools,
        None => match tokio::time::timeout(limit, service.list_all_tools()).await {
            Ok(Ok(tools)) => tools,
            Ok(Err(e)) => return Err(format!("cannot list the server's tools: {e}")),
            Err(_) => return Err("the server did not list its tools in time".to_owned()),
        },
    };
    let segments = names::segments_for(listed.iter().map(|t| t.name.as_ref()));
    let tools = listed
        .iter()
        .zip(segments)
        .map(|(tool, segment)| MappedTool {
            segment,
            name: tool.name.to_string(),
            description: tool
                .description
                .as_deref()
                .or(tool.title.as_deref())
                .unwrap_or("")
                .to_owned(),
            input_schema: Json::Object((*tool.input_schema).clone()),
        })
        .collect();
    Ok(Connection {
        peer: service.peer().clone(),
        service: tokio::sync::Mutex::new(Some(service)),
        tools,
        timeout,
        trusted: entry.trusted,
    })
}

/// The last lines a server wrote on stderr, for a failure message.
#[derive(Debug, Default)]
struct StderrTail {
    lines: std::collections::VecDeque<String>,
}

impl StderrTail {
    const KEEP: usize = 5;

    fn push(&mut self, line: String) {
        if self.lines.len() == Self::KEEP {
            self.lines.pop_front();
        }
        self.lines.push_back(line);
    }

    fn text(&self) -> String {
        if self.lines.is_empty() {
            String::new()
        } else {
            let joined: Vec<&str> = self.lines.iter().map(String::as_str).collect();
            format!("; it said: {}", joined.join(" | "))
        }
    }
}

/// A tool result as the text a prompt reads: its text blocks joined by newlines; the
/// structured content as JSON when there is no text; other blocks as a short note of what
/// they hold (an image's type and size, a resource's URI and text).
pub fn result_text(result: &CallToolResult) -> String {
    let mut parts: Vec<String> = Vec::new();
    for block in &result.content {
        match block {
            ContentBlock::Text(text) => parts.push(text.text.clone()),
            ContentBlock::Image(image) => parts.push(format!(
                "[image {}, {} bytes of base64]",
                image.mime_type,
                image.data.len()
            )),
            ContentBlock::Audio(audio) => parts.push(format!(
                "[audio {}, {} bytes of base64]",
                audio.mime_type,
                audio.data.len()
            )),
            ContentBlock::Resource(embedded) => {
                parts.push(match serde_json::to_value(&embedded.resource) {
                    Ok(Json::Object(map)) => match (map.get("text"), map.get("uri")) {
                        (Some(Json::String(text)), _) => text.clone(),
                        (_, Some(Json::String(uri))) => format!("[resource {uri}]"),
                        _ => "[resource]".to_owned(),
                    },
                    _ => "[resource]".to_owned(),
                });
            }
            ContentBlock::ResourceLink(link) => parts.push(format!("[resource link {}]", link.uri)),
            _ => parts.push("[content]".to_owned()),
        }
    }
    if parts.is_empty()
        && let Some(structured) = &result.structured_content
    {
        return structured.to_string();
    }
    parts.join("\n")
}
