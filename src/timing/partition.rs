//! `--partition K/N`: a run split over N runners, each running part K. The parts are
//! balanced by expected work (a batch's expected time × the GPUs it holds), assigned
//! longest first to the lightest part (LPT, as SGLang's `auto_partition` does): within
//! 4/3 of the best split, and in practice within a few percent. The split depends on
//! nothing but the batches, their expected times and N, so every runner computes the
//! same one; a part may be empty.

use std::str::FromStr;
use std::time::Duration;

use super::Expected;
use super::error::TimingError;

/// The most parts a run may be split into.
pub const MAX_PARTS: u32 = 1024;

/// Part `index` (1-based) of `count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionSpec {
    pub index: u32,
    pub count: u32,
}

impl FromStr for PartitionSpec {
    type Err = TimingError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = |why: &str| TimingError::Partition {
            given: crate::util::escape(s).into_owned(),
            why: why.to_string(),
        };
        let (k, n) = s.split_once('/').ok_or_else(|| bad("no `/`"))?;
        let number = |t: &str| -> Option<u32> {
            (!t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()))
                .then(|| t.parse().ok())
                .flatten()
        };
        let (Some(index), Some(count)) = (number(k), number(n)) else {
            return Err(bad("K and N must be whole numbers"));
        };
        if count == 0 || count > MAX_PARTS {
            return Err(bad(&format!("N must be 1 to {MAX_PARTS}")));
        }
        if index == 0 || index > count {
            return Err(bad("K must be 1 to N"));
        }
        Ok(PartitionSpec { index, count })
    }
}

impl std::fmt::Display for PartitionSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

/// One part of a split.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Part {
    /// 1-based.
    pub index: u32,
    /// Its batches, in the request's order.
    pub batches: Vec<String>,
    /// The sum of their expected times (one after another).
    pub serial: Duration,
    /// The sum of their expected work (slot-seconds).
    pub work: f64,
}

/// `expected`'s batches split into `count` parts, longest work first onto the lightest
/// part (ties: the earlier batch of the request, the lower part).
pub fn split(expected: &Expected, count: u32) -> Vec<Part> {
    let count = count.clamp(1, MAX_PARTS) as usize;
    let mut parts: Vec<Part> = (1..=count)
        .map(|i| Part {
            index: i as u32,
            ..Part::default()
        })
        .collect();
    // Whole milli-slot-seconds: the same sums on every runner.
    let work = |i: usize| -> u128 {
        let e = &expected.batches[i];
        e.time.as_millis() * u128::from(e.slots)
    };
    let mut order: Vec<usize> = (0..expected.batches.len()).collect();
    order.sort_by(|a, b| work(*b).cmp(&work(*a)).then(a.cmp(b)));
    let mut load = vec![0u128; count];
    let mut members: Vec<Vec<usize>> = vec![Vec::new(); count];
    for i in order {
        let lightest = (0..count)
            .min_by_key(|p| (load[*p], *p))
            .expect("at least one part");
        load[lightest] += work(i);
        members[lightest].push(i);
    }
    for (part, mut idx) in parts.iter_mut().zip(members) {
        idx.sort_unstable();
        for i in idx {
            let e = &expected.batches[i];
            part.batches.push(e.name.clone());
            part.serial += e.time;
            part.work += e.work();
        }
    }
    parts
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::timing::{Expectation, Source};

    fn expected(items: &[(&str, u64, u32)]) -> Expected {
        Expected {
            batches: items
                .iter()
                .map(|(n, s, slots)| Expectation {
                    name: n.to_string(),
                    time: Duration::from_secs(*s),
                    source: Source::Estimated,
                    slots: *slots,
                })
                .collect(),
        }
    }

    #[test]
    fn k_of_n_is_read_strictly() {
        let p: PartitionSpec = "2/4".parse().unwrap();
        assert_eq!((p.index, p.count), (2, 4));
        assert_eq!(p.to_string(), "2/4");
        for (bad, why) in [
            ("0/4", "K must be 1 to N"),
            ("5/4", "K must be 1 to N"),
            ("1/0", "N must be 1 to 1024"),
            ("1/2000", "N must be 1 to 1024"),
            ("2", "no `/`"),
            ("a/4", "whole numbers"),
            ("+1/4", "whole numbers"),
            ("1/4/", "whole numbers"),
            ("", "no `/`"),
        ] {
            let e = bad.parse::<PartitionSpec>().unwrap_err().to_string();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn longest_work_goes_first_to_the_lightest_part() {
        // Work: a 800, b 600, c 500, d 400, e 300, f 100 (slot-seconds).
        let e = expected(&[
            ("a", 100, 8),
            ("b", 600, 1),
            ("c", 500, 1),
            ("d", 100, 4),
            ("e", 300, 1),
            ("f", 100, 1),
        ]);
        let parts = split(&e, 3);
        let got: Vec<(Vec<String>, f64)> =
            parts.iter().map(|p| (p.batches.clone(), p.work)).collect();
        assert_eq!(
            got,
            [
                // a (800) first; f (100) last, onto the lightest: a's part.
                (vec!["a".to_string(), "f".to_string()], 900.0),
                (vec!["b".to_string(), "e".to_string()], 900.0),
                (vec!["c".to_string(), "d".to_string()], 900.0),
            ]
        );
        assert_eq!(parts[2].serial, Duration::from_secs(600));
        // Every batch in exactly one part, whatever N; parts beyond the batches empty.
        for n in 1..=8 {
            let parts = split(&e, n);
            let mut all: Vec<String> = parts.iter().flat_map(|p| p.batches.clone()).collect();
            all.sort();
            assert_eq!(all, ["a", "b", "c", "d", "e", "f"]);
            assert_eq!(parts.len(), n as usize);
        }
        assert!(split(&e, 8)[6].batches.is_empty());
    }

    #[test]
    fn the_split_is_the_same_whatever_order_equal_batches_come_in() {
        let e = expected(&[("x", 60, 1), ("y", 60, 1), ("z", 60, 1), ("w", 60, 1)]);
        let a = split(&e, 2);
        assert_eq!(a[0].batches, ["x", "z"]);
        assert_eq!(a[1].batches, ["y", "w"]);
        assert_eq!(split(&e, 2), a);
    }
}
