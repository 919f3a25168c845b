//! What a place in the prompt sees (chapter 08): the sibling lists the walk moves along, the
//! visible set a `call`, `jump`, spawn or fanout resolves its target against, and the blocks a
//! place runs. A room over the prompt alone: nothing here knows about a run.

use std::sync::Arc;

use promptforge_lua::vm::VisibleSet;
use promptforge_syntax::heading_ref::parse_heading_ref;
use promptforge_syntax::{Block, Prompt, SectionId};

use crate::strand::Place;

/// The sibling list under `parent` (the top level for `None`).
pub(crate) fn siblings(prompt: &Prompt, parent: Option<SectionId>) -> &[SectionId] {
    prompt.siblings(parent)
}

/// The sections visible from `place` ([`Prompt::visible_from`]).
pub(crate) fn visible_ids(prompt: &Prompt, place: Place) -> Vec<SectionId> {
    prompt.visible_from(match place {
        Place::H1 => None,
        Place::Section(id) => Some(id),
    })
}

/// The visible set an entry's VM gets: a shared handle, resolved only if it is read.
pub(crate) fn visible_set(prompt: &Arc<Prompt>, place: Place) -> VisibleSet {
    VisibleSet::Prompt {
        prompt: prompt.clone(),
        place: match place {
            Place::H1 => None,
            Place::Section(id) => Some(id),
        },
    }
}

/// Resolve a heading reference against the sections visible from `place`; the error is the
/// message raised at the call.
pub(crate) fn resolve(prompt: &Prompt, place: Place, target: &str) -> Result<SectionId, String> {
    let reference = parse_heading_ref(target).map_err(|e| e.to_string())?;
    let at = match place {
        Place::H1 => None,
        Place::Section(id) => Some(id),
    };
    prompt.resolve_from(at, &reference).ok_or_else(|| {
        let visible = visible_ids(prompt, place);
        let list = visible
            .iter()
            .filter_map(|id| prompt.section(*id).map(|s| s.heading_ref()))
            .collect::<Vec<_>>()
            .join(", ");
        format!("section heading `{reference}` not found; available sections: {list}")
    })
}

/// The blocks `place` runs.
pub(crate) fn blocks_of(prompt: &Prompt, place: Place) -> &[Block] {
    match place {
        Place::H1 => &prompt.h1_blocks,
        Place::Section(id) => prompt.section(id).map_or(&[][..], |s| s.blocks.as_slice()),
    }
}

/// A section's name, shared (empty for an id the prompt does not have).
pub(crate) fn section_name(prompt: &Prompt, id: SectionId) -> Arc<str> {
    prompt
        .section(id)
        .map_or_else(|| Arc::from(""), |x| Arc::from(x.name.as_str()))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code

    use super::*;

    const SOURCE: &str = "---\nname: t\ndescription: d\npromptforge: 0\n---\n\n# T\n\nIntro.\n\n## A\n\nA.\n\n### A1\n\nA1.\n\n### A2\n\nA2.\n\n## B\n\nB.\n";

    fn id_of(prompt: &Prompt, name: &str) -> SectionId {
        prompt
            .top_level
            .iter()
            .chain(
                prompt
                    .top_level
                    .iter()
                    .flat_map(|t| {
                        prompt
                            .section(*t)
                            .map(|s| s.children.clone())
                            .unwrap_or_default()
                    })
                    .collect::<Vec<_>>()
                    .iter(),
            )
            .copied()
            .find(|id| prompt.section(*id).is_some_and(|s| s.name == name))
            .unwrap()
    }

    fn names(prompt: &Prompt, ids: &[SectionId]) -> Vec<String> {
        ids.iter()
            .map(|id| prompt.section(*id).unwrap().heading_ref())
            .collect()
    }

    #[test]
    fn a_place_sees_its_siblings_then_its_children() {
        let prompt = Prompt::parse(SOURCE).unwrap();
        let a = id_of(&prompt, "A");
        let a1 = id_of(&prompt, "A1");
        assert_eq!(
            names(&prompt, &visible_ids(&prompt, Place::H1)),
            ["## A", "## B"]
        );
        assert_eq!(
            names(&prompt, &visible_ids(&prompt, Place::Section(a))),
            ["## B", "### A1", "### A2"]
        );
        assert_eq!(
            names(&prompt, &visible_ids(&prompt, Place::Section(a1))),
            ["### A2"]
        );
        assert_eq!(
            names(&prompt, siblings(&prompt, Some(a))),
            ["### A1", "### A2"]
        );
    }

    #[test]
    fn a_reference_resolves_in_the_visible_set_or_names_what_is_there() {
        let prompt = Prompt::parse(SOURCE).unwrap();
        let a = id_of(&prompt, "A");
        assert_eq!(
            resolve(&prompt, Place::Section(a), "### A2").unwrap(),
            id_of(&prompt, "A2")
        );
        assert_eq!(
            resolve(&prompt, Place::Section(a), "## A").unwrap_err(),
            "section heading `## A` not found; available sections: ## B, ### A1, ### A2"
        );
        assert!(resolve(&prompt, Place::H1, "A").is_err());
        assert_eq!(blocks_of(&prompt, Place::Section(a)).len(), 1);
    }
}
