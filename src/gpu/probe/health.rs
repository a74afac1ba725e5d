//! Whether the driver reports a unit unhealthy, read in the same driver calls as the
//! idle check (docs/interface.md §6, "Sick GPUs"). What counts, NVIDIA's:
//!
//! - an uncorrected (double-bit) ECC error since the driver loaded (the volatile
//!   count: the aggregate one never clears, so a GPU repaired by a reset would stay
//!   out for ever);
//! - memory pages retired but not yet blacklisted (`retired_pages.pending`: they can
//!   still be allocated until a reset);
//! - rows remapped but pending a reset, or a remapping that failed
//!   (`remapped_rows.pending`, `remapped_rows.failure`: A100 and later);
//! - a GPU the driver reports lost (NVML's `GPU_IS_LOST` on one GPU's call).
//!
//! A value the card does not support (`[N/A]`, `[Not Supported]`, NVML's
//! `NOT_SUPPORTED`) is not sickness: an H100 has no retired pages, a GeForce no ECC.
//! Anything else that is not a number or Yes/No is a probe failure (fail closed).

/// One health reading as nvidia-smi prints it (the four fields [`NVIDIA_FIELDS`] names,
/// in order, as `smi::QUERY_GPUS` asks them); `None` where the card does not report it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NvidiaHealth {
    pub ecc_uncorrected_volatile: Option<u64>,
    pub retired_pages_pending: Option<bool>,
    pub remapped_rows_pending: Option<bool>,
    pub remapped_rows_failure: Option<bool>,
}

/// Whether nvidia-smi says the card does not report a field.
pub fn unsupported(v: &str) -> bool {
    let v = v.trim();
    v.is_empty() || v.starts_with('[') || v.eq_ignore_ascii_case("N/A")
}

impl NvidiaHealth {
    /// From nvidia-smi's four values; `Err` names the one that is neither a value
    /// nor unsupported.
    pub fn from_smi(values: &[&str]) -> Result<NvidiaHealth, String> {
        let [ecc, retired, pending, failure] = values else {
            return Err(format!("expected 4 health values, got {}", values.len()));
        };
        let yes_no = |name: &str, v: &str| -> Result<Option<bool>, String> {
            match v.trim() {
                v if unsupported(v) => Ok(None),
                "Yes" | "yes" | "1" => Ok(Some(true)),
                "No" | "no" | "0" => Ok(Some(false)),
                other => Err(format!("{name} is `{other}`, neither Yes nor No")),
            }
        };
        let ecc = match ecc.trim() {
            v if unsupported(v) => None,
            v => Some(v.parse::<u64>().map_err(|_| {
                format!("ecc.errors.uncorrected.volatile.total is `{v}`, not a number")
            })?),
        };
        Ok(NvidiaHealth {
            ecc_uncorrected_volatile: ecc,
            retired_pages_pending: yes_no("retired_pages.pending", retired)?,
            remapped_rows_pending: yes_no("remapped_rows.pending", pending)?,
            remapped_rows_failure: yes_no("remapped_rows.failure", failure)?,
        })
    }

    /// Why the unit is sick, or `None`.
    pub fn verdict(&self) -> Option<String> {
        let mut why = Vec::new();
        if let Some(n) = self.ecc_uncorrected_volatile.filter(|n| *n > 0) {
            why.push(format!(
                "{n} uncorrected ECC error{} since the driver loaded",
                if n == 1 { "" } else { "s" }
            ));
        }
        if self.retired_pages_pending == Some(true) {
            why.push("retired memory pages pending a reset".to_string());
        }
        if self.remapped_rows_failure == Some(true) {
            why.push("a memory row remapping failed".to_string());
        } else if self.remapped_rows_pending == Some(true) {
            why.push("remapped memory rows pending a reset".to_string());
        }
        (!why.is_empty()).then(|| why.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unsupported_fields_are_not_sickness_and_each_sign_is_named() {
        let h = |v: [&str; 4]| NvidiaHealth::from_smi(&v).map(|h| h.verdict());
        assert_eq!(h(["0", "[N/A]", "No", "No"]), Ok(None));
        assert_eq!(h(["[N/A]", "[Not Supported]", "[N/A]", "[N/A]"]), Ok(None));
        assert_eq!(
            h(["2", "No", "No", "No"]).unwrap().unwrap(),
            "2 uncorrected ECC errors since the driver loaded"
        );
        assert_eq!(
            h(["0", "Yes", "No", "No"]).unwrap().unwrap(),
            "retired memory pages pending a reset"
        );
        assert_eq!(
            h(["0", "[N/A]", "Yes", "No"]).unwrap().unwrap(),
            "remapped memory rows pending a reset"
        );
        assert_eq!(
            h(["1", "[N/A]", "Yes", "Yes"]).unwrap().unwrap(),
            "1 uncorrected ECC error since the driver loaded; a memory row remapping failed"
        );
        assert!(
            h(["x", "No", "No", "No"])
                .unwrap_err()
                .contains("not a number")
        );
        assert!(
            h(["0", "Maybe", "No", "No"])
                .unwrap_err()
                .contains("`Maybe`")
        );
        assert!(NvidiaHealth::from_smi(&["0"]).is_err());
    }
}
