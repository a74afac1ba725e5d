//! `cibox image …`: lockset, verify, load, id, fetch, build, save. Each turns the
//! manifest and its flags into a call of the image library ([`crate::image`]; `image
//! build` into one [`recipe::BuildRequest`]) and prints what comes back.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use serde_json::json;

use super::context::Context;
use crate::console;
use crate::engine::{Engine, EngineInfo};
use crate::error::{ErrorKind, Result};
use crate::exit::{self, Failure};
use crate::image::recipe::{BuildRequest, Recipe};
use crate::image::{self, ImageId, PinnedRef, Verified};
use crate::run::launch::Whereabouts;

/// What `image` commands refuse: all usage errors.
#[derive(Debug, thiserror::Error)]
pub enum ImageCommandError {
    /// `command` (`image load`, `image id`) would read an archive from a terminal.
    #[error(
        "`{command}` reads the archive from standard input, which is a terminal; pass --from FILE or pipe an archive in"
    )]
    StdinIsTerminal { command: &'static str },
    /// `image load --from FILE`: the file cannot be opened.
    #[error("cannot open {from}: {source}")]
    CannotOpen {
        from: String,
        #[source]
        source: std::io::Error,
    },
    /// `image id --from FILE`: the file cannot be opened (or is not a plain file).
    #[error("--from {from}: {source}")]
    FromUnreadable {
        from: String,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "no image reference: pass REPOSITORY@sha256:… or set the `ref` of image `{name}` in {}",
        .manifest.display()
    )]
    NoReference { name: String, manifest: PathBuf },
    #[error(
        "{}: image `{name}` has no recipe; set its dockerfile or nix",
        .manifest.display()
    )]
    NoRecipe { manifest: PathBuf, name: String },
    #[error(
        "--secret: image `{name}` is a Nix recipe, which takes its inputs from the flake; secrets are for a Dockerfile's RUN --mount=type=secret"
    )]
    SecretsForNix { name: String },
    #[error("--to {to}: {why}")]
    BadRepository { to: String, why: String },
}

impl ErrorKind for ImageCommandError {
    fn failure(&self) -> Failure {
        Failure::Usage
    }
}

/// `cibox image lockset`: the canonical text, then `digest: sha256:…`.
pub fn lockset(ctx: &Context, name: Option<&str>) -> Result<u8> {
    let m = ctx.manifest()?;
    let (image_name, _) = m.image_named(name)?;
    let l = m.lockset(image_name)?;
    if ctx.json {
        let files: Vec<_> = l
            .files
            .iter()
            .map(|f| json!({"path": f.path, "sha256": f.sha256}))
            .collect();
        console::json(&json!({"files": files, "text": l.text, "digest": l.digest}));
    } else {
        // The lock files' names are the checkout's.
        print!("{}", crate::util::escape_lines(&l.text));
        println!("digest: {}", l.digest);
    }
    Ok(exit::SUCCESS)
}

fn print_verified(ctx: &Context, v: &Verified, info: &EngineInfo) {
    match ctx.json {
        true => console::json(&v.to_json(info)),
        false => println!("{}", v.said()),
    }
}

/// The ID of a loaded or built image on stdout (for scripts) and what was verified on
/// stderr; or, with `--json`, the verification.
fn print_result(ctx: &Context, v: &Verified, info: &EngineInfo, done: &str) {
    if ctx.json {
        console::json(&v.to_json(info));
    } else {
        println!("{}", v.id);
        console::info(v.said_as(done));
    }
}

/// `cibox image verify [ID]`.
pub fn verify(ctx: &Context, flag: Option<String>, name: Option<&str>) -> Result<u8> {
    // A malformed ID given explicitly is refused before anything else is read.
    let explicit = flag.is_some() || std::env::var("CIBOX_IMAGE").is_ok_and(|s| !s.is_empty());
    if explicit {
        crate::manifest::chosen_id(flag.clone(), None)?;
    }
    let m = ctx.manifest()?;
    let img = m.image_named(name)?;
    let (id, from) = crate::manifest::chosen_id(flag, Some(img))?;
    console::debug(format!("image {id} (from {from})"));
    let source = m.lockset(img.0)?;
    let engine = Engine::connect()?;
    let info = engine.info()?;
    image::progress::describe_engine(&info);
    let v = image::verify(&engine, &id, &source)?;
    print_verified(ctx, &v, &info);
    Ok(exit::SUCCESS)
}

/// `cibox image load [--from FILE|-]`.
pub fn load(ctx: &Context, from: &str, verify: bool, name: Option<&str>) -> Result<u8> {
    // Read the manifest first: a bad manifest must stop us before the engine changes.
    // `--no-verify` skips the lockset only: an ID the manifest pins still holds (there
    // is none to hold to without a manifest, unless a name was asked for).
    let manifest = match ctx.manifest() {
        Ok(m) => Some(m),
        Err(e) if super::context::no_manifest(&e) && !verify && name.is_none() => None,
        Err(e) => return Err(e),
    };
    let (manifest, source) = match manifest {
        Some(m) => {
            let (n, _) = m.image_named(name)?;
            let source = if verify { Some(m.lockset(n)?) } else { None };
            let n = n.to_string();
            (Some((m, n)), source)
        }
        None => (None, None),
    };
    if from == "-" && std::io::stdin().is_terminal() {
        return Err(ImageCommandError::StdinIsTerminal {
            command: "image load",
        }
        .into());
    }
    let file = if from == "-" {
        None
    } else {
        Some(
            std::fs::File::open(from).map_err(|source| ImageCommandError::CannotOpen {
                from: from.to_string(),
                source,
            })?,
        )
    };
    let engine = Engine::connect()?;
    let info = engine.info()?;
    image::progress::describe_engine(&info);
    let loaded = match file {
        Some(f) => engine.load(Box::new(f))?,
        None => engine.load(Box::new(std::io::stdin()))?,
    };
    let ids = image::load::loaded_ids(&engine, loaded)?;
    // Unverified, the IDs alone (stdout, one per line, for scripts), once held to the pin.
    let (Some((m, name)), Some(source)) = (&manifest, &source) else {
        if let Some((m, name)) = &manifest {
            for id in &ids {
                m.pin(name).check(id)?;
            }
        }
        if ctx.json {
            console::json(&json!({"images": ids, "verified": false}));
        } else {
            for id in &ids {
                println!("{id}");
            }
        }
        return Ok(exit::SUCCESS);
    };
    let verified = image::load::verify_loaded(&engine, &ids, source, &m.pin(name), &mut |id| {
        console::info(format!("loaded {id}"))
    })?;
    for v in &verified {
        // Named as `image build` names it: a loaded archive may carry no name (`image
        // save` of an ID), and an unnamed image is the first an engine prunes.
        image::load::name_verified(&engine, &m.project, &source.digest, &v.id)?;
        print_result(ctx, v, &info, "verified");
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
        Err(e) if super::context::no_manifest(&e) && name.is_none() => None,
        Err(e) => return Err(e),
    };
    let pin = match &manifest {
        Some(m) => {
            let (n, _) = m.image_named(name)?;
            Some((m, n.to_string()))
        }
        None => None,
    };
    let shown = if from == "-" { "standard input" } else { from };
    let found = if from == "-" {
        if std::io::stdin().is_terminal() {
            return Err(ImageCommandError::StdinIsTerminal {
                command: "image id",
            }
            .into());
        }
        image::archive::read_image(std::io::stdin().lock(), shown)?
    } else {
        let (file, _) = crate::util::open_plain(Path::new(from), true).map_err(|source| {
            ImageCommandError::FromUnreadable {
                from: from.to_string(),
                source,
            }
        })?;
        image::archive::read_image(std::io::BufReader::new(file), shown)?
    };
    if let Some((m, n)) = &pin {
        m.pin(n).check(&found.id)?;
    }
    let pinned = pin.as_ref().and_then(|(m, n)| m.images[n].id.clone());
    if ctx.json {
        console::json(&found.to_json(pinned.as_deref()));
    } else {
        println!("{}", found.id);
        console::info(found.which_store());
        if let Some((_, n)) = pin.as_ref().filter(|_| pinned.is_some()) {
            console::info(format!("it is the ID image `{n}` pins"));
        }
    }
    Ok(exit::SUCCESS)
}

/// `cibox image fetch [REF]`: pulls an image pinned by digest, then verifies it like a
/// loaded one: its lockset labels against the source's, and its ID against `image.id`
/// when the manifest pins one.
pub fn fetch(ctx: &Context, reference: Option<String>, name: Option<&str>) -> Result<u8> {
    if let Some(r) = &reference {
        PinnedRef::parse(r)?;
    }
    let m = ctx.manifest()?;
    let (name, img) = m.image_named(name)?;
    let Some(text) = reference.or_else(|| img.reference.clone()) else {
        return Err(ImageCommandError::NoReference {
            name: name.to_string(),
            manifest: m.path.clone(),
        }
        .into());
    };
    let pinned = PinnedRef::parse(&text)?;
    let source = m.lockset(name)?;
    let engine = Engine::connect()?;
    let info = engine.info()?;
    image::progress::describe_engine(&info);
    console::info(format!("pulling {pinned}"));
    engine.pull(&pinned.repository, &pinned.digest)?;
    let found =
        engine
            .inspect(&pinned.to_string())?
            .ok_or_else(|| crate::image::ImageError::Vanished {
                what: format!("pulled {pinned}"),
            })?;
    let id = ImageId::parse(&found.id).map_err(crate::image::ImageError::NotAnId)?;
    m.pin(name)
        .check_as(&id, &format!("{pinned} is image {id}"))?;
    let v = image::verify(&engine, &id, &source)?;
    // A pull by digest leaves no name, and an unnamed image is the first pruned.
    image::load::name_verified(&engine, &m.project, &source.digest, &id)?;
    print_result(ctx, &v, &info, "verified");
    Ok(exit::SUCCESS)
}

/// `cibox image build`: the manifest's Dockerfile or Nix recipe.
pub fn build(ctx: &Context, name: Option<&str>, check: bool, secrets: &[String]) -> Result<u8> {
    let secrets = image::secrets::read(secrets)?;
    let m = ctx.manifest()?;
    let policy = ctx.host_policy()?;
    let (name, img) = m.image_named(name)?;
    let source = m.lockset(name)?;
    let dockerfile = img.dockerfile.as_deref().map(|df| m.resolve(df));
    let recipe = match (&dockerfile, &img.nix) {
        (Some(df), _) => Recipe::Dockerfile(df),
        (None, Some(attr)) => Recipe::Nix(attr),
        (None, None) => {
            return Err(ImageCommandError::NoRecipe {
                manifest: m.path.clone(),
                name: name.to_string(),
            }
            .into());
        }
    };
    if !secrets.is_empty() && dockerfile.is_none() {
        return Err(ImageCommandError::SecretsForNix {
            name: name.to_string(),
        }
        .into());
    }
    let args_path = img.build_args.as_deref().map(|a| m.resolve(a));
    let context_path = img.context.as_deref().map(|c| m.resolve(c));
    // Where its cache mounts live and what its steps get: the host's to say.
    let scope = crate::host::build_scope::decide(&policy, &m.project, &m.dir).map_err(|e| {
        crate::engine::EngineError::Io {
            action: "naming the build's private cache namespace".into(),
            reason: e.to_string(),
        }
    })?;
    let grants = policy.build_grants(scope.trust);
    let not_granted = crate::host::build_scope::not_granted(&policy, &scope);
    let request = BuildRequest {
        name,
        recipe,
        source: &source,
        pin: m.pin(name),
        project: &m.project,
        dir: &m.dir,
        check,
        build_args: args_path.as_deref().zip(img.build_args.as_deref()),
        context: context_path.as_deref().zip(img.context.as_deref()),
        target: img.target.as_deref(),
        secrets: &secrets,
        scope: &scope,
        grants: &grants,
        not_granted: &not_granted,
    };
    let verbose = console::enabled(console::Level::Debug);
    // A large build can be quiet for a while: say that it goes on.
    let ticker = console::Ticker::start(std::time::Duration::from_secs(10));
    let built = crate::image::make::build(&request, &mut |p| {
        image::progress::show(p, verbose, &ticker)
    })?;
    drop(ticker);
    let done = match recipe {
        Recipe::Nix(_) => "verified",
        Recipe::Dockerfile(_) if check => "built twice, reproducible, and verified",
        Recipe::Dockerfile(_) => "built and verified",
    };
    for v in &built.images {
        print_result(ctx, v, &built.engine, done);
    }
    Ok(exit::SUCCESS)
}

/// `cibox image save ID --to FILE`.
pub fn save(ctx: &Context, id: &str, to: &Path) -> Result<u8> {
    let id = ImageId::parse(id).map_err(crate::image::ImageError::NotAnId)?;
    let engine = Engine::connect()?;
    if engine.inspect(id.as_str())?.is_none() {
        return Err(crate::image::ImageError::NotPresent { id }.into());
    }
    let bytes = engine.save(id.as_str(), to)?;
    if ctx.json {
        console::json(&json!({"image": id, "file": to, "bytes": bytes}));
    } else {
        println!("saved {id} to {} ({bytes} bytes)", to.display());
    }
    Ok(exit::SUCCESS)
}

/// `cibox image qualify ID`: run the `qualify` layer on the image and write
/// `qualification.json` only when every batch passed.
pub fn qualify(
    ctx: &Context,
    id: &str,
    reports: PathBuf,
    source: Option<PathBuf>,
    scope: Option<String>,
) -> Result<u8> {
    let image = ImageId::parse(id).map_err(crate::image::ImageError::NotAnId)?;
    let at = Whereabouts {
        source,
        reports: Some(reports),
        scope,
    };
    let q =
        crate::run::qualify::qualify(ctx.manifest()?, &ctx.host_policy()?, &image, at, ctx.json)?;
    if ctx.json {
        console::json(&q.to_json(&image));
    } else {
        match &q.record {
            Some(path) => println!("qualified {image}: {}", path.display()),
            None => console::info(q.not_qualified(&image)),
        }
    }
    Ok(q.exit_code())
}

/// `cibox image push ID --to REPOSITORY`: the image, verified against the source's
/// lockset (and its pin), pushed as `REPOSITORY:id-<hex>`; prints
/// `REPOSITORY@sha256:<digest>`, the value for `image.ref` that `image fetch` takes.
pub fn push(ctx: &Context, id: &str, to: &str, name: Option<&str>) -> Result<u8> {
    let id = ImageId::parse(id).map_err(crate::image::ImageError::NotAnId)?;
    image::pinned::check_repository(to).map_err(|e| ImageCommandError::BadRepository {
        to: to.to_string(),
        why: e.to_string(),
    })?;
    let m = ctx.manifest()?;
    let (name, _) = m.image_named(name)?;
    m.pin(name).check(&id)?;
    let source = m.lockset(name)?;
    let credentials = crate::engine::auth::credentials(&crate::engine::auth::registry_of(to))?;
    let engine = Engine::connect()?;
    let info = engine.info()?;
    image::progress::describe_engine(&info);
    let v = image::verify(&engine, &id, &source)?;
    let digest = image::push::push(&engine, &id, to, &m.project, &source.digest, credentials)?;
    let reference = PinnedRef::parse(&format!("{to}@{digest}"))?;
    if ctx.json {
        console::json(&json!({
            "image": v.id,
            "reference": reference.to_string(),
            "digest": digest,
            "lockset": v.lockset,
        }));
    } else {
        println!("{reference}");
        console::info(format!(
            "pushed {id} (lockset {}); set image.ref to it, and `cibox image fetch` gives back this ID",
            v.lockset
        ));
    }
    Ok(exit::SUCCESS)
}
