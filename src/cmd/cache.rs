//! `cibox cache list|inspect|prune`: the host's caches of a project (see
//! [`crate::cache`]), where the host policy keeps them.

use std::path::PathBuf;

use serde_json::json;

use super::context::Context;
use crate::cache::{Cache, CacheInfo, CacheStore};
use crate::console::{self, Table};
use crate::error::{ErrorKind, Result};
use crate::exit::{self, Failure};
use crate::host::caches::CachePolicy;
use crate::units::Size;

/// What `cache` commands refuse.
#[derive(Debug, thiserror::Error)]
pub enum CacheCommandError {
    #[error("this host keeps no caches: its policy ({policy}) has no `caches:` section")]
    NoCaches {
        /// The policy in force, as it describes itself.
        policy: String,
    },
    #[error(
        "`{name}` is not a cache of {} (it names {})",
        .manifest.display(),
        if .known.is_empty() { "none".to_string() } else { .known.join(", ") }
    )]
    NotACache {
        name: String,
        manifest: PathBuf,
        /// The caches the manifest names.
        known: Vec<String>,
    },
    #[error("cache `{name}` has not been used on this host yet ({})", .root.display())]
    NotUsedYet { name: String, root: PathBuf },
}

impl ErrorKind for CacheCommandError {
    fn failure(&self) -> Failure {
        Failure::Usage
    }
}

/// The store the host policy names, and the policy's caches section.
fn store_and_policy(ctx: &Context) -> Result<(CacheStore, CachePolicy)> {
    let policy = ctx.host_policy()?;
    let Some(c) = policy.caches else {
        return Err(CacheCommandError::NoCaches {
            policy: policy.describe(),
        }
        .into());
    };
    let host_root = c.host_root.as_deref().unwrap_or(&c.root);
    let store = CacheStore::open(&c.root, host_root)?;
    Ok((store, c))
}

/// The store the host policy names.
fn store(ctx: &Context) -> Result<CacheStore> {
    Ok(store_and_policy(ctx)?.0)
}

/// The caches of this manifest's project that exist, by name (all of them, or `names`).
fn project_caches(ctx: &Context, store: &CacheStore, names: &[String]) -> Result<Vec<Cache>> {
    let m = ctx.manifest_as_written()?;
    for n in names {
        if !m.caches.contains_key(n) {
            return Err(CacheCommandError::NotACache {
                name: n.clone(),
                manifest: m.path.clone(),
                known: m.caches.keys().cloned().collect(),
            }
            .into());
        }
    }
    Ok(store
        .caches(Some(&m.project))?
        .into_iter()
        .filter(|c| names.is_empty() || names.contains(&c.name))
        .collect())
}

/// `cibox cache list`.
pub fn list(ctx: &Context, all_projects: bool) -> Result<u8> {
    let store = store(ctx)?;
    let caches = if all_projects {
        store.caches(None)?
    } else {
        project_caches(ctx, &store, &[])?
    };
    let infos = caches
        .iter()
        .map(Cache::info_with_scopes)
        .collect::<Result<Vec<CacheInfo>, _>>()?;
    if ctx.json {
        console::json(&json!({ "root": store.root(), "caches": infos }));
        return Ok(exit::SUCCESS);
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
    for i in &infos {
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
    if infos.is_empty() {
        println!("no caches in {} yet", store.root().display());
    } else {
        print!("{}", t.render());
    }
    Ok(exit::SUCCESS)
}

/// `cibox cache inspect NAME`.
pub fn inspect(ctx: &Context, name: &str, pull_request: Option<u64>) -> Result<u8> {
    let (store, policy) = store_and_policy(ctx)?;
    let Some(cache) = project_caches(ctx, &store, &[name.to_string()])?.pop() else {
        return Err(CacheCommandError::NotUsedYet {
            name: name.to_string(),
            root: store.root().to_path_buf(),
        }
        .into());
    };
    let info = cache.info_with_scopes()?;
    if ctx.json {
        console::json(&info);
        return Ok(exit::SUCCESS);
    }
    if let Some(n) = pull_request {
        print_warmth(&info, n, &policy);
        return Ok(exit::SUCCESS);
    }
    println!(
        "cache {}/{}: {} in {} files",
        info.project,
        info.name,
        Size(info.bytes),
        info.files
    );
    println!(
        "last used: {}",
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
        println!(
            "generation {}{}",
            g.name,
            if notes.is_empty() {
                String::new()
            } else {
                format!(" ({})", notes.join(", "))
            }
        );
    }
    println!(
        "layers: {} being written, {} left by dead runs (`cibox cache prune` removes them)",
        info.writing, info.left_behind
    );
    for s in &info.scopes {
        println!(
            "pull request {}: its scope holds {} in {} files over the base's (generation {}, last used {}{})",
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
        );
    }
    Ok(exit::SUCCESS)
}

/// How warm a run of pull request `n` will be: what it reads of the base's, and what
/// its own scope adds.
fn print_warmth(info: &CacheInfo, n: u64, policy: &CachePolicy) {
    let base = format!(
        "the base's generation {} ({} in {} files)",
        info.current,
        Size(info.bytes),
        info.files
    );
    match info.scopes.iter().find(|s| s.pull_request == n) {
        Some(s) => println!(
            "cache {}/{}: pull request {n}'s next run reads {base}, with its own scope over it ({} in {} files, generation {})",
            info.project,
            info.name,
            Size(s.bytes),
            s.files,
            s.current
        ),
        None => println!(
            "cache {}/{}: pull request {n} has no scope yet: its next run reads {base} alone",
            info.project, info.name
        ),
    }
    if !(policy.trusted && policy.pull_requests.keep) {
        println!(
            "this host keeps no pull request's writes (caches.pull_requests is not `keep`): what its runs write is thrown away"
        );
    }
}

/// `cibox cache prune [NAME…] [--all]`.
pub fn prune(ctx: &Context, names: &[String], all: bool) -> Result<u8> {
    let (store, policy) = store_and_policy(ctx)?;
    let caches = project_caches(ctx, &store, names)?;
    let mut results = Vec::new();
    let mut problems = 0;
    for c in &caches {
        let mut p = c.prune(all)?;
        let expiry = (!all).then_some(policy.pull_requests.expiry);
        p.scopes = c.expire_scopes(expiry, &mut p.problems);
        problems += p.problems.len();
        for line in &p.problems {
            console::warn(format!("cache {}: {line}", c.label()));
        }
        results.push((c.label(), p));
    }
    if ctx.json {
        let out: Vec<_> = results
            .iter()
            .map(|(label, p)| json!({"cache": label, "generations": p.generations, "layers": p.layers, "scopes": p.scopes, "problems": p.problems}))
            .collect();
        console::json(&json!({ "pruned": out }));
    } else {
        for (label, p) in &results {
            println!(
                "cache {label}: removed {} generation(s), {} layer(s) of dead runs and {} pull request scope(s){}",
                p.generations,
                p.layers,
                p.scopes,
                if all { "; starts again empty" } else { "" }
            );
        }
        if results.is_empty() {
            println!("no caches of this project on this host");
        }
    }
    Ok(if problems == 0 {
        exit::SUCCESS
    } else {
        exit::INFRA
    })
}
