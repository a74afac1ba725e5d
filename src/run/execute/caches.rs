//! A batch's caches for the life of its container (see [`crate::cache`]): each the
//! current generation beneath an overlay, the layer it writes into either the cache's
//! own (a host whose policy trusts its runs) or a private one in memory that goes with
//! the batch. After the batch: a trusted run that passed has its layer promoted, any
//! other layer is thrown away, and what each cache saw is recorded.

use std::os::unix::io::RawFd;

use bollard::models::Mount;

use crate::cache::{Cache, CacheError, Reading, Writing};
use crate::plan::BatchPlan;
use crate::plan::container::caches::{overlay_mount, private_dir};
use crate::report::record::CacheRecord;
use crate::run::cleanup::watchdog::Watchdog;
use crate::run::error::RunError;
use crate::run::execute::{Execution, Result};

/// Room left in a private layer below which it counts as full.
const FULL_MARGIN: u64 = 1 << 20;
/// Room for the archive's headers when a private layer is measured: a layer of many
/// small files is counted up to about this many of them.
const MAX_HEADER_BYTES: u64 = 64 << 20;

/// A batch's caches while its container lives.
pub(super) struct BatchCaches {
    uses: Vec<CacheUse>,
    /// The holder of private layers, and its watchdog.
    holder: Option<(String, Watchdog)>,
    private_size: u64,
}

struct CacheUse {
    name: String,
    target: String,
    cache: Cache,
    reading: Reading,
    /// A pull request's run: its scope, whose generation lies over the base's, and
    /// which a passing run's layer is laid over (never the base).
    scope: Option<(Cache, Reading)>,
    layer: Layer,
}

enum Layer {
    /// The cache's own layer: kept if the batch passes.
    Through(Writing),
    /// A private one in the holder, at these paths of the engine's host.
    Private { upper: String, work: String },
}

impl BatchCaches {
    /// The overlays the batch's container mounts.
    pub(super) fn mounts(&self) -> Vec<Mount> {
        self.uses
            .iter()
            .map(|u| {
                // The scope's generation over the base's (the overlay's leftmost lower
                // folder is the top one).
                let lower = match &u.scope {
                    Some((_, r)) => format!(
                        "{}:{}",
                        r.lower.to_string_lossy(),
                        u.reading.lower.to_string_lossy()
                    ),
                    None => u.reading.lower.to_string_lossy().into_owned(),
                };
                match &u.layer {
                    Layer::Through(w) => overlay_mount(
                        &u.target,
                        &lower,
                        &w.host_upper.to_string_lossy(),
                        &w.host_work.to_string_lossy(),
                        true,
                    ),
                    Layer::Private { upper, work } => {
                        overlay_mount(&u.target, &lower, upper, work, false)
                    }
                }
            })
            .collect()
    }

    /// The locks that keep the generations read (and the layers written) in place: the
    /// batch's watchdog holds them too, so they last as long as the container does.
    pub(super) fn fds(&self) -> Vec<RawFd> {
        self.uses
            .iter()
            .flat_map(|u| {
                let mut fds = vec![u.reading.fd()];
                if let Some((_, r)) = &u.scope {
                    fds.push(r.fd());
                }
                if let Layer::Through(w) = &u.layer {
                    fds.push(w.fd());
                }
                fds
            })
            .collect()
    }
}

impl Execution<'_> {
    /// Holds each cache of `b` for reading and makes the layers it writes into.
    pub(super) fn prepare_caches(&self, b: &BatchPlan) -> Result<Option<BatchCaches>> {
        if b.caches.is_empty() {
            return Ok(None);
        }
        let (Some(store), Some(policy)) = (self.cache_store, self.plan.caches.as_ref()) else {
            return Err(crate::error::Error::from(CacheError::Cache {
                cache: b.caches[0].0.clone(),
                message: "this host grants no caches".into(),
            }));
        };
        // A pull request's run keeps its writes in its own scope, where the host keeps
        // them; never in the base.
        let scoped = match self.plan.pull_request {
            Some(n) if policy.trusted && policy.pull_requests.keep => Some(n),
            _ => None,
        };
        let through = policy.trusted && (self.plan.pull_request.is_none() || scoped.is_some());
        let mut uses = Vec::new();
        for (name, target) in &b.caches {
            let cache = store.cache(&self.plan.manifest.project, name)?;
            // A pull request's scope exists only for a cache the base has written: a
            // manifest a pull request wrote names any caches it likes, and each scope
            // has a cap of its own, so new names would multiply what one pull request
            // may keep.
            let scoped = scoped.filter(|_| cache.base_written());
            let through = through && (self.plan.pull_request.is_none() || scoped.is_some());
            let reading = cache.read()?;
            let scope = match scoped {
                Some(n) => Some(cache.read_scope(n)?),
                None => None,
            };
            let layer = match (&scope, through) {
                (Some((s, _)), true) => Layer::Through(s.write(b.user)?),
                (None, true) => Layer::Through(cache.write(b.user)?),
                _ => Layer::Private {
                    upper: String::new(),
                    work: String::new(),
                },
            };
            uses.push(CacheUse {
                name: name.clone(),
                target: target.clone(),
                cache,
                reading,
                scope,
                layer,
            });
        }
        let mut caches = BatchCaches {
            uses,
            holder: None,
            private_size: policy.private_size,
        };
        if caches
            .uses
            .iter()
            .any(|u| matches!(u.layer, Layer::Private { .. }))
        {
            self.start_holder(b, &mut caches)?;
        }
        Ok(Some(caches))
    }

    /// Starts the holder of `caches`' private layers and makes each layer's folders.
    fn start_holder(&self, b: &BatchPlan, caches: &mut BatchCaches) -> Result<()> {
        let private = |u: &CacheUse| matches!(u.layer, Layer::Private { .. });
        let names: Vec<String> = caches
            .uses
            .iter()
            .filter(|u| private(u))
            .map(|u| u.name.clone())
            .collect();
        let id = self.engine.create_container(
            &b.container.holder_name(),
            b.container.holder_body(&names, caches.private_size),
        )?;
        let watchdog = match (self.start_watchdog)(&id, &[]) {
            Ok(w) => w,
            Err(e) => {
                let _ = self.engine.remove_container(&id);
                return Err(RunError::Watchdog(e).into());
            }
        };
        // From here the holder goes with `caches` (its watchdog removes it if dropped).
        caches.holder = Some((id.clone(), watchdog));
        if let Err(why) = self.engine.start_container(&id) {
            return Err(RunError::HolderNotStarted { why }.into());
        }
        for u in caches.uses.iter_mut().filter(|u| private(u)) {
            let dir = private_dir(&u.name);
            // Into the volume itself: the holder's root is read-only.
            self.engine.upload(&id, &dir, layer_folders(b.user))?;
            let Some(source) = self.engine.mount_source(&id, &dir) else {
                return Err(RunError::PrivateLayerNowhere {
                    cache: u.name.clone(),
                }
                .into());
            };
            u.layer = Layer::Private {
                upper: format!("{source}/upper"),
                work: format!("{source}/work"),
            };
        }
        Ok(())
    }

    /// Ends the batch's use of its caches, once its container is gone: promotes a
    /// trusted layer of a batch that `passed`, throws every other away, and says what
    /// each cache saw. When its container could not be removed (`container_left`), what
    /// still runs there may write its layer: a merge or a removal would follow the links
    /// it plants, so the layer is left to a clean-up once the watchdog has removed the
    /// container (it holds the layer's lock until then).
    pub(super) fn finish_caches(
        &self,
        caches: BatchCaches,
        passed: bool,
        container_left: bool,
    ) -> Vec<CacheRecord> {
        let BatchCaches {
            uses,
            holder,
            private_size,
        } = caches;
        let mut records = Vec::new();
        for u in uses {
            let mut r = CacheRecord {
                name: u.name.clone(),
                path: u.target.clone(),
                generation: u.reading.generation.clone(),
                writes: "private".into(),
                ..Default::default()
            };
            if let Some((scope, reading)) = &u.scope {
                r.pull_request = scope.pull_request;
                r.scope_generation = Some(reading.generation.clone());
            }
            // Where a kept layer goes: the pull request's scope, or the base.
            let (target, cap) = match &u.scope {
                Some((scope, _)) => (
                    scope,
                    self.plan
                        .caches
                        .as_ref()
                        .map_or(0, |p| p.scope_cap(&u.cache.project, &u.name)),
                ),
                None => (
                    &u.cache,
                    self.plan
                        .caches
                        .as_ref()
                        .map_or(0, |p| p.cap(&u.cache.project, &u.name)),
                ),
            };
            match u.layer {
                Layer::Through(w) => {
                    r.writes = if u.scope.is_some() {
                        "pull-request".into()
                    } else {
                        "through".into()
                    };
                    r.wrote_bytes = target.layer_bytes(&w);
                    if container_left {
                        r.problem = Some(
                            "not kept: the batch's container could not be removed; its layer is left until it is (`cibox cache prune`)".into(),
                        );
                    } else if passed {
                        match target.promote(w, cap) {
                            Ok(p) => {
                                r.kept = Some(p.generation);
                                r.evicted = p.evicted;
                                r.problem = (!p.problems.is_empty()).then(|| p.problems.join("; "));
                            }
                            Err(e) => r.problem = Some(format!("not kept: {e}")),
                        }
                    } else {
                        let problems = target.discard(w);
                        r.problem = (!problems.is_empty()).then(|| problems.join("; "));
                    }
                }
                Layer::Private { .. } => {
                    if let Some((id, _)) = &holder {
                        r.wrote_bytes = self.private_bytes(id, &u.name, private_size);
                        if r.wrote_bytes + FULL_MARGIN >= private_size {
                            r.full = true;
                            r.problem = Some(format!(
                                "its private layer ({}) filled up: writes to {} failed from then on (the host's caches.private_size bounds it)",
                                crate::units::Size(private_size),
                                u.target
                            ));
                        }
                    }
                }
            }
            if u.scope.is_some()
                && let Some(p) = self.plan.caches.as_ref()
            {
                // Scopes nobody used for the policy's expiry go.
                let mut problems = Vec::new();
                u.cache
                    .expire_scopes(Some(p.pull_requests.expiry), &mut problems);
            }
            records.push(r);
        }
        if let Some((id, watchdog)) = holder
            && self.engine.remove_container(&id).is_ok()
        {
            watchdog.dismiss();
        }
        records
    }

    /// How much a batch wrote into a private layer: the sizes of the files the holder
    /// keeps there, read from the engine's archive. The batch chose what is there: a
    /// sparse file claims any size (counted by its size as the archive gives it, PAX
    /// headers included, and never read past), and the archive is read no further than
    /// the layer could hold with room for headers, nor longer than a copy of
    /// `/reports` may take, nor past a signal.
    fn private_bytes(&self, holder: &str, name: &str, size: u64) -> u64 {
        let stop = crate::run::copy::StopWhen::now();
        let archive = self.engine.download(
            holder,
            &format!("{}/upper", private_dir(name)),
            Box::new(move || stop.reason()),
        );
        let readable = size.saturating_mul(2).saturating_add(MAX_HEADER_BYTES);
        let mut total: u64 = 0;
        let mut tar = tar::Archive::new(std::io::Read::take(archive, readable));
        let Ok(entries) = tar.entries() else {
            return 0;
        };
        for e in entries {
            let Ok(e) = e else { break };
            if e.header().entry_type().is_file() {
                total = total.saturating_add(e.size());
            }
            if total > size.saturating_mul(2) {
                break;
            }
        }
        total
    }
}

/// A tar of a private layer's `upper` (the batch's, so its writes may land) and `work`
/// (the overlay's, root's) folders.
fn layer_folders((uid, gid): (u32, u32)) -> Box<dyn std::io::Read + Send> {
    let mut b = tar::Builder::new(Vec::new());
    for (sub, owner, mode) in [("upper/", (uid, gid), 0o755), ("work/", (0, 0), 0o700)] {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Directory);
        h.set_uid(u64::from(owner.0));
        h.set_gid(u64::from(owner.1));
        h.set_mode(mode);
        h.set_size(0);
        h.set_mtime(0);
        // Two fixed names: appending to a Vec cannot fail.
        let _ = b.append_data(&mut h, sub, std::io::empty());
    }
    let bytes = b.into_inner().unwrap_or_default();
    Box::new(std::io::Cursor::new(bytes))
}
