//! An instruction's flags, as BuildKit's `BFlags` reads them (`--name=value`, or
//! `--name` for a flag that is true or false; names compared as written; a flag given
//! twice refused but `--mount`), and `RUN --mount`'s value, a CSV record read as Go's
//! `encoding/csv` reads one.

use std::collections::HashMap;

/// The flags each instruction takes, and whether each is true-or-false. BuildKit
/// refuses any other.
fn known(command: &str) -> &'static [(&'static str, bool)] {
    match command {
        "FROM" => &[("platform", false)],
        "COPY" => &[
            ("from", false),
            ("chown", false),
            ("chmod", false),
            ("link", true),
            ("parents", true),
            ("exclude", false),
        ],
        "ADD" => &[
            ("chown", false),
            ("chmod", false),
            ("link", true),
            ("keep-git-dir", true),
            ("checksum", false),
            ("exclude", false),
            ("unpack", true),
        ],
        "RUN" => &[
            ("mount", false),
            ("network", false),
            ("security", false),
            ("device", false),
        ],
        "HEALTHCHECK" => &[
            ("interval", false),
            ("timeout", false),
            ("start-period", false),
            ("start-interval", false),
            ("retries", false),
        ],
        _ => &[],
    }
}

/// Flags that may be given more than once.
const REPEATABLE: [&str; 3] = ["mount", "exclude", "device"];

/// The flags of one instruction, by name: each value as given (`true` for a
/// true-or-false flag given without one).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Flags {
    pub values: Vec<(String, String)>,
}

impl Flags {
    /// The last value of `name`.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.values
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn all<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.values
            .iter()
            .filter(move |(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Reads `flags` of `command` (upper case).
pub fn parse(command: &str, flags: &[String]) -> Result<Flags, String> {
    let known = known(command);
    let mut out = Flags::default();
    for f in flags {
        let Some(arg) = f.strip_prefix("--") else {
            return Err(format!("arguments must begin with '--': {f}"));
        };
        let (name, value) = match arg.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (arg, None),
        };
        let Some(&(_, boolean)) = known.iter().find(|(k, _)| *k == name) else {
            return Err(format!("unknown flag: {name}"));
        };
        if !REPEATABLE.contains(&name) && out.values.iter().any(|(n, _)| n == name) {
            return Err(format!("duplicate flag specified: {name}"));
        }
        let value = match (value, boolean) {
            (Some(v), true) if !["true", "false"].contains(&v.to_ascii_lowercase().as_str()) => {
                return Err(format!("expecting boolean value for flag {name}, not: {v}"));
            }
            (Some(v), _) => v.to_string(),
            (None, true) => "true".to_string(),
            (None, false) => return Err(format!("missing a value on flag: {name}")),
        };
        out.values.push((name.to_string(), value));
    }
    Ok(out)
}

/// One `--mount`: its fields by key (lower case), `true` for a key given alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    pub fields: HashMap<String, String>,
}

impl Mount {
    pub fn kind(&self) -> &str {
        self.fields.get("type").map_or("bind", String::as_str)
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.fields.get(key).map(String::as_str)
    }

    /// The target (`target`, `dst`, `destination`).
    pub fn target(&self) -> Option<&str> {
        ["target", "dst", "destination"]
            .iter()
            .find_map(|k| self.get(k))
    }
}

/// Keys a `--mount` field may have, and those that may stand alone.
const MOUNT_KEYS: [&str; 17] = [
    "type",
    "from",
    "source",
    "src",
    "target",
    "dst",
    "destination",
    "readonly",
    "ro",
    "readwrite",
    "rw",
    "required",
    "id",
    "sharing",
    "mode",
    "uid",
    "gid",
];
const MOUNT_ALONE: [&str; 5] = ["readonly", "ro", "readwrite", "rw", "required"];

/// Reads a `--mount` value. A field whose value a BuildKit version puts variables
/// into and another does not (`type`, `from`, a secret's `id` and `target`) may not
/// hold a `$`.
pub fn mount(value: &str) -> Result<Mount, String> {
    let mut fields = HashMap::new();
    for field in csv_record(value)? {
        let (key, v) = match field.split_once('=') {
            Some((k, v)) => (k.to_ascii_lowercase(), v.to_string()),
            None => {
                let k = field.to_ascii_lowercase();
                if !MOUNT_ALONE.contains(&k.as_str()) {
                    return Err(format!("invalid field '{field}' must be a key=value pair"));
                }
                (k, "true".to_string())
            }
        };
        if !MOUNT_KEYS.contains(&key.as_str()) {
            return Err(format!("unexpected key '{key}' in '{field}'"));
        }
        fields.insert(key, v);
    }
    let m = Mount { fields };
    if !["bind", "cache", "tmpfs", "secret", "ssh"].contains(&m.kind()) {
        return Err(format!("unsupported mount type {}", m.kind()));
    }
    let mut pinned = vec!["type", "from"];
    if m.kind() == "secret" {
        pinned.extend(["id", "target", "dst", "destination"]);
    }
    for key in pinned {
        if m.get(key).is_some_and(|v| v.contains('$')) {
            return Err(format!(
                "`{key}` holds a `$`: BuildKit versions differ on whether a mount's {key} is expanded; write it plainly"
            ));
        }
    }
    Ok(m)
}

/// One CSV record as Go's `encoding/csv` reads it (comma separated; a field that
/// starts with `"` is quoted, `""` in it is a quote; a quote anywhere else is an
/// error).
fn csv_record(line: &str) -> Result<Vec<String>, String> {
    if line.is_empty() {
        return Err("failed to parse csv mounts: an empty mount".into());
    }
    let bad = |why: &str| format!("failed to parse csv mounts: {why}");
    let mut fields = Vec::new();
    let mut chars = line.chars().peekable();
    loop {
        let mut field = String::new();
        if chars.peek() == Some(&'"') {
            chars.next();
            loop {
                match chars.next() {
                    None => return Err(bad("extraneous or missing \" in quoted-field")),
                    Some('"') if chars.peek() == Some(&'"') => {
                        chars.next();
                        field.push('"');
                    }
                    Some('"') => break,
                    Some(c) => field.push(c),
                }
            }
            match chars.next() {
                None => {
                    fields.push(field);
                    return Ok(fields);
                }
                Some(',') => fields.push(field),
                Some(_) => return Err(bad("extraneous or missing \" in quoted-field")),
            }
        } else {
            loop {
                match chars.next() {
                    None => {
                        fields.push(field);
                        return Ok(fields);
                    }
                    Some(',') => break,
                    Some('"') => return Err(bad("bare \" in non-quoted-field")),
                    Some(c) => field.push(c),
                }
            }
            fields.push(field);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_are_read_as_bflags_reads_them() {
        let f = parse("COPY", &["--from=a".into(), "--link".into()]).unwrap();
        assert_eq!(f.get("from"), Some("a"));
        assert_eq!(f.get("link"), Some("true"));
        for bad in [
            vec!["--FROM=a"],
            vec!["--from"],
            vec!["--from=a", "--from=b"],
            vec!["--link=maybe"],
            vec!["from=a"],
        ] {
            let flags: Vec<String> = bad.iter().map(|s| s.to_string()).collect();
            assert!(parse("COPY", &flags).is_err(), "{bad:?}");
        }
        let f = parse(
            "RUN",
            &[
                "--mount=type=cache,target=/a".into(),
                "--mount=type=tmpfs,target=/b".into(),
            ],
        )
        .unwrap();
        assert_eq!(f.all("mount").count(), 2);
    }

    #[test]
    fn mounts_are_csv() {
        let m = mount("type=bind,\"from=evil:1\",target=/m").unwrap();
        assert_eq!(m.get("from"), Some("evil:1"));
        let m = mount("type=secret,id=tok,required").unwrap();
        assert_eq!((m.kind(), m.get("required")), ("secret", Some("true")));
        assert_eq!(mount("target=/x").unwrap().kind(), "bind");
        let m = mount("\"type=secret\",\"id=a,b\"").unwrap();
        assert_eq!(m.get("id"), Some("a,b"));
        for bad in [
            "type=bind,f\"rom\"=x",
            "\"type=bind\"x",
            "\"type=bind",
            "type=bind,from=$X",
            "type=secret,id=${ID}",
            "type=weird",
            "type=bind,color=red",
            "type=bind,nothing",
            "",
        ] {
            assert!(mount(bad).is_err(), "{bad}");
        }
    }
}
