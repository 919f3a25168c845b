//! `input.ask()` under `mcp serve`: the person behind the client answers.
//!
//! Two protocol eras reach that person differently:
//!
//! - On a connection made with `initialize` (MCP 2025-11-25 and before) the server asks the
//!   client in the middle of the call, with `elicitation/create`, and the run waits for the
//!   reply ([`elicit`]).
//! - On MCP 2026-07-28 (no `initialize`; a server never sends a request of its own), the call
//!   returns an `input_required` result naming the question, and the client calls again with
//!   the answer (multi round-trip requests, SEP-2322). The run stays alive on the server
//!   meanwhile, parked under a handle that travels in `requestState`. That value comes back
//!   from the client, so it is attacker-controlled input: it is sealed with HMAC-SHA256 under a
//!   key made when the server starts, bound to the tool and the arguments of the call, valid
//!   for `--answer-within` (600 s by default), and good for one answer (a round number inside must match the parked
//!   run's). A run whose client never comes back is cancelled when that time is up.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{
    ClientCapabilities, ElicitRequest, ElicitRequestParams, ElicitationAction, ElicitationSchema,
    InputRequest, InputRequiredResult, InputResponses, JsonObject, RequestStateCodec, SealOptions,
};
use rmcp::service::RequestContext;
use rmcp::{Peer, RoleServer};
use serde_json::Value as Json;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::host::{Operator, RemoteOperator};

/// The most runs parked at once: past it, a new question ends its call with a tool failure.
const MAX_PARKED: usize = 256;

/// Whether the client can ask its user (form elicitation), from what this request says it can
/// do (or, on an `initialize` connection, what it declared then).
pub(super) fn can_elicit(cx: &RequestContext<RoleServer>) -> bool {
    cx.client_capabilities()
        .as_ref()
        .and_then(|caps: &ClientCapabilities| caps.elicitation.as_ref())
        .is_some_and(|e| e.form.is_some() || e.url.is_none())
}

/// Whether this request speaks MCP 2026-07-28 or later (no `initialize`, no server requests).
pub(super) fn is_modern(cx: &RequestContext<RoleServer>) -> bool {
    cx.protocol_version().is_some_and(|v| !v.has_initialize())
}

/// The operator for a call on an `initialize` connection: asks with `elicitation/create`.
pub(super) fn asking_peer(peer: &Peer<RoleServer>, name: &str) -> Operator {
    let (peer, name) = (peer.clone(), name.to_owned());
    Operator::Remote(RemoteOperator(Arc::new(move |section| {
        let (peer, name) = (peer.clone(), name.clone());
        Box::pin(async move { elicit(&peer, &name, section).await })
    })))
}

/// The Host's message for an ask: which prompt and section ask (the ask has no question of its
/// own, chapter 05).
fn message(name: &str, section: Option<&str>) -> String {
    match section {
        Some(section) => format!("The prompt `{name}` asks for your answer (section `{section}`)."),
        None => format!("The prompt `{name}` asks for your answer."),
    }
}

/// The form an ask shows: one required string, `answer`.
fn form(name: &str, section: Option<&str>) -> Result<ElicitRequestParams, String> {
    let schema = ElicitationSchema::builder()
        .required_string("answer")
        .build()
        .map_err(|e| format!("cannot ask the client's user: {e}"))?;
    Ok(ElicitRequestParams::FormElicitationParams {
        meta: None,
        message: message(name, section),
        requested_schema: schema,
    })
}

/// Ask the client's user with `elicitation/create`. Declining and cancelling are both the
/// operator not answering: the ask fails as a tool call (`tool call failure: ...`), which the
/// prompt can catch with `pcall`; the run goes on (the client cancels the run by cancelling
/// the tool call itself).
async fn elicit(
    peer: &Peer<RoleServer>,
    name: &str,
    section: Option<String>,
) -> Result<String, String> {
    let params = form(name, section.as_deref())?;
    let result = peer
        .create_elicitation(params)
        .await
        .map_err(|e| format!("the client could not ask its user: {e}"))?;
    answer_of(result.action, result.content)
}

/// What an elicitation's reply means for the ask.
fn answer_of(action: ElicitationAction, content: Option<Json>) -> Result<String, String> {
    match action {
        ElicitationAction::Accept => Ok(elicited_text(content)),
        ElicitationAction::Decline => Err("the user declined to answer".to_owned()),
        // Cancel, and any action a later protocol adds: no answer came.
        _ => Err("the user cancelled the question".to_owned()),
    }
}

/// The ask's answer in a client's reply to an input request (an elicitation result, as JSON).
fn answer_in(reply: Json) -> Result<String, String> {
    match serde_json::from_value::<rmcp::model::ElicitResult>(reply) {
        Ok(result) => answer_of(result.action, result.content),
        Err(e) => Err(format!(
            "the client's answer is not an elicitation result: {e}"
        )),
    }
}

/// What a call's run ended with, from the task it ran in.
fn joined(ended: Result<Ended, tokio::task::JoinError>) -> Ended {
    ended.unwrap_or_else(|e| Err(super::run_stopped(e)))
}

/// The answer in an accepted elicitation's content: the `answer` string asked for; a client
/// that filled a form of its own gets its one string value, or its whole content as JSON text.
pub(super) fn elicited_text(content: Option<Json>) -> String {
    let Some(content) = content else {
        return String::new();
    };
    if let Some(answer) = content.get("answer").and_then(Json::as_str) {
        return answer.to_owned();
    }
    if let Some(map) = content.as_object() {
        let strings: Vec<&str> = map.values().filter_map(Json::as_str).collect();
        if map.len() == 1 && strings.len() == 1 {
            return strings[0].to_owned();
        }
    }
    content.to_string()
}

/// One question a run asks on a 2026-07-28 call (or a task's), with where its answer goes.
pub(super) struct Question {
    section: Option<String>,
    reply: oneshot::Sender<Result<String, String>>,
}

/// What a call's run hands back when it ends.
pub(super) type Ended = Result<(promptforge_engine::Outcome, Option<super::OutputFile>), String>;

/// A 2026-07-28 call's run, between the requests of its client.
pub(super) struct Pending {
    run: tokio::task::JoinHandle<Ended>,
    questions: mpsc::UnboundedReceiver<Question>,
    cancel: CancellationToken,
}

/// How a call from a client that takes tasks goes, once decided: its run ended in time, or it
/// becomes a task (the first question out, if that is what decided it).
pub(super) enum TaskStart {
    Ended(Ended),
    Task(Pending, Option<Question>),
}

impl Pending {
    /// Start a call's run with an operator that asks through `input_required` results:
    /// `start` gets the operator and the run's cancel token, and returns the run.
    pub(super) fn start(
        start: impl FnOnce(Operator, CancellationToken) -> tokio::task::JoinHandle<Ended>,
    ) -> Pending {
        Pending::start_asking(true, start)
    }

    /// The same, with no operator at all when `asks` is false (a client that cannot ask its
    /// user: the run's asks get the no-operator answer, and no question ever comes out).
    pub(super) fn start_asking(
        asks: bool,
        start: impl FnOnce(Operator, CancellationToken) -> tokio::task::JoinHandle<Ended>,
    ) -> Pending {
        let (tx, questions) = mpsc::unbounded_channel::<Question>();
        if !asks {
            drop(tx);
            let cancel = CancellationToken::new();
            let run = start(Operator::Nobody, cancel.clone());
            return Pending {
                run,
                questions,
                cancel,
            };
        }
        let operator = Operator::Remote(RemoteOperator(Arc::new(move |section| {
            let tx = tx.clone();
            Box::pin(async move {
                let (reply, answer) = oneshot::channel();
                tx.send(Question { section, reply })
                    .map_err(|_| "the call that asked is gone".to_owned())?;
                answer
                    .await
                    .map_err(|_| "the client never answered".to_owned())?
            })
        })));
        let cancel = CancellationToken::new();
        let run = start(operator, cancel.clone());
        Pending {
            run,
            questions,
            cancel,
        }
    }

    /// Cancel the run and wait for its end.
    async fn cancel_and_join(&mut self) -> Ended {
        self.cancel.cancel();
        joined((&mut self.run).await)
    }

    /// Wait up to `wait` for the run to end (its result goes back as usual) or to ask its
    /// user (then it becomes a task at once, so the client can see the question); past
    /// `wait` it becomes a task. The request cancelled meanwhile cancels the run.
    pub(super) async fn decide(mut self, wait: Duration, ct: &CancellationToken) -> TaskStart {
        tokio::select! {
            ended = &mut self.run => TaskStart::Ended(joined(ended)),
            Some(question) = self.questions.recv() => TaskStart::Task(self, Some(question)),
            () = tokio::time::sleep(wait) => TaskStart::Task(self, None),
            () = ct.cancelled() => TaskStart::Ended(self.cancel_and_join().await),
        }
    }

    /// The rest of the run as a task (SEP-2663): each question becomes an input request of
    /// the task (`tasks/get` shows it, `tasks/update` answers it), `tasks/cancel` cancels the
    /// run, and the task's future dropped early (past its time) cancels it too.
    pub(super) async fn run_as_task(
        self,
        first: Option<Question>,
        name: String,
        task: rmcp::task_manager::TaskContext,
    ) -> Ended {
        let Pending {
            mut run,
            mut questions,
            cancel,
        } = self;
        // Cancels the run when dropped (a task future dropped before its run ended).
        let _stop = cancel.clone().drop_guard();
        let mut asked = 0u64;
        let mut ask = |question: Question| {
            asked += 1;
            let (task, name, key) = (task.clone(), name.clone(), format!("ask-{asked}"));
            tokio::spawn(async move {
                let answer = match form(&name, question.section.as_deref()) {
                    Ok(params) => {
                        let request = InputRequest::Elicitation(ElicitRequest::new(params));
                        match task.request_input(key, request).await {
                            Ok(reply) => answer_in(reply),
                            Err(_) => {
                                Err("the task was cancelled before its user answered".to_owned())
                            }
                        }
                    }
                    Err(message) => Err(message),
                };
                let _ = question.reply.send(answer);
            });
        };
        if let Some(question) = first {
            ask(question);
        }
        loop {
            tokio::select! {
                ended = &mut run => return joined(ended),
                Some(question) = questions.recv() => ask(question),
                () = task.cancelled() => {
                    cancel.cancel();
                    return joined((&mut run).await);
                }
            }
        }
    }
}

/// A run parked until its client answers.
struct Parked {
    pending: Pending,
    /// Which answer it waits for: the sealed state carries it, and a state for an earlier one
    /// is a replay.
    round: u64,
    /// The questions out, by the key the `input_required` result gave each.
    asked: Vec<(String, oneshot::Sender<Result<String, String>>)>,
}

/// What a sealed `requestState` holds.
#[derive(serde::Serialize, serde::Deserialize)]
struct Handle {
    handle: u64,
    round: u64,
}

/// How a 2026-07-28 call goes on: it ended, or it asks.
pub(super) enum Step {
    Ended(Ended),
    Asks(InputRequiredResult),
}

/// Take the run parked under `handle` if it waits for the answer of `round` (a state for an
/// earlier round is a replay, and a run taken already is gone).
fn take_parked(parked: &Mutex<HashMap<u64, Parked>>, handle: u64, round: u64) -> Option<Parked> {
    let mut parked = parked.lock().unwrap_or_else(|e| e.into_inner());
    match parked.get(&handle) {
        Some(p) if p.round == round => parked.remove(&handle),
        _ => None,
    }
}

/// The parked runs of a server, and the key their handles are sealed with.
pub(super) struct Asking {
    codec: RequestStateCodec,
    /// How long a parked run waits for its answer.
    ttl: Duration,
    parked: Arc<Mutex<HashMap<u64, Parked>>>,
    next: AtomicU64,
}

impl std::fmt::Debug for Asking {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Asking").finish_non_exhaustive()
    }
}

/// What a sealed state is bound to: the tool and its arguments, in a canonical form (keys
/// sorted at every level), hashed.
fn binding(tool: &str, arguments: &JsonObject) -> Vec<u8> {
    use sha2::Digest;
    fn canonical(value: &Json) -> Json {
        match value {
            Json::Object(map) => {
                let sorted: BTreeMap<&String, Json> =
                    map.iter().map(|(k, v)| (k, canonical(v))).collect();
                Json::Object(sorted.into_iter().map(|(k, v)| (k.clone(), v)).collect())
            }
            Json::Array(items) => Json::Array(items.iter().map(canonical).collect()),
            other => other.clone(),
        }
    }
    let args = canonical(&Json::Object(arguments.clone())).to_string();
    let mut hasher = sha2::Sha256::new();
    hasher.update(b"promptforge/mcp/tools/call\0");
    hasher.update(tool.as_bytes());
    hasher.update(b"\0");
    hasher.update(args.as_bytes());
    hasher.finalize().to_vec()
}

impl Asking {
    /// A fresh key from the operating system: a state sealed by another server process (or
    /// before a restart) does not open here.
    pub(super) fn new(ttl: Duration) -> Result<Asking, String> {
        let mut key = [0u8; 32];
        getrandom::fill(&mut key).map_err(|e| format!("cannot make a signing key: {e}"))?;
        let codec = RequestStateCodec::try_new(key.to_vec()).map_err(|e| e.to_string())?;
        Ok(Asking {
            codec,
            ttl,
            parked: Arc::new(Mutex::new(HashMap::new())),
            next: AtomicU64::new(1),
        })
    }

    /// The server stops: every parked run is cancelled (so it ends, and its history says
    /// `cancelled`), and waited for.
    pub(super) async fn cancel_all(&self) {
        let parked: Vec<Parked> = {
            let mut parked = self.parked.lock().unwrap_or_else(|e| e.into_inner());
            parked.drain().map(|(_, p)| p).collect()
        };
        for parked in parked {
            parked.pending.cancel.cancel();
            drop(parked.asked);
            let _ = parked.pending.run.await;
        }
    }

    /// A client's answers to a parked run's questions, given back with the state its
    /// `input_required` result carried: the run, with the answers delivered, ready to go on.
    pub(super) fn resume(
        &self,
        state: &str,
        tool: &str,
        arguments: &JsonObject,
        responses: Option<&InputResponses>,
    ) -> Result<(Pending, (u64, u64)), String> {
        let bound = binding(tool, arguments);
        let handle: Handle = self.codec.open_json_with(state, &bound).map_err(|e| {
            format!("refused requestState: {e} (it was not issued by this server for this call, or is too old)")
        })?;
        let Some(parked) = take_parked(&self.parked, handle.handle, handle.round) else {
            return Err("refused requestState: it was answered already, or its run ended (a run waits for its answer for --answer-within seconds, 600 by default)".to_owned());
        };
        for (key, reply) in parked.asked {
            let answer = match responses.and_then(|r| r.get(&key)) {
                Some(response) => answer_in(response.clone()),
                None => Err("the client sent no answer".to_owned()),
            };
            let _ = reply.send(answer);
        }
        // The handle goes on with the run: its next question gets the next round.
        Ok((parked.pending, (handle.handle, parked.round)))
    }

    /// Go on with a call's run until it ends, or asks (then it is parked, and the result says
    /// what to ask), or `ct` cancels the request (then the run is cancelled). `tool` is the
    /// prompt's tool name: the question's form names it and the parked state is bound to it.
    pub(super) async fn step(
        &self,
        mut pending: Pending,
        resumed: Option<(u64, u64)>,
        tool: &str,
        arguments: &JsonObject,
        ct: &CancellationToken,
    ) -> Step {
        // A loop, not recursion: a run whose asks are refused (the state could not be sealed,
        // or the server holds too many parked runs) goes on here, however many times it asks.
        let (handle, round, sealed, requests) = loop {
            let first = tokio::select! {
                ended = &mut pending.run => {
                    return Step::Ended(joined(ended));
                }
                question = pending.questions.recv() => question,
                () = ct.cancelled() => {
                    pending.cancel.cancel();
                    let ended = (&mut pending.run).await;
                    return Step::Ended(joined(ended));
                }
            };
            let Some(first) = first else {
                // No operator left to ask: the run ends on its own.
                let ended = (&mut pending.run).await;
                return Step::Ended(joined(ended));
            };
            // Every question out now goes in one result.
            let mut questions = vec![first];
            while let Ok(more) = pending.questions.try_recv() {
                questions.push(more);
            }
            let (handle, round) = match resumed {
                Some((handle, round)) => (handle, round + 1),
                None => (self.next.fetch_add(1, Ordering::Relaxed), 1),
            };
            let mut requests = BTreeMap::new();
            let mut asked = Vec::new();
            for (n, question) in questions.into_iter().enumerate() {
                let key = format!("ask-{round}-{n}");
                match form(tool, question.section.as_deref()) {
                    Ok(params) => {
                        requests.insert(
                            key.clone(),
                            InputRequest::Elicitation(ElicitRequest::new(params)),
                        );
                        asked.push((key, question.reply));
                    }
                    Err(message) => {
                        let _ = question.reply.send(Err(message));
                    }
                }
            }
            let sealed = self.codec.seal_json_with(
                &Handle { handle, round },
                &SealOptions::new()
                    .associated_data(&binding(tool, arguments))
                    .ttl(self.ttl),
            );
            let sealed = match sealed {
                Ok(sealed) => sealed,
                Err(e) => {
                    for (_, reply) in asked {
                        let _ = reply.send(Err(format!("cannot seal the request state: {e}")));
                    }
                    continue;
                }
            };
            // Parked, unless the server holds too many already (then the asks fail, and the run
            // goes on without their answers).
            let refused = {
                let mut parked = self.parked.lock().unwrap_or_else(|e| e.into_inner());
                if parked.len() >= MAX_PARKED {
                    Some((pending, asked))
                } else {
                    parked.insert(
                        handle,
                        Parked {
                            pending,
                            round,
                            asked,
                        },
                    );
                    None
                }
            };
            match refused {
                Some((again, asked)) => {
                    for (_, reply) in asked {
                        let _ = reply.send(Err(
                            "the server has too many runs waiting for their users' answers"
                                .to_owned(),
                        ));
                    }
                    pending = again;
                }
                None => break (handle, round, sealed, requests),
            }
        };
        // A client that never comes back: the run is cancelled when the state expires.
        let parked = Arc::clone(&self.parked);
        let ttl = self.ttl;
        tokio::spawn(async move {
            tokio::time::sleep(ttl).await;
            if let Some(mut expired) = take_parked(&parked, handle, round) {
                let _ = expired.pending.cancel_and_join().await;
            }
        });
        Step::Asks(InputRequiredResult::new(Some(requests), Some(sealed)))
    }

    /// The handle and round a sealed state names, when it opens for this call.
    #[cfg(test)]
    fn handle_of(&self, state: &str, tool: &str, arguments: &JsonObject) -> Option<(u64, u64)> {
        self.codec
            .open_json_with::<Handle>(state, &binding(tool, arguments))
            .ok()
            .map(|h| (h.handle, h.round))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]

    use super::*;
    use serde_json::json;

    const PARK_TTL: Duration = Duration::from_secs(600);

    /// A run that asks over and over while the server holds too many parked runs: every ask
    /// is refused at once and the run goes on to its end (in a loop: this once recursed once
    /// per refused ask).
    #[tokio::test(flavor = "current_thread")]
    async fn refused_asks_let_the_run_go_on_however_many_it_makes() {
        let asking = Asking::new(PARK_TTL).unwrap();
        let idle = || {
            let (_tx, questions) = mpsc::unbounded_channel();
            Pending {
                run: tokio::spawn(std::future::pending::<Ended>()),
                questions,
                cancel: CancellationToken::new(),
            }
        };
        {
            let mut parked = asking.parked.lock().unwrap();
            for handle in 0..MAX_PARKED as u64 {
                parked.insert(
                    handle + 1_000_000,
                    Parked {
                        pending: idle(),
                        round: 1,
                        asked: Vec::new(),
                    },
                );
            }
        }
        const ASKS: usize = 5_000;
        let (tx, questions) = mpsc::unbounded_channel();
        let run = tokio::spawn(async move {
            let mut refused = 0;
            for _ in 0..ASKS {
                let (reply, answer) = oneshot::channel();
                if tx
                    .send(Question {
                        section: None,
                        reply,
                    })
                    .is_err()
                {
                    break;
                }
                if matches!(answer.await, Ok(Err(ref e)) if e.contains("too many runs")) {
                    refused += 1;
                }
            }
            Err::<_, String>(format!("refused {refused}"))
        });
        let pending = Pending {
            run,
            questions,
            cancel: CancellationToken::new(),
        };
        let step = asking
            .step(
                pending,
                None,
                "p",
                &JsonObject::new(),
                &CancellationToken::new(),
            )
            .await;
        match step {
            Step::Ended(Err(message)) => assert_eq!(message, format!("refused {ASKS}")),
            Step::Ended(Ok(_)) | Step::Asks(_) => panic!("the run should have ended"),
        }
        for parked in asking.parked.lock().unwrap().drain() {
            parked.1.pending.run.abort();
        }
    }

    #[test]
    fn answers_are_read_from_the_form_or_what_the_client_sent() {
        assert_eq!(elicited_text(Some(json!({"answer": " a\n"}))), " a\n");
        assert_eq!(elicited_text(Some(json!({"name": "Ada"}))), "Ada");
        assert_eq!(
            elicited_text(Some(json!({"a": "x", "b": "y"}))),
            r#"{"a":"x","b":"y"}"#
        );
        assert_eq!(elicited_text(None), "");
        assert_eq!(
            answer_of(ElicitationAction::Decline, None),
            Err("the user declined to answer".to_owned())
        );
    }

    #[test]
    fn a_sealed_state_is_bound_to_its_call_and_its_server() {
        let asking = Asking::new(PARK_TTL).unwrap();
        let args: JsonObject =
            serde_json::from_value(json!({"b": 1, "a": {"y": 2, "x": 1}})).unwrap();
        let same: JsonObject =
            serde_json::from_value(json!({"a": {"x": 1, "y": 2}, "b": 1})).unwrap();
        let other: JsonObject =
            serde_json::from_value(json!({"a": {"x": 1, "y": 3}, "b": 1})).unwrap();
        let sealed = asking
            .codec
            .seal_json_with(
                &Handle {
                    handle: 7,
                    round: 2,
                },
                &SealOptions::new()
                    .associated_data(&binding("t", &args))
                    .ttl(PARK_TTL),
            )
            .unwrap();
        // The same arguments in another order open it; other arguments, another tool, another
        // server's key, or a changed byte do not.
        assert_eq!(asking.handle_of(&sealed, "t", &same), Some((7, 2)));
        assert_eq!(asking.handle_of(&sealed, "t", &other), None);
        assert_eq!(asking.handle_of(&sealed, "u", &args), None);
        assert_eq!(
            Asking::new(PARK_TTL)
                .unwrap()
                .handle_of(&sealed, "t", &args),
            None
        );
        let mut tampered = sealed.clone().into_bytes();
        let last = tampered.len() - 1;
        tampered[last] = if tampered[last] == b'A' { b'B' } else { b'A' };
        let tampered = String::from_utf8(tampered).unwrap();
        assert_eq!(asking.handle_of(&tampered, "t", &args), None);
        // A state no run is parked under is refused.
        assert!(asking.resume(&sealed, "t", &args, None).is_err());
    }
}
