//! GPU models on a mixed host: a request may ask for a model (`gpu_model: GLOB`, `gpu
//! exec --model GLOB`), matched against the model name the probe reports (`NVIDIA H100
//! 80GB HBM3`); only the pool's GPUs of that model are its candidates.
//!
//! It narrows the pool, never widens it: the host policy's pool still bounds it, so a
//! manifest (a pull request writes it) gains nothing by asking. Fail closed: a GPU whose
//! model the probe could not name matches no model, and a host whose models cannot be
//! read leases nothing to a request for one.
//!
//! MIG slices: a slice's model is its GPU's and its profile, as NVML names it (`NVIDIA
//! H200 MIG 1g.18gb`). Slices go only to a request whose glob says `MIG` (case
//! ignored: `*MIG 1g.18gb`, `*H200 MIG*`), and whole GPUs only to the others (no model
//! among them): a batch that asked for an H200 never gets an 18 GB slice of one.

use super::pool::PoolGpu;
use super::probe::GpuHardware;
use crate::exit::Failure;

/// Why a request for a model cannot be served from the pool.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// No GPU of the pool is of the model: capacity, as for more GPUs than the pool has
    /// (this host cannot serve it; another may).
    #[error("no GPU of model `{glob}` in the pool; it has {have}")]
    NoneMatch { glob: String, have: String },
    /// Fewer GPUs of the model than the request needs.
    #[error("{need} GPU(s) of model `{glob}` asked for; the pool has {matching} (it has {have})")]
    TooFew {
        glob: String,
        need: usize,
        matching: usize,
        have: String,
    },
    /// The probe could not say what the GPUs are: none is leased for a model it may not
    /// be.
    #[error("GPU model `{glob}` asked for, and the GPUs' models could not be read: {why}")]
    Unreadable { glob: String, why: String },
    /// A request without a model (whole GPUs) on a pool of MIG slices.
    #[error(
        "{need} whole GPU(s) asked for; the pool has {whole}, and MIG slices, which go only to a request for their model (gpu_model / --model `*MIG 1g.18gb`); it has {have}"
    )]
    TooFewWhole {
        need: usize,
        whole: usize,
        have: String,
    },
}

impl crate::error::ErrorKind for ModelError {
    fn failure(&self) -> Failure {
        match self {
            ModelError::NoneMatch { .. }
            | ModelError::TooFew { .. }
            | ModelError::TooFewWhole { .. } => Failure::Capacity,
            ModelError::Unreadable { .. } => Failure::Infra,
        }
    }
}

/// Whether `name` is of the model `glob` asks for: the whole name, ASCII case ignored,
/// `*` any run of characters, `?` any one.
pub fn matches(glob: &str, name: &str) -> bool {
    let g: Vec<char> = glob.chars().map(|c| c.to_ascii_lowercase()).collect();
    let n: Vec<char> = name.chars().map(|c| c.to_ascii_lowercase()).collect();
    // The classic iterative match with one backtrack point: linear in practice, never
    // exponential.
    let (mut gi, mut ni) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ni < n.len() {
        if gi < g.len() && (g[gi] == '?' || (g[gi] != '*' && g[gi] == n[ni])) {
            gi += 1;
            ni += 1;
        } else if gi < g.len() && g[gi] == '*' {
            star = Some((gi, ni));
            gi += 1;
        } else if let Some((sg, sn)) = star {
            gi = sg + 1;
            ni = sn + 1;
            star = Some((sg, sn + 1));
        } else {
            return false;
        }
    }
    g[gi..].iter().all(|&c| c == '*')
}

/// The model of GPU `uuid`, when the probe named it.
pub fn model_of<'h>(hardware: &'h [GpuHardware], uuid: &str) -> Option<&'h str> {
    hardware
        .iter()
        .find(|h| h.uuid == uuid)
        .and_then(|h| h.name.as_deref())
}

/// The models of `pool`, each with its count, in order of first appearance: `2 × NVIDIA
/// H100 80GB HBM3, 1 × NVIDIA A100-SXM4-80GB` (`no GPU` for an empty pool; a GPU the
/// probe did not name is `an unnamed model`).
pub fn describe(pool: &[PoolGpu], hardware: &[GpuHardware]) -> String {
    let mut counts: Vec<(&str, usize)> = Vec::new();
    for g in pool {
        let name = model_of(hardware, &g.uuid).unwrap_or("an unnamed model");
        match counts.iter_mut().find(|(n, _)| *n == name) {
            Some((_, c)) => *c += 1,
            None => counts.push((name, 1)),
        }
    }
    if counts.is_empty() {
        return "no GPU".into();
    }
    counts
        .iter()
        .map(|(n, c)| format!("{c} × {}", crate::util::escape(n)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Whether a request for model `glob` asks for MIG slices (the glob says `MIG`).
pub fn asks_for_slices(glob: &str) -> bool {
    glob.to_ascii_lowercase().contains("mig")
}

/// The units of `pool` a request for `need` of model `glob` may have (without a model,
/// the pool's whole GPUs): those the probe named a model `glob` matches, slices only for
/// a glob that asks for them. `hardware` is what the probe said the GPUs are, or why it
/// could not.
pub fn narrow(
    pool: &[PoolGpu],
    hardware: Result<&[GpuHardware], &str>,
    glob: Option<&str>,
    need: usize,
) -> Result<Vec<PoolGpu>, ModelError> {
    let Some(glob) = glob else {
        let whole: Vec<PoolGpu> = pool
            .iter()
            .filter(|g| g.parent.is_none())
            .cloned()
            .collect();
        if whole.len() < need && whole.len() < pool.len() {
            return Err(ModelError::TooFewWhole {
                need,
                whole: whole.len(),
                have: hardware.map_or_else(|_| "no model read".into(), |h| describe(pool, h)),
            });
        }
        return Ok(whole);
    };
    let slices = asks_for_slices(glob);
    let hardware = hardware.map_err(|why| ModelError::Unreadable {
        glob: glob.to_string(),
        why: why.to_string(),
    })?;
    let matching: Vec<PoolGpu> = pool
        .iter()
        .filter(|g| g.parent.is_some() == slices)
        .filter(|g| model_of(hardware, &g.uuid).is_some_and(|name| matches(glob, name)))
        .cloned()
        .collect();
    if matching.is_empty() {
        return Err(ModelError::NoneMatch {
            glob: glob.to_string(),
            have: describe(pool, hardware),
        });
    }
    if matching.len() < need {
        return Err(ModelError::TooFew {
            glob: glob.to_string(),
            need,
            matching: matching.len(),
            have: describe(pool, hardware),
        });
    }
    Ok(matching)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(i: u32, name: Option<&str>) -> (PoolGpu, GpuHardware) {
        let uuid = format!("GPU-00000000-0000-0000-0000-00000000000{i}");
        (
            PoolGpu {
                index: i,
                uuid: uuid.clone(),
                parent: None,
            },
            GpuHardware {
                index: i,
                uuid,
                name: name.map(str::to_string),
                memory_mib: None,
                driver: None,
                cuda: None,
                compute_capability: None,
            },
        )
    }

    fn host() -> (Vec<PoolGpu>, Vec<GpuHardware>) {
        [
            gpu(0, Some("NVIDIA H100 80GB HBM3")),
            gpu(1, Some("NVIDIA A100-SXM4-80GB")),
            gpu(2, Some("NVIDIA H100 80GB HBM3")),
            gpu(3, None),
        ]
        .into_iter()
        .unzip()
    }

    #[test]
    fn globs_match_the_whole_name_ignoring_case() {
        let h100 = "NVIDIA H100 80GB HBM3";
        for (glob, want) in [
            ("*H100*", true),
            ("*h100*", true),
            ("NVIDIA H100 80GB HBM3", true),
            ("H100", false),
            ("NVIDIA H100", false),
            ("*H100", false),
            ("NVIDIA ?100*", true),
            ("*A100*", false),
            ("*", true),
            ("**H1*0*HBM?", true),
            ("", false),
        ] {
            assert_eq!(matches(glob, h100), want, "{glob}");
        }
        assert!(matches("", ""));
        // No blow-up on a pathological pattern.
        assert!(!matches(&"*a".repeat(50), &"a".repeat(40)));
    }

    #[test]
    fn a_model_narrows_the_pool_to_its_gpus() {
        let (pool, hw) = host();
        let h = narrow(&pool, Ok(&hw), Some("*H100*"), 2).unwrap();
        assert_eq!(h.iter().map(|g| g.index).collect::<Vec<_>>(), [0, 2]);
        let a = narrow(&pool, Ok(&hw), Some("*a100*"), 1).unwrap();
        assert_eq!(a.iter().map(|g| g.index).collect::<Vec<_>>(), [1]);
        // No model: the whole pool, unnamed GPUs included.
        assert_eq!(narrow(&pool, Ok(&hw), None, 4).unwrap(), pool);
        // Without hardware, a request without a model still has the pool.
        assert_eq!(narrow(&pool, Err("no"), None, 1).unwrap().len(), 4);
    }

    #[test]
    fn a_model_the_pool_lacks_is_capacity_naming_the_models_it_has() {
        let (pool, hw) = host();
        let err = narrow(&pool, Ok(&hw), Some("*B200*"), 1).unwrap_err();
        assert_eq!(
            err.to_string(),
            "no GPU of model `*B200*` in the pool; it has 2 × NVIDIA H100 80GB HBM3, 1 × NVIDIA A100-SXM4-80GB, 1 × an unnamed model"
        );
        assert_eq!(
            crate::error::Error::from(err).exit_code(),
            crate::exit::CAPACITY
        );
        let err = narrow(&pool, Ok(&hw), Some("*H100*"), 3).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("3 GPU(s) of model `*H100*` asked for; the pool has 2"),
            "{err}"
        );
        assert_eq!(
            crate::error::Error::from(err).exit_code(),
            crate::exit::CAPACITY
        );
    }

    #[test]
    fn slices_go_only_to_requests_that_ask_for_them() {
        let (mut pool, mut hw) = host();
        for j in 0..3 {
            let (mut g, mut h) = gpu(4, Some("NVIDIA H100 80GB HBM3 MIG 1g.10gb"));
            g.uuid = format!("MIG-00000000-0000-0000-0000-00000000000{j}");
            g.parent = Some("GPU-00000000-0000-0000-0000-000000000004".into());
            h.uuid = g.uuid.clone();
            pool.push(g);
            hw.push(h);
        }
        let slices = narrow(&pool, Ok(&hw), Some("*MIG 1g.10gb"), 2).unwrap();
        assert_eq!(slices.len(), 3);
        assert!(slices.iter().all(|g| g.parent.is_some()));
        // A glob that does not say MIG never gets a slice, though it would match.
        let whole = narrow(&pool, Ok(&hw), Some("*H100*"), 1).unwrap();
        assert_eq!(whole.iter().map(|g| g.index).collect::<Vec<_>>(), [0, 2]);
        // Nor does a request without a model.
        assert_eq!(narrow(&pool, Ok(&hw), None, 4).unwrap().len(), 4);
        let err = narrow(&pool, Ok(&hw), None, 5).unwrap_err();
        assert!(
            err.to_string()
                .contains("3 × NVIDIA H100 80GB HBM3 MIG 1g.10gb"),
            "{err}"
        );
        assert_eq!(
            crate::error::Error::from(err).exit_code(),
            crate::exit::CAPACITY
        );
        let err = narrow(&pool, Ok(&hw), Some("*MIG 3g*"), 1).unwrap_err();
        assert!(err.to_string().starts_with("no GPU of model"), "{err}");
    }

    #[test]
    fn unknown_models_fail_closed() {
        let (pool, hw) = host();
        // The unnamed GPU 3 matches not even `*`.
        let any = narrow(&pool, Ok(&hw), Some("*"), 1).unwrap();
        assert!(!any.iter().any(|g| g.index == 3), "{any:?}");
        let err = narrow(&pool, Err("nvidia-smi timed out"), Some("*H100*"), 1).unwrap_err();
        assert!(err.to_string().contains("nvidia-smi timed out"), "{err}");
        assert_eq!(
            crate::error::Error::from(err).exit_code(),
            crate::exit::INFRA
        );
    }
}
