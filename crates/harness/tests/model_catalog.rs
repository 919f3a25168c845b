//! The Host's model catalog: quick ids, config layering, clear setup errors, listing, and
//! resolving to a provider that talks to a fake server on 127.0.0.1.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "model_fake.rs"]
mod fake;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use fake::{FakeServer, Validator, data, event, sse};
use promptforge_harness::model::{
    Catalog, CatalogError, ConfigSources, Environment, KeyStatus, Message, ModelDescription,
    ProviderKind, ThinkingCapability, ThinkingSwitch,
};
use serde_json::json;

fn env(pairs: &[(&str, &str)]) -> Environment {
    Environment::fixed(pairs.iter().copied())
}

fn layered(files: &[(&str, &str)]) -> Catalog {
    let mut catalog = Catalog::empty();
    for (name, text) in files {
        catalog = catalog.layer(text, Path::new(name)).unwrap();
    }
    catalog
}

fn describe(catalog: &Catalog, id: &str, env: &Environment) -> ModelDescription {
    catalog.resolve(id, env).unwrap().description
}

#[test]
fn openai_quick_id_works_with_no_file() {
    let env = env(&[("OPENAI_API_KEY", "sk-1")]);
    let d = describe(&Catalog::empty(), "openai:gpt-4.1", &env);
    assert_eq!(
        d,
        ModelDescription {
            id: "openai:gpt-4.1".into(),
            provider: ProviderKind::OpenAi,
            model: "gpt-4.1".into(),
            base_url: Some("https://api.openai.com/v1".into()),
            api_key_env: Some("OPENAI_API_KEY".into()),
            context: 128_000,
            thinking: ThinkingCapability::Never,
            description: "gpt-4.1 via OpenAI".into(),
            price: None,
        }
    );
    let d = describe(&Catalog::empty(), "openai:gpt-5.1", &env);
    assert_eq!(d.thinking, ThinkingCapability::Switchable);
    let d = describe(&Catalog::empty(), "openai:o3", &env);
    assert_eq!(d.thinking, ThinkingCapability::Always);
    let info = d.engine_info();
    assert_eq!(info.id, "openai:o3");
    assert_eq!(info.context, 128_000);
}

#[test]
fn a_missing_key_says_what_to_set() {
    let err = Catalog::empty()
        .resolve("openai:gpt-4.1", &env(&[]))
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "missing environment variable: OPENAI_API_KEY (the API key for model `openai:gpt-4.1`; keys are read only from the environment)"
    );
    // An empty key counts as unset.
    let err = Catalog::empty()
        .resolve(
            "anthropic:claude-sonnet-4-6",
            &env(&[("ANTHROPIC_API_KEY", "")]),
        )
        .unwrap_err();
    assert!(
        matches!(err, CatalogError::MissingEnv { ref name, .. } if name == "ANTHROPIC_API_KEY")
    );
    // Describing needs no key.
    let d = Catalog::empty()
        .describe("anthropic:claude-sonnet-4-6", &env(&[]))
        .unwrap();
    assert_eq!(d.context, 200_000);
    assert_eq!(d.thinking, ThinkingCapability::Switchable);
}

#[test]
fn provider_base_url_variables_are_honoured() {
    let env = env(&[
        ("OPENAI_BASE_URL", "http://127.0.0.1:8000/v1/"),
        ("ANTHROPIC_BASE_URL", "https://proxy.example.com"),
        ("ANTHROPIC_API_KEY", "k"),
    ]);
    // A loopback OpenAI-compatible server needs no key.
    let d = describe(&Catalog::empty(), "openai:qwen", &env);
    assert_eq!(d.base_url.as_deref(), Some("http://127.0.0.1:8000/v1"));
    let d = describe(&Catalog::empty(), "anthropic:claude-haiku-4-5", &env);
    assert_eq!(d.base_url.as_deref(), Some("https://proxy.example.com"));
}

#[test]
fn ollama_quick_ids_use_ollama_host() {
    let d = describe(&Catalog::empty(), "ollama:qwen3:8b", &env(&[]));
    assert_eq!(d.model, "qwen3:8b");
    assert_eq!(d.base_url.as_deref(), Some("http://127.0.0.1:11434/v1"));
    assert_eq!(d.api_key_env, None);
    assert_eq!(d.context, 4096);
    let env = env(&[
        ("OLLAMA_HOST", "gpu-box:9000"),
        ("OLLAMA_CONTEXT_LENGTH", "32768"),
    ]);
    let d = describe(&Catalog::empty(), "ollama:llama3.2", &env);
    assert_eq!(d.base_url.as_deref(), Some("http://gpu-box:9000/v1"));
    assert_eq!(d.context, 32_768);
}

#[test]
fn gateway_variables_follow_the_spec_messages() {
    let err = Catalog::empty()
        .resolve("gateway:any", &env(&[]))
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "missing environment variable: PROMPTFORGE_GATEWAY_URL"
    );
    let remote = env(&[("PROMPTFORGE_GATEWAY_URL", "https://gw.example.com/v1")]);
    let err = Catalog::empty()
        .resolve("gateway:any", &remote)
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "missing environment variable: PROMPTFORGE_GATEWAY_API_KEY"
    );
    for host in ["127.0.0.1:4000", "localhost:4000", "[::1]:4000"] {
        let local = env(&[("PROMPTFORGE_GATEWAY_URL", &format!("http://{host}/v1"))]);
        assert!(
            Catalog::empty().resolve("gateway:any", &local).is_ok(),
            "{host}"
        );
    }
}

#[test]
fn an_unknown_model_names_the_files_and_the_quick_ids() {
    let catalog = layered(&[("/etc/user.toml", "")]);
    let err = catalog.resolve("gpt-4o", &env(&[])).unwrap_err();
    let text = err.to_string();
    assert!(
        text.starts_with(
            "unknown model `gpt-4o`: it is not in the model catalog (read /etc/user.toml)"
        ),
        "{text}"
    );
    assert!(
        text.contains("`openai:NAME`") && text.contains("[models.\"gpt-4o\"]"),
        "{text}"
    );
    let err = Catalog::empty()
        .resolve("mystery:thing", &env(&[]))
        .unwrap_err();
    assert!(err.to_string().contains("no config file was found"));
}

const USER: &str = r#"
default = "writer"

[models.writer]
provider = "anthropic"
model = "claude-sonnet-4-6"
context = 200000
thinking = "Switchable"
description = "Claude for drafting"

[models.local]
provider = "ollama"
model = "qwen3:8b"
context = 40960
description = "user's local model"
"#;

const PROJECT: &str = r#"
default = "local"

[models.local]
provider = "llamacpp"
base_url = "http://127.0.0.1:9090/v1"
"#;

#[test]
fn the_project_file_replaces_whole_entries_by_id() {
    let catalog = layered(&[("user.toml", USER), ("promptforge.toml", PROJECT)]);
    assert_eq!(catalog.default_id(), Some("local"));
    let local = describe(&catalog, "local", &env(&[]));
    // Nothing of the user's `local` survives: kind, model, context and description are the
    // project entry's or the llamacpp defaults.
    assert_eq!(local.provider, ProviderKind::LlamaCpp);
    assert_eq!(local.model, "local");
    assert_eq!(local.context, 32_768);
    assert_eq!(local.description, "local via llama.cpp");
    assert_eq!(local.base_url.as_deref(), Some("http://127.0.0.1:9090/v1"));
    let writer = describe(&catalog, "writer", &env(&[("ANTHROPIC_API_KEY", "k")]));
    assert_eq!(writer.model, "claude-sonnet-4-6");
    assert_eq!(writer.description, "Claude for drafting");
    assert_eq!(
        catalog.entries()["local"].source.as_deref(),
        Some(Path::new("promptforge.toml"))
    );
}

#[test]
fn a_config_entry_overrides_a_quick_id() {
    let catalog = layered(&[(
        "promptforge.toml",
        "[models.\"ollama:qwen3:8b\"]\nprovider = \"ollama\"\nmodel = \"qwen3:8b\"\ncontext = 40960\n",
    )]);
    assert_eq!(
        describe(&catalog, "ollama:qwen3:8b", &env(&[])).context,
        40_960
    );
}

#[test]
fn load_reads_existing_files_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let user = dir.path().join("config.toml");
    let project = dir.path().join("promptforge.toml");
    std::fs::write(&user, USER).unwrap();
    std::fs::write(&project, PROJECT).unwrap();
    let catalog = Catalog::load(&ConfigSources {
        user: Some(user.clone()),
        project: Some(project.clone()),
    })
    .unwrap();
    assert_eq!(catalog.default_id(), Some("local"));
    // A missing file is skipped.
    let catalog = Catalog::load(&ConfigSources {
        user: Some(dir.path().join("absent.toml")),
        project: Some(user),
    })
    .unwrap();
    assert_eq!(catalog.default_id(), Some("writer"));
}

#[test]
fn standard_sources_use_xdg_config_home_and_the_working_directory() {
    let sources = ConfigSources::standard(
        Path::new("/work/proj"),
        &env(&[("XDG_CONFIG_HOME", "/home/u/.cfg")]),
    )
    .unwrap();
    assert_eq!(
        sources.user,
        Some(PathBuf::from("/home/u/.cfg/promptforge/config.toml"))
    );
    assert_eq!(
        sources.project,
        Some(PathBuf::from("/work/proj/promptforge.toml"))
    );
}

#[test]
fn the_project_file_is_found_in_the_nearest_parent_that_has_one() {
    let root = tempfile::tempdir().unwrap();
    let nested = root.path().join("prompts").join("drafts");
    std::fs::create_dir_all(&nested).unwrap();
    std::fs::write(root.path().join("promptforge.toml"), "default = \"x\"\n").unwrap();
    let sources = ConfigSources::standard(&nested, &env(&[])).unwrap();
    assert_eq!(sources.project, Some(root.path().join("promptforge.toml")));
    // A nearer file wins.
    std::fs::write(nested.join("promptforge.toml"), "").unwrap();
    let sources = ConfigSources::standard(&nested, &env(&[])).unwrap();
    assert_eq!(sources.project, Some(nested.join("promptforge.toml")));
}

#[test]
fn quick_kinds_say_where_their_url_and_key_come_from() {
    let kinds = Catalog::quick_kinds(&env(&[("OPENAI_API_KEY", "k")]));
    assert_eq!(kinds.len(), 6);
    let openai = &kinds[0];
    assert_eq!(
        openai.base_url.as_deref(),
        Some("https://api.openai.com/v1")
    );
    assert_eq!(
        openai.key,
        KeyStatus::Set {
            env: "OPENAI_API_KEY".into()
        }
    );
    let anthropic = &kinds[1];
    assert_eq!(
        anthropic.key,
        KeyStatus::Missing {
            env: "ANTHROPIC_API_KEY".into()
        }
    );
    let ollama = &kinds[2];
    assert_eq!(ollama.key, KeyStatus::NotNeeded);
    let gateway = &kinds[5];
    assert_eq!(gateway.base_url, None, "the gateway needs its URL set");
    assert!(
        gateway.origin.contains("PROMPTFORGE_GATEWAY_URL"),
        "{}",
        gateway.origin
    );
}

#[test]
fn bad_files_and_entries_are_clear_errors() {
    let parse = |text: &str| {
        Catalog::empty()
            .layer(text, Path::new("p.toml"))
            .unwrap_err()
            .to_string()
    };
    let text = parse("[models.a]\nprovider = \"openai\"\napi_key = \"sk-secret\"\n");
    assert!(text.starts_with("invalid model config p.toml:"), "{text}");
    assert!(text.contains("api_key"), "{text}");
    let text = parse("[models.a]\nprovider = \"acme\"\n");
    assert!(text.starts_with("invalid model config p.toml:"), "{text}");
    let text = parse("[models.a]\ncontext = 10\n");
    assert_eq!(
        text,
        "model `a` in p.toml: set `provider` to one of: openai, anthropic, ollama, vllm, llamacpp, gateway"
    );
    let text = parse("[models.\"\"]\nprovider = \"openai\"\n");
    assert!(text.contains("must not be empty"), "{text}");

    let resolve = |text: &str| {
        layered(&[("p.toml", text)])
            .resolve("a", &env(&[("OPENAI_API_KEY", "k")]))
            .unwrap_err()
            .to_string()
    };
    assert_eq!(
        resolve("[models.a]\nprovider = \"openai\"\ncontext = 0\n"),
        "model `a` in p.toml: `context` must be at least 1"
    );
    let text = resolve("[models.a]\nprovider = \"openai\"\nbase_url = \"ftp://x\"\n");
    assert_eq!(
        text,
        "model `a` in p.toml: base URL `ftp://x` (from `base_url`) must use http or https, not `ftp`"
    );
    let text = resolve("[models.a]\nprovider = \"openai\"\nbase_url = \"https://u:p@x.com/v1\"\n");
    assert!(text.contains("must not carry credentials"), "{text}");
    let text = resolve("[models.a]\nprovider = \"openai\"\nmax_tokens_field = \"n_predict\"\n");
    assert!(text.contains("`max_tokens_field`"), "{text}");
}

#[test]
fn listing_shows_defaults_keys_and_problems() {
    let catalog = layered(&[
        ("user.toml", USER),
        (
            "promptforge.toml",
            "[models.gw]\nprovider = \"gateway\"\n\n[models.cloud]\nprovider = \"openai\"\nmodel = \"gpt-5\"\n",
        ),
    ]);
    let listed = catalog.list(&env(&[("OPENAI_API_KEY", "k")]));
    let ids: Vec<&str> = listed.iter().map(|m| m.description.id.as_str()).collect();
    assert_eq!(ids, vec!["cloud", "gw", "local", "writer"]);
    let by_id = |id: &str| listed.iter().find(|m| m.description.id == id).unwrap();
    assert_eq!(
        by_id("cloud").key,
        KeyStatus::Set {
            env: "OPENAI_API_KEY".into()
        }
    );
    assert_eq!(by_id("cloud").problem, None);
    assert_eq!(by_id("local").key, KeyStatus::NotNeeded);
    assert_eq!(
        by_id("writer").key,
        KeyStatus::Missing {
            env: "ANTHROPIC_API_KEY".into()
        }
    );
    assert!(by_id("writer").is_default);
    assert_eq!(
        by_id("writer").problem.as_deref(),
        Some("missing environment variable: ANTHROPIC_API_KEY")
    );
    assert_eq!(
        by_id("gw").problem.as_deref(),
        Some("missing environment variable: PROMPTFORGE_GATEWAY_URL")
    );
    assert_eq!(
        by_id("writer").source.as_deref(),
        Some(Path::new("user.toml"))
    );
}

#[tokio::test]
async fn a_resolved_model_talks_to_its_server() {
    // A llama.cpp entry on loopback: no key, the switch as chat_template_kwargs.
    let accept: Validator = Arc::new(|headers, body, _| {
        if headers.get("authorization").is_some() {
            return Err("no key was configured".into());
        }
        if body["model"] != "qwen3-8b" {
            return Err(format!("wrong model {}", body["model"]));
        }
        Ok(())
    });
    let server = FakeServer::start(
        "/v1/chat/completions",
        accept,
        vec![sse(vec![
            data(&json!({"choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": "stop"}]})),
            "data: [DONE]\n\n".into(),
        ])],
    )
    .await;
    let config = format!(
        "[models.local]\nprovider = \"llamacpp\"\nmodel = \"qwen3-8b\"\nbase_url = \"{}/v1\"\ncontext = 40960\nthinking = \"Switchable\"\n",
        server.origin
    );
    let catalog = layered(&[("promptforge.toml", &config)]);
    let resolved = catalog.resolve("local", &env(&[])).unwrap();
    let mut request = resolved.request(vec![Message::user("hello")]);
    request.thinking = ThinkingSwitch::Off;
    let reply = resolved.provider.complete(&request).await.unwrap();
    assert_eq!(reply.text, "hi");
    assert_eq!(server.violations(), Vec::<String>::new());
    assert_eq!(
        server.requests()[0]["chat_template_kwargs"],
        json!({"enable_thinking": false})
    );
}

#[tokio::test]
async fn a_resolved_anthropic_model_sends_its_key_from_the_environment() {
    let accept: Validator =
        Arc::new(
            |headers, _, _| match headers.get("x-api-key").and_then(|v| v.to_str().ok()) {
                Some("from-env") => Ok(()),
                other => Err(format!("x-api-key {other:?}")),
            },
        );
    let stop = json!({"type": "message_stop"});
    let server = FakeServer::start(
        "/v1/messages",
        accept,
        vec![sse(vec![
            event("message_start", &json!({"type": "message_start", "message": {"usage": {"input_tokens": 3}}})),
            event("content_block_start", &json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": "ok"}})),
            event("message_delta", &json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 1}})),
            event("message_stop", &stop),
        ])],
    )
    .await;
    let config = format!(
        "[models.claude]\nprovider = \"anthropic\"\nmodel = \"claude-sonnet-4-6\"\nbase_url = \"{}\"\napi_key_env = \"MY_CLAUDE_KEY\"\n",
        server.origin
    );
    let catalog = layered(&[("promptforge.toml", &config)]);
    let resolved = catalog
        .resolve("claude", &env(&[("MY_CLAUDE_KEY", "from-env")]))
        .unwrap();
    assert_eq!(
        resolved.description.api_key_env.as_deref(),
        Some("MY_CLAUDE_KEY")
    );
    let reply = resolved
        .provider
        .complete(&resolved.request(vec![Message::user("hi")]))
        .await
        .unwrap();
    assert_eq!(reply.text, "ok");
    assert_eq!(server.violations(), Vec::<String>::new());
    // The key never shows in debug output.
    assert!(!format!("{resolved:?}").contains("from-env"));
}

#[tokio::test]
async fn a_down_endpoint_names_where_its_url_came_from() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    let env = env(&[("OLLAMA_HOST", &format!("127.0.0.1:{port}"))]);
    let resolved = Catalog::empty().resolve("ollama:qwen3", &env).unwrap();
    let err = resolved
        .provider
        .complete(&resolved.request(vec![Message::user("hi")]))
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "the connection to the model backend failed"
    );
    let detail = err.detail().unwrap();
    assert!(detail.contains("OLLAMA_HOST"), "{detail}");
    assert!(
        detail.contains(&format!("http://127.0.0.1:{port}/v1")),
        "{detail}"
    );
}
