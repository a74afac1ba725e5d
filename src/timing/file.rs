//! `timings.json`: how long each batch of a run took, written in the reports folder by
//! every run, and read back with `--timings` (docs/interface.md §7). The file that
//! comes back is often a pull request's artifact, so it is read as anyone's: a plain
//! file of bounded size, every name a batch name, every time a finite number of
//! seconds within 30 days, or it is refused whole.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::error::TimingError;

/// The schema this cibox writes and reads.
pub const SCHEMA: u32 = 1;
/// The file's name in a reports folder.
pub const FILE_NAME: &str = "timings.json";
/// The largest timings file read: 10,000 batches take well under a megabyte.
const MAX_BYTES: u64 = 8 << 20;
/// The most batches one file may name.
const MAX_BATCHES: usize = 100_000;
/// The most files one run reads (a folder of downloaded artifacts).
const MAX_FILES: usize = 1000;
/// The most bytes one run reads of all its files: each file's bound alone would let
/// 1,000 files cost minutes of parsing.
const MAX_TOTAL_BYTES: u64 = 64 << 20;
/// The longest time a file may record.
const MAX_SECONDS: f64 = 30.0 * 24.0 * 3600.0;

/// A run's `timings.json`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TimingsFile {
    pub schema: u32,
    pub project: String,
    /// The run that recorded them.
    pub run: String,
    pub batches: BTreeMap<String, BatchTiming>,
}

/// How long one batch ran.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct BatchTiming {
    /// Seconds its last attempt ran, from its container's start to its end (waits for
    /// GPUs or for Slurm left out).
    pub seconds: f64,
    pub gpus: u32,
    /// How it ended.
    pub status: String,
    /// How many times it ran.
    #[serde(default = "one")]
    pub attempts: u32,
}

fn one() -> u32 {
    1
}

impl TimingsFile {
    /// The file's text.
    pub fn to_json(&self) -> String {
        let mut text = serde_json::to_string_pretty(self).expect("timings serialise");
        text.push('\n');
        text
    }
}

/// Times recorded by earlier runs, by batch name: the mean of every file that names
/// the batch.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Recorded {
    times: BTreeMap<String, Duration>,
    /// The files read.
    pub files: Vec<PathBuf>,
}

impl Recorded {
    /// What `paths` record: each a `timings.json`, or a folder whose `timings.json`
    /// files (in it and in its folders, one level down: downloaded artifacts) are read.
    pub fn read(paths: &[PathBuf]) -> Result<Recorded, TimingError> {
        let mut files = Vec::new();
        for p in paths {
            let err = |why: String| TimingError::File {
                path: p.display().to_string(),
                why,
            };
            let md = std::fs::metadata(p).map_err(|e| err(e.to_string()))?;
            if md.is_dir() {
                let found = found_in(p).map_err(err)?;
                if found.is_empty() {
                    crate::console::warn(format!(
                        "--timings {}: holds no {FILE_NAME} (in it or a folder in it); batches keep their est_time",
                        p.display()
                    ));
                }
                files.extend(found);
            } else {
                files.push(p.clone());
            }
            if files.len() > MAX_FILES {
                return Err(err(format!(
                    "more than {MAX_FILES} timings files; name fewer"
                )));
            }
        }
        // Bounded in all, not only file by file: 1,000 files of 100,000 names each
        // would hold a hundred million names (many GiB) in memory.
        let mut budget = MAX_TOTAL_BYTES;
        let mut sums: BTreeMap<String, (f64, u32)> = BTreeMap::new();
        for f in &files {
            for (name, t) in read_one(f, &mut budget)?.batches {
                let e = sums.entry(name).or_default();
                e.0 += t.seconds;
                e.1 += 1;
            }
            if sums.len() > MAX_BATCHES {
                return Err(TimingError::File {
                    path: f.display().to_string(),
                    why: format!(
                        "the timings files name more than {MAX_BATCHES} batches in all; name fewer files"
                    ),
                });
            }
        }
        let times = sums
            .into_iter()
            .map(|(n, (sum, count))| {
                // Whole milliseconds: every runner gets the same split.
                let ms = (sum / f64::from(count) * 1000.0).round() as u64;
                (n, Duration::from_millis(ms))
            })
            .collect();
        Ok(Recorded { times, files })
    }

    /// What was recorded for `batch`.
    pub fn get(&self, batch: &str) -> Option<Duration> {
        self.times.get(batch).copied()
    }

    #[cfg(test)]
    pub fn from_times(times: impl IntoIterator<Item = (String, Duration)>) -> Recorded {
        Recorded {
            times: times.into_iter().collect(),
            files: Vec::new(),
        }
    }
}

/// The `timings.json` files in `dir` and in its folders, sorted; links not followed.
/// A folder of more folders than files are read is refused, not cut: which folders a
/// cut kept would follow the file system's order, and runners that read different
/// files split the batches differently (a batch could land in no part at all).
fn found_in(dir: &Path) -> Result<Vec<PathBuf>, String> {
    let mut found = Vec::new();
    let direct = dir.join(FILE_NAME);
    if std::fs::symlink_metadata(&direct).is_ok_and(|m| m.is_file()) {
        found.push(direct);
    }
    let mut subs: Vec<PathBuf> = Vec::new();
    for e in std::fs::read_dir(dir).map_err(|e| e.to_string())? {
        let e = e.map_err(|e| e.to_string())?;
        if e.file_type().map_err(|e| e.to_string())?.is_dir() {
            subs.push(e.path());
        }
        if subs.len() > MAX_FILES {
            return Err(format!(
                "holds more than {MAX_FILES} folders; name the folders of the runs' artifacts instead"
            ));
        }
    }
    subs.sort();
    for s in subs {
        let f = s.join(FILE_NAME);
        if std::fs::symlink_metadata(&f).is_ok_and(|m| m.is_file()) {
            found.push(f);
        }
    }
    Ok(found)
}

/// One file, checked whole; what it holds is taken from `budget`, the bytes left to
/// read of all the run's files.
fn read_one(path: &Path, budget: &mut u64) -> Result<TimingsFile, TimingError> {
    let err = |why: String| TimingError::File {
        path: path.display().to_string(),
        why,
    };
    // Anyone's file: a plain one (a FIFO would block), read only so far.
    let (file, md) = crate::util::open_plain(path, true).map_err(|e| err(e.to_string()))?;
    if md.len() > MAX_BYTES {
        return Err(err(format!(
            "larger than {} MiB; a timings file is far smaller",
            MAX_BYTES >> 20
        )));
    }
    let over_budget = || {
        err(format!(
            "the timings files hold more than {} MiB in all; name fewer files",
            MAX_TOTAL_BYTES >> 20
        ))
    };
    if md.len() > *budget {
        return Err(over_budget());
    }
    let mut text = String::new();
    file.take(MAX_BYTES.min(*budget) + 1)
        .read_to_string(&mut text)
        .map_err(|e| err(e.to_string()))?;
    let read = text.len() as u64;
    if read > *budget {
        return Err(over_budget());
    }
    *budget -= read;
    let parsed: TimingsFile = serde_json::from_str(&text).map_err(|e| {
        // Said by where, never by what: serde's message quotes the value it met,
        // and the file may be one the user may not read (a link named here).
        err(format!(
            "not a cibox timings file (line {}, column {}: {})",
            e.line(),
            e.column(),
            match e.classify() {
                serde_json::error::Category::Io => "unreadable",
                serde_json::error::Category::Syntax => "not JSON",
                serde_json::error::Category::Data => "not the fields or types of one",
                serde_json::error::Category::Eof => "it ends early",
            }
        ))
    })?;
    if parsed.schema != SCHEMA {
        return Err(err(format!(
            "schema {} is not one this cibox reads ({SCHEMA})",
            parsed.schema
        )));
    }
    if parsed.batches.len() > MAX_BATCHES {
        return Err(err(format!("names more than {MAX_BATCHES} batches")));
    }
    for (name, t) in &parsed.batches {
        if !crate::manifest::is_batch_name(name) {
            return Err(err(format!(
                "`{}` is not a batch name",
                crate::util::escape(name)
            )));
        }
        if !t.seconds.is_finite() || !(0.0..=MAX_SECONDS).contains(&t.seconds) {
            return Err(err(format!(
                "batch {name}: {} seconds is no time a batch ran (0 to 30 days)",
                t.seconds
            )));
        }
    }
    Ok(parsed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(batches: &[(&str, f64)]) -> String {
        TimingsFile {
            schema: SCHEMA,
            project: "p".into(),
            run: "0123456789abcdef".into(),
            batches: batches
                .iter()
                .map(|(n, s)| {
                    (
                        n.to_string(),
                        BatchTiming {
                            seconds: *s,
                            gpus: 1,
                            status: "passed".into(),
                            attempts: 1,
                        },
                    )
                })
                .collect(),
        }
        .to_json()
    }

    #[test]
    fn files_and_folders_of_artifacts_are_read_and_their_times_averaged() {
        let d = tempfile::tempdir().unwrap();
        let one = d.path().join("one.json");
        std::fs::write(&one, file(&[("a", 10.0), ("b", 1.5)])).unwrap();
        let arts = d.path().join("artifacts");
        for (i, t) in [(1, 30.0), (2, 50.0)] {
            std::fs::create_dir_all(arts.join(format!("part-{i}"))).unwrap();
            std::fs::write(
                arts.join(format!("part-{i}/timings.json")),
                file(&[("a", t)]),
            )
            .unwrap();
        }
        let r = Recorded::read(&[one, arts]).unwrap();
        assert_eq!(r.files.len(), 3);
        assert_eq!(r.get("a"), Some(Duration::from_secs(30)));
        assert_eq!(r.get("b"), Some(Duration::from_millis(1500)));
        assert_eq!(r.get("c"), None);
    }

    #[test]
    fn a_hostile_file_is_refused_whole_with_its_path() {
        let d = tempfile::tempdir().unwrap();
        let refused = |text: &str| {
            let p = d.path().join("t.json");
            std::fs::write(&p, text).unwrap();
            Recorded::read(&[p]).unwrap_err().to_string()
        };
        let bad = refused(&file(&[("a", -1.0)]));
        assert!(
            bad.contains("t.json: batch a: -1 seconds is no time"),
            "{bad}"
        );
        let bad = refused(&file(&[("../x", 1.0)]));
        assert!(bad.contains("is not a batch name"), "{bad}");
        let bad = refused(&file(&[("a\u{1b}]52;", 1.0)]));
        assert!(!bad.contains('\u{1b}'), "{bad}");
        let bad = refused(&file(&[("a", 1.0)]).replace("\"schema\": 1", "\"schema\": 9"));
        assert!(bad.contains("schema 9"), "{bad}");
        let bad = refused("{\"x\": 1}");
        assert!(bad.contains("not a cibox timings file"), "{bad}");
        // What it holds is never quoted back.
        let bad = refused(r#"{"schema": "ghp_SECRET", "project": "p", "run": "x", "batches": {}}"#);
        assert!(
            !bad.contains("ghp_SECRET") && bad.contains("line 1"),
            "{bad}"
        );
        let bad = refused(&file(&[("a", 1e300)]));
        assert!(bad.contains("no time a batch ran"), "{bad}");
        // Missing, a FIFO: said, never waited on.
        let missing = Recorded::read(&[d.path().join("none.json")]).unwrap_err();
        assert!(missing.to_string().contains("none.json"), "{missing}");
        let fifo = d.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
        let e = Recorded::read(&[fifo]).unwrap_err().to_string();
        assert!(e.contains("not a plain file"), "{e}");
        // Too big.
        let big = d.path().join("big.json");
        let f = std::fs::File::create(&big).unwrap();
        f.set_len(MAX_BYTES + 1).unwrap();
        let e = Recorded::read(&[big]).unwrap_err().to_string();
        assert!(e.contains("larger than 8 MiB"), "{e}");
    }

    #[test]
    fn a_folder_of_more_folders_than_are_read_is_refused_not_cut() {
        // The file system's order decided which folders were read: a runner could
        // miss a file another read, and the runners' splits differ.
        let d = tempfile::tempdir().unwrap();
        for i in 0..=MAX_FILES {
            std::fs::create_dir(d.path().join(format!("part-{i:04}"))).unwrap();
        }
        std::fs::write(
            d.path().join(format!("part-{MAX_FILES:04}/timings.json")),
            file(&[("a", 1.0)]),
        )
        .unwrap();
        let e = Recorded::read(&[d.path().to_path_buf()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("holds more than 1000 folders"), "{e}");
    }

    #[test]
    fn files_that_hold_too_much_in_all_are_refused() {
        let d = tempfile::tempdir().unwrap();
        // Names: each file within its bound, more than 100,000 batches in all.
        let half = MAX_BATCHES / 2 + 1;
        let mut paths = Vec::new();
        for f in 0..2 {
            let names: Vec<(String, f64)> =
                (0..half).map(|i| (format!("f{f}-b{i}"), 1.0)).collect();
            let named: Vec<(&str, f64)> = names.iter().map(|(n, s)| (n.as_str(), *s)).collect();
            let p = d.path().join(format!("names-{f}.json"));
            std::fs::write(&p, file(&named)).unwrap();
            paths.push(p);
        }
        let e = Recorded::read(&paths).unwrap_err().to_string();
        assert!(e.contains("more than 100000 batches in all"), "{e}");
        // Bytes: each file within its 8 MiB, more than 64 MiB in all.
        let padded = format!(
            "{}{}",
            file(&[("a", 1.0)]),
            " ".repeat((MAX_BYTES - 1024) as usize)
        );
        let paths: Vec<PathBuf> = (0..(MAX_TOTAL_BYTES / MAX_BYTES + 1))
            .map(|i| {
                let p = d.path().join(format!("padded-{i}.json"));
                std::fs::write(&p, &padded).unwrap();
                p
            })
            .collect();
        let e = Recorded::read(&paths).unwrap_err().to_string();
        assert!(e.contains("more than 64 MiB in all"), "{e}");
    }
}
