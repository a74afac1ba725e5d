//! The script a batch's container runs, and its keeper: the first process, which
//! keeps the container alive until cibox has copied `/reports` out.

use crate::manifest::Batch;
use crate::plan::container::phases::REPORTS_EMPTY;

/// Where a batch's container sees the run's snapshot (read-only).
pub const SNAPSHOT_PATH: &str = "/.cibox-source";

/// What the script is told on its standard input when the source waits at
/// [`SNAPSHOT_PATH`] (else it is in `/work` already).
pub const FROM_SNAPSHOT: &str = "snapshot";

/// What the script is told when the source was put in `/work` for it.
pub const IN_WORK: &str = "work";

/// Quotes a string for `sh` (single quotes, `'` as `'\''`).
pub fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The script the container runs in `/work`, once cibox has put the source there (see
/// [`crate::run::source`]): install it, then the batch's preflight and run steps, stopping at
/// the first that fails; when all passed and `/reports` is empty, it says so last (see
/// [`REPORTS_EMPTY`]).
///
/// Its standard error is its standard output: one pipe keeps what the steps print in
/// the order they printed it. Two pipes reach the engine apart, so a step's output
/// could land after the next step's announcement (and in that step's failure text).
pub(super) fn script(install: &[String], batch: &Batch) -> String {
    // cibox says, on standard input, when the source is in: until then the script runs
    // nothing of the batch's (see `Engine::follow_exec`).
    let mut s = String::from(
        "exec 2>&1\n\
         set -e\n\
         if ! read -r __cibox_source; then echo 'cibox: the source never reached /work' >&2; exit 125; fi\n\
         exec </dev/null\n\
         if ! [ -d /work ] || ! [ -w /work ]; then echo \"cibox: /work is missing or not writable by uid $(id -u); cibox puts the source there before the batch starts\" >&2; exit 125; fi\n",
    );
    // The run's snapshot of the source, copied in by the batch itself: each top-level
    // entry (not the snapshot's own folder, whose owner and mode are not the batch's to
    // give `/work`), links as links.
    s.push_str(&format!(
        "if [ \"$__cibox_source\" = {from} ]; then\n\
         for __cibox_f in {at}/* {at}/.[!.]* {at}/..?*; do\n\
         if [ -e \"$__cibox_f\" ] || [ -L \"$__cibox_f\" ]; then set -- \"$@\" \"$__cibox_f\"; fi\n\
         done\n\
         if [ $# -gt 0 ] && ! cp -a \"$@\" /work/; then echo 'cibox: could not copy the source from the run'\\''s snapshot ({at}) into /work (cp -a)' >&2; exit 125; fi\n\
         set --\n\
         fi\n\
         cd /work\n",
        from = FROM_SNAPSHOT,
        at = SNAPSHOT_PATH
    ));
    for cmd in install {
        step(&mut s, "install", cmd);
    }
    // The batch's own folder for its steps (`working_dir`), once the source is
    // installed; one it lacks fails the batch, said.
    if let Some(dir) = &batch.working_dir {
        let q = sh_quote(dir);
        s.push_str(&format!(
            "cd -- {q} || {{ echo {} >&2; exit 1; }}\n",
            sh_quote(&format!(
                "cibox: working_dir {dir}: no such folder in the container"
            ))
        ));
    }
    let steps = batch
        .preflight
        .iter()
        .map(|c| ("preflight", c))
        .chain(batch.run.iter().map(|c| ("run", c)));
    for (phase, cmd) in steps {
        step(&mut s, phase, cmd);
    }
    // Said only of a folder the batch can list (it is the batch's: one it made
    // unreadable is copied as before), by the shell alone: no process to start.
    s.push_str(&format!(
        "if [ -d /reports ] && [ -r /reports ] && [ -x /reports ]; then\n\
         for __cibox_f in /reports/* /reports/.[!.]* /reports/..?*; do\n\
         if [ -e \"$__cibox_f\" ] || [ -L \"$__cibox_f\" ]; then exit 0; fi\n\
         done\n\
         echo {} >&2\n\
         fi\n",
        sh_quote(REPORTS_EMPTY)
    ));
    s
}

/// One step of the script: announced, then run, its status the script's when it fails.
fn step(s: &mut String, phase: &str, cmd: &str) {
    s.push_str(&format!(
        "echo {} >&2\n",
        sh_quote(&format!("cibox {phase}: {cmd}"))
    ));
    s.push_str(cmd);
    // A step's status is its last command's, even where `set -e` looks away (the
    // left of `&&` or `||`, after `!`): `false && echo ok` fails the step.
    s.push_str("\n__cibox_status=$?; [ \"$__cibox_status\" -eq 0 ] || exit \"$__cibox_status\"\n");
}

/// The container's first process: waits on its standard input (kept open by the
/// engine), ignoring the signals a batch or a stop could send; needs nothing but `sh`.
pub(super) const KEEPER: &str = "trap '' TERM INT HUP; while read -r _; do :; done";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotes_for_sh() {
        assert_eq!(sh_quote("it's"), r"'it'\''s'");
    }
}
