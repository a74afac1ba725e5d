//! cibox: reproducible, safe GPU CI for large ML projects. The interface it keeps is
//! written down in `docs/interface.md`; `main` parses the command line and dispatches.
//!
//! The layers, from the top; a module imports only modules of the layers below its own,
//! and no room imports in a circle at any depth (both checked by `tests/it/layers.rs`):
//!
//! 1. [`cmd`]: one thin adapter per command family: flags → request → call → exit code;
//! 2. [`run`]: running batches: one setup for every front end, the run loop behind the
//!    [`engine::ContainerEngine`] seam, Slurm submissions, the watchdog and the sweep;
//! 3. [`report`]: saying what happened: events, reporters, how batches end, the record;
//!    [`capacity`]: what this host's GPUs or its Slurm partition can take now;
//! 4. [`plan`]: what a run will be, decided before anything runs; [`claims`]: the GPUs
//!    of running cibox containers, added to a probe; [`starter`]: what `cibox init`
//!    writes for a project, from what it holds; [`doctor`]: the host checked for what
//!    GPU batches need;
//! 5. [`host`] (the host policy: what the host grants, its GPU facts), [`gpu`] (probe,
//!    pool, queue, the lease sequence), [`changed`] (change selection), [`workflow`]
//!    (render and lint);
//! 6. [`timing`]: how long batches are expected to run (recorded, estimated), and
//!    runs split by it into partitions;
//! 7. [`manifest`]: what `cibox.yaml` says;
//! 8. [`image`]: IDs, lockset, verification, build recipes;
//! 9. [`git_mask`]: a checkout's git configs, cleaned of credentials (a batch's source,
//!    an image's build context);
//! 10. [`engine`] (the container engine, synchronous, owning the async runtime),
//!     [`cache`] (the host's cache store), [`artifact`] (what batches hand to later
//!     layers: the run's artifact store, digests, trust), [`lockdir`] (the shared lock directory),
//!     [`slurm`] (a Slurm cluster's commands and what they print), [`git`], [`github`],
//!     [`buildkite`];
//! 11. [`console`] (what cibox prints), [`process`] (confining a command), [`yaml`] (a
//!     YAML tree with positions), [`error`] (what kind of failure an error is),
//!     [`nofollow`] (writing where a link must never be followed: folders held open),
//!     [`mask`] (secrets' values masked in what is printed);
//! 12. [`cli`] (the command line: its flags typed as they are parsed), [`exit`] (the
//!     exit codes), [`labels`], [`ownership`] (who can change a path), [`signals`],
//!     [`util`];
//! 13. [`units`] (durations, sizes and times as cibox reads and writes them).
//!
//! Errors become exit codes in one place ([`error::Error::exit_code`], codes in
//! [`exit`]).

mod artifact;
mod buildkite;
mod cache;
mod capacity;
mod changed;
mod claims;
mod cli;
mod cmd;
mod console;
mod doctor;
mod engine;
mod error;
mod exit;
mod git;
mod git_mask;
mod github;
mod gpu;
mod host;
mod image;
mod labels;
mod lockdir;
mod manifest;
mod mask;
mod nofollow;
mod ownership;
mod plan;
mod process;
mod report;
mod run;
mod signals;
mod slurm;
mod starter;
mod timing;
mod units;
mod util;
mod workflow;
mod yaml;

use std::process::ExitCode;

use clap::Parser;

use crate::cli::Cli;

fn main() -> ExitCode {
    // Die quietly on a closed pipe (`cibox batch list | head`) like other Unix tools,
    // instead of panicking on the failed write.
    // SAFETY: restoring the default disposition before any thread exists.
    unsafe {
        let _ = nix::sys::signal::signal(
            nix::sys::signal::Signal::SIGPIPE,
            nix::sys::signal::SigHandler::SigDfl,
        );
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return ExitCode::from(usage_error(e)),
    };
    console::init(cli.verbose);
    let json = cli.json;
    let code = match cmd::dispatch(cli) {
        Ok(code) => code,
        Err(e) => {
            console::error(&e, e.details());
            if json {
                console::json_error(&e.to_string(), e.details(), e.exit_code());
            }
            e.exit_code()
        }
    };
    if gpu::probe::stuck_in_driver() {
        // A thread is stuck in the driver or the loader, maybe holding the loader's
        // lock that the exit handlers take: leave without them.
        use std::io::Write;
        let _ = std::io::stdout().flush();
        let _ = std::io::stderr().flush();
        // SAFETY: ends the process at once; nothing runs after it.
        unsafe { nix::libc::_exit(i32::from(code)) }
    }
    ExitCode::from(code)
}

/// Help and version go to stdout with 0; a usage error is one line and exit 2.
fn usage_error(e: clap::Error) -> u8 {
    use clap::error::ErrorKind;
    match e.kind() {
        ErrorKind::DisplayHelp
        | ErrorKind::DisplayVersion
        | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            let _ = e.print();
            if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
                exit::USAGE
            } else {
                exit::SUCCESS
            }
        }
        _ => {
            let text = e.render().to_string();
            let first = text
                .lines()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("bad command line")
                .trim_start_matches("error: ");
            // clap's "did you mean": kept, on the same line.
            let tip = text
                .lines()
                .map(str::trim)
                .find_map(|l| l.strip_prefix("tip: "))
                .map(|t| format!("; {t}"))
                .or_else(|| {
                    let bad = e.get(clap::error::ContextKind::InvalidSubcommand)?;
                    let words: Vec<String> = std::env::args().skip(1).collect();
                    cibox_suggestion(&words, &bad.to_string())
                })
                .unwrap_or_default();
            let first = format!("{first}{tip}");
            let first = first.as_str();
            eprintln!(
                "cibox: {} {first} (see `cibox --help`)",
                console::paint("error:", console::Colour::Red)
            );
            // `--json` was asked for, though the line it is on did not parse.
            let json = std::env::args()
                .skip(1)
                .take_while(|a| a != "--")
                .any(|a| a == "--json");
            if json {
                console::json_error(first, &[], exit::USAGE);
            }
            exit::USAGE
        }
    }
}

/// `; a similar subcommand exists: 'run'`, as clap words its own tips.
fn cibox_suggestion(words: &[String], bad: &str) -> Option<String> {
    cli::suggest_subcommand(words, bad).map(|s| format!("; a similar subcommand exists: '{s}'"))
}
