//! One entry of a layer: as read from the saved archive, and what it is.

/// What one file of a layer is, for naming what differs between two builds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntrySummary {
    pub kind: char,
    pub mode: u32,
    pub owner: (u64, u64),
    pub size: u64,
    /// Of the content (regular files), or the link target.
    pub digest: String,
}

/// One entry of a layer as read: enough to write it again from the saved archive.
pub(super) struct Indexed {
    pub(super) path: Vec<u8>,
    pub(super) header: tar::Header,
    pub(super) link: Option<Vec<u8>>,
    /// Where its data starts in the saved archive.
    pub(super) data_at: u64,
    pub(super) size: u64,
    /// PAX records to keep (not times).
    pub(super) pax: Vec<(String, Vec<u8>)>,
}

/// The letter `ls -l` shows for an entry's type.
pub(super) fn kind_char(kind: tar::EntryType) -> char {
    match kind {
        tar::EntryType::Directory => 'd',
        tar::EntryType::Symlink => 'l',
        tar::EntryType::Link => 'h',
        tar::EntryType::Char => 'c',
        tar::EntryType::Block => 'b',
        tar::EntryType::Fifo => 'p',
        _ => '-',
    }
}

/// A link's target as shown and compared: lossy where it is not UTF-8.
pub(super) fn shown_target(target: &[u8]) -> String {
    use std::os::unix::ffi::OsStrExt;
    std::path::Path::new(std::ffi::OsStr::from_bytes(target))
        .display()
        .to_string()
}
