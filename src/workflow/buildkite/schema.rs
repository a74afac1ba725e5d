//! Buildkite's published pipeline schema (`schema.json` beside this file, vendored from
//! `buildkite/pipeline-schema`, MIT: `schema.NOTICE.md`), compiled once, and what a
//! pipeline that fails it is told: the place in the pipeline the schema refused, as a
//! key path (`steps.2.key`) with the reason.

use std::sync::OnceLock;

use serde_json::Value;

/// The schema's text, as Buildkite publishes it.
pub const SCHEMA: &str = include_str!("schema.json");

fn validator() -> &'static jsonschema::Validator {
    static V: OnceLock<jsonschema::Validator> = OnceLock::new();
    V.get_or_init(|| {
        let schema: Value = serde_json::from_str(SCHEMA).expect("the vendored schema is JSON");
        // Draft 7, as the schema says; no remote references are resolved (none is
        // needed, and the crate is built without the means).
        jsonschema::draft7::new(&schema).expect("the vendored schema compiles")
    })
}

/// Why a pipeline fails the schema: where (a key path into the pipeline, `""` for its
/// top) and what the schema says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaError {
    /// The path's parts: map keys and list indices.
    pub path: Vec<String>,
    pub message: String,
}

impl SchemaError {
    /// `steps.2.key`, or `(top level)`.
    pub fn at(&self) -> String {
        if self.path.is_empty() {
            "(top level)".into()
        } else {
            self.path.join(".")
        }
    }
}

/// The longest message quoted from the schema check: it may quote the value refused.
const MAX_MESSAGE: usize = 300;

/// Checks `pipeline` (the YAML as JSON) against the schema. Of the failures, one is
/// told: the one that says most (`steps.0.key` whose pattern fails, rather than
/// `steps.0` matching no kind of step).
pub fn check(pipeline: &Value) -> Result<(), SchemaError> {
    let v = validator();
    if v.is_valid(pipeline) {
        return Ok(());
    }
    let evaluation = v.evaluate(pipeline);
    // Under an `anyOf` of step kinds each kind fails its own way (`additionalProperties`,
    // `type`, `required`): what says most is a failure of a value itself (a `pattern`,
    // a bound), then the first step's, then the deepest in it.
    const GENERIC: [&str; 11] = [
        "type",
        "enum",
        "const",
        "required",
        "additionalProperties",
        "anyOf",
        "oneOf",
        "allOf",
        "not",
        "$ref",
        "false",
    ];
    type Rank = (bool, Vec<(usize, String)>, std::cmp::Reverse<usize>, String);
    let rank = |at: &str, schema_at: &str| -> Rank {
        let parts: Vec<(usize, String)> = at
            .split('/')
            .skip(1)
            .map(|p| match p.parse::<usize>() {
                Ok(n) => (n, String::new()),
                Err(_) => (usize::MAX, p.to_string()),
            })
            .collect();
        let keyword = schema_at.rsplit('/').next().unwrap_or_default();
        (
            GENERIC.contains(&keyword),
            parts.iter().take(2).cloned().collect(),
            std::cmp::Reverse(parts.len()),
            at.to_string(),
        )
    };
    let deepest = evaluation
        .iter_errors()
        .map(|e| {
            let at = e.instance_location.as_str().to_string();
            (rank(&at, e.schema_location), at, e.error.to_string())
        })
        .min_by(|a, b| a.0.cmp(&b.0))
        .map(|(_, at, message)| (at, message));
    let (pointer, message) = match deepest {
        Some(found) => found,
        None => match v.validate(pipeline) {
            Err(e) => (e.instance_path().as_str().to_string(), e.to_string()),
            Ok(()) => return Ok(()),
        },
    };
    let path = pointer
        .split('/')
        .skip(1)
        .map(|p| p.replace("~1", "/").replace("~0", "~"))
        .collect();
    let mut message = crate::util::escape(&message).into_owned();
    if message.len() > MAX_MESSAGE {
        let mut cut = MAX_MESSAGE;
        while !message.is_char_boundary(cut) {
            cut -= 1;
        }
        message.truncate(cut);
        message.push('…');
    }
    Err(SchemaError { path, message })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_schema_compiles_and_judges() {
        check(&json!({"steps": [{"command": "x", "key": "a-b"}, "wait", {"block": "go"}]}))
            .unwrap();
        let e = check(&json!({"steps": [{"command": "x", "key": "has spaces"}]})).unwrap_err();
        assert_eq!(e.at(), "steps.0.key", "{e:?}");
        assert!(e.message.contains("has spaces"), "{e:?}");
        let e = check(&json!({"stepz": []})).unwrap_err();
        assert_eq!(e.at(), "(top level)", "{e:?}");
        assert!(e.message.contains("steps"), "{e:?}");
    }
}
