//! What cibox does with an engine, as a trait: the seam between the code that runs
//! batches, sweeps leftovers and judges GPUs, and Docker. [`Engine`] is the one
//! implementation that talks to Docker; the run loop's unit tests drive a fake that
//! plays out timeouts, cancels, kills from outside, lost reports and images gone.

use std::collections::HashMap;
use std::io::Read;

use bollard::models::ContainerCreateBody;

use super::{
    ContainerInfo, EndCause, Engine, EngineError, FollowEnd, Followed, ImageDetails, Removal,
    Steps, VolumeInfo,
};

/// The engine as the runner, the sweep and the GPU claims use it.
pub trait ContainerEngine: Sync {
    /// The engine's version, for the records of what batches ran on (empty when it
    /// cannot say).
    fn version(&self) -> String;
    /// An image by ID or reference, if present (see [`Engine::inspect`]).
    fn inspect(&self, reference: &str) -> Result<Option<ImageDetails>, EngineError>;

    /// Containers (running or not) carrying all of `labels` (`key=value`).
    fn containers_with_labels(&self, labels: &[String]) -> Result<Vec<ContainerInfo>, EngineError>;

    /// Whether a bind can be read-only all the way down (API 1.44+).
    fn recursive_read_only(&self) -> bool;

    /// Whether the engine is reached through a socket of this host, so that it may
    /// see what cibox mounts here (see `run::work_layer`).
    fn on_this_host(&self) -> bool;

    /// Creates a container (never pulls); its ID.
    fn create_container(
        &self,
        name: &str,
        body: ContainerCreateBody,
    ) -> Result<String, EngineError>;

    /// Starts a container; the engine's reason when it cannot.
    fn start_container(&self, id: &str) -> Result<(), String>;

    /// Extracts a tar archive into `path` of a running container, keeping the owners
    /// its entries name.
    fn upload(
        &self,
        id: &str,
        path: &str,
        archive: Box<dyn Read + Send>,
    ) -> Result<(), EngineError>;

    /// Runs a batch's steps in a running container and follows them to their end; they
    /// go on once `prepare`, run while their process starts, returns the word they are
    /// told (see [`Engine::follow_exec`]).
    fn follow_exec(
        &self,
        id: &str,
        steps: Steps<'_>,
        prepare: &mut dyn FnMut() -> Option<&'static str>,
        interrupted: &mut dyn FnMut() -> bool,
        on: &mut dyn FnMut(Followed<'_>),
    ) -> Result<FollowEnd, EngineError>;

    fn is_running(&self, id: &str) -> bool;

    fn remove_volume(&self, name: &str) -> Result<(), EngineError>;

    /// Creates a named volume with `labels`; where the engine's host keeps it (its
    /// `Mountpoint`, empty where it does not say).
    fn create_volume(
        &self,
        name: &str,
        labels: HashMap<String, String>,
    ) -> Result<String, EngineError>;

    /// Volumes carrying all of `labels` (`key=value`).
    fn volumes_with_labels(&self, labels: &[String]) -> Result<Vec<VolumeInfo>, EngineError>;

    /// Where on the engine's host the mount at `target` comes from (a volume's folder).
    fn mount_source(&self, id: &str, target: &str) -> Option<String>;

    /// The tar archive of `path` in the container, until `stop` gives a reason.
    fn download<'a>(
        &'a self,
        id: &str,
        path: &str,
        stop: Box<dyn Fn() -> Option<String> + 'a>,
    ) -> Box<dyn Read + 'a>;

    /// Removes a container (killing it if it runs) with its anonymous volumes, and says
    /// whether someone else had removed it first.
    fn remove(&self, id: &str) -> Result<Removal, EngineError>;

    /// Removes a container; whoever removed it first.
    fn remove_container(&self, id: &str) -> Result<(), EngineError> {
        self.remove(id).map(|_| ())
    }

    /// Why a container that ended by itself ended, as far as the engine knows.
    fn end_cause(&self, id: &str, since_unix: u64) -> Result<EndCause, EngineError>;
}

impl ContainerEngine for Engine {
    fn version(&self) -> String {
        Engine::server_version(self)
    }

    fn inspect(&self, reference: &str) -> Result<Option<ImageDetails>, EngineError> {
        Engine::inspect(self, reference)
    }

    fn containers_with_labels(&self, labels: &[String]) -> Result<Vec<ContainerInfo>, EngineError> {
        Engine::containers_with_labels(self, labels)
    }

    fn recursive_read_only(&self) -> bool {
        Engine::recursive_read_only(self)
    }

    fn on_this_host(&self) -> bool {
        self.host.starts_with("unix://")
    }

    fn create_container(
        &self,
        name: &str,
        body: ContainerCreateBody,
    ) -> Result<String, EngineError> {
        Engine::create_container(self, name, body)
    }

    fn start_container(&self, id: &str) -> Result<(), String> {
        Engine::start_container(self, id)
    }

    fn upload(
        &self,
        id: &str,
        path: &str,
        archive: Box<dyn Read + Send>,
    ) -> Result<(), EngineError> {
        Engine::upload(self, id, path, archive)
    }

    fn follow_exec(
        &self,
        id: &str,
        steps: Steps<'_>,
        prepare: &mut dyn FnMut() -> Option<&'static str>,
        interrupted: &mut dyn FnMut() -> bool,
        on: &mut dyn FnMut(Followed<'_>),
    ) -> Result<FollowEnd, EngineError> {
        Engine::follow_exec(self, id, steps, prepare, interrupted, on)
    }

    fn is_running(&self, id: &str) -> bool {
        Engine::is_running(self, id)
    }

    fn remove_volume(&self, name: &str) -> Result<(), EngineError> {
        Engine::remove_volume(self, name)
    }

    fn create_volume(
        &self,
        name: &str,
        labels: HashMap<String, String>,
    ) -> Result<String, EngineError> {
        Engine::create_volume(self, name, labels)
    }

    fn volumes_with_labels(&self, labels: &[String]) -> Result<Vec<VolumeInfo>, EngineError> {
        Engine::volumes_with_labels(self, labels)
    }

    fn mount_source(&self, id: &str, target: &str) -> Option<String> {
        Engine::mount_source(self, id, target)
    }

    fn download<'a>(
        &'a self,
        id: &str,
        path: &str,
        stop: Box<dyn Fn() -> Option<String> + 'a>,
    ) -> Box<dyn Read + 'a> {
        Box::new(Engine::download(self, id, path, stop))
    }

    fn remove(&self, id: &str) -> Result<Removal, EngineError> {
        Engine::remove(self, id)
    }

    fn end_cause(&self, id: &str, since_unix: u64) -> Result<EndCause, EngineError> {
        Engine::end_cause(self, id, since_unix)
    }
}
