//! What cibox reads in a Dockerfile's text, exactly as the engine's BuildKit reads it,
//! or not at all: its instructions ([`parse`], a port of BuildKit's parser held to its
//! own test files), their flags ([`flags`]) and words ([`lex`]); from them its stages
//! and what building one of them takes (images, with the build arguments put in and
//! their platform, secret mounts, networks, remote sources), and the arguments it
//! declares. What BuildKit versions read differently, and a frontend of the
//! Dockerfile's choosing (`# syntax=`), are refused ([`ParseError`]).

pub mod flags;
pub mod lex;
pub mod node;
pub mod parse;
pub mod words;

pub use node::ParseError;
pub use parse::Dialect;

use std::collections::HashMap;

use node::{Node, fail};

/// An image a build takes: a stage's base, or a `--from` source (`COPY --from=`, `RUN
/// --mount=…,from=`) that is not a stage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageUse {
    /// As the Dockerfile writes it.
    pub written: String,
    /// With the build arguments put in, as the builder reads it.
    pub image: String,
    /// The line it is written on.
    pub line: usize,
    /// The platform the builder takes it for (`FROM --platform=`, arguments put in);
    /// `None`: the build's own, this host's.
    pub platform: Option<String>,
}

/// A secret a step mounts (`RUN --mount=type=secret,id=ID`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretUse {
    pub id: String,
    /// `required=true`: the build fails without it.
    pub required: bool,
    pub line: usize,
}

/// What a step asks to reach beyond the build's own network.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reach {
    /// `RUN --network=MODE` (`host`, `none`, `default`).
    Network(String),
    /// `ADD` of a URL or a git repository, which the builder fetches itself.
    Remote(String),
}

/// A source named by a `--from` before it is known to be a stage.
#[derive(Debug, Clone)]
struct FromRef {
    written: String,
    line: usize,
    /// `COPY --from` takes a stage's number too; a mount's `from` names one only by
    /// its name (BuildKit 0.8 looks mount sources up by name).
    by_number: bool,
}

/// Where a stage, or a step's `--from`, takes files from.
#[derive(Debug, Clone)]
enum Source {
    /// An earlier stage, by its index.
    Stage(usize),
    Image(ImageUse),
}

#[derive(Debug, Clone)]
struct Stage {
    /// `AS name`, lower case (the builder compares stage names so).
    name: Option<String>,
    base: Source,
    /// The `--from` sources of its steps, as written.
    from: Vec<FromRef>,
    secrets: Vec<SecretUse>,
    reach: Vec<(Reach, usize)>,
}

/// A Dockerfile as BuildKit reads it with the build's arguments: its stages and
/// the arguments it declares.
#[derive(Debug, Clone)]
pub struct Stages {
    stages: Vec<Stage>,
    args: Vec<(String, usize)>,
}

/// What building a Dockerfile's target takes: the images (each once, in order), the
/// secrets its steps mount and what they reach, of the target and every stage it
/// needs.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Needs {
    pub images: Vec<ImageUse>,
    pub secrets: Vec<SecretUse>,
    pub reach: Vec<(Reach, usize)>,
}

/// Reads a Dockerfile as the engine's BuildKit (`dialect`) reads it, with the build
/// arguments `args`: they and the defaults of the `ARG`s before the first `FROM` (each
/// default read with the ones before it), and BuildKit's platform arguments, name the
/// images, as the builder puts them in.
pub fn stages(
    text: &str,
    args: &HashMap<String, String>,
    dialect: Dialect,
) -> Result<Stages, ParseError> {
    let (nodes, escape) = parse::parse(text, dialect)?;
    let mut reader = Reader {
        vars: platform_args(),
        args,
        stages: Vec::new(),
        declared: Vec::new(),
        escape,
    };
    for node in &nodes {
        reader.node(node)?;
    }
    Ok(Stages {
        stages: reader.stages,
        args: reader.declared,
    })
}

/// The names the Dockerfile's `ARG`s declare, each once, in order, without reading
/// anything else of it (the build arguments are checked against them before they are
/// put in).
pub fn declared_args(text: &str, dialect: Dialect) -> Result<Vec<String>, ParseError> {
    let (nodes, _) = parse::parse(text, dialect)?;
    let mut names: Vec<String> = Vec::new();
    for node in nodes.iter().filter(|n| n.command() == "ARG") {
        for w in node.args.items() {
            let name = w.split('=').next().unwrap_or(w).to_string();
            if !names.contains(&name) {
                names.push(name);
            }
        }
    }
    Ok(names)
}

/// The instructions BuildKit knows; it refuses any other.
const INSTRUCTIONS: [&str; 18] = [
    "ADD",
    "ARG",
    "CMD",
    "COPY",
    "ENTRYPOINT",
    "ENV",
    "EXPOSE",
    "FROM",
    "HEALTHCHECK",
    "LABEL",
    "MAINTAINER",
    "ONBUILD",
    "RUN",
    "SHELL",
    "STOPSIGNAL",
    "USER",
    "VOLUME",
    "WORKDIR",
];

/// Reads the instructions one by one.
struct Reader<'a> {
    /// The arguments before the first `FROM`, with BuildKit's platform arguments.
    vars: HashMap<String, String>,
    args: &'a HashMap<String, String>,
    stages: Vec<Stage>,
    declared: Vec<(String, usize)>,
    escape: char,
}

impl Reader<'_> {
    fn node(&mut self, node: &Node) -> Result<(), ParseError> {
        let command = node.command();
        if !INSTRUCTIONS.contains(&command.as_str()) {
            return Err(fail(node.line, format!("unknown instruction: {command}")));
        }
        let flags = flags::parse(&command, &node.flags)
            .map_err(|why| fail(node.line, format!("{command}: {why}")))?;
        match command.as_str() {
            "ARG" => self.arg(node),
            "FROM" => self.from(node, &flags),
            "COPY" | "ADD" => {
                let Some(stage) = self.stages.last_mut() else {
                    return Err(fail(node.line, format!("{command} before the first FROM")));
                };
                if let Some(src) = flags.get("from") {
                    plain_from(src, node.line)?;
                    stage.from.push(FromRef {
                        written: src.to_string(),
                        line: node.line,
                        by_number: true,
                    });
                }
                if command == "ADD" {
                    let items = node.args.items();
                    for src in items.iter().take(items.len().saturating_sub(1)) {
                        if is_remote(src) {
                            stage.reach.push((Reach::Remote(src.clone()), node.line));
                        }
                    }
                }
                Ok(())
            }
            "RUN" => self.run(node, &flags),
            _ => Ok(()),
        }
    }

    fn arg(&mut self, node: &Node) -> Result<(), ParseError> {
        for w in node.args.items() {
            let (name, default) = match w.split_once('=') {
                Some((n, d)) => (n, Some(d)),
                None => (w.as_str(), None),
            };
            if name.is_empty() {
                return Err(fail(node.line, format!("ARG: `{w}` names no argument")));
            }
            if name.starts_with("BUILDKIT_") {
                return Err(fail(
                    node.line,
                    format!(
                        "ARG {name}: BUILDKIT_* arguments are options of the builder's frontend (which frontend, where caches live), for cibox alone to set"
                    ),
                ));
            }
            self.declared.push((name.to_string(), node.line));
            if !self.stages.is_empty() {
                continue;
            }
            if let Some(given) = self.args.get(name) {
                self.vars.insert(name.to_string(), given.clone());
            } else if let Some(default) = default {
                let value = lex::process_word(default, &self.vars, self.escape)
                    .map_err(|why| fail(node.line, format!("ARG {name}: {why}")))?;
                self.vars.insert(name.to_string(), value);
            } else if self.vars.contains_key(name) {
                // BuildKit 0.8 sets it empty again, later versions keep its value.
                return Err(fail(
                    node.line,
                    format!(
                        "ARG {name} before the first FROM declares again, without a value, an argument that has one (a platform argument, or an earlier ARG): BuildKit 0.8 empties it, later versions keep it; give it a default or drop the line"
                    ),
                ));
            } else {
                // Declared without a value: empty to every BuildKit.
                self.vars.insert(name.to_string(), String::new());
            }
        }
        Ok(())
    }

    fn from(&mut self, node: &Node, flags: &flags::Flags) -> Result<(), ParseError> {
        let words = node.args.items();
        let named = words.len() == 3 && words[1].eq_ignore_ascii_case("AS");
        if words.len() != 1 && !named {
            return Err(fail(
                node.line,
                "FROM requires either one or three arguments (IMAGE, or IMAGE AS NAME)",
            ));
        }
        let written = &words[0];
        let word = |w: &str, what: &str| {
            lex::process_word(w, &self.vars, self.escape)
                .map_err(|why| fail(node.line, format!("FROM {what} `{w}`: {why}")))
        };
        let image = word(written, "image")?;
        if image.is_empty() {
            return Err(fail(
                node.line,
                format!("base name ({written}) should not be blank"),
            ));
        }
        let platform = flags
            .get("platform")
            .map(|p| word(p, "platform"))
            .transpose()?;
        let name = named.then(|| words[2].to_ascii_lowercase());
        if let Some(n) = &name {
            let valid = n.starts_with(|c: char| c.is_ascii_lowercase())
                && n.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "-_.".contains(c));
            if !valid {
                return Err(fail(
                    node.line,
                    format!("invalid name for build stage: `{n}`"),
                ));
            }
            if self.stages.iter().any(|s| s.name.as_ref() == Some(n)) {
                return Err(fail(node.line, format!("duplicate stage name `{n}`")));
            }
        }
        let lower = image.to_ascii_lowercase();
        let base = match self
            .stages
            .iter()
            .position(|s| s.name.as_deref() == Some(lower.as_str()))
        {
            Some(i) => Source::Stage(i),
            None => Source::Image(ImageUse {
                written: written.clone(),
                image,
                line: node.line,
                platform,
            }),
        };
        self.stages.push(Stage {
            name,
            base,
            from: Vec::new(),
            secrets: Vec::new(),
            reach: Vec::new(),
        });
        Ok(())
    }

    fn run(&mut self, node: &Node, flags: &flags::Flags) -> Result<(), ParseError> {
        let Some(stage) = self.stages.last_mut() else {
            return Err(fail(node.line, "RUN before the first FROM"));
        };
        let line = node.line;
        if let Some(sec) = flags.get("security")
            && sec != "sandbox"
        {
            return Err(fail(
                line,
                format!(
                    "RUN --security={sec}: cibox never grants a build step more than the sandbox"
                ),
            ));
        }
        if flags.get("device").is_some() {
            return Err(fail(
                line,
                "RUN --device: cibox grants no device to a build step",
            ));
        }
        if let Some(net) = flags.get("network") {
            if !["default", "none", "host"].contains(&net) {
                return Err(fail(
                    line,
                    format!("RUN --network={net}: the network is default, none or host"),
                ));
            }
            if net != "default" {
                stage.reach.push((Reach::Network(net.to_string()), line));
            }
        }
        for spec in flags.all("mount") {
            let m = flags::mount(spec)
                .map_err(|why| fail(line, format!("RUN --mount={spec}: {why}")))?;
            if m.kind() == "secret" {
                let id = m
                    .get("id")
                    .or_else(|| m.target().and_then(|t| t.rsplit('/').next()))
                    .filter(|id| !id.is_empty())
                    .ok_or_else(|| {
                        fail(
                            line,
                            format!("RUN --mount={spec}: a secret mount names no id nor target"),
                        )
                    })?;
                let required = match m.get("required") {
                    None => false,
                    Some(v) => parse_bool(v).ok_or_else(|| {
                        fail(
                            line,
                            format!("RUN --mount={spec}: required={v} is not true or false"),
                        )
                    })?,
                };
                stage.secrets.push(SecretUse {
                    id: id.to_string(),
                    required,
                    line,
                });
            } else if let Some(src) = m.get("from") {
                stage.from.push(FromRef {
                    written: src.to_string(),
                    line,
                    by_number: false,
                });
            }
        }
        Ok(())
    }
}

/// Go's `strconv.ParseBool`.
fn parse_bool(v: &str) -> Option<bool> {
    match v {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// A `--from` that names what it names plainly: BuildKit versions differ on whether
/// variables are put in.
fn plain_from(src: &str, line: usize) -> Result<(), ParseError> {
    if src.contains('$') {
        return Err(fail(
            line,
            format!(
                "--from={src}: BuildKit versions differ on variables in --from (older ones take it as written, newer refuse it); name the stage or image plainly"
            ),
        ));
    }
    Ok(())
}

/// Whether an `ADD` source is fetched by the builder (a URL or a git repository).
fn is_remote(src: &str) -> bool {
    let lower = src.to_ascii_lowercase();
    lower.contains("://") || lower.starts_with("git@")
}

impl Stages {
    /// The stages' names (`AS name`), in order.
    pub fn names(&self) -> Vec<String> {
        self.stages.iter().filter_map(|s| s.name.clone()).collect()
    }

    /// Each `ARG` the Dockerfile declares, with its line, in order.
    pub fn arg_lines(&self) -> &[(String, usize)] {
        &self.args
    }

    /// The names the Dockerfile declares with `ARG`, each once.
    #[cfg(test)]
    pub fn declared_args(&self) -> Vec<String> {
        let mut names: Vec<String> = Vec::new();
        for (name, _) in &self.args {
            if !names.contains(name) {
                names.push(name.clone());
            }
        }
        names
    }

    /// A `--from` source: a stage by name (any, as BuildKit looks them up once all are
    /// read) or number, else an image.
    fn resolve(&self, f: &FromRef) -> Source {
        let lower = f.written.to_ascii_lowercase();
        if let Some(i) = self
            .stages
            .iter()
            .position(|s| s.name.as_deref() == Some(lower.as_str()))
        {
            return Source::Stage(i);
        }
        if f.by_number
            && let Ok(i) = f.written.parse::<usize>()
            && i < self.stages.len()
        {
            return Source::Stage(i);
        }
        Source::Image(ImageUse {
            written: f.written.clone(),
            image: f.written.clone(),
            line: f.line,
            platform: None,
        })
    }

    /// What building `target` (a stage's name; the last stage when `None`) takes:
    /// that stage and every stage it needs, as the builder builds no other (BuildKit).
    /// `Err` says that no stage has that name.
    pub fn needs(&self, target: Option<&str>) -> Result<Needs, String> {
        let Some(last) = self.stages.len().checked_sub(1) else {
            return Ok(Needs::default());
        };
        let start = match target {
            None => last,
            Some(t) => self
                .stages
                .iter()
                .position(|s| s.name.as_deref() == Some(t.to_ascii_lowercase().as_str()))
                .ok_or_else(|| {
                    let names = self.names();
                    format!(
                        "the Dockerfile has no stage named `{t}` ({})",
                        if names.is_empty() {
                            "it names none: write `FROM … AS NAME`".to_string()
                        } else {
                            format!("its stages: {}", names.join(", "))
                        }
                    )
                })?,
        };
        let mut seen = vec![false; self.stages.len()];
        let mut todo = vec![start];
        while let Some(i) = todo.pop() {
            if std::mem::replace(&mut seen[i], true) {
                continue;
            }
            for s in self.sources(i) {
                if let Source::Stage(j) = s {
                    todo.push(j);
                }
            }
        }
        let mut needs = Needs::default();
        for (i, stage) in self.stages.iter().enumerate().filter(|(i, _)| seen[*i]) {
            for s in self.sources(i) {
                if let Source::Image(use_) = s
                    && !needs
                        .images
                        .iter()
                        .any(|u| u.image == use_.image && u.platform == use_.platform)
                {
                    needs.images.push(use_);
                }
            }
            needs.secrets.extend(stage.secrets.iter().cloned());
            needs.reach.extend(stage.reach.iter().cloned());
        }
        Ok(needs)
    }

    /// Stage `i`'s base and `--from` sources.
    fn sources(&self, i: usize) -> Vec<Source> {
        let stage = &self.stages[i];
        std::iter::once(stage.base.clone())
            .chain(stage.from.iter().map(|f| self.resolve(f)))
            .collect()
    }
}

/// BuildKit's platform arguments: it sets them itself, and a build argument of the same
/// name would override them (BuildKit 0.8), so none may be given.
pub const PLATFORM_ARGS: [&str; 8] = [
    "TARGETPLATFORM",
    "TARGETOS",
    "TARGETARCH",
    "TARGETVARIANT",
    "BUILDPLATFORM",
    "BUILDOS",
    "BUILDARCH",
    "BUILDVARIANT",
];

/// BuildKit's platform arguments, which a `FROM` may use undeclared, for this host.
fn platform_args() -> std::collections::HashMap<String, String> {
    let arch = host_arch();
    let platform = format!("linux/{arch}");
    [
        ("TARGETPLATFORM", platform.as_str()),
        ("BUILDPLATFORM", &platform),
        ("TARGETOS", "linux"),
        ("BUILDOS", "linux"),
        ("TARGETARCH", arch),
        ("BUILDARCH", arch),
        ("TARGETVARIANT", ""),
        ("BUILDVARIANT", ""),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// A platform (`os/arch[/variant]`, or one of them) as containerd reads it: lower
/// case, with the architectures' other names made one, `arm64`'s `v8` dropped.
pub fn normalise_platform(text: &str) -> (String, String, String) {
    let host = host_arch();
    let lower = text.trim().to_ascii_lowercase();
    let parts: Vec<&str> = if lower.is_empty() {
        Vec::new()
    } else {
        lower.split('/').collect()
    };
    let (os, arch, variant) = match parts.as_slice() {
        [one] if ["linux", "windows", "darwin", "freebsd"].contains(one) => (*one, host, ""),
        [one] => ("linux", *one, ""),
        [os, arch] => (*os, *arch, ""),
        [os, arch, variant, ..] => (*os, *arch, *variant),
        [] => ("linux", host, ""),
    };
    let arch = match arch {
        "x86_64" | "x86-64" => "amd64",
        "aarch64" => "arm64",
        "i386" | "i486" | "i586" | "i686" => "386",
        other => other,
    };
    let variant = match (arch, variant) {
        ("arm64", "v8" | "8") => "",
        (_, v) => v,
    };
    (os.to_string(), arch.to_string(), variant.to_string())
}

/// This host's architecture, as Go names it.
fn host_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "powerpc64" => "ppc64le",
        other => other,
    }
}

/// Docker's predefined proxy arguments: given to a build without an `ARG`, and kept out
/// of the image's history unless the Dockerfile declares them.
pub const PROXY_ARGS: [&str; 10] = [
    "HTTP_PROXY",
    "http_proxy",
    "HTTPS_PROXY",
    "https_proxy",
    "FTP_PROXY",
    "ftp_proxy",
    "NO_PROXY",
    "no_proxy",
    "ALL_PROXY",
    "all_proxy",
];

/// Whether `name` is one of Docker's predefined proxy arguments ([`PROXY_ARGS`]).
pub fn is_proxy_arg(name: &str) -> bool {
    PROXY_ARGS.contains(&name)
}

#[cfg(test)]
mod tests;
