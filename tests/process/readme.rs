//! docs/settings.md documents every setting: each key of every section, read from the settings
//! types themselves, has a row in its "Settings" table with its file key and its `SLUICE_*`
//! environment name, and the table names no key that does not exist. (README.md links there.)

use serde::Deserialize as _;
use serde::de::value::{Error, MapDeserializer, StrDeserializer};
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, Visitor};
use sluice::config::settings::Settings;

/// A deserializer that only records what serde's derived code asks for: the field names of
/// each struct. At the top (`Settings`, `section` none) it offers every field, each read by
/// a `Fields` for that section; a section is offered no field, so it takes its defaults.
struct Fields<'a> {
    section: Option<&'static str>,
    found: &'a mut Vec<String>,
}

impl<'de> Deserializer<'de> for Fields<'_> {
    type Error = Error;

    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Error> {
        Err(de::Error::custom("the settings are sections of keys"))
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        let Some(section) = self.section else {
            return visitor.visit_map(Sections {
                names: fields.iter(),
                current: None,
                found: self.found,
            });
        };
        let keys = fields.iter().map(|key| format!("{section}.{key}"));
        self.found.extend(keys);
        visitor.visit_map(MapDeserializer::<_, Error>::new(std::iter::empty::<(
            &str,
            &str,
        )>()))
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier
        ignored_any
    }
}

/// The top-level map: each section by name, its value read by a section's `Fields`.
struct Sections<'a> {
    names: std::slice::Iter<'static, &'static str>,
    current: Option<&'static str>,
    found: &'a mut Vec<String>,
}

impl<'de> MapAccess<'de> for Sections<'_> {
    type Error = Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Error> {
        let Some(&name) = self.names.next() else {
            return Ok(None);
        };
        self.current = Some(name);
        seed.deserialize(StrDeserializer::<Error>::new(name))
            .map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Error> {
        seed.deserialize(Fields {
            section: self.current,
            found: &mut *self.found,
        })
    }
}

/// Every `section.key` of the settings, in declaration order.
fn setting_keys() -> Vec<String> {
    let mut found = Vec::new();
    let settings = Settings::deserialize(Fields {
        section: None,
        found: &mut found,
    })
    .expect("the settings types are read");
    assert_eq!(settings, Settings::default());
    found
}

/// The rows of docs/settings.md's "Settings" table: `(key, env)` from the first two cells.
fn documented() -> Vec<(String, String)> {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/settings.md"))
        .expect("docs/settings.md");
    let section = doc
        .split("\n## ")
        .find(|s| s.starts_with("Settings\n"))
        .expect("a Settings section in docs/settings.md");
    section
        .lines()
        .filter_map(|line| {
            let mut cells = line.strip_prefix("| `")?.split(" | ");
            let key = cells.next()?.strip_suffix('`')?;
            let env = cells.next()?;
            Some((key.to_owned(), env.to_owned()))
        })
        .collect()
}

#[test]
fn every_setting_has_a_row_with_its_key_and_environment_name() {
    let keys = setting_keys();
    assert!(keys.len() > 40, "{keys:?}");
    assert!(
        keys.contains(&"redis.deny_cache_size".to_owned()),
        "{keys:?}"
    );
    let rows = documented();
    for key in &keys {
        let env = format!("`SLUICE_{}`", key.to_uppercase().replace('.', "__"));
        let row = rows.iter().find(|(k, _)| k == key);
        let Some((_, documented_env)) = row else {
            panic!("docs/settings.md's Settings table has no row for `{key}`");
        };
        assert!(
            documented_env.starts_with(&env),
            "`{key}`: docs/settings.md gives {documented_env}, not {env}"
        );
    }
    for (key, _) in &rows {
        assert!(
            keys.contains(key),
            "docs/settings.md documents `{key}`, not a setting"
        );
    }
}
