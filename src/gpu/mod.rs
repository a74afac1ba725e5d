//! GPUs: probing what they do, and (with the leasing layer) who holds them.

pub mod lockdir;
pub mod probe;

pub use probe::is_gpu_uuid;
