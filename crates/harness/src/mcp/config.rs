//! `[mcp.servers.NAME]` tables in `promptforge.toml`: the MCP servers the Host offers as
//! Plugins `mcp/NAME`. Like a model entry, a table names the environment variables that hold
//! its secrets and never holds a secret itself.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The `[mcp]` table.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct McpTable {
    /// The servers, by name.
    #[serde(default)]
    pub servers: BTreeMap<String, McpServerEntry>,
}

/// One `[mcp.servers.NAME]` table: a command to start (stdio) or a URL (streamable HTTP).
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct McpServerEntry {
    /// The program to start; the server speaks MCP on its stdin and stdout.
    pub command: Option<String>,
    /// Its arguments.
    #[serde(default)]
    pub args: Vec<String>,
    /// The working directory to start it in (default: the Host's); a relative one is read
    /// from the config file's folder.
    pub cwd: Option<PathBuf>,
    /// Plain settings for its environment (`NAME = "value"`); never secrets.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Variables of the Host's environment handed to the server under the same name (keys,
    /// tokens). The server starts with only these, `env`, and a few basics (`PATH`, `HOME`,
    /// locale, temporary directory).
    #[serde(default)]
    pub env_vars: Vec<String>,
    /// The server's streamable HTTP endpoint, instead of a command.
    pub url: Option<String>,
    /// The variable holding a bearer token sent to `url`.
    pub bearer_token_env: Option<String>,
    /// Authorize with OAuth (the authorization-code flow with PKCE, once; the tokens kept
    /// under the user's data directory and refreshed). Only with `url`.
    #[serde(default)]
    pub oauth: bool,
    /// With `oauth`: a client id registered with the authorization server beforehand (else
    /// the server registers one).
    pub client_id: Option<String>,
    /// With `client_id`: the variable holding its secret, for a confidential client.
    pub client_secret_env: Option<String>,
    /// With `oauth`: the scopes to ask for (default: what the server says it needs).
    #[serde(default)]
    pub scopes: Vec<String>,
    /// The server's output is trusted: its tools' results reach the prompt without the
    /// untrusted envelope. Default `false`.
    #[serde(default)]
    pub trusted: bool,
    /// Seconds a tool call may take (default 60), and the server to start and list its tools.
    pub timeout: Option<f64>,
    /// The file the table came from.
    #[serde(skip)]
    pub source: Option<PathBuf>,
}

/// How long a call may take when the table sets no `timeout`.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// How a server is reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transport {
    /// A child process on stdio.
    Command {
        /// The program.
        program: String,
        /// Its arguments.
        args: Vec<String>,
    },
    /// Streamable HTTP.
    Http {
        /// The endpoint.
        url: String,
    },
}

impl McpServerEntry {
    /// The transport the table describes, or what to set.
    pub fn transport(&self) -> Result<Transport, String> {
        match (&self.command, &self.url) {
            (Some(_), Some(_)) => Err("set either `command` or `url`, not both".to_owned()),
            (None, None) => Err(
                "set `command` (a program speaking MCP on stdio) or `url` (a streamable HTTP endpoint)"
                    .to_owned(),
            ),
            (Some(program), None) if program.trim().is_empty() => {
                Err("`command` must not be empty".to_owned())
            }
            (Some(_), None) if self.oauth => {
                Err("`oauth` applies only to `url` (a server started as a command needs none)".to_owned())
            }
            (Some(program), None) => Ok(Transport::Command {
                program: program.clone(),
                args: self.args.clone(),
            }),
            (None, Some(url)) => {
                let parsed = url::Url::parse(url)
                    .map_err(|e| format!("`url` {url:?} is not a URL: {e}"))?;
                if !matches!(parsed.scheme(), "http" | "https") {
                    return Err(format!("`url` {url:?} must use http or https"));
                }
                if !self.args.is_empty() {
                    return Err("`args` applies only to `command`".to_owned());
                }
                if self.oauth && self.bearer_token_env.is_some() {
                    return Err("set either `oauth` or `bearer_token_env`, not both".to_owned());
                }
                if !self.oauth
                    && (self.client_id.is_some()
                        || self.client_secret_env.is_some()
                        || !self.scopes.is_empty())
                {
                    return Err("`client_id`, `client_secret_env` and `scopes` apply only with `oauth = true`".to_owned());
                }
                if self.client_secret_env.is_some() && self.client_id.is_none() {
                    return Err("`client_secret_env` needs `client_id`".to_owned());
                }
                Ok(Transport::Http { url: url.clone() })
            }
        }
    }

    /// The per-call timeout.
    pub fn timeout(&self) -> Result<Duration, String> {
        match self.timeout {
            None => Ok(DEFAULT_TIMEOUT),
            Some(secs) if secs.is_finite() && secs > 0.0 && secs <= 86_400.0 => {
                Ok(Duration::from_secs_f64(secs))
            }
            Some(secs) => Err(format!(
                "`timeout` must be a number of seconds above 0 and at most 86400, got {secs}"
            )),
        }
    }
}

/// The basics a started server inherits from the Host's environment besides what its table
/// names: enough to find programs, a home for caches (`npx`), the locale and temporary files.
pub const INHERITED_VARS: &[&str] = &[
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "TMPDIR",
    "TEMP",
    "TMP",
    "SYSTEMROOT",
    "APPDATA",
    "LOCALAPPDATA",
    "USERPROFILE",
];

/// Network settings a started server inherits too, so it reaches what the Host reaches: the
/// proxy and the certificate authorities the Host trusts.
pub const INHERITED_NETWORK_VARS: &[&str] = &[
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "NODE_EXTRA_CA_CERTS",
    "REQUESTS_CA_BUNDLE",
];

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(text: &str) -> McpServerEntry {
        match toml::from_str(text) {
            Ok(entry) => entry,
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn a_command_or_a_url() {
        let cmd = entry("command = \"npx\"\nargs = [\"-y\", \"srv\"]\n");
        assert_eq!(
            cmd.transport(),
            Ok(Transport::Command {
                program: "npx".into(),
                args: vec!["-y".into(), "srv".into()]
            })
        );
        let http = entry("url = \"http://127.0.0.1:9/mcp\"\n");
        assert_eq!(
            http.transport(),
            Ok(Transport::Http {
                url: "http://127.0.0.1:9/mcp".into()
            })
        );
        assert!(entry("").transport().is_err());
        assert!(
            entry("command = \"x\"\nurl = \"http://a/\"\n")
                .transport()
                .is_err()
        );
        assert!(entry("url = \"ftp://a/\"\n").transport().is_err());
    }

    #[test]
    fn timeouts() {
        assert_eq!(entry("command = \"x\"").timeout(), Ok(DEFAULT_TIMEOUT));
        assert_eq!(
            entry("command = \"x\"\ntimeout = 2.5").timeout(),
            Ok(Duration::from_millis(2500))
        );
        assert!(entry("command = \"x\"\ntimeout = 0").timeout().is_err());
    }

    #[test]
    fn unknown_keys_are_refused() {
        assert!(toml::from_str::<McpServerEntry>("command = \"x\"\nsecret = \"k\"").is_err());
    }
}
