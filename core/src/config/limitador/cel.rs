//! CEL expressions of limitador-format limits: compiled once at load, evaluated per request
//! against the request's descriptors.
//!
//! The crate is `cel` (cel-rust), the interpreter limitador itself evaluates its limits with,
//! so an expression means the same in both. A request is bound as `descriptors`, a list with
//! one map per descriptor (entry key to entry value, the last entry winning when a key is
//! repeated), and each limit adds `limit` (a map with its `name` and `id`, null when unset).

use std::collections::HashMap;
use std::sync::Arc;

use ::cel::common::ast::{EntryExpr, Expr as AstExpr, IdedEntryExpr};
use ::cel::objects::Value;
use ::cel::{Context, ExecutionError, IdedExpr, Program};

/// The longest expression accepted, in bytes.
pub(crate) const MAX_SOURCE_BYTES: usize = 4096;
/// The deepest nesting of brackets (`(`, `[`, `{`) accepted before the parser runs.
pub(crate) const MAX_NESTING: usize = 32;
/// The most operator characters (outside string literals) accepted before the parser runs:
/// it bounds how deep the parser itself may go.
pub(crate) const MAX_OPERATORS: usize = 256;
/// The deepest expression tree accepted: evaluation recurses once per level, on the stack of
/// the runtime's worker threads.
pub(crate) const MAX_DEPTH: usize = 32;

/// One compiled expression and the text it was compiled from. Equal by source text.
#[derive(Clone)]
pub struct Expr {
    source: String,
    program: Arc<Program>,
}

impl Expr {
    /// Compiles `source`, or says in one line why it cannot be.
    pub fn compile(source: &str) -> Result<Expr, String> {
        if source.trim().is_empty() {
            return Err("must not be empty".to_owned());
        }
        if source.len() > MAX_SOURCE_BYTES {
            return Err(format!(
                "a CEL expression must be at most {MAX_SOURCE_BYTES} bytes, got {}",
                source.len()
            ));
        }
        if nesting(source) > MAX_NESTING {
            return Err(format!(
                "a CEL expression may nest at most {MAX_NESTING} brackets deep"
            ));
        }
        if operators(source) > MAX_OPERATORS {
            return Err(format!(
                "a CEL expression may hold at most {MAX_OPERATORS} operators"
            ));
        }
        match Program::compile(source) {
            Ok(program) if depth(program.expression()) > MAX_DEPTH => Err(format!(
                "a CEL expression may be at most {MAX_DEPTH} operations deep"
            )),
            Ok(program) => Ok(Expr {
                source: source.to_owned(),
                program: Arc::new(program),
            }),
            Err(errors) => {
                let first = errors.errors.first().map_or_else(
                    || "unknown error".to_owned(),
                    |e| format!("{} (column {})", e.msg, e.pos.1 + 1),
                );
                Err(format!("invalid CEL expression '{source}': {first}"))
            }
        }
    }

    /// The text the expression was compiled from.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Whether the expression reads `limit` (the limit's own `name` and `id`).
    pub(crate) fn reads_limit(&self) -> bool {
        self.program.references().has_variable("limit")
    }

    fn eval(&self, ctx: &Context<'_, '_>) -> Result<Value, ExecutionError> {
        self.program.execute(ctx)
    }

    /// The expression's value, whatever its type (for label maps).
    pub(crate) fn evaluate(&self, ctx: &Context<'_, '_>) -> Result<Value, ExecutionError> {
        self.eval(ctx)
    }

    /// A condition: true only when it evaluates to `true`. A missing key or descriptor, an
    /// error or a value that is not a boolean all make it false.
    pub fn holds(&self, ctx: &Context<'_, '_>) -> bool {
        matches!(self.eval(ctx), Ok(Value::Bool(true)))
    }

    /// A variable: its value as text (strings as they are, numbers and booleans printed,
    /// null as `null`), or `None` when it cannot be resolved (a missing key or descriptor,
    /// an error, or a list, map or other value that has no text).
    pub fn value(&self, ctx: &Context<'_, '_>) -> Option<String> {
        match self.eval(ctx).ok()? {
            Value::String(s) => Some(s.as_str().to_owned()),
            Value::Int(i) => Some(i.to_string()),
            Value::UInt(u) => Some(u.to_string()),
            Value::Float(f) => Some(f.to_string()),
            Value::Bool(b) => Some(b.to_string()),
            Value::Null => Some("null".to_owned()),
            _ => None,
        }
    }
}

impl PartialEq for Expr {
    fn eq(&self, other: &Expr) -> bool {
        self.source == other.source
    }
}

impl Eq for Expr {}

impl std::fmt::Debug for Expr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Expr({:?})", self.source)
    }
}

/// The deepest bracket nesting of `source` (brackets inside string literals count too, which
/// only makes the bound stricter).
fn nesting(source: &str) -> usize {
    let mut depth = 0usize;
    let mut deepest = 0;
    for b in source.bytes() {
        match b {
            b'(' | b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b')' | b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

/// The operator characters of `source` outside its string literals (quotes and escapes
/// followed roughly: a miscount only makes the bound stricter or looser by a literal's worth).
fn operators(source: &str) -> usize {
    let mut count = 0;
    let mut quote = None;
    let mut escaped = false;
    for b in source.bytes() {
        match quote {
            Some(q) if escaped => {
                escaped = false;
                quote = Some(q);
            }
            Some(_) if b == b'\\' => escaped = true,
            Some(q) if b == q => quote = None,
            Some(_) => {}
            None if b == b'\'' || b == b'"' => quote = Some(b),
            None if b"[(.?+-*/%!<>=&|:,".contains(&b) => count += 1,
            None => {}
        }
    }
    count
}

/// The depth of an expression tree, walked without recursion.
fn depth<'a>(root: &'a IdedExpr) -> usize {
    let mut deepest = 0;
    let mut stack: Vec<(&'a IdedExpr, usize)> = vec![(root, 1)];
    while let Some((node, d)) = stack.pop() {
        deepest = deepest.max(d);
        let mut push = |child: &'a IdedExpr| stack.push((child, d + 1));
        match &node.expr {
            AstExpr::Call(call) => {
                call.target.iter().for_each(|t| push(t));
                call.args.iter().for_each(&mut push);
            }
            AstExpr::Comprehension(c) => {
                [
                    &c.iter_range,
                    &c.accu_init,
                    &c.loop_cond,
                    &c.loop_step,
                    &c.result,
                ]
                .into_iter()
                .for_each(&mut push);
            }
            AstExpr::List(list) => list.elements.iter().for_each(&mut push),
            AstExpr::Map(map) => map.entries.iter().for_each(|e| entry(e, &mut push)),
            AstExpr::Struct(st) => st.entries.iter().for_each(|e| entry(e, &mut push)),
            AstExpr::Select(select) => push(&select.operand),
            AstExpr::Ident(_) | AstExpr::Literal(_) | AstExpr::Unspecified => {}
        }
    }
    deepest
}

fn entry<'a>(e: &'a IdedEntryExpr, push: &mut impl FnMut(&'a IdedExpr)) {
    match &e.expr {
        EntryExpr::StructField(f) => push(&f.value),
        EntryExpr::MapEntry(m) => {
            push(&m.key);
            push(&m.value);
        }
    }
}

/// The request's binding: `descriptors`, one map per descriptor (given as its entries).
pub fn request_context<'e, D, E>(descriptors: D) -> Context<'static, 'static>
where
    D: IntoIterator<Item = E>,
    E: IntoIterator<Item = (&'e str, &'e str)>,
{
    let list: Vec<Value> = descriptors
        .into_iter()
        .map(|entries| {
            let map: HashMap<String, String> = entries
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect();
            Value::from(map)
        })
        .collect();
    let mut ctx = Context::default();
    ctx.add_variable_from_value("descriptors", Value::List(Arc::new(list)));
    ctx
}

/// `limit`, bound for one limit's expressions: its `name` and `id` (null when unset).
pub(crate) fn limit_value(name: Option<&str>, id: Option<&str>) -> Value {
    let text = |s: Option<&str>| s.map_or(Value::Null, |s| Value::String(Arc::new(s.to_owned())));
    let map: HashMap<String, Value> =
        HashMap::from([("name".to_owned(), text(name)), ("id".to_owned(), text(id))]);
    Value::from(map)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx(descriptors: &[&[(&str, &str)]]) -> Context<'static, 'static> {
        request_context(descriptors.iter().map(|d| d.iter().copied()))
    }

    #[test]
    fn conditions_read_descriptors_by_index_and_key() {
        let get = [("req.method", "GET"), ("user_id", "a")];
        let c = ctx(&[&get]);
        assert!(
            Expr::compile("descriptors[0]['req.method'] == 'GET'")
                .unwrap()
                .holds(&c)
        );
        assert!(
            !Expr::compile("descriptors[0]['req.method'] == 'POST'")
                .unwrap()
                .holds(&c)
        );
        let x = [("x", "1")];
        assert!(
            Expr::compile("descriptors[0].x == '1'")
                .unwrap()
                .holds(&ctx(&[&x]))
        );
    }

    #[test]
    fn missing_keys_and_descriptors_make_a_condition_false_and_a_variable_absent() {
        let c = ctx(&[&[("a", "1")]]);
        assert!(!Expr::compile("descriptors[0].b == '1'").unwrap().holds(&c));
        assert!(!Expr::compile("descriptors[1].a == '1'").unwrap().holds(&c));
        assert!(!Expr::compile("undeclared == '1'").unwrap().holds(&c));
        assert!(
            !Expr::compile("descriptors[0].a").unwrap().holds(&c),
            "not a boolean"
        );
        assert_eq!(Expr::compile("descriptors[0].b").unwrap().value(&c), None);
        assert_eq!(Expr::compile("descriptors[0]").unwrap().value(&c), None);
        assert_eq!(
            Expr::compile("descriptors[0].a").unwrap().value(&c),
            Some("1".into())
        );
        assert_eq!(
            Expr::compile("int(descriptors[0].a) * 3")
                .unwrap()
                .value(&c),
            Some("3".into())
        );
    }

    #[test]
    fn bad_expressions_are_refused_with_a_reason() {
        assert!(
            Expr::compile("descriptors[0].x ==")
                .unwrap_err()
                .contains("invalid CEL")
        );
        assert_eq!(Expr::compile("  ").unwrap_err(), "must not be empty");
        let deep = format!("{}1{}", "(".repeat(40), ")".repeat(40));
        assert!(Expr::compile(&deep).unwrap_err().contains("nest"));
        assert!(
            Expr::compile(&"1+".repeat(3000))
                .unwrap_err()
                .contains("bytes")
        );
    }
}

#[cfg(test)]
mod hostile {
    use super::*;

    /// Expressions at the length bound, deep in every way brackets do not count, must compile
    /// or be refused on a 2 MiB stack (a runtime worker's) without overflowing it.
    #[test]
    fn long_chains_neither_panic_nor_exhaust_a_small_stack() {
        let n = MAX_SOURCE_BYTES / 2 - 1;
        let inputs = [
            "!".repeat(MAX_SOURCE_BYTES - 4) + "true",
            "-".repeat(MAX_SOURCE_BYTES - 1) + "1",
            "a".to_owned() + &".b".repeat(n),
            "1".to_owned() + &"+1".repeat(n),
            "x".to_owned() + &"[0]".repeat(MAX_SOURCE_BYTES / 3 - 1),
            "a ? ".repeat(MAX_SOURCE_BYTES / 4 - 2) + "1",
            "1 || ".repeat(MAX_SOURCE_BYTES / 5 - 1) + "1",
        ];
        for input in inputs {
            let run = std::thread::Builder::new()
                .stack_size(2 << 20)
                .spawn(move || {
                    let ctx = request_context([[("a", "b")]]);
                    if let Ok(e) = Expr::compile(&input) {
                        let _ = e.holds(&ctx);
                        let _ = e.value(&ctx);
                    }
                })
                .unwrap();
            run.join().expect("no panic");
        }
    }
}
