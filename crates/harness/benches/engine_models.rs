#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // bench code
//! Model rounds made by a prompt, driven through the engine's [`Run`], against the same rounds
//! made directly with the provider (no engine) as the baseline:
//!
//! - one `models.infer` round, and ten `models.loop` rounds (ten one-round loops on one
//!   growing message list: a system record, then a user record and the reply per loop); in
//!   process also forty such rounds, since a round's cost grows with the length of the list;
//! - over HTTP with the real [`OpenAiProvider`] against an instant OpenAI-shaped server on
//!   127.0.0.1 (axum, a canned server-sent event reply), and in process with a provider that
//!   answers at once (no HTTP), which shows the engine's own cost per round;
//! - in process, one `models.loop` of ten rounds driven by tool calls: nine rounds where the
//!   model calls a local tool and a last one where it answers, so each round also runs a local
//!   tool handler and grows the list by a call and its result;
//! - a run of the same prompt shape that makes no round, which is the fixed cost of a run
//!   (the H1 pass and one section entry) that the per-round figures include.
//!
//! Engine overhead per round = (engine time − direct time) / rounds. The Host loop here does
//! what the CLI Host does per round, with the same functions: [`round_request`] turns the
//! engine's round into a [`ChatRequest`], [`reply_answer`] the provider's [`Reply`] into the
//! JSON the shim reads.

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::post;
use criterion::{Criterion, criterion_group, criterion_main};
use promptforge_engine::protocol::Answer;
use promptforge_engine::protocol::{ModelRound, store_answer, store_error_answer};
use promptforge_engine::{Effect, ModelInfo, Outcome, Run, RunContext, Step, ThinkingCapability};
use promptforge_harness::model::{
    ChatRequest, FinishReason, Message, ModelFuture, ModelLimits, ModelProvider, OpenAiOptions,
    OpenAiProvider, Reply, ReplyObserver, ToolCall, Usage, reply_answer, round_request,
};
use promptforge_harness::store::Store;
use promptforge_syntax::Prompt;
use serde_json::{Value as Json, json};

// The allocator the `promptforge` binary uses, so the figures are the product's (a run is
// many small allocations, where the system allocator costs a fifth of the engine's time).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The wire model name and the catalog id the engine sees.
const MODEL: &str = "bench-model";
/// The reply every round gets.
const REPLY: &str = "Short answer.";
/// Rounds in the loop prompt.
const LOOP_ROUNDS: usize = 10;
/// Rounds in the long loop prompt (in process only), to show how a round's cost grows with the
/// length of the list.
const LONG_LOOP_ROUNDS: usize = 40;

const FRONTMATTER: &str = "---\nname: model-bench\ndescription: model rounds for the bench\n\
promptforge: 0\nmodels:\n  writer: {}\n---\n\n# Model bench\n\n```lua\nmodels.default('writer')\n```\n\n";

const INFER: &str = "## Ask\n\n```lua\nreturn models.infer('Say hello in two words.')\n```\n";

/// A section that runs `rounds` one-round loops on one growing list.
fn loop_section(rounds: usize) -> String {
    format!(
        "## Talk\n\n```lua\nlocal msgs = messages.new():system('Be brief.')\n\
         for i = 1, {rounds} do\n  msgs:user('Question ' .. i .. ': say something short.')\n  \
         models.loop(msgs)\nend\nreturn msgs[#msgs].content .. ' ' .. #msgs\n```\n"
    )
}

/// One loop whose rounds are driven by tool calls (see [`ToolCallingProvider`]).
const TOOL_LOOP: &str = "## Count\n\n```lua\nlocal total = 0\n\
tools.add_local('count', 'Adds one to the running total', { n = 'integer' }, function(a)\n  \
total = total + a.n\n  return 'total ' .. total\nend)\n\
local msgs = messages.new():user('Count to nine with the tool, then say done.')\n\
models.loop(msgs)\nreturn msgs[#msgs].content .. ' ' .. total .. ' ' .. #msgs\n```\n";

const NO_ROUND: &str = "## Ask\n\n```lua\nlocal s = 'Say hello in two words.'\nreturn s\n```\n";

fn prompt(section: &str) -> Arc<Prompt> {
    Arc::new(Prompt::parse(&format!("{FRONTMATTER}{section}")).unwrap())
}

// --- The instant OpenAI-shaped server ----------------------------------------------------------

/// A complete chat-completions stream: one content delta, the finish reason, usage, `[DONE]`.
fn canned_sse() -> String {
    let chunk = |choices: Json, usage: Option<Json>| {
        let mut value = json!({
            "id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 1_767_225_600,
            "model": MODEL, "choices": choices,
        });
        if let Some(usage) = usage {
            value["usage"] = usage;
        }
        format!("data: {value}\n\n")
    };
    [
        chunk(
            json!([{"index": 0, "delta": {"role": "assistant", "content": REPLY}, "finish_reason": null}]),
            None,
        ),
        chunk(
            json!([{"index": 0, "delta": {}, "finish_reason": "stop"}]),
            None,
        ),
        chunk(
            json!([]),
            Some(json!({"prompt_tokens": 20, "completion_tokens": 3, "total_tokens": 23})),
        ),
        "data: [DONE]\n\n".to_owned(),
    ]
    .concat()
}

/// Start the server on a background thread; its base URL (`http://127.0.0.1:PORT/v1`).
fn start_server() -> String {
    let sse: &'static str = Box::leak(canned_sse().into_boxed_str());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(listener.local_addr().unwrap()).unwrap();
            let app = Router::new().route(
                "/v1/chat/completions",
                post(move |body: Bytes| async move {
                    // Read the request like a server would, then answer at once.
                    black_box(body.len());
                    Response::builder()
                        .status(StatusCode::OK)
                        .header("content-type", "text/event-stream")
                        // One chunk per event, as a streaming server sends them (chunked
                        // encoding, the end of the body after the last event).
                        .body(Body::from_stream(futures_util::stream::iter(
                            sse.split_inclusive("\n\n")
                                .map(|event| {
                                    Ok::<_, std::convert::Infallible>(Bytes::from_static(
                                        event.as_bytes(),
                                    ))
                                })
                                .collect::<Vec<_>>(),
                        )))
                        .unwrap()
                }),
            );
            axum::serve(listener, app).await.unwrap();
        });
    });
    let addr = rx.recv_timeout(Duration::from_secs(10)).unwrap();
    format!("http://{addr}/v1")
}

// --- The in-process instant provider -----------------------------------------------------------

/// Answers every round at once with the same reply, without any I/O.
#[derive(Debug)]
struct InstantProvider;

impl ModelProvider for InstantProvider {
    fn stream<'a>(
        &'a self,
        _request: &'a ChatRequest,
        observer: &'a dyn ReplyObserver,
    ) -> ModelFuture<'a> {
        Box::pin(async move {
            observer.text(REPLY);
            Ok(Reply {
                text: REPLY.to_owned(),
                finish_reason: Some(FinishReason::Stop),
                usage: Some(Usage {
                    prompt_tokens: 20,
                    completion_tokens: 3,
                    reasoning_tokens: None,
                }),
                ..Reply::default()
            })
        })
    }
}

/// Calls the `count` tool until the request holds nine tool results, then answers: a
/// ten-round `models.loop` with nine tool rounds.
#[derive(Debug)]
struct ToolCallingProvider;

impl ModelProvider for ToolCallingProvider {
    fn stream<'a>(
        &'a self,
        request: &'a ChatRequest,
        observer: &'a dyn ReplyObserver,
    ) -> ModelFuture<'a> {
        Box::pin(async move {
            let results = request
                .messages
                .iter()
                .filter(|m| matches!(&***m, Message::Tool { .. }))
                .count();
            let usage = Some(Usage {
                prompt_tokens: 20,
                completion_tokens: 3,
                reasoning_tokens: None,
            });
            if results >= LOOP_ROUNDS - 1 {
                observer.text(REPLY);
                return Ok(Reply {
                    text: REPLY.to_owned(),
                    finish_reason: Some(FinishReason::Stop),
                    usage,
                    ..Reply::default()
                });
            }
            Ok(Reply {
                tool_calls: vec![ToolCall {
                    id: format!("call_{results}"),
                    name: "count".to_owned(),
                    arguments: json!({"n": 1}),
                }],
                finish_reason: Some(FinishReason::ToolCalls),
                usage,
                ..Reply::default()
            })
        })
    }
}

// --- The Host loop ----------------------------------------------------------------------------

/// A Host with one current model, performing rounds on a current-thread runtime as the CLI
/// Host does.
struct Host {
    runtime: tokio::runtime::Runtime,
    provider: Arc<dyn ModelProvider>,
    store: Store,
}

impl Host {
    fn new(provider: Arc<dyn ModelProvider>) -> Host {
        Host {
            runtime: tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap(),
            provider,
            store: Store::memory(),
        }
    }

    fn drive(&mut self, prompt: &Arc<Prompt>) -> Outcome {
        let mut ctx = RunContext::new(1, 1_767_225_600_000);
        ctx.host.model = Some(ModelInfo {
            id: MODEL.to_owned(),
            context: 128_000,
            thinking: ThinkingCapability::Never,
            description: "the bench model".to_owned(),
        });
        let mut run = Run::new(prompt.clone(), ctx);
        loop {
            match run.step() {
                Step::Done(outcome) => return outcome,
                Step::Effects(batch) => {
                    assert!(
                        !batch.issued.is_empty(),
                        "the run is blocked with nothing issued"
                    );
                    for (id, effect) in batch.issued {
                        let answer = match effect {
                            Effect::ModelRound(round) => self.round(&round),
                            Effect::Store(op) => match self.store.perform(&op) {
                                Ok(answer) => store_answer(answer),
                                Err(err) => store_error_answer(&err),
                            },
                            Effect::Ask | Effect::Tool { .. } | Effect::Timer { .. } => {
                                panic!("this prompt asks no one, calls no tool and never waits")
                            }
                        };
                        run.resume(id, answer);
                    }
                }
            }
        }
    }

    fn round(&self, round: &ModelRound) -> Answer {
        let request = round_request(MODEL, round);
        let reply = self
            .runtime
            .block_on(self.provider.complete(&request))
            .unwrap();
        Answer::Value(reply_answer(&reply))
    }

    /// The same rounds without the engine: the requests a Host would send, built directly.
    fn direct(&self, requests: &[ChatRequest]) {
        for request in requests {
            let reply = self
                .runtime
                .block_on(self.provider.complete(request))
                .unwrap();
            black_box(reply);
        }
    }
}

/// The requests the prompts send, built without the engine.
fn infer_requests() -> Vec<ChatRequest> {
    vec![ChatRequest::new(
        MODEL,
        vec![Message::user("Say hello in two words.")],
    )]
}

fn loop_requests(rounds: usize) -> Vec<ChatRequest> {
    let mut messages = vec![Message::system("Be brief.")];
    let mut requests = Vec::with_capacity(rounds);
    for i in 1..=rounds {
        messages.push(Message::user(format!("Question {i}: say something short.")));
        requests.push(ChatRequest::new(MODEL, messages.clone()));
        messages.push(Message::assistant(REPLY));
    }
    requests
}

fn bench_engine_models(c: &mut Criterion) {
    let infer = prompt(INFER);
    let ten_loops = prompt(&loop_section(LOOP_ROUNDS));
    let long_loops = prompt(&loop_section(LONG_LOOP_ROUNDS));
    let no_round = prompt(NO_ROUND);
    let openai = OpenAiProvider::new(
        &start_server(),
        None,
        OpenAiOptions::default(),
        ModelLimits::default(),
    )
    .unwrap();
    let mut http = Host::new(Arc::new(openai));
    let mut local = Host::new(Arc::new(InstantProvider));
    let mut tool_calling = Host::new(Arc::new(ToolCallingProvider));
    let tool_loop = prompt(TOOL_LOOP);
    assert_eq!(
        tool_calling.drive(&tool_loop),
        Outcome::Completed(format!("{REPLY} {} {}", LOOP_ROUNDS - 1, 2 * LOOP_ROUNDS))
    );

    // The prompts do what the direct baselines do.
    for host in [&mut http, &mut local] {
        assert_eq!(host.drive(&infer), Outcome::Completed(REPLY.to_owned()));
        assert_eq!(
            host.drive(&ten_loops),
            Outcome::Completed(format!("{REPLY} {}", 1 + 2 * LOOP_ROUNDS))
        );
    }
    assert_eq!(
        local.drive(&long_loops),
        Outcome::Completed(format!("{REPLY} {}", 1 + 2 * LONG_LOOP_ROUNDS))
    );
    let infer_direct = infer_requests();
    let loop_direct = loop_requests(LOOP_ROUNDS);
    let long_loop_direct = loop_requests(LONG_LOOP_ROUNDS);

    let mut group = c.benchmark_group("engine models");
    group.warm_up_time(Duration::from_secs(1));
    group.measurement_time(Duration::from_secs(3));

    group.bench_function("no round/engine (run setup)", |b| {
        b.iter(|| black_box(local.drive(&no_round)));
    });

    group.bench_function("openai http/infer 1 round/engine", |b| {
        b.iter(|| black_box(http.drive(&infer)));
    });
    group.bench_function("openai http/infer 1 round/direct", |b| {
        b.iter(|| http.direct(&infer_direct));
    });
    group.bench_function("openai http/loop 10 rounds/engine", |b| {
        b.iter(|| black_box(http.drive(&ten_loops)));
    });
    group.bench_function("openai http/loop 10 rounds/direct", |b| {
        b.iter(|| http.direct(&loop_direct));
    });

    group.bench_function("in-process/infer 1 round/engine", |b| {
        b.iter(|| black_box(local.drive(&infer)));
    });
    group.bench_function("in-process/infer 1 round/direct", |b| {
        b.iter(|| local.direct(&infer_direct));
    });
    group.bench_function("in-process/loop 10 rounds/engine", |b| {
        b.iter(|| black_box(local.drive(&ten_loops)));
    });
    group.bench_function("in-process/loop 10 rounds/direct", |b| {
        b.iter(|| local.direct(&loop_direct));
    });
    group.bench_function("in-process/tool loop 10 rounds/engine", |b| {
        b.iter(|| black_box(tool_calling.drive(&tool_loop)));
    });
    group.bench_function("in-process/loop 40 rounds/engine", |b| {
        b.iter(|| black_box(local.drive(&long_loops)));
    });
    group.bench_function("in-process/loop 40 rounds/direct", |b| {
        b.iter(|| local.direct(&long_loop_direct));
    });
    group.finish();

    // The same HTTP rounds in CPU time rather than wall time: the time the bench thread (the
    // Host loop, the engine and the HTTP client, all on one current-thread runtime) spends
    // working, without the waits for the server (which runs on its own thread). The engine's
    // CPU overhead per round is (engine − direct) / rounds.
    let mut group = c.benchmark_group("engine models cpu");
    group.warm_up_time(Duration::from_secs(1));
    group.measurement_time(Duration::from_secs(3));
    group.bench_function("no round/engine (run setup)", |b| {
        b.iter_custom(|iters| thread_cpu(iters, || black_box(local.drive(&no_round))));
    });
    group.bench_function("openai http/infer 1 round/engine", |b| {
        b.iter_custom(|iters| thread_cpu(iters, || black_box(http.drive(&infer))));
    });
    group.bench_function("openai http/infer 1 round/direct", |b| {
        b.iter_custom(|iters| thread_cpu(iters, || http.direct(&infer_direct)));
    });
    group.bench_function("openai http/loop 10 rounds/engine", |b| {
        b.iter_custom(|iters| thread_cpu(iters, || black_box(http.drive(&ten_loops))));
    });
    group.bench_function("openai http/loop 10 rounds/direct", |b| {
        b.iter_custom(|iters| thread_cpu(iters, || http.direct(&loop_direct)));
    });
    group.finish();
}

/// The CPU time this thread spends on `iters` calls of `f`.
fn thread_cpu<T>(iters: u64, mut f: impl FnMut() -> T) -> Duration {
    let start = cpu_time::ThreadTime::now();
    for _ in 0..iters {
        black_box(f());
    }
    start.elapsed()
}

criterion_group!(benches, bench_engine_models);
criterion_main!(benches);
