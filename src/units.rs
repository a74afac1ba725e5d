//! Durations (`90s`, `30m`, `2h`) and sizes (`512m`, `8g`) as the manifest writes them.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Deserializer};

/// A duration written with a unit: `ms`, `s`, `m`, `h` or `d`; `0s` is allowed, and
/// so are several, largest first, each once (`1h45m`, `2d12h`), as people write them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Span(pub Duration);

impl Span {
    /// The longest duration accepted: 365 days.
    pub const MAX: Duration = Duration::from_secs(365 * 86400);
}

impl FromStr for Span {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || {
            format!(
                "bad duration `{s}`: write whole numbers with units, largest first, like 90s, 30m, 2h or 1h45m"
            )
        };
        // Each part: a whole number and its unit, in milliseconds; units get smaller.
        const UNITS: [(&str, u64); 5] = [
            ("d", 86_400_000),
            ("h", 3_600_000),
            ("m", 60_000),
            ("s", 1000),
            ("ms", 1),
        ];
        let mut rest = s.trim();
        if rest.is_empty() {
            return Err(bad());
        }
        let mut ms: u64 = 0;
        let mut smallest = usize::MAX;
        while !rest.is_empty() {
            let digits = rest
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(rest.len());
            let n: u64 = rest[..digits].parse().map_err(|_| bad())?;
            let unit_len = rest[digits..]
                .find(|c: char| c.is_ascii_digit())
                .unwrap_or(rest.len() - digits);
            let unit = &rest[digits..digits + unit_len];
            let rank = UNITS.iter().position(|(u, _)| *u == unit).ok_or_else(bad)?;
            if smallest != usize::MAX && rank <= smallest {
                return Err(bad());
            }
            smallest = rank;
            ms = n
                .checked_mul(UNITS[rank].1)
                .and_then(|v| ms.checked_add(v))
                .ok_or_else(bad)?;
            rest = &rest[digits + unit_len..];
        }
        let d = Duration::from_millis(ms);
        // Deadlines are computed as now + span, which must not overflow; no CI wait or
        // timeout is longer than this.
        if d > Span::MAX {
            return Err(format!("duration `{s}` is longer than {}", Span(Span::MAX)));
        }
        Ok(Span(d))
    }
}

impl fmt::Display for Span {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = self.0.as_millis();
        let s = self.0.as_secs();
        if !ms.is_multiple_of(1000) {
            write!(f, "{ms}ms")
        } else if s != 0 && s.is_multiple_of(3600) {
            write!(f, "{}h", s / 3600)
        } else if s != 0 && s.is_multiple_of(60) {
            write!(f, "{}m", s / 60)
        } else {
            write!(f, "{s}s")
        }
    }
}

/// Reads a unit-bearing value; a bare number gets the same "add a unit" message as any
/// other malformed text rather than a type error.
fn text_or_number<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        Text(String),
        Int(i64),
        Float(f64),
    }
    match Raw::deserialize(d) {
        Ok(Raw::Text(s)) => Ok(s),
        Ok(Raw::Int(i)) => Ok(i.to_string()),
        Ok(Raw::Float(f)) => Ok(f.to_string()),
        Err(_) => Err(serde::de::Error::custom(
            "expected a value with a unit, like 90s or 8g",
        )),
    }
}

impl<'de> Deserialize<'de> for Span {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        text_or_number(d)?.parse().map_err(serde::de::Error::custom)
    }
}

/// A size in bytes written with a unit: `k`, `m`, `g` or `t` (powers of 1024), or `b`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Size(pub u64);

impl FromStr for Size {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let t = s.trim().to_ascii_lowercase();
        let t = t
            .strip_suffix('b')
            .filter(|r| !r.is_empty() && r.ends_with(|c: char| c.is_ascii_alphabetic()))
            .unwrap_or(&t);
        let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        let bad = || format!("bad size `{s}`: write a whole number and a unit, like 512m or 8g");
        let n: u64 = num.parse().map_err(|_| bad())?;
        let k: u64 = match unit {
            "b" => 1,
            "k" => 1 << 10,
            "m" => 1 << 20,
            "g" => 1 << 30,
            "t" => 1 << 40,
            _ => return Err(bad()),
        };
        let bytes = n.checked_mul(k).ok_or_else(bad)?;
        if bytes == 0 {
            return Err(format!("bad size `{s}`: must be more than zero"));
        }
        Ok(Size(bytes))
    }
}

impl fmt::Display for Size {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (k, u) in [
            (1u64 << 40, "t"),
            (1 << 30, "g"),
            (1 << 20, "m"),
            (1 << 10, "k"),
        ] {
            if self.0.is_multiple_of(k) {
                return write!(f, "{}{u}", self.0 / k);
            }
        }
        write!(f, "{}b", self.0)
    }
}

impl<'de> Deserialize<'de> for Size {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        text_or_number(d)?.parse().map_err(serde::de::Error::custom)
    }
}

/// A duration for people: `0.4s`, `12s`, `4m 08s`, `2h 05m`.
pub fn human(d: std::time::Duration) -> String {
    let s = d.as_secs();
    if s < 10 {
        format!("{:.1}s", d.as_secs_f64())
    } else if s < 60 {
        format!("{s}s")
    } else if s < 3600 {
        format!("{}m {:02}s", s / 60, s % 60)
    } else {
        format!("{}h {:02}m", s / 3600, s % 3600 / 60)
    }
}

/// `SystemTime` as RFC 3339 in UTC with milliseconds (`2026-11-29T11:22:33.456Z`,
/// truncated to the millisecond; a time before 1970 as 1970, one past jiff's range (the
/// year 9999) as its last instant).
pub fn rfc3339(t: std::time::SystemTime) -> String {
    let ms = t
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis();
    let at = i64::try_from(ms)
        .ok()
        .and_then(|ms| jiff::Timestamp::from_millisecond(ms).ok())
        .unwrap_or(jiff::Timestamp::MAX);
    // A timestamp prints in UTC (`Z`); the precision fixes three fraction digits.
    format!("{at:.3}")
}

/// Milliseconds since 1970 of an RFC 3339 time in UTC as [`rfc3339`] writes it
/// (`2026-11-29T11:22:33.456Z`; the fraction optional, up to milliseconds used).
pub fn parse_rfc3339_ms(text: &str) -> Option<u64> {
    // Digits where `YYYY-MM-DDTHH:MM:SS` has them: strptime would also take a sign, a
    // space or a one-digit month.
    let shaped = text.len() >= 20
        && text.bytes().take(19).enumerate().all(|(i, c)| match i {
            4 | 7 => c == b'-',
            10 => c == b'T',
            13 | 16 => c == b':',
            _ => c.is_ascii_digit(),
        });
    if !shaped {
        return None;
    }
    // `Z` only, as cibox writes it: jiff's own `Timestamp` parser takes any offset.
    let fields = jiff::fmt::strtime::parse("%Y-%m-%dT%H:%M:%S%.fZ", text).ok()?;
    let at = jiff::tz::TimeZone::UTC
        .to_timestamp(fields.to_datetime().ok()?)
        .ok()?;
    u64::try_from(at.as_millisecond()).ok()
}

#[cfg(test)]
mod time_tests {
    #[test]
    fn rfc3339_reads_back_what_it_writes() {
        use std::time::{Duration, UNIX_EPOCH};
        for ms in [0, 951_782_400_000, 1_795_951_353_456, 4_102_444_799_999] {
            let text = super::rfc3339(UNIX_EPOCH + Duration::from_millis(ms));
            assert_eq!(super::parse_rfc3339_ms(&text), Some(ms), "{text}");
        }
        assert_eq!(
            super::parse_rfc3339_ms("2026-11-30T03:00:12Z"),
            Some(1_796_007_612_000)
        );
        assert_eq!(
            super::parse_rfc3339_ms("2026-11-30T03:00:12.5Z"),
            Some(1_796_007_612_500)
        );
        assert_eq!(
            super::parse_rfc3339_ms("2026-11-30T03:00:12.123456789Z"),
            Some(1_796_007_612_123)
        );
        for bad in [
            "",
            "2026-11-30",
            "2026-13-30T03:00:12Z",
            "2026-11-30T03:00:12.x5Z",
            "2026-11-30T03:00:12+01:00",
            "2026-11-30T03:00:12z",
            "2026-11-30 03:00:12Z",
            "2026-02-31T03:00:12Z",
            "2026-1-30T03:00:12Z",
            " 2026-11-30T03:00:12Z",
            "+2026-11-30T03:00:12Z",
            "1969-12-31T23:59:59Z",
        ] {
            assert_eq!(super::parse_rfc3339_ms(bad), None, "{bad}");
        }
    }

    #[test]
    fn human_durations() {
        use std::time::Duration;
        assert_eq!(super::human(Duration::from_millis(400)), "0.4s");
        assert_eq!(super::human(Duration::from_secs(12)), "12s");
        assert_eq!(super::human(Duration::from_secs(248)), "4m 08s");
        assert_eq!(super::human(Duration::from_secs(7500)), "2h 05m");
    }

    #[test]
    fn rfc3339_known_instants() {
        use std::time::{Duration, UNIX_EPOCH};
        assert_eq!(super::rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        let t = UNIX_EPOCH + Duration::from_millis(1_795_951_353_456);
        assert_eq!(super::rfc3339(t), "2026-11-29T11:22:33.456Z");
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400);
        assert_eq!(super::rfc3339(leap), "2000-02-29T00:00:00.000Z");
        let fraction = UNIX_EPOCH + Duration::from_nanos(1_795_951_353_456_999_999);
        assert_eq!(super::rfc3339(fraction), "2026-11-29T11:22:33.456Z");
        let before = UNIX_EPOCH - Duration::from_secs(5);
        assert_eq!(super::rfc3339(before), "1970-01-01T00:00:00.000Z");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!("90s".parse::<Span>().unwrap().0, Duration::from_secs(90));
        assert_eq!("30m".parse::<Span>().unwrap().0, Duration::from_secs(1800));
        assert_eq!("2h".parse::<Span>().unwrap().0, Duration::from_secs(7200));
        assert_eq!("0s".parse::<Span>().unwrap().0, Duration::ZERO);
        for bad in [
            "",
            "90",
            "1.5h",
            "-3s",
            "3 s",
            "h",
            "10x",
            "366d",
            "18446744073709551615s",
        ] {
            assert!(bad.parse::<Span>().is_err(), "{bad}");
        }
        assert_eq!("365d".parse::<Span>().unwrap().0, Span::MAX);
        // As people write them: largest first, each unit once.
        assert_eq!(
            "1h45m".parse::<Span>().unwrap().0,
            Duration::from_secs(6300)
        );
        assert_eq!(
            "2d12h30m5s250ms".parse::<Span>().unwrap().0,
            Duration::from_millis(((2 * 24 + 12) * 3600 + 30 * 60 + 5) * 1000 + 250)
        );
        for bad in ["45m1h", "1h1h", "1h 45m", "1h45", "h45m", "1hm"] {
            assert!(bad.parse::<Span>().is_err(), "{bad}");
        }
        assert_eq!("30m".parse::<Span>().unwrap().to_string(), "30m");
        assert_eq!("90s".parse::<Span>().unwrap().to_string(), "90s");
    }

    #[test]
    fn sizes() {
        assert_eq!("512m".parse::<Size>().unwrap().0, 512 << 20);
        assert_eq!("8g".parse::<Size>().unwrap().0, 8 << 30);
        assert_eq!("8GB".parse::<Size>().unwrap().0, 8 << 30);
        for bad in ["", "8", "0g", "1.5g", "-1m", "8x"] {
            assert!(bad.parse::<Size>().is_err(), "{bad}");
        }
        assert_eq!("64g".parse::<Size>().unwrap().to_string(), "64g");
    }
}
