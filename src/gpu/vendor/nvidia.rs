//! NVIDIA: whole GPUs (`GPU-…`) and MIG slices (`MIG-…`), handed to a container by
//! UUID through the engine's GPU runtime (the NVIDIA Container Toolkit's device
//! request, or CDI names), and named to CUDA by the same UUIDs in
//! `CUDA_VISIBLE_DEVICES` (CUDA takes `MIG-…` UUIDs as it takes GPUs').

use super::handover::{DeviceRequest, Handover, HandoverError, Vendor};
use crate::gpu::pool::PoolGpu;
use crate::manifest::{GpuDriver, is_gpu_uuid, is_mig_uuid};

pub struct Nvidia;

impl Vendor for Nvidia {
    fn name(&self) -> &'static str {
        "NVIDIA"
    }

    fn owns(&self, id: &str) -> bool {
        is_gpu_uuid(id) || is_mig_uuid(id)
    }

    fn container(&self, units: &[PoolGpu], driver: GpuDriver) -> Result<Handover, HandoverError> {
        let ids: Vec<String> = units.iter().map(|g| g.uuid.clone()).collect();
        let request = match driver {
            GpuDriver::Nvidia => DeviceRequest {
                driver: "nvidia".into(),
                device_ids: ids.clone(),
                capabilities: vec![vec!["gpu".into()]],
            },
            // nvidia-ctk names each GPU and slice by its UUID (its `uuid` naming
            // strategy).
            GpuDriver::Cdi => DeviceRequest {
                driver: "cdi".into(),
                device_ids: ids.iter().map(|u| format!("nvidia.com/gpu={u}")).collect(),
                capabilities: Vec::new(),
            },
        };
        Ok(Handover {
            env: self.host_env(units),
            ids,
            devices: Vec::new(),
            requests: vec![request],
            groups: Vec::new(),
            mounts: Vec::new(),
        })
    }

    fn host_env(&self, units: &[PoolGpu]) -> Vec<(String, String)> {
        let ids: Vec<&str> = units.iter().map(|g| g.uuid.as_str()).collect();
        vec![("CUDA_VISIBLE_DEVICES".into(), ids.join(","))]
    }
}
