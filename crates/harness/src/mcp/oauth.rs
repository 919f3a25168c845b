//! OAuth for remote MCP servers (`[mcp.servers.NAME]` with `url` and `oauth = true`).
//!
//! rmcp's `auth` module does the protocol: discovery (the server's `WWW-Authenticate`
//! challenge, protected resource metadata, authorization server metadata), client
//! registration (dynamic, a client metadata document, or a pre-registered `client_id`), the
//! authorization-code flow with PKCE, the token exchange, and silent refresh. What is ours:
//!
//! - where tokens live: one JSON file per server under the user's data directory
//!   (`promptforge/oauth/NAME.json`), created `0600` and replaced atomically;
//! - the person's part: the authorization URL is handed to the Host (which prints it, and
//!   opens `$BROWSER` when set), and a one-request HTTP listener on 127.0.0.1 receives the
//!   redirect;
//! - when: a server that answers 401 (or 403 for a scope it wants) is authorized once, then
//!   connected again; a stored token is used, and refreshed, without asking.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rmcp::transport::auth::{
    AuthError, AuthorizationManager, AuthorizationRequest, CredentialStore, OAuthState,
    StoredCredentials,
};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

/// How long the Host waits for the person to finish authorizing in the browser.
const AUTHORIZE_WITHIN: Duration = Duration::from_secs(300);

/// Shows a person the URL to open to authorize (and may open it): the server's name, the URL.
pub type ShowAuthorization = Arc<dyn Fn(&str, &str) + Send + Sync>;

/// What the Host provides for OAuth: where tokens are kept, and how a person is shown the
/// authorization URL.
#[derive(Clone)]
pub struct OAuthSetup {
    /// The folder of the token files (`0700`).
    pub token_dir: PathBuf,
    /// Shows the person the URL to open.
    pub authorize: ShowAuthorization,
}

impl std::fmt::Debug for OAuthSetup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OAuthSetup")
            .field("token_dir", &self.token_dir)
            .finish_non_exhaustive()
    }
}

/// A server's tokens in a file of their own, readable by the user alone, with the URL they
/// were issued for: a table that names the same server name with another URL (a project
/// file redefining `[mcp.servers.NAME]`) finds no tokens, never the other server's.
struct FileCredentialStore {
    path: PathBuf,
    url: String,
}

/// The token file's contents.
#[derive(serde::Serialize, serde::Deserialize)]
struct TokenFile {
    url: String,
    credentials: StoredCredentials,
}

fn store_error(path: &Path, e: impl std::fmt::Display) -> AuthError {
    AuthError::CredentialStoreError(format!("{}: {e}", path.display()))
}

#[async_trait::async_trait]
impl CredentialStore for FileCredentialStore {
    async fn load(&self) -> Result<Option<StoredCredentials>, AuthError> {
        match tokio::fs::read(&self.path).await {
            Ok(bytes) => match serde_json::from_slice::<TokenFile>(&bytes) {
                Ok(file) if file.url == self.url => Ok(Some(file.credentials)),
                // Tokens for another URL, or a file of another shape: none for this server
                // (authorizing again replaces the file).
                _ => Ok(None),
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(store_error(&self.path, e)),
        }
    }

    async fn save(&self, credentials: StoredCredentials) -> Result<(), AuthError> {
        let file = TokenFile {
            url: self.url.clone(),
            credentials,
        };
        let bytes = serde_json::to_vec(&file).map_err(|e| store_error(&self.path, e))?;
        let path = self.path.clone();
        tokio::task::spawn_blocking(move || write_private(&path, &bytes))
            .await
            .map_err(|e| store_error(&self.path, e))?
            .map_err(|e| store_error(&self.path, e))
    }

    async fn clear(&self) -> Result<(), AuthError> {
        match tokio::fs::remove_file(&self.path).await {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(store_error(&self.path, e)),
        }
    }
}

/// Write `bytes` to `path` so that only the user can read them: a new file of a unique name
/// (created `0600`) in the same folder (itself `0700`), then renamed over the old one.
fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    }
    let mut temp = tempfile::Builder::new().prefix(".token").tempfile_in(dir)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        temp.as_file()
            .set_permissions(std::fs::Permissions::from_mode(0o600))?;
    }
    temp.write_all(bytes)?;
    temp.as_file().sync_all()?;
    temp.persist(path).map(|_| ()).map_err(|e| e.error)
}

/// The token file of server `name`.
pub(crate) fn token_file(setup: &OAuthSetup, name: &str) -> PathBuf {
    setup.token_dir.join(format!("{name}.json"))
}

/// Whether a URL's host is this machine (then its authorization server may be too).
fn is_local(url: &str) -> bool {
    url::Url::parse(url).is_ok_and(|u| crate::model::http::is_loopback(&u))
}

/// An authorization manager for `url` with the server's token file as its store, loaded.
/// Discovery may reach private addresses only for a server on this machine (a remote server's
/// metadata naming an address inside the network is refused).
pub(crate) async fn manager(
    setup: &OAuthSetup,
    name: &str,
    url: &str,
) -> Result<AuthorizationManager, String> {
    let made = if is_local(url) {
        AuthorizationManager::new_allowing_private_addresses(url).await
    } else {
        AuthorizationManager::new(url).await
    };
    let mut manager = made.map_err(|e| format!("OAuth for the MCP server at {url}: {e}"))?;
    manager.set_credential_store(FileCredentialStore {
        path: token_file(setup, name),
        url: url.to_owned(),
    });
    manager
        .initialize_from_store()
        .await
        .map_err(|e| format!("OAuth for the MCP server at {url}: {e}"))?;
    Ok(manager)
}

/// What a server said when it wants authorization: its `WWW-Authenticate` challenge (a 401,
/// or a 403 for more scope), from a failed handshake. rmcp wraps the HTTP error in its worker's
/// and the service's errors without linking them as sources, so they are unwrapped by type.
pub(crate) fn challenge_in(error: &rmcp::service::ClientInitializeError) -> Option<String> {
    let rmcp::service::ClientInitializeError::TransportError { error, .. } = error else {
        return None;
    };
    challenge_in_transport(error)
}

/// The challenge of a request that failed on the way (a 401, or a 403 for more scope).
pub(crate) fn challenge_in_service(error: &rmcp::ServiceError) -> Option<String> {
    let rmcp::ServiceError::TransportSend(error) = error else {
        return None;
    };
    challenge_in_transport(error)
}

fn challenge_in_transport(error: &rmcp::transport::DynamicTransportError) -> Option<String> {
    use rmcp::transport::streamable_http_client::StreamableHttpError;
    use rmcp::transport::worker::WorkerQuitReason;
    let inner: &(dyn std::error::Error + 'static) = error.error.as_ref();
    if let Some(error) = inner.downcast_ref::<StreamableHttpError<reqwest_mcp::Error>>()
        && let Some(challenge) = error.auth_challenge()
    {
        return Some(challenge.to_owned());
    }
    if let Some(WorkerQuitReason::Fatal { error, .. }) =
        inner.downcast_ref::<WorkerQuitReason<StreamableHttpError<reqwest_mcp::Error>>>()
        && let Some(challenge) = error.auth_challenge()
    {
        return Some(challenge.to_owned());
    }
    challenge_in_chain(inner)
}

/// The challenge anywhere in an error's source chain.
fn challenge_in_chain(error: &(dyn std::error::Error + 'static)) -> Option<String> {
    use rmcp::transport::streamable_http_client::{AuthRequiredError, InsufficientScopeError};
    let mut next = Some(error);
    while let Some(e) = next {
        if let Some(required) = e.downcast_ref::<AuthRequiredError>() {
            return Some(required.www_authenticate_header.clone());
        }
        if let Some(scope) = e.downcast_ref::<InsufficientScopeError>() {
            return Some(scope.www_authenticate_header.clone());
        }
        next = e.source();
    }
    None
}

/// The client identity a table gives: a pre-registered id (and the variable holding its
/// secret), or none (the authorization server registers one).
#[derive(Debug, Clone, Default)]
pub(crate) struct ClientIdentity {
    pub client_id: Option<String>,
    pub client_secret: Option<String>,
    pub scopes: Vec<String>,
}

impl ClientIdentity {
    /// The identity a server's table gives, its secret read from the variable it names.
    pub(crate) fn of(entry: &super::McpServerEntry) -> Result<ClientIdentity, String> {
        let client_secret = match &entry.client_secret_env {
            Some(var) => match std::env::var(var) {
                Ok(secret) if !secret.is_empty() => {
                    crate::secrets::register(&secret);
                    Some(secret)
                }
                _ => {
                    return Err(format!(
                        "the client secret variable {var} (named in `client_secret_env`) is not set"
                    ));
                }
            },
            None => None,
        };
        Ok(ClientIdentity {
            client_id: entry.client_id.clone(),
            client_secret,
            scopes: entry.scopes.clone(),
        })
    }
}

/// Run the authorization-code flow once for server `name` at `url`, seeded by its challenge:
/// register (or use the configured client), show the person the URL, wait for the redirect
/// on a loopback port, exchange the code, and keep the tokens in the server's file.
pub(crate) async fn authorize(
    setup: &OAuthSetup,
    name: &str,
    url: &str,
    challenge: Option<String>,
    identity: &ClientIdentity,
) -> Result<(), String> {
    let fail = |e: &dyn std::fmt::Display| format!("OAuth for the MCP server at {url}: {e}");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| fail(&format!("cannot listen for the redirect: {e}")))?;
    let port = listener.local_addr().map_err(|e| fail(&e))?.port();
    let redirect = format!("http://127.0.0.1:{port}/callback");
    let mut request = AuthorizationRequest::new(redirect.clone())
        .with_client_name("promptforge")
        .with_initial_scope_selection();
    if !identity.scopes.is_empty() {
        request = request.with_scopes(identity.scopes.clone());
    }
    if let Some(challenge) = challenge {
        request = request.with_challenge(challenge);
    }
    if let Some(id) = &identity.client_id {
        request = request.with_preregistered_client(id.clone());
        if let Some(secret) = &identity.client_secret {
            request = request.with_client_secret(secret.clone());
        }
    }
    let manager = manager(setup, name, url).await?;
    let mut state = OAuthState::Unauthorized(manager);
    state
        .start_authorization(request)
        .await
        .map_err(|e| fail(&e))?;
    let address = state.get_authorization_url().await.map_err(|e| fail(&e))?;
    (setup.authorize)(name, &address);
    // Only the redirect that carries this authorization's `state` ends the wait (another
    // local process cannot end it, or slip in a code of its own).
    let expected = url::Url::parse(&address).ok().and_then(|u| {
        u.query_pairs()
            .find(|(k, _)| k == "state")
            .map(|(_, v)| v.into_owned())
    });
    let callback = tokio::time::timeout(AUTHORIZE_WITHIN, redirected(&listener, expected))
        .await
        .map_err(|_| {
            fail(&format!(
                "no authorization arrived within {} minutes",
                AUTHORIZE_WITHIN.as_secs() / 60
            ))
        })?
        .map_err(|e| fail(&e))?;
    state
        .handle_callback_url(&callback)
        .await
        .map_err(|e| fail(&e))?;
    Ok(())
}

/// How long one connection to the redirect listener may take to send its request line.
const REQUEST_LINE_WITHIN: Duration = Duration::from_secs(5);

/// The longest request line read (a redirect's query is a code and a state).
const REQUEST_LINE_MAX: u64 = 8 * 1024;

/// Answer one connection to the redirect listener with a small page.
async fn answer(stream: &mut tokio::net::TcpStream, status: &str, text: &str) {
    let page = format!("<!doctype html><title>promptforge</title><p>{text}</p>");
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/html; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        page.len()
    );
    let _ = stream.write_all(format!("{head}{page}").as_bytes()).await;
    let _ = stream.shutdown().await;
}

/// Wait for the browser's redirect to the loopback listener and answer it: the full callback
/// URL (its query carries the code and state). A request that is not this authorization's
/// redirect (another path, another `state`, a connection that sends nothing) is turned away
/// and the wait goes on; the authorization server's own error ends it. Written by hand: one
/// GET request line is all there is to read, which a web framework would dwarf.
async fn redirected(
    listener: &tokio::net::TcpListener,
    state: Option<String>,
) -> Result<String, String> {
    use tokio::io::AsyncReadExt;
    loop {
        let (stream, _) = listener.accept().await.map_err(|e| e.to_string())?;
        let mut reader = tokio::io::BufReader::new(stream.take(REQUEST_LINE_MAX));
        let mut line = String::new();
        let read = tokio::time::timeout(REQUEST_LINE_WITHIN, reader.read_line(&mut line)).await;
        let mut stream = reader.into_inner().into_inner();
        if !matches!(read, Ok(Ok(n)) if n > 0) {
            continue;
        }
        let target = line.split_whitespace().nth(1).unwrap_or("").to_owned();
        let query = url::Url::parse(&format!("http://127.0.0.1{target}")).ok();
        let param = |key: &str| {
            query.as_ref().and_then(|u| {
                u.query_pairs()
                    .find(|(k, _)| k == key)
                    .map(|(_, v)| v.into_owned())
            })
        };
        let ours = state.is_none() || param("state") == state;
        if !target.starts_with("/callback") || !ours {
            answer(&mut stream, "404 Not Found", "Not this authorization.").await;
            continue;
        }
        if let Some(error) = param("error") {
            let detail = param("error_description").unwrap_or_default();
            answer(
                &mut stream,
                "200 OK",
                "Not authorized. You can close this window; the terminal says why.",
            )
            .await;
            return Err(format!("the authorization server said {error} {detail}")
                .trim_end()
                .to_owned());
        }
        answer(
            &mut stream,
            "200 OK",
            "Authorized. You can close this window and go back to the terminal.",
        )
        .await;
        return Ok(format!("http://127.0.0.1{target}"));
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn token_files_are_private() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("oauth").join("s.json");
        write_private(&path, b"{}").unwrap();
        write_private(&path, b"{\"a\":1}").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"{\"a\":1}");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
            let dir_mode = std::fs::metadata(path.parent().unwrap())
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(dir_mode & 0o777, 0o700);
        }
        // No temporary file is left behind.
        assert_eq!(
            std::fs::read_dir(path.parent().unwrap()).unwrap().count(),
            1
        );
    }

    async fn get(port: u16, target: &str) -> String {
        use tokio::io::AsyncReadExt;
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .unwrap();
        stream
            .write_all(format!("GET {target} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut reply = String::new();
        stream.read_to_string(&mut reply).await.unwrap();
        reply
    }

    #[tokio::test]
    async fn the_redirect_listener_takes_only_its_own_authorization() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let waiting =
            tokio::spawn(async move { redirected(&listener, Some("s1".to_owned())).await });
        // Another path, another state: turned away, and the wait goes on.
        assert!(get(port, "/favicon.ico").await.starts_with("HTTP/1.1 404"));
        assert!(
            get(port, "/callback?code=evil&state=other")
                .await
                .starts_with("HTTP/1.1 404")
        );
        let reply = get(port, "/callback?code=c1&state=s1").await;
        assert!(reply.contains("Authorized."), "{reply}");
        assert_eq!(
            waiting.await.unwrap().unwrap(),
            "http://127.0.0.1/callback?code=c1&state=s1"
        );
        // The authorization server's refusal ends the wait with its words.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let waiting =
            tokio::spawn(async move { redirected(&listener, Some("s2".to_owned())).await });
        let reply = get(port, "/callback?error=access_denied&state=s2").await;
        assert!(reply.contains("Not authorized."), "{reply}");
        assert_eq!(
            waiting.await.unwrap(),
            Err("the authorization server said access_denied".to_owned())
        );
    }

    #[tokio::test]
    async fn tokens_belong_to_the_url_they_were_issued_for() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.json");
        let store = FileCredentialStore {
            path: path.clone(),
            url: "https://a.example/mcp".to_owned(),
        };
        let credentials: StoredCredentials =
            serde_json::from_value(serde_json::json!({"client_id": "c"})).unwrap();
        store.save(credentials).await.unwrap();
        assert!(store.load().await.unwrap().is_some());
        let other = FileCredentialStore {
            path,
            url: "https://b.example/mcp".to_owned(),
        };
        assert!(other.load().await.unwrap().is_none());
    }

    #[test]
    fn only_servers_on_this_machine_may_send_discovery_inside_the_network() {
        assert!(is_local("http://127.0.0.1:3000/mcp"));
        assert!(is_local("http://localhost/mcp"));
        assert!(is_local("http://[::1]:8080/mcp"));
        assert!(!is_local("https://mcp.example.com/mcp"));
        assert!(!is_local("http://10.0.0.5/mcp"));
    }
}
