//! What cibox reads in a Dockerfile's text, as the builder reads it: its instructions
//! (continuations joined, comments and parser directives dropped), the images it takes
//! and the arguments it declares.

/// Images a Dockerfile takes: everything after FROM, and `COPY --from=` sources, that is
/// not an earlier stage (by name or number).
pub fn bases(text: &str) -> Vec<String> {
    let mut stages: Vec<String> = Vec::new();
    let mut bases = Vec::new();
    for line in logical_lines(text) {
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

/// The Dockerfile's instructions, one per item, as the builder reads them: a line that
/// ends with the escape character (`\\`, or what an `# escape=` parser directive at the
/// top sets) goes on in the next, and comment and blank lines are dropped (also inside
/// such a continuation).
pub fn logical_lines(text: &str) -> Vec<String> {
    let mut escape = '\\';
    let mut directives = true;
    let mut lines = Vec::new();
    let mut current: Option<String> = None;
    for raw in text.lines() {
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
        let line = current.get_or_insert_with(String::new);
        line.push_str(body);
        line.push(' ');
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
    let mut names = Vec::new();
    for line in logical_lines(dockerfile) {
        let mut words = line.split_whitespace();
        if !words.next().is_some_and(|w| w.eq_ignore_ascii_case("ARG")) {
            continue;
        }
        for w in words {
            let name = w.split('=').next().unwrap_or(w);
            if !names.iter().any(|n| n == name) {
                names.push(name.to_string());
            }
        }
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_base_images() {
        let df = "FROM --platform=linux/amd64 sha256:abc AS build\nRUN x\nfrom build\nFROM scratch\nCOPY --from=build / /\nCOPY --from=0 /a /a\nCOPY --from=alpine:3.19 /b /b\n";
        assert_eq!(bases(df), ["sha256:abc", "scratch", "alpine:3.19"]);
    }

    #[test]
    fn line_continuations_join_before_words_are_read() {
        let df = "FROM \\\n    --platform=linux/amd64 \\\n  alpine:3.19 \\\n  AS base\nRUN echo \\\n  FROM not-an-image\nFROM base\nCOPY \\\n  --from=busybox:1 \\\n  /x /x\n";
        assert_eq!(bases(df), ["alpine:3.19", "busybox:1"]);
        // Comment and blank lines inside a continuation are dropped, as docker does.
        let df = "FROM \\\n# a comment\n\n  debian:12 AS b\nFROM b\n";
        assert_eq!(bases(df), ["debian:12"]);
        // A parser directive may make the escape a backtick (Windows style).
        let df = "# escape=`\nFROM `\n  debian:12\nRUN dir c:\\\nFROM scratch\n";
        assert_eq!(bases(df), ["debian:12", "scratch"]);
    }

    #[test]
    fn args_are_the_ones_the_dockerfile_declares() {
        let df = "ARG CUDA=12.8\nFROM scratch\nARG TORCH \\\n  FLAVOUR=cu128\n";
        assert_eq!(declared_args(df), ["CUDA", "TORCH", "FLAVOUR"]);
    }
}
