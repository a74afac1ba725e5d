//! What `cibox cache` prints of the store: the caches as a table, one cache's
//! generations and pull request scopes, how warm a pull request's next run will be,
//! what a prune removed.

use super::store::{CacheInfo, Pruned};
use crate::console::Table;
use crate::units::Size;

/// `cache list`: one row per cache, or that the store holds none yet.
pub fn list(infos: &[CacheInfo], root: &std::path::Path) -> String {
    if infos.is_empty() {
        return format!("no caches in {} yet\n", root.display());
    }
    let mut t = Table::new(&[
        "CACHE",
        "SIZE",
        "FILES",
        "GENERATION",
        "LAST USED",
        "WRITING",
        "PR SCOPES",
    ]);
    for i in infos {
        t.row(vec![
            format!("{}/{}", i.project, i.name),
            Size(i.bytes).to_string(),
            i.files.to_string(),
            i.current.clone(),
            i.last_used.clone().unwrap_or_else(|| "never".into()),
            i.writing.to_string(),
            i.scopes.len().to_string(),
        ]);
    }
    t.render()
}

/// `cache inspect NAME`: its size, generations, layers under way and scopes.
pub fn inspect(info: &CacheInfo) -> String {
    let mut out = format!(
        "cache {}/{}: {} in {} files\nlast used: {}\n",
        info.project,
        info.name,
        Size(info.bytes),
        info.files,
        info.last_used.as_deref().unwrap_or("never")
    );
    for g in &info.generations {
        let mut notes = Vec::new();
        if g.current {
            notes.push("current");
        }
        if g.in_use {
            notes.push("read now");
        }
        let notes = match notes.is_empty() {
            true => String::new(),
            false => format!(" ({})", notes.join(", ")),
        };
        out.push_str(&format!("generation {}{notes}\n", g.name));
    }
    out.push_str(&format!(
        "layers: {} being written, {} left by dead runs (`cibox cache prune` removes them)\n",
        info.writing, info.left_behind
    ));
    for s in &info.scopes {
        out.push_str(&format!(
            "pull request {}: its scope holds {} in {} files over the base's (generation {}, last used {}{})\n",
            s.pull_request,
            Size(s.bytes),
            s.files,
            s.current,
            s.last_used.as_deref().unwrap_or("never"),
            if s.writing > 0 {
                format!(", {} run(s) writing", s.writing)
            } else {
                String::new()
            }
        ));
    }
    out
}

/// `cache inspect NAME --pull-request N`: how warm a run of pull request `n` will be:
/// what it reads of the base's, and what its own scope adds; `keeps` whether this host
/// keeps a pull request's writes.
pub fn warmth(info: &CacheInfo, n: u64, keeps: bool) -> String {
    let base = format!(
        "the base's generation {} ({} in {} files)",
        info.current,
        Size(info.bytes),
        info.files
    );
    let mut out = match info.scopes.iter().find(|s| s.pull_request == n) {
        Some(s) => format!(
            "cache {}/{}: pull request {n}'s next run reads {base}, with its own scope over it ({} in {} files, generation {})\n",
            info.project,
            info.name,
            Size(s.bytes),
            s.files,
            s.current
        ),
        None => format!(
            "cache {}/{}: pull request {n} has no scope yet: its next run reads {base} alone\n",
            info.project, info.name
        ),
    };
    if !keeps {
        out.push_str(
            "this host keeps no pull request's writes (caches.pull_requests is not `keep`): what its runs write is thrown away\n",
        );
    }
    out
}

/// `cache prune`: what each cache lost (`all`: everything).
pub fn pruned(results: &[(String, Pruned)], all: bool) -> String {
    if results.is_empty() {
        return "no caches of this project on this host\n".into();
    }
    let mut out = String::new();
    for (label, p) in results {
        out.push_str(&format!(
            "cache {label}: removed {} generation(s), {} layer(s) of dead runs and {} pull request scope(s){}\n",
            p.generations,
            p.layers,
            p.scopes,
            if all { "; starts again empty" } else { "" }
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::store::{GenerationInfo, ScopeInfo};

    fn info() -> CacheInfo {
        CacheInfo {
            project: "demo".into(),
            name: "hf".into(),
            current: "g3".into(),
            bytes: 3 << 30,
            files: 120,
            last_used: Some("2026-01-02T03:04:05Z".into()),
            generations: vec![
                GenerationInfo {
                    name: "g2".into(),
                    current: false,
                    in_use: true,
                },
                GenerationInfo {
                    name: "g3".into(),
                    current: true,
                    in_use: false,
                },
            ],
            writing: 1,
            left_behind: 2,
            scopes: vec![ScopeInfo {
                pull_request: 42,
                current: "s1".into(),
                bytes: 1 << 20,
                files: 3,
                last_used: None,
                writing: 1,
            }],
        }
    }

    #[test]
    fn list_shows_one_row_per_cache_or_says_there_is_none() {
        let root = std::path::Path::new("/var/cache/cibox");
        insta::assert_snapshot!("list", list(&[info()], root));
        assert_eq!(list(&[], root), "no caches in /var/cache/cibox yet\n");
    }

    #[test]
    fn inspect_shows_generations_layers_and_scopes() {
        insta::assert_snapshot!("inspect", inspect(&info()));
    }

    #[test]
    fn warmth_says_what_a_pull_request_reads_and_whether_its_writes_stay() {
        insta::assert_snapshot!("warmth_scoped_kept", warmth(&info(), 42, true));
        insta::assert_snapshot!("warmth_unscoped_thrown_away", warmth(&info(), 7, false));
    }

    #[test]
    fn pruned_says_what_each_cache_lost() {
        let p = Pruned {
            generations: 2,
            layers: 1,
            scopes: 0,
            problems: Vec::new(),
        };
        insta::assert_snapshot!("pruned_all", pruned(&[("demo/hf".into(), p)], true));
        assert_eq!(
            pruned(&[], false),
            "no caches of this project on this host\n"
        );
    }
}
