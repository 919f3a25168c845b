//! The parsed prompt: frontmatter contract, H1 title and body, the section tree with its blocks
//! and list items, and every Lua region compiled. [`Prompt::parse`] is the whole file grammar of
//! chapters 01-03; it runs nothing.

use std::collections::HashMap;

use crate::compile::{Compiler, LuaRegion};
use crate::error::{ParseError, ParseErrorKind};
use crate::frontmatter::{Frontmatter, parse_frontmatter};
use crate::scan::{self, FenceEnd, Item};

/// Index of a section in [`Prompt::sections`] (file order).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SectionId(pub usize);

/// A prose block: Markdown text between fences, trimmed of surrounding blank lines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProseBlock {
    /// The raw Markdown (placeholders unrendered). Empty between back-to-back fences.
    pub text: String,
    /// The file line of the block's first text line (or of the fence that follows, if empty).
    pub line: u32,
}

/// One block of the H1 body or of a section, in file order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Block {
    /// Markdown prose: read by the next Lua block as `prose`, or commentary if none follows.
    Prose(ProseBlock),
    /// A compiled `lua` fence.
    Lua(LuaRegion),
}

impl Block {
    /// The Lua region, if this is a Lua block.
    pub fn as_lua(&self) -> Option<&LuaRegion> {
        match self {
            Block::Lua(region) => Some(region),
            Block::Prose(_) => None,
        }
    }
}

/// A section: a `##`..`######` heading and the content up to the next heading.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Section {
    /// The heading text with markup stripped and whitespace trimmed.
    pub name: String,
    /// The heading level, 2 to 6.
    pub level: u8,
    /// The heading's file line.
    pub line: u32,
    /// The parent section; `None` for a top-level (H2) section.
    pub parent: Option<SectionId>,
    /// Child sections in file order.
    pub children: Vec<SectionId>,
    /// The section's own blocks (its content before its first child heading).
    pub blocks: Vec<Block>,
    /// The items of a list section, parsed at load; `None` for any other section.
    pub items: Option<Vec<String>>,
}

impl Section {
    /// The section's heading reference, e.g. `## Main`.
    pub fn heading_ref(&self) -> String {
        format!("{} {}", "#".repeat(usize::from(self.level)), self.name)
    }

    /// The Lua blocks of the section, in order.
    pub fn lua_blocks(&self) -> impl Iterator<Item = &LuaRegion> {
        self.blocks.iter().filter_map(Block::as_lua)
    }
}

/// A parsed prompt file.
#[derive(Debug, Clone, PartialEq)]
pub struct Prompt {
    /// The frontmatter contract.
    pub frontmatter: Frontmatter,
    /// The H1 title (markup stripped, trimmed).
    pub title: String,
    /// The file line of the H1 heading.
    pub title_line: u32,
    /// The shared library from the H1 body's `lua shared` fence, if any.
    pub shared: Option<LuaRegion>,
    /// The H1 body's own blocks.
    pub h1_blocks: Vec<Block>,
    /// All sections in file order; the tree is formed by `parent`/`children`.
    pub sections: Vec<Section>,
    /// The top-level (H2) sections in file order.
    pub top_level: Vec<SectionId>,
}

impl Prompt {
    /// Parse a whole prompt file. Nothing runs; every Lua region is compiled.
    pub fn parse(source: &str) -> Result<Prompt, ParseError> {
        let parser = Parser::new(source, false);
        match parser.parse() {
            Ok(Some(prompt)) => Ok(prompt),
            Ok(None) => Err(ParseError::new(
                ParseErrorKind::Frontmatter,
                "the frontmatter could not be read",
            )),
            Err(err) => Err(err),
        }
    }

    /// Every independent problem of a prompt file, for `check` and editors: `Err` holds each
    /// one (at most one per line), ordered by line with problems that have none first.
    /// Where [`Prompt::parse`] stops at the first failure in the spec's order, this goes on
    /// past each one it can step over (a duplicate heading is still a section, an unclosed
    /// fence is not compiled, a frontmatter failure does not stop the body's checks) and
    /// compiles every closed fence. The first problem in the spec's order is always among them.
    pub fn check(source: &str) -> Result<Prompt, Vec<ParseError>> {
        match Prompt::check_partial(source) {
            (Some(prompt), problems) if problems.is_empty() => Ok(prompt),
            (_, problems) => Err(problems),
        }
    }

    /// [`Prompt::check`]'s problems, with the prompt as far as it could be built beside them
    /// (an editor still navigates a file while it has problems): `None` only when the body's
    /// frame (the H1, the delimiters) failed. A frontmatter that failed to decode leaves the
    /// body parsed under [`Frontmatter::undecoded`], which declares nothing.
    pub fn check_partial(source: &str) -> (Option<Prompt>, Vec<ParseError>) {
        let parser = Parser::new(source, true);
        let result = parser.parse();
        let mut problems = parser.problems.into_inner();
        let prompt = match result {
            Ok(prompt) => prompt,
            Err(err) => {
                problems.push(err);
                None
            }
        };
        // The first problem reported on a line is the one kept, so the problem `parse` would
        // report (always reported first) is never dropped. A Lua diagnostic is at the fault
        // line its text names.
        let mut lines = std::collections::HashSet::new();
        problems.retain(|p| p.fault_line().is_none() || lines.insert(p.fault_line()));
        problems.sort_by_key(|p| (p.fault_line().is_some(), p.fault_line(), p.column));
        (prompt, problems)
    }

    /// The sibling list under `parent` (the top level for `None`).
    pub fn siblings(&self, parent: Option<SectionId>) -> &[SectionId] {
        match parent {
            Some(parent) => self
                .section(parent)
                .map_or(&[][..], |p| p.children.as_slice()),
            None => &self.top_level,
        }
    }

    /// The sections visible from a place (chapter 08): from the H1 (`None`), the top level;
    /// from a section, its siblings (not itself) and then its children. A `call`, `jump`,
    /// spawn or fanout resolves its target against these.
    pub fn visible_from(&self, place: Option<SectionId>) -> Vec<SectionId> {
        match place {
            None => self.top_level.clone(),
            Some(id) => {
                let Some(section) = self.section(id) else {
                    return Vec::new();
                };
                self.siblings(section.parent)
                    .iter()
                    .filter(|s| **s != id)
                    .chain(section.children.iter())
                    .copied()
                    .collect()
            }
        }
    }

    /// The section a heading reference names among those visible from `place`.
    pub fn resolve_from(
        &self,
        place: Option<SectionId>,
        reference: &crate::heading_ref::HeadingRef,
    ) -> Option<SectionId> {
        self.visible_from(place).into_iter().find(|id| {
            self.section(*id).is_some_and(|s| {
                usize::from(s.level) == reference.level && s.name == reference.name
            })
        })
    }

    /// The section with this id.
    pub fn section(&self, id: SectionId) -> Option<&Section> {
        self.sections.get(id.0)
    }

    /// Every Lua region in file order (shared library included).
    pub fn lua_regions(&self) -> impl Iterator<Item = &LuaRegion> {
        self.shared
            .iter()
            .chain(self.h1_blocks.iter().filter_map(Block::as_lua))
            .chain(self.sections.iter().flat_map(Section::lua_blocks))
    }
}

/// The text of a heading with inline markup reduced to its text, as CommonMark renders it:
/// code spans keep their content without backticks, emphasis and links keep only their text.
pub fn heading_text(raw: &str) -> String {
    use pulldown_cmark::{Event, Parser as Md, Tag, TagEnd};
    // Parse as an ATX heading so the text is never read as a list or other block.
    let source = format!("# {raw}");
    let mut text = String::new();
    let mut in_heading = false;
    for event in Md::new(&source) {
        match event {
            Event::Start(Tag::Heading { .. }) => in_heading = true,
            Event::End(TagEnd::Heading(_)) => in_heading = false,
            Event::Text(t) | Event::Code(t) if in_heading => text.push_str(&t),
            Event::SoftBreak | Event::HardBreak if in_heading => text.push(' '),
            _ => {}
        }
    }
    text.trim().to_owned()
}

/// Join text lines and trim the blank lines around them.
fn prose_text(lines: &[(u32, &str)]) -> (String, Option<u32>) {
    let start = lines.iter().position(|(_, l)| !l.trim().is_empty());
    let end = lines.iter().rposition(|(_, l)| !l.trim().is_empty());
    match (start, end) {
        (Some(s), Some(e)) => {
            let text = lines[s..=e]
                .iter()
                .map(|(_, l)| *l)
                .collect::<Vec<_>>()
                .join("\n");
            (text, Some(lines[s].0))
        }
        _ => (String::new(), None),
    }
}

/// Which part of the body a run of items belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    Notes,
    H1,
    Section(usize),
}

struct Parser<'a> {
    source: &'a str,
    /// Whether problems are collected and stepped over (`Prompt::check`) rather than the
    /// first one returned (`Prompt::parse`).
    collect: bool,
    problems: std::cell::RefCell<Vec<ParseError>>,
}

/// A heading found in the body, with its extracted name.
struct HeadingInfo {
    level: u8,
    name: String,
    line: u32,
    /// The 1-based byte column where the heading starts.
    column: u32,
    item: usize,
}

impl<'a> Parser<'a> {
    fn new(source: &'a str, collect: bool) -> Self {
        Parser {
            source: source.strip_prefix('\u{feff}').unwrap_or(source),
            collect,
            problems: std::cell::RefCell::new(Vec::new()),
        }
    }

    /// A problem the parse can step over: the error itself when parsing, kept when checking.
    fn report(&self, err: ParseError) -> Result<(), ParseError> {
        if self.collect {
            self.problems.borrow_mut().push(err);
            Ok(())
        } else {
            Err(err)
        }
    }

    /// The prompt, or `None` when checking a file whose frontmatter failed (its body checked).
    fn parse(&self) -> Result<Option<Prompt>, ParseError> {
        let lines: Vec<(u32, &str)> = self
            .source
            .split('\n')
            .enumerate()
            .map(|(i, l)| {
                let number = u32::try_from(i + 1).unwrap_or(u32::MAX);
                (number, l.strip_suffix('\r').unwrap_or(l))
            })
            .collect();
        // A trailing newline leaves one empty final piece that is not a line of the file.
        let lines = match lines.split_last() {
            Some(((_, ""), rest)) => rest.to_vec(),
            _ => lines,
        };

        // Frontmatter delimiters, compared after trimming.
        if lines.first().map(|(_, l)| l.trim()) != Some("---") {
            return Err(ParseError::new(
                ParseErrorKind::Frontmatter,
                "file must begin with a --- frontmatter delimiter",
            ));
        }
        let close = lines
            .iter()
            .skip(1)
            .position(|(_, l)| l.trim() == "---")
            .map(|p| p + 1)
            .ok_or_else(|| {
                ParseError::new(
                    ParseErrorKind::Frontmatter,
                    "frontmatter was not closed with ---",
                )
            })?;
        let yaml = lines[1..close]
            .iter()
            .map(|(_, l)| *l)
            .collect::<Vec<_>>()
            .join("\n");
        let frontmatter = match parse_frontmatter(&yaml, 2) {
            Ok(frontmatter) => Some(frontmatter),
            Err(err) => {
                self.report(err)?;
                None
            }
        };
        let name = frontmatter.as_ref().map(|f| f.name.clone());
        let before = self.problems.borrow().len();
        let body = &lines[close + 1..];
        let parsed = self.parse_body(frontmatter, body);
        let Some(name) = name else { return parsed };
        for problem in self.problems.borrow_mut().iter_mut().skip(before) {
            problem.prompt_name = Some(name.clone());
        }
        parsed.map_err(|e| e.with_prompt_name(&name))
    }

    fn parse_body(
        &self,
        frontmatter: Option<Frontmatter>,
        body: &[(u32, &str)],
    ) -> Result<Option<Prompt>, ParseError> {
        use ParseErrorKind::{Fence, Structure};
        let items = scan::scan(body);

        let headings: Vec<HeadingInfo> = items
            .iter()
            .enumerate()
            .filter_map(|(index, item)| match item {
                Item::Heading {
                    level,
                    text,
                    line,
                    column,
                } => Some(HeadingInfo {
                    level: *level,
                    name: heading_text(text),
                    line: *line,
                    column: *column,
                    item: index,
                }),
                _ => None,
            })
            .collect();

        // The H1 rules: exactly one, anywhere in the body (notes included), not empty.
        let mut h1s = headings.iter().filter(|h| h.level == 1);
        let h1 = h1s
            .next()
            .ok_or_else(|| ParseError::new(Structure, "prompt requires an H1 title"))?;
        if let Some(second) = h1s.next() {
            self.report(ParseError::at(
                Structure,
                "prompt must contain exactly one H1 title",
                second.line,
                second.column,
            ))?;
        }
        if h1.name.is_empty() {
            self.report(ParseError::at(
                Structure,
                "prompt H1 title must not be empty",
                h1.line,
                h1.column,
            ))?;
        }
        let title = h1.name.clone();

        // The shared-fence count is checked before any placement.
        let mut shared_fences = items.iter().filter_map(|item| match item {
            Item::Fence(f) if f.shared => Some(f.open_line),
            _ => None,
        });
        if let (Some(_), Some(second)) = (shared_fences.next(), shared_fences.next()) {
            self.report(ParseError::at(
                Fence,
                "prompt allows at most one `lua shared` fence",
                second,
                1,
            ))?;
        }

        // Walk the items in file order: place each into notes, the H1 body or a section,
        // checking headings and fences as they come.
        let mut sections: Vec<Section> = Vec::new();
        let mut top_level: Vec<SectionId> = Vec::new();
        // Stack of open sections (ids), deepest last.
        let mut stack: Vec<usize> = Vec::new();
        // Per parent (None = top level): sibling name -> first line.
        let mut siblings: HashMap<(Option<usize>, String), u32> = HashMap::new();
        // Items belonging to each part.
        let mut h1_items: Vec<&Item> = Vec::new();
        let mut section_items: Vec<Vec<&Item>> = Vec::new();
        let mut part = Part::Notes;
        let mut heading_iter = headings.iter().peekable();

        for (index, item) in items.iter().enumerate() {
            if let Item::Heading { .. } = item {
                let Some(heading) = heading_iter.next().filter(|h| h.item == index) else {
                    continue;
                };
                if part == Part::Notes {
                    if heading.item == h1.item {
                        part = Part::H1;
                    }
                    continue;
                }
                // After the H1 every heading is a section heading (levels 2..6); a second H1
                // was reported above.
                let level = heading.level;
                if level == 1 {
                    continue;
                }
                if heading.name.is_empty() {
                    self.report(ParseError::at(
                        Structure,
                        format!("an H{level} section heading must not be empty"),
                        heading.line,
                        heading.column,
                    ))?;
                }
                while let Some(&top) = stack.last() {
                    if sections[top].level >= level {
                        stack.pop();
                    } else {
                        break;
                    }
                }
                let parent_level = stack.last().map_or(1, |&p| sections[p].level);
                if level != parent_level + 1 {
                    self.report(ParseError::at(
                        Structure,
                        format!(
                            "section `{}` is an orphan H{level} heading with no parent H{}",
                            heading.name,
                            level - 1
                        ),
                        heading.line,
                        heading.column,
                    ))?;
                }
                let parent = stack.last().copied();
                let key = (parent, heading.name.clone());
                if let Some(first) = siblings.get(&key) {
                    self.report(ParseError::at(
                        Structure,
                        format!(
                            "duplicate sibling section name `{}`: first declared at line {first}, again at line {}; sibling section names must be unique",
                            heading.name, heading.line
                        ),
                        heading.line,
                        heading.column,
                    ))?;
                } else {
                    siblings.insert(key, heading.line);
                }
                let id = sections.len();
                sections.push(Section {
                    name: heading.name.clone(),
                    level,
                    line: heading.line,
                    parent: parent.map(SectionId),
                    children: Vec::new(),
                    blocks: Vec::new(),
                    items: None,
                });
                section_items.push(Vec::new());
                match parent {
                    Some(p) => sections[p].children.push(SectionId(id)),
                    None => top_level.push(SectionId(id)),
                }
                stack.push(id);
                part = Part::Section(id);
                continue;
            }
            if let Item::Fence(fence) = item
                && fence.shared
                && part != Part::H1
            {
                self.report(ParseError::at(
                    Fence,
                    "`lua shared` fence is allowed only in H1",
                    fence.open_line,
                    1,
                ))?;
                continue;
            }
            match part {
                Part::Notes => {}
                Part::H1 => h1_items.push(item),
                Part::Section(id) => section_items[id].push(item),
            }
        }

        // Fence closure errors, with the block position the fence would have had.
        let check_fences = |owner: &str, part_items: &[&Item]| -> Result<(), ParseError> {
            // The shared fence is not a block, so it is checked on its own.
            for item in part_items {
                if let Item::Fence(fence) = item
                    && fence.shared
                {
                    match fence.end {
                        FenceEnd::Closed => {}
                        FenceEnd::Unclosed => {
                            self.report(ParseError::at(
                                Fence,
                                "prompt `lua shared` fence is not closed",
                                fence.open_line,
                                1,
                            ))?;
                        }
                        FenceEnd::Inexact => {
                            self.report(ParseError::at(
                                Fence,
                                format!("section `{owner}` `lua` fence is not closed exactly"),
                                fence.open_line,
                                1,
                            ))?;
                        }
                    }
                }
            }
            let shaped = shape_blocks(part_items);
            for (position, fence) in shaped.fences {
                match fence.end {
                    FenceEnd::Closed => {}
                    FenceEnd::Unclosed => {
                        let word = match position {
                            Position::Prologue => "prologue ",
                            Position::Epilog => "epilog ",
                            Position::Middle => "",
                        };
                        self.report(ParseError::at(
                            Fence,
                            format!("section `{owner}` {word}`lua` fence is not closed"),
                            fence.open_line,
                            1,
                        ))?;
                    }
                    FenceEnd::Inexact => {
                        self.report(ParseError::at(
                            Fence,
                            format!("section `{owner}` `lua` fence is not closed exactly"),
                            fence.open_line,
                            1,
                        ))?;
                    }
                }
            }
            Ok(())
        };
        check_fences(&title, &h1_items)?;
        for (section, part_items) in sections.iter().zip(&section_items) {
            check_fences(&section.name, part_items)?;
        }

        // List sections.
        for (section, part_items) in sections.iter_mut().zip(&section_items) {
            section.items = match list_items(&section.name, part_items) {
                Ok(items) => items,
                Err(err) => {
                    self.report(err)?;
                    None
                }
            };
        }

        // Blocks, compiled in file order.
        let compiler = Compiler::new()?;
        let mut shared = None;
        let h1_shape = shape_blocks(&h1_items);
        if let Some(fence) = h1_items.iter().find_map(|item| match item {
            Item::Fence(f) if f.shared => Some(f),
            _ => None,
        }) {
            let closed = fence.end == FenceEnd::Closed || !self.collect;
            if closed {
                match compiler.compile(
                    "prompt shared library".to_owned(),
                    fence.open_line + 1,
                    fence.source.clone(),
                ) {
                    Ok(region) => shared = Some(region),
                    Err(err) => self.report(err)?,
                }
            }
        }
        let h1_label = format!("H1 `{title}` lua");
        let h1_blocks = h1_shape.into_blocks(self, &compiler, |_| h1_label.clone())?;
        for (section, part_items) in sections.iter_mut().zip(&section_items) {
            let name = section.name.clone();
            section.blocks =
                shape_blocks(part_items).into_blocks(
                    self,
                    &compiler,
                    |position| match position {
                        Position::Prologue => format!("section `{name}` prologue"),
                        Position::Epilog => format!("section `{name}` epilog"),
                        Position::Middle => format!("section `{name}` lua"),
                    },
                )?;
        }

        // Checking only: a frontmatter that failed (reported already) leaves the body as it
        // parsed, under a frontmatter that declares nothing.
        let frontmatter = frontmatter.unwrap_or_else(Frontmatter::undecoded);
        Ok(Some(Prompt {
            frontmatter,
            title,
            title_line: h1.line,
            shared,
            h1_blocks,
            sections,
            top_level,
        }))
    }
}

/// Where a Lua block sits in its part, which decides its location label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Position {
    /// The part's first block.
    Prologue,
    /// The last Lua block, with prose before it.
    Epilog,
    /// Any other Lua block.
    Middle,
}

/// A part's blocks before compiling: prose text or a fence with its position.
enum Shaped<'i> {
    Prose(ProseBlock),
    Fence(&'i scan::Fence),
}

struct Shape<'i> {
    blocks: Vec<Shaped<'i>>,
    fences: Vec<(Position, &'i scan::Fence)>,
}

impl Shape<'_> {
    /// The blocks with every closed fence compiled. When checking, a compile failure is kept
    /// and its block left out, and a fence that is not closed (reported already, its source
    /// running on past its end) is not compiled.
    fn into_blocks(
        self,
        parser: &Parser<'_>,
        compiler: &Compiler,
        label: impl Fn(Position) -> String,
    ) -> Result<Vec<Block>, ParseError> {
        let mut positions = self.fences.iter().map(|(p, _)| *p);
        let mut blocks = Vec::with_capacity(self.blocks.len());
        for block in self.blocks {
            match block {
                Shaped::Prose(prose) => blocks.push(Block::Prose(prose)),
                Shaped::Fence(fence) => {
                    let position = positions.next().unwrap_or(Position::Middle);
                    if parser.collect && fence.end != FenceEnd::Closed {
                        continue;
                    }
                    match compiler.compile(
                        label(position),
                        fence.open_line + 1,
                        fence.source.clone(),
                    ) {
                        Ok(region) => blocks.push(Block::Lua(region)),
                        Err(err) => parser.report(err)?,
                    }
                }
            }
        }
        Ok(blocks)
    }
}

/// Split a part's items into blocks. Headings never occur here. A thematic break resets the
/// pending prose; a `lua shared` fence is not a block and does not split the prose around it.
fn shape_blocks<'i>(items: &[&'i Item]) -> Shape<'i> {
    let mut blocks: Vec<Shaped<'i>> = Vec::new();
    let mut pending: Vec<(u32, &'i str)> = Vec::new();
    // Markdown before a fence makes it not the part's first block, even when a thematic
    // break dropped that Markdown from the pending prose (the fence then reads '').
    let mut saw_text = false;
    for item in items {
        match item {
            Item::Text { line, text } => {
                saw_text |= !text.trim().is_empty();
                pending.push((*line, text.as_str()));
            }
            Item::Break { .. } => pending.clear(),
            Item::Fence(fence) if fence.shared => {}
            Item::Fence(fence) => {
                let (text, line) = prose_text(&pending);
                if !text.is_empty() || !blocks.is_empty() || saw_text {
                    blocks.push(Shaped::Prose(ProseBlock {
                        text,
                        line: line.unwrap_or(fence.open_line),
                    }));
                }
                blocks.push(Shaped::Fence(fence));
                pending.clear();
                saw_text = false;
            }
            Item::Heading { .. } => {}
        }
    }
    let (text, line) = prose_text(&pending);
    if let Some(line) = line {
        blocks.push(Shaped::Prose(ProseBlock { text, line }));
    }
    let last_lua = blocks.iter().rposition(|b| matches!(b, Shaped::Fence(_)));
    let fences = blocks
        .iter()
        .enumerate()
        .filter_map(|(index, block)| match block {
            Shaped::Fence(fence) => {
                let position = if index == 0 {
                    Position::Prologue
                } else if Some(index) == last_lua {
                    Position::Epilog
                } else {
                    Position::Middle
                };
                Some((position, *fence))
            }
            Shaped::Prose(_) => None,
        })
        .collect();
    Shape { blocks, fences }
}

/// The items of a list section, or `None` when the section is not a list.
///
/// A section is a list when it has no Lua block and every nonblank line below its last
/// thematic break is a list item line. A section whose every line is a marker line or a break,
/// but whose break leaves no marker line below it, is a list with no items (an error).
fn list_items(name: &str, items: &[&Item]) -> Result<Option<Vec<String>>, ParseError> {
    if items
        .iter()
        .any(|i| matches!(i, Item::Fence(f) if !f.shared))
    {
        return Ok(None);
    }
    let tail_start = items
        .iter()
        .rposition(|i| matches!(i, Item::Break { .. }))
        .map_or(0, |p| p + 1);
    let nonblank = |slice: &[&Item]| -> Vec<(u32, String)> {
        slice
            .iter()
            .filter_map(|item| match item {
                Item::Text { line, text } if !text.trim().is_empty() => Some((*line, text.clone())),
                _ => None,
            })
            .collect()
    };
    let tail = nonblank(&items[tail_start..]);
    if tail.is_empty() {
        let all = nonblank(items);
        let all_markers = !all.is_empty() && all.iter().all(|(_, t)| scan::list_item(t).is_some());
        if all_markers {
            return Err(ParseError::new(
                ParseErrorKind::List,
                format!("section `{name}` is a list section but has no items"),
            ));
        }
        return Ok(None);
    }
    let mut out = Vec::with_capacity(tail.len());
    let mut empty_at = None;
    for (line, text) in &tail {
        match scan::list_item(text) {
            Some(item) => {
                if item.is_empty() && empty_at.is_none() {
                    empty_at = Some(*line);
                }
                out.push(item.to_owned());
            }
            None => return Ok(None),
        }
    }
    if let Some(line) = empty_at {
        return Err(ParseError::at(
            ParseErrorKind::List,
            format!("empty bullet item in list section `{name}`"),
            line,
            1,
        ));
    }
    Ok(Some(out))
}
