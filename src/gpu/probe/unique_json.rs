//! JSON read strictly: an object that gives a key twice is refused, where `serde_json`
//! keeps the last. A tool's answer that names one GPU twice (one reading busy, one
//! idle) must fail the probe, never be read as whichever came last.

use serde::de::{Deserialize, Deserializer, Error as _, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

/// `text` as JSON, refused when any object in it gives a key twice.
pub fn parse(text: &str) -> Result<Value, serde_json::Error> {
    serde_json::from_str::<Unique>(text).map(|u| u.0)
}

/// A JSON value whose objects were checked for keys given twice.
struct Unique(Value);

impl<'de> Deserialize<'de> for Unique {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Unique, D::Error> {
        d.deserialize_any(UniqueVisitor).map(Unique)
    }
}

struct UniqueVisitor;

impl<'de> Visitor<'de> for UniqueVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_string()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(Unique(v)) = seq.next_element()? {
            items.push(v);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if out.contains_key(&key) {
                return Err(A::Error::custom(format!(
                    "the key `{}` is given twice",
                    crate::util::escape(&key)
                )));
            }
            let Unique(v) = map.next_value()?;
            out.insert(key, v);
        }
        Ok(Value::Object(out))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_key_given_twice_is_refused_at_any_depth() {
        let v = super::parse(r#"{"a": {"b": [1, {"c": null}]}, "d": true}"#).unwrap();
        assert_eq!(v["a"]["b"][1]["c"], serde_json::Value::Null);
        for bad in [
            r#"{"card0": {"x": "1"}, "card0": {"x": "2"}}"#,
            r#"{"card0": {"GPU use (%)": "99", "GPU use (%)": "0"}}"#,
            r#"[{"a": 1, "a": 1}]"#,
        ] {
            let e = super::parse(bad).unwrap_err().to_string();
            assert!(e.contains("is given twice"), "{bad}: {e}");
        }
    }
}
