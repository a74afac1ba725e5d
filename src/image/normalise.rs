//! Reproducible Dockerfile builds: what the engine built, rewritten so that the same
//! inputs give the same image ID on any machine.
//!
//! The classic builder stamps an image with what varies from build to build: file
//! times (the checkout's, the build's), the `created` times of the image and each
//! history step, the build container's ID and config, the engine's version, the ID of
//! the intermediate parent image. cibox saves the built image and writes it again:
//! each layer the build added has its entries sorted by path (hard links last, after
//! what they link to), every file time set to `SOURCE_DATE_EPOCH`, owner names and
//! access/change times dropped (numeric owners, modes, extended attributes kept), and
//! an entry that only restates what the build's layers below hold dropped ([`restated`]:
//! a builder may or may not write it again); the config gets the new layer digests, `created` at the epoch, and no builder-specific
//! fields. Then the engine loads that archive, and its ID is the config's digest.
//!
//! Times are set, not only clamped: clamping keeps times older than the epoch, and a
//! checkout's file times are whatever made it (git writes the checkout's time, `cp -a`
//! or an unpacked tarball older ones), so the same files would give another ID.
//! The base image's layers are kept byte for byte: they are inputs, pinned by the base
//! image's ID, and rewriting them would cost a second copy of the base on disk.
//!
//! The layers are rewritten from disk (the saved archive is seeked, not held in
//! memory); each normalised layer passes through a temporary file to learn its digest.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Read, Seek, SeekFrom, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use sha2::{Digest, Sha256};

use super::ImageId;
use super::archive::ArchiveError;
use crate::util::hex;

mod entry;
mod restated;
mod scan;

pub use entry::EntrySummary;
use entry::{Indexed, kind_char, shown_target};
use scan::{ScanningReader, SecretScan};

use crate::mask::{Hidden, Masker};

/// A normalised image: the archive to load, its ID, and each layer's files.
pub struct Normalised {
    pub archive: tempfile::NamedTempFile,
    pub id: ImageId,
    /// Per layer, in order: path (as the layer has it) → summary.
    pub layers: Vec<BTreeMap<Vec<u8>, EntrySummary>>,
    /// The normalised config, for naming what differs outside the layers.
    pub config: serde_json::Value,
    /// How many entries restated the layers below them and were dropped.
    pub restated: usize,
    /// Where a secret's value or a proxy's credentials were found, one line each
    /// (`secret `ID`: layer 2, PATH`), never the value.
    pub secrets_found: Vec<String>,
    /// The diff IDs (as the engine built them) of the layers they were found in.
    pub secret_layers: Vec<String>,
}

/// Writes and hashes at once.
struct HashingWriter<W> {
    inner: W,
    hasher: Sha256,
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Reads and hashes at once.
pub(super) struct HashingReader<R> {
    pub(super) inner: R,
    pub(super) hasher: Sha256,
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
}

/// Rewrites the saved archive at `saved` (one image, as `docker save` writes it) with
/// times at `epoch`, named `REPOSITORY:id-<its ID's hex>` (a name of its own, which no
/// other image takes), in a temporary file under `tmp`. The layers of `keep` (a base
/// image's diff IDs) are kept as they are; every entry the build added (content, name,
/// link target, PAX records) and the config (every string) are searched for what
/// `hidden` holds ([`Normalised::secrets_found`], the places shown through `mask`).
pub fn normalise(
    saved: &Path,
    epoch: u64,
    repository: &str,
    (keep, passed_over): (
        &std::collections::HashSet<String>,
        &std::collections::BTreeSet<String>,
    ),
    (hidden, mask): (&[Hidden], &Masker),
    tmp: &Path,
) -> Result<Normalised, ArchiveError> {
    let mut scan = SecretScan::new(hidden, mask);
    let mut saved = SavedArchive::open(saved)?;
    saved.passed_over = passed_over.clone();
    let (mut config, layer_paths) = saved.image()?;
    let out_file =
        tempfile::NamedTempFile::new_in(tmp).map_err(|e| saved.io("temporary file", e))?;
    let mut out = tar::Builder::new(BufWriter::new(
        out_file
            .reopen()
            .map_err(|e| saved.io("temporary file", e))?,
    ));
    let old_ids = strings(&config["rootfs"]["diff_ids"]);
    let mut diff_ids = Vec::new();
    let mut written = std::collections::BTreeSet::new();
    let mut summaries = Vec::new();
    let mut below = restated::Below::default();
    let mut secret_layers = Vec::new();
    for (i, layer) in layer_paths.iter().enumerate() {
        let base = old_ids
            .get(i)
            .filter(|id| keep.contains(*id) && id.len() == 71);
        scan.layer = i + 1;
        let found_before = scan.found.len();
        let (digest, summary) = saved.write_layer(
            &mut out,
            layer,
            base,
            &mut written,
            (epoch, tmp),
            (&mut scan, &mut below),
        )?;
        diff_ids.push(format!("sha256:{digest}"));
        summaries.push(summary);
        if scan.found.len() > found_before
            && let Some(raw) = old_ids.get(i)
        {
            secret_layers.push(raw.clone());
        }
    }
    normalise_config(&mut config, &diff_ids, epoch);
    scan.config(&config);
    let config_digest = write_config_and_manifest(&mut out, &config, &diff_ids, repository, epoch)
        .map_err(|e| saved.io("writing the archive", e))?;
    out.into_inner()
        .and_then(|mut w| w.flush())
        .map_err(|e| saved.io("writing the archive", e))?;
    let id = ImageId::parse(&format!("sha256:{config_digest}"))
        .map_err(|e| ArchiveError::NotArchive(saved.from.clone(), e))?;
    Ok(Normalised {
        archive: out_file,
        id,
        layers: summaries,
        config,
        restated: below.dropped,
        secrets_found: scan.found,
        secret_layers,
    })
}

/// A link's target (relative to the folder `parent` of the archive) as a path of the
/// archive, when it stays inside it.
fn resolve_link(parent: &str, target: &str) -> Option<String> {
    let mut parts: Vec<&str> = if target.starts_with('/') {
        Vec::new()
    } else {
        parent.split('/').filter(|p| !p.is_empty()).collect()
    };
    for part in target.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            p => parts.push(p),
        }
    }
    Some(parts.join("/"))
}

/// The strings of a JSON list (none if it is not one).
fn strings(list: &serde_json::Value) -> Vec<String> {
    list.as_array()
        .map(|l| {
            l.iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// The archive `docker save` wrote, and where each of its files lies in it (it is
/// seeked, not held in memory).
struct SavedArchive {
    file: File,
    /// Layer files whose content the save passed over (a base's, see `saved`).
    passed_over: std::collections::BTreeSet<String>,
    /// Path → where its data starts, and its size.
    places: BTreeMap<String, (u64, u64)>,
    /// Its name in messages.
    from: String,
}

impl SavedArchive {
    /// Opens the archive and finds where each file of it lies.
    fn open(saved: &Path) -> Result<SavedArchive, ArchiveError> {
        let from = saved.display().to_string();
        let io =
            |what: &str, e: std::io::Error| ArchiveError::Io(from.clone(), format!("{what}: {e}"));
        let mut file = File::open(saved).map_err(|e| io("opening it", e))?;
        let mut places: BTreeMap<String, (u64, u64)> = BTreeMap::new();
        {
            let mut outer = tar::Archive::new(&mut file);
            // `docker save` writes a layer the image has twice as a link to the first.
            let mut links: Vec<(String, String)> = Vec::new();
            for entry in outer.entries().map_err(|e| io("reading it", e))? {
                let entry = entry.map_err(|e| io("reading it", e))?;
                let path = String::from_utf8_lossy(&entry.path_bytes())
                    .trim_start_matches("./")
                    .to_string();
                let kind = entry.header().entry_type();
                if kind.is_file() {
                    places.insert(path, (entry.raw_file_position(), entry.size()));
                } else if kind.is_symlink()
                    && let Some(target) = entry.link_name_bytes()
                {
                    links.push((path, String::from_utf8_lossy(&target).into_owned()));
                }
            }
            for (path, target) in links {
                let parent = path.rsplit_once('/').map_or("", |(p, _)| p);
                let Some(resolved) = resolve_link(parent, &target) else {
                    continue;
                };
                if let Some(&place) = places.get(&resolved) {
                    places.entry(path).or_insert(place);
                }
            }
        }
        Ok(SavedArchive {
            file,
            passed_over: Default::default(),
            places,
            from,
        })
    }

    /// The archive could not be read or written here (`what` was being done).
    fn io(&self, what: &str, e: std::io::Error) -> ArchiveError {
        ArchiveError::Io(self.from.clone(), format!("{what}: {e}"))
    }

    /// A file of the archive, whole (at most 64 MiB).
    fn read_small(&mut self, path: &str) -> Result<Vec<u8>, ArchiveError> {
        let Some(&(at, size)) = self.places.get(path) else {
            return Err(ArchiveError::Incomplete(
                self.from.clone(),
                format!("{path} is missing"),
            ));
        };
        if size > 64 << 20 {
            return Err(ArchiveError::NotArchive(
                self.from.clone(),
                format!("{path} is larger than 64 MiB"),
            ));
        }
        let mut bytes = vec![0u8; size as usize];
        self.file
            .seek(SeekFrom::Start(at))
            .and_then(|_| self.file.read_exact(&mut bytes))
            .map_err(|e| self.io(path, e))?;
        Ok(bytes)
    }

    /// The archive's one image: its config, and its layers' paths in order.
    fn image(&mut self) -> Result<(serde_json::Value, Vec<String>), ArchiveError> {
        let manifest: serde_json::Value =
            serde_json::from_slice(&self.read_small("manifest.json")?).map_err(|e| {
                ArchiveError::NotArchive(self.from.clone(), format!("manifest.json: {e}"))
            })?;
        let one = match manifest.as_array().map(Vec::as_slice) {
            Some([one]) => one.clone(),
            Some(many) => return Err(ArchiveError::ManyImages(self.from.clone(), many.len())),
            None => {
                return Err(ArchiveError::NotArchive(
                    self.from.clone(),
                    "manifest.json is not a list".into(),
                ));
            }
        };
        let config_path = one["Config"].as_str().unwrap_or_default().to_string();
        let config: serde_json::Value = serde_json::from_slice(&self.read_small(&config_path)?)
            .map_err(|e| {
                ArchiveError::NotArchive(self.from.clone(), format!("{config_path}: {e}"))
            })?;
        Ok((config, strings(&one["Layers"])))
    }

    /// Writes the archive's layer `layer` into `out`, once per digest (`written`): a
    /// base image's layer (`base`, its diff ID) as it was, any other normalised (times
    /// at the epoch, through a temporary file under `tmp`, searched by `scan`).
    /// Returns its digest (hex) and its files (none named for a base layer).
    fn write_layer(
        &mut self,
        out: &mut tar::Builder<BufWriter<File>>,
        layer: &str,
        base: Option<&String>,
        written: &mut std::collections::BTreeSet<String>,
        (epoch, tmp): (u64, &Path),
        (scan, below): (&mut SecretScan<'_>, &mut restated::Below),
    ) -> Result<(String, BTreeMap<Vec<u8>, EntrySummary>), ArchiveError> {
        let Some(&(at, size)) = self.places.get(layer) else {
            return Err(ArchiveError::Incomplete(
                self.from.clone(),
                format!("layer {layer} is missing"),
            ));
        };
        let from = &self.from;
        let io = |e: std::io::Error| ArchiveError::Io(from.clone(), format!("{layer}: {e}"));
        if base.is_none() && self.passed_over.contains(layer) {
            return Err(ArchiveError::Incomplete(
                self.from.clone(),
                format!(
                    "the save passed over {layer}, which the manifest names as a layer the build added"
                ),
            ));
        }
        let Some(base) = base else {
            let (layer_file, digest, summary) =
                normalise_layer(&mut self.file, at, size, epoch, (scan, below), tmp).map_err(io)?;
            let name = format!("{digest}/layer.tar");
            if written.insert(digest.clone()) {
                let mut h = tar::Header::new_gnu();
                let len = layer_file.as_file().metadata().map_err(io)?.len();
                h.set_size(len);
                h.set_mode(0o644);
                h.set_mtime(epoch);
                out.append_data(&mut h, &name, layer_file.reopen().map_err(io)?)
                    .map_err(io)?;
            }
            return Ok((digest, summary));
        };
        // A base image's layer, as it was: the engine holds it (the raw build is built on
        // it and outlives the load), so the archive names it without carrying it.
        below.forget_all();
        Ok((base[7..].to_string(), BTreeMap::new()))
    }
}

/// The name an image of ID `sha256:<hex>` gets in `repository`: `REPOSITORY:id-<hex>`.
pub fn id_tag(repository: &str, hex: &str) -> String {
    format!(
        "{repository}:id-{}",
        hex.strip_prefix("sha256:").unwrap_or(hex)
    )
}

/// Writes the normalised config and the `manifest.json` naming it, its layers and
/// its name ([`id_tag`]); returns the config's digest (hex).
fn write_config_and_manifest(
    out: &mut tar::Builder<BufWriter<File>>,
    config: &serde_json::Value,
    diff_ids: &[String],
    repository: &str,
    epoch: u64,
) -> std::io::Result<String> {
    let config_bytes = serde_json::to_vec(config).expect("JSON values serialise");
    let config_digest = hex(&Sha256::digest(&config_bytes));
    let tag = id_tag(repository, &config_digest);
    let config_name = format!("{config_digest}.json");
    let mut add = |path: &str, data: &[u8]| {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_mtime(epoch);
        out.append_data(&mut h, path, data)
    };
    add(&config_name, &config_bytes)?;
    let layers_named: Vec<String> = diff_ids
        .iter()
        .map(|d| format!("{}/layer.tar", &d[7..]))
        .collect();
    let manifest = serde_json::json!([{
        "Config": config_name,
        "RepoTags": [tag],
        "Layers": layers_named,
    }]);
    add("manifest.json", manifest.to_string().as_bytes())?;
    Ok(config_digest)
}

/// The config as it would be built anywhere: the new layers, `created` at the epoch,
/// and nothing of the build container, the intermediate parent or the engine.
fn normalise_config(config: &mut serde_json::Value, diff_ids: &[String], epoch: u64) {
    let created =
        crate::units::rfc3339(std::time::UNIX_EPOCH + std::time::Duration::from_secs(epoch));
    let Some(obj) = config.as_object_mut() else {
        return;
    };
    for key in ["container", "container_config", "docker_version", "parent"] {
        obj.remove(key);
    }
    obj.insert("created".into(), created.clone().into());
    if let Some(image) = obj.get_mut("config").and_then(|c| c.as_object_mut()) {
        // The classic builder names the intermediate image it ran the last step in.
        image.remove("Image");
        image.remove("Hostname");
        // Which build made it, for the next one should this one be killed: not the
        // image's (see `scratch`).
        if let Some(labels) = image.get_mut("Labels").and_then(|l| l.as_object_mut()) {
            labels.remove(super::scratch::LABEL_RAW_BUILD);
        }
    }
    if let Some(history) = obj.get_mut("history").and_then(|h| h.as_array_mut()) {
        // The builder records each label as a step of its own: that one goes too.
        let raw_label = format!("LABEL {}=", super::scratch::LABEL_RAW_BUILD);
        history.retain(|step| {
            !step["created_by"]
                .as_str()
                .is_some_and(|c| c.contains(&raw_label))
        });
        for step in history {
            if let Some(s) = step.as_object_mut() {
                s.insert("created".into(), created.clone().into());
            }
        }
    }
    obj.insert(
        "rootfs".into(),
        serde_json::json!({"type": "layers", "diff_ids": diff_ids}),
    );
}

/// One layer (`size` bytes at `at` in `saved`) rewritten into a temporary file,
/// without what it restates of the layers `below` ([`restated`]): returns it, the hex
/// SHA-256 of its bytes (its diff ID), and its files.
fn normalise_layer(
    saved: &mut File,
    at: u64,
    size: u64,
    epoch: u64,
    (scan, below): (&mut SecretScan<'_>, &mut restated::Below),
    tmp: &Path,
) -> std::io::Result<(
    tempfile::NamedTempFile,
    String,
    BTreeMap<Vec<u8>, EntrySummary>,
)> {
    let mut indexed = index_layer(saved, at, size)?;
    // Sorted by path; hard links last, after whatever they link to.
    indexed.sort_by(|a, b| {
        let hard = |e: &Indexed| e.header.entry_type() == tar::EntryType::Link;
        (hard(a), &a.path).cmp(&(hard(b), &b.path))
    });
    let out_file = tempfile::NamedTempFile::new_in(tmp)?;
    let writer = HashingWriter {
        inner: BufWriter::new(out_file.reopen()?),
        hasher: Sha256::new(),
    };
    let mut out = tar::Builder::new(writer);
    let mut files = BTreeMap::new();
    let dropped = below.restated(&indexed, saved)?;
    below.dropped += dropped.len();
    let mut kept = Vec::with_capacity(indexed.len() - dropped.len());
    for (i, e) in indexed.iter().enumerate() {
        if dropped.contains(&i) {
            continue;
        }
        kept.push(e);
        let (summary, hits) = write_entry(&mut out, e, saved, epoch, scan)?;
        below.keep(e, &summary)?;
        scan.entry(e, &hits);
        files.insert(e.path.clone(), summary);
    }
    below.end(&kept);
    let mut writer = out.into_inner()?;
    writer.flush()?;
    let digest = hex(&writer.hasher.finalize());
    Ok((out_file, digest, files))
}

/// The entries of one layer (`size` bytes at `at` in `saved`), in the layer's order.
fn index_layer(saved: &mut File, at: u64, size: u64) -> std::io::Result<Vec<Indexed>> {
    saved.seek(SeekFrom::Start(at))?;
    let mut magic = [0u8; 2];
    saved.read_exact(&mut magic).ok();
    if magic == [0x1f, 0x8b] {
        return Err(std::io::Error::other(
            "a compressed layer; cibox normalises uncompressed layers, as docker save writes them",
        ));
    }
    saved.seek(SeekFrom::Start(at))?;
    let mut indexed = Vec::new();
    let mut layer = tar::Archive::new(Read::by_ref(saved).take(size));
    for entry in layer.entries()? {
        let mut entry = entry?;
        let pax = entry
            .pax_extensions()?
            .map(|exts| {
                exts.filter_map(Result::ok)
                    .filter_map(|e| {
                        let key = e.key().ok()?.to_string();
                        // Paths, link names and sizes are written again by the
                        // builder; times go.
                        let dropped = matches!(
                            key.as_str(),
                            "path"
                                | "linkpath"
                                | "size"
                                | "mtime"
                                | "atime"
                                | "ctime"
                                | "uname"
                                | "gname"
                        );
                        (!dropped).then(|| (key, e.value_bytes().to_vec()))
                    })
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default();
        indexed.push(Indexed {
            path: entry.path_bytes().into_owned(),
            header: entry.header().clone(),
            link: entry.link_name_bytes().map(|l| l.into_owned()),
            data_at: at + entry.raw_file_position(),
            size: entry.size(),
            pax,
        });
    }
    Ok(indexed)
}

/// Writes one entry of a layer again, its data read from `saved`, with its time at
/// `epoch`; returns what it is, and what `scan` found in its content.
fn write_entry<'a, W: Write>(
    out: &mut tar::Builder<W>,
    e: &Indexed,
    saved: &mut File,
    epoch: u64,
    scan: &SecretScan<'a>,
) -> std::io::Result<(EntrySummary, Vec<&'a str>)> {
    let mut hits = Vec::new();
    let kind = e.header.entry_type();
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_mode(e.header.mode()?);
    h.set_uid(e.header.uid()?);
    h.set_gid(e.header.gid()?);
    h.set_mtime(epoch);
    if let (Ok(Some(major)), Ok(Some(minor))) = (e.header.device_major(), e.header.device_minor()) {
        h.set_device_major(major)?;
        h.set_device_minor(minor)?;
    }
    if !e.pax.is_empty() {
        out.append_pax_extensions(e.pax.iter().map(|(k, v)| (k.as_str(), v.as_slice())))?;
    }
    let path = Path::new(std::ffi::OsStr::from_bytes(&e.path));
    let digest = match (&e.link, kind) {
        (Some(target), tar::EntryType::Link | tar::EntryType::Symlink) => {
            h.set_size(0);
            out.append_link(&mut h, path, Path::new(std::ffi::OsStr::from_bytes(target)))?;
            shown_target(target)
        }
        _ if kind.is_file() || kind == tar::EntryType::Continuous => {
            h.set_size(e.size);
            saved.seek(SeekFrom::Start(e.data_at))?;
            let mut data = HashingReader {
                inner: ScanningReader {
                    inner: Read::by_ref(saved).take(e.size),
                    scan,
                    tail: Vec::new(),
                    hits: Vec::new(),
                },
                hasher: Sha256::new(),
            };
            out.append_data(&mut h, path, &mut data)?;
            hits = std::mem::take(&mut data.inner.hits);
            hex(&data.hasher.finalize())
        }
        _ => {
            h.set_size(0);
            out.append_data(&mut h, path, std::io::empty())?;
            String::new()
        }
    };
    let summary = EntrySummary {
        kind: kind_char(kind),
        mode: e.header.mode()?,
        owner: (e.header.uid()?, e.header.gid()?),
        size: e.size,
        digest,
    };
    Ok((summary, hits))
}

/// What differs between two normalised builds: config keys, then per layer the files
/// added, removed or changed (at most `limit` named per layer), each name shown
/// through `mask` (escaped: two names that differ only in bytes that are not UTF-8
/// stay two).
pub fn differences(a: &Normalised, b: &Normalised, limit: usize, mask: &Masker) -> Vec<String> {
    let mut out = Vec::new();
    if let (Some(ca), Some(cb)) = (a.config.as_object(), b.config.as_object()) {
        for (k, va) in ca {
            if k != "rootfs" && cb.get(k) != Some(va) {
                out.push(format!("config: `{}` differs", mask.shown(k.as_bytes())));
            }
        }
        for k in cb.keys() {
            if !ca.contains_key(k) {
                out.push(format!(
                    "config: `{}` only in the second build",
                    mask.shown(k.as_bytes())
                ));
            }
        }
    }
    if a.layers.len() != b.layers.len() {
        out.push(format!(
            "the builds have {} and {} layers",
            a.layers.len(),
            b.layers.len()
        ));
    }
    for (i, (la, lb)) in a.layers.iter().zip(&b.layers).enumerate() {
        let mut named = Vec::new();
        for (path, ea) in la {
            let shown = mask.shown(path);
            match lb.get(path) {
                None => named.push(format!("{shown} (only in the first build)")),
                Some(eb) if eb != ea => named.push(format!("{shown} ({})", what_differs(ea, eb))),
                Some(_) => {}
            }
        }
        for path in lb.keys() {
            if !la.contains_key(path) {
                named.push(format!("{} (only in the second build)", mask.shown(path)));
            }
        }
        let total = named.len();
        for n in named.into_iter().take(limit) {
            out.push(format!("layer {}: {n}", i + 1));
        }
        if total > limit {
            out.push(format!("layer {}: … {} more", i + 1, total - limit));
        }
    }
    out
}

fn what_differs(a: &EntrySummary, b: &EntrySummary) -> String {
    let mut parts = Vec::new();
    if a.kind != b.kind {
        parts.push("type");
    }
    if a.mode != b.mode {
        parts.push("mode");
    }
    if a.owner != b.owner {
        parts.push("owner");
    }
    if a.size != b.size {
        parts.push("size");
    }
    if a.digest != b.digest {
        parts.push(if a.kind == 'l' || a.kind == 'h' {
            "link target"
        } else {
            "content"
        });
    }
    parts.join(", ")
}

#[cfg(test)]
mod tests;
