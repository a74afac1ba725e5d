//! Pull requests' scopes of a cache: what one pull request's passing runs wrote, kept
//! apart from the base branch's generations and from every other pull request's.
//!
//! A scope is a cache of its own below its cache's folder (`pulls/N/`, the same layout:
//! `cache.lock`, `current`, `gens/`, `work/`), whose generations hold only what the
//! pull request's runs wrote: a run of the pull request reads the scope's current
//! generation laid over the base's current one (two lower folders), and a promotion
//! lays its layer over the scope's generation, never the base's. Nothing reads a scope
//! but runs of its own pull request; a base run never sees one.
//!
//! `pulls.lock` (in the cache's folder) orders opening a scope against removing one: a
//! reader holds it shared while it makes the scope's folders and locks the generation
//! it reads; an expiry holds it exclusive while it checks that nothing holds any of the
//! scope's locks and renames the scope away.

use std::path::Path;
use std::time::{Duration, SystemTime};

use super::CacheError;
use super::store::{Cache, CacheInfo, Reading, ScopeInfo, folder_names, remove_layer};

impl Cache {
    /// The scope of pull request `number`, made (empty) if it is new.
    fn scope(&self, number: u64) -> Result<Cache, CacheError> {
        if self.pull_request.is_some() || number == 0 {
            return Err(self.refuse(format!("no scope {number} here")));
        }
        let pulls = self.dir.join("pulls");
        let scope = Cache {
            project: self.project.clone(),
            name: self.name.clone(),
            pull_request: Some(number),
            dir: pulls.join(number.to_string()),
            host_dir: self.host_dir.join("pulls").join(number.to_string()),
            me: self.me,
        };
        self.ensure_dir(&pulls)?;
        scope.ensure_private_dir(&scope.dir)?;
        for dir in [scope.dir.join("gens"), scope.dir.join("work")] {
            scope.ensure_dir(&dir)?;
        }
        scope.ensure_current()?;
        Ok(scope)
    }

    fn pulls_lock(&self) -> Result<std::fs::File, CacheError> {
        self.lock_file(&self.dir.join("pulls.lock"))
    }

    /// Holds pull request `number`'s scope for reading (its current generation, what the
    /// pull request's runs kept): the scope, and what its run lays over the base's
    /// generation.
    pub fn read_scope(&self, number: u64) -> Result<(Cache, Reading), CacheError> {
        let lock = self.pulls_lock()?;
        lock.lock_shared()
            .map_err(|e| self.io("locking", &self.dir, e))?;
        let scope = self.scope(number)?;
        let reading = scope.read()?;
        Ok((scope, reading))
    }

    /// The scopes' numbers, in order.
    fn scope_numbers(&self) -> Vec<u64> {
        let mut numbers: Vec<u64> = folder_names(&self.dir.join("pulls"))
            .into_iter()
            .filter(|n| !n.starts_with('0'))
            .filter_map(|n| n.parse().ok())
            .collect();
        numbers.sort_unstable();
        numbers
    }

    /// When a run last read the scope at `dir`.
    fn last_used(dir: &Path) -> Option<SystemTime> {
        std::fs::symlink_metadata(dir.join("cache.lock"))
            .or_else(|_| std::fs::symlink_metadata(dir))
            .and_then(|m| m.modified())
            .ok()
    }

    /// What `cibox cache list` and `inspect` show: [`Cache::info`] with the scopes.
    pub fn info_with_scopes(&self) -> Result<CacheInfo, CacheError> {
        let mut info = self.info()?;
        info.scopes = self.scopes_info();
        Ok(info)
    }

    /// What `inspect` shows of each scope.
    fn scopes_info(&self) -> Vec<ScopeInfo> {
        let mut out = Vec::new();
        for n in self.scope_numbers() {
            let Ok(scope) = self.scope(n) else { continue };
            let Ok(info) = scope.info() else { continue };
            out.push(ScopeInfo {
                pull_request: n,
                current: info.current,
                bytes: info.bytes,
                files: info.files,
                last_used: info.last_used,
                writing: info.writing,
            });
        }
        out
    }

    /// Removes the scopes no run read for `expiry` (every scope with `None`) that no run
    /// uses now, and prunes the others (their generations nobody reads, layers of dead
    /// runs). How many scopes went; what could not be removed is named in `problems`.
    pub fn expire_scopes(&self, expiry: Option<Duration>, problems: &mut Vec<String>) -> usize {
        let pulls = self.dir.join("pulls");
        // What an earlier expiry renamed away and could not finish removing.
        for name in std::fs::read_dir(&pulls)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(".gone-"))
        {
            remove_layer(&name.path(), problems);
        }
        let now = SystemTime::now();
        let mut removed = 0;
        for n in self.scope_numbers() {
            let dir = pulls.join(n.to_string());
            let expired = match expiry {
                None => true,
                Some(e) => Cache::last_used(&dir)
                    .and_then(|t| now.duration_since(t).ok())
                    .is_some_and(|age| age >= e),
            };
            if !expired {
                if let Ok(scope) = self.scope(n)
                    && let Ok(p) = scope.prune(false)
                {
                    problems.extend(p.problems);
                }
                continue;
            }
            match self.remove_scope(n) {
                Ok(true) => removed += 1,
                Ok(false) => {}
                Err(e) => problems.push(e.to_string()),
            }
        }
        removed
    }

    /// Removes scope `n` unless some run holds one of its locks: whether it went.
    fn remove_scope(&self, n: u64) -> Result<bool, CacheError> {
        let pulls = self.dir.join("pulls");
        let lock = self.pulls_lock()?;
        lock.lock().map_err(|e| self.io("locking", &self.dir, e))?;
        let scope = self.scope(n)?;
        // Every lock of the scope, held until it is renamed away: none may be in use.
        let mut held = vec![scope.cache_lock()?];
        for g in scope.generation_names() {
            held.push(scope.lock_file(&scope.dir.join("gens").join(format!("{g}.lock")))?);
        }
        for (_, path) in scope.layer_locks() {
            held.push(scope.lock_file(&path)?);
        }
        if held.iter().any(|l| l.try_lock().is_err()) {
            return Ok(false);
        }
        let random =
            crate::util::random_hex(4).map_err(|e| self.io("naming a folder in", &pulls, e))?;
        let gone = pulls.join(format!(".gone-{n}-{random}"));
        std::fs::rename(&scope.dir, &gone).map_err(|e| self.io("renaming", &scope.dir, e))?;
        drop(held);
        drop(lock);
        let mut problems = Vec::new();
        if remove_layer(&gone, &mut problems) {
            Ok(true)
        } else {
            Err(self.refuse(problems.join("; ")))
        }
    }
}
