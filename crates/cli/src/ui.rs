//! What a person at a terminal sees while a run works: a live progress display on stderr
//! (indicatif), the notes the Host has for them (a retry, a server's message), and a one-line
//! summary at the end.
//!
//! The display is drawn only when stderr is a terminal and nothing else owns the output
//! (`--json`, `--events`, `--quiet` and batch runs turn it off); then notes are plain stderr
//! lines. One line shows the section the main walk is in and the run's totals; each running
//! task or fanout arm gets a line of its own with its current model round and the tail of the
//! reply streaming in.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use promptforge_engine::protocol::EffectId;
use promptforge_engine::{Event, EventKind, Outcome};
use promptforge_harness::model::{Price, Usage};

/// The display on screen, if any: tracing's writer draws its log lines above it. Set while a
/// display is drawn and taken away when it is cleared, so a line printed after a display is
/// gone goes straight to stderr (never through a display that no longer draws its bars).
static SCREEN: std::sync::Mutex<Option<MultiProgress>> = std::sync::Mutex::new(None);

/// The display on screen now, if any.
fn screen() -> Option<MultiProgress> {
    SCREEN.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// Make `multi` the display on screen (`None`: none is).
fn set_screen(multi: Option<MultiProgress>) {
    *SCREEN.lock().unwrap_or_else(|e| e.into_inner()) = multi;
}

/// Standard output is closed (a reader that went away, `| head`) or failed: nothing more is
/// written to it.
static STDOUT_GONE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
/// Standard output failed for another reason than a closed pipe (a full disk, `/dev/full`).
static STDOUT_FAILED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Write to stdout (the `out!`/`outln!` macros). A reader that went away ends the output
/// quietly, as `cat` and `grep` do, and the command goes on (a run still reaches the history);
/// any other failure is said once on stderr and makes the command fail. Never panics.
pub(crate) fn out(args: std::fmt::Arguments) {
    use std::io::Write;
    use std::sync::atomic::Ordering;
    if STDOUT_GONE.load(Ordering::Relaxed) {
        return;
    }
    let mut stdout = std::io::stdout().lock();
    if let Err(e) = stdout.write_fmt(args) {
        stdout_failed(&e);
    }
}

/// Note a failed write to stdout (see [`out`]).
pub(crate) fn stdout_failed(e: &std::io::Error) {
    use std::sync::atomic::Ordering;
    if STDOUT_GONE.swap(true, Ordering::Relaxed) {
        return;
    }
    if e.kind() != std::io::ErrorKind::BrokenPipe {
        STDOUT_FAILED.store(true, Ordering::Relaxed);
        errln!("error: cannot write to standard output: {e}");
    }
}

/// Whether stdout is closed or failed (nothing more goes to it).
pub(crate) fn stdout_gone() -> bool {
    STDOUT_GONE.load(std::sync::atomic::Ordering::Relaxed)
}

/// Stdout as a writer that never fails (see [`out`]): a long listing or a batch's results
/// piped into `head` stop quietly.
pub(crate) struct QuietStdout;

impl std::io::Write for QuietStdout {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if !stdout_gone()
            && let Err(e) = std::io::stdout().lock().write_all(buf)
        {
            stdout_failed(&e);
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if !stdout_gone()
            && let Err(e) = std::io::stdout().lock().flush()
        {
            stdout_failed(&e);
        }
        Ok(())
    }
}

/// Flush stdout; whether it failed for another reason than a closed pipe (the exit status
/// then says so).
pub(crate) fn stdout_flush_failed() -> bool {
    use std::io::Write;
    use std::sync::atomic::Ordering;
    if !STDOUT_GONE.load(Ordering::Relaxed)
        && let Err(e) = std::io::stdout().lock().flush()
    {
        stdout_failed(&e);
    }
    STDOUT_FAILED.load(Ordering::Relaxed)
}

/// Write a finished line to stderr, above the progress display when one is drawn. Every
/// secret the Host holds is taken out first (a server may echo a key in its error text).
pub(crate) fn print_line(text: &str) {
    let text = &*promptforge_harness::secrets::redact(text);
    match screen() {
        Some(multi) => {
            if multi.println(text).is_err() {
                errln!("{text}");
            }
        }
        None => errln!("{text}"),
    }
}

/// stderr as the live display draws on it. indicatif pads every line to the terminal's width
/// and leaves the cursor at the right edge of the last one, so the `^C` a terminal echoes
/// after it wraps onto a line the display does not know of, and the display's first line was
/// left behind when it cleared. Every display template ends in two spaces; this writer holds
/// a frame's output until it is flushed and leaves off the last two spaces, so the cursor
/// stays two columns short of the edge and an echoed `^C` fits on the display's last line.
/// Drawn only where stderr is a terminal.
#[derive(Debug)]
struct EchoRoom {
    term: console::Term,
    held: std::sync::Mutex<String>,
}

impl EchoRoom {
    /// Writes what is held, as it is (before the cursor moves or a line clears).
    fn release(&self) -> std::io::Result<()> {
        let held = std::mem::take(&mut *self.held.lock().unwrap_or_else(|e| e.into_inner()));
        if held.is_empty() {
            Ok(())
        } else {
            self.term.write_str(&held)
        }
    }
}

impl indicatif::TermLike for EchoRoom {
    fn width(&self) -> u16 {
        self.term.size().1
    }
    fn height(&self) -> u16 {
        self.term.size().0
    }
    fn move_cursor_up(&self, n: usize) -> std::io::Result<()> {
        self.release()?;
        self.term.move_cursor_up(n)
    }
    fn move_cursor_down(&self, n: usize) -> std::io::Result<()> {
        self.release()?;
        self.term.move_cursor_down(n)
    }
    fn move_cursor_right(&self, n: usize) -> std::io::Result<()> {
        self.release()?;
        self.term.move_cursor_right(n)
    }
    fn move_cursor_left(&self, n: usize) -> std::io::Result<()> {
        self.release()?;
        self.term.move_cursor_left(n)
    }
    fn write_line(&self, s: &str) -> std::io::Result<()> {
        self.release()?;
        self.term.write_line(s)
    }
    fn write_str(&self, s: &str) -> std::io::Result<()> {
        self.held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push_str(s);
        Ok(())
    }
    fn clear_line(&self) -> std::io::Result<()> {
        self.release()?;
        self.term.clear_line()
    }
    fn flush(&self) -> std::io::Result<()> {
        {
            let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
            if held.ends_with("  ") {
                let keep = held.len() - 2;
                held.truncate(keep);
            }
        }
        self.release()?;
        self.term.flush()
    }
}

/// The live display's draw target (see [`EchoRoom`]); its templates end in two spaces.
fn display_target() -> ProgressDrawTarget {
    ProgressDrawTarget::term_like(Box::new(EchoRoom {
        term: console::Term::stderr(),
        held: std::sync::Mutex::new(String::new()),
    }))
}

/// What a coloured word on stderr says.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Tone {
    /// A failure (`error[KIND]`, `✗`).
    Bad,
    /// Something to do (`hint:`).
    Hint,
    /// Something to know (`note:`, `■`).
    Note,
    /// It worked (`✓`).
    Good,
}

/// `text` coloured for stderr when stderr is a terminal that takes colour and `NO_COLOR` is
/// not set (console's rule, which `TERM=dumb` and `CLICOLOR=0` also turn off); as it is
/// otherwise. stdout is never coloured.
pub(crate) fn paint(text: &str, tone: Tone) -> String {
    let style = console::style(text).for_stderr();
    match tone {
        Tone::Bad => style.red().bold(),
        Tone::Hint => style.cyan().bold(),
        Tone::Note => style.yellow(),
        Tone::Good => style.green(),
    }
    .to_string()
}

/// Take the live display off the screen for good (the process is about to end without the
/// run's own end clearing it: the Ctrl-C watchdog).
pub(crate) fn clear_screen() {
    if let Some(multi) = screen() {
        let _ = multi.clear();
        multi.set_draw_target(ProgressDrawTarget::hidden());
    }
    set_screen(None);
}

/// Draw `bar` on stderr as the display `-v` logs and notes print above (a batch's bar).
pub(crate) fn screen_bar(bar: ProgressBar) -> ProgressBar {
    let multi = MultiProgress::with_draw_target(display_target());
    let bar = multi.add(bar);
    set_screen(Some(multi));
    bar
}

/// tracing's writer: each log line goes out through [`print_line`]'s route, so `-v` logs and
/// the progress display never tear each other.
#[derive(Debug, Default)]
pub(crate) struct LogWriter(Vec<u8>);

impl std::io::Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for LogWriter {
    fn drop(&mut self) {
        let text = String::from_utf8_lossy(&self.0);
        let text = text.trim_end_matches('\n');
        if !text.is_empty() {
            print_line(text);
        }
    }
}

/// Token and round totals of a run (or of one run of a batch).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Totals {
    /// Model rounds that got a reply.
    pub rounds: u64,
    /// Rounds whose reply carried no usage.
    pub unmetered: u64,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    /// Rounds answered from the response cache (counted in `rounds` too), and their tokens.
    pub cached: u64,
    pub cached_prompt_tokens: u64,
    pub cached_completion_tokens: u64,
}

impl Totals {
    /// A round answered from the response cache (its tokens are in the totals already).
    pub(crate) fn add_cached(&mut self, usage: Option<&Usage>) {
        self.cached += 1;
        if let Some(u) = usage {
            self.cached_prompt_tokens += u.prompt_tokens;
            self.cached_completion_tokens += u.completion_tokens;
        }
    }

    pub(crate) fn add(&mut self, usage: Option<&Usage>) {
        self.rounds += 1;
        match usage {
            Some(u) => {
                self.prompt_tokens += u.prompt_tokens;
                self.completion_tokens += u.completion_tokens;
            }
            None => self.unmetered += 1,
        }
    }

    /// The cost in dollars, when every round was metered and the model has a price.
    pub(crate) fn cost(&self, price: Option<&Price>) -> Option<f64> {
        if self.unmetered > 0 {
            return None;
        }
        // Cached rounds were paid for when they were first sent: not again.
        let usage = Usage {
            prompt_tokens: self.prompt_tokens.saturating_sub(self.cached_prompt_tokens),
            completion_tokens: self
                .completion_tokens
                .saturating_sub(self.cached_completion_tokens),
            reasoning_tokens: None,
        };
        price.map(|p| p.cost(&usage))
    }

    /// What the cached rounds would have cost, sent again.
    fn cached_cost(&self, price: Option<&Price>) -> Option<f64> {
        let usage = Usage {
            prompt_tokens: self.cached_prompt_tokens,
            completion_tokens: self.cached_completion_tokens,
            reasoning_tokens: None,
        };
        (self.cached > 0 && self.unmetered == 0)
            .then(|| price.map(|p| p.cost(&usage)))
            .flatten()
    }

    /// `3 rounds · 1,204 in / 311 out tokens · $0.0041` (or `cost unknown`).
    pub(crate) fn text(&self, price: Option<&Price>, model: Option<&str>) -> String {
        if self.rounds == 0 {
            return "no model rounds".to_owned();
        }
        let rounds = plural(self.rounds, "round");
        let tokens = if self.unmetered == self.rounds {
            "tokens not reported".to_owned()
        } else {
            let partial = if self.unmetered > 0 {
                format!(" ({} unreported)", plural(self.unmetered, "round"))
            } else {
                String::new()
            };
            format!(
                "{} in / {} out tokens{partial}",
                thousands(self.prompt_tokens),
                thousands(self.completion_tokens)
            )
        };
        let cost = match (self.cost(price), price) {
            (Some(cost), _) => format!("${cost:.4}"),
            (None, Some(_)) => "cost unknown (tokens not reported)".to_owned(),
            (None, None) => match model {
                Some(id) => format!("cost unknown (no price for {id} in the catalog)"),
                None => "cost unknown".to_owned(),
            },
        };
        let (rounds, cost) = if self.cached > 0 {
            let saved = self
                .cached_cost(price)
                .map(|c| format!(" (cached rounds: ${c:.4} not spent)"))
                .unwrap_or_default();
            (
                format!("{rounds} ({} cached)", self.cached),
                format!("{cost}{saved}"),
            )
        } else {
            (rounds, cost)
        };
        format!("{rounds} · {tokens} · {cost}")
    }
}

pub(crate) fn plural(n: u64, word: &str) -> String {
    if n == 1 {
        format!("1 {word}")
    } else {
        format!("{n} {word}s")
    }
}

/// `12345` as `12,345`.
pub(crate) fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A wall time for people: `850 ms`, `2.41 s`, `3 m 05 s`.
pub(crate) fn duration_text(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1000 {
        format!("{ms} ms")
    } else if ms < 60_000 {
        format!("{:.2} s", d.as_secs_f64())
    } else {
        format!("{} m {:02} s", ms / 60_000, (ms / 1000) % 60)
    }
}

/// The last `max` characters of `text`, on one line.
fn tail(text: &str, max: usize) -> String {
    let flat: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let count = flat.chars().count();
    if count <= max {
        return flat;
    }
    let skip = count - max;
    format!("…{}", flat.chars().skip(skip + 1).collect::<String>())
}

/// The widest reply tail a task line shows.
const TAIL: usize = 60;

/// One model round in flight, as its line shows it; shared with the round's observer.
#[derive(Debug)]
pub(crate) struct RoundLine {
    bar: Option<ProgressBar>,
    label: String,
    streamed: Mutex<String>,
}

impl RoundLine {
    fn show(&self, what: &str) {
        if let Some(bar) = &self.bar {
            bar.set_message(format!("{}: {what}", self.label));
        }
    }

    /// A fragment of the reply arrived.
    pub(crate) fn text(&self, fragment: &str) {
        if self.bar.is_none() {
            return;
        }
        let mut streamed = self.streamed.lock().unwrap_or_else(|e| e.into_inner());
        streamed.push_str(fragment);
        // Keep only what the line can show.
        if streamed.len() > 4 * TAIL * 4 {
            let cut = streamed.len() - 2 * TAIL * 4;
            let cut = (cut..streamed.len())
                .find(|&i| streamed.is_char_boundary(i))
                .unwrap_or(0);
            streamed.drain(..cut);
        }
        let shown = tail(&streamed, TAIL);
        drop(streamed);
        self.show(&shown);
    }

    /// The model is reasoning (its text is never shown).
    pub(crate) fn reasoning(&self) {
        let streamed = self.streamed.lock().unwrap_or_else(|e| e.into_inner());
        if streamed.is_empty() {
            drop(streamed);
            self.show("thinking…");
        }
    }

    /// The round waits to be sent again.
    pub(crate) fn waiting(&self, why: &str, wait: Duration) {
        self.show(&format!(
            "{}; retrying in {}",
            promptforge_harness::secrets::redact(why),
            duration_text(wait).replace(".00", "")
        ));
    }
}

/// Receives a run's progress as short messages (`section Main`, `model round 3`).
pub(crate) struct Reporter(pub(crate) Box<dyn Fn(String) + Send + Sync>);

impl std::fmt::Debug for Reporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Reporter")
    }
}

/// The live display of one run.
#[derive(Debug)]
pub(crate) struct Progress {
    screen: Option<Screen>,
    /// Where progress goes besides the screen (an MCP client's progress notifications).
    reporter: Option<Reporter>,
    /// Rounds started so far (for the reporter's messages).
    rounds_started: u64,
    /// Whether a display was drawn (it is cleared when the run ends).
    drawn: bool,
    totals: Totals,
    section: String,
    started: Instant,
    /// Each task's label (`Summarize 3/20 "q3 report"`, `Review (task 0.2)`), by task id.
    labels: BTreeMap<String, String>,
    /// Tasks and fanout arms spawned, started and ended so far.
    spawned: u64,
    running: u64,
    ended: u64,
}

/// At most this many task lines are drawn; the head line counts the rest.
const TASK_LINES: usize = 8;

#[derive(Debug)]
struct Screen {
    multi: MultiProgress,
    /// The head line: the section, the round and task counts, the tokens.
    main: ProgressBar,
    /// The main walk's round line, drawn once it makes a round.
    walk: Option<ProgressBar>,
    /// A line per running task, by task id (the first [`TASK_LINES`] of them).
    tasks: BTreeMap<String, ProgressBar>,
    /// Model rounds in flight: effect → (task, round number of that task).
    rounds: BTreeMap<EffectId, String>,
    /// How many rounds each task has started.
    counts: BTreeMap<String, u64>,
}

fn spinner(template: &str) -> ProgressBar {
    let bar = ProgressBar::new_spinner();
    if let Ok(style) = ProgressStyle::with_template(template) {
        bar.set_style(style.tick_chars("⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏ "));
    }
    bar
}

impl Progress {
    /// A display drawn on stderr when `draw` (stderr is a terminal and nothing else owns the
    /// output), else none.
    pub(crate) fn new(draw: bool) -> Progress {
        let screen = draw.then(|| {
            let multi = MultiProgress::with_draw_target(display_target());
            let main = multi.add(spinner("{spinner} {elapsed:>3} {wide_msg}  "));
            main.enable_steady_tick(Duration::from_millis(120));
            main.set_message("starting");
            set_screen(Some(multi.clone()));
            Screen {
                multi,
                main,
                walk: None,
                tasks: BTreeMap::new(),
                rounds: BTreeMap::new(),
                counts: BTreeMap::new(),
            }
        });
        Progress {
            drawn: screen.is_some(),
            screen,
            reporter: None,
            rounds_started: 0,
            totals: Totals::default(),
            section: String::new(),
            started: Instant::now(),
            labels: BTreeMap::new(),
            spawned: 0,
            running: 0,
            ended: 0,
        }
    }

    /// A task's label for people.
    fn label(&self, task: &str) -> String {
        self.labels
            .get(task)
            .cloned()
            .unwrap_or_else(|| format!("task {task}"))
    }

    /// Also tell `reporter` each step a person would see: a section entered, a task or arm
    /// started, a model round sent.
    pub(crate) fn set_reporter(&mut self, reporter: Reporter) {
        self.reporter = Some(reporter);
    }

    fn report(&self, message: impl FnOnce() -> String) {
        if let Some(reporter) = &self.reporter {
            (reporter.0)(message());
        }
    }

    /// Whether a display is (or was) drawn.
    pub(crate) fn drawn(&self) -> bool {
        self.drawn
    }

    /// The run's totals so far.
    pub(crate) fn totals(&self) -> Totals {
        self.totals
    }

    /// The wall time since the run started.
    pub(crate) fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    fn refresh_main(&self) {
        if let Some(screen) = &self.screen {
            let mut text = if self.section.is_empty() {
                "running".to_owned()
            } else {
                format!("§ {}", self.section)
            };
            if self.totals.rounds > 0 || !screen.rounds.is_empty() {
                text.push_str(&format!(
                    "  · {} done, {} in flight · {} in / {} out tokens",
                    plural(self.totals.rounds, "round"),
                    screen.rounds.len(),
                    thousands(self.totals.prompt_tokens),
                    thousands(self.totals.completion_tokens)
                ));
            }
            if self.spawned > 0 {
                let queued = self.spawned.saturating_sub(self.running + self.ended);
                text.push_str(&format!(
                    " · tasks {} running, {queued} queued, {} done",
                    self.running, self.ended
                ));
            }
            screen.main.set_message(text);
        }
    }

    /// An event of the run.
    fn show_event(&mut self, event: &Event) {
        match &event.kind {
            EventKind::SectionStarted { section, .. } if event.task == "0" => {
                self.report(|| format!("section {section}"));
            }
            EventKind::SectionStarted { section, .. } => {
                self.report(|| format!("{}: section {section}", self.label(&event.task)));
            }
            EventKind::TaskStarted => {
                self.report(|| format!("{} started", self.label(&event.task)));
            }
            EventKind::Log { section, message } => {
                self.report(|| format!("[{section}] {message}"));
            }
            _ => {}
        }
        match &event.kind {
            EventKind::TaskSpawned {
                id, target, arm, ..
            } => {
                let label = match arm {
                    Some(arm) => format!("{target} {}/{} {:?}", arm.index, arm.of, arm.item),
                    None => format!("{target} (task {id})"),
                };
                self.labels.insert(id.clone(), label);
                self.spawned += 1;
            }
            EventKind::TaskStarted => self.running += 1,
            EventKind::TaskEnded { .. } => {
                self.running = self.running.saturating_sub(1);
                self.ended += 1;
            }
            _ => {}
        }
        let label = self.label(&event.task);
        let Some(screen) = &mut self.screen else {
            return;
        };
        match &event.kind {
            EventKind::SectionStarted { section, .. } if event.task == "0" => {
                self.section = section.clone();
                if let Some(walk) = &screen.walk {
                    walk.set_prefix(format!("§ {section}"));
                }
            }
            EventKind::SectionStarted { section, .. } => {
                if let Some(bar) = screen.tasks.get(&event.task) {
                    bar.set_message(format!("§ {section}"));
                }
            }
            EventKind::TaskStarted if screen.tasks.len() < TASK_LINES => {
                let bar = screen
                    .multi
                    .add(spinner("  {spinner} {prefix:.dim} {wide_msg}  "));
                bar.set_prefix(label);
                bar.set_message("started");
                bar.enable_steady_tick(Duration::from_millis(120));
                screen.tasks.insert(event.task.clone(), bar);
            }
            EventKind::TaskSpawned { .. } | EventKind::TaskStarted => {}
            EventKind::TaskEnded { .. } => {
                if let Some(bar) = screen.tasks.remove(&event.task) {
                    bar.finish_and_clear();
                    screen.multi.remove(&bar);
                }
            }
            _ => return,
        }
        self.refresh_main();
    }

    /// A model round is sent for `task` (every round, those answered at once included).
    pub(crate) fn round_sent(&mut self, task: Option<&str>) {
        self.rounds_started += 1;
        let n = self.rounds_started;
        self.report(|| match task {
            Some(task) if task != "0" => format!("model round {n} (task {task})"),
            _ => format!("model round {n}"),
        });
    }

    /// A model round goes out for `task` (the issuing task, when the run knows it).
    pub(crate) fn round_started(
        &mut self,
        effect: EffectId,
        task: Option<String>,
    ) -> Arc<RoundLine> {
        let Some(screen) = &mut self.screen else {
            return Arc::new(RoundLine {
                bar: None,
                label: String::new(),
                streamed: Mutex::new(String::new()),
            });
        };
        let task = task.unwrap_or_else(|| "0".to_owned());
        let n = screen.counts.entry(task.clone()).or_insert(0);
        *n += 1;
        let label = format!("round {n}");
        // The main walk's rounds get a line of their own under the head, so the head's
        // counts are never overwritten; a task past the drawn lines shows only in the counts.
        let bar = if task == "0" {
            let walk = screen.walk.get_or_insert_with(|| {
                let bar = screen.multi.insert_after(
                    &screen.main,
                    spinner("  {spinner} {prefix:.dim} {wide_msg}  "),
                );
                bar.enable_steady_tick(Duration::from_millis(120));
                bar
            });
            walk.set_prefix(format!("§ {}", self.section));
            Some(walk.clone())
        } else {
            screen.tasks.get(&task).cloned()
        };
        screen.rounds.insert(effect, task);
        let line = Arc::new(RoundLine {
            bar,
            label,
            streamed: Mutex::new(String::new()),
        });
        line.show("waiting for the model");
        self.refresh_main();
        line
    }

    /// A model round was answered from the response cache (`round_finished` counts it too).
    pub(crate) fn round_cached(&mut self, usage: Option<&Usage>) {
        self.totals.add_cached(usage);
    }

    /// A model round ended (a reply, with its usage if reported) or was dropped (`None`).
    fn round_ended(&mut self, effect: EffectId, reply: Option<Option<&Usage>>) {
        if let Some(usage) = reply {
            self.totals.add(usage);
        }
        if let Some(screen) = &mut self.screen {
            screen.rounds.remove(&effect);
        }
        self.refresh_main();
    }

    /// Hide the display while a person types an answer on the terminal (`true`), and show
    /// it again (`false`).
    pub(crate) fn pause(&mut self, hidden: bool) {
        if let Some(screen) = &self.screen {
            screen.multi.set_draw_target(if hidden {
                ProgressDrawTarget::hidden()
            } else {
                display_target()
            });
        }
    }

    /// Clear the display (the run ended).
    fn clear(&mut self) {
        if let Some(screen) = self.screen.take() {
            for bar in screen.tasks.values().chain(&screen.walk) {
                bar.finish_and_clear();
            }
            screen.main.finish_and_clear();
            let _ = screen.multi.clear();
            set_screen(None);
        }
    }

    /// The one-line summary of the run's end.
    pub(crate) fn summary(
        &self,
        outcome: &Outcome,
        price: Option<&Price>,
        model: Option<&str>,
    ) -> String {
        let (mark, what) = match outcome {
            Outcome::Completed(_) => (paint("✓", Tone::Good), "completed".to_owned()),
            Outcome::Cancelled => (paint("■", Tone::Note), "cancelled".to_owned()),
            Outcome::Failed(err) => (paint("✗", Tone::Bad), format!("failed ({})", err.kind)),
        };
        format!(
            "{mark} {what} in {} · {}",
            duration_text(self.elapsed()),
            self.totals.text(price, model)
        )
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.clear();
    }
}

/// The progress display shows events and rounds as they come and clears when the run ends.
impl crate::witness::Witness for Progress {
    fn event(&mut self, event: &Event) {
        self.show_event(event);
    }

    fn step(
        &mut self,
        _issued: &[(EffectId, promptforge_engine::protocol::Effect)],
        _commits: &promptforge_engine::protocol::Commits,
        withdrawn: &[EffectId],
        _task: &dyn Fn(EffectId) -> Option<String>,
    ) {
        for id in withdrawn {
            self.round_ended(*id, None);
        }
    }

    fn round_finished(&mut self, id: EffectId, reply: Option<Option<&Usage>>) {
        self.round_ended(id, reply);
    }

    fn ended(&mut self) {
        self.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The head line counts exactly the rounds the lines below it show: refreshed when a round
    /// of the main walk starts and when it ends, not later (it once lagged them).
    #[test]
    fn the_head_line_counts_the_rounds_as_they_start_and_end() {
        let mut progress = Progress::new(true);
        progress.pause(true);
        let head = |p: &Progress| {
            p.screen
                .as_ref()
                .map(|s| s.main.message())
                .unwrap_or_default()
        };
        let first = progress.round_started(1, Some("0".into()));
        assert!(
            head(&progress).contains("0 rounds done, 1 in flight"),
            "{}",
            head(&progress)
        );
        let _second = progress.round_started(2, Some("0".into()));
        assert!(
            head(&progress).contains("0 rounds done, 2 in flight"),
            "{}",
            head(&progress)
        );
        progress.round_ended(
            1,
            Some(Some(&Usage {
                prompt_tokens: 1200,
                completion_tokens: 30,
                reasoning_tokens: None,
            })),
        );
        assert!(
            head(&progress).contains("1 round done, 1 in flight · 1,200 in / 30 out tokens"),
            "{}",
            head(&progress)
        );
        // A dropped round leaves the count of rounds done as it was.
        progress.round_ended(2, None);
        assert!(
            head(&progress).contains("1 round done, 0 in flight"),
            "{}",
            head(&progress)
        );
        drop(first);
        clear_screen();
    }

    #[test]
    fn numbers_read_well() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(1234567), "1,234,567");
        assert_eq!(duration_text(Duration::from_millis(850)), "850 ms");
        assert_eq!(duration_text(Duration::from_millis(2414)), "2.41 s");
        assert_eq!(duration_text(Duration::from_secs(185)), "3 m 05 s");
    }

    #[test]
    fn tails_keep_the_end_on_one_line() {
        assert_eq!(tail("a\nb", 10), "a b");
        assert_eq!(tail("abcdefghij", 5), "…ghij");
        assert_eq!(tail("ééééé", 3), "…éé");
    }

    #[test]
    fn totals_never_show_an_unknown_cost_as_zero() {
        let mut t = Totals::default();
        assert_eq!(t.text(None, None), "no model rounds");
        t.add(Some(&Usage {
            prompt_tokens: 1500,
            completion_tokens: 500,
            reasoning_tokens: None,
        }));
        t.add(Some(&Usage {
            prompt_tokens: 500,
            completion_tokens: 500,
            reasoning_tokens: None,
        }));
        assert_eq!(
            t.text(None, Some("openai:gpt-4.1")),
            "2 rounds · 2,000 in / 1,000 out tokens · cost unknown (no price for openai:gpt-4.1 in the catalog)"
        );
        let price = Price::new(2.0, 8.0);
        assert_eq!(
            t.text(price.as_ref(), None),
            "2 rounds · 2,000 in / 1,000 out tokens · $0.0120"
        );
        // A round answered from the cache is counted apart, and costs nothing this time.
        let mut cached = t;
        cached.add_cached(Some(&Usage {
            prompt_tokens: 500,
            completion_tokens: 500,
            reasoning_tokens: None,
        }));
        assert_eq!(
            cached.text(price.as_ref(), None),
            "2 rounds (1 cached) · 2,000 in / 1,000 out tokens · $0.0070 (cached rounds: $0.0050 not spent)"
        );
        t.add(None);
        assert_eq!(
            t.text(price.as_ref(), None),
            "3 rounds · 2,000 in / 1,000 out tokens (1 round unreported) · cost unknown (tokens not reported)"
        );
    }
}
