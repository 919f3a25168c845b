//! What the Host tells the parts that watch a run as it drives it: the recorder, the progress
//! display and the replay source. Each implements the calls it needs (every call has a no-op
//! default), and the Host makes every call at the same point of its loop for all of them, so a
//! new watcher is one implementation, not a new thread through the loop.

use promptforge_engine::Event;
use promptforge_engine::protocol::{Answer, Commits, Effect, EffectId};
use promptforge_harness::model::Usage;

/// A part of the Host that watches a run.
pub(crate) trait Witness {
    /// An event the run reported, in the order it reported them.
    fn event(&mut self, _event: &Event) {}

    /// One step of the run: the effects it issued, what it committed (final ids, answers
    /// taken), then the effects it withdrew. `task` names the task that issued an effect.
    fn step(
        &mut self,
        _issued: &[(EffectId, Effect)],
        _commits: &Commits,
        _withdrawn: &[EffectId],
        _task: &dyn Fn(EffectId) -> Option<String>,
    ) {
    }

    /// A model round ended: a reply, with its usage when reported (`Some`), or dropped or
    /// answered otherwise (`None`).
    fn round_finished(&mut self, _id: EffectId, _reply: Option<Option<&Usage>>) {}

    /// The Host answered an effect; the run takes the answer next.
    fn answered(&mut self, _id: EffectId, _answer: &Answer) {}

    /// The run took answers that came from outside (a model, a tool, a timer, a person):
    /// what must outlive a crash is written out now, and the file to sync to the disk handed
    /// back; the Host syncs it before anything the step issued goes out.
    fn durable(&mut self) -> Option<std::sync::Arc<std::fs::File>> {
        None
    }

    /// The Host is about to wait for answers.
    fn idle(&mut self) {}

    /// A model round was answered from the response cache (before `answered`).
    fn cached(&mut self, _id: EffectId) {}

    /// The operator cancelled the run.
    fn cancelled(&mut self) {}

    /// The run ended.
    fn ended(&mut self) {}
}
