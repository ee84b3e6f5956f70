//! The marked YAML tree of one rules file: parsing with a nesting guard, node kinds and lines,
//! and mappings checked against the keys allowed in their context.
//!
//! Everything here reports problems into a [`Ctx`] and carries on, so that one pass over a
//! file finds every error.

use std::path::PathBuf;
use std::sync::Arc;

use saphyr::{LoadableYamlNode, MarkedYaml, Scalar, YamlData};

use super::{DefaultsFrom, LoadOptions, RuleError};
use crate::config::model::{LimitDefaults, Location};

/// The deepest indentation (in columns) a line of a rules file may have.
pub(super) const MAX_INDENT: usize = 100;
/// The most block indicators (`- `, `? `, `: `) one line may hold.
pub(super) const MAX_INDICATORS: usize = 50;

/// One file being checked: its name, its text and the errors found so far.
pub(super) struct Ctx<'t> {
    pub file: Arc<PathBuf>,
    text: &'t str,
    chars: CharIndex,
    pub errors: Vec<RuleError>,
    /// The settings' defaults, for every domain.
    pub options: LoadOptions,
    /// The defaults of the domain being read (set once its name is known).
    pub defaults: LimitDefaults,
    /// Whether those came from the domain's own `limits.domains` entry.
    pub defaults_from: DefaultsFrom,
    /// The domain being read.
    domain: String,
}

impl<'t> Ctx<'t> {
    pub(super) fn new(file: Arc<PathBuf>, text: &'t str) -> Ctx<'t> {
        Ctx {
            file,
            text,
            chars: CharIndex::new(text),
            errors: Vec::new(),
            options: LoadOptions::default(),
            defaults: LimitDefaults::default(),
            defaults_from: DefaultsFrom::default(),
            domain: String::new(),
        }
    }

    /// Reads the limits of `domain` from here on with that domain's defaults.
    pub(super) fn enter_domain(&mut self, domain: &str) {
        (self.defaults, self.defaults_from) = self.options.defaults(domain);
        domain.clone_into(&mut self.domain);
    }

    /// The domain being read.
    pub(super) fn domain(&self) -> &str {
        &self.domain
    }

    /// Where the default algorithm of the current domain comes from, for messages.
    pub(super) fn algorithm_source(&self) -> String {
        if self.defaults_from.algorithm {
            format!("limits.domains.\"{}\".algorithm", self.domain)
        } else {
            "limits.default_algorithm".to_owned()
        }
    }

    /// Records one error at `line` (1-based) and YAML `path`.
    pub(super) fn error(&mut self, line: usize, path: &str, message: impl Into<String>) {
        self.errors.push(RuleError {
            file: self.file.as_ref().clone(),
            line,
            path: path.to_owned(),
            message: message.into(),
        });
    }

    pub(super) fn location(&self, line: usize) -> Location {
        Location {
            file: Arc::clone(&self.file),
            line,
        }
    }

    /// The source text a node was read from (empty if its span is unknown).
    pub(super) fn source(&self, node: &MarkedYaml<'_>) -> &'t str {
        let start = self.chars.byte_offset(self.text, node.span.start.index());
        let end = self.chars.byte_offset(self.text, node.span.end.index());
        match (start, end) {
            (Some(s), Some(e)) if s <= e => self.text.get(s..e).unwrap_or(""),
            _ => "",
        }
    }
}

/// Turns the parser's character indices into byte offsets without rescanning the whole text:
/// it keeps the byte offset of every [`CharIndex::STEP`]-th character.
struct CharIndex {
    /// Empty for ASCII text, where characters and bytes coincide.
    checkpoints: Vec<usize>,
    chars: usize,
}

impl CharIndex {
    const STEP: usize = 64;

    fn new(text: &str) -> CharIndex {
        if text.is_ascii() {
            return CharIndex {
                checkpoints: Vec::new(),
                chars: text.len(),
            };
        }
        let checkpoints = text.char_indices().step_by(Self::STEP).map(|(b, _)| b);
        CharIndex {
            checkpoints: checkpoints.collect(),
            chars: text.chars().count(),
        }
    }

    /// The byte offset of the `index`-th character (the text's length just past the last one).
    fn byte_offset(&self, text: &str, index: usize) -> Option<usize> {
        if index >= self.chars {
            return (index == self.chars).then_some(text.len());
        }
        if self.checkpoints.is_empty() {
            return Some(index);
        }
        let base = *self.checkpoints.get(index / Self::STEP)?;
        let rest = text.get(base..)?;
        rest.char_indices()
            .nth(index % Self::STEP)
            .map(|(b, _)| base + b)
    }
}

/// Parses every YAML document of the file. A syntax error (or a file nested too deeply to be
/// parsed safely) is reported once and yields no documents.
pub(super) fn parse<'t>(ctx: &mut Ctx<'t>) -> Vec<MarkedYaml<'t>> {
    if let Some(line) = too_deep(ctx.text) {
        let message = format!(
            "nested too deeply (at most {MAX_INDENT} columns of indentation and \
             {MAX_INDICATORS} nested collections on one line)"
        );
        ctx.error(line, "", message);
        return Vec::new();
    }
    match MarkedYaml::load_from_str(ctx.text) {
        Ok(docs) => docs,
        Err(e) => {
            let mark = e.marker();
            let message = format!("invalid YAML: {} (column {})", e.info(), mark.col() + 1);
            ctx.error(mark.line(), "", message);
            Vec::new()
        }
    }
}

/// The first line whose nesting could exceed what the parser handles safely on a small stack.
///
/// A chain of nested block collections needs ever deeper indentation (a sequence directly
/// under a mapping key may share its column) or compact indicators on one line, and flow
/// collections are capped by the parser itself; so bounding both keeps the real depth low.
fn too_deep(text: &str) -> Option<usize> {
    let mut offset = 0;
    for piece in text.split(['\n', '\r', '\0']) {
        let indent = piece.len() - piece.trim_start_matches(' ').len();
        let content = piece.trim();
        if !content.is_empty()
            && !content.starts_with('#')
            && (indent > MAX_INDENT || indicators(piece) > MAX_INDICATORS)
        {
            return Some(line_at(text, offset));
        }
        offset += piece.len() + 1;
    }
    None
}

/// The 1-based line of a byte offset, counting line breaks as YAML does: `\n`, `\r\n`, or a
/// lone `\r` (a NUL, which the check above also splits at, is no line break).
fn line_at(text: &str, offset: usize) -> usize {
    let bytes = text.as_bytes();
    let breaks = bytes[..offset]
        .iter()
        .enumerate()
        .filter(|&(i, &b)| b == b'\n' || (b == b'\r' && bytes.get(i + 1) != Some(&b'\n')))
        .count();
    1 + breaks
}

/// Counts `-`, `?` and `:` followed by a blank or the end of the line.
fn indicators(line: &str) -> usize {
    let bytes = line.as_bytes();
    bytes
        .iter()
        .enumerate()
        .filter(|(i, b)| {
            matches!(b, b'-' | b'?' | b':') && matches!(bytes.get(i + 1), None | Some(b' ' | b'\t'))
        })
        .count()
}

/// The 1-based line a node starts on.
pub(super) fn line(node: &MarkedYaml<'_>) -> usize {
    node.span.start.line()
}

/// True for a YAML null (`~`, `null`, or nothing) and for an empty document.
pub(super) fn is_null(node: &MarkedYaml<'_>) -> bool {
    matches!(
        node.data,
        YamlData::Value(Scalar::Null) | YamlData::BadValue
    )
}

/// Describes a node for "expected X, got Y" messages.
pub(super) fn describe(node: &MarkedYaml<'_>, ctx: &Ctx<'_>) -> String {
    match &node.data {
        YamlData::Mapping(_) => "a mapping".into(),
        YamlData::Sequence(_) => "a sequence".into(),
        YamlData::Value(Scalar::Null) => "null".into(),
        YamlData::Value(Scalar::Boolean(b)) => format!("a boolean ({b})"),
        YamlData::Value(Scalar::Integer(i)) => format!("an integer ({i})"),
        YamlData::Value(Scalar::FloatingPoint(_)) => format!("a number ({})", ctx.source(node)),
        YamlData::Value(Scalar::String(s)) => format!("a string ('{s}')"),
        YamlData::Tagged(tag, _) => format!("a node tagged {tag}"),
        YamlData::Alias(_) => "an alias".into(),
        YamlData::Representation(..) | YamlData::BadValue => {
            "a value that does not match its tag".into()
        }
    }
}

/// `path.key`, or `key` at the top of a document.
pub(super) fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

/// `path[index]`.
pub(super) fn index(path: &str, i: usize) -> String {
    format!("{path}[{i}]")
}

/// One `key: value` of a checked mapping.
pub(super) struct Field<'a> {
    /// The line of the key.
    pub line: usize,
    /// The YAML path of the key.
    pub path: String,
    pub node: &'a MarkedYaml<'a>,
}

/// A mapping whose keys were all allowed in its context.
pub(super) struct Fields<'a> {
    /// The line the mapping starts on.
    pub line: usize,
    /// The YAML path of the mapping.
    pub path: String,
    entries: Vec<(String, Field<'a>)>,
}

impl<'a> Fields<'a> {
    /// The field `name`, unless it is absent or null.
    pub(super) fn get(&self, name: &str) -> Option<&Field<'a>> {
        self.get_raw(name).filter(|f| !is_null(f.node))
    }

    /// The field `name`, even when its value is null.
    pub(super) fn get_raw(&self, name: &str) -> Option<&Field<'a>> {
        self.entries.iter().find(|(k, _)| k == name).map(|(_, f)| f)
    }
}

/// Reads `node` as a mapping whose keys must be among `allowed`; every other key is an error.
/// `line` is where to report a node that is not a mapping.
pub(super) fn mapping<'a>(
    node: &'a MarkedYaml<'a>,
    path: &str,
    line: usize,
    allowed: &[&str],
    ctx: &mut Ctx<'_>,
) -> Option<Fields<'a>> {
    let YamlData::Mapping(map) = &node.data else {
        let message = format!("expected a mapping, got {}", describe(node, ctx));
        ctx.error(line, path, message);
        return None;
    };
    let start = self::line(node);
    let mut fields = Fields {
        line: if start == 0 { line } else { start },
        path: path.to_owned(),
        entries: Vec::new(),
    };
    for (key, value) in map.iter() {
        if let Some(name) = key_name(key, path, ctx) {
            add_field(&mut fields, name, key, value, allowed, ctx);
        }
    }
    Some(fields)
}

fn add_field<'a>(
    fields: &mut Fields<'a>,
    name: String,
    key: &MarkedYaml<'_>,
    value: &'a MarkedYaml<'a>,
    allowed: &[&str],
    ctx: &mut Ctx<'_>,
) {
    let key_line = line(key);
    if !allowed.contains(&name.as_str()) {
        ctx.error(key_line, &fields.path, format!("unknown key '{name}'"));
    } else if fields.get_raw(&name).is_some() {
        ctx.error(key_line, &fields.path, format!("duplicate key '{name}'"));
    } else {
        let path = join(&fields.path, &name);
        let field = Field {
            line: key_line,
            path,
            node: value,
        };
        fields.entries.push((name, field));
    }
}

/// The text of a mapping key; keys must be scalars.
pub(super) fn key_name(key: &MarkedYaml<'_>, path: &str, ctx: &mut Ctx<'_>) -> Option<String> {
    match &key.data {
        YamlData::Value(Scalar::String(s)) => Some(s.to_string()),
        YamlData::Value(scalar) => Some(scalar_text(key, scalar, ctx)),
        _ => {
            let message = format!("expected a plain key, got {}", describe(key, ctx));
            ctx.error(line(key), path, message);
            None
        }
    }
}

/// The text of a non-string scalar as written (`0x1F` stays `0x1F`), or its value when the
/// source has anchors, tags or an alias in front of it.
pub(super) fn scalar_text(node: &MarkedYaml<'_>, scalar: &Scalar<'_>, ctx: &Ctx<'_>) -> String {
    let raw = ctx.source(node).trim();
    if !raw.is_empty() && Scalar::parse_from_cow(raw.into()) == *scalar {
        return raw.to_owned();
    }
    match scalar {
        Scalar::Null => String::new(),
        Scalar::Boolean(b) => b.to_string(),
        Scalar::Integer(i) => i.to_string(),
        Scalar::FloatingPoint(f) => f.to_string(),
        Scalar::String(s) => s.to_string(),
    }
}
