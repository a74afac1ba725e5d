//! GPUs held by running cibox containers.
//!
//! A batch's lease names its container, and dies with its cibox. If cibox is
//! SIGKILLed the container may run on, between steps (a `pip install`) showing no
//! process on its GPUs. So everything that hands out or judges GPUs (`batch run`,
//! `gpu exec`, `gpu status`, `capacity`) adds what the engine says to nvidia-smi's
//! view: a GPU named in the `org.cibox.gpus` label of a running cibox container is
//! busy. Not being able to list the containers fails closed, like a probe failure.

use crate::engine::{ContainerInfo, Engine};
use crate::gpu::probe::{self, ProbeError, Snapshot};
use crate::report;

use super::container::{LABEL_GPUS, LABEL_OWNER};

/// The engine, when one answers, to ask for running cibox containers.
pub struct ContainerClaims {
    rt: tokio::runtime::Runtime,
    engine: Engine,
}

impl ContainerClaims {
    /// `None` when no engine answers on this host: then no container can hold a GPU.
    pub fn connect() -> Option<ContainerClaims> {
        let rt = crate::engine::runtime().ok()?;
        match rt.block_on(Engine::connect()) {
            Ok(engine) => Some(ContainerClaims { rt, engine }),
            Err(e) => {
                report::debug(format!("no running cibox containers to consider: {e}"));
                None
            }
        }
    }

    /// nvidia-smi's view with the GPUs of running cibox containers marked busy.
    pub fn probe(claims: Option<&ContainerClaims>) -> Result<Snapshot, ProbeError> {
        let mut snap = probe::probe(probe::timeout())?;
        if let Some(c) = claims {
            mark(&mut snap, &c.engine, &c.rt)?;
        }
        Ok(snap)
    }
}

/// Marks the GPUs of running cibox containers in `snap` as claimed.
pub fn mark(
    snap: &mut Snapshot,
    engine: &Engine,
    rt: &tokio::runtime::Runtime,
) -> Result<(), ProbeError> {
    let labels = vec![format!("{LABEL_OWNER}=cibox")];
    let running = rt
        .block_on(engine.containers_with_labels(&labels))
        .map_err(|e| ProbeError::Containers(e.to_string()))?;
    mark_running(snap, &running);
    Ok(())
}

fn mark_running(snap: &mut Snapshot, containers: &[ContainerInfo]) {
    for c in containers.iter().filter(|c| c.running) {
        for uuid in c
            .labels
            .get(LABEL_GPUS)
            .map(|s| s.split(','))
            .into_iter()
            .flatten()
        {
            if snap.gpus.iter().any(|g| g.uuid == uuid) {
                snap.claimed.push((
                    uuid.to_string(),
                    format!("running cibox container {}", c.name),
                ));
            }
        }
    }
}
