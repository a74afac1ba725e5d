//! Small helpers shared by every layer; a leaf: it imports nothing from cibox.

use std::path::{Path, PathBuf};

/// Keeps what container and job names allow, `[A-Za-z0-9_.-]`; anything else becomes
/// `_`.
pub fn sanitize(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Lowercase hex of a byte slice.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

/// The SHA-256 of all `reader` gives, in lowercase hex (read in chunks, never whole).
pub fn sha256_hex(mut reader: impl std::io::Read) -> std::io::Result<String> {
    use sha2::Digest;
    let mut hasher = sha2::Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = reader.read(&mut buf)?;
        if n == 0 {
            return Ok(hex(&hasher.finalize()));
        }
        hasher.update(&buf[..n]);
    }
}

/// The 8-4-4-4-12 hex groups of a UUID (what follows `GPU-` or `MIG-` in an NVIDIA
/// unit's UUID).
pub fn is_uuid_groups(s: &str) -> bool {
    let groups: Vec<&str> = s.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, n)| g.len() == n && g.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// `bytes` random bytes from the kernel's random source (getrandom(2)), in hex. Fails
/// when it cannot be read, rather than make something predictable of the time and the
/// pid: these name commands' stop tokens, delimiters and files others must not guess.
pub fn random_hex(bytes: usize) -> std::io::Result<String> {
    let mut buf = vec![0u8; bytes];
    getrandom::fill(&mut buf)?;
    Ok(hex(&buf))
}

/// Opens a file someone else may have put there for reading: never blocking on a FIFO,
/// following a symlink only if `follow`, and only if it is a plain file (else
/// `InvalidData`). Returns its metadata too.
pub fn open_plain(
    path: &Path,
    follow: bool,
) -> std::io::Result<(std::fs::File, std::fs::Metadata)> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut flags = nix::libc::O_NONBLOCK | nix::libc::O_CLOEXEC;
    if !follow {
        flags |= nix::libc::O_NOFOLLOW;
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(flags)
        .open(path)?;
    let md = file.metadata()?;
    if !md.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "not a plain file",
        ));
    }
    Ok((file, md))
}

/// The closest known name, when it is close enough to be a typo.
pub fn did_you_mean<'a>(bad: &str, known: &'a [String]) -> Option<&'a str> {
    known
        .iter()
        .map(|k| (strsim::damerau_levenshtein(bad, k), k))
        .filter(|(d, k)| *d <= (k.len() / 3).max(2))
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k.as_str())
}

/// Whether `p` is a regular file someone may execute.
pub fn is_executable_file(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|md| md.is_file() && md.permissions().mode() & 0o111 != 0)
}

/// Finds a program on PATH.
pub fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| is_executable_file(p))
}

/// This host's name, as leases, containers and run records name it.
pub fn host_name() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_default()
}

/// Whether `c` may not reach a terminal or a log as it is: a control character (C0,
/// DEL and C1: newlines, ESC that starts a terminal's escape sequences, the 8-bit CSI
/// and OSC) or a bidirectional override or isolate (which reorders what a line shows).
pub fn is_unsafe_char(c: char) -> bool {
    c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// `text` with control characters (newlines, terminal escapes) and bidirectional
/// overrides written as escapes, so a value from a manifest or a path can neither
/// forge a second line nor drive the terminal when cibox quotes it.
pub fn escape(text: &str) -> std::borrow::Cow<'_, str> {
    escape_but(text, |_| false)
}

/// [`escape`] for text of many lines (a diff, a lockset): newlines and tabs stay as
/// they are, every other control character and override is escaped.
pub fn escape_lines(text: &str) -> std::borrow::Cow<'_, str> {
    escape_but(text, |c| matches!(c, '\n' | '\t'))
}

fn escape_but(text: &str, keep: impl Fn(char) -> bool) -> std::borrow::Cow<'_, str> {
    let unsafe_char = |c: char| is_unsafe_char(c) && !keep(c);
    if !text.chars().any(unsafe_char) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if unsafe_char(c) {
            out.extend(c.escape_debug());
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// `1 GPU`, `3 GPUs`: a count and its noun, in the plural when it is not one.
pub fn count(n: impl Into<u64>, noun: &str) -> String {
    let n = n.into();
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

/// JSON text with what [`is_unsafe_char`] names written as `\uXXXX`: serde_json
/// escapes C0 controls but writes DEL, C1 controls and overrides as they are. Such a
/// character can only stand inside a JSON string, where `\uXXXX` means the same; the
/// whitespace between values (newlines, tabs of pretty JSON) stays.
pub fn escape_json(json: &str) -> std::borrow::Cow<'_, str> {
    let unsafe_char = |c: char| is_unsafe_char(c) && !matches!(c, '\n' | '\t' | '\r');
    if !json.chars().any(unsafe_char) {
        return std::borrow::Cow::Borrowed(json);
    }
    let mut out = String::with_capacity(json.len() + 8);
    for c in json.chars() {
        if unsafe_char(c) {
            out.push_str(&format!("\\u{:04x}", c as u32));
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// A name a shell variable (or a build argument) can have: `[A-Za-z_][A-Za-z0-9_]*`.
pub fn is_env_name(s: &str) -> bool {
    let mut b = s.bytes();
    matches!(b.next(), Some(c) if c.is_ascii_alphabetic() || c == b'_')
        && b.all(|c| c.is_ascii_alphanumeric() || c == b'_')
}

/// Whether `path` is relative and written plainly, as git writes paths: no `.`, `..`,
/// empty or trailing component.
pub fn is_plain_relative(path: &str) -> bool {
    let p = std::path::Path::new(path);
    !path.is_empty()
        && p.components()
            .map(|c| match c {
                std::path::Component::Normal(part) => part.to_str(),
                _ => None,
            })
            .collect::<Option<Vec<_>>>()
            .is_some_and(|parts| parts.join("/") == path)
}

/// Where the kernel's sysfs is read (the GPUs' device links, AMD's KFD topology):
/// `/sys`, or the folder `CIBOX_SYSFS_ROOT` names. Like `CIBOX_NVIDIA_SMI` for the
/// probe, it lets tests point cibox at a fake machine; the invoker's to set, as those.
pub fn sysfs_root() -> PathBuf {
    root_from("CIBOX_SYSFS_ROOT", "/sys")
}

/// Where the GPUs' device files are (`kfd`, `dri/renderD*`): `/dev`, or the folder
/// `CIBOX_DEV_ROOT` names (for tests, as [`sysfs_root`]).
pub fn dev_root() -> PathBuf {
    root_from("CIBOX_DEV_ROOT", "/dev")
}

fn root_from(var: &str, default: &str) -> PathBuf {
    std::env::var_os(var)
        .filter(|v| !v.is_empty())
        .map_or_else(|| PathBuf::from(default), PathBuf::from)
}

#[cfg(test)]
mod tests {
    #[test]
    fn escapes_what_could_forge_a_line_or_drive_a_terminal() {
        assert_eq!(super::escape("plain ünïcode"), "plain ünïcode");
        assert_eq!(super::escape("a\nb"), "a\\nb");
        assert_eq!(super::escape("\u{1b}[2Jx"), "\\u{1b}[2Jx");
        assert_eq!(super::escape("\u{202e}txt"), "\\u{202e}txt");
        assert_eq!(super::escape("\u{9b}31m"), "\\u{9b}31m");
        assert_eq!(
            super::escape_lines("- a\tb\n+ \u{1b}]52;c;eA==\u{7}\n"),
            "- a\tb\n+ \\u{1b}]52;c;eA==\\u{7}\n"
        );
        // JSON keeps its meaning: the escapes are JSON's own.
        let json =
            serde_json::to_string_pretty(&serde_json::json!({"a": "x\u{9b}\u{202e}\u{1b}\n"}))
                .unwrap();
        let safe = super::escape_json(&json);
        assert!(
            !safe.chars().any(|c| c != '\n' && super::is_unsafe_char(c)),
            "{safe}"
        );
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&safe).unwrap()["a"],
            "x\u{9b}\u{202e}\u{1b}\n"
        );
    }

    #[test]
    fn random_hex_is_hex_of_its_length_and_differs_each_time() {
        let a = super::random_hex(16).unwrap();
        assert_eq!(a.len(), 32);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()), "{a}");
        assert_ne!(a, super::random_hex(16).unwrap());
    }
}
