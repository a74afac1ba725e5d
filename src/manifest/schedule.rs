//! A batch's place in a run shaped by time: how long it is expected to run
//! (`est_time`), how often it runs again when it did not pass (`retries`), and whether
//! its failure fails the run (`soft_fail`); a layer's `fail_fast` is read with the
//! layer. The checks are shared by batches, test lists' entries and `changed.run`.

use serde::Deserialize;

use crate::units::Span;

use super::check::Checker;
use super::error::ManifestError;
use super::types::{Retries, RetryOn};

/// The most retries a batch may ask: each attempt may cost its whole timeout.
pub const MAX_RETRIES: i64 = 10;

/// The longest expected time: a batch is expected within its timeout, and a timeout is
/// at most a year.
const MAX_EST_TIME: std::time::Duration = std::time::Duration::from_secs(30 * 24 * 3600);

/// `retries:` as written: a count, or `{count, on}`.
#[derive(Debug, Clone)]
pub(super) enum RawRetries {
    Count(i64),
    Full(RawRetriesFull),
}

impl<'de> Deserialize<'de> for RawRetries {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        super::values::scalar_or_compound(
            d,
            (
                false,
                "`retries` is a count (`2`) or `{count: 2, on: [infra_error]}`",
            ),
            RawRetries::Count,
            RawRetries::Full,
        )
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRetriesFull {
    pub(super) count: i64,
    pub(super) on: Option<Vec<RetryOn>>,
}

/// An `est_time` at `at`: at most 30 days. `0s` is allowed: a file that registers no
/// time of its own (SGLang's `est_time=0`) costs a part nothing, as in SGLang's split.
pub(super) fn est_time<S: AsRef<str>>(
    check: &Checker<'_>,
    at: &[S],
    est: Option<Span>,
) -> Result<Option<Span>, ManifestError> {
    match est {
        Some(e) if e.0 > MAX_EST_TIME => Err(check.at(
            at,
            format!("must be at most 30d, got {e}: how long the batch is expected to run"),
        )),
        other => Ok(other),
    }
}

/// `retries:` at `at`: a count from 0 to [`MAX_RETRIES`], or `{count, on: [...]}`;
/// not written: none.
pub(super) fn retries<S: AsRef<str>>(
    check: &Checker<'_>,
    at: &[S],
    raw: Option<RawRetries>,
) -> Result<Retries, ManifestError> {
    let (count, on) = match raw {
        None => return Ok(Retries::default()),
        Some(RawRetries::Count(n)) => (n, None),
        Some(RawRetries::Full(f)) => (f.count, f.on),
    };
    if !(0..=MAX_RETRIES).contains(&count) {
        return Err(check.at(
            at,
            format!("must be 0 to {MAX_RETRIES} (how many more times a batch that did not pass runs), got {count}"),
        ));
    }
    let on = match on {
        None => vec![RetryOn::Failed],
        Some(on) if on.is_empty() => {
            return Err(check.at(
                at,
                "`on` names no ending: give `failed`, `timeout` or `infra_error`, or drop it for `failed`",
            ));
        }
        Some(mut on) => {
            on.sort_by_key(|o| *o as u8);
            on.dedup();
            on
        }
    };
    Ok(Retries {
        count: count as u32,
        on,
    })
}

#[cfg(test)]
mod tests {
    use crate::manifest::tests::parse;
    use crate::manifest::{Retries, RetryOn};

    const TEXT: &str = "version: 1\nproject: p\nimage: {locks: [x]}\ndefaults: {timeout: 1h, run: [x], est_time: 5m}\nbatches:\n  a: {gpus: 1, retries: 2, soft_fail: true}\n  b: {gpus: 0, est_time: 90s, retries: {count: 1, on: [timeout, failed, timeout]}}\n  c: {gpus: 0, est_time: null}\nlayers:\n  l: {batches: all, fail_fast: true}\n  m: {batches: [a]}\n";

    #[test]
    fn a_batch_says_how_long_it_runs_how_often_it_runs_again_and_whether_it_fails_the_run() {
        let m = parse(TEXT).unwrap();
        let (a, b, c) = (&m.batches["a"], &m.batches["b"], &m.batches["c"]);
        assert_eq!(a.est_time.map(|s| s.to_string()).as_deref(), Some("5m"));
        assert_eq!(b.est_time.map(|s| s.to_string()).as_deref(), Some("90s"));
        assert_eq!(c.est_time, None, "null removes the default's");
        assert_eq!(
            a.retries,
            Retries {
                count: 2,
                on: vec![RetryOn::Failed]
            }
        );
        assert_eq!(b.retries.on, [RetryOn::Failed, RetryOn::Timeout]);
        assert_eq!(c.retries, Retries::default());
        assert!(a.soft_fail && !b.soft_fail);
        assert!(m.layers["l"].fail_fast && !m.layers["m"].fail_fast);
    }

    #[test]
    fn a_test_list_entry_sets_or_removes_its_familys_time_retries_and_soft_failure() {
        let text = "version: 1\nproject: p\nimage: {locks: [x]}\nbatches:\n  fam:\n    gpus: 1\n    timeout: 1h\n    run: [x]\n    est_time: 10m\n    retries: 1\n    soft_fail: true\n    each:\n      - {file: t/a.py}\n      - {file: t/b.py, est_time: 2m, retries: {count: 3, on: [infra_error]}, soft_fail: false}\n      - {file: t/c.py, est_time: null, retries: null, soft_fail: null}\n";
        let m = parse(text).unwrap();
        let b = |n: &str| &m.batches[n];
        assert_eq!(
            b("fam-a").est_time.map(|s| s.to_string()).as_deref(),
            Some("10m")
        );
        assert_eq!((b("fam-a").retries.count, b("fam-a").soft_fail), (1, true));
        assert_eq!(
            b("fam-b").est_time.map(|s| s.to_string()).as_deref(),
            Some("2m")
        );
        assert_eq!(b("fam-b").retries.on, [RetryOn::InfraError]);
        assert!(!b("fam-b").soft_fail);
        assert_eq!(b("fam-c").est_time, None);
        assert_eq!(b("fam-c").retries, Retries::default());
        assert!(!b("fam-c").soft_fail);
        // SGLang registers `est_time=0` (test/registered/unit/entrypoints/openai/utils.py:31):
        // a part pays nothing for it.
        let m = parse(&text.replace("est_time: 2m", "est_time: 0s")).unwrap();
        assert_eq!(m.batches["fam-b"].est_time.map(|s| s.0.as_secs()), Some(0));
    }

    #[test]
    fn bad_times_and_retries_are_refused_at_their_key() {
        crate::manifest::tests::assert_refused(
            TEXT,
            &[
                (
                    "est_time: 90s",
                    "est_time: 31d",
                    "batches.b.est_time: must be at most 30d",
                ),
                (
                    "retries: 2",
                    "retries: 11",
                    "batches.a.retries: must be 0 to 10",
                ),
                (
                    "retries: 2",
                    "retries: -1",
                    "batches.a.retries: must be 0 to 10",
                ),
                (
                    "on: [timeout, failed, timeout]",
                    "on: []",
                    "batches.b.retries: `on` names no ending",
                ),
                ("on: [timeout, failed, timeout]", "on: [crash]", "retries"),
                ("retries: 2", "retries: {count: 1, when: x}", "retries"),
                ("soft_fail: true", "soft_fail: maybe", "soft_fail"),
                ("fail_fast: true", "fail_fast: 1", "fail_fast"),
            ],
        );
    }
}
