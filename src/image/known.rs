//! What this user's builds have normalised before: an index from the engine's raw build
//! (and everything else normalising it depends on) to the normalised image, so that a
//! rebuild the engine takes wholly from its cache costs what `docker build` costs: no
//! save, no rewrite, no load.
//!
//! The index is a folder of this user's (`$XDG_CACHE_HOME/cibox/normalised`, else
//! `~/.cache/cibox/normalised`), made mode 0700 and used only while it is theirs, not a
//! link, and open to nobody else: another local user can neither write an entry nor
//! swap one. An entry is used only when the image it names is in the engine (an ID is
//! the digest of what it names, so it is the image that was loaded) with the build's
//! lockset labels; anything else is a miss, and the build goes the long way.
//! The key covers the raw build's ID (the digest of its config: its layers, steps and
//! labels), the epoch, the base layers kept as they are, the builder, the values
//! searched for (by digest) and cibox's own commit: what normalising reads.

use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::PathBuf;

use sha2::{Digest, Sha256};

use super::ImageId;
use crate::engine::Engine;
use crate::mask::Hidden;

/// What an entry starts with.
const MAGIC: &str = "cibox-normalised 1";

/// The index's folder, made if missing; `None` where there is no home to keep it, or
/// it is not this user's alone.
fn folder() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .filter(|v| !v.is_empty())
                .map(|h| PathBuf::from(h).join(".cache"))
        })?;
    if !base.is_absolute() {
        return None;
    }
    let dir = base.join("cibox").join("normalised");
    let _ = std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir);
    let md = std::fs::symlink_metadata(&dir).ok()?;
    let me = nix::unistd::geteuid().as_raw();
    let mine = md.uid() == me && md.is_dir() && md.mode() & 0o077 == 0;
    // Nor may anyone else swap a folder on the way to it.
    (mine && crate::ownership::changeable_by_others(&dir, me).is_none()).then_some(dir)
}

/// The file of layers that held what the host gave a build that was refused for it.
const REFUSED: &str = "refused-layers";

/// The most of [`REFUSED`] read.
const MAX_REFUSED: u64 = 4 << 20;

/// Writes down the layers of a raw build refused because one of them holds a secret's
/// value or a proxy's credentials: the engine's build cache keeps the step that wrote
/// them (it does not key on a secret's value), and a later build, given no secret or
/// another, would take it from there unseen.
pub fn refuse_layers(layers: &[String]) {
    let Some(dir) = folder() else {
        return;
    };
    let Ok(mut f) = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(dir.join(REFUSED))
    else {
        return;
    };
    for l in layers {
        let _ = writeln!(f, "{l}");
    }
}

/// The first of `layers` that a refused build held ([`refuse_layers`]).
pub fn refused_layer(layers: &[String]) -> Option<String> {
    let (file, md) = crate::util::open_plain(&folder()?.join(REFUSED), false).ok()?;
    if md.uid() != nix::unistd::geteuid().as_raw() {
        return None;
    }
    let mut text = String::new();
    file.take(MAX_REFUSED).read_to_string(&mut text).ok()?;
    let refused: std::collections::HashSet<&str> = text.lines().collect();
    layers
        .iter()
        .find(|l| refused.contains(l.as_str()))
        .cloned()
}

/// What normalising a raw build reads besides the build itself.
pub struct Normalising<'a> {
    pub epoch: u64,
    pub repository: &'a str,
    /// The builder, as it is named.
    pub builder: &'a str,
    /// The base layers kept as they are.
    pub bases: &'a std::collections::HashSet<String>,
    /// The values searched for.
    pub hidden: &'a [Hidden],
}

/// The key of a raw build `raw` normalised with `inputs`.
pub fn key(raw: &str, inputs: &Normalising<'_>) -> String {
    let mut h = Sha256::new();
    let mut put = |field: &str, value: &[u8]| {
        h.update(field.as_bytes());
        h.update((value.len() as u64).to_be_bytes());
        h.update(value);
    };
    put("version", MAGIC.as_bytes());
    put("cibox", env!("CIBOX_COMMIT").as_bytes());
    put("raw", raw.as_bytes());
    put("epoch", &inputs.epoch.to_be_bytes());
    put("repository", inputs.repository.as_bytes());
    put("builder", inputs.builder.as_bytes());
    let mut bases: Vec<&String> = inputs.bases.iter().collect();
    bases.sort();
    for b in bases {
        put("base", b.as_bytes());
    }
    let mut hidden: Vec<(String, [u8; 32])> = inputs
        .hidden
        .iter()
        .map(|x| (x.what.clone(), Sha256::digest(&x.value).into()))
        .collect();
    hidden.sort();
    for (what, digest) in hidden {
        put("hidden", what.as_bytes());
        put("digest", &digest);
    }
    crate::util::hex(&h.finalize())
}

/// The image a build with this key gave before (its ID, and the engine's ID for it),
/// when it is still in the engine with these labels.
pub fn lookup(
    engine: &Engine,
    key: &str,
    labels: &std::collections::HashMap<String, String>,
) -> Option<(ImageId, ImageId)> {
    let path = folder()?.join(key);
    let (file, md) = crate::util::open_plain(&path, false).ok()?;
    if md.uid() != nix::unistd::geteuid().as_raw() || md.len() > 4096 {
        return None;
    }
    let mut text = String::new();
    file.take(4096).read_to_string(&mut text).ok()?;
    let mut lines = text.lines();
    if lines.next() != Some(MAGIC) {
        return None;
    }
    let id = ImageId::parse(lines.next()?).ok()?;
    let engine_id = ImageId::parse(lines.next()?).ok()?;
    let found = engine.inspect(engine_id.as_str()).ok()??;
    let labelled = labels.iter().all(|(k, v)| found.labels.get(k) == Some(v));
    if found.id != engine_id.as_str() || !labelled {
        let _ = std::fs::remove_file(&path);
        return None;
    }
    Some((id, engine_id))
}

/// Writes down that a build with this key gave the image `id` (`engine_id` in the
/// engine), atomically; a failure only costs the next build the long way.
pub fn record(key: &str, id: &ImageId, engine_id: &ImageId) {
    let Some(dir) = folder() else {
        return;
    };
    let Ok(random) = crate::util::random_hex(8) else {
        return;
    };
    let tmp = dir.join(format!(".{key}.{random}"));
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(&tmp)
        .and_then(|mut f| {
            writeln!(f, "{MAGIC}\n{id}\n{engine_id}")?;
            f.sync_all()
        });
    if written.is_err() || std::fs::rename(&tmp, dir.join(key)).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}
