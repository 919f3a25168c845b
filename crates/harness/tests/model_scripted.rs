//! The scripted model of `--script FILE`: every reply form of the conformance README, the
//! order rounds take replies in, and clear parse errors.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::{Arc, Mutex};

use promptforge_harness::model::{
    ChatRequest, Condition, Content, ContentPart, FinishReason, Message, ModelDescription,
    ModelError, ModelProvider, ProviderKind, ReplyObserver, Script, ScriptedModel, ScriptedReply,
    ThinkingCapability, ToolCall, Usage,
};
use serde_json::json;

const README_EXAMPLE: &str = r#"{
  "model": {"id": "scripted", "context": 128000, "thinking": "Switchable",
            "description": "a scripted model"},
  "replies": [
    "a plain text reply",
    {"text": "optional text", "tool_calls": [{"id": "call_1", "name": "search", "arguments": {"q": "x"}}]},
    {"when": "substring", "text": "reply for the first round whose last user message contains it"},
    {"echo": true},
    {"fail": "status", "status": 503},
    {"fail": "overflow"},
    {"text": "", "finish_reason": "length"}
  ]
}"#;

fn ask(text: &str) -> ChatRequest {
    ChatRequest::new("scripted", vec![Message::user(text)])
}

fn model(replies: serde_json::Value) -> ScriptedModel {
    ScriptedModel::from_json(&json!({"replies": replies}).to_string()).unwrap()
}

#[test]
fn the_readme_example_parses() {
    let script = Script::parse(README_EXAMPLE).unwrap();
    assert_eq!(
        script.model,
        Some(ModelDescription {
            id: "scripted".into(),
            provider: ProviderKind::Scripted,
            model: "scripted".into(),
            base_url: None,
            api_key_env: None,
            context: 128_000,
            thinking: ThinkingCapability::Switchable,
            description: "a scripted model".into(),
            price: None,
        })
    );
    assert_eq!(script.replies.len(), 7);
    assert_eq!(
        script.replies[2].when,
        Some(Condition::User("substring".into()))
    );
    assert_eq!(script.replies[3].reply, ScriptedReply::Echo);
    assert_eq!(script.replies[4].reply, ScriptedReply::Status(503));
    assert_eq!(script.replies[5].reply, ScriptedReply::Overflow);
}

#[tokio::test]
async fn the_readme_example_plays_in_order() {
    let m = ScriptedModel::from_json(README_EXAMPLE).unwrap();
    let first = m.complete(&ask("hello")).await.unwrap();
    assert_eq!(first.text, "a plain text reply");
    assert_eq!(first.finish_reason, Some(FinishReason::Stop));
    let second = m.complete(&ask("search please")).await.unwrap();
    assert_eq!(second.text, "optional text");
    assert_eq!(second.finish_reason, Some(FinishReason::ToolCalls));
    assert_eq!(
        second.tool_calls,
        vec![ToolCall {
            id: "call_1".into(),
            name: "search".into(),
            arguments: json!({"q": "x"}),
        }]
    );
    // The `when` entry is skipped by rounds that do not match it.
    assert_eq!(
        m.complete(&ask("repeat me")).await.unwrap().text,
        "repeat me"
    );
    assert_eq!(
        m.complete(&ask("a substring here")).await.unwrap().text,
        "reply for the first round whose last user message contains it"
    );
    let err = m.complete(&ask("x")).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "the model backend is overloaded (status 503)"
    );
    let err = m.complete(&ask("x")).await.unwrap_err();
    assert!(err.is_context_overflow());
    let last = m.complete(&ask("x")).await.unwrap();
    assert_eq!(last.text, "");
    assert_eq!(last.finish_reason, Some(FinishReason::Length));
    assert_eq!(m.remaining(), 0);
}

#[tokio::test]
async fn plain_strings_answer_in_order() {
    let m = model(json!(["one", "two"]));
    assert_eq!(m.complete(&ask("a")).await.unwrap().text, "one");
    assert_eq!(m.complete(&ask("b")).await.unwrap().text, "two");
}

#[tokio::test]
async fn a_round_with_no_reply_left_fails_like_a_provider() {
    let m = model(json!(["only"]));
    m.complete(&ask("a")).await.unwrap();
    let err = m.complete(&ask("b")).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "the model backend sent a reply that could not be understood: the scripted model has no reply left for round 2"
    );
    assert!(matches!(err, ModelError::Malformed { .. }));
}

#[tokio::test]
async fn when_entries_wait_for_their_round_and_match_the_last_user_message() {
    let m = model(json!([
        {"when": "Research this topic", "text": "", "tool_calls": [
            {"id": "call_1", "name": "task", "arguments": {"target": "## Research"}}]},
        {"when": "List the key facts", "text": "Tides are predictable."},
        "Tidal power is predictable and clean."
    ]));
    let first = m
        .complete(&ask("Research this topic with a background task"))
        .await
        .unwrap();
    assert_eq!(first.tool_calls[0].name, "task");
    // The next round's last user message is still the first one, but that entry is used up;
    // an earlier user message never matches.
    let request = ChatRequest::new(
        "scripted",
        vec![
            Message::user("List the key facts about: tides"),
            Message::assistant("ok"),
            Message::user("Research this topic with a background task"),
            Message::assistant_tool_calls("", first.tool_calls.clone()),
            Message::tool("call_1", "started"),
        ],
    );
    assert_eq!(
        m.complete(&request).await.unwrap().text,
        "Tidal power is predictable and clean."
    );
    assert_eq!(
        m.complete(&ask("List the key facts about: tidal power"))
            .await
            .unwrap()
            .text,
        "Tides are predictable."
    );
}

#[tokio::test]
async fn a_matching_when_entry_wins_over_earlier_plain_entries() {
    let m = model(json!(["plain", {"when": "special", "text": "matched"}]));
    assert_eq!(
        m.complete(&ask("a special round")).await.unwrap().text,
        "matched"
    );
    assert_eq!(
        m.complete(&ask("a special round")).await.unwrap().text,
        "plain"
    );
}

#[tokio::test]
async fn when_tool_entries_wait_for_a_round_whose_latest_tool_result_matches() {
    let m = model(json!([
        "plain",
        {"when_tool": "illustrative", "text": "saw the page"}
    ]));
    let with_tool = |result: &str| {
        ChatRequest::new(
            "scripted",
            vec![
                Message::user("fetch it, illustrative please"),
                Message::Assistant {
                    content: Content::Text(String::new()),
                    tool_calls: vec![ToolCall {
                        id: "call_1".into(),
                        name: "fetch".into(),
                        arguments: json!({}),
                    }],
                    reasoning: Vec::new(),
                },
                Message::Tool {
                    tool_call_id: "call_1".into(),
                    content: Content::Text(result.into()),
                },
            ],
        )
    };
    // A user message with the text does not count: only the latest tool record does.
    assert_eq!(
        m.complete(&ask("illustrative")).await.unwrap().text,
        "plain"
    );
    assert_eq!(
        m.complete(&with_tool("an illustrative page"))
            .await
            .unwrap()
            .text,
        "saw the page"
    );
    assert!(
        Script::parse(r#"{"replies": [{"when": "a", "when_tool": "b", "text": "x"}]}"#)
            .unwrap_err()
            .to_string()
            .contains("give `when` or `when_tool`, not both")
    );
}

#[tokio::test]
async fn echo_replies_with_the_last_user_message_text() {
    let m = model(json!([{"echo": true}, {"echo": true}, {"echo": true}]));
    assert_eq!(
        m.complete(&ask("Explain tides in one sentence."))
            .await
            .unwrap()
            .text,
        "Explain tides in one sentence."
    );
    let parts = ChatRequest::new(
        "scripted",
        vec![
            Message::user("earlier"),
            Message::User {
                content: Content::Parts(vec![
                    ContentPart::Text {
                        text: "Hello.".into(),
                    },
                    ContentPart::Text {
                        text: "\n\n".into(),
                    },
                    ContentPart::Text {
                        text: "World.".into(),
                    },
                ]),
            },
            Message::assistant("ignored"),
        ],
    );
    assert_eq!(m.complete(&parts).await.unwrap().text, "Hello.\n\nWorld.");
    let none = ChatRequest::new("scripted", vec![Message::system("no user here")]);
    assert_eq!(m.complete(&none).await.unwrap().text, "");
}

#[tokio::test]
async fn fail_status_classifies_like_the_http_client() {
    let m = model(json!([
        {"fail": "status", "status": 500},
        {"fail": "status", "status": 429},
        {"fail": "status", "status": 529},
        {"fail": "status", "status": 401},
        {"fail": "status", "status": 404},
        {"when": "later", "fail": "status", "status": 502}
    ]));
    let expected = [
        "the model backend reported a fault of its own (status 500)",
        "the model backend is limiting the request rate (status 429)",
        "the model backend is overloaded (status 529)",
        "the model backend did not accept the credentials (status 401)",
        "the model backend rejected the request (status 404)",
    ];
    for text in expected {
        assert_eq!(m.complete(&ask("x")).await.unwrap_err().to_string(), text);
    }
    let err = m.complete(&ask("later")).await.unwrap_err();
    assert_eq!(err, ModelError::ServerFault { status: 502 });
}

#[tokio::test]
async fn fail_overflow_is_a_provider_context_rejection() {
    let m = model(json!([{"fail": "overflow"}]));
    let err = m.complete(&ask("x")).await.unwrap_err();
    assert_eq!(err, ModelError::ContextOverflow { status: 400 });
    assert!(err.is_context_overflow());
    assert!(!err.retryable());
}

#[tokio::test]
async fn finish_reasons_and_usage() {
    let m = model(json!([
        {"text": "", "finish_reason": "stop"},
        {"text": "", "finish_reason": null},
        {"text": "cut", "finish_reason": "length"},
        {"tool_calls": [{"id": "c", "name": "f"}]},
        {"text": "x", "usage": {"prompt_tokens": 100, "completion_tokens": 20, "reasoning_tokens": 5}}
    ]));
    let r = m.complete(&ask("a")).await.unwrap();
    assert_eq!(
        (r.text.as_str(), r.finish_reason),
        ("", Some(FinishReason::Stop))
    );
    assert_eq!(m.complete(&ask("a")).await.unwrap().finish_reason, None);
    assert_eq!(
        m.complete(&ask("a")).await.unwrap().finish_reason,
        Some(FinishReason::Length)
    );
    let calls = m.complete(&ask("a")).await.unwrap();
    assert_eq!(calls.text, "");
    assert_eq!(calls.tool_calls[0].arguments, json!({}));
    assert_eq!(calls.finish_reason, Some(FinishReason::ToolCalls));
    assert_eq!(
        m.complete(&ask("a")).await.unwrap().usage,
        Some(Usage {
            prompt_tokens: 100,
            completion_tokens: 20,
            reasoning_tokens: Some(5),
        })
    );
}

#[tokio::test]
async fn malformed_arguments_pass_through_for_the_engine_to_judge() {
    let m =
        model(json!([{"text": "", "tool_calls": [{"id": "c", "name": "f", "arguments": [1, 2]}]}]));
    assert_eq!(
        m.complete(&ask("a")).await.unwrap().tool_calls[0].arguments,
        json!([1, 2])
    );
}

#[tokio::test]
async fn requests_are_recorded_and_fragments_observed() {
    #[derive(Default)]
    struct Seen(Mutex<Vec<String>>);
    impl ReplyObserver for Seen {
        fn text(&self, fragment: &str) {
            self.0.lock().unwrap().push(fragment.to_owned());
        }
    }
    let m = Arc::new(model(json!(["streamed whole"])));
    let seen = Seen::default();
    let mut request = ask("hi");
    request.temperature = Some(0.3);
    let provider: Arc<dyn ModelProvider> = m.clone();
    provider.stream(&request, &seen).await.unwrap();
    assert_eq!(*seen.0.lock().unwrap(), vec!["streamed whole"]);
    assert_eq!(m.requests(), vec![request]);
}

#[test]
fn no_model_means_no_current_model() {
    let m = ScriptedModel::from_json(r#"{"replies": []}"#).unwrap();
    assert!(m.model().is_none());
    let m = ScriptedModel::from_json(r#"{"model": {"id": "m"}}"#).unwrap();
    let d = m.model().unwrap();
    assert_eq!(
        (d.context, d.thinking),
        (128_000, ThinkingCapability::Switchable)
    );
    let m = ScriptedModel::from_json(
        r#"{"model": {"id": "scripted-small", "context": 32000, "thinking": "Never", "description": "small"}, "replies": []}"#,
    )
    .unwrap();
    let info = m.model().unwrap().engine_info();
    assert_eq!((info.id.as_str(), info.context), ("scripted-small", 32_000));
}

#[test]
fn parse_errors_are_clear() {
    let err = |text: &str| Script::parse(text).unwrap_err().to_string();
    assert!(err("{").starts_with("the script is not valid JSON: "));
    assert_eq!(
        err("[]"),
        "the script must be a JSON object with `model` and `replies`, got an array"
    );
    assert_eq!(
        err(r#"{"reply": []}"#),
        "the script: unknown key `reply`; expected one of: model, replies"
    );
    assert_eq!(
        err(r#"{"replies": {}}"#),
        "the script's `replies` must be an array, got an object"
    );
    assert_eq!(
        err(r#"{"replies": [3]}"#),
        "replies[1] must be a string or an object, got a number"
    );
    assert_eq!(
        err(r#"{"replies": ["ok", {"txt": "typo"}]}"#),
        "replies[2]: unknown key `txt`; expected one of: when, when_tool, text, tool_calls, finish_reason, usage"
    );
    assert_eq!(
        err(r#"{"replies": [{"fail": "timeout"}]}"#),
        "replies[1]: `fail` must be \"status\" or \"overflow\", got \"timeout\""
    );
    assert_eq!(
        err(r#"{"replies": [{"fail": "status"}]}"#),
        "replies[1]: `fail: \"status\"` needs `status`, an HTTP status from 300 to 599"
    );
    assert_eq!(
        err(r#"{"replies": [{"fail": "status", "status": 200}]}"#),
        "replies[1]: `fail: \"status\"` needs `status`, an HTTP status from 300 to 599"
    );
    assert_eq!(
        err(r#"{"replies": [{"echo": false}]}"#),
        "replies[1]: `echo` must be true, got false"
    );
    assert_eq!(
        err(r#"{"replies": [{"when": "x"}]}"#),
        "replies[1] must be a string, or an object with `text` and/or `tool_calls`, `echo`, or `fail`"
    );
    assert_eq!(
        err(r#"{"replies": [{"text": "", "tool_calls": [{"name": "f"}]}]}"#),
        "replies[1].tool_calls[1] must set `id`"
    );
    assert_eq!(
        err(r#"{"replies": [{"text": 5}]}"#),
        "replies[1]: `text` must be a string, got a number"
    );
    assert_eq!(
        err(r#"{"model": {"id": "m", "thinking": "Sometimes"}}"#),
        "the script's `model`: `thinking` must be Never, Always or Switchable, got \"Sometimes\""
    );
    assert_eq!(
        err(r#"{"model": {"id": "m", "context": 0}}"#),
        "the script's `model`: `context` must be at least 1"
    );
    assert_eq!(
        err(r#"{"model": {"context": 5}}"#),
        "the script's `model` must set `id`"
    );
}

#[test]
fn loading_a_file_names_it_in_errors() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("script.json");
    std::fs::write(&path, README_EXAMPLE).unwrap();
    assert_eq!(ScriptedModel::load(&path).unwrap().remaining(), 7);
    std::fs::write(&path, r#"{"replies": [1]}"#).unwrap();
    let err = ScriptedModel::load(&path).unwrap_err().to_string();
    assert_eq!(
        err,
        format!(
            "script {}: replies[1] must be a string or an object, got a number",
            path.display()
        )
    );
    let missing = dir.path().join("absent.json");
    let err = ScriptedModel::load(&missing).unwrap_err().to_string();
    assert!(err.starts_with(&format!("cannot read the script {}: ", missing.display())));
}
