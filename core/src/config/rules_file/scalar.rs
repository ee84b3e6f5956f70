//! Typed values of fields: strings, booleans, unsigned integers, and `metadata` as JSON.
//!
//! Each reader reports a value of the wrong type at the field's key and returns `None`.

use saphyr::{MarkedYaml, Scalar, YamlData};
use serde_json::{Map, Number, Value};

use super::tree::{Ctx, Field, describe, index, join, key_name, line, scalar_text};

/// A string field. Numbers and booleans are taken as written (`value: 123` is `"123"`).
pub(super) fn string(f: &Field<'_>, ctx: &mut Ctx<'_>) -> Option<String> {
    match &f.node.data {
        YamlData::Value(Scalar::String(s)) => Some(s.to_string()),
        YamlData::Value(Scalar::Null) => Some(String::new()),
        YamlData::Value(scalar) => Some(scalar_text(f.node, scalar, ctx)),
        _ => mismatch(f, "a string", ctx),
    }
}

/// A boolean field: `true` or `false`, or an unquoted YAML 1.1 spelling (`yes`, `off`, ...)
/// as envoyproxy/ratelimit's YAML library reads them.
pub(super) fn boolean(f: &Field<'_>, ctx: &mut Ctx<'_>) -> Option<bool> {
    match &f.node.data {
        YamlData::Value(Scalar::Boolean(b)) => Some(*b),
        YamlData::Value(Scalar::String(s)) if ctx.source(f.node) == s => match yaml11_bool(s) {
            Some(b) => Some(b),
            None => mismatch(f, "true or false", ctx),
        },
        _ => mismatch(f, "true or false", ctx),
    }
}

/// The YAML 1.1 booleans that YAML 1.2 reads as strings.
fn yaml11_bool(s: &str) -> Option<bool> {
    match s {
        "y" | "Y" | "yes" | "Yes" | "YES" | "on" | "On" | "ON" => Some(true),
        "n" | "N" | "no" | "No" | "NO" | "off" | "Off" | "OFF" => Some(false),
        _ => None,
    }
}

/// An unsigned 32-bit integer field. Floats, negative and too large values are errors.
pub(super) fn uint(f: &Field<'_>, ctx: &mut Ctx<'_>) -> Option<u32> {
    match &f.node.data {
        YamlData::Value(Scalar::Integer(i)) => in_range(f, &i.to_string(), *i < 0, ctx),
        YamlData::Value(Scalar::FloatingPoint(_)) if is_integer(ctx.source(f.node)) => {
            let text = ctx.source(f.node).trim();
            in_range(f, text, text.starts_with('-'), ctx)
        }
        _ => mismatch(f, "an integer", ctx),
    }
}

/// Converts an integer (given as text, already known to be negative or not) to a u32.
fn in_range(f: &Field<'_>, text: &str, negative: bool, ctx: &mut Ctx<'_>) -> Option<u32> {
    if negative {
        ctx.error(f.line, &f.path, format!("must not be negative, got {text}"));
        return None;
    }
    let parsed = text.strip_prefix('+').unwrap_or(text).parse::<u32>();
    match parsed {
        Ok(n) => Some(n),
        Err(_) => {
            let message = format!("must be at most {}, got {text}", u32::MAX);
            ctx.error(f.line, &f.path, message);
            None
        }
    }
}

/// True for decimal digits with an optional sign: an integer too large for YAML's i64.
fn is_integer(text: &str) -> bool {
    let digits = text.trim().trim_start_matches(['-', '+']);
    !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
}

/// Reports "expected X, got Y" at the field.
fn mismatch<T>(f: &Field<'_>, expected: &str, ctx: &mut Ctx<'_>) -> Option<T> {
    let message = format!("expected {expected}, got {}", describe(f.node, ctx));
    ctx.error(f.line, &f.path, message);
    None
}

/// A `metadata` mapping, converted to JSON.
pub(super) fn json_map(f: &Field<'_>, ctx: &mut Ctx<'_>) -> Option<Map<String, Value>> {
    match json(f.node, &f.path, f.line, ctx)? {
        Value::Object(map) => Some(map),
        _ => mismatch(f, "a mapping", ctx),
    }
}

/// Converts any YAML node to JSON; tags, aliases and complex keys are errors.
fn json(node: &MarkedYaml<'_>, path: &str, at: usize, ctx: &mut Ctx<'_>) -> Option<Value> {
    match &node.data {
        YamlData::Value(scalar) => Some(json_scalar(node, scalar, ctx)),
        YamlData::Sequence(items) => {
            let mut values = Vec::with_capacity(items.len());
            for (i, item) in items.iter().enumerate() {
                values.push(json(item, &index(path, i), line(item), ctx)?);
            }
            Some(Value::Array(values))
        }
        YamlData::Mapping(map) => {
            let mut object = Map::new();
            for (key, value) in map.iter() {
                let name = key_name(key, path, ctx)?;
                let converted = json(value, &join(path, &name), line(key), ctx)?;
                if object.contains_key(&name) {
                    ctx.error(line(key), path, format!("duplicate key '{name}'"));
                    return None;
                }
                object.insert(name, converted);
            }
            Some(Value::Object(object))
        }
        _ => {
            let message = format!("expected plain YAML data, got {}", describe(node, ctx));
            ctx.error(at, path, message);
            None
        }
    }
}

fn json_scalar(node: &MarkedYaml<'_>, scalar: &Scalar<'_>, ctx: &Ctx<'_>) -> Value {
    match scalar {
        Scalar::Null => Value::Null,
        Scalar::Boolean(b) => Value::Bool(*b),
        Scalar::Integer(i) => Value::Number((*i).into()),
        Scalar::FloatingPoint(f) => Number::from_f64(f.into_inner())
            .map(Value::Number)
            .unwrap_or_else(|| Value::String(scalar_text(node, scalar, ctx))),
        Scalar::String(s) => Value::String(s.to_string()),
    }
}
