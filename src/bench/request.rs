//! The request a load sends: a fixed `RateLimitRequest`, from a file or from flags, and an
//! optional spread of one entry's value over many values.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::Context as _;
use saphyr::{LoadableYamlNode, Scalar, Yaml};
use serde_json::{Map, Number, Value};

use crate::proto::rate_limit_descriptor::Entry;
use crate::proto::{RateLimitDescriptor, RateLimitRequest};
pub use sluice_core::rng::Rng;

/// How spread values are drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SpreadOrder {
    /// Uniformly at random (fixed seed per worker).
    Random,
    /// `--seed`, then +1 each, shared by all workers, wrapping at N: every value once before
    /// any twice.
    Sequential,
}

/// `--spread KEY=N`: entries with key `KEY` get the value `KEY-n`, `n` in `0..N`.
#[derive(Debug)]
pub struct Spread {
    pub key: String,
    pub values: u64,
    pub order: SpreadOrder,
    next: AtomicU64,
}

impl Spread {
    pub fn new(key: impl Into<String>, values: u64, order: SpreadOrder) -> Spread {
        Spread {
            key: key.into(),
            values: values.max(1),
            order,
            next: AtomicU64::new(0),
        }
    }

    /// A sequential spread starts at `first` (mod N).
    pub(crate) fn starting_at(self, first: u64) -> Spread {
        self.next.store(first, Ordering::Relaxed);
        self
    }

    /// Parses `KEY=N`.
    pub fn parse(text: &str, order: SpreadOrder) -> anyhow::Result<Spread> {
        let (key, n) = text
            .rsplit_once('=')
            .with_context(|| format!("--spread {text:?}: expected KEY=N"))?;
        let n: u64 = n
            .parse()
            .with_context(|| format!("--spread {text:?}: N must be a whole number"))?;
        anyhow::ensure!(
            !key.is_empty() && n >= 1,
            "--spread {text:?}: expected a key and N >= 1"
        );
        Ok(Spread::new(key, n, order))
    }

    pub(super) fn draw(&self, rng: &mut Rng) -> u64 {
        match self.order {
            SpreadOrder::Random => rng.next_u64() % self.values,
            SpreadOrder::Sequential => self.next.fetch_add(1, Ordering::Relaxed) % self.values,
        }
    }
}

/// What every request of a load is made from.
#[derive(Debug)]
pub struct Template {
    base: RateLimitRequest,
    spread: Option<Spread>,
}

impl Template {
    /// A template sending `request` as is.
    pub fn new(request: RateLimitRequest) -> Template {
        Template {
            base: request,
            spread: None,
        }
    }

    /// A request from a proto3-JSON file (`.json`, or YAML of the same shape).
    pub(crate) fn from_file(path: &Path) -> anyhow::Result<Template> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        let json = json_of_yaml(&text).with_context(|| format!("{}", path.display()))?;
        let body = serde_json::to_vec(&json)?;
        let request = crate::wire::json::request(&body)
            .with_context(|| format!("{}: not a RateLimitRequest", path.display()))?;
        Ok(Template::new(request))
    }

    /// A request from `--domain` and `--descriptor key=value,key2=value2` flags.
    pub(crate) fn from_flags(
        domain: Option<&str>,
        descriptors: &[String],
    ) -> anyhow::Result<Template> {
        let domain = domain.context("give --request FILE, or --domain and --descriptor")?;
        anyhow::ensure!(
            !descriptors.is_empty(),
            "give at least one --descriptor key=value[,key2=value2]"
        );
        let descriptors = descriptors
            .iter()
            .map(|d| descriptor_of(d))
            .collect::<anyhow::Result<_>>()?;
        Ok(Template::new(RateLimitRequest {
            domain: domain.to_owned(),
            descriptors,
            hits_addend: 0,
        }))
    }

    pub(crate) fn set_hits(&mut self, hits: u32) {
        self.base.hits_addend = hits;
    }

    /// Spreads one key; fails when no entry of the request has it.
    pub(crate) fn set_spread(&mut self, spread: Spread) -> anyhow::Result<()> {
        let present = self
            .base
            .descriptors
            .iter()
            .flat_map(|d| &d.entries)
            .any(|e| e.key == spread.key);
        anyhow::ensure!(
            present,
            "--spread {}: no entry of the request has this key",
            spread.key
        );
        self.spread = Some(spread);
        Ok(())
    }

    /// The request as sent before any spread.
    pub fn base(&self) -> &RateLimitRequest {
        &self.base
    }

    /// The next request to send.
    pub fn make(&self, rng: &mut Rng) -> RateLimitRequest {
        let mut request = self.base.clone();
        if let Some(spread) = &self.spread {
            for entry in request
                .descriptors
                .iter_mut()
                .flat_map(|d| d.entries.iter_mut())
                .filter(|e| e.key == spread.key)
            {
                entry.value = format!("{}-{}", spread.key, spread.draw(rng));
            }
        }
        request
    }
}

/// `key=value,key2=value2` as one descriptor.
fn descriptor_of(text: &str) -> anyhow::Result<RateLimitDescriptor> {
    let entries = text
        .split(',')
        .map(|pair| {
            let (key, value) = pair
                .split_once('=')
                .with_context(|| format!("--descriptor {text:?}: expected key=value pairs"))?;
            anyhow::ensure!(!key.is_empty(), "--descriptor {text:?}: empty key");
            Ok(Entry {
                key: key.to_owned(),
                value: value.to_owned(),
            })
        })
        .collect::<anyhow::Result<_>>()?;
    Ok(RateLimitDescriptor {
        entries,
        ..Default::default()
    })
}

/// A YAML (or JSON) document as JSON.
fn json_of_yaml(text: &str) -> anyhow::Result<Value> {
    let docs = Yaml::load_from_str(text).map_err(|e| anyhow::anyhow!("invalid YAML: {e}"))?;
    let [doc] = docs.as_slice() else {
        anyhow::bail!("expected exactly one YAML document, found {}", docs.len());
    };
    json_of(doc)
}

fn json_of(node: &Yaml<'_>) -> anyhow::Result<Value> {
    Ok(match node {
        Yaml::Value(scalar) => scalar_json(scalar),
        Yaml::Representation(text, ..) => Value::String(text.to_string()),
        Yaml::Sequence(items) => Value::Array(items.iter().map(json_of).collect::<Result<_, _>>()?),
        Yaml::Mapping(map) => {
            let mut out = Map::new();
            for (k, v) in map {
                let key = match k {
                    Yaml::Value(Scalar::String(s)) => s.to_string(),
                    Yaml::Value(other) => scalar_json(other).to_string(),
                    _ => anyhow::bail!("mapping keys must be plain scalars"),
                };
                out.insert(key, json_of(v)?);
            }
            Value::Object(out)
        }
        Yaml::Tagged(_, inner) => json_of(inner)?,
        _ => anyhow::bail!("unsupported YAML node (aliases and bad values are refused)"),
    })
}

fn scalar_json(scalar: &Scalar<'_>) -> Value {
    match scalar {
        Scalar::Null => Value::Null,
        Scalar::Boolean(b) => Value::Bool(*b),
        Scalar::Integer(i) => Value::Number((*i).into()),
        Scalar::FloatingPoint(f) => {
            Number::from_f64(f.into_inner()).map_or(Value::Null, Value::Number)
        }
        Scalar::String(s) => Value::String(s.to_string()),
    }
}

/// The Throttle request of a load (`--throttle KEY`), with `--spread KEY=N` spreading its
/// key over `KEY-0` .. `KEY-(N-1)`.
#[derive(Debug)]
pub struct ThrottleTemplate {
    pub base: crate::proto::sluice::v1::ThrottleRequest,
    pub spread: Option<Spread>,
}

impl ThrottleTemplate {
    /// The next request to send.
    pub fn make(&self, rng: &mut Rng) -> crate::proto::sluice::v1::ThrottleRequest {
        use crate::proto::sluice::v1::throttle_key::Id;
        let mut request = self.base.clone();
        if let Some(spread) = &self.spread {
            for key in &mut request.keys {
                if matches!(&key.id, Some(Id::Key(k)) if *k == spread.key) {
                    key.id = Some(Id::Key(format!("{}-{}", spread.key, spread.draw(rng))));
                }
            }
        }
        request
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_make_a_request() {
        let t = Template::from_flags(Some("d"), &["a=1,b=".to_owned(), "c=x=y".to_owned()])
            .expect("valid flags");
        let r = t.base();
        assert_eq!(r.domain, "d");
        assert_eq!(r.descriptors.len(), 2);
        assert_eq!(r.descriptors[0].entries[1].value, "");
        assert_eq!(r.descriptors[1].entries[0].value, "x=y");
        assert!(Template::from_flags(Some("d"), &["novalue".to_owned()]).is_err());
        assert!(Template::from_flags(None, &["a=1".to_owned()]).is_err());
    }

    #[test]
    fn yaml_and_json_files_read_alike() {
        let yaml =
            "domain: d\nhitsAddend: 2\ndescriptors:\n  - entries:\n      - {key: k, value: v}\n";
        let json = r#"{"domain":"d","hits_addend":"2","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}"#;
        let dir = tempfile::tempdir().expect("a temporary directory");
        let (a, b) = (dir.path().join("r.yaml"), dir.path().join("r.json"));
        std::fs::write(&a, yaml).expect("write");
        std::fs::write(&b, json).expect("write");
        let a = Template::from_file(&a).expect("valid YAML request");
        let b = Template::from_file(&b).expect("valid JSON request");
        assert_eq!(a.base(), b.base());
        assert_eq!(a.base().hits_addend, 2);
    }

    #[test]
    fn spread_draws_within_range_and_in_sequence() {
        let mut t = Template::from_flags(Some("d"), &["user=x,path=/".to_owned()]).expect("ok");
        assert!(
            t.set_spread(Spread::new("nope", 3, SpreadOrder::Random))
                .is_err()
        );
        t.set_spread(Spread::new("user", 3, SpreadOrder::Sequential))
            .expect("key present");
        let mut rng = Rng::new(1);
        let values: Vec<String> = (0..4)
            .map(|_| t.make(&mut rng).descriptors[0].entries[0].value.clone())
            .collect();
        assert_eq!(values, ["user-0", "user-1", "user-2", "user-0"]);
        let mut t = Template::from_flags(Some("d"), &["user=x".to_owned()]).expect("ok");
        t.set_spread(Spread::parse("user=10", SpreadOrder::Random).expect("valid"))
            .expect("key present");
        for _ in 0..100 {
            let v = t.make(&mut rng).descriptors[0].entries[0].value.clone();
            let n: u64 = v.trim_start_matches("user-").parse().expect("a number");
            assert!(n < 10);
        }
    }
}
