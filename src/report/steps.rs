//! `verdict: exit-code`: a batch whose tests are scripts that write no JUnit. Its steps'
//! exit status is the verdict; each `run` step becomes a test case, timed from the
//! moment its announcement (`cibox run: CMD`, printed by the container's script before
//! the step) came through the output stream, with the tail of what it printed.
//!
//! The times are cibox's, taken as the stream arrives; the announcements are matched in
//! order. A step never announced fails the batch even when it exited 0: a step that
//! `exec`s or `exit`s ends the script, and the steps after it did not run. A batch that
//! prints a fake announcement can shift a step's timing or pass a step off as run, but
//! no more than its code could anyway: with this verdict the test code's own exit
//! status is what passes it.

use std::time::Instant;

use crate::report::junit::{Case, CaseStatus};

/// Why a step the batch never announced fails a batch that exited 0.
const UNSEEN: &str = "did not run: the batch exited 0 before this step was announced (an earlier step that runs `exec` or `exit` ends the script), or its output was lost";

/// How much of a step's output its case keeps.
const TAIL_BYTES: usize = 4096;
/// The longest line looked at for an announcement; longer output is only counted.
const MAX_LINE: usize = 64 * 1024;

#[derive(Debug)]
pub struct StepTracker {
    /// The announcement lines, in order (the first line of each command).
    markers: Vec<String>,
    names: Vec<String>,
    /// When each announced step started.
    started: Vec<Instant>,
    /// The output tail of the step under way (of the last announced).
    tails: Vec<Vec<u8>>,
    line: Vec<u8>,
}

impl StepTracker {
    pub fn new(run: &[String]) -> StepTracker {
        StepTracker {
            markers: run
                .iter()
                .map(|c| format!("cibox run: {}", c.lines().next().unwrap_or("")))
                .collect(),
            names: run
                .iter()
                .map(|c| {
                    let first = c.lines().next().unwrap_or("").trim();
                    let short: String = first.chars().take(120).collect();
                    if short.len() < first.len() {
                        format!("{short}…")
                    } else {
                        short
                    }
                })
                .collect(),
            started: Vec::new(),
            tails: Vec::new(),
            line: Vec::new(),
        }
    }

    /// Takes what the batch printed, as it came.
    pub fn feed(&mut self, bytes: &[u8]) {
        for &b in bytes {
            if b == b'\n' {
                self.end_line();
            } else if self.line.len() < MAX_LINE {
                self.line.push(b);
            }
            if let Some(tail) = self.tails.last_mut() {
                tail.push(b);
                if tail.len() > 2 * TAIL_BYTES {
                    tail.drain(..tail.len() - TAIL_BYTES);
                }
            }
        }
    }

    fn end_line(&mut self) {
        let next = self.started.len();
        // A line that ends with the announcement: the step before may have left its
        // last line without a newline (`printf 'ok'`).
        if next < self.markers.len() && self.line.ends_with(self.markers[next].as_bytes()) {
            self.started.push(Instant::now());
            self.tails.push(Vec::new());
        }
        self.line.clear();
    }

    /// Whether any `run` step was announced (began).
    pub fn began(&self) -> bool {
        !self.started.is_empty()
    }

    /// One case per `run` step: passed, failed (the step under way when the batch ended
    /// without success), or skipped (never reached; or under way when the batch was
    /// `cancelled`: a step stopped from outside neither passed nor failed).
    pub fn cases(
        &self,
        batch: &str,
        ended_at: Instant,
        (succeeded, cancelled): (bool, bool),
    ) -> Vec<Case> {
        let last = self.started.len();
        (0..self.markers.len())
            .map(|i| {
                let (status, time_s, message) = if i < last {
                    let end = self.started.get(i + 1).copied().unwrap_or(ended_at);
                    let secs = end.saturating_duration_since(self.started[i]).as_secs_f64();
                    let failed = !succeeded && i + 1 == last;
                    let tail = &self.tails[i];
                    let tail =
                        String::from_utf8_lossy(&tail[tail.len().saturating_sub(TAIL_BYTES)..])
                            .into_owned();
                    if failed && cancelled {
                        let why = "cancelled while it ran: it neither passed nor failed";
                        (CaseStatus::Skipped, Some(secs), Some(why.to_string()))
                    } else if failed {
                        (CaseStatus::Failed, Some(secs), Some(tail))
                    } else {
                        (CaseStatus::Passed, Some(secs), None)
                    }
                } else if succeeded {
                    // The batch ended well without reaching this step: an earlier one
                    // ended the script (`exec`, `exit 0`), or its output was lost.
                    // Either way nobody saw it pass.
                    (CaseStatus::Failed, None, Some(UNSEEN.to_string()))
                } else {
                    (
                        CaseStatus::Skipped,
                        None,
                        Some("not reached: an earlier step failed".to_string()),
                    )
                };
                Case {
                    classname: batch.to_string(),
                    name: format!("step {}: {}", i + 1, self.names[i]),
                    status,
                    message,
                    text: None,
                    time_s,
                    file: None,
                    line: None,
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_become_cases_in_order() {
        let run = vec![
            "./a.sh".to_string(),
            "./b.sh --x".to_string(),
            "./c.sh".to_string(),
        ];
        let mut t = StepTracker::new(&run);
        t.feed(b"install noise\ncibox run: ./a.sh\nA out\ncibox run: ./c.sh\n");
        t.feed(b"cibox run: ./b.sh --x\nB o");
        t.feed(b"ut\nboom\n");
        let cases = t.cases("scripts", Instant::now(), (false, false));
        assert_eq!(cases.len(), 3);
        assert_eq!(cases[0].name, "step 1: ./a.sh");
        assert_eq!(cases[0].status, CaseStatus::Passed);
        // A marker out of order (c before b) is output, not a step.
        assert!(cases[0].message.is_none());
        assert_eq!(cases[1].status, CaseStatus::Failed);
        assert!(
            cases[1]
                .message
                .as_deref()
                .unwrap()
                .ends_with("B out\nboom\n")
        );
        assert_eq!(cases[2].status, CaseStatus::Skipped);
        // Cancelled while step 2 ran: step 2 neither passed nor failed.
        let cancelled = t.cases("scripts", Instant::now(), (false, true));
        assert_eq!(cancelled[0].status, CaseStatus::Passed);
        assert_eq!(cancelled[1].status, CaseStatus::Skipped);
        assert!(
            cancelled[1]
                .message
                .as_deref()
                .unwrap()
                .starts_with("cancelled while it ran")
        );
        let ok = t.cases("scripts", Instant::now(), (true, false));
        assert!(ok[..2].iter().all(|c| c.status == CaseStatus::Passed));
        // Step 3 never came: an `exec` or `exit 0` in step 2 ended the script.
        assert_eq!(ok[2].status, CaseStatus::Failed);
        assert!(ok[2].message.as_deref().unwrap().starts_with("did not run"));
        // Glued onto a line step 2 left without a newline.
        t.feed(b"no newline herecibox run: ./c.sh\n");
        let all = t.cases("scripts", Instant::now(), (true, false));
        assert!(all.iter().all(|c| c.status == CaseStatus::Passed));
    }
}
