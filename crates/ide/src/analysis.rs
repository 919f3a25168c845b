//! One document's analysis (see the crate's opening).

use promptforge_syntax::frontmatter::VersionProblem;
use promptforge_syntax::heading_ref::{HeadingRef, parse_heading_ref};
use promptforge_syntax::{Outline, OutlineFence, ParseError, ParseErrorKind, Prompt, SectionId};

use crate::lua_lex::{Spanned, Token, tokens};
use crate::reference;

/// A place in the text: a 1-based line and a 1-based byte column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Pos {
    pub line: u32,
    pub col: u32,
}

/// A range of text, its end exclusive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    pub start: Pos,
    pub end: Pos,
}

impl Span {
    fn contains(&self, pos: Pos) -> bool {
        self.start <= pos && pos <= self.end
    }
}

/// How much a diagnostic matters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Severity {
    /// The prompt does not parse: a run fails.
    Error,
    /// A literal reference names nothing; the run fails there unless the call is caught.
    Warning,
}

impl Severity {
    /// `error` or `warning`.
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Error => "error",
            Severity::Warning => "warning",
        }
    }
}

/// A problem at a place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    pub span: Span,
    pub severity: Severity,
    /// The parse error kind (`Structure`, `Lua`, ...) or `Reference` for a warning.
    pub kind: String,
    pub message: String,
    /// Whether the parser gave no column (a Lua diagnostic): the span is then the whole line.
    pub whole_line: bool,
}

/// What a completion is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompletionKind {
    Section,
    Function,
    Field,
    Role,
    Tool,
    Arg,
    Key,
}

/// One completion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    pub label: String,
    pub kind: CompletionKind,
    pub detail: String,
    pub doc: String,
}

/// A heading and the sections under it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Symbol {
    pub name: String,
    pub level: u8,
    /// The heading line.
    pub selection: Span,
    /// The heading and everything under it.
    pub span: Span,
    pub children: Vec<Symbol>,
}

/// What a literal argument names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SiteKind {
    /// A heading reference (`call`, `jump`, `fanout`, `tasks.spawn`, `list_from_section`,
    /// `tools.allow_tasks`, each also as `pcall(f, ...)`; the `task` built-in's `target`).
    Section,
    /// A role label (`models.use`, `models.default`, `models.get`).
    Role,
    /// A tool alias offered or called (`tools.add`, `tools.always`, `tools.call`).
    Tool,
    /// A tool alias a local tool defines (`tools.add_local`).
    LocalTool,
}

/// A literal argument: which function takes it, its value, where it is written.
#[derive(Debug, Clone)]
struct Site {
    kind: SiteKind,
    function: String,
    value: String,
    /// The literal, quotes included.
    span: Span,
    closed: bool,
    /// The fence it is in (`None` for a `"target"` written in prose).
    fence: Option<usize>,
    /// Where the code (or the prose) that names it runs.
    place: Place,
    /// Written under `pcall(f, ...)`: the author expects it may fail (the spec's way to
    /// probe for a section), so it navigates but is never warned about.
    guarded: bool,
}

/// Where a fence's code runs: the H1 body (`None`), a section, or every section (shared).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    H1,
    Section(SectionId),
    Shared,
    /// Before the H1, or under a heading the prompt could not place.
    Nowhere,
}

/// One document's analysis.
#[derive(Debug)]
pub struct Analysis {
    lines: Vec<String>,
    outline: Outline,
    prompt: Option<Prompt>,
    problems: Vec<ParseError>,
    diagnostics: Vec<Diagnostic>,
    sites: Vec<Site>,
    places: Vec<Place>,
}

impl Analysis {
    /// Analyse a document.
    pub fn new(text: &str) -> Analysis {
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        let lines: Vec<String> = text
            .split('\n')
            .map(|l| l.strip_suffix('\r').unwrap_or(l).to_owned())
            .collect();
        let outline = Outline::of(text);
        let (prompt, problems) = Prompt::check_partial(text);
        let places = outline
            .fences
            .iter()
            .map(|fence| match fence.shared {
                true => Place::Shared,
                false => place_at(&outline, prompt.as_ref(), fence.open_line),
            })
            .collect();
        let mut analysis = Analysis {
            lines,
            outline,
            prompt,
            problems: Vec::new(),
            diagnostics: Vec::new(),
            sites: Vec::new(),
            places,
        };
        analysis.sites = analysis.find_sites();
        let mut diagnostics: Vec<Diagnostic> =
            problems.iter().map(|p| analysis.problem(p, text)).collect();
        analysis.problems = problems;
        diagnostics.extend(analysis.version_problem());
        let mut lines_with_errors: Vec<u32> =
            diagnostics.iter().map(|d| d.span.start.line).collect();
        lines_with_errors.sort_unstable();
        for warning in analysis.warnings() {
            if lines_with_errors
                .binary_search(&warning.span.start.line)
                .is_err()
            {
                diagnostics.push(warning);
            }
        }
        diagnostics.sort_by_key(|d| (d.span.start, d.severity == Severity::Warning));
        analysis.diagnostics = diagnostics;
        analysis
    }

    /// The parse problems as the parser reported them ([`Prompt::check_partial`]'s).
    pub fn problems(&self) -> &[ParseError] {
        &self.problems
    }

    /// The prompt, when the file parses with no problem at all.
    pub fn clean_prompt(&self) -> Option<&Prompt> {
        self.problems
            .is_empty()
            .then_some(self.prompt.as_ref())
            .flatten()
    }

    /// The prompt as far as it parses.
    pub fn prompt(&self) -> Option<&Prompt> {
        self.prompt.as_ref()
    }

    /// Every problem: the parse problems `check` reports, and warnings for literal references
    /// that name no section, no declared role or no declared tool.
    pub fn diagnostics(&self) -> &[Diagnostic] {
        &self.diagnostics
    }

    /// The text of a 1-based line.
    fn line(&self, line: u32) -> &str {
        line.checked_sub(1)
            .and_then(|i| self.lines.get(i as usize))
            .map_or("", String::as_str)
    }

    /// The span of a whole line.
    fn line_span(&self, line: u32) -> Span {
        let len = u32::try_from(self.line(line).len()).unwrap_or(u32::MAX);
        Span {
            start: Pos { line, col: 1 },
            end: Pos { line, col: len + 1 },
        }
    }

    /// A parse problem as a diagnostic: what it points at when known (a Lua diagnostic's
    /// `near` token, a structure problem's column to the end of its line), else its whole line.
    fn problem(&self, err: &ParseError, text: &str) -> Diagnostic {
        let (line, columns) = err
            .span_in(text)
            .unwrap_or((err.fault_line().unwrap_or(1), None));
        let mut span = self.line_span(line.max(1));
        if let Some((start, end)) = columns {
            span.start.col = start.min(span.end.col);
            // A problem with a column of its own names where something starts: the rest of
            // its line is what it is about (a heading, a key); a Lua token is just itself.
            if err.kind == ParseErrorKind::Lua {
                span.end.col = end.clamp(span.start.col, span.end.col.max(span.start.col));
            }
        }
        Diagnostic {
            span,
            severity: Severity::Error,
            kind: err.kind.to_string(),
            message: err.message.clone(),
            whole_line: columns.is_none(),
        }
    }

    /// Whether the frontmatter decoded (else the prompt was built under one that declares
    /// nothing, and what the file declares is unknown).
    fn frontmatter_decoded(&self) -> bool {
        !self
            .problems
            .iter()
            .any(|p| p.kind == ParseErrorKind::Frontmatter)
    }

    /// The first step's refusal of a file that parses (`check` reports it too): no
    /// `promptforge:` key (at the opening `---`), or a major this build does not run (at the
    /// value). Only when the frontmatter decoded, so it never doubles a frontmatter error.
    fn version_problem(&self) -> Option<Diagnostic> {
        let prompt = self.prompt.as_ref()?;
        if !self.frontmatter_decoded() {
            return None;
        }
        let problem = prompt.frontmatter.version_check().err()?;
        let (span, kind, whole_line) = match &problem {
            VersionProblem::Missing => (
                self.line_span(self.outline.frontmatter.map_or(1, |(open, _)| open)),
                "Structure",
                true,
            ),
            VersionProblem::Unsupported(version) => {
                let mut span = self.line_span(version.line);
                span.start.col = version.column.min(span.end.col);
                (span, "Version", false)
            }
        };
        Some(Diagnostic {
            span,
            severity: Severity::Error,
            kind: kind.to_owned(),
            message: problem.message(),
            whole_line,
        })
    }

    /// Every literal argument of the calls that name sections, roles and tools.
    fn find_sites(&self) -> Vec<Site> {
        let mut sites = Vec::new();
        for (index, fence) in self.outline.fences.iter().enumerate() {
            let toks = tokens(&fence.source);
            let starts = line_starts(&fence.source);
            let pos_of = |offset: usize| -> Pos {
                let row = starts.partition_point(|s| *s <= offset).saturating_sub(1);
                let col = offset - starts.get(row).copied().unwrap_or(0);
                Pos {
                    line: fence.open_line + 1 + u32::try_from(row).unwrap_or(0),
                    col: u32::try_from(col + 1).unwrap_or(u32::MAX),
                }
            };
            let place = self.places.get(index).copied().unwrap_or(Place::Nowhere);
            let mut push = |kind: SiteKind, function: &str, literal: &Spanned, guarded: bool| {
                let Token::Str { value, closed } = &literal.token else {
                    return;
                };
                sites.push(Site {
                    kind,
                    function: function.to_owned(),
                    value: value.clone(),
                    span: Span {
                        start: pos_of(literal.start),
                        end: pos_of(literal.end),
                    },
                    closed: *closed,
                    fence: Some(index),
                    place,
                    guarded,
                });
            };
            let mut i = 0;
            while i < toks.len() {
                // `target = '## X'` in a table: the `task` built-in's argument, as a test
                // double or a scripted reply writes it.
                if let (Some(Token::Name(name)), Some(Token::Punct('=')), Some(literal)) = (
                    toks.get(i).map(|t| &t.token),
                    toks.get(i + 1).map(|t| &t.token),
                    toks.get(i + 2),
                ) && name == "target"
                    && i > 0
                    && matches!(
                        toks[i - 1].token,
                        Token::Punct('{') | Token::Punct(',') | Token::Punct(';')
                    )
                    && matches!(
                        toks.get(i + 3).map(|t| &t.token),
                        None | Some(Token::Punct(',' | ';' | '}'))
                    )
                {
                    push(SiteKind::Section, "task", literal, false);
                    i += 3;
                    continue;
                }
                let Some((function, after)) = dotted_path(&toks, i) else {
                    i += 1;
                    continue;
                };
                // `pcall(call, '## X')`: the protected call's function and its first argument.
                if function == "pcall"
                    && toks.get(after).map(|t| &t.token) == Some(&Token::Punct('('))
                    && let Some((inner, inner_after)) = dotted_path(&toks, after + 1)
                    && toks.get(inner_after).map(|t| &t.token) == Some(&Token::Punct(','))
                    && let Some(kind) = site_kind(&inner)
                {
                    for literal in first_argument(&toks, inner_after + 1) {
                        push(kind, &inner, literal, true);
                    }
                    i = inner_after + 1;
                    continue;
                }
                let Some(kind) = site_kind(&function) else {
                    i = after.max(i + 1);
                    continue;
                };
                for literal in first_argument(&toks, after) {
                    push(kind, &function, literal, false);
                }
                i = after;
            }
        }
        sites.extend(self.prose_targets());
        sites.sort_by_key(|s| s.span.start);
        sites
    }

    /// `"target": "## X"` written in prose (the `task` built-in's arguments, as a prompt shows
    /// the model how to call it): a section reference resolved from the section it is in.
    fn prose_targets(&self) -> Vec<Site> {
        let in_fence = |line: u32| {
            self.outline
                .fences
                .iter()
                .any(|f| line >= f.open_line && line <= f.close_line.max(f.open_line))
        };
        let in_frontmatter = |line: u32| {
            self.outline
                .frontmatter
                .is_some_and(|(open, close)| line >= open && line <= close)
        };
        let mut sites = Vec::new();
        for (index, text) in self.lines.iter().enumerate() {
            let line = u32::try_from(index + 1).unwrap_or(u32::MAX);
            if !text.contains("\"target\"") || in_fence(line) || in_frontmatter(line) {
                continue;
            }
            let mut from = 0;
            while let Some(found) = text[from..].find("\"target\"") {
                let key_end = from + found + "\"target\"".len();
                from = key_end;
                let rest = &text[key_end..];
                let Some(after_colon) = rest.trim_start().strip_prefix(':') else {
                    continue;
                };
                let value = after_colon.trim_start();
                let Some(body) = value.strip_prefix('"') else {
                    continue;
                };
                let open = text.len() - value.len();
                let (inner, closed) = match body.find('"') {
                    Some(end) => (&body[..end], true),
                    None => (body, false),
                };
                let close = open + 1 + inner.len() + usize::from(closed);
                let col = |byte: usize| u32::try_from(byte + 1).unwrap_or(u32::MAX);
                sites.push(Site {
                    kind: SiteKind::Section,
                    function: "task".to_owned(),
                    value: inner.to_owned(),
                    span: Span {
                        start: Pos {
                            line,
                            col: col(open),
                        },
                        end: Pos {
                            line,
                            col: col(close),
                        },
                    },
                    closed,
                    fence: None,
                    place: place_at(&self.outline, self.prompt.as_ref(), line),
                    guarded: false,
                });
                from = close;
            }
        }
        sites
    }

    /// The warnings for literal references that name nothing.
    fn warnings(&self) -> Vec<Diagnostic> {
        let Some(prompt) = &self.prompt else {
            return Vec::new();
        };
        // While the frontmatter does not decode, what it declares is unknown: only section
        // references are checked.
        let declarations_known = self.frontmatter_decoded();
        let fm = &prompt.frontmatter;
        let roles: Vec<&str> = fm.models.iter().map(|r| r.label.as_str()).collect();
        let tools: Vec<&str> = fm.tools.iter().map(|t| t.alias.as_str()).collect();
        let locals: Vec<&str> = self
            .sites
            .iter()
            .filter(|s| s.kind == SiteKind::LocalTool)
            .map(|s| s.value.as_str())
            .collect();
        let mut out = Vec::new();
        let mut warn = |span: Span, message: String| {
            out.push(Diagnostic {
                span,
                severity: Severity::Warning,
                kind: "Reference".to_owned(),
                message,
                whole_line: false,
            });
        };
        for site in self.sites.iter().filter(|s| s.closed && !s.guarded) {
            match site.kind {
                SiteKind::Section => {
                    if let Some(message) = self.section_problem(prompt, site) {
                        warn(site.span, message);
                    }
                }
                SiteKind::Role if site.function != "models.get" && declarations_known => {
                    if !roles.contains(&site.value.as_str()) {
                        warn(
                            site.span,
                            format!(
                                "model role `{}` is not declared under `models:`{}",
                                site.value,
                                suggestion(&site.value, &roles, "declared roles")
                            ),
                        );
                    }
                }
                SiteKind::Tool if declarations_known => {
                    let declared = tools.contains(&site.value.as_str());
                    let local =
                        site.function == "tools.call" && locals.contains(&site.value.as_str());
                    if !declared && !local {
                        warn(
                            site.span,
                            format!(
                                "tool alias `{}` is not declared under `tools:`{}",
                                site.value,
                                suggestion(&site.value, &tools, "declared aliases")
                            ),
                        );
                    }
                }
                SiteKind::Role | SiteKind::Tool | SiteKind::LocalTool => {}
            }
        }
        out
    }

    /// Why a section reference names nothing where it is written, if it does not.
    fn section_problem(&self, prompt: &Prompt, site: &Site) -> Option<String> {
        let reference = match parse_heading_ref(&site.value) {
            Ok(reference) => reference,
            // A `target` field may be any table's (`#ops`, `#fff`): only one written as a
            // heading is checked.
            Err(_) if site.function == "task" => return None,
            Err(err) => return Some(err.to_string()),
        };
        let place = site.place;
        match place {
            Place::Nowhere => None,
            // Shared code runs in every section: only a name no heading has is a mistake.
            Place::Shared => {
                let anywhere: Vec<String> =
                    prompt.sections.iter().map(|s| s.heading_ref()).collect();
                let found = prompt
                    .sections
                    .iter()
                    .any(|s| usize::from(s.level) == reference.level && s.name == reference.name);
                (!found).then(|| {
                    format!(
                        "no section has the heading `{reference}`{}",
                        suggestion(
                            &reference.to_string(),
                            &anywhere.iter().map(String::as_str).collect::<Vec<_>>(),
                            "sections"
                        )
                    )
                })
            }
            Place::H1 | Place::Section(_) => {
                let at = match place {
                    Place::Section(id) => Some(id),
                    _ => None,
                };
                if prompt.resolve_from(at, &reference).is_some() {
                    return None;
                }
                let visible: Vec<String> = prompt
                    .visible_from(at)
                    .iter()
                    .filter_map(|id| prompt.section(*id).map(|s| s.heading_ref()))
                    .collect();
                let from = match at.and_then(|id| prompt.section(id)) {
                    Some(section) => format!("section `{}`", section.name),
                    None => "the H1 body".to_owned(),
                };
                Some(format!(
                    "section heading `{reference}` is not visible from {from}{}",
                    suggestion(
                        &reference.to_string(),
                        &visible.iter().map(String::as_str).collect::<Vec<_>>(),
                        "visible sections"
                    )
                ))
            }
        }
    }

    /// The section a site names, if it resolves.
    fn target_of(&self, site: &Site) -> Option<SectionId> {
        let prompt = self.prompt.as_ref()?;
        let reference = parse_heading_ref(&site.value).ok()?;
        match site.place {
            Place::H1 => prompt.resolve_from(None, &reference),
            Place::Section(id) => prompt.resolve_from(Some(id), &reference),
            Place::Shared => unique_heading(prompt, &reference),
            Place::Nowhere => None,
        }
    }

    /// The heading line of a section.
    fn heading_span(&self, id: SectionId) -> Option<Span> {
        let section = self.prompt.as_ref()?.section(id)?;
        Some(self.line_span(section.line))
    }

    /// Go to definition: from a section reference to its heading.
    pub fn definition(&self, pos: Pos) -> Option<Span> {
        let site = self
            .sites
            .iter()
            .find(|s| s.kind == SiteKind::Section && s.span.contains(pos))?;
        self.heading_span(self.target_of(site)?)
    }

    /// Find references: from a heading (or a reference to it), every literal that names that
    /// section, with the heading first.
    pub fn references(&self, pos: Pos) -> Vec<Span> {
        let prompt = match &self.prompt {
            Some(prompt) => prompt,
            None => return Vec::new(),
        };
        let target = prompt
            .sections
            .iter()
            .position(|s| s.line == pos.line)
            .map(SectionId)
            .or_else(|| {
                self.sites
                    .iter()
                    .find(|s| s.kind == SiteKind::Section && s.span.contains(pos))
                    .and_then(|s| self.target_of(s))
            });
        let Some(target) = target else {
            return Vec::new();
        };
        self.heading_span(target)
            .into_iter()
            .chain(
                self.sites
                    .iter()
                    .filter(|s| s.kind == SiteKind::Section && self.target_of(s) == Some(target))
                    .map(|s| s.span),
            )
            .collect()
    }

    /// Completions at `pos`.
    pub fn completion(&self, pos: Pos) -> Vec<Completion> {
        if let Some((start, end)) = self.outline.frontmatter
            && pos.line > start
            && pos.line < end
        {
            return self.frontmatter_completion(pos);
        }
        let Some((index, fence)) = self.outline.fences.iter().enumerate().find(|(_, f)| {
            pos.line > f.open_line
                && pos.line < f.close_line.max(f.open_line + 1) + u32::from(!f.closed)
        }) else {
            return Vec::new();
        };
        // Inside a literal argument: what it names.
        if let Some(site) = self.sites.iter().find(|s| {
            s.fence == Some(index)
                && s.span.start < pos
                && (pos < s.span.end || (!s.closed && pos <= s.span.end))
        }) {
            return self.site_completion(site);
        }
        // The code up to the cursor, for `ns.` and a partial name.
        let before = self.code_before(fence, pos);
        let toks = tokens(&before);
        let mut n = toks.len();
        if matches!(toks.last().map(|t| &t.token), Some(Token::Name(_)))
            && toks.last().is_some_and(|t| t.end == before.len())
        {
            n -= 1;
        }
        if n >= 2
            && toks[n - 1].token == Token::Punct('.')
            && let Token::Name(ns) = &toks[n - 2].token
        {
            if ns == "argv" {
                return self.arg_completion();
            }
            return reference::members(ns)
                .unwrap_or(&[])
                .iter()
                .map(|m| Completion {
                    label: m.name.to_owned(),
                    kind: if m.form.contains('(') {
                        CompletionKind::Function
                    } else {
                        CompletionKind::Field
                    },
                    detail: m.form.to_owned(),
                    doc: m.doc.to_owned(),
                })
                .collect();
        }
        let mut out: Vec<Completion> = reference::GLOBALS
            .iter()
            .map(|g| Completion {
                label: g.name.to_owned(),
                kind: CompletionKind::Function,
                detail: g.form.to_owned(),
                doc: g.doc.to_owned(),
            })
            .collect();
        if let Some(prompt) = &self.prompt {
            out.extend(prompt.frontmatter.models.iter().map(|r| Completion {
                label: r.label.clone(),
                kind: CompletionKind::Role,
                detail: "model handle".to_owned(),
                doc: r.description.clone().unwrap_or_default(),
            }));
            out.extend(prompt.frontmatter.tools.iter().map(|t| Completion {
                label: t.alias.clone(),
                kind: CompletionKind::Tool,
                detail: format!("Tool object: {}", t.path),
                doc: String::new(),
            }));
        }
        out
    }

    /// The fence's code from its start to `pos`.
    fn code_before(&self, fence: &OutlineFence, pos: Pos) -> String {
        let mut code = String::new();
        for line in fence.open_line + 1..pos.line {
            code.push_str(self.line(line));
            code.push('\n');
        }
        let current = self.line(pos.line);
        let cut = usize::try_from(pos.col.saturating_sub(1))
            .unwrap_or(0)
            .min(current.len());
        let cut = (0..=cut)
            .rev()
            .find(|i| current.is_char_boundary(*i))
            .unwrap_or(0);
        code.push_str(&current[..cut]);
        code
    }

    fn site_completion(&self, site: &Site) -> Vec<Completion> {
        let Some(prompt) = &self.prompt else {
            return Vec::new();
        };
        match site.kind {
            SiteKind::Section => {
                let ids: Vec<SectionId> = match site.place {
                    Place::H1 => prompt.visible_from(None),
                    Place::Section(id) => prompt.visible_from(Some(id)),
                    Place::Shared => (0..prompt.sections.len()).map(SectionId).collect(),
                    Place::Nowhere => Vec::new(),
                };
                ids.iter()
                    .filter_map(|id| prompt.section(*id))
                    .map(|s| Completion {
                        label: s.heading_ref(),
                        kind: CompletionKind::Section,
                        detail: format!("line {}", s.line),
                        doc: first_prose_line(s).unwrap_or_default(),
                    })
                    .collect()
            }
            SiteKind::Role => prompt
                .frontmatter
                .models
                .iter()
                .map(|r| Completion {
                    label: r.label.clone(),
                    kind: CompletionKind::Role,
                    detail: "model role".to_owned(),
                    doc: r.description.clone().unwrap_or_default(),
                })
                .collect(),
            SiteKind::Tool => prompt
                .frontmatter
                .tools
                .iter()
                .map(|t| Completion {
                    label: t.alias.clone(),
                    kind: CompletionKind::Tool,
                    detail: t.path.clone(),
                    doc: String::new(),
                })
                .collect(),
            SiteKind::LocalTool => Vec::new(),
        }
    }

    fn arg_completion(&self) -> Vec<Completion> {
        let Some(prompt) = &self.prompt else {
            return Vec::new();
        };
        prompt
            .frontmatter
            .args
            .args
            .iter()
            .map(|a| Completion {
                label: a.name.clone(),
                kind: CompletionKind::Arg,
                detail: format!(
                    "{}{}",
                    a.ty.as_str(),
                    if a.optional { ", optional" } else { "" }
                ),
                doc: a.description.clone().unwrap_or_default(),
            })
            .collect()
    }

    /// The keys that fit where the cursor is in the frontmatter.
    fn frontmatter_completion(&self, pos: Pos) -> Vec<Completion> {
        let parent = self.frontmatter_parent(pos.line);
        reference::frontmatter_keys(&parent)
            .iter()
            .map(|k| Completion {
                label: k.name.to_owned(),
                kind: CompletionKind::Key,
                detail: k.form.to_owned(),
                doc: k.doc.to_owned(),
            })
            .collect()
    }

    /// Which key group a frontmatter line belongs to: `""` at the top level, else the
    /// top-level key whose declarations it is in (`models`, `args`, `input`, `output`,
    /// `plugins`). Under `models:` and `args:` the first level holds the author's own labels
    /// and names, so a line there gets no group (no key fits it); their keys are one level in.
    fn frontmatter_parent(&self, line: u32) -> String {
        let indent = |text: &str| text.len() - text.trim_start().len();
        let own = indent(self.line(line));
        if own == 0 && !self.line(line).trim_start().starts_with('-') {
            return String::new();
        }
        let start = self.outline.frontmatter.map_or(1, |(s, _)| s);
        let Some(key_line) = (start + 1..line)
            .rev()
            .find(|l| !self.line(*l).trim().is_empty() && indent(self.line(*l)) == 0)
        else {
            return String::new();
        };
        let key = self
            .line(key_line)
            .split(':')
            .next()
            .map(|key| key.trim().to_owned())
            .unwrap_or_default();
        if key == "models" || key == "args" {
            let label_indent = (key_line + 1..line)
                .map(|l| self.line(l))
                .find(|text| !text.trim().is_empty())
                .map_or(own, indent);
            if own <= label_indent {
                return format!("{key} label");
            }
        }
        key
    }

    /// A hover's markdown at `pos`.
    pub fn hover(&self, pos: Pos) -> Option<String> {
        if let Some(site) = self
            .sites
            .iter()
            .find(|s| s.kind == SiteKind::Section && s.span.contains(pos))
        {
            let section = self.prompt.as_ref()?.section(self.target_of(site)?)?;
            let mut text = format!("**{}** (line {})", section.heading_ref(), section.line);
            if let Some(line) = first_prose_line(section) {
                text.push_str("\n\n");
                text.push_str(&line);
            }
            return Some(text);
        }
        if let Some((start, end)) = self.outline.frontmatter
            && pos.line > start
            && pos.line < end
        {
            let line = self.line(pos.line);
            let key = line
                .trim_start()
                .trim_start_matches("- ")
                .split(':')
                .next()?
                .trim();
            let parent = self.frontmatter_parent(pos.line);
            let entry = reference::frontmatter_keys(&parent)
                .iter()
                .find(|k| k.name == key)?;
            return Some(format!("`{}`\n\n{}", entry.form, entry.doc));
        }
        let fence = self.outline.fence_at(pos.line)?;
        let line = self.line(pos.line);
        let toks = tokens(line);
        let at = usize::try_from(pos.col.saturating_sub(1)).unwrap_or(0);
        let index = toks
            .iter()
            .position(|t| t.start <= at && at <= t.end && matches!(t.token, Token::Name(_)))?;
        let Token::Name(name) = &toks[index].token else {
            return None;
        };
        let _ = fence;
        let entry = match (
            index
                .checked_sub(2)
                .map(|i| (&toks[i].token, &toks[i + 1].token)),
            name,
        ) {
            (Some((Token::Name(ns), Token::Punct('.'))), name) => reference::members(ns)
                .and_then(|m| m.iter().find(|e| e.name == name))
                .copied(),
            (_, name) => reference::GLOBALS.iter().find(|g| g.name == name).copied(),
        }?;
        Some(format!("```lua\n{}\n```\n{}", entry.form, entry.doc))
    }

    /// The H1 and every section, nested by level.
    pub fn symbols(&self) -> Vec<Symbol> {
        let last = self.outline.lines.max(1);
        let headings = &self.outline.headings;
        let mut flat: Vec<Symbol> = headings
            .iter()
            .enumerate()
            .map(|(i, h)| {
                let end_line = headings[i + 1..]
                    .iter()
                    .find(|next| next.level <= h.level)
                    .map_or(last, |next| next.line.saturating_sub(1).max(h.line));
                let end = self.line_span(end_line).end;
                Symbol {
                    name: h.name.clone(),
                    level: h.level,
                    selection: self.line_span(h.line),
                    span: Span {
                        start: Pos {
                            line: h.line,
                            col: 1,
                        },
                        end,
                    },
                    children: Vec::new(),
                }
            })
            .collect();
        // Nest: each symbol goes under the nearest open one of a lower level.
        let mut roots: Vec<Symbol> = Vec::new();
        let mut stack: Vec<Symbol> = Vec::new();
        for symbol in flat.drain(..) {
            while stack.last().is_some_and(|top| top.level >= symbol.level) {
                if let Some(done) = stack.pop() {
                    attach(&mut stack, &mut roots, done);
                }
            }
            stack.push(symbol);
        }
        while let Some(done) = stack.pop() {
            attach(&mut stack, &mut roots, done);
        }
        roots
    }

    /// Folding ranges as (first line, last line): the frontmatter, each heading's part, and
    /// each fence.
    pub fn folding(&self) -> Vec<(u32, u32)> {
        let mut out = Vec::new();
        if let Some(range) = self.outline.frontmatter {
            out.push(range);
        }
        fn walk(symbols: &[Symbol], out: &mut Vec<(u32, u32)>) {
            for s in symbols {
                if s.span.end.line > s.span.start.line {
                    out.push((s.span.start.line, s.span.end.line));
                }
                walk(&s.children, out);
            }
        }
        walk(&self.symbols(), &mut out);
        out.extend(
            self.outline
                .fences
                .iter()
                .filter(|f| f.close_line > f.open_line)
                .map(|f| (f.open_line, f.close_line)),
        );
        out.sort_unstable();
        out
    }
}

fn attach(stack: &mut [Symbol], roots: &mut Vec<Symbol>, done: Symbol) {
    match stack.last_mut() {
        Some(parent) => parent.children.push(done),
        None => roots.push(done),
    }
}

/// What a function's literal first argument names, for the functions that take one.
fn site_kind(function: &str) -> Option<SiteKind> {
    match function {
        "call" | "jump" | "fanout" | "tasks.spawn" | "list_from_section" | "tools.allow_tasks" => {
            Some(SiteKind::Section)
        }
        "models.use" | "models.default" | "models.get" => Some(SiteKind::Role),
        "tools.add" | "tools.always" | "tools.call" => Some(SiteKind::Tool),
        "tools.add_local" => Some(SiteKind::LocalTool),
        _ => None,
    }
}

/// Where code or prose on a line runs: the H1 body, the section under whose heading it is,
/// or nowhere (before the H1, under a heading the prompt could not place).
fn place_at(outline: &Outline, prompt: Option<&Prompt>, line: u32) -> Place {
    let (Some(heading), Some(prompt)) = (outline.heading_at(line), prompt) else {
        return Place::Nowhere;
    };
    if heading.level == 1 {
        return if heading.line == prompt.title_line {
            Place::H1
        } else {
            Place::Nowhere
        };
    }
    // The section arena is in file order: a binary search, not a scan per fence.
    prompt
        .sections
        .binary_search_by_key(&heading.line, |s| s.line)
        .ok()
        .map_or(Place::Nowhere, |i| Place::Section(SectionId(i)))
}

/// The section of the whole prompt with this heading, when exactly one has it.
fn unique_heading(prompt: &Prompt, reference: &HeadingRef) -> Option<SectionId> {
    let mut found = prompt
        .sections
        .iter()
        .enumerate()
        .filter(|(_, s)| usize::from(s.level) == reference.level && s.name == reference.name);
    let first = found.next()?;
    found.next().is_none().then_some(SectionId(first.0))
}

/// A section's first line of prose, for a hover.
fn first_prose_line(section: &promptforge_syntax::Section) -> Option<String> {
    section.blocks.iter().find_map(|b| match b {
        promptforge_syntax::Block::Prose(p) => p
            .text
            .lines()
            .map(str::trim)
            .find(|l| !l.is_empty())
            .map(str::to_owned),
        promptforge_syntax::Block::Lua(_) => None,
    })
}

/// `; did you mean `x`?` for the nearest of `names`, or `; {what}: a, b` when none is near
/// (nothing when there are none).
fn suggestion(name: &str, names: &[&str], what: &str) -> String {
    let nearest = names
        .iter()
        .map(|n| (strsim::levenshtein(name, n), *n))
        .filter(|(d, n)| *d <= (n.chars().count() / 3).max(2))
        .min_by_key(|(d, _)| *d);
    // A long list is cut: a message is read in a hover or a terminal line.
    const LISTED: usize = 12;
    match nearest {
        Some((_, n)) => format!("; did you mean `{n}`?"),
        None if names.is_empty() => String::new(),
        None if names.len() > LISTED => format!(
            "; {what}: {}, and {} more",
            names[..LISTED].join(", "),
            names.len() - LISTED
        ),
        None => format!("; {what}: {}", names.join(", ")),
    }
}

/// Byte offsets where each line of `source` starts.
fn line_starts(source: &str) -> Vec<usize> {
    std::iter::once(0)
        .chain(source.match_indices('\n').map(|(i, _)| i + 1))
        .collect()
}

/// A dotted name starting at token `i` (`tasks.spawn`), and the index after it.
fn dotted_path(toks: &[Spanned], i: usize) -> Option<(String, usize)> {
    let Token::Name(first) = &toks.get(i)?.token else {
        return None;
    };
    // A name right after `.` or `:` is a member of something else.
    if i > 0 && matches!(toks[i - 1].token, Token::Punct('.') | Token::Punct(':')) {
        return None;
    }
    let mut path = first.clone();
    let mut j = i + 1;
    while let (Some(Token::Punct('.')), Some(Token::Name(next))) = (
        toks.get(j).map(|t| &t.token),
        toks.get(j + 1).map(|t| &t.token),
    ) {
        path.push('.');
        path.push_str(next);
        j += 2;
    }
    Some((path, j))
}

/// The string literals of a call's first argument at token `i`: `f('x')`, `f 'x'`, `f{...}`,
/// `f({'x', 'y'})`.
fn first_argument(toks: &[Spanned], i: usize) -> Vec<&Spanned> {
    let mut j = i;
    match toks.get(j).map(|t| &t.token) {
        Some(Token::Str { .. }) => return vec![&toks[j]],
        Some(Token::Punct('(')) => j += 1,
        Some(Token::Punct('{')) => {}
        _ => return Vec::new(),
    }
    match toks.get(j).map(|t| &t.token) {
        Some(Token::Str { .. }) => vec![&toks[j]],
        Some(Token::Punct('{')) => toks[j + 1..]
            .iter()
            .take_while(|t| t.token != Token::Punct('}'))
            .filter(|t| matches!(t.token, Token::Str { .. }))
            .collect(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests;
