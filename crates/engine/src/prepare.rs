//! Prepare: Plugin activation, filling tool slots and model roles, and the requirements
//! notice when the Harness cannot satisfy the prompt (chapter 04).

use std::collections::BTreeSet;

use promptforge_syntax::frontmatter::{Frontmatter, Keyword};

pub use promptforge_protocol::host::{
    HostState, ModelInfo, PluginInfo, ThinkingCapability, ToolInfo,
};

const NOTICE_HEADER: &str = "the environment cannot satisfy this prompt:";

/// The bound tool slots: each slot whose Plugin is active and contributed a tool at its exact
/// path, in declaration order.
pub fn bound_slots(fm: &Frontmatter, host: &HostState) -> Vec<(String, String, ToolInfo)> {
    fm.tools
        .iter()
        .filter_map(|slot| {
            let plugin = host.plugins.iter().find(|p| p.id == slot.plugin_id())?;
            if plugin.activation_failure.is_some() || fm.plugin(&plugin.id).is_none() {
                return None;
            }
            let tool = plugin.tools.iter().find(|t| t.name == slot.short_name())?;
            Some((slot.alias.clone(), slot.path.clone(), tool.clone()))
        })
        .collect()
}

/// The requirements notice, or `None` when prepare can start the run. Lines: missing Plugins
/// first (activation in declaration order, then tool slots in sorted alias order, each Plugin
/// once), then Plugin conflicts, then unmet model-role requirements (sorted by label; the
/// context line before the keyword lines, which follow declaration order).
pub fn requirements_notice(fm: &Frontmatter, host: &HostState) -> Option<String> {
    let mut missing: Vec<String> = Vec::new();
    let mut other_activation: Vec<String> = Vec::new();
    let mut conflicts: Vec<String> = Vec::new();
    let find = |id: &str| host.plugins.iter().find(|p| p.id == id);

    // Conflicting pairs never activate.
    let mut in_conflict: BTreeSet<&str> = BTreeSet::new();
    for (i, first) in fm.plugins.iter().enumerate() {
        for second in &fm.plugins[i + 1..] {
            let declares =
                |a: &str, b: &str| find(a).is_some_and(|p| p.conflicts.iter().any(|c| c == b));
            if declares(&first.id, &second.id) || declares(&second.id, &first.id) {
                conflicts.push(format!(
                    "conflicting Plugins: {} and {} cannot be activated together; declare one or the other",
                    first.id, second.id
                ));
                in_conflict.insert(first.id.as_str());
                in_conflict.insert(second.id.as_str());
            }
        }
    }

    // Activation, in declaration order. A Plugin that fails to activate is reported by its
    // own line instead of as missing (its slots included).
    let mut active: BTreeSet<&str> = BTreeSet::new();
    let mut failed: BTreeSet<&str> = BTreeSet::new();
    for decl in &fm.plugins {
        match find(&decl.id) {
            None => {
                if !decl.optional {
                    missing.push(decl.id.clone());
                }
            }
            Some(plugin) => {
                if let Some(failure) = &plugin.activation_failure {
                    if !decl.optional {
                        other_activation.push(failure.clone());
                        failed.insert(plugin.id.as_str());
                    }
                } else if !in_conflict.contains(decl.id.as_str()) {
                    active.insert(plugin.id.as_str());
                }
            }
        }
    }

    // Tool slots, in sorted alias order: a slot whose Plugin contributed no tools is missing.
    let mut slots: Vec<_> = fm.tools.iter().collect();
    slots.sort_by(|a, b| a.alias.cmp(&b.alias));
    for slot in slots {
        let id = slot.plugin_id();
        let contributed = active.contains(id) && find(id).is_some_and(|p| !p.tools.is_empty());
        if !contributed && !failed.contains(id) && !missing.iter().any(|m| m == id) {
            missing.push(id.to_owned());
        }
    }

    // Model roles, checked only when the Host provides a current model.
    let mut roles: Vec<String> = Vec::new();
    if let Some(model) = &host.model {
        let mut decls: Vec<_> = fm.models.iter().collect();
        decls.sort_by(|a, b| a.label.cmp(&b.label));
        for role in decls {
            if let Some(min) = role.min_context
                && model.context < u64::from(min)
            {
                roles.push(format!(
                    "role '{}': requires a context of at least {min} tokens; the current model provides {}",
                    role.label, model.context
                ));
            }
            for keyword in &role.keywords {
                let unmet = match keyword {
                    Keyword::Thinking => model.thinking == ThinkingCapability::Never,
                    Keyword::NoThinking => model.thinking == ThinkingCapability::Always,
                    _ => false,
                };
                if unmet {
                    roles.push(format!(
                        "role '{}': requires '{}'; the current model's thinking capability is {}",
                        role.label,
                        keyword.as_str(),
                        model.thinking.as_str()
                    ));
                }
            }
        }
    }

    let lines: Vec<String> = missing
        .iter()
        .map(|id| format!("missing required Plugin: {id}"))
        .chain(other_activation)
        .chain(conflicts)
        .chain(roles)
        .collect();
    if lines.is_empty() {
        return None;
    }
    let mut notice = NOTICE_HEADER.to_owned();
    for line in lines {
        notice.push_str("\n- ");
        notice.push_str(&line);
    }
    Some(notice)
}

#[cfg(test)]
mod tests {
    use super::*;
    use promptforge_syntax::Prompt;

    fn frontmatter(extra: &str) -> Frontmatter {
        let src = format!("---\nname: p\ndescription: d\npromptforge: 0\n{extra}---\n\n# T\n");
        Prompt::parse(&src).unwrap().frontmatter
    }

    #[test]
    fn nothing_declared_runs() {
        assert_eq!(
            requirements_notice(&frontmatter(""), &HostState::default()),
            None
        );
    }

    #[test]
    fn slot_without_plugin_is_reported_once() {
        let fm = frontmatter(
            "tools:\n  fetch: promptforge/web/fetch\n  search: promptforge/web/search\n",
        );
        assert_eq!(
            requirements_notice(&fm, &HostState::default()).unwrap(),
            "the environment cannot satisfy this prompt:\n- missing required Plugin: promptforge/web"
        );
        let fm =
            frontmatter("plugins:\n  - promptforge/web\ntools:\n  fetch: promptforge/web/fetch\n");
        assert_eq!(
            requirements_notice(&fm, &HostState::default()).unwrap(),
            "the environment cannot satisfy this prompt:\n- missing required Plugin: promptforge/web"
        );
    }

    #[test]
    fn optional_plugin_is_skipped() {
        let fm = frontmatter("plugins:\n  - ref: promptforge/web\n    optional: true\n");
        assert_eq!(requirements_notice(&fm, &HostState::default()), None);
    }

    #[test]
    fn conflicts_name_both_in_declaration_order() {
        let fm = frontmatter("plugins:\n  - acme/bashkit\n  - acme/terminal\n");
        let host = HostState {
            plugins: vec![
                PluginInfo {
                    id: "acme/bashkit".into(),
                    tools: vec![ToolInfo::new("run", "runs")],
                    conflicts: vec![],
                    activation_failure: None,
                },
                PluginInfo {
                    id: "acme/terminal".into(),
                    tools: vec![ToolInfo::new("exec", "executes")],
                    conflicts: vec!["acme/bashkit".into()],
                    activation_failure: None,
                },
            ],
            model: None,
            live_operator: false,
        };
        assert_eq!(
            requirements_notice(&fm, &host).unwrap(),
            "the environment cannot satisfy this prompt:\n- conflicting Plugins: acme/bashkit and acme/terminal cannot be activated together; declare one or the other"
        );
    }

    #[test]
    fn role_lines_sorted_with_context_first() {
        let fm = frontmatter(
            "models:\n  analyst:\n    keywords: [frontier, thinking]\n    min_context: 200000\n  a-fast:\n    keywords: [no-thinking]\n",
        );
        let never = HostState {
            plugins: vec![],
            model: Some(ModelInfo {
                id: "m".into(),
                context: 32000,
                thinking: ThinkingCapability::Never,
                description: String::new(),
            }),
            live_operator: false,
        };
        assert_eq!(
            requirements_notice(&fm, &never).unwrap(),
            "the environment cannot satisfy this prompt:\n- role 'analyst': requires a context of at least 200000 tokens; the current model provides 32000\n- role 'analyst': requires 'thinking'; the current model's thinking capability is Never"
        );
        let always = HostState {
            plugins: vec![],
            model: Some(ModelInfo {
                id: "m".into(),
                context: 200000,
                thinking: ThinkingCapability::Always,
                description: String::new(),
            }),
            live_operator: false,
        };
        assert_eq!(
            requirements_notice(&fm, &always).unwrap(),
            "the environment cannot satisfy this prompt:\n- role 'a-fast': requires 'no-thinking'; the current model's thinking capability is Always"
        );
    }
}
