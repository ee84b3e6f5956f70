//! limitador's metric labels from CEL (`--custom-metric-labels FILE`,
//! `--metric-labels-default EXPR`; sluice's `metrics.limitador_labels_file` and
//! `metrics.limitador_labels_default`), evaluated over the request's `descriptors` as
//! limitador evaluates them:
//!
//! - the file maps label names to expressions; a label is set when its expression gives a
//!   string, number, boolean or null (as text), and left out when it reads a missing key or
//!   descriptor, fails, or gives a list or map;
//! - the default expression gives a map; each entry whose key and value are strings is a
//!   label, an entry of another kind is left out, and anything but a map gives none;
//! - a label of the file wins over the default's entry of the same name. An entry named as
//!   limitador's own labels (`limitador_namespace`, `limit_name`), or not a valid Prometheus
//!   label name, is left out;
//! - in the file, an entry whose expression does not compile, or whose name is not a label
//!   sluice can add, is left out and said at start (limitador logs and skips an expression
//!   that does not compile too); a file that cannot be read, is not YAML, or maps a name to
//!   anything but a string stops the start, as it stops limitador's.

use std::path::Path;

use cel::Value;
use cel::objects::Key;
use saphyr::{LoadableYamlNode, MarkedYaml, Scalar, YamlData};

use super::cel::{Expr, request_context};

/// Labels limitador's series always carry; no CEL label may take these names.
pub const RESERVED: [&str; 2] = ["limitador_namespace", "limit_name"];

/// The compiled label expressions.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MetricLabels {
    /// A map of labels (`--metric-labels-default`).
    pub default: Option<Expr>,
    /// One expression per label, by name (`--custom-metric-labels`'s file).
    pub custom: Vec<(String, Expr)>,
}

impl MetricLabels {
    /// Reads the labels file (when given) and compiles the default expression (when given);
    /// also returns the file's entries left out, each naming the file, its line and why (to
    /// be logged). Errors name the setting, and for the file its line and label.
    pub fn load(
        file: Option<&Path>,
        default: Option<&str>,
    ) -> Result<(MetricLabels, Vec<String>), String> {
        let default = default
            .map(|d| Expr::compile(d).map_err(|e| format!("metrics.limitador_labels_default: {e}")))
            .transpose()?;
        let (custom, left_out) = match file {
            None => (Vec::new(), Vec::new()),
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|e| {
                    format!("metrics.limitador_labels_file: {}: {e}", path.display())
                })?;
                let at = |line: usize, e: &str| {
                    format!(
                        "metrics.limitador_labels_file: {}:{line}: {e}",
                        path.display()
                    )
                };
                let (custom, skipped) = parse(&text).map_err(|(line, e)| at(line, &e))?;
                let skipped = skipped
                    .iter()
                    .map(|(line, e)| at(*line, &format!("{e}; the label is left out")))
                    .collect();
                (custom, skipped)
            }
        };
        Ok((MetricLabels { default, custom }, left_out))
    }

    /// Whether there is anything to evaluate.
    pub fn is_empty(&self) -> bool {
        self.default.is_none() && self.custom.is_empty()
    }

    /// The labels of a request with `descriptors` (each a list of entries), sorted by name.
    pub fn eval<'e, D, E>(&self, descriptors: D) -> Vec<(String, String)>
    where
        D: IntoIterator<Item = E>,
        E: IntoIterator<Item = (&'e str, &'e str)>,
    {
        if self.is_empty() {
            return Vec::new();
        }
        let ctx = request_context(descriptors);
        let mut labels: Vec<(String, String)> = Vec::new();
        if let Some(default) = &self.default
            && let Ok(Value::Map(map)) = default.evaluate(&ctx)
        {
            for (k, v) in map.map.iter() {
                if let (Key::String(k), Value::String(v)) = (k, v)
                    && label_name_ok(k)
                {
                    labels.push((k.to_string(), v.to_string()));
                }
            }
        }
        for (name, expr) in &self.custom {
            if let Some(value) = expr.value(&ctx) {
                labels.retain(|(n, _)| n != name);
                labels.push((name.clone(), value));
            }
        }
        labels.sort();
        labels
    }
}

/// A Prometheus label name, not one limitador's series carry already.
pub fn label_name_ok(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !name.starts_with("__")
        && !RESERVED.contains(&name)
}

/// A labels file read: its `label: expression` pairs, and the entries left out (each with
/// its line and why).
type Parsed = (Vec<(String, Expr)>, Vec<(usize, String)>);

/// The file's `label: expression` pairs, and the entries left out; an error with its line.
fn parse(text: &str) -> Result<Parsed, (usize, String)> {
    let docs = MarkedYaml::load_from_str(text).map_err(|e| {
        let mark = e.marker();
        (
            mark.line(),
            format!("invalid YAML: {} (column {})", e.info(), mark.col() + 1),
        )
    })?;
    let Some(doc) = docs.into_iter().next() else {
        return Ok((Vec::new(), Vec::new()));
    };
    let map = match &doc.data {
        YamlData::Mapping(map) => map,
        YamlData::Value(Scalar::Null) => return Ok((Vec::new(), Vec::new())),
        _ => {
            let line = doc.span.start.line();
            return Err((
                line,
                "expected a mapping of label names to CEL expressions".into(),
            ));
        }
    };
    let mut labels: Vec<(String, Expr)> = Vec::with_capacity(map.len());
    let mut skipped = Vec::new();
    for (key, value) in map {
        let line = key.span.start.line();
        let YamlData::Value(Scalar::String(name)) = &key.data else {
            return Err((line, "a label name must be a string".into()));
        };
        if !label_name_ok(name) {
            let why = format!(
                "'{name}': not a label name sluice can add (letters, digits and '_', not \
                 starting with a digit or '__', and not {})",
                RESERVED.join(" or ")
            );
            skipped.push((line, why));
            continue;
        }
        let YamlData::Value(Scalar::String(source)) = &value.data else {
            return Err((
                line,
                format!("{name}: expected a CEL expression (a string)"),
            ));
        };
        match Expr::compile(source) {
            Ok(expr) => labels.push((name.to_string(), expr)),
            Err(e) => skipped.push((line, format!("{name}: {e}"))),
        }
    }
    labels.sort_by(|a, b| a.0.cmp(&b.0));
    Ok((labels, skipped))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(file: &str, default: Option<&str>) -> MetricLabels {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("labels.yaml");
        std::fs::write(&path, file).unwrap();
        MetricLabels::load(Some(&path), default)
            .unwrap_or_else(|e| panic!("{e}"))
            .0
    }

    #[test]
    fn file_labels_and_the_default_map_are_evaluated_over_the_descriptors() {
        let l = labels(
            "user: descriptors[0]['user']\nmethod: descriptors[0].method\nsize: size(descriptors)\nlist: '[1]'\n",
            Some("{'tier': descriptors[0]['tier'], 'user': 'anon', 'n': 1, 'limit_name': 'x'}"),
        );
        let got = l.eval([[("user", "alice"), ("tier", "gold")]]);
        let want = [("size", "1"), ("tier", "gold"), ("user", "alice")];
        assert_eq!(got, want.map(|(k, v)| (k.to_owned(), v.to_owned())));
        // A missing key leaves its label out; the default's `user` stands then.
        let got = l.eval([[("tier", "gold"), ("method", "GET")]]);
        let want = [
            ("method", "GET"),
            ("size", "1"),
            ("tier", "gold"),
            ("user", "anon"),
        ];
        assert_eq!(got, want.map(|(k, v)| (k.to_owned(), v.to_owned())));
        // A default that reads a missing key gives no map, hence no labels of its own.
        assert_eq!(
            l.eval([[("user", "bob")]]),
            [
                ("size".to_owned(), "1".to_owned()),
                ("user".to_owned(), "bob".to_owned())
            ]
        );
    }

    #[test]
    fn bad_entries_are_left_out_and_bad_files_refused_naming_where() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("l.yaml");
        for (text, says) in [
            ("a: b\n'9x': c\n", "l.yaml:2: '9x': not a label name"),
            (
                "limit_name: c\na: b\n",
                "l.yaml:1: 'limit_name': not a label name",
            ),
            (
                "a: 'descriptors[0].'\nb: c\n",
                "l.yaml:1: a: invalid CEL expression",
            ),
        ] {
            std::fs::write(&path, text).unwrap();
            let (labels, left_out) = MetricLabels::load(Some(&path), None).unwrap();
            assert_eq!(labels.custom.len(), 1, "{text:?}: the good entry stays");
            assert_eq!(left_out.len(), 1, "{text:?}: {left_out:?}");
            let said = &left_out[0];
            assert!(
                said.starts_with("metrics.limitador_labels_file: "),
                "{said}"
            );
            assert!(
                said.contains(says) && said.ends_with("left out"),
                "{text:?}: {said}"
            );
        }
        for (text, says) in [
            ("a: [b]\n", "l.yaml:1: a: expected a CEL expression"),
            ("- a\n", "l.yaml:1: expected a mapping"),
            ("a: [\n", "invalid YAML"),
        ] {
            std::fs::write(&path, text).unwrap();
            let err = MetricLabels::load(Some(&path), None).unwrap_err();
            assert!(err.starts_with("metrics.limitador_labels_file: "), "{err}");
            assert!(err.contains(says), "{text:?}: {err}");
        }
        let err = MetricLabels::load(None, Some("{'a': ")).unwrap_err();
        assert!(
            err.starts_with("metrics.limitador_labels_default: invalid CEL"),
            "{err}"
        );
        let missing = MetricLabels::load(Some(&dir.path().join("none.yaml")), None).unwrap_err();
        assert!(missing.contains("none.yaml"), "{missing}");
        assert!(MetricLabels::load(None, None).unwrap().0.is_empty());
    }
}
