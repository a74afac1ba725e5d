//! Saying what happened (docs/interface.md §7, §8, §9): the events a run emits, each
//! with when it happened; the reporters that render them (terminal, GitHub Actions, the
//! reports folder, the wire to a Slurm submitter); how batches and runs end; the test
//! cases a batch's reports and steps hold.
//!
//! The rooms, from the bottom up; each imports only those below it:
//!
//! - [`error`]: why a reporter could not write what it owns;
//! - [`junit`] and [`steps`]: a batch's test cases, from its JUnit files or its steps;
//! - [`record`]: `result.json`, what a batch's run leaves for a later reader;
//! - [`sweep`]: what a sweep of dead runs' containers did;
//! - [`outcome`]: how batches and runs end ([`outcome::judge`], results);
//! - [`shards`]: a sharded batch's shards merged into one batch's result;
//! - [`event`]: what the runner tells its reporters, in order;
//! - [`remote`]: events as a Slurm node sends them to its submitter;
//! - [`reporter`]: who renders the events.

pub mod error;
pub mod event;
pub mod junit;
pub mod outcome;
pub mod record;
pub mod remote;
pub mod reporter;
pub mod shards;
pub mod steps;
pub mod sweep;

pub use record::RunRecord;
