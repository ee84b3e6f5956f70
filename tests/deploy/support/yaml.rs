//! Reading rendered manifests in tests: split a multi-document YAML text, and walk a parsed
//! document by a dotted path (`spec.template.spec.containers.0.ports`), panicking with the
//! path when something is missing.

use saphyr::{LoadableYamlNode as _, Yaml};

/// One document of a multi-document text: its own text and its parsed form.
pub(crate) struct Doc {
    pub text: String,
    pub yaml: Yaml<'static>,
}

impl Doc {
    pub(crate) fn kind(&self) -> &str {
        opt(&self.yaml, "kind").and_then(Yaml::as_str).unwrap_or("")
    }

    pub(crate) fn name(&self) -> &str {
        str_at(&self.yaml, "metadata.name")
    }
}

/// The non-empty documents of `text` (separated by `---` lines).
pub(crate) fn documents(text: &str) -> Vec<Doc> {
    let mut chunks = vec![String::new()];
    for line in text.lines() {
        if line == "---" {
            chunks.push(String::new());
        } else {
            let last = chunks.last_mut().expect("one chunk at least");
            last.push_str(line);
            last.push('\n');
        }
    }
    chunks
        .into_iter()
        .filter_map(|text| {
            // Leaked so the parsed nodes may borrow it for the rest of the test (a few KiB).
            let leaked: &'static str = Box::leak(text.clone().into_boxed_str());
            let mut parsed = Yaml::load_from_str(leaked)
                .unwrap_or_else(|e| panic!("invalid YAML ({e}):\n{text}"));
            let yaml = parsed.pop().filter(Yaml::is_mapping)?;
            Some(Doc { yaml, text })
        })
        .collect()
}

/// The node at a dotted path (numbers index sequences), if any.
pub(crate) fn opt<'a>(node: &'a Yaml<'static>, path: &str) -> Option<&'a Yaml<'static>> {
    path.split('.')
        .try_fold(node, |node, step| match step.parse::<usize>() {
            Ok(i) => node.as_sequence_get(i),
            Err(_) => node.as_mapping_get(step),
        })
}

/// The node at a dotted path; panics naming the path when it is missing.
pub(crate) fn at<'a>(node: &'a Yaml<'static>, path: &str) -> &'a Yaml<'static> {
    opt(node, path).unwrap_or_else(|| panic!("no `{path}` in {node:?}"))
}

pub(crate) fn str_at<'a>(node: &'a Yaml<'static>, path: &str) -> &'a str {
    at(node, path)
        .as_str()
        .unwrap_or_else(|| panic!("`{path}` is not a string"))
}

pub(crate) fn int_at(node: &Yaml<'static>, path: &str) -> i64 {
    at(node, path)
        .as_integer()
        .unwrap_or_else(|| panic!("`{path}` is not an integer"))
}

pub(crate) fn bool_at(node: &Yaml<'static>, path: &str) -> bool {
    at(node, path)
        .as_bool()
        .unwrap_or_else(|| panic!("`{path}` is not a boolean"))
}

/// The items of the sequence at `path`.
pub(crate) fn seq_at<'a>(node: &'a Yaml<'static>, path: &str) -> &'a [Yaml<'static>] {
    at(node, path)
        .as_vec()
        .map(Vec::as_slice)
        .unwrap_or_else(|| panic!("`{path}` is not a sequence"))
}

/// The item of the sequence at `path` whose `name` is `name`.
pub(crate) fn named<'a>(node: &'a Yaml<'static>, path: &str, name: &str) -> &'a Yaml<'static> {
    seq_at(node, path)
        .iter()
        .find(|item| opt(item, "name").and_then(Yaml::as_str) == Some(name))
        .unwrap_or_else(|| panic!("no item named `{name}` in `{path}`"))
}

/// The string pairs of the mapping at `path`, in order.
pub(crate) fn string_map(node: &Yaml<'static>, path: &str) -> Vec<(String, String)> {
    at(node, path)
        .as_mapping()
        .unwrap_or_else(|| panic!("`{path}` is not a mapping"))
        .iter()
        .map(|(k, v)| {
            let text = |y: &Yaml<'_>| {
                y.as_str()
                    .map(str::to_owned)
                    .unwrap_or_else(|| format!("{y:?}"))
            };
            (text(k), text(v))
        })
        .collect()
}

/// The same data as JSON (scalars by their resolved type), e.g. to build an Envoy bootstrap.
pub(crate) fn to_json(node: &Yaml<'_>) -> serde_json::Value {
    use saphyr::Scalar;
    use serde_json::Value;
    match node {
        Yaml::Value(Scalar::Null) => Value::Null,
        Yaml::Value(Scalar::Boolean(b)) => Value::Bool(*b),
        Yaml::Value(Scalar::Integer(i)) => Value::from(*i),
        Yaml::Value(Scalar::FloatingPoint(f)) => Value::from(f.into_inner()),
        Yaml::Value(Scalar::String(s)) => Value::String(s.to_string()),
        Yaml::Sequence(items) => Value::Array(items.iter().map(to_json).collect()),
        Yaml::Mapping(map) => Value::Object(
            map.iter()
                .map(|(k, v)| {
                    let key = k
                        .as_str()
                        .unwrap_or_else(|| panic!("a non-string key {k:?}"));
                    (key.to_owned(), to_json(v))
                })
                .collect(),
        ),
        other => panic!("no JSON for {other:?}"),
    }
}
