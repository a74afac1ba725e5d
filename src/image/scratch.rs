//! What a Dockerfile build makes besides its image, and who removes it.
//!
//! A build makes a folder under the temporary folder (`cibox-image-*`) for the archives
//! it saves and normalises, and images in the engine: the raw build (tagged
//! `cibox-raw-build:…`) and one image for each step the builder ran rather than took
//! from its cache (a multi-stage build's earlier stages are left dangling by the
//! builder). [`BuildScratch`] removes all of them however the build returns. A build
//! killed outright cannot, so its folder holds a lock, held for the build's life, and a
//! journal of the images it made (the raw build's tag written before the engine builds
//! it). The next build removes what a build whose lock is free left ([`sweep_dead`]):
//! the images its journal names, never another image, then its folder; and raw builds
//! of older versions, which carried [`LABEL_RAW_BUILD`] naming their folder.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::engine::Engine;

/// On a raw build of cibox before issue 44: `HOST FOLDER`, the build's host and scratch
/// folder. (A raw build now carries nothing of its own, so the engine's cache gives a
/// rebuild the same ID.)
pub const LABEL_RAW_BUILD: &str = "org.cibox.raw-build";
/// The tag of a raw build (and the start of it).
pub const RAW_TAG: &str = "cibox-raw-build";

const PREFIX: &str = "cibox-image-";
const LOCK: &str = ".lock";
const JOURNAL: &str = "images";
/// A folder younger than this may be a build that has not taken its lock yet.
const SETTLING: Duration = Duration::from_secs(60);

/// One build's scratch folder and the images it made; removes both when dropped.
pub struct BuildScratch<'e> {
    engine: &'e Engine,
    made: Vec<String>,
    journal: File,
    _lock: File,
    // Last: removed after the images its journal names.
    dir: tempfile::TempDir,
}

impl<'e> BuildScratch<'e> {
    pub fn new(engine: &'e Engine) -> std::io::Result<BuildScratch<'e>> {
        let dir = tempfile::Builder::new().prefix(PREFIX).tempdir()?;
        // What the build saves (every layer it made, secrets a refused build held) is
        // for this user alone, whatever the umask.
        std::fs::set_permissions(
            dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o700),
        )?;
        let lock = File::create(dir.path().join(LOCK))?;
        lock.try_lock().map_err(std::io::Error::other)?;
        let journal = File::options()
            .create(true)
            .append(true)
            .open(dir.path().join(JOURNAL))?;
        Ok(BuildScratch {
            engine,
            made: Vec::new(),
            journal,
            _lock: lock,
            dir,
        })
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// An image this build made (by ID, or the raw build's tag before it is built):
    /// written down at once, removed when the build ends.
    pub fn made(&mut self, id: &str) {
        let _ = writeln!(self.journal, "{id}");
        self.made.push(id.to_string());
    }
}

impl Drop for BuildScratch<'_> {
    fn drop(&mut self) {
        // Newest first: an image goes only once nothing is built on it.
        for id in self.made.iter().rev() {
            let _ = self.engine.remove_image_only(id, is_raw_tag);
        }
    }
}

fn is_raw_tag(tag: &str) -> bool {
    tag.strip_prefix(RAW_TAG)
        .is_some_and(|t| t.starts_with(':'))
}

/// What [`sweep_dead`] removed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Leftovers {
    pub images: usize,
    pub folders: usize,
}

/// Removes what builds of this user that ended without cleaning up (killed) left: the
/// images each one's journal names and its folder, and raw builds labelled with a
/// folder of this host whose build is gone. A build is gone when its folder's lock is
/// free; a folder without a lock (an older cibox's, or not a build's) is left alone.
/// Failures only leave things for the next time.
pub fn sweep_dead(engine: &Engine) -> Leftovers {
    let mut out = Leftovers::default();
    let me = nix::unistd::geteuid().as_raw();
    // Whether the image is gone now (counted when it went now).
    let mut remove = |id: &str| {
        let present = matches!(engine.inspect(id), Ok(Some(_)));
        let gone = engine.remove_image_only(id, is_raw_tag).unwrap_or(false);
        if present && gone {
            out.images += 1;
        }
        gone
    };
    for dir in scratch_folders(me) {
        if !gone(&dir) {
            continue;
        }
        let journal = std::fs::read_to_string(dir.join(JOURNAL)).unwrap_or_default();
        let mut all_gone = true;
        for id in journal
            .lines()
            .rev()
            .filter(|l| is_image_id(l) || is_raw_tag(l))
        {
            all_gone &= remove(id);
        }
        // One still in use (its build's container not yet gone): next time.
        if all_gone && std::fs::remove_dir_all(&dir).is_ok() {
            out.folders += 1;
        }
    }
    let host = crate::util::host_name();
    for (id, value) in engine.images_labelled(LABEL_RAW_BUILD).unwrap_or_default() {
        let Some((from, dir)) = value.split_once(' ') else {
            continue;
        };
        // Another host's build cannot be judged from here.
        if from == host && (!Path::new(dir).exists() || gone(Path::new(dir))) {
            remove(&id);
        }
    }
    out
}

/// The scratch folders of `uid` in the temporary folder, old enough to judge.
fn scratch_folders(uid: u32) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| {
            e.file_name()
                .as_encoded_bytes()
                .starts_with(PREFIX.as_bytes())
        })
        .filter(|e| {
            e.metadata().is_ok_and(|md| {
                md.is_dir()
                    && md.uid() == uid
                    && md
                        .modified()
                        .ok()
                        .and_then(|m| m.elapsed().ok())
                        .is_some_and(|age| age > SETTLING)
            })
        })
        .map(|e| e.path())
        .collect()
}

/// Whether the build of scratch folder `dir` is gone: its lock is there and free.
fn gone(dir: &Path) -> bool {
    let Ok(lock) = File::open(dir.join(LOCK)) else {
        return false;
    };
    // Taken, it is let go with the file.
    lock.try_lock().is_ok()
}

/// A full `sha256:` ID, or a short or full hex one, as the builder prints them.
fn is_image_id(s: &str) -> bool {
    let hex = s.strip_prefix("sha256:").unwrap_or(s);
    (12..=64).contains(&hex.len()) && hex.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Reads the classic builder's output and names each image a step of this build made
/// (not one taken from the cache, nor a `FROM` step's base image).
#[derive(Default)]
pub struct StepImages {
    partial: String,
    /// The current step is a `FROM`, or was taken from the cache.
    not_ours: bool,
}

impl StepImages {
    pub fn feed(&mut self, text: &str, made: &mut dyn FnMut(&str)) {
        self.partial.push_str(text);
        while let Some(end) = self.partial.find('\n') {
            let line: String = self.partial.drain(..=end).collect();
            self.line(line.trim(), made);
        }
    }

    fn line(&mut self, line: &str, made: &mut dyn FnMut(&str)) {
        if let Some(step) = line.strip_prefix("Step ") {
            let instruction = step.split_once(" : ").map_or("", |(_, i)| i);
            self.not_ours = instruction
                .split_whitespace()
                .next()
                .is_some_and(|w| w.eq_ignore_ascii_case("FROM"));
            return;
        }
        let Some(rest) = line.strip_prefix("--->") else {
            return;
        };
        let rest = rest.trim();
        if rest == "Using cache" {
            self.not_ours = true;
        } else if !self.not_ours && is_image_id(rest) {
            made(rest);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_steps_a_build_ran_are_its_own_not_the_cached_nor_the_bases() {
        let output = [
            "Step 1/6 : FROM sha256:aaaaaaaaaaaa AS a\n",
            " ---> aaaaaaaaaaaa\n",
            "Step 2/6 : COPY f /f\n ---> Using cache\n ---> bbbbbbbbbbbb\n",
            "Step 3/6 : RUN make\n",
            " ---> Running in 0123456789ab\n",
            "Removing intermediate container 0123456789ab\n ---> cccccccccccc\n",
            "Step 4/6 : FROM scratch\n ---> \n",
            "Step 5/6 : COPY --from=a /f /g\n ---> dd",
            "dddddddddd\n",
            "Step 6/6 : LABEL x=y\n ---> Running in 111111111111\n ---> eeeeeeeeeeee\n",
            "Successfully built eeeeeeeeeeee\n",
        ];
        let mut steps = StepImages::default();
        let mut made = Vec::new();
        for chunk in output {
            steps.feed(chunk, &mut |id| made.push(id.to_string()));
        }
        assert_eq!(made, ["cccccccccccc", "dddddddddddd", "eeeeeeeeeeee"]);
    }

    #[test]
    fn only_raw_build_tags_may_be_taken() {
        assert!(is_raw_tag("cibox-raw-build:0123abcd"));
        assert!(!is_raw_tag("cibox-raw-builder:x"));
        assert!(!is_raw_tag("cibox/p:lockset-0123"));
    }
}
