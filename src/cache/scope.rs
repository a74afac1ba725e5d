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
use super::store::{Cache, CacheInfo, Reading, ScopeInfo, check_ours, folder_names, remove_layer};

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
        // Never read, nor remove in, another folder than the store's own: a `pulls`
        // that is a link would lead the removals below out of the store.
        match std::fs::symlink_metadata(&pulls) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return 0,
            Err(e) => {
                problems.push(format!("{}: {e}", pulls.display()));
                return 0;
            }
            Ok(md) => {
                if let Err(why) = check_ours(&md, self.me) {
                    problems.push(format!("{}: {why}", pulls.display()));
                    return 0;
                }
            }
        }
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

#[cfg(test)]
mod tests {
    use std::os::unix::fs::DirBuilderExt;
    use std::path::Path;

    use crate::cache::{Cache, CacheStore, Writing};

    fn store() -> (tempfile::TempDir, CacheStore) {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("store");
        std::fs::DirBuilder::new()
            .mode(0o755)
            .create(&root)
            .unwrap();
        let s = CacheStore::open(&root, Path::new("/host/store")).unwrap();
        (t, s)
    }

    fn me() -> (u32, u32) {
        (
            nix::unistd::geteuid().as_raw(),
            nix::unistd::getegid().as_raw(),
        )
    }

    fn layer_write(w: &Writing, name: &str, text: &str) {
        std::fs::write(w.dir.join("upper").join(name), text).unwrap();
    }

    /// The names in the generation `lower` (as the engine sees it) of `cache`.
    fn names(cache: &Cache, lower: &Path) -> Vec<String> {
        let rel = lower.strip_prefix(&cache.host_dir).unwrap();
        let mut out: Vec<String> = std::fs::read_dir(cache.dir.join(rel))
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        out.sort();
        out
    }

    /// What a run of pull request `n` (or of the base) would see: its scope's names, then
    /// the base's.
    fn seen(c: &Cache, n: Option<u64>) -> (Vec<String>, Vec<String>) {
        let base = c.read().unwrap();
        let scope = match n {
            Some(n) => {
                let (s, r) = c.read_scope(n).unwrap();
                names(&s, &r.lower)
            }
            None => Vec::new(),
        };
        (scope, names(c, &base.lower))
    }

    #[test]
    fn a_scope_is_its_pull_requests_alone_and_never_the_bases() {
        let (_t, s) = store();
        let c = s.cache("proj", "models").unwrap();
        let w = c.write(me()).unwrap();
        layer_write(&w, "base", "b");
        c.promote(w, 1 << 30).unwrap();
        let (scope, r) = c.read_scope(7).unwrap();
        assert!(r.lower.starts_with("/host/store/proj/models/pulls/7/gens"));
        assert_eq!(scope.label(), "proj/models (pull request 7's scope)");
        let w = scope.write(me()).unwrap();
        layer_write(&w, "seven", "7");
        layer_write(&w, "base", "overwritten by 7");
        scope.promote(w, 1 << 30).unwrap();
        drop(r);
        assert_eq!(
            seen(&c, Some(7)),
            (vec!["base".into(), "seven".into()], vec!["base".into()])
        );
        assert_eq!(seen(&c, Some(8)), (vec![], vec!["base".into()]));
        assert_eq!(seen(&c, None), (vec![], vec!["base".into()]));
        let base_gen = c.dir.join("gens").join(c.current().unwrap());
        assert_eq!(std::fs::read_to_string(base_gen.join("base")).unwrap(), "b");
        // No scope of a scope, no scope 0.
        assert!(scope.read_scope(1).is_err());
        assert!(c.read_scope(0).is_err());
        let info = c.info_with_scopes().unwrap();
        let numbers: Vec<u64> = info.scopes.iter().map(|s| s.pull_request).collect();
        assert_eq!(numbers, [7, 8]);
    }

    #[test]
    fn the_base_and_a_scope_promoted_at_once_each_land_in_their_own_place() {
        let (_t, s) = store();
        let c = s.cache("proj", "ext").unwrap();
        for round in 0..20 {
            let (scope, _r) = c.read_scope(7).unwrap();
            let wb = c.write(me()).unwrap();
            let ws = scope.write(me()).unwrap();
            layer_write(&wb, &format!("base-{round}"), "b");
            layer_write(&ws, &format!("pr-{round}"), "p");
            std::thread::scope(|t| {
                t.spawn(|| c.promote(wb, 1 << 30).unwrap());
                t.spawn(|| scope.promote(ws, 1 << 30).unwrap());
            });
        }
        let (scope, base) = seen(&c, Some(7));
        assert_eq!(base.len(), 20, "{base:?}");
        assert!(base.iter().all(|n| n.starts_with("base-")), "{base:?}");
        assert_eq!(scope.len(), 20, "{scope:?}");
        assert!(scope.iter().all(|n| n.starts_with("pr-")), "{scope:?}");
    }

    #[test]
    fn a_scope_in_use_stays_and_one_planted_as_a_link_is_refused() {
        let (_t, s) = store();
        let c = s.cache("proj", "x").unwrap();
        let held = c.read_scope(7).unwrap();
        let mut problems = Vec::new();
        assert_eq!(c.expire_scopes(None, &mut problems), 0, "{problems:?}");
        assert!(c.dir.join("pulls/7").is_dir());
        // A run writing (its lock held), its reading let go: still in use.
        let w = held.0.write(me()).unwrap();
        drop(held);
        assert_eq!(c.expire_scopes(None, &mut problems), 0, "{problems:?}");
        drop(w);
        assert_eq!(c.expire_scopes(None, &mut problems), 1, "{problems:?}");
        assert!(!c.dir.join("pulls/7").exists());
        // A scope's folder that is a link (to the base's own folder, say) is refused,
        // never read or removed through.
        std::os::unix::fs::symlink(&c.dir, c.dir.join("pulls/9")).unwrap();
        let e = c.read_scope(9).unwrap_err().to_string();
        assert!(e.contains("is not a folder"), "{e}");
        assert_eq!(c.expire_scopes(None, &mut problems), 0);
        assert!(c.dir.join("gens").is_dir());
        // Only numbers name scopes.
        std::fs::create_dir(c.dir.join("pulls/007")).unwrap();
        assert!(c.info_with_scopes().unwrap().scopes.is_empty());
    }

    /// Issue 38, attack: `pulls` itself a link (to a folder holding a `.gone-…` tree):
    /// an expiry's clean-up of what an earlier one left removed that tree, outside the
    /// store. It is now named and nothing is removed.
    #[test]
    fn a_pulls_folder_planted_as_a_link_is_never_removed_in() {
        let (t, s) = store();
        let c = s.cache("proj", "x").unwrap();
        let elsewhere = t.path().join("elsewhere");
        std::fs::create_dir_all(elsewhere.join(".gone-7-0123abcd/data")).unwrap();
        std::os::unix::fs::symlink(&elsewhere, c.dir.join("pulls")).unwrap();
        let mut problems = Vec::new();
        assert_eq!(c.expire_scopes(None, &mut problems), 0);
        assert!(elsewhere.join(".gone-7-0123abcd/data").is_dir());
        assert!(
            problems.iter().any(|p| p.contains("is not a folder")),
            "{problems:?}"
        );
        // No `pulls` at all: nothing to do, nothing to say.
        std::fs::remove_file(c.dir.join("pulls")).unwrap();
        let mut problems = Vec::new();
        assert_eq!(c.expire_scopes(None, &mut problems), 0);
        assert!(problems.is_empty(), "{problems:?}");
    }

    #[test]
    fn an_expiry_goes_by_last_use() {
        let (_t, s) = store();
        let c = s.cache("proj", "x").unwrap();
        drop(c.read_scope(7).unwrap());
        drop(c.read_scope(8).unwrap());
        let old = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
        std::fs::File::options()
            .write(true)
            .open(c.dir.join("pulls/7/cache.lock"))
            .unwrap()
            .set_modified(old)
            .unwrap();
        let mut problems = Vec::new();
        let day = std::time::Duration::from_secs(86_400);
        assert_eq!(c.expire_scopes(Some(day), &mut problems), 0);
        let minute = std::time::Duration::from_secs(60);
        assert_eq!(c.expire_scopes(Some(minute), &mut problems), 1);
        assert!(!c.dir.join("pulls/7").exists());
        assert!(c.dir.join("pulls/8").exists());
    }
}
