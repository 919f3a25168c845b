//! `promptforge runs show ID --html FILE`: a run's timeline as one self-contained HTML page.
//!
//! One lane per task (the main walk is task `0`; each fanout arm and task has its own), a
//! light band per section the lane walked, and a bar per effect from its issue to its answer:
//! model rounds, tool calls, operator questions, timers and store calls, each coloured by
//! kind. Hovering a bar shows its request and answer. The page has no outside references: the
//! styles and the small script that lays the bars out are inline, and the data is in the page.
//! After layout the script writes what it drew onto `<body>` (`data-lanes`, `data-bars`,
//! `data-drawn`, and each bar's box in `data-boxes`), which a test reads back from a real
//! browser and checks against the browser's screenshot.

use std::collections::BTreeMap;

use serde_json::{Value as Json, json};

/// One effect of the run, as the page shows it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Bar {
    pub effect: u64,
    pub task: String,
    pub kind: String,
    pub start_ms: u64,
    pub end_ms: Option<u64>,
    pub label: String,
    pub request: Json,
    pub answer: Option<Json>,
}

/// A section a lane walked.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Band {
    pub task: String,
    pub section: String,
    pub start_ms: u64,
    pub end_ms: Option<u64>,
}

/// Everything the page shows.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Timeline {
    pub title: String,
    pub summary: String,
    pub outcome: String,
    pub total_ms: u64,
    pub bars: Vec<Bar>,
    pub bands: Vec<Band>,
}

fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// JSON for a `<script type="application/json">` block: `</` can never close the element.
fn script_json(value: &Json) -> String {
    value.to_string().replace("</", "<\\/")
}

const STYLE: &str = r#"
body { font: 13px/1.4 system-ui, sans-serif; margin: 24px; color: #1d232a; }
h1 { font-size: 18px; margin: 0 0 4px; }
.summary { margin: 0 0 16px; color: #4a5560; }
.outcome-completed { color: #1f7a3a; } .outcome-failed { color: #b42318; } .outcome-cancelled { color: #8a6100; }
.legend span { display: inline-block; margin-right: 12px; }
.legend i { display: inline-block; width: 10px; height: 10px; margin-right: 4px; border-radius: 2px; }
.timeline { border-top: 1px solid #d0d7de; margin-top: 12px; }
.lane { display: flex; border-bottom: 1px solid #eaeef2; min-height: 30px; }
.lane .name { width: 140px; flex: none; padding: 6px 8px; font-family: ui-monospace, monospace; color: #4a5560; }
.lane .track { position: relative; flex: 1; }
.band { position: absolute; top: 2px; bottom: 2px; background: #f3f6f9; border-left: 1px solid #c9d1d9;
        font-size: 11px; color: #6e7781; overflow: hidden; white-space: nowrap; padding-left: 3px; }
.bar { position: absolute; top: 8px; height: 14px; min-width: 3px; border-radius: 3px; cursor: default; }
.bar.model_round { background: #5b8def; } .bar.tool { background: #e09f3e; } .bar.ask { background: #9b59b6; }
.bar.timer { background: #9aa5b1; } .bar.store { background: #3fb68b; height: 6px; top: 12px; }
.bar.open { opacity: 0.45; }
.bar .tip { display: none; position: absolute; top: 18px; left: 0; z-index: 10; width: 560px; max-height: 420px;
            overflow: auto; background: #fff; border: 1px solid #d0d7de; box-shadow: 0 4px 12px rgba(0,0,0,.15);
            padding: 8px; color: #1d232a; }
.bar:hover .tip { display: block; }
.tip pre { white-space: pre-wrap; word-break: break-word; margin: 4px 0 8px; font-size: 11px; }
"#;

const SCRIPT: &str = r#"
(function () {
  var total = Math.max(1, Number(document.body.dataset.total) || 1);
  var lanes = document.querySelectorAll('.lane');
  var drawn = 0, bars = 0, boxes = [];
  document.querySelectorAll('[data-start]').forEach(function (el) {
    var start = Number(el.dataset.start), end = el.dataset.end === '' ? total : Number(el.dataset.end);
    el.style.left = (100 * start / total) + '%';
    el.style.width = Math.max(0.3, 100 * (end - start) / total) + '%';
    if (el.classList.contains('bar')) {
      bars++;
      var box = el.getBoundingClientRect();
      if (box.width > 0 && box.height > 0) drawn++;
      boxes.push({effect: Number(el.dataset.effect), task: el.closest('.lane').dataset.task,
                  x: Math.round(box.left), y: Math.round(box.top),
                  w: Math.round(box.width), h: Math.round(box.height)});
    }
  });
  document.body.dataset.lanes = String(lanes.length);
  document.body.dataset.bars = String(bars);
  document.body.dataset.drawn = String(drawn);
  document.body.dataset.boxes = JSON.stringify(boxes);
})();
"#;

impl Timeline {
    /// The page.
    pub(crate) fn html(&self) -> String {
        let mut tasks: Vec<String> = Vec::new();
        let mut add = |task: &str| {
            if !tasks.iter().any(|t| t == task) {
                tasks.push(task.to_owned());
            }
        };
        add("0");
        for band in &self.bands {
            add(&band.task);
        }
        for bar in &self.bars {
            add(&bar.task);
        }
        let mut lanes: BTreeMap<usize, String> = BTreeMap::new();
        for (n, task) in tasks.iter().enumerate() {
            let mut track = String::new();
            for band in self.bands.iter().filter(|b| &b.task == task) {
                track.push_str(&format!(
                    r#"<div class="band" data-start="{}" data-end="{}" title="{}">{}</div>"#,
                    band.start_ms,
                    band.end_ms.map(|e| e.to_string()).unwrap_or_default(),
                    escape(&format!("section `{}`", band.section)),
                    escape(&band.section)
                ));
            }
            for bar in self.bars.iter().filter(|b| &b.task == task) {
                let took = bar
                    .end_ms
                    .map(|e| format!("{} ms", e.saturating_sub(bar.start_ms)))
                    .unwrap_or_else(|| "no answer".to_owned());
                let request = serde_json::to_string_pretty(&bar.request).unwrap_or_default();
                let answer = bar
                    .answer
                    .as_ref()
                    .map(|a| serde_json::to_string_pretty(a).unwrap_or_default())
                    .unwrap_or_else(|| "(none)".to_owned());
                track.push_str(&format!(
                    r#"<div class="bar {kind}{open}" data-effect="{id}" data-start="{start}" data-end="{end}"><div class="tip"><b>{label}</b> · effect {id} · {took}<br>request<pre>{request}</pre>answer<pre>{answer}</pre></div></div>"#,
                    kind = escape(&bar.kind),
                    open = if bar.end_ms.is_none() { " open" } else { "" },
                    id = bar.effect,
                    start = bar.start_ms,
                    end = bar.end_ms.map(|e| e.to_string()).unwrap_or_default(),
                    label = escape(&bar.label),
                    took = escape(&took),
                    request = escape(&request),
                    answer = escape(&answer),
                ));
            }
            let name = if task == "0" {
                "0 (main)".to_owned()
            } else {
                task.clone()
            };
            lanes.insert(
                n,
                format!(
                    r#"<div class="lane" data-task="{task}"><div class="name">{name}</div><div class="track">{track}</div></div>"#,
                    task = escape(task),
                    name = escape(&name),
                ),
            );
        }
        let data = json!({
            "bars": self.bars.iter().map(|b| json!({"effect": b.effect, "task": b.task, "kind": b.kind,
                "start_ms": b.start_ms, "end_ms": b.end_ms})).collect::<Vec<_>>(),
        });
        let legend = [
            ("model_round", "#5b8def", "model round"),
            ("tool", "#e09f3e", "tool call"),
            ("ask", "#9b59b6", "operator"),
            ("timer", "#9aa5b1", "wait"),
            ("store", "#3fb68b", "store"),
        ]
        .iter()
        .map(|(_, colour, name)| {
            format!(r#"<span><i style="background:{colour}"></i>{name}</span>"#)
        })
        .collect::<String>();
        format!(
            r#"<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title><style>{STYLE}</style></head>
<body data-total="{total}">
<h1>{title}</h1>
<p class="summary"><span class="outcome-{outcome}">{outcome}</span> · {summary}</p>
<div class="legend">{legend}</div>
<div class="timeline">{lanes}</div>
<script type="application/json" id="run-data">{data}</script>
<script>{SCRIPT}</script>
</body></html>
"#,
            title = escape(&self.title),
            total = self.total_ms.max(1),
            outcome = escape(&self.outcome),
            summary = escape(&self.summary),
            lanes = lanes.into_values().collect::<String>(),
            data = script_json(&data),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_escapes_everything_it_shows() {
        let page = Timeline {
            title: "run 1: <b>x</b>.md".into(),
            summary: "1 round".into(),
            outcome: "completed".into(),
            total_ms: 10,
            bars: vec![Bar {
                effect: 0,
                task: "0.1".into(),
                kind: "model_round".into(),
                start_ms: 2,
                end_ms: Some(8),
                label: "model round".into(),
                request: json!({"messages": [{"content": "</script><script>alert(1)</script>"}]}),
                answer: Some(json!({"text": "a & b"})),
            }],
            bands: vec![Band {
                task: "0.1".into(),
                section: "Fact".into(),
                start_ms: 1,
                end_ms: None,
            }],
        }
        .html();
        assert!(!page.contains("<b>x</b>"));
        assert!(!page.contains("<script>alert"));
        assert!(page.contains("a &amp; b"));
        assert!(page.contains(r#"<div class="lane" data-task="0.1">"#));
        assert!(page.contains(r#"data-effect="0" data-start="2" data-end="8""#));
        assert_eq!(page.matches("<script").count(), 2);
    }
}
