//! What the host gives a build and cibox must never show: build secrets' values and
//! the credentials of its proxies. One [`Masker`] replaces them by `***`, byte for
//! byte, in everything a build prints (its steps' output as it comes, in pieces:
//! [`MaskStream`]), its errors, and the paths and keys its messages name. The image
//! itself is searched for them by `image::normalise`.
//!
//! A value is masked whole (without the white space around it) and, when it has
//! several lines, each line of it long enough, wherever it appears: a PEM key quoted
//! line by line with another indent is masked too. Values and lines shorter than
//! [`SHORTEST`] are not masked: they would be found by chance. A value need not be
//! UTF-8: the text is masked as bytes before it is made text.

use std::borrow::Cow;

/// The shortest value (or line of one) masked or searched for: a shorter one would be
/// found by chance.
pub const SHORTEST: usize = 8;

/// What takes a masked value's place.
const MASK: &[u8] = b"***";

/// The most a [`MaskStream`] holds back at the start of a run of masked values that
/// overlap (a value repeated over and over) before it lets the run out masked.
const MAX_HELD: usize = 1 << 20;

/// A value the host gave a build, named for messages (`secret `tok``, `the
/// credentials of proxy variable HTTPS_PROXY`): never shown, never kept in the image.
#[derive(Clone)]
pub struct Hidden {
    pub what: String,
    pub value: Vec<u8>,
}

impl std::fmt::Debug for Hidden {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Hidden({}, {} bytes)", self.what, self.value.len())
    }
}

/// Masks values in text: see the module's description.
#[derive(Default)]
pub struct Masker {
    /// What is masked, longest first, each once.
    needles: Vec<memchr::memmem::Finder<'static>>,
}

impl Masker {
    /// A masker of `values`: each whole, and each of its lines, of [`SHORTEST`] bytes
    /// or more once trimmed of white space.
    pub fn new<'v>(values: impl IntoIterator<Item = &'v [u8]>) -> Masker {
        let mut parts: Vec<Vec<u8>> = Vec::new();
        for value in values {
            let whole = value.trim_ascii();
            let lines = whole.split(|&b| b == b'\n').map(<[u8]>::trim_ascii);
            for part in std::iter::once(whole).chain(lines) {
                if part.len() >= SHORTEST && !parts.iter().any(|n| n == part) {
                    parts.push(part.to_vec());
                }
            }
        }
        parts.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        let needles = parts
            .iter()
            .map(|p| memchr::memmem::Finder::new(p).into_owned())
            .collect();
        Masker { needles }
    }

    /// A masker of what `hidden` holds.
    pub fn of(hidden: &[Hidden]) -> Masker {
        Masker::new(hidden.iter().map(|h| h.value.as_slice()))
    }

    /// The longest value masked (0 when none is).
    fn longest(&self) -> usize {
        self.needles.first().map_or(0, |n| n.needle().len())
    }

    /// Where `data` holds a masked value: ranges, sorted, those that overlap joined.
    fn ranges(&self, data: &[u8]) -> Vec<(usize, usize)> {
        let mut found: Vec<(usize, usize)> = Vec::new();
        for needle in &self.needles {
            for at in needle.find_iter(data) {
                found.push((at, at + needle.needle().len()));
            }
        }
        found.sort_unstable();
        let mut joined: Vec<(usize, usize)> = Vec::with_capacity(found.len());
        for (start, end) in found {
            match joined.last_mut() {
                Some(last) if start < last.1 => last.1 = last.1.max(end),
                _ => joined.push((start, end)),
            }
        }
        joined
    }

    /// `data` with each masked value replaced by `***`.
    pub fn mask<'d>(&self, data: &'d [u8]) -> Cow<'d, [u8]> {
        let ranges = self.ranges(data);
        if ranges.is_empty() {
            return Cow::Borrowed(data);
        }
        let mut out = Vec::with_capacity(data.len());
        let mut at = 0;
        for (start, end) in ranges {
            out.extend_from_slice(&data[at..start]);
            out.extend_from_slice(MASK);
            at = end;
        }
        out.extend_from_slice(&data[at..]);
        Cow::Owned(out)
    }

    /// `text` masked ([`Masker::mask`]), as text.
    pub fn mask_str<'t>(&self, text: &'t str) -> Cow<'t, str> {
        match self.mask(text.as_bytes()) {
            Cow::Borrowed(_) => Cow::Borrowed(text),
            Cow::Owned(bytes) => Cow::Owned(text_of(bytes)),
        }
    }

    /// Bytes masked, then made text (what is not UTF-8 replaced by `�`).
    pub fn mask_lossy(&self, data: &[u8]) -> String {
        text_of(self.mask(data).into_owned())
    }

    /// A path (or name) as messages show it: masked, then escaped (`\n`, `\xff`), so
    /// that two names that differ only in bytes that are not UTF-8 stay two.
    pub fn shown(&self, path: &[u8]) -> String {
        self.mask(path).escape_ascii().to_string()
    }

    /// A stream of text to mask as it comes, in pieces.
    pub fn stream(&self) -> MaskStream<'_> {
        MaskStream {
            masker: self,
            held: Vec::new(),
        }
    }
}

fn text_of(bytes: Vec<u8>) -> String {
    String::from_utf8(bytes).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

/// Text masked as it comes in pieces (a step's output): a value split between two
/// pieces is masked too. What could be the start of a value is held back until the
/// next piece, or [`MaskStream::finish`]; what comes out is what masking the whole
/// text at once gives.
pub struct MaskStream<'m> {
    masker: &'m Masker,
    held: Vec<u8>,
}

impl MaskStream<'_> {
    /// Takes the next piece; returns what can be shown now, masked.
    pub fn push(&mut self, piece: &[u8]) -> Vec<u8> {
        if self.held.is_empty() && self.masker.needles.is_empty() {
            return piece.to_vec();
        }
        self.held.extend_from_slice(piece);
        let data = &self.held;
        let ranges = self.masker.ranges(data);
        // A value that starts before `cut` lies whole in what is here.
        let mut cut = data
            .len()
            .saturating_sub(self.masker.longest().saturating_sub(1));
        // Not inside a character: the rest would show as `�`.
        for _ in 0..3 {
            if cut == 0 || cut == data.len() || data[cut] & 0xc0 != 0x80 {
                break;
            }
            cut -= 1;
        }
        // Not inside a masked value, which a later piece may make longer.
        if let Some(&(start, end)) = ranges.iter().find(|(s, e)| *s < cut && cut < *e) {
            cut = if data.len() - start <= MAX_HELD {
                start
            } else {
                end
            };
        }
        let rest = self.held.split_off(cut);
        let out = std::mem::replace(&mut self.held, rest);
        self.masker.mask(&out).into_owned()
    }

    /// What is held back, masked: the stream's end.
    pub fn finish(&mut self) -> Vec<u8> {
        let out = std::mem::take(&mut self.held);
        self.masker.mask(&out).into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn masker(values: &[&[u8]]) -> Masker {
        Masker::new(values.iter().copied())
    }

    #[test]
    fn values_are_masked_whole_and_short_ones_not_at_all() {
        let m = masker(&[b"  s3cret-value\n", b"short", b"value-two-long"]);
        assert_eq!(
            m.mask_str("a s3cret-value b value-two-long short"),
            "a *** b *** short"
        );
        // Overlapping values are one mask.
        let m = masker(&[b"abcdefgh", b"efghijkl"]);
        assert_eq!(m.mask_str("xabcdefghijklx"), "x***x");
        assert!(matches!(m.mask_str("nothing"), Cow::Borrowed(_)));
        assert_eq!(Masker::default().mask_str("abc"), "abc");
    }

    #[test]
    fn a_value_of_several_lines_is_masked_line_by_line_wherever_they_appear() {
        let pem = b"-----BEGIN PRIVATE KEY-----\r\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\nabc=\n-----END PRIVATE KEY-----\n";
        let m = masker(&[pem]);
        // Quoted in an error, each line indented again: every long line goes.
        let quoted = "step failed; its last lines:\n    -----BEGIN PRIVATE KEY-----\n    MIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n    abc=\n    -----END PRIVATE KEY-----";
        assert_eq!(
            m.mask_str(quoted),
            "step failed; its last lines:\n    ***\n    ***\n    abc=\n    ***"
        );
        // Whole, it is one mask.
        let whole = [b"<".as_slice(), pem.trim_ascii(), b">"].concat();
        assert_eq!(m.mask(&whole).as_ref(), b"<***>");
    }

    #[test]
    fn a_value_that_is_not_utf8_is_masked_as_bytes() {
        let value = b"\xff\xfe-not-utf8-\x80secret";
        let m = masker(&[value]);
        let text = [b"out: ".as_slice(), value, b"\n"].concat();
        assert_eq!(m.mask_lossy(&text), "out: ***\n");
        assert_eq!(m.shown(&[b"x-".as_slice(), value].concat()), "x-***");
        // Shown escaped otherwise.
        assert_eq!(m.shown(b"a\xffb\n"), "a\\xffb\\n");
    }

    #[test]
    fn a_value_split_between_pieces_is_masked_as_if_whole() {
        let value = "split-secret-value";
        let m = masker(&[value.as_bytes()]);
        let text = format!("before {value} mid {value}{value} after é");
        let bytes = text.as_bytes();
        // Every way of cutting it in two or three pieces gives what masking it whole
        // gives.
        let whole = m.mask_lossy(bytes);
        for i in 0..=bytes.len() {
            for j in i..=bytes.len() {
                let mut s = m.stream();
                let mut out = s.push(&bytes[..i]);
                out.extend(s.push(&bytes[i..j]));
                out.extend(s.push(&bytes[j..]));
                out.extend(s.finish());
                assert_eq!(String::from_utf8_lossy(&out), whole, "{i} {j}");
            }
        }
        // What cannot start a value comes out at once; a character is never cut.
        let mut s = m.stream();
        let out = s.push("héllo wörld, this is long enough".as_bytes());
        assert!(std::str::from_utf8(&out).is_ok());
        assert!(out.len() >= "héllo wörld, this is long enough".len() - value.len());
        // Nothing to mask: nothing held.
        assert_eq!(Masker::default().stream().push(b"abc"), b"abc");
    }
}
