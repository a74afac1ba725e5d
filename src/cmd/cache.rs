//! `cibox cache list|inspect|prune`: the host's caches of a project (see
//! [`crate::cache`]), where the host policy keeps them.

use std::path::PathBuf;

use serde_json::json;

use super::context::Context;
use crate::cache::{Cache, CacheInfo, CacheStore, shown};
use crate::console;
use crate::error::{ErrorKind, Result};
use crate::exit::{self, Failure};
use crate::host::caches::CachePolicy;

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
    } else {
        print!("{}", shown::list(&infos, store.root()));
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
    } else if let Some(n) = pull_request {
        let keeps = policy.trusted && policy.pull_requests.keep;
        print!("{}", shown::warmth(&info, n, keeps));
    } else {
        print!("{}", shown::inspect(&info));
    }
    Ok(exit::SUCCESS)
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
        print!("{}", shown::pruned(&results, all));
    }
    Ok(if problems == 0 {
        exit::SUCCESS
    } else {
        exit::INFRA
    })
}
