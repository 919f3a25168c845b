//! One session: what every command that runs prompts assembles before a run, in one place.
//!
//! [`ModelFlags`] is the one declaration of the flags that choose the current model and the
//! network (`--model`, `--script`, `--web-script`), flattened into every command that runs
//! prompts. [`Session::open`] reads the config once and resolves the current model and the web
//! Plugin; [`Session::host`] builds a [`Host`] over them for one run (the prompt's MCP Plugins
//! included) and [`Session::offer`] tells the run what the Host offers. The run's context
//! (seed, start instant), its store and its record header live here too, so `run`, `batch`,
//! `replay` and `mcp serve` build a run the same way and no command imports another.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use clap::Args;
use promptforge_engine::run::USER_INPUT_PLUGIN;
use promptforge_engine::{Outcome, PluginInfo, RunContext, ToolInfo};
use promptforge_harness::mcp::McpPlugins;
use promptforge_harness::model::{Catalog, Environment, ScriptedModel};
use promptforge_harness::store::Store;
use promptforge_harness::web::{RealNetwork, ScriptedNetwork, WebPlugin};
use promptforge_syntax::frontmatter::Frontmatter;

use crate::host::{CurrentModel, Host, HostMessage, Operator};

/// The response cache flags of `run` and `batch`.
#[derive(Debug, Clone, Args)]
pub(crate) struct CacheFlags {
    /// Answer model rounds sent before from the response cache, and keep new replies there
    /// (also `PROMPTFORGE_CACHE=on`). See docs/devloop.md.
    #[arg(long)]
    pub(crate) cache: bool,
    /// How long a cached reply is used, in days.
    #[arg(long, value_name = "DAYS", default_value_t = 14.0)]
    pub(crate) cache_ttl: f64,
}

impl CacheFlags {
    /// The cache file, opened, when the cache is on (`force`: on whatever the flags say, as
    /// under `run --watch`).
    pub(crate) fn open(
        &self,
        force: bool,
    ) -> Result<Option<Arc<std::sync::Mutex<crate::response_cache::ResponseCache>>>, String> {
        if !force && !self.cache && !crate::response_cache::on_by_environment() {
            return Ok(None);
        }
        if !(self.cache_ttl.is_finite() && self.cache_ttl >= 0.0) {
            return Err(format!(
                "--cache-ttl {}: give a number of days",
                self.cache_ttl
            ));
        }
        let path = crate::response_cache::location()
            .ok_or("the response cache has no place: set PROMPTFORGE_CACHE_FILE")?;
        let ttl = std::time::Duration::try_from_secs_f64(self.cache_ttl * 86_400.0)
            .map_err(|_| format!("--cache-ttl {}: give a number of days", self.cache_ttl))?;
        let cache = crate::response_cache::ResponseCache::open(&path, ttl)?;
        Ok(Some(Arc::new(std::sync::Mutex::new(cache))))
    }
}

/// The flags that choose the current model and the network, the same on every command that
/// runs prompts.
#[derive(Debug, Clone, Default, Args)]
pub(crate) struct ModelFlags {
    /// The current model: a catalog id or a quick id such as `openai:gpt-4.1`
    /// (default: the catalog's `default`, if any). See `promptforge models`.
    #[arg(short = 'm', long, value_name = "ID")]
    pub(crate) model: Option<String>,
    /// Answer every model round from a scripted model file.
    #[arg(long, value_name = "FILE", conflicts_with = "model")]
    pub(crate) script: Option<PathBuf>,
    /// Register the web Plugin over a scripted network and search backend (the conformance
    /// `--web-script` format) instead of the real network.
    #[arg(long, value_name = "FILE")]
    pub(crate) web_script: Option<PathBuf>,
}

/// What every run of a command shares: the config, the current model and the web Plugin.
#[derive(Debug)]
pub(crate) struct Session {
    pub(crate) config: Config,
    pub(crate) model: Option<CurrentModel>,
    /// The web Plugin; `None` in an offline session.
    pub(crate) web: Option<Arc<WebPlugin>>,
}

impl Session {
    /// Read the config and resolve the current model (`model` overrides the flags' `--model`)
    /// and the web Plugin.
    pub(crate) fn open(flags: &ModelFlags, model: Option<&str>) -> Result<Session, String> {
        let config = Config::default();
        let model = current_model(
            flags.script.as_deref(),
            model.or(flags.model.as_deref()),
            &config,
        )?;
        let web = Some(Arc::new(web_plugin(flags.web_script.as_deref(), &config)?));
        Ok(Session { config, model, web })
    }

    /// A session that reaches no model and no network (a replay answers from its record).
    pub(crate) fn offline() -> Session {
        Session {
            config: Config::default(),
            model: None,
            web: None,
        }
    }

    /// Tell a run's context what this Host offers: its current model, the input broker (when
    /// there is an operator) and the web Plugin (an offline session has none to offer).
    pub(crate) fn offer(&self, ctx: &mut RunContext, operator: &Operator) {
        ctx.host.model = self.model.as_ref().map(|m| m.description.engine_info());
        offer_plugins(ctx, operator, self.web.as_deref());
    }

    /// The MCP Plugins a prompt declares, from the config's `[mcp.servers]`.
    pub(crate) fn mcp_for(
        &self,
        frontmatter: &Frontmatter,
    ) -> Result<Option<Arc<McpPlugins>>, String> {
        self.config.mcp_plugins(frontmatter)
    }

    /// A Host for one run over this session's model and web Plugin.
    pub(crate) fn host(
        &self,
        store: Store,
        operator: Operator,
        cancel: Arc<AtomicBool>,
        messages: (
            tokio::sync::mpsc::UnboundedSender<HostMessage>,
            tokio::sync::mpsc::UnboundedReceiver<HostMessage>,
        ),
    ) -> Result<Host, String> {
        Host::new(
            self.model.clone(),
            self.web.clone(),
            store,
            operator,
            cancel,
            messages,
        )
    }
}

/// The run's start instant in milliseconds since the epoch: `--when`, or now.
pub(crate) fn start_instant(when: Option<&str>) -> Result<i64, String> {
    match when {
        Some(text) => chrono::DateTime::parse_from_rfc3339(text)
            .map(|t| t.timestamp_millis())
            .map_err(|e| format!("--when {text:?} is not an RFC 3339 instant: {e}")),
        None => {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_err(|e| format!("the system clock is before 1970: {e}"))?;
            i64::try_from(now.as_millis())
                .map_err(|e| format!("the system clock is out of range: {e}"))
        }
    }
}

/// A seed from the OS when `--seed` is not given: std's `RandomState` is keyed from the
/// operating system's randomness, which is all a seed needs.
pub(crate) fn os_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(0x5eed);
    hasher.finish()
}

pub(crate) fn read_snapshot(path: &std::path::Path) -> Result<serde_json::Value, String> {
    let text = promptforge_harness::limits::read_capped_text(
        path,
        promptforge_harness::limits::SNAPSHOT_FILE_CAP,
    )
    .map_err(|e| format!("--snapshot: {e}"))?;
    let value: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| format!("--snapshot {} is not JSON: {e}", path.display()))?;
    if !value.is_object() {
        return Err(format!(
            "--snapshot {} must hold a JSON object",
            path.display()
        ));
    }
    Ok(value)
}

#[derive(Debug, Default)]
pub(crate) struct Config(std::sync::OnceLock<Result<Catalog, String>>);

impl Config {
    pub(crate) fn catalog(&self) -> Result<&Catalog, String> {
        self.0
            .get_or_init(|| {
                let cwd = std::env::current_dir()
                    .map_err(|e| format!("cannot read the working directory: {e}"))?;
                Catalog::load_standard(&cwd).map_err(|e| e.to_string())
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    /// The MCP Plugins of the config's `[mcp.servers]` tables, when the prompt declares one
    /// (`mcp/NAME`); a config that cannot be read then is an error, as for a model.
    pub(crate) fn mcp_plugins(
        &self,
        frontmatter: &promptforge_syntax::frontmatter::Frontmatter,
    ) -> Result<Option<Arc<promptforge_harness::mcp::McpPlugins>>, String> {
        let declares = frontmatter
            .plugins
            .iter()
            .any(|p| promptforge_harness::mcp::server_of_plugin(&p.id).is_some());
        if !declares {
            return Ok(None);
        }
        let servers = self.catalog()?.mcp_servers().clone();
        Ok(Some(Arc::new(mcp_plugins(servers))))
    }
}

/// The MCP Plugins of these servers, authorizing those behind OAuth through [`oauth_setup`].
pub(crate) fn mcp_plugins(
    servers: std::collections::BTreeMap<String, promptforge_harness::mcp::McpServerEntry>,
) -> promptforge_harness::mcp::McpPlugins {
    let plugins = promptforge_harness::mcp::McpPlugins::new(servers);
    match oauth_setup() {
        Some(setup) => plugins.with_oauth(setup),
        None => plugins,
    }
}

/// Where OAuth tokens for MCP servers live (`$PROMPTFORGE_OAUTH_DIR`, else `promptforge/oauth`
/// in the user's data directory), and how a person authorizes: the URL on stderr, and
/// `$BROWSER URL` run when the variable is set (`BROWSER=xdg-open`, `BROWSER=open`).
pub(crate) fn oauth_setup() -> Option<promptforge_harness::mcp::OAuthSetup> {
    let token_dir = std::env::var_os("PROMPTFORGE_OAUTH_DIR")
        .map(std::path::PathBuf::from)
        .or_else(|| dirs::data_dir().map(|d| d.join("promptforge").join("oauth")))?;
    Some(promptforge_harness::mcp::OAuthSetup {
        token_dir,
        authorize: Arc::new(|name: &str, url: &str| {
            crate::ui::print_line(&format!(
                "The MCP server `{name}` asks you to authorize promptforge. Open this URL in a browser (the page comes back to this machine when you are done):\n  {url}"
            ));
            if let Some(browser) = std::env::var("BROWSER")
                .ok()
                .filter(|b| !b.trim().is_empty())
            {
                let mut words = browser.split_whitespace();
                if let Some(program) = words.next() {
                    let opened = std::process::Command::new(program)
                        .args(words)
                        .arg(url)
                        .stdin(std::process::Stdio::null())
                        .stdout(std::process::Stdio::null())
                        .stderr(std::process::Stdio::null())
                        .spawn();
                    if let Err(e) = opened {
                        crate::ui::print_line(&format!(
                            "note: cannot run $BROWSER ({browser}): {e}; open the URL yourself"
                        ));
                    }
                }
            }
        }),
    })
}

/// The Host's current model: the scripted model of `script`, the `model` id, or the
/// catalog's default.
fn current_model(
    script: Option<&std::path::Path>,
    model: Option<&str>,
    config: &Config,
) -> Result<Option<CurrentModel>, String> {
    if let Some(path) = script {
        let scripted = ScriptedModel::load(path).map_err(|e| e.to_string())?;
        let Some(description) = scripted.model().cloned() else {
            return Ok(None);
        };
        return Ok(Some(CurrentModel {
            description,
            provider: Arc::new(scripted),
        }));
    }
    let catalog = config.catalog()?;
    let id = match model {
        Some(id) => id.to_owned(),
        None => match catalog.default_id() {
            Some(id) => id.to_owned(),
            None => return Ok(None),
        },
    };
    let resolved = catalog
        .resolve(&id, &Environment::Process)
        .map_err(|e| e.to_string())?;
    Ok(Some(CurrentModel {
        description: resolved.description,
        provider: resolved.provider,
    }))
}

/// The web Plugin: over the scripted network of `--web-script` (a script that cannot be read
/// is a usage error), else over the real network with the search backend of the config's
/// `[search]` table. Without a backend the Plugin reports the missing search provider, and a
/// setup problem (a bad `[search]` table, a key not set) its own line, each only to a prompt
/// that declares the Plugin.
fn web_plugin(web_script: Option<&std::path::Path>, config: &Config) -> Result<WebPlugin, String> {
    if let Some(path) = web_script {
        let network = ScriptedNetwork::load(path)
            .map_err(|e| format!("--web-script {}: {e}", path.display()))?;
        let search = network.search_backend();
        return Ok(WebPlugin::new(Arc::new(network), search));
    }
    let real = || -> Result<WebPlugin, String> {
        let search = config
            .catalog()?
            .search_backend(&Environment::Process)
            .map_err(|e| e.to_string())?;
        Ok(WebPlugin::new(Arc::new(RealNetwork::new()?), search))
    };
    Ok(real().unwrap_or_else(WebPlugin::unavailable))
}

/// Tell the run which Plugins this Host offers: the input broker (when there is an operator)
/// and the web Plugin, when the session has one.
fn offer_plugins(ctx: &mut RunContext, operator: &Operator, web: Option<&WebPlugin>) {
    ctx.host.live_operator = operator.is_person();
    ctx.host.plugins.push(PluginInfo {
        id: USER_INPUT_PLUGIN.to_owned(),
        tools: vec![ToolInfo::new(
            "ask",
            "Ask the operator: returns their next message. Takes no arguments.",
        )],
        conflicts: Vec::new(),
        activation_failure: (!operator.connected()).then(|| {
            format!(
                "{USER_INPUT_PLUGIN} needs promptforge/input-broker, and this host provides none"
            )
        }),
    });
    ctx.host.plugins.extend(web.map(WebPlugin::info));
}

/// The run's store directory and whether it is a fresh one of ours (removed after the run
/// unless kept).
#[derive(Debug)]
pub(crate) struct StoreDir {
    pub(crate) path: PathBuf,
    pub(crate) fresh: bool,
}

/// The run's store: `store`, or a fresh directory under the system temp folder.
pub(crate) fn open_store(store: Option<&std::path::Path>) -> Result<(Store, StoreDir), String> {
    let dir = match store {
        Some(dir) => StoreDir {
            path: dir.to_path_buf(),
            fresh: false,
        },
        None => StoreDir {
            path: tempfile::Builder::new()
                .prefix("promptforge-store-")
                .tempdir()
                .map_err(|e| format!("cannot create a store directory: {e}"))?
                .keep(),
            fresh: true,
        },
    };
    let store = Store::directory(&dir.path)
        .map_err(|e| format!("cannot open the store at {}: {e}", dir.path.display()))?;
    Ok((store, dir))
}

/// A record's header for a run of the prompt at `path`, whose text is `text`.
pub(crate) fn header_for(
    path: &std::path::Path,
    text: &str,
    ctx: &RunContext,
) -> crate::record::Header {
    crate::record::Header {
        record: "promptforge-run".to_owned(),
        version: crate::record::RECORD_VERSION,
        tool: concat!("promptforge ", env!("CARGO_PKG_VERSION")).to_owned(),
        prompt: crate::record::PromptId {
            // Absolute, so a replay from another folder finds the prompt.
            path: std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf()),
            sha256: crate::record::sha256_hex(text),
        },
        seed: ctx.seed,
        when: chrono::DateTime::from_timestamp_millis(ctx.start_ms)
            .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
            .unwrap_or_default(),
        start_ms: ctx.start_ms,
        args: ctx.args.clone(),
        host: ctx.host.clone(),
        concurrency: ctx.concurrency,
        snapshot: ctx.snapshot.clone(),
    }
}

/// Finish a run's record and keep it: exported to the OpenTelemetry endpoint when one is set,
/// and added to the run history when it is on. A failure to keep it in the history or export
/// it is a warning; a record file the user asked for (`--record`) that could not be written
/// is returned, for the command to fail on.
/// A run that went into the history as it started is `started` (its row is completed, and its
/// journal removed once the run is kept).
pub(crate) fn keep_record(
    recorder: crate::record::Recorder,
    outcome: &Outcome,
    wall_ms: u64,
    history: Option<&std::path::Path>,
    started: Option<i64>,
    otel: Option<&str>,
    info: &crate::otel::RunInfo,
) -> Option<String> {
    let asked = recorder.is_file();
    let finished = match recorder.finish(outcome) {
        Ok(written) => Ok(written),
        Err(e) if asked => return Some(e),
        Err(e) => Err(e),
    };
    let kept = finished.and_then(|written| {
        let path = written.path().to_path_buf();
        let path = path.as_path();
        let open = || {
            std::fs::File::open(path)
                .map(std::io::BufReader::new)
                .map_err(|e| format!("{}: {e}", path.display()))
        };
        if let Some(url) = otel {
            let sent = std::fs::read(path)
                .map_err(|e| format!("{}: {e}", path.display()))
                .and_then(|bytes| crate::otel::export(url, &bytes, info));
            if let Err(e) = sent {
                crate::ui::print_line(&format!("warning: {e}"));
            }
        }
        match history {
            Some(db) => {
                crate::history::History::open(db)?.add(
                    open()?,
                    wall_ms,
                    info.price.as_ref(),
                    started,
                )?;
                // Kept: the journal has done its work. It goes while its lock is still held,
                // so no `resume` can take it up in between.
                if let crate::record::Written::Journal(path, _locked) = &written {
                    let _ = std::fs::remove_file(path);
                }
                Ok(())
            }
            None => Ok(()),
        }
    });
    if let Err(e) = kept {
        crate::ui::print_line(&format!("warning: {e}"));
    }
    None
}
