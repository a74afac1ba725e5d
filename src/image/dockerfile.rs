//! What cibox reads in a Dockerfile's text, as the builder reads it: its instructions
//! (continuations joined, comments and parser directives dropped), its stages and what
//! building one of them takes (images, with the build arguments put in, and secret
//! mounts), and the arguments it declares.

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
}

/// A secret a step mounts (`RUN --mount=type=secret,id=ID`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretUse {
    pub id: String,
    /// `required=true`: the build fails without it.
    pub required: bool,
    pub line: usize,
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
    /// The `--from` sources of its steps.
    from: Vec<Source>,
    secrets: Vec<SecretUse>,
}

/// A Dockerfile's stages, read with the build's arguments: what each one takes.
#[derive(Debug, Clone)]
pub struct Stages {
    stages: Vec<Stage>,
}

/// What building a Dockerfile's target takes: the images (each once, in order) and
/// the secrets its steps mount, of the target and every stage it needs.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Needs {
    pub images: Vec<ImageUse>,
    pub secrets: Vec<SecretUse>,
}

/// Reads a Dockerfile's stages. `args` are the build arguments given: they and the
/// defaults of the `ARG`s before the first `FROM` (each default read with the ones
/// before it), and BuildKit's platform arguments, name the images, as the builder puts
/// them in. A Dockerfile without a `FROM` has no stages.
pub fn stages(text: &str, args: &std::collections::HashMap<String, String>) -> Stages {
    let mut vars: std::collections::HashMap<String, String> = platform_args();
    let mut stages: Vec<Stage> = Vec::new();
    for ins in instructions(text) {
        let words = shell_words(&ins.text);
        let Some(keyword) = words.first() else {
            continue;
        };
        let keyword = keyword.to_ascii_uppercase();
        match keyword.as_str() {
            "ARG" if stages.is_empty() => {
                for w in &words[1..] {
                    let (name, default) = match w.split_once('=') {
                        Some((n, d)) => (n, Some(unquote(d))),
                        None => (w.as_str(), None),
                    };
                    if let Some(given) = args.get(name) {
                        vars.insert(name.to_string(), given.clone());
                    } else if let Some(default) = default {
                        let value = expand(&default, &vars);
                        vars.insert(name.to_string(), value);
                    }
                }
            }
            "FROM" => {
                let rest: Vec<&String> =
                    words[1..].iter().filter(|w| !w.starts_with("--")).collect();
                let Some(written) = rest.first() else {
                    continue;
                };
                let image = expand(written, &vars);
                let base = source(&stages, written, &image, ins.line, false);
                let name = (rest.len() >= 3 && rest[1].eq_ignore_ascii_case("AS"))
                    .then(|| rest[2].to_ascii_lowercase());
                stages.push(Stage {
                    name,
                    base,
                    from: Vec::new(),
                    secrets: Vec::new(),
                });
            }
            "COPY" | "ADD" => {
                let Some(stage) = stages.len().checked_sub(1) else {
                    continue;
                };
                for w in words[1..].iter().take_while(|w| w.starts_with("--")) {
                    if let Some(src) = w.strip_prefix("--from=") {
                        let image = expand(src, &vars);
                        let from = source(&stages[..stage], src, &image, ins.line, true);
                        stages[stage].from.push(from);
                    }
                }
            }
            "RUN" => {
                let Some(stage) = stages.len().checked_sub(1) else {
                    continue;
                };
                for w in words[1..].iter().take_while(|w| w.starts_with("--")) {
                    let Some(spec) = w.strip_prefix("--mount=") else {
                        continue;
                    };
                    let mount = mount_options(&unquote(spec));
                    let kind = mount.get("type").map_or("bind", String::as_str);
                    if kind == "secret" {
                        let target = ["target", "dst", "destination"]
                            .iter()
                            .find_map(|k| mount.get(*k));
                        let id = mount.get("id").cloned().or_else(|| {
                            target.and_then(|t| t.rsplit('/').next().map(str::to_string))
                        });
                        if let Some(id) = id {
                            stages[stage].secrets.push(SecretUse {
                                id,
                                required: mount
                                    .get("required")
                                    .is_some_and(|v| v.is_empty() || v == "true"),
                                line: ins.line,
                            });
                        }
                    } else if let Some(src) = mount.get("from") {
                        let image = expand(src, &vars);
                        let from = source(&stages[..stage], src, &image, ins.line, true);
                        stages[stage].from.push(from);
                    }
                }
            }
            _ => {}
        }
    }
    Stages { stages }
}

impl Stages {
    /// The stages' names (`AS name`), in order.
    pub fn names(&self) -> Vec<String> {
        self.stages.iter().filter_map(|s| s.name.clone()).collect()
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
            let stage = &self.stages[i];
            for s in std::iter::once(&stage.base).chain(&stage.from) {
                if let Source::Stage(j) = s {
                    todo.push(*j);
                }
            }
        }
        let mut needs = Needs::default();
        for (stage, _) in self.stages.iter().zip(&seen).filter(|(_, s)| **s) {
            for s in std::iter::once(&stage.base).chain(&stage.from) {
                if let Source::Image(use_) = s
                    && !needs.images.iter().any(|u| u.image == use_.image)
                {
                    needs.images.push(use_.clone());
                }
            }
            needs.secrets.extend(stage.secrets.iter().cloned());
        }
        Ok(needs)
    }
}

/// An earlier stage named `image` (by name, or by number where `by_number`), or else
/// the image.
fn source(earlier: &[Stage], written: &str, image: &str, line: usize, by_number: bool) -> Source {
    let lower = image.to_ascii_lowercase();
    if let Some(i) = earlier
        .iter()
        .position(|s| s.name.as_deref() == Some(lower.as_str()))
    {
        return Source::Stage(i);
    }
    if by_number
        && let Ok(i) = image.parse::<usize>()
        && i < earlier.len()
    {
        return Source::Stage(i);
    }
    Source::Image(ImageUse {
        written: written.to_string(),
        image: image.to_string(),
        line,
    })
}

/// BuildKit's platform arguments, which a `FROM` may use undeclared, for this host.
fn platform_args() -> std::collections::HashMap<String, String> {
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "powerpc64" => "ppc64le",
        other => other,
    };
    let platform = format!("linux/{arch}");
    [
        ("TARGETPLATFORM", platform.as_str()),
        ("BUILDPLATFORM", &platform),
        ("TARGETOS", "linux"),
        ("BUILDOS", "linux"),
        ("TARGETARCH", arch),
        ("BUILDARCH", arch),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// `k=v,k=v` (a `--mount` flag's value); a key alone has an empty value.
fn mount_options(spec: &str) -> std::collections::HashMap<String, String> {
    spec.split(',')
        .filter(|kv| !kv.is_empty())
        .map(|kv| match kv.split_once('=') {
            Some((k, v)) => (k.trim().to_ascii_lowercase(), v.trim().to_string()),
            None => (kv.trim().to_ascii_lowercase(), String::new()),
        })
        .collect()
}

/// An instruction's words: split at white space outside quotes, the quotes kept.
fn shell_words(text: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut quote: Option<char> = None;
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        match (quote, c) {
            (None, c) if c.is_whitespace() => {
                if !word.is_empty() {
                    words.push(std::mem::take(&mut word));
                }
            }
            (None, '"' | '\'') => {
                quote = Some(c);
                word.push(c);
            }
            (Some(q), c) if c == q => {
                quote = None;
                word.push(c);
            }
            (_, '\\') => {
                word.push(c);
                word.extend(chars.next());
            }
            (_, c) => word.push(c),
        }
    }
    if !word.is_empty() {
        words.push(word);
    }
    words
}

/// A value without the quotes around it.
fn unquote(value: &str) -> String {
    for q in ['"', '\''] {
        if value.len() >= 2 && value.starts_with(q) && value.ends_with(q) {
            return value[1..value.len() - 1].to_string();
        }
    }
    value.to_string()
}

/// Puts variables into `word` as the builder does: `$NAME`, `${NAME}`, and
/// `${NAME:-word}`, `${NAME-word}` (a default), `${NAME:+word}`, `${NAME+word}` (an
/// alternative); an unset variable is empty; `\$` is a `$`.
pub fn expand(word: &str, vars: &std::collections::HashMap<String, String>) -> String {
    let mut out = String::new();
    let mut chars = word.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\\' && chars.peek() == Some(&'$') {
            out.push('$');
            chars.next();
            continue;
        }
        if c != '$' {
            out.push(c);
            continue;
        }
        if chars.peek() == Some(&'{') {
            chars.next();
            let mut inner = String::new();
            let mut depth = 1;
            for c in chars.by_ref() {
                match c {
                    '{' => depth += 1,
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    _ => {}
                }
                inner.push(c);
            }
            let end = inner
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(inner.len());
            let (name, op) = inner.split_at(end);
            let value = vars.get(name);
            let set = value.is_some();
            let non_empty = value.is_some_and(|v| !v.is_empty());
            let got = if let Some(w) = op.strip_prefix(":-") {
                if non_empty {
                    value.cloned()
                } else {
                    Some(expand(w, vars))
                }
            } else if let Some(w) = op.strip_prefix(":+") {
                non_empty.then(|| expand(w, vars))
            } else if let Some(w) = op.strip_prefix('-') {
                if set {
                    value.cloned()
                } else {
                    Some(expand(w, vars))
                }
            } else if let Some(w) = op.strip_prefix('+') {
                set.then(|| expand(w, vars))
            } else {
                value.cloned()
            };
            out.push_str(&got.unwrap_or_default());
            continue;
        }
        let mut name = String::new();
        while let Some(&c) = chars.peek() {
            if c.is_ascii_alphanumeric() || c == '_' {
                name.push(c);
                chars.next();
            } else {
                break;
            }
        }
        if name.is_empty() {
            out.push('$');
        } else if let Some(v) = vars.get(&name) {
            out.push_str(v);
        }
    }
    out
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

/// One instruction of a Dockerfile: its text (continuations joined) and the line it
/// starts on (1-based), for messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instruction {
    pub line: usize,
    pub text: String,
}

/// The Dockerfile's instructions, as the builder reads them, each with the line it
/// starts on: a line that ends with the escape character (`\\`, or what an `# escape=`
/// parser directive at the top sets) goes on in the next, and comment and blank lines
/// are dropped (also inside such a continuation).
pub fn instructions(text: &str) -> Vec<Instruction> {
    let mut escape = '\\';
    let mut directives = true;
    let mut lines = Vec::new();
    let mut current: Option<Instruction> = None;
    for (n, raw) in text.lines().enumerate() {
        let trimmed = raw.trim_start();
        if directives {
            match parser_directive(trimmed) {
                Some((key, v)) if key == "escape" && matches!(v, "\\" | "`") => {
                    escape = v.chars().next().expect("one character");
                    continue;
                }
                Some(_) => continue,
                None => directives = false,
            }
        }
        if trimmed.starts_with('#') || trimmed.is_empty() {
            continue;
        }
        let body = raw.trim_end();
        let (body, goes_on) = match body.strip_suffix(escape) {
            Some(b) => (b, true),
            None => (body, false),
        };
        let line = current.get_or_insert_with(|| Instruction {
            line: n + 1,
            text: String::new(),
        });
        line.text.push_str(body);
        line.text.push(' ');
        if !goes_on {
            lines.extend(current.take());
        }
    }
    lines.extend(current);
    lines
}

/// A parser directive (`# syntax=…`, `# escape=…`, `# check=…`) as the key, lower
/// case, and its value; docker reads them only above everything else.
fn parser_directive(line: &str) -> Option<(String, &str)> {
    let (key, value) = line.strip_prefix('#')?.split_once('=')?;
    let key = key.trim().to_ascii_lowercase();
    ["syntax", "escape", "check"]
        .contains(&key.as_str())
        .then(|| (key, value.trim()))
}

/// The names a Dockerfile declares with `ARG NAME` or `ARG NAME=default`.
pub fn declared_args(dockerfile: &str) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for (name, _) in arg_lines(dockerfile) {
        if !names.contains(&name) {
            names.push(name);
        }
    }
    names
}

/// Each `ARG` a Dockerfile declares, with its line, in order.
pub fn arg_lines(dockerfile: &str) -> Vec<(String, usize)> {
    let mut out = Vec::new();
    for ins in instructions(dockerfile) {
        let words = shell_words(&ins.text);
        if !words.first().is_some_and(|w| w.eq_ignore_ascii_case("ARG")) {
            continue;
        }
        for w in &words[1..] {
            let name = w.split('=').next().unwrap_or(w);
            out.push((name.to_string(), ins.line));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn images(df: &str, args: &[(&str, &str)], target: Option<&str>) -> Vec<String> {
        let args: HashMap<String, String> = args
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        stages(df, &args)
            .needs(target)
            .unwrap()
            .images
            .into_iter()
            .map(|u| u.image)
            .collect()
    }

    #[test]
    fn finds_base_images() {
        let df = "FROM --platform=linux/amd64 sha256:abc AS build\nRUN x\nfrom build\nFROM scratch\nCOPY --from=build / /\nCOPY --from=0 /a /a\nCOPY --from=alpine:3.19 /b /b\n";
        assert_eq!(
            images(df, &[], None),
            ["sha256:abc", "scratch", "alpine:3.19"]
        );
    }

    #[test]
    fn line_continuations_join_before_words_are_read() {
        let df = "FROM \\\n    --platform=linux/amd64 \\\n  alpine:3.19 \\\n  AS base\nRUN echo \\\n  FROM not-an-image\nFROM base\nCOPY \\\n  --from=busybox:1 \\\n  /x /x\n";
        assert_eq!(images(df, &[], None), ["alpine:3.19", "busybox:1"]);
        // Comment and blank lines inside a continuation are dropped, as docker does.
        let df = "FROM \\\n# a comment\n\n  debian:12 AS b\nFROM b\n";
        assert_eq!(images(df, &[], None), ["debian:12"]);
        // A parser directive may make the escape a backtick (Windows style).
        let df = "# escape=`\nFROM `\n  debian:12\nRUN dir c:\\\nFROM scratch\n";
        assert_eq!(images(df, &[], None), ["scratch"]);
        let ins = instructions("# syntax=x\n\nFROM a \\\n AS b\n# c\nRUN x\n");
        assert_eq!(
            ins.iter().map(|i| i.line).collect::<Vec<_>>(),
            [3, 6],
            "{ins:?}"
        );
    }

    #[test]
    fn bases_are_read_with_the_build_arguments_put_in() {
        // vLLM's shape: a default built from an earlier one, overridden by an argument.
        let df = "ARG CUDA_VERSION=13.0.2\nARG BASE=nvidia/cuda:${CUDA_VERSION}-devel-ubuntu22.04\nARG FINAL=\"nvidia/cuda:${CUDA_VERSION}-base\"\nFROM ${BASE} AS base\nFROM $FINAL AS final\nCOPY --from=base /x /x\n";
        assert_eq!(
            images(df, &[], None),
            [
                "nvidia/cuda:13.0.2-devel-ubuntu22.04",
                "nvidia/cuda:13.0.2-base"
            ]
        );
        assert_eq!(
            images(df, &[("CUDA_VERSION", "12.8.1")], Some("base")),
            ["nvidia/cuda:12.8.1-devel-ubuntu22.04"]
        );
        let vars: HashMap<String, String> = [
            ("A".to_string(), "a".to_string()),
            ("E".into(), String::new()),
        ]
        .into();
        for (word, want) in [
            ("${A:-x}", "a"),
            ("${B:-x}", "x"),
            ("${E:-x}", "x"),
            ("${E-x}", ""),
            ("${A:+y}", "y"),
            ("${B:+y}", ""),
            ("${E+y}", "y"),
            ("r/$A/$B/\\$A", "r/a//$A"),
            ("${B:-${A}z}", "az"),
        ] {
            assert_eq!(expand(word, &vars), want, "{word}");
        }
        // The platform arguments need no ARG.
        assert!(images("FROM img:${TARGETOS}\n", &[], None)[0].starts_with("img:linux"));
    }

    #[test]
    fn a_target_takes_only_the_stages_it_needs() {
        let df = "FROM a:1 AS one\nRUN --mount=type=secret,id=tok,required=true true\nFROM b:1 AS two\nRUN --mount=type=cache,target=/c --mount=type=bind,from=c:1,target=/m true\nFROM one AS test\nCOPY --from=two /x /x\nRUN --mount=type=secret,target=/root/.aws/credentials true\nFROM d:1 AS other\n";
        let s = stages(df, &HashMap::new());
        assert_eq!(s.names(), ["one", "two", "test", "other"]);
        let needs = s.needs(Some("TEST")).unwrap();
        assert_eq!(
            needs
                .images
                .iter()
                .map(|u| (u.image.as_str(), u.line))
                .collect::<Vec<_>>(),
            [("a:1", 1), ("b:1", 3), ("c:1", 4)]
        );
        assert_eq!(
            needs
                .secrets
                .iter()
                .map(|s| (s.id.as_str(), s.required, s.line))
                .collect::<Vec<_>>(),
            [("tok", true, 2), ("credentials", false, 7)]
        );
        assert_eq!(images(df, &[], None), ["d:1"]);
        let err = s.needs(Some("tset")).unwrap_err();
        assert!(
            err.contains("no stage named `tset` (its stages: one, two, test, other)"),
            "{err}"
        );
    }

    #[test]
    fn args_are_the_ones_the_dockerfile_declares() {
        let df = "ARG CUDA=12.8\nFROM scratch\nARG TORCH \\\n  FLAVOUR=cu128\nARG NOTE=\"a b\"\n";
        assert_eq!(declared_args(df), ["CUDA", "TORCH", "FLAVOUR", "NOTE"]);
        assert_eq!(arg_lines(df)[2], ("FLAVOUR".to_string(), 3));
        assert!(is_proxy_arg("https_proxy") && !is_proxy_arg("Https_Proxy"));
    }
}
