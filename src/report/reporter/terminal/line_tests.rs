use super::*;
use crate::report::reporter::sample;

/// Each batch's verdict, then the run's closing and replay lines.
fn lines_of(run: &RunResult) -> String {
    let mut lines: Vec<String> = run
        .batches
        .iter()
        .map(|b| verdict_line(&b.record, false).to_string())
        .collect();
    lines.extend(closing_lines(run, None));
    lines.extend(replay_lines(run));
    lines.join("\n")
}

#[test]
fn verdict_and_replay_lines_of_a_mixed_run() {
    insta::assert_snapshot!(lines_of(&sample::run()));
}

#[test]
fn verdict_and_closing_lines_of_a_run_shaped_by_time() {
    insta::assert_snapshot!(lines_of(&sample::shaped_run()));
}

#[test]
fn a_batch_that_never_ran_is_said_once_with_no_tests_and_no_replay() {
    use crate::report::record::Status;
    let mut run = sample::run();
    let r = &mut run.batches[2].record;
    r.status = Status::Capacity;
    r.message = Some("batch 8b needs 3 GPUs; the pool has 2".into());
    // The error line said why: the verdict does not say it again.
    let line = verdict_line(r, true).to_string();
    assert_eq!(line, "batch 8b: capacity (never ran) in 12.2s");
    let line = verdict_line(r, false).to_string();
    assert!(
        line.contains(": batch 8b needs 3 GPUs; the pool has 2 (never ran)"),
        "{line}"
    );
    // Nothing to replay: the host would say the same again.
    let replays = replay_lines(&run);
    assert!(!replays.iter().any(|l| l.contains("8b")), "{replays:?}");
    assert!(replays.iter().any(|l| l.contains("4a")), "{replays:?}");
}

#[test]
fn a_wait_that_was_told_is_told_when_it_ends() {
    use crate::report::event::{Event, RunClock};
    let b = crate::plan::run_plan::tests::batch_plan("4a");
    let clock = RunClock::start();
    let at = |secs: u64, kind| Event {
        elapsed: std::time::Duration::from_secs(secs),
        ..clock.now(kind)
    };
    let report = || crate::gpu::WaitReport {
        position: 0,
        first_ahead: None,
        leased: vec![(0, "ci-7".into())],
        busy: Vec::new(),
        waited: std::time::Duration::from_secs(1),
        left: std::time::Duration::from_secs(600),
    };
    let gpus = [crate::gpu::pool::PoolGpu {
        index: 3,
        uuid: "GPU-3".into(),
        parent: None,
    }];
    let mut t = Terminal::new(Vec::new(), Vec::new());
    t.handle(&at(
        1,
        EventKind::Waiting {
            batch: &b,
            report: &report,
        },
    ))
    .unwrap();
    t.handle(&at(
        13,
        EventKind::LeaseGranted {
            batch: &b,
            gpus: &gpus,
        },
    ))
    .unwrap();
    let said = String::from_utf8(t.err.clone()).unwrap();
    assert!(said.contains("batch 4a: waiting"), "{said}");
    assert!(
        said.contains("batch 4a: got GPU(s) 3 after waiting 12s"),
        "{said}"
    );
    // A batch whose wait was never told gets no line when its GPUs come.
    let mut t = Terminal::new(Vec::new(), Vec::new());
    t.handle(&at(
        0,
        EventKind::LeaseGranted {
            batch: &b,
            gpus: &gpus,
        },
    ))
    .unwrap();
    assert!(t.err.is_empty());
}

#[test]
fn one_gpu_is_one_gpu() {
    assert_eq!(crate::util::count(1u32, "GPU"), "1 GPU");
    assert_eq!(crate::util::count(3u32, "GPU"), "3 GPUs");
    let e = crate::run::error::RunError::PoolTooSmall {
        batch: "b".into(),
        need: 1,
        pool: 0,
    };
    assert_eq!(e.to_string(), "batch b needs 1 GPU; the pool has 0");
}

#[test]
fn a_verdict_s_status_word_is_painted_not_quoted() {
    use crate::report::record::Status;
    let run = sample::run();
    for b in &run.batches {
        let code = match b.record.status {
            Status::Passed => 32,
            Status::Failed => 31,
            _ => 33,
        };
        let line = verdict_line(&b.record, false).render(true);
        let word = format!(
            ": \u{1b}[1m\u{1b}[{code}m{}\u{1b}[0m",
            b.record.status.as_str()
        );
        assert!(line.contains(&word), "{line:?}");
        assert!(!line.contains("\\u{1b}"), "{line:?}");
    }
}
