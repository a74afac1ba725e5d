//! `cibox reproduce RESULT.json`: replay a recorded batch ([`crate::run::replay`]), then
//! show the recorded and replayed outcomes side by side.

use std::path::Path;

use super::context::Context;
use crate::console;
use crate::error::Result;
use crate::exit;
use crate::run::launch;
use crate::run::replay::{self, Replay};

pub fn run(ctx: &Context, result: &Path, dry_run: bool) -> Result<u8> {
    let replay = Replay::read(result, || ctx.manifest().ok())?;
    if !ctx.json {
        // The record is data from elsewhere: what it says is shown, never sent.
        for line in replay.plan_lines() {
            println!("{}", crate::util::escape(&line));
        }
    }
    let worktree = replay.checkout()?;
    // A dry run refuses what the replay would: no manifest at the commit, no such
    // batch in it (issue 48: it printed a plan the replay then failed).
    let m = replay.manifest(&worktree, || ctx.host_policy())?;
    if dry_run {
        if ctx.json {
            console::json(&serde_json::json!({ "plan": replay.plan_json() }));
        }
        return Ok(exit::SUCCESS);
    }
    let request = replay.request(&worktree)?;
    let run = launch::run(m, &ctx.host_policy()?, request, ctx.json)?;
    drop(worktree);
    let record = &replay.record;
    // No batch ran only when a signal stopped the run before it started.
    let replayed = run.batches.first().map(|b| &b.record);
    let differs = replayed
        .map(|r| replay::hardware_differences(record, r))
        .unwrap_or_default();
    if !differs.is_empty() {
        let said: Vec<String> = differs
            .iter()
            .map(|(what, a, b)| format!("{what} {a} then, {b} now"))
            .collect();
        console::warn(format!(
            "replayed on other hardware than recorded: {}; a difference in the outcome may come from there",
            said.join("; ")
        ));
    }
    if ctx.json {
        let differs: Vec<_> = differs
            .iter()
            .map(|(what, a, b)| serde_json::json!({"what": what, "recorded": a, "replayed": b}))
            .collect();
        console::json(&serde_json::json!({
            "plan": replay.plan_json(),
            "recorded": record,
            "replayed": replayed,
            "outcome": run.to_json(),
            "hardware_differs": differs,
        }));
    } else if let Some(replayed) = replayed {
        print!("{}", replay::side_by_side(record, replayed));
    }
    Ok(run.exit_code())
}
