//! What a probe reads: each GPU's state and identity, the compute processes on them,
//! and when.

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct GpuState {
    /// The GPU's index as the driver numbers it; a MIG slice has its GPU's.
    pub index: u32,
    /// What names the unit leased: a GPU's UUID (an AMD GPU's unique ID), or a MIG
    /// slice's `MIG-…` UUID.
    pub uuid: String,
    /// For a MIG slice, the UUID of the GPU it is a slice of: leasing one excludes
    /// leasing the other (see `gpu::lease`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    pub memory_used_mib: u64,
    pub memory_total_mib: u64,
    /// Percent busy; `None` where the driver reports none: only ever a MIG slice's
    /// (the driver has no utilisation in MIG mode), whose processes and memory judge it.
    pub utilization: Option<u32>,
    /// Why the driver reports the unit unhealthy (`2 uncorrected ECC errors since the
    /// driver loaded`), `None` when it reads healthy or the card does not report it
    /// (`[N/A]` is not sickness). A sick unit is leased to nobody (see
    /// `pool::busy_reason`) until it reads healthy again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sick: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ComputeApp {
    pub gpu_uuid: String,
    pub pid: u32,
    pub used_memory_mib: u64,
}

/// What a GPU is, for the record of what a batch ran on: its model, memory, and the
/// driver and CUDA version it is driven by. A field the backend cannot give is `None`
/// (an older nvidia-smi has no `compute_cap`): these describe, they decide nothing.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct GpuHardware {
    pub index: u32,
    pub uuid: String,
    /// The model, as the driver names it (`NVIDIA H100 80GB HBM3`).
    pub name: Option<String>,
    pub memory_mib: Option<u64>,
    /// The driver's version (`550.54.15`).
    pub driver: Option<String>,
    /// The highest CUDA version the driver supports (`12.4`).
    pub cuda: Option<String>,
    /// `MAJOR.MINOR` (`9.0`).
    pub compute_capability: Option<String>,
}

/// What one backend read: the GPUs and the compute processes on them.
pub type Reading = (Vec<GpuState>, Vec<ComputeApp>);

/// One consistent reading of the host's GPUs.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Snapshot {
    pub gpus: Vec<GpuState>,
    pub apps: Vec<ComputeApp>,
    /// GPUs that something cibox knows of is using though the driver may not show it
    /// yet (UUID, by whom): a running cibox container whose lease died with its cibox.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub claimed: Vec<(String, String)>,
}

/// A point on the host's monotonic clock: one clock for every process on the host, so a
/// probe's start can be compared with the moment another process locked its GPUs.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct HostInstant(u64);

impl HostInstant {
    /// Now; `None` if the clock cannot be read (then nothing is shared).
    pub fn now() -> Option<HostInstant> {
        let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).ok()?;
        let secs = u64::try_from(t.tv_sec()).ok()?;
        let nanos = u64::try_from(t.tv_nsec()).ok()?;
        Some(HostInstant(
            secs.checked_mul(1_000_000_000)?.checked_add(nanos)?,
        ))
    }
}
