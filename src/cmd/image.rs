//! `cibox image …`: lockset, verify, load, build, save.

use std::collections::HashMap;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use serde_json::json;

use super::Context;
use crate::engine::{Engine, EngineInfo};
use crate::error::{Error, Result};
use crate::exit;
use crate::image::lockset::{self, Lockset};
use crate::image::{self, ImageError, ImageId, PinnedRef, Verified, build_context};
use crate::manifest::{DEFAULT_IMAGE, ImageConfig, Manifest};
use crate::report;

/// The manifest's image named `name` (`default` when none is given).
fn named<'m>(m: &'m Manifest, name: Option<&str>) -> Result<(&'m str, &'m ImageConfig)> {
    let name = name.unwrap_or(DEFAULT_IMAGE);
    m.images
        .get_key_value(name)
        .map(|(k, v)| (k.as_str(), v))
        .ok_or_else(|| {
            Error::Usage(format!(
                "{}: no image named `{name}`; images: {}",
                m.path.display(),
                m.images.keys().cloned().collect::<Vec<_>>().join(", ")
            ))
        })
}

/// `cibox image lockset`: the canonical text, then `digest: sha256:…`.
pub fn lockset(ctx: &Context, name: Option<&str>) -> Result<u8> {
    let m = ctx.manifest()?;
    let (_, img) = named(&m, name)?;
    let l = Lockset::compute(&m.dir, &img.locks)?;
    if ctx.json {
        let files: Vec<_> = l
            .files
            .iter()
            .map(|f| json!({"path": f.path, "sha256": f.sha256}))
            .collect();
        report::json(&json!({"files": files, "text": l.text, "digest": l.digest}));
    } else {
        print!("{}", l.text);
        println!("digest: {}", l.digest);
    }
    Ok(exit::SUCCESS)
}

/// The image to use: the flag, else `CIBOX_IMAGE` (the default image) or
/// `CIBOX_IMAGE_<NAME>`, else the image's `id`.
fn chosen_id(
    flag: Option<String>,
    manifest: Option<(&str, &ImageConfig)>,
) -> Result<(ImageId, &'static str)> {
    let name = manifest.map_or(DEFAULT_IMAGE, |(n, _)| n);
    let var = if name == DEFAULT_IMAGE {
        "CIBOX_IMAGE".to_string()
    } else {
        crate::manifest::image_variable(name)
    };
    let (raw, from) = if let Some(id) = flag {
        (id, "the command line")
    } else if let Some(id) = std::env::var(&var).ok().filter(|s| !s.is_empty()) {
        (id, "the environment")
    } else if let Some(id) = manifest.and_then(|(_, i)| i.id.clone()) {
        (id, "the image's id in the manifest")
    } else {
        return Err(Error::Usage(
            "no image ID: pass one, set CIBOX_IMAGE, or set image.id in cibox.yaml".into(),
        ));
    };
    let id =
        ImageId::parse(raw.trim()).map_err(|why| Error::refused(format!("{why} (from {from})")))?;
    Ok((id, from))
}

fn describe_engine(info: &EngineInfo) {
    report::debug(format!(
        "engine {} at {} (API {}), storage driver {}: {}",
        info.server_version,
        info.host,
        info.api_version,
        info.storage_driver,
        info.id_semantics.describe()
    ));
}

fn print_verified(ctx: &Context, v: &Verified, info: &EngineInfo) {
    if ctx.json {
        report::json(&json!({
            "status": "verified",
            "image": v.id,
            "lockset": v.lockset,
            "lock_files": v.files,
            "id_semantics": info.id_semantics,
            "storage_driver": info.storage_driver,
        }));
    } else {
        println!(
            "verified {} (lockset {}, {} lock files)",
            v.id, v.lockset, v.files
        );
    }
}

/// The ID of a loaded or built image on stdout (for scripts) and what was verified on
/// stderr; or, with `--json`, the verification.
fn print_result(ctx: &Context, v: &Verified, info: &EngineInfo, done: &str) {
    if ctx.json {
        print_verified(ctx, v, info);
    } else {
        println!("{}", v.id);
        report::info(format!(
            "{done}: lockset {} ({} lock files)",
            v.lockset, v.files
        ));
    }
}

/// `cibox image verify [ID]`.
pub fn verify(ctx: &Context, flag: Option<String>, name: Option<&str>) -> Result<u8> {
    // A malformed ID given explicitly is refused before anything else is read.
    let explicit = flag.is_some() || std::env::var("CIBOX_IMAGE").is_ok_and(|s| !s.is_empty());
    if explicit {
        chosen_id(flag.clone(), None)?;
    }
    let m = ctx.manifest()?;
    let img = named(&m, name)?;
    let (id, from) = chosen_id(flag, Some(img))?;
    report::debug(format!("image {id} (from {from})"));
    let source = Lockset::compute(&m.dir, &img.1.locks)?;
    let engine = Engine::connect()?;
    let info = engine.info()?;
    describe_engine(&info);
    let v = image::verify(&engine, &id, &source)?;
    print_verified(ctx, &v, &info);
    Ok(exit::SUCCESS)
}

/// Turns what the engine says it loaded into image IDs.
fn loaded_ids(engine: &Engine, loaded: Vec<String>) -> Result<Vec<ImageId>> {
    if loaded.is_empty() {
        return Err(Error::refused(
            "the engine loaded nothing from the archive; is it a docker-archive (docker save, or a Nix streamLayeredImage)?",
        ));
    }
    let mut ids: Vec<ImageId> = Vec::new();
    for r in loaded {
        let id = if r.starts_with("sha256:") {
            r
        } else {
            // A tagged archive (Nix images always are): resolve the tag right away.
            engine.inspect(&r)?.map(|i| i.id).ok_or_else(|| {
                Error::refused(format!("loaded `{r}`, but the engine cannot find it"))
            })?
        };
        let id = ImageId::parse(&id).map_err(Error::refused)?;
        if !ids.contains(&id) {
            ids.push(id);
        }
    }
    Ok(ids)
}

/// `cibox image load [--from FILE|-]`.
pub fn load(ctx: &Context, from: &str, verify: bool, name: Option<&str>) -> Result<u8> {
    // Read the manifest first: a bad manifest must stop us before the engine changes.
    let (manifest, source) = if verify {
        let m = ctx.manifest()?;
        let (n, img) = named(&m, name)?;
        let source = Lockset::compute(&m.dir, &img.locks)?;
        let n = n.to_string();
        (Some((m, n)), Some(source))
    } else {
        (None, None)
    };
    if from == "-" && std::io::stdin().is_terminal() {
        return Err(Error::Usage(
            "`image load` reads the archive from standard input, which is a terminal; pass --from FILE or pipe an archive in".into(),
        ));
    }
    let file = if from == "-" {
        None
    } else {
        Some(
            std::fs::File::open(from)
                .map_err(|e| Error::Usage(format!("cannot open {from}: {e}")))?,
        )
    };
    let engine = Engine::connect()?;
    let info = engine.info()?;
    describe_engine(&info);
    let loaded = match file {
        Some(f) => engine.load(Box::new(f))?,
        None => engine.load(Box::new(std::io::stdin()))?,
    };
    let ids = loaded_ids(&engine, loaded)?;
    let pin = manifest.as_ref().map(|(m, n)| (m, n.as_str()));
    finish_loaded(ctx, &engine, &info, ids, source.as_ref(), pin)
}

/// Prints the loaded IDs (stdout, one per line, for scripts) and verifies each.
fn finish_loaded(
    ctx: &Context,
    engine: &Engine,
    info: &EngineInfo,
    ids: Vec<ImageId>,
    source: Option<&Lockset>,
    pin: Option<(&Manifest, &str)>,
) -> Result<u8> {
    let Some(source) = source else {
        if ctx.json {
            report::json(&json!({"images": ids, "verified": false}));
        } else {
            for id in &ids {
                println!("{id}");
            }
        }
        return Ok(exit::SUCCESS);
    };
    let mut verified = Vec::new();
    for id in &ids {
        report::info(format!("loaded {id}"));
        verified.push(image::verify(engine, id, source)?);
        if let Some((m, name)) = pin {
            check_pin(m, name, id)?;
        }
    }
    for v in &verified {
        print_result(ctx, v, info, "verified");
    }
    Ok(exit::SUCCESS)
}

/// `cibox image id [--from FILE|-]`: the ID of a docker-archive's image, read from the
/// archive alone (no engine), checked against the manifest's pinned `id` when there is
/// a manifest that pins one.
pub fn id(ctx: &Context, from: &str, name: Option<&str>) -> Result<u8> {
    // The manifest first: a pin to compare with (none without a manifest, unless a
    // name was asked for).
    let manifest = match ctx.manifest() {
        Ok(m) => Some(m),
        Err(Error::Manifest(crate::manifest::ManifestError::NotFound { .. })) if name.is_none() => {
            None
        }
        Err(e) => return Err(e),
    };
    let pin = match &manifest {
        Some(m) => {
            let (n, _) = named(m, name)?;
            Some((m, n.to_string()))
        }
        None => None,
    };
    let shown = if from == "-" { "standard input" } else { from };
    let found = if from == "-" {
        if std::io::stdin().is_terminal() {
            return Err(Error::Usage(
                "`image id` reads the archive from standard input, which is a terminal; pass --from FILE or pipe an archive in".into(),
            ));
        }
        image::archive::read_image(std::io::stdin().lock(), shown)?
    } else {
        let (file, _) = crate::util::open_plain(Path::new(from), true)
            .map_err(|e| Error::Usage(format!("--from {from}: {e}")))?;
        image::archive::read_image(std::io::BufReader::new(file), shown)?
    };
    if let Some((m, n)) = &pin {
        check_pin(m, n, &found.id)?;
    }
    if ctx.json {
        report::json(&json!({
            "id": found.id,
            "manifest_digest": found.manifest_digest,
            "repo_tags": found.repo_tags,
            "layers": found.layers.len(),
            "pinned": pin.as_ref().and_then(|(m, n)| m.images[n].id.clone()),
        }));
    } else {
        println!("{}", found.id);
        match &found.manifest_digest {
            Some(d) => report::info(format!(
                "on a containerd image store the engine names this image {d} (its manifest digest)"
            )),
            None => report::info(
                "the ID on a classic image store; a containerd image store names images by their manifest digest, which this archive does not carry",
            ),
        }
        if let Some((m, n)) = &pin
            && m.images[n].id.is_some()
        {
            report::info(format!("it is the ID image `{n}` pins"));
        }
    }
    Ok(exit::SUCCESS)
}

/// `cibox image fetch [REF]`: pulls an image pinned by digest, then verifies it like a
/// loaded one: its lockset labels against the source's, and its ID against `image.id`
/// when the manifest pins one.
pub fn fetch(ctx: &Context, reference: Option<String>, name: Option<&str>) -> Result<u8> {
    if let Some(r) = &reference {
        PinnedRef::parse(r).map_err(Error::Usage)?;
    }
    let m = ctx.manifest()?;
    let (name, img) = named(&m, name)?;
    let Some(text) = reference.or_else(|| img.reference.clone()) else {
        return Err(Error::Usage(format!(
            "no image reference: pass REPOSITORY@sha256:… or set the `ref` of image `{name}` in {}",
            m.path.display()
        )));
    };
    let pinned = PinnedRef::parse(&text).map_err(Error::Usage)?;
    let source = Lockset::compute(&m.dir, &img.locks)?;
    let engine = Engine::connect()?;
    let info = engine.info()?;
    describe_engine(&info);
    report::info(format!("pulling {pinned}"));
    engine.pull(&pinned.repository, &pinned.digest)?;
    let found = engine
        .inspect(&pinned.to_string())?
        .ok_or_else(|| Error::refused(format!("pulled {pinned}, but the engine cannot find it")))?;
    let id = ImageId::parse(&found.id).map_err(Error::refused)?;
    check_pin_of(&m, name, &id, &format!("{pinned} is image {id}"))?;
    let v = image::verify(&engine, &id, &source)?;
    print_result(ctx, &v, &info, "verified");
    Ok(exit::SUCCESS)
}

/// `cibox image build`: the manifest's Dockerfile or Nix recipe.
pub fn build(ctx: &Context, name: Option<&str>, check: bool) -> Result<u8> {
    let m = ctx.manifest()?;
    let (name, img) = named(&m, name)?;
    let source = Lockset::compute(&m.dir, &img.locks)?;
    match (&img.dockerfile, &img.nix) {
        (Some(df), _) => build_dockerfile(ctx, &m, name, &m.resolve(df), &source, check),
        (None, Some(_)) if check => Err(Error::Usage(format!(
            "--check builds a Dockerfile twice; image `{name}` is a Nix recipe, whose builds Nix itself checks: nix build --rebuild {}",
            img.nix.as_deref().unwrap_or_default()
        ))),
        (None, Some(attr)) => build_nix(ctx, &m, name, attr, &source),
        (None, None) => Err(Error::Usage(format!(
            "{}: image `{name}` has no recipe; set its dockerfile or nix",
            m.path.display()
        ))),
    }
}

/// Images a Dockerfile takes: everything after FROM, and `COPY --from=` sources, that is
/// not an earlier stage (by name or number).
fn dockerfile_bases(text: &str) -> Vec<String> {
    let mut stages: Vec<String> = Vec::new();
    let mut bases = Vec::new();
    for line in text.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        if words
            .first()
            .is_some_and(|w| w.eq_ignore_ascii_case("COPY") || w.eq_ignore_ascii_case("ADD"))
        {
            for w in &words[1..] {
                if let Some(src) = w.strip_prefix("--from=")
                    && !stages.iter().any(|s| s.eq_ignore_ascii_case(src))
                    && src.parse::<usize>().is_err()
                {
                    bases.push(src.to_string());
                }
            }
            continue;
        }
        if words
            .first()
            .is_none_or(|w| !w.eq_ignore_ascii_case("FROM"))
        {
            continue;
        }
        let rest: Vec<&str> = words[1..]
            .iter()
            .copied()
            .filter(|w| !w.starts_with("--"))
            .collect();
        if let Some(image) = rest.first()
            && !stages.iter().any(|s| s.eq_ignore_ascii_case(image))
        {
            bases.push(image.to_string());
        }
        if rest.len() >= 3 && rest[1].eq_ignore_ascii_case("AS") {
            stages.push(rest[2].to_string());
        }
    }
    bases
}

fn build_dockerfile(
    ctx: &Context,
    m: &Manifest,
    image_name: &str,
    dockerfile: &Path,
    source: &Lockset,
    check: bool,
) -> Result<u8> {
    let text = std::fs::read_to_string(dockerfile).map_err(|e| {
        Error::Usage(format!(
            "image.dockerfile {}: cannot read: {e}",
            dockerfile.display()
        ))
    })?;
    let context_dir = dockerfile.parent().unwrap_or(Path::new(".")).to_path_buf();
    let name = dockerfile
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("Dockerfile")
        .to_string();
    let bases = dockerfile_bases(&text);
    // Packed now so a bad context stops us before the engine is asked anything; again
    // for a second build.
    let first_context = std::cell::RefCell::new(Some(build_context::pack(&context_dir, &name)?));
    let context = || -> std::result::Result<std::fs::File, ImageError> {
        match first_context.borrow_mut().take() {
            Some(f) => Ok(f),
            None => build_context::pack(&context_dir, &name)
                .map_err(|e| ImageError::refused(e.to_string())),
        }
    };
    let labels = HashMap::from([
        (lockset::LABEL_DIGEST.to_string(), source.digest.clone()),
        (lockset::LABEL_FILES.to_string(), source.text.clone()),
    ]);
    let (epoch, epoch_from) = image::build::source_date_epoch().map_err(Error::Usage)?;
    let engine = Engine::connect()?;
    let info = engine.info()?;
    describe_engine(&info);
    // The classic builder pulls a missing base image; cibox never pulls.
    let mut base_layers = std::collections::HashSet::new();
    for base in &bases {
        if base.eq_ignore_ascii_case("scratch") {
            continue;
        }
        if base.contains('$') {
            report::warn(format!(
                "FROM {base}: uses a build argument; cannot check it is local"
            ));
            continue;
        }
        match engine.inspect(base)? {
            Some(found) => base_layers.extend(found.layers),
            None => {
                return Err(Error::refused(format!(
                    "{}: base image `{base}` is not present locally and cibox never pulls; load it first (docker load) or build FROM scratch",
                    dockerfile.display()
                )));
            }
        }
        if !base.starts_with("sha256:") {
            report::warn(format!(
                "FROM {base}: a tag; the image ID pins what was used, but the lockset does not cover it"
            ));
        }
    }
    report::info(format!(
        "building {}{} (lockset {}; file times set to {epoch}, {epoch_from})",
        dockerfile.display(),
        if check {
            " twice, without the cache"
        } else {
            ""
        },
        source.digest
    ));
    let verbose = report::enabled(report::Level::Debug);
    let mut on_output = |out: &str| {
        if verbose {
            eprint!("{out}");
        }
    };
    let tag = tag_for(m, source);
    let inputs = image::build::BuildInputs {
        context: &context,
        dockerfile: &name,
        labels: &labels,
        tag: &tag,
        epoch,
        base_layers,
    };
    let built = if check {
        image::build::check(&engine, &inputs, &mut on_output)?
    } else {
        image::build::build(&engine, &inputs, &mut on_output)?
    };
    if built.engine_id != built.id {
        report::info(format!(
            "this engine names the image {} (a containerd image store: the manifest digest); its config digest is {}",
            built.engine_id, built.id
        ));
    }
    check_pin(m, image_name, &built.id)?;
    let v = image::verify(&engine, &built.engine_id, source)?;
    let done = if check {
        "built twice, reproducible, and verified"
    } else {
        "built and verified"
    };
    print_result(ctx, &v, &info, done);
    Ok(exit::SUCCESS)
}

/// Refuses an image whose ID is not the one the manifest pins for it (`id`).
fn check_pin(m: &Manifest, name: &str, id: &ImageId) -> Result<()> {
    check_pin_of(m, name, id, &format!("image `{name}` is {id}"))
}

/// [`check_pin`], with `subject` saying what gave `id` (`REF is image ID`).
fn check_pin_of(m: &Manifest, name: &str, id: &ImageId, subject: &str) -> Result<()> {
    let Some(pin) = m.images.get(name).and_then(|i| i.id.as_deref()) else {
        return Ok(());
    };
    if ImageId::parse(pin.trim()).ok().as_ref() == Some(id) {
        return Ok(());
    }
    Err(Error::Image(ImageError::Refused {
        message: format!(
            "{subject}, but the id of image `{name}` in {} pins {}",
            m.path.display(),
            pin.trim()
        ),
        details: vec![
            "the same lock files gave another image: find what differs with `cibox image build --check`".into(),
            format!("or, if the change is meant, pin the new ID: id: \"{id}\""),
        ],
    }))
}

/// A tag keeps the image from being "dangling" (and so from `docker image prune`);
/// cibox itself never selects images by it.
fn tag_for(m: &Manifest, source: &Lockset) -> String {
    format!("cibox/{}:lockset-{}", m.project, &source.digest[7..19])
}

fn build_nix(
    ctx: &Context,
    m: &Manifest,
    image_name: &str,
    attr: &str,
    source: &Lockset,
) -> Result<u8> {
    let nix = crate::util::which("nix").ok_or_else(|| {
        Error::Infra(format!(
            "image.nix ({attr}) needs Nix, and `nix` is not on PATH: install Nix with flakes enabled, or build with image.dockerfile"
        ))
    })?;
    report::info(format!("nix build {attr}"));
    let out = std::process::Command::new(&nix)
        .args(["build", "--no-link", "--print-out-paths", attr])
        .current_dir(&m.dir)
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| Error::Infra(format!("cannot run {}: {e}", nix.display())))?;
    if !out.status.success() {
        return Err(Error::Infra(format!(
            "`nix build {attr}` failed ({})",
            out.status
        )));
    }
    let path = String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .unwrap_or_default()
        .trim()
        .to_string();
    if path.is_empty() {
        return Err(Error::Infra(format!(
            "`nix build {attr}` printed no output path"
        )));
    }
    let path = PathBuf::from(path);
    let engine = Engine::connect()?;
    let info = engine.info()?;
    describe_engine(&info);
    let loaded = if crate::util::is_executable_file(&path) {
        // streamLayeredImage: a script that writes the archive to stdout.
        let mut child = std::process::Command::new(&path)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .map_err(|e| Error::Infra(format!("cannot run {}: {e}", path.display())))?;
        let stdout = child.stdout.take().expect("piped");
        let loaded = engine.load(Box::new(stdout));
        if loaded.is_err() {
            let _ = child.kill();
        }
        let status = child
            .wait()
            .map_err(|e| Error::Infra(format!("{}: {e}", path.display())))?;
        let loaded = loaded?;
        if !status.success() {
            return Err(Error::Infra(format!(
                "{} failed ({status})",
                path.display()
            )));
        }
        loaded
    } else {
        let f = std::fs::File::open(&path)
            .map_err(|e| Error::Infra(format!("cannot open {}: {e}", path.display())))?;
        engine.load(Box::new(f))?
    };
    let ids = loaded_ids(&engine, loaded)?;
    finish_loaded(
        ctx,
        &engine,
        &info,
        ids,
        Some(source),
        Some((m, image_name)),
    )
}

/// `cibox image save ID --to FILE`.
pub fn save(ctx: &Context, id: &str, to: &Path) -> Result<u8> {
    let id = ImageId::parse(id).map_err(Error::refused)?;
    let engine = Engine::connect()?;
    if engine.inspect(id.as_str())?.is_none() {
        return Err(Error::refused(format!(
            "{id} is not present in the local engine"
        )));
    }
    let bytes = engine.save(id.as_str(), to)?;
    if ctx.json {
        report::json(&json!({"image": id, "file": to, "bytes": bytes}));
    } else {
        println!("saved {id} to {} ({bytes} bytes)", to.display());
    }
    Ok(exit::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_base_images() {
        let df = "FROM --platform=linux/amd64 sha256:abc AS build\nRUN x\nfrom build\nFROM scratch\nCOPY --from=build / /\nCOPY --from=0 /a /a\nCOPY --from=alpine:3.19 /b /b\n";
        assert_eq!(
            dockerfile_bases(df),
            ["sha256:abc", "scratch", "alpine:3.19"]
        );
    }
}
