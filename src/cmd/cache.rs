//! `cibox cache list|inspect|prune`: the host's caches of a project (see
//! [`crate::cache`]), where the host policy keeps them.

use std::path::PathBuf;

use serde_json::json;

use super::context::Context;
use crate::cache::{Cache, CacheInfo, CacheStore};
use crate::console::{self, Table};
use crate::error::{ErrorKind, Result};
use crate::exit::{self, Failure};
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

/// The store the host policy names.
fn store(ctx: &Context) -> Result<CacheStore> {
    let policy = ctx.host_policy()?;
    let Some(c) = policy.caches else {
        return Err(CacheCommandError::NoCaches {
            policy: policy.describe(),
        }
        .into());
    };
    let host_root = c.host_root.as_deref().unwrap_or(&c.root);
    Ok(CacheStore::open(&c.root, host_root)?)
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
        .map(Cache::info)
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
    ]);
    for i in &infos {
        t.row(vec![
            format!("{}/{}", i.project, i.name),
            Size(i.bytes).to_string(),
            i.files.to_string(),
            i.current.clone(),
            i.last_used.clone().unwrap_or_else(|| "never".into()),
            i.writing.to_string(),
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
pub fn inspect(ctx: &Context, name: &str) -> Result<u8> {
    let store = store(ctx)?;
    let Some(cache) = project_caches(ctx, &store, &[name.to_string()])?.pop() else {
        return Err(CacheCommandError::NotUsedYet {
            name: name.to_string(),
            root: store.root().to_path_buf(),
        }
        .into());
    };
    let info = cache.info()?;
    if ctx.json {
        console::json(&info);
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
    Ok(exit::SUCCESS)
}

/// `cibox cache prune [NAME…] [--all]`.
pub fn prune(ctx: &Context, names: &[String], all: bool) -> Result<u8> {
    let store = store(ctx)?;
    let caches = project_caches(ctx, &store, names)?;
    let mut results = Vec::new();
    let mut problems = 0;
    for c in &caches {
        let p = c.prune(all)?;
        problems += p.problems.len();
        for line in &p.problems {
            console::warn(format!("cache {}: {line}", c.label()));
        }
        results.push((c.label(), p));
    }
    if ctx.json {
        let out: Vec<_> = results
            .iter()
            .map(|(label, p)| json!({"cache": label, "generations": p.generations, "layers": p.layers, "problems": p.problems}))
            .collect();
        console::json(&json!({ "pruned": out }));
    } else {
        for (label, p) in &results {
            println!(
                "cache {label}: removed {} generation(s) and {} layer(s) of dead runs{}",
                p.generations,
                p.layers,
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
