//! Sweeping the containers of dead runs: what a killed cibox left behind (their
//! containers, their snapshot volumes, the upper layers of `/work` it had mounted).

use std::path::PathBuf;

use crate::engine::{ContainerEngine, ContainerInfo};
use crate::lockdir::LockDir;
use crate::plan::container;
use crate::report::sweep::Swept;
use crate::run::error::RunError;
use crate::run::work_layer;

use crate::labels::{
    LABEL_HOST, LABEL_LOCK_DIR, LABEL_OWNER, LABEL_PROJECT, LABEL_RUN, LABEL_SCOPE,
};
use crate::lockdir::runs as run_lock;
use crate::lockdir::runs::Liveness;

/// What the labels and name of a listed container say, before any lock is looked at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Candidate {
    /// Not a container made by cibox (the engine's label filter is not trusted alone:
    /// the name must be the one the labels imply), or not of the scope swept.
    NotOurs,
    /// Made by a cibox on another host: only that host can tell whether its run lives.
    Elsewhere(String),
    /// Made on this host by this run, whose lock lives in `lock_dir` (when the
    /// container says): removed if the run is dead.
    Run {
        run: String,
        lock_dir: Option<PathBuf>,
    },
}

/// Judges one listed container for a sweep of `scope` (every scope: `None`) on `host`.
pub fn candidate(c: &ContainerInfo, scope: Option<&str>, host: &str) -> Candidate {
    candidate_named(&c.name, &c.labels, scope, host)
}

/// Judges a container or volume by its name and labels (see [`candidate`]).
fn candidate_named(
    name: &str,
    labels: &std::collections::HashMap<String, String>,
    scope: Option<&str>,
    host: &str,
) -> Candidate {
    let label = |k: &str| labels.get(k).map(String::as_str);
    let Some(its_scope) = label(LABEL_SCOPE) else {
        return Candidate::NotOurs;
    };
    let prefix = format!(
        "cibox-{}-{}-",
        container::sanitize(label(LABEL_PROJECT).unwrap_or_default()),
        container::sanitize(its_scope)
    );
    if label(LABEL_OWNER) != Some("cibox")
        || scope.is_some_and(|s| s != its_scope)
        || !name.starts_with(&prefix)
    {
        return Candidate::NotOurs;
    }
    let Some(run) = label(LABEL_RUN).filter(|r| run_lock::is_run_id(r)) else {
        return Candidate::NotOurs;
    };
    // Containers made before the host label existed count as this host's.
    match label(LABEL_HOST).filter(|h| *h != host) {
        Some(other) => Candidate::Elsewhere(other.to_string()),
        None => Candidate::Run {
            run: run.to_string(),
            lock_dir: label(LABEL_LOCK_DIR)
                .map(PathBuf::from)
                .filter(|p| p.is_absolute()),
        },
    }
}

/// Whether `run` lives, judged in the lock dir its container or volume names (else
/// `runs`).
fn liveness(
    runs: &LockDir,
    run: &str,
    lock_dir: Option<&std::path::Path>,
) -> Result<Liveness, crate::error::Error> {
    let dir = match lock_dir {
        Some(d) if d != runs.path() => LockDir::existing(d),
        _ => runs.clone(),
    };
    Ok(
        run_lock::liveness(&dir, run).map_err(|source| RunError::RunLocks {
            dir: dir.path().display().to_string(),
            what: format!("cannot tell whether run {run} is alive"),
            source,
        })?,
    )
}

/// Judges one listed container and removes it if its run is dead; whether it did.
fn sweep_one(
    engine: &dyn ContainerEngine,
    c: &ContainerInfo,
    scope: Option<&str>,
    runs: &LockDir,
    host: &str,
    swept: &mut Swept,
) -> Result<bool, crate::error::Error> {
    let (run, lock_dir) = match candidate(c, scope, host) {
        Candidate::NotOurs => return Ok(false),
        Candidate::Elsewhere(other) => {
            swept.elsewhere.push((c.name.clone(), other));
            return Ok(false);
        }
        Candidate::Run { run, lock_dir } => (run, lock_dir),
    };
    if liveness(runs, &run, lock_dir.as_deref())? != Liveness::Dead {
        swept.live.push((c.name.clone(), run));
        return Ok(false);
    }
    engine.remove_container(&c.id)?;
    swept.removed.push((c.name.clone(), c.id.clone()));
    Ok(true)
}

/// Removes the containers of dead runs (their cibox died) on this host: of `scope`, or
/// of every scope; of `project`, or of every project. A container is judged by its
/// exact owner/scope labels, the name they imply, a run ID, this host, and the run's
/// lock in the lock dir the container names (else `runs`): only a record whose lock is
/// free is a dead run; a run that cannot be placed counts as alive. Then forgets the
/// records in `runs` of the dead runs swept, but those of a container or volume that
/// could not be removed.
pub fn sweep(
    engine: &dyn ContainerEngine,
    project: Option<&str>,
    scope: Option<&str>,
    runs: &LockDir,
    host: &str,
) -> Result<Swept, crate::error::Error> {
    let mut labels = vec![format!("{LABEL_OWNER}=cibox")];
    if let Some(s) = scope {
        labels.push(format!("{LABEL_SCOPE}={s}"));
    }
    if let Some(p) = project {
        labels.push(format!("{LABEL_PROJECT}={p}"));
    }
    let mut swept = Swept::default();
    // Runs with a container (or a snapshot volume) still there: their records must
    // stay (they are what makes `gpu exec` ask the engine which GPUs such a container
    // holds, and what tells a later sweep that the run is dead).
    let mut kept: std::collections::HashSet<String> = std::collections::HashSet::new();
    for c in engine.containers_with_labels(&labels)? {
        if !sweep_one(engine, &c, scope, runs, host, &mut swept)?
            && let Some(run) = c.labels.get(LABEL_RUN)
        {
            kept.insert(run.clone());
        }
    }
    // A dead run's snapshot of its source (a volume its batches shared), now that its
    // containers are gone.
    for v in engine.volumes_with_labels(&labels)? {
        let Candidate::Run { run, lock_dir } = candidate_named(&v.name, &v.labels, scope, host)
        else {
            continue;
        };
        if liveness(runs, &run, lock_dir.as_deref())? != Liveness::Dead {
            continue;
        }
        match engine.remove_volume(&v.name) {
            Ok(()) => swept.volumes_removed.push(v.name),
            // Still in use: the run's record stays, or no later sweep could tell that
            // its run is dead, and the volume would be left for good.
            Err(_) => {
                kept.insert(run);
            }
        }
    }
    // The upper layers of `/work` that a dead run had mounted on this host and not yet
    // handed to a container (see `work_layer`): not the engine's, found by their lock.
    swept.layers_removed = work_layer::sweep(std::path::Path::new(work_layer::BASE));
    // Every container and volume of the swept dead runs is gone now: their records
    // can go too, and with them the reason to ask the engine (see `claims`).
    let dead = run_lock::dead_runs(runs).map_err(|source| RunError::RunLocks {
        dir: runs.path().display().to_string(),
        what: "runs/".into(),
        source,
    })?;
    for d in dead {
        if let Some(info) = d.info
            && scope.is_none_or(|s| s == info.scope)
            && project.is_none_or(|p| p == info.project)
            && !kept.contains(&d.run)
        {
            run_lock::forget(runs, &d.run);
        }
    }
    Ok(swept)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn listed(name: &str, labels: &[(&str, &str)]) -> ContainerInfo {
        ContainerInfo {
            id: "0123456789abcdef".into(),
            name: name.into(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<HashMap<_, _>>(),
            running: true,
        }
    }

    const RUN: &str = "0123456789abcdef";

    fn ours() -> Vec<(&'static str, &'static str)> {
        vec![
            (LABEL_OWNER, "cibox"),
            (LABEL_PROJECT, "p"),
            (LABEL_SCOPE, "gh-1-1"),
            (LABEL_RUN, RUN),
            (LABEL_HOST, "h"),
        ]
    }

    #[test]
    fn only_this_scopes_containers_of_this_host_are_swept() {
        let c = listed("cibox-p-gh-1-1-a-01234567", &ours());
        let ours_run = Candidate::Run {
            run: RUN.into(),
            lock_dir: None,
        };
        assert_eq!(candidate(&c, Some("gh-1-1"), "h"), ours_run);
        // Every scope: this one too.
        assert_eq!(candidate(&c, None, "h"), ours_run);
        // Another host's: left to that host.
        assert_eq!(
            candidate(&c, Some("gh-1-1"), "other"),
            Candidate::Elsewhere("h".into())
        );
        // Another scope, or a name that is not the one the labels imply.
        assert_eq!(candidate(&c, Some("gh-2-1"), "h"), Candidate::NotOurs);
        let renamed = listed("precious-db", &ours());
        assert_eq!(candidate(&renamed, Some("gh-1-1"), "h"), Candidate::NotOurs);
        // Labels a user put on a container of their own are not enough either.
        let mut foreign = ours();
        foreign[0] = (LABEL_OWNER, "someone");
        let c = listed("cibox-p-gh-1-1-a-01234567", &foreign);
        assert_eq!(candidate(&c, Some("gh-1-1"), "h"), Candidate::NotOurs);
        // A run label that is no run ID is never turned into a path.
        let mut bad_run = ours();
        bad_run[3] = (LABEL_RUN, "../../etc/passwd");
        let c = listed("cibox-p-gh-1-1-a-01234567", &bad_run);
        assert_eq!(candidate(&c, Some("gh-1-1"), "h"), Candidate::NotOurs);
        // Made before the host label existed: this host's.
        let old: Vec<_> = ours()
            .into_iter()
            .filter(|(k, _)| *k != LABEL_HOST)
            .collect();
        let c = listed("cibox-p-gh-1-1-a-01234567", &old);
        assert_eq!(candidate(&c, Some("gh-1-1"), "h"), ours_run);
        // The lock dir it names is where its run is judged.
        let mut placed = ours();
        placed.push((LABEL_LOCK_DIR, "/srv/locks"));
        let c = listed("cibox-p-gh-1-1-a-01234567", &placed);
        assert_eq!(
            candidate(&c, None, "h"),
            Candidate::Run {
                run: RUN.into(),
                lock_dir: Some("/srv/locks".into())
            }
        );
    }
}
