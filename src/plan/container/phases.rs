//! Which phase of a batch's script was under way when it ended: the script announces
//! each step (`cibox install: CMD`, `cibox preflight: CMD`, `cibox run: CMD`) before it
//! runs it, so a batch that failed while installing the source can be told from one
//! whose tests failed, and named as such with the end of that step's output. A batch
//! can print a fake announcement, but only to word its own failure differently.
//!
//! A script that ends well with `/reports` empty says so last ([`REPORTS_EMPTY`]), so
//! that cibox need not read an empty folder out of the container. A batch can print
//! that line while its `/reports` holds files, but then it only loses its own reports
//! (as it could by deleting them): no reports is what it said it has.

/// The script's last line when every step passed and `/reports` holds nothing.
pub const REPORTS_EMPTY: &str = "cibox reports: none";

/// How much of the step's output is kept.
const TAIL_BYTES: usize = 2048;
/// The longest line looked at for an announcement.
const MAX_LINE: usize = 64 * 1024;

/// The steps of a run and of each batch, in order; the script announces three of them
/// (install, preflight, run), each followed here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// The run's images were verified against their lock files.
    Verify,
    /// The batch's Slurm job left Slurm's queue: its nodes were allocated.
    Queue,
    /// The batch's GPUs were leased (or it needs none).
    Lease,
    /// Its container was created.
    Create,
    /// The source was copied into its `/work`.
    Copy,
    /// An install, preflight or run step was announced.
    Install,
    Preflight,
    Run,
    /// Its `/reports` was copied out and its test cases read.
    Collect,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Verify => "verify",
            Phase::Queue => "queue",
            Phase::Lease => "lease",
            Phase::Create => "create",
            Phase::Copy => "copy",
            Phase::Install => "install",
            Phase::Preflight => "preflight",
            Phase::Run => "run",
            Phase::Collect => "collect",
        }
    }
}

/// Follows the announcements in a batch's output.
#[derive(Debug, Default)]
pub struct PhaseTracker {
    /// The last step announced, and its command.
    current: Option<(Phase, String)>,
    /// What it printed since.
    tail: Vec<u8>,
    line: Vec<u8>,
    /// The last line so far is [`REPORTS_EMPTY`] (nothing came after it).
    said_reports_empty: bool,
}

impl PhaseTracker {
    /// Takes what the batch printed, as it came; returns the steps announced in it,
    /// each with where in `bytes` its announcement's line ends (after its newline).
    pub fn feed(&mut self, bytes: &[u8]) -> Vec<(usize, Phase, String)> {
        let mut announced = Vec::new();
        for (i, &b) in bytes.iter().enumerate() {
            if b == b'\n' {
                announced.extend(self.end_line().map(|(p, cmd)| (i + 1, p, cmd)));
            } else {
                self.said_reports_empty = false;
                if self.line.len() < MAX_LINE {
                    self.line.push(b);
                }
            }
            self.tail.push(b);
        }
        if self.tail.len() > 2 * TAIL_BYTES {
            self.tail.drain(..self.tail.len() - TAIL_BYTES);
        }
        announced
    }

    fn end_line(&mut self) -> Option<(Phase, String)> {
        // Glued onto what a step left without a newline, like the announcements.
        self.said_reports_empty = self.line.ends_with(REPORTS_EMPTY.as_bytes());
        let line = String::from_utf8_lossy(&self.line);
        let mut announced = None;
        for phase in [Phase::Install, Phase::Preflight, Phase::Run] {
            let marker = format!("cibox {}: ", phase.as_str());
            if let Some(at) = line.rfind(&marker) {
                let cmd = line[at + marker.len()..].to_string();
                self.current = Some((phase, cmd.clone()));
                self.tail.clear();
                announced = Some((phase, cmd));
                break;
            }
        }
        self.line.clear();
        announced
    }

    /// The batch's script said, as its last line, that it left `/reports` empty.
    pub fn said_reports_empty(&self) -> bool {
        self.said_reports_empty
    }

    /// When the batch failed with `code` while installing the source or in a
    /// preflight step, which one, in one line with the end of its output.
    pub fn setup_failure(&self, code: i64) -> Option<String> {
        let (phase, cmd) = self.current.as_ref()?;
        if *phase == Phase::Run {
            return None;
        }
        let text = String::from_utf8_lossy(&self.tail);
        let last: Vec<&str> = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect();
        let last = last[last.len().saturating_sub(3)..].join(" | ");
        let ends = if last.is_empty() {
            "it printed nothing".to_string()
        } else {
            format!("its output ends: {last}")
        };
        Some(format!(
            "the {} step `{cmd}` failed with exit {code}, before any test ran; {ends}",
            phase.as_str()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failing_install_is_told_from_failing_tests() {
        let mut t = PhaseTracker::default();
        t.feed(b"cibox install: pip install -e .\nCollecting x\nERROR: No matching distribution\n");
        assert_eq!(
            t.setup_failure(1).unwrap(),
            "the install step `pip install -e .` failed with exit 1, before any test ran; its output ends: Collecting x | ERROR: No matching distribution"
        );
        t.feed(b"partial cibox run: pytest\nF\n");
        assert_eq!(t.setup_failure(1), None, "a run step was under way");
        let mut quiet = PhaseTracker::default();
        quiet.feed(b"cibox preflight: nvidia-smi\n");
        assert!(
            quiet
                .setup_failure(127)
                .unwrap()
                .ends_with("it printed nothing")
        );
    }

    #[test]
    fn an_empty_reports_folder_is_said_by_the_last_line_only() {
        let mut t = PhaseTracker::default();
        t.feed(b"cibox run: true\nok\ncibox reports: no");
        assert!(!t.said_reports_empty(), "a line not yet ended");
        t.feed(b"ne\n");
        assert!(t.said_reports_empty());
        // Output after it (a worker the script left behind): no longer the last word.
        t.feed(b"late");
        assert!(!t.said_reports_empty());
        t.feed(b"\n");
        assert!(!t.said_reports_empty());
        // Glued onto a line a step left without a newline.
        t.feed(b"no newlinecibox reports: none\n");
        assert!(t.said_reports_empty());
    }
}
