#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point
//! Interoperability with a real gateway this project did not write: LiteLLM's proxy, installed
//! from PyPI, serving mock responses on 127.0.0.1 in both API shapes. Its Anthropic-shaped
//! `/v1/messages` answers a streaming request with one JSON message, which PromptForge must
//! accept.
//!
//! The proxy is found through `PROMPTFORGE_LITELLM` (the `litellm` executable; `.ci/run`
//! installs it in a virtual environment and sets it). Without it the test says so and skips,
//! unless `PROMPTFORGE_REQUIRE_INTEROP` is set, as CI sets it, where a missing proxy fails.

mod support;

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use support::promptforge;

const KEY: &str = "sk-interop-master-key-0123456789abcdef";
const MOCK: &str = "Hello from the LiteLLM mock";

struct Proxy(Child);

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn alive(port: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    let request = format!(
        "GET /health/liveliness HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\nconnection: close\r\n\r\n"
    );
    if stream.write_all(request.as_bytes()).is_err() {
        return false;
    }
    let mut reply = String::new();
    let _ = stream.read_to_string(&mut reply);
    reply.starts_with("HTTP/1.1 200")
}

#[test]
fn both_api_shapes_through_the_litellm_proxy() {
    let Some(litellm) = std::env::var_os("PROMPTFORGE_LITELLM") else {
        assert!(
            std::env::var_os("PROMPTFORGE_REQUIRE_INTEROP").is_none(),
            "PROMPTFORGE_REQUIRE_INTEROP is set but PROMPTFORGE_LITELLM is not"
        );
        eprintln!("skipped: set PROMPTFORGE_LITELLM to a litellm executable to run this test");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("litellm.yaml"),
        format!(
            "model_list:\n  - model_name: mock-gpt\n    litellm_params:\n      model: openai/mock-gpt\n      api_key: sk-unused\n      mock_response: \"{MOCK}\"\n"
        ),
    )
    .unwrap();
    let port = free_port();
    let child = Command::new(&litellm)
        .current_dir(dir.path())
        .args(["--config", "litellm.yaml", "--host", "127.0.0.1", "--port"])
        .arg(port.to_string())
        .env("LITELLM_MASTER_KEY", KEY)
        .env("NO_PROXY", "127.0.0.1,localhost")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let _proxy = Proxy(child);
    let started = Instant::now();
    while !alive(port) {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "the LiteLLM proxy did not come up on port {port}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    std::fs::write(
        dir.path().join("promptforge.toml"),
        format!(
            "[models.via-openai]\nprovider = \"openai\"\nmodel = \"mock-gpt\"\nbase_url = \"http://127.0.0.1:{port}/v1\"\napi_key_env = \"INTEROP_KEY\"\n\n\
             [models.via-anthropic]\nprovider = \"anthropic\"\nmodel = \"mock-gpt\"\nbase_url = \"http://127.0.0.1:{port}\"\napi_key_env = \"INTEROP_KEY\"\n"
        ),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("prompt.md"),
        "---\nname: interop\ndescription: d\npromptforge: 0\nmodels:\n  w: {}\n---\n\n# Interop\n\n## Main\n\n\
         ```lua\nmodels.default('w')\nlocal m = messages.new()\nm:user('hi')\nmodels.loop(m)\n\
         return models.infer('hello') .. ' | ' .. m[#m].content\n```\n",
    )
    .unwrap();
    for model in ["via-openai", "via-anthropic"] {
        let output = promptforge(dir.path())
            .args([
                "run",
                "prompt.md",
                "--json",
                "--seed",
                "1",
                "--model",
                model,
                "--store",
            ])
            .arg(dir.path().join(format!("store-{model}")))
            .env("INTEROP_KEY", KEY)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert_eq!(
            stdout.trim(),
            format!(r#"{{"outcome":"completed","result":"{MOCK} | {MOCK}"}}"#),
            "{model}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
}
