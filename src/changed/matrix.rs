//! The JSON matrix `cibox changed` prints and `cibox changed run` reads back: parsed
//! (bounded: at most 256 files, 1 MiB of text), each row checked against the manifest
//! (a test list entry's row against its entry, any other file as `changed` would list
//! it), and the batches that run them; and what `changed` refuses.

use std::path::PathBuf;

use super::NotATestFile;
use crate::cli::ChangedRunArgs;
use crate::error::{ErrorKind, Result};
use crate::exit::Failure;
use crate::manifest::{ChangedConfig, Manifest};
use crate::util;

/// What `changed` and `changed run` refuse: all usage errors.
#[derive(Debug, thiserror::Error)]
pub enum ChangedError {
    #[error(
        "{}: no `changed` section (patterns, gpus_marker, default_gpus)",
        .manifest.display()
    )]
    NoChangedSection { manifest: PathBuf },
    #[error("changed: --base REF is required")]
    NoBase,
    #[error(
        "changed --unregistered: no batch names its test files; add `tests: [globs]` to the batches"
    )]
    NoTestGlobs,
    /// `changed run` in a manifest without a `changed` section.
    #[error(
        "{}: no `changed` section (patterns, and run: for `changed run`)",
        .manifest.display()
    )]
    NothingToRun { manifest: PathBuf },
    #[error(
        "{}: `changed.run` is missing: say how one test file runs (`run: {{command: 'pytest \"$CIBOX_TEST_FILE\"', timeout: 30m}}`)",
        .manifest.display()
    )]
    NoChangedRun { manifest: PathBuf },
    /// The matrix file cannot be opened or read.
    #[error("--matrix-file {}: {source}", .path.display())]
    MatrixFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("--matrix-env {var}: the variable is not set (or not UTF-8)")]
    MatrixEnvUnset { var: String },
    #[error("changed run: give --matrix-file or --matrix-env")]
    NoMatrix,
    /// `from`: where the matrix came from (`--matrix-file PATH`, `--matrix-env VAR`).
    #[error("{from}: larger than 1 MiB")]
    MatrixTooLarge { from: String },
    #[error("{from}: not JSON: {source}")]
    MatrixNotJson {
        from: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("{from}: `include` is not a list")]
    IncludeNotList { from: String },
    #[error("{from}: expected the matrix `cibox changed` prints")]
    NotAMatrix { from: String },
    #[error("{from}: {count} test files; at most {MAX_FILES} run at once")]
    TooManyFiles { from: String, count: usize },
    #[error("{from}: entry {entry} has no `test_file` string")]
    NoTestFile { from: String, entry: usize },
    #[error(
        "{from}: entry {entry} ({}) has no whole `num_gpus`",
        util::escape(.path)
    )]
    NoGpuCount {
        from: String,
        entry: usize,
        path: String,
    },
    #[error("{from}: `{}` is listed twice", util::escape(.path))]
    MatrixTwice { from: String, path: String },
    /// The matrix names a file `changed` itself would not list.
    #[error("{from}: {why}")]
    NotATestFile {
        from: String,
        #[source]
        why: NotATestFile,
    },
    #[error("batch `{name}` exists in the manifest; `changed run` names its batches changed-N-…")]
    BatchExists { name: String },
    #[error("{from}: entry {entry}'s `batch` is not a string")]
    BatchNotAName { from: String, entry: usize },
    /// A row names a batch that is no test list entry of this manifest, or not the
    /// file's.
    #[error("{from}: `{}` is no test list entry's batch for `{}` in this manifest: make the matrix again with `cibox changed`", util::escape(.batch), util::escape(.path))]
    NotAnEntry {
        from: String,
        batch: String,
        path: String,
    },
    /// A row of an entry says something its batch does not.
    #[error("{from}: the row of batch `{batch}` says {what} {}, the manifest {}: make the matrix again with `cibox changed`", util::escape(.row), util::escape(.manifest))]
    RowDisagrees {
        from: String,
        batch: String,
        what: &'static str,
        row: String,
        manifest: String,
    },
    /// A row without `batch` for a file that test lists run, each with its own
    /// arguments, image and container.
    #[error("{from}: `{}` is run by test list entries ({}): give each row the entry's `batch`, as `cibox changed` prints it", util::escape(.path), .batches.join(", "))]
    EntryWithoutBatch {
        from: String,
        path: String,
        batches: Vec<String>,
    },
}

impl ErrorKind for ChangedError {
    fn failure(&self) -> Failure {
        Failure::Usage
    }
}

/// The most test files one `changed run` runs, and the most matrix text it reads.
const MAX_FILES: usize = 256;
const MAX_MATRIX_BYTES: u64 = 1 << 20;

/// One test file to run and its GPUs, from the matrix; for a test list's entry, the
/// entry's batch and what the row says it runs with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TestFile {
    pub path: String,
    pub gpus: u32,
    /// The test list entry's batch (`batch`), as `changed` prints it.
    pub batch: Option<String>,
    /// The row's `args` and `image`, when it has them: checked against the batch's.
    args: Option<serde_json::Value>,
    image: Option<serde_json::Value>,
}

/// Reads the matrix: `{"include": [...]}`, a list of entries, or one entry, each
/// `{"test_file": PATH, "num_gpus": N}` (other keys ignored, as a workflow matrix may
/// carry more).
fn parse_matrix(text: &str, from: &str) -> std::result::Result<Vec<TestFile>, ChangedError> {
    let from = || from.to_string();
    let v: serde_json::Value =
        serde_json::from_str(text).map_err(|source| ChangedError::MatrixNotJson {
            from: from(),
            source,
        })?;
    let entries: Vec<&serde_json::Value> = match &v {
        serde_json::Value::Object(o) if o.contains_key("include") => match &o["include"] {
            serde_json::Value::Array(a) => a.iter().collect(),
            _ => return Err(ChangedError::IncludeNotList { from: from() }),
        },
        serde_json::Value::Object(_) => vec![&v],
        serde_json::Value::Array(a) => a.iter().collect(),
        _ => return Err(ChangedError::NotAMatrix { from: from() }),
    };
    if entries.len() > MAX_FILES {
        return Err(ChangedError::TooManyFiles {
            from: from(),
            count: entries.len(),
        });
    }
    let mut out: Vec<TestFile> = Vec::new();
    for (i, e) in entries.iter().enumerate() {
        let path = e.get("test_file").and_then(|p| p.as_str()).ok_or_else(|| {
            ChangedError::NoTestFile {
                from: from(),
                entry: i,
            }
        })?;
        let gpus = e
            .get("num_gpus")
            .and_then(|n| n.as_u64())
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| ChangedError::NoGpuCount {
                from: from(),
                entry: i,
                path: path.to_string(),
            })?;
        let batch = match e.get("batch") {
            None | Some(serde_json::Value::Null) => None,
            Some(serde_json::Value::String(b)) => Some(b.clone()),
            Some(_) => {
                return Err(ChangedError::BatchNotAName {
                    from: from(),
                    entry: i,
                });
            }
        };
        if out.iter().any(|t| t.path == path && t.batch == batch) {
            return Err(ChangedError::MatrixTwice {
                from: from(),
                path: match &batch {
                    Some(b) => format!("{path}` (batch `{b}"),
                    None => path.to_string(),
                },
            });
        }
        out.push(TestFile {
            path: path.to_string(),
            gpus,
            batch,
            args: e.get("args").cloned(),
            image: e.get("image").cloned(),
        });
    }
    Ok(out)
}

/// The batch name of the `n`th file (from 1): `changed-N-<file stem>`, in the
/// characters a batch name allows.
fn batch_name(n: usize, path: &str) -> String {
    let stem = std::path::Path::new(path)
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let clean: String = stem
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-') {
                c
            } else {
                '_'
            }
        })
        .take(48)
        .collect();
    format!("changed-{n}-{clean}")
}

/// The matrix's text and where it came from.
pub fn read_matrix(args: &ChangedRunArgs) -> Result<(String, String)> {
    match (&args.matrix_file, &args.matrix_env) {
        (Some(path), _) => {
            use std::io::Read;
            let unreadable = |source| ChangedError::MatrixFile {
                path: path.clone(),
                source,
            };
            let (f, _) = util::open_plain(path, true).map_err(unreadable)?;
            let mut text = String::new();
            f.take(MAX_MATRIX_BYTES + 1)
                .read_to_string(&mut text)
                .map_err(unreadable)?;
            Ok((text, format!("--matrix-file {}", path.display())))
        }
        (None, Some(var)) => {
            let text = std::env::var(var)
                .map_err(|_| ChangedError::MatrixEnvUnset { var: var.clone() })?;
            Ok((text, format!("--matrix-env {var}")))
        }
        (None, None) => Err(ChangedError::NoMatrix.into()),
    }
}

/// Checks a row that names a test list entry's batch against the manifest: the batch
/// is an entry of this file, with the row's GPUs, arguments and image.
fn check_entry_row(m: &Manifest, f: &TestFile, batch: &str, from: &str) -> Result<()> {
    let Some(b) = m
        .batches
        .get(batch)
        .filter(|b| b.family.is_some() && b.tests.first() == Some(&f.path))
    else {
        return Err(ChangedError::NotAnEntry {
            from: from.to_string(),
            batch: batch.to_string(),
            path: f.path.clone(),
        }
        .into());
    };
    let row = super::entry_row(batch, b);
    let disagrees = |what: &'static str, said: String, has: String| ChangedError::RowDisagrees {
        from: from.to_string(),
        batch: batch.to_string(),
        what,
        row: said,
        manifest: has,
    };
    if f.gpus != b.gpus {
        return Err(disagrees("num_gpus", f.gpus.to_string(), b.gpus.to_string()).into());
    }
    for (what, said) in [("args", &f.args), ("image", &f.image)] {
        if let Some(said) = said
            && *said != row[what]
        {
            return Err(disagrees(what, said.to_string(), row[what].to_string()).into());
        }
    }
    Ok(())
}

/// The matrix's rows, each checked against the manifest: a matrix is data someone else
/// made, so only what `changed` itself would list runs, each row once. `from` names
/// where the text came from.
pub fn rows(m: &Manifest, cfg: &ChangedConfig, text: &str, from: String) -> Result<Vec<TestFile>> {
    if text.len() as u64 > MAX_MATRIX_BYTES {
        return Err(ChangedError::MatrixTooLarge { from }.into());
    }
    let files = parse_matrix(text, &from)?;
    for f in &files {
        match &f.batch {
            Some(batch) => check_entry_row(m, f, batch, &from)?,
            None => {
                let entries: Vec<String> = m
                    .batches
                    .iter()
                    .filter(|(_, b)| b.family.is_some() && b.tests.first() == Some(&f.path))
                    .map(|(n, _)| n.clone())
                    .collect();
                if !entries.is_empty() {
                    return Err(ChangedError::EntryWithoutBatch {
                        from,
                        path: f.path.clone(),
                        batches: entries,
                    }
                    .into());
                }
                super::check_test_file(cfg, &f.path).map_err(|why| ChangedError::NotATestFile {
                    from: from.clone(),
                    why,
                })?;
            }
        }
    }
    Ok(files)
}

/// The batches that run `files`: a test list entry's row its entry's batch, any other
/// file a batch made from `changed.run` (`changed-N-<stem>`), added to `m`.
pub fn batches(m: &mut Manifest, cfg: &ChangedConfig, files: &[TestFile]) -> Result<Vec<String>> {
    let mut names: Vec<String> = Vec::new();
    for (i, f) in files.iter().enumerate() {
        if let Some(batch) = &f.batch {
            if !names.contains(batch) {
                names.push(batch.clone());
            }
            continue;
        }
        let Some(template) = &cfg.run else {
            return Err(ChangedError::NoChangedRun {
                manifest: m.path.clone(),
            }
            .into());
        };
        let name = batch_name(i + 1, &f.path);
        if m.batches.contains_key(&name) {
            return Err(ChangedError::BatchExists { name }.into());
        }
        m.batches
            .insert(name.clone(), template.batch_for(&f.path, f.gpus));
        names.push(name);
    }
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matrices_in_every_shape() {
        let one = TestFile {
            path: "tests/test_a.py".into(),
            gpus: 2,
            batch: None,
            args: None,
            image: None,
        };
        for text in [
            r#"{"include": [{"test_file": "tests/test_a.py", "num_gpus": 2}]}"#,
            r#"[{"test_file": "tests/test_a.py", "num_gpus": 2}]"#,
            r#"{"test_file": "tests/test_a.py", "num_gpus": 2, "os": "x"}"#,
        ] {
            assert_eq!(parse_matrix(text, "m").unwrap(), vec![one.clone()]);
        }
        assert!(parse_matrix("{\"include\": 3}", "m").is_err());
        assert!(parse_matrix(r#"[{"test_file": "a", "num_gpus": -1}]"#, "m").is_err());
        assert!(
            parse_matrix(
                r#"[{"test_file": "a", "num_gpus": 1}, {"test_file": "a", "num_gpus": 1}]"#,
                "m"
            )
            .unwrap_err()
            .to_string()
            .contains("listed twice")
        );
        // One file, two entries of a test list: two rows.
        let two = parse_matrix(
            r#"[{"test_file": "a", "num_gpus": 1, "batch": "x"}, {"test_file": "a", "num_gpus": 1, "batch": "y", "args": null}]"#,
            "m",
        )
        .unwrap();
        assert_eq!(two.len(), 2);
        assert_eq!(two[1].args, Some(serde_json::Value::Null));
        assert!(
            parse_matrix(
                r#"[{"test_file": "a", "num_gpus": 1, "batch": "x"}, {"test_file": "a", "num_gpus": 1, "batch": "x"}]"#,
                "m"
            )
            .is_err()
        );
        assert_eq!(
            batch_name(3, "tests/x/test_$(id).py"),
            "changed-3-test___id_"
        );
    }
}
