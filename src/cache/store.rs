//! The store on disk: where each cache's generations live, which one is current, who
//! uses which, and the layers trusted runs are writing.
//!
//! Every folder and file here is made by cibox and must stay changeable only by root
//! and the invoking user: another local user who could write here could plant what the
//! next run loads. `cache.lock` orders what changes a cache: readers hold it shared
//! while they pick the current generation and lock it shared (`gens/GEN.lock`, held
//! for the batch's life); a promotion and a clean-up hold it exclusive, and remove a
//! generation only when they can lock it exclusive (nobody uses it).

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::{CacheError, is_folder_name, walk};

/// The most a `current` file may hold: a generation's name.
const MAX_CURRENT: u64 = 256;

/// The store: one folder, the policy's `caches.root`.
#[derive(Debug, Clone)]
pub struct CacheStore {
    root: PathBuf,
    /// The same folder as the engine sees it (another path when cibox runs in a
    /// container of the engine's host).
    host_root: PathBuf,
    me: u32,
}

/// One cache of one project.
#[derive(Debug, Clone)]
pub struct Cache {
    pub project: String,
    pub name: String,
    /// The pull request whose scope of the cache this is; `None`: the base branch's.
    pub pull_request: Option<u64>,
    pub(super) dir: PathBuf,
    pub(super) host_dir: PathBuf,
    pub(super) me: u32,
}

/// A generation held for reading: it stays until this is dropped.
#[derive(Debug)]
pub struct Reading {
    pub generation: String,
    /// The generation's folder as the engine sees it: the overlay's lower folder.
    pub lower: PathBuf,
    _lock: File,
}

/// A trusted run's writable layer, on disk beside the generations.
#[derive(Debug)]
pub struct Writing {
    pub id: String,
    pub(super) dir: PathBuf,
    /// The overlay's upper and work folders as the engine sees them.
    pub host_upper: PathBuf,
    pub host_work: PathBuf,
    _lock: File,
}

/// What `cibox cache list` and `inspect` show of a cache.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CacheInfo {
    pub project: String,
    pub name: String,
    pub current: String,
    /// Bytes on disk of the current generation (each file once).
    pub bytes: u64,
    pub files: u64,
    /// When a batch last started with this cache (the `cache.lock` file's time).
    pub last_used: Option<String>,
    pub generations: Vec<GenerationInfo>,
    /// Trusted runs writing now, and layers their dead runs left.
    pub writing: usize,
    pub left_behind: usize,
    /// The pull requests' scopes of the cache ([`Cache::info_with_scopes`]).
    pub scopes: Vec<ScopeInfo>,
}

/// What `cibox cache list` and `inspect` show of one pull request's scope.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ScopeInfo {
    pub pull_request: u64,
    pub current: String,
    /// Bytes on disk of what the pull request's runs kept (each file once): what its
    /// next run finds over the base's generation.
    pub bytes: u64,
    pub files: u64,
    pub last_used: Option<String>,
    pub writing: usize,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct GenerationInfo {
    pub name: String,
    pub current: bool,
    /// Some batch reads it now.
    pub in_use: bool,
}

/// What a clean-up removed.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct Pruned {
    pub generations: usize,
    pub layers: usize,
    /// Pull requests' scopes removed (unused past their expiry).
    pub scopes: usize,
    /// Entries it could not remove (another user's files, written by a batch that ran
    /// as root, say): each named in `problems`.
    pub problems: Vec<String>,
}

impl Reading {
    /// The lock that keeps the generation: whoever holds it keeps it in place.
    pub fn fd(&self) -> std::os::unix::io::RawFd {
        std::os::unix::io::AsRawFd::as_raw_fd(&self._lock)
    }
}

impl Writing {
    /// The lock that marks the layer as written now.
    pub fn fd(&self) -> std::os::unix::io::RawFd {
        std::os::unix::io::AsRawFd::as_raw_fd(&self._lock)
    }
}

impl CacheStore {
    /// Opens the store at `root` (as cibox sees it; the engine sees it at `host_root`).
    /// It must be a folder nobody but root and the invoking user can change.
    pub fn open(root: &Path, host_root: &Path) -> Result<CacheStore, CacheError> {
        let me = nix::unistd::geteuid().as_raw();
        let fail = |message: String| CacheError::Store {
            path: root.to_path_buf(),
            message,
        };
        if !root.is_absolute() || !host_root.is_absolute() {
            return Err(fail("must be an absolute path".into()));
        }
        let md = std::fs::symlink_metadata(root).map_err(|e| {
            fail(format!(
                "{e}; make it (owned by root or uid {me}, mode 0755) or run `cibox host setup`"
            ))
        })?;
        check_ours(&md, me).map_err(fail)?;
        if let Some(why) = crate::ownership::changeable_by_others(root, me) {
            return Err(fail(why));
        }
        Ok(CacheStore {
            root: root.to_path_buf(),
            host_root: host_root.to_path_buf(),
            me,
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The cache `name` of `project`, made (empty) if it is new.
    pub fn cache(&self, project: &str, name: &str) -> Result<Cache, CacheError> {
        let label = format!("{project}/{name}");
        if !is_folder_name(project) || !is_folder_name(name) {
            return Err(CacheError::Cache {
                cache: label,
                message: "a project or cache name must be letters, digits, `_`, `.` and `-`, starting with a letter or digit".into(),
            });
        }
        let cache = Cache {
            project: project.into(),
            name: name.into(),
            pull_request: None,
            dir: self.root.join(project).join(name),
            host_dir: self.host_root.join(project).join(name),
            me: self.me,
        };
        cache.ensure_dir(&self.root.join(project))?;
        cache.ensure_private_dir(&cache.dir)?;
        for dir in [cache.dir.join("gens"), cache.dir.join("work")] {
            cache.ensure_dir(&dir)?;
        }
        cache.ensure_current()?;
        Ok(cache)
    }

    /// The caches already in the store, of `project` or of every project.
    pub fn caches(&self, project: Option<&str>) -> Result<Vec<Cache>, CacheError> {
        let projects: Vec<String> = match project {
            Some(p) => vec![p.to_string()],
            None => folder_names(&self.root),
        };
        let mut out = Vec::new();
        for p in projects {
            for name in folder_names(&self.root.join(&p)) {
                if self.root.join(&p).join(&name).join("current").exists() {
                    out.push(self.cache(&p, &name)?);
                }
            }
        }
        Ok(out)
    }
}

/// Sorted names of the folders in `dir` that could be projects or caches.
pub(super) fn folder_names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|n| is_folder_name(n))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// A folder of the store: a folder (not a link), root's or ours, that nobody else may
/// write.
pub(super) fn check_ours(md: &std::fs::Metadata, me: u32) -> Result<(), String> {
    if !md.is_dir() {
        return Err("is not a folder (a link or a file is refused)".into());
    }
    if md.uid() != 0 && md.uid() != me {
        return Err(format!(
            "is {}: only root or uid {me} may own the cache store's folders",
            crate::ownership::owner_of(md.uid())
        ));
    }
    if md.mode() & 0o022 != 0 {
        return Err(format!(
            "has mode {:o}: others may write it; make it 0755",
            md.mode() & 0o7777
        ));
    }
    Ok(())
}

impl Cache {
    /// `PROJECT/NAME`, and the pull request of a scope.
    pub fn label(&self) -> String {
        match self.pull_request {
            None => format!("{}/{}", self.project, self.name),
            Some(n) => format!("{}/{} (pull request {n}'s scope)", self.project, self.name),
        }
    }

    pub(super) fn dir(&self) -> &Path {
        &self.dir
    }

    pub(super) fn io(&self, what: &'static str, path: &Path, source: std::io::Error) -> CacheError {
        CacheError::Io {
            cache: self.label(),
            what,
            path: path.to_path_buf(),
            source,
        }
    }

    pub(super) fn refuse(&self, message: String) -> CacheError {
        CacheError::Cache {
            cache: self.label(),
            message,
        }
    }

    /// Makes `dir` (mode 0755) or checks the one there.
    pub(super) fn ensure_dir(&self, dir: &Path) -> Result<(), CacheError> {
        match std::fs::DirBuilder::new().mode(0o755).create(dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(self.io("making", dir, e)),
        }
        let md = std::fs::symlink_metadata(dir).map_err(|e| self.io("reading", dir, e))?;
        check_ours(&md, self.me).map_err(|why| self.refuse(format!("{}: {why}", dir.display())))
    }

    /// Makes the cache's own folder (mode 0700) or closes the one there to others. What
    /// a trusted run kept is the batch user's (`nobody` when cibox is root, a user other
    /// processes of the host run as) with the modes the batch gave it, and a generation
    /// is what every later batch loads: nobody else may reach it. Nor may anyone else
    /// open the cache's lock files: a lock needs no more than that, and one held
    /// forever would stop every batch. The engine, root, still reaches the layers.
    pub(super) fn ensure_private_dir(&self, dir: &Path) -> Result<(), CacheError> {
        match std::fs::DirBuilder::new().mode(0o700).create(dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(self.io("making", dir, e)),
        }
        let md = std::fs::symlink_metadata(dir).map_err(|e| self.io("reading", dir, e))?;
        check_ours(&md, self.me).map_err(|why| self.refuse(format!("{}: {why}", dir.display())))?;
        if md.mode() & 0o077 != 0 {
            // Ours, not a link, in a folder only we can change: closing it is safe.
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
                .map_err(|e| self.io("closing", dir, e))?;
        }
        Ok(())
    }

    /// Opens (making it if need be) a lock file of the cache: a plain file, root's or
    /// ours, never a link.
    pub(super) fn lock_file(&self, path: &Path) -> Result<File, CacheError> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o644)
            .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC | nix::libc::O_NONBLOCK)
            .open(path)
            .map_err(|e| self.io("opening", path, e))?;
        let md = file.metadata().map_err(|e| self.io("reading", path, e))?;
        if !md.is_file() || (md.uid() != 0 && md.uid() != self.me) || md.nlink() != 1 {
            return Err(self.refuse(format!(
                "{} is not a plain lock file of root's or uid {}'s",
                path.display(),
                self.me
            )));
        }
        Ok(file)
    }

    pub(super) fn cache_lock(&self) -> Result<File, CacheError> {
        self.lock_file(&self.dir.join("cache.lock"))
    }

    /// The current generation's name.
    pub(super) fn current(&self) -> Result<String, CacheError> {
        let path = self.dir.join("current");
        let (file, md) =
            crate::util::open_plain(&path, false).map_err(|e| self.io("reading", &path, e))?;
        if md.uid() != 0 && md.uid() != self.me {
            return Err(self.refuse(format!("{} is not root's or ours", path.display())));
        }
        let mut text = String::new();
        std::io::Read::read_to_string(&mut std::io::Read::take(file, MAX_CURRENT), &mut text)
            .map_err(|e| self.io("reading", &path, e))?;
        let name = text.trim().to_string();
        // A folder, never a link: the engine would mount, and a merge link files from,
        // wherever a link leads.
        let is_folder = |p: &Path| std::fs::symlink_metadata(p).is_ok_and(|m| m.is_dir());
        if !is_folder_name(&name) || !is_folder(&self.dir.join("gens").join(&name)) {
            return Err(self.refuse(format!(
                "{} names no generation of this cache ({name:?}); `cibox cache prune --all` starts it again",
                path.display()
            )));
        }
        Ok(name)
    }

    /// Names `generation` current: written beside, then renamed over, so a reader sees the old
    /// name or the new one. Called with `cache.lock` held exclusive.
    pub(super) fn set_current(&self, generation: &str) -> Result<(), CacheError> {
        let random =
            crate::util::random_hex(4).map_err(|e| self.io("naming a file in", &self.dir, e))?;
        let tmp = self.dir.join(format!("current.{random}"));
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(&tmp)
            .map_err(|e| self.io("writing", &tmp, e))?;
        f.write_all(format!("{generation}\n").as_bytes())
            .and_then(|()| f.sync_all())
            .map_err(|e| self.io("writing", &tmp, e))?;
        let path = self.dir.join("current");
        std::fs::rename(&tmp, &path).map_err(|e| self.io("renaming", &path, e))?;
        File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| self.io("syncing", &self.dir, e))
    }

    /// A new generation's name, after `previous` (numbered, so names sort by age).
    pub(super) fn next_name(previous: Option<&str>) -> std::io::Result<String> {
        let n = previous
            .and_then(|p| p.split('-').next())
            .and_then(|n| n.parse::<u64>().ok())
            .map_or(0, |n| n + 1);
        Ok(format!("{n:08}-{}", crate::util::random_hex(4)?))
    }

    /// A new cache starts with one empty generation.
    pub(super) fn ensure_current(&self) -> Result<(), CacheError> {
        if self.dir.join("current").exists() {
            return Ok(());
        }
        let lock = self.cache_lock()?;
        lock.lock().map_err(|e| self.io("locking", &self.dir, e))?;
        if self.dir.join("current").exists() {
            return Ok(());
        }
        let generation =
            Cache::next_name(None).map_err(|e| self.io("naming a generation in", &self.dir, e))?;
        let path = self.dir.join("gens").join(&generation);
        std::fs::DirBuilder::new()
            .mode(0o755)
            .create(&path)
            .map_err(|e| self.io("making", &path, e))?;
        self.set_current(&generation)
    }

    /// Whether a run the host trusts has written the base: its current generation is
    /// a promoted one, not the empty one a new cache starts with (numbered 0).
    pub fn base_written(&self) -> bool {
        self.current().is_ok_and(|g| {
            g.split('-')
                .next()
                .and_then(|n| n.parse::<u64>().ok())
                .is_some_and(|n| n > 0)
        })
    }

    /// Holds the current generation for reading, and notes the cache as used now.
    pub fn read(&self) -> Result<Reading, CacheError> {
        let lock = self.cache_lock()?;
        lock.lock_shared()
            .map_err(|e| self.io("locking", &self.dir, e))?;
        let generation = self.current()?;
        let gen_lock = self.lock_file(&self.dir.join("gens").join(format!("{generation}.lock")))?;
        gen_lock
            .lock_shared()
            .map_err(|e| self.io("locking", &self.dir, e))?;
        // When a batch last used it: the store's least recently used caches go first.
        let _ = lock.set_modified(std::time::SystemTime::now());
        Ok(Reading {
            lower: self.host_dir.join("gens").join(&generation),
            generation,
            _lock: gen_lock,
        })
    }

    /// A layer for a trusted run to write, over the generation it reads; owned by the
    /// batch's `uid:gid` so it can write the cache's top folder (when cibox cannot give
    /// it away, the top folder is left open to all: it lies in a folder only cibox can
    /// enter).
    pub fn write(&self, (uid, gid): (u32, u32)) -> Result<Writing, CacheError> {
        let id =
            crate::util::random_hex(8).map_err(|e| self.io("naming a layer in", &self.dir, e))?;
        let dir = self.dir.join("work").join(&id);
        let lock = self.lock_file(&self.dir.join("work").join(format!("{id}.lock")))?;
        lock.try_lock()
            .map_err(|e| self.refuse(format!("cannot lock the new layer {id}: {e}")))?;
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(|e| self.io("making", &dir, e))?;
        for sub in ["upper", "work"] {
            let p = dir.join(sub);
            std::fs::DirBuilder::new()
                .mode(0o755)
                .create(&p)
                .map_err(|e| self.io("making", &p, e))?;
        }
        let upper = dir.join("upper");
        if (uid, gid) != (self.me, nix::unistd::getegid().as_raw())
            && std::os::unix::fs::chown(&upper, Some(uid), Some(gid)).is_err()
        {
            std::fs::set_permissions(&upper, std::fs::Permissions::from_mode(0o777))
                .map_err(|e| self.io("opening", &upper, e))?;
        }
        let host = self.host_dir.join("work").join(&id);
        Ok(Writing {
            id,
            dir,
            host_upper: host.join("upper"),
            host_work: host.join("work"),
            _lock: lock,
        })
    }

    /// Bytes on disk a trusted run's layer holds.
    pub fn layer_bytes(&self, w: &Writing) -> u64 {
        walk::usage(&w.dir.join("upper")).map_or(0, |u| u.bytes)
    }

    /// Throws a trusted run's layer away (its batch did not pass).
    pub fn discard(&self, w: Writing) -> Vec<String> {
        let mut problems = Vec::new();
        remove_layer(&w.dir, &mut problems);
        let _ = std::fs::remove_file(self.dir.join("work").join(format!("{}.lock", w.id)));
        problems
    }

    /// Removes what nobody uses: generations that are not current (all of them with
    /// `everything`, which starts the cache again empty) and layers of dead runs.
    pub fn prune(&self, everything: bool) -> Result<Pruned, CacheError> {
        let lock = self.cache_lock()?;
        lock.lock().map_err(|e| self.io("locking", &self.dir, e))?;
        let mut pruned = Pruned::default();
        let mut current = self.current().ok();
        if everything {
            let generation = Cache::next_name(current.as_deref())
                .map_err(|e| self.io("naming a generation in", &self.dir, e))?;
            let path = self.dir.join("gens").join(&generation);
            std::fs::DirBuilder::new()
                .mode(0o755)
                .create(&path)
                .map_err(|e| self.io("making", &path, e))?;
            self.set_current(&generation)?;
            current = Some(generation);
        }
        // A `current` a killed promotion was writing (`current.XXXXXXXX`): only one
        // holding `cache.lock` exclusive writes one.
        if let Ok(entries) = std::fs::read_dir(&self.dir) {
            for e in entries.flatten() {
                let name = e.file_name();
                if name.to_string_lossy().starts_with("current.")
                    && e.file_type().is_ok_and(|t| t.is_file())
                {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
        // Generations a killed promotion was making (`.NAME`): nobody reads them.
        if let Ok(entries) = std::fs::read_dir(self.dir.join("gens")) {
            for e in entries.flatten() {
                if e.file_name().to_string_lossy().starts_with('.') {
                    remove_layer(&e.path(), &mut pruned.problems);
                }
            }
        }
        for generation in self.generation_names() {
            if Some(&generation) == current.as_ref() {
                continue;
            }
            let lock_path = self.dir.join("gens").join(format!("{generation}.lock"));
            let Ok(gen_lock) = self.lock_file(&lock_path) else {
                continue;
            };
            if gen_lock.try_lock().is_err() {
                continue;
            }
            if remove_layer(
                &self.dir.join("gens").join(&generation),
                &mut pruned.problems,
            ) {
                pruned.generations += 1;
                let _ = std::fs::remove_file(&lock_path);
            }
        }
        pruned.layers = self.prune_layers(&mut pruned.problems);
        Ok(pruned)
    }

    /// Removes the layers of trusted runs that died (their lock is free).
    fn prune_layers(&self, problems: &mut Vec<String>) -> usize {
        let mut removed = 0;
        for (id, lock_path) in self.layer_locks() {
            let Ok(lock) = self.lock_file(&lock_path) else {
                continue;
            };
            if lock.try_lock().is_err() {
                continue;
            }
            if remove_layer(&self.dir.join("work").join(&id), problems) {
                removed += 1;
                let _ = std::fs::remove_file(&lock_path);
            }
        }
        removed
    }

    /// The generations' names, oldest first.
    pub(super) fn generation_names(&self) -> Vec<String> {
        folder_names(&self.dir.join("gens"))
    }

    /// `(id, lock path)` of each trusted layer, live or left behind.
    pub(super) fn layer_locks(&self) -> Vec<(String, PathBuf)> {
        let work = self.dir.join("work");
        let mut ids: Vec<String> = folder_names(&work);
        ids.sort();
        ids.into_iter()
            .map(|id| {
                let lock = work.join(format!("{id}.lock"));
                (id, lock)
            })
            .collect()
    }

    /// What `cibox cache inspect` shows.
    pub fn info(&self) -> Result<CacheInfo, CacheError> {
        let current = self.current()?;
        let usage = walk::usage(&self.dir.join("gens").join(&current))
            .map_err(|e| self.io("measuring", &self.dir, e))?;
        let last_used = std::fs::metadata(self.dir.join("cache.lock"))
            .and_then(|m| m.modified())
            .ok()
            .map(crate::units::rfc3339);
        let generations = self
            .generation_names()
            .into_iter()
            .map(|name| {
                let in_use = self
                    .lock_file(&self.dir.join("gens").join(format!("{name}.lock")))
                    .map(|l| l.try_lock().is_err())
                    .unwrap_or(false);
                GenerationInfo {
                    current: name == current,
                    name,
                    in_use,
                }
            })
            .collect();
        let (mut writing, mut left_behind) = (0, 0);
        for (_, lock_path) in self.layer_locks() {
            match self.lock_file(&lock_path).map(|l| l.try_lock().is_err()) {
                Ok(true) => writing += 1,
                _ => left_behind += 1,
            }
        }
        Ok(CacheInfo {
            project: self.project.clone(),
            name: self.name.clone(),
            current,
            bytes: usage.bytes,
            files: usage.files,
            last_used,
            generations,
            writing,
            left_behind,
            scopes: Vec::new(),
        })
    }
}

/// Removes a generation or a layer; what cannot be removed is named in `problems`.
/// Whether it is gone.
pub(super) fn remove_layer(dir: &Path, problems: &mut Vec<String>) -> bool {
    match crate::nofollow::remove_tree(dir) {
        Ok(()) => true,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => true,
        Err(e) => {
            problems.push(format!(
                "{}: {e} (files a batch wrote as another user: remove as root)",
                dir.display()
            ));
            false
        }
    }
}

#[cfg(test)]
mod tests;
