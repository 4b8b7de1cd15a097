//! How a `[[tenant]]` table is read: its own keys (name, module, kind, assets, variables) and the
//! shared [`TenantSettings`] at the same level, each value with its place in the file.

use serde::Deserialize;
use toml::Spanned;

use super::tenant::{GuestKind, TenantConfig, TenantSettings};

/// The keys of a `[[tenant]]` table that are the file's own, not [`TenantSettings`].
const FILE_ONLY: [&str; 5] = ["name", "module", "kind", "assets", "variables"];

/// The keys of [`TenantSettings`], as the file and the admin API write them: its fields, as
/// serde names them (a new setting is a field there and nothing here).
pub fn settings_keys() -> &'static [&'static str] {
    static KEYS: std::sync::LazyLock<&'static [&'static str]> =
        std::sync::LazyLock::new(struct_fields::<TenantSettings<String>>);
    &KEYS
}

/// Every key of a `[[tenant]]` table, for the message about an unknown one: the file's own,
/// then the settings'.
fn tenant_keys() -> &'static [&'static str] {
    static KEYS: std::sync::LazyLock<&'static [&'static str]> = std::sync::LazyLock::new(|| {
        let keys: Vec<&'static str> = FILE_ONLY.iter().chain(settings_keys()).copied().collect();
        Vec::leak(keys)
    });
    &KEYS
}

/// The fields of struct `T` as its derived `Deserialize` names them (it hands them to
/// `deserialize_struct`, asked here and then refused).
fn struct_fields<T: serde::de::DeserializeOwned>() -> &'static [&'static str] {
    use serde::de::{Error as _, Visitor, value::Error};

    struct Ask<'f>(&'f mut &'static [&'static str]);

    impl<'de> serde::Deserializer<'de> for Ask<'_> {
        type Error = Error;

        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Error> {
            Err(Error::custom("not a struct"))
        }

        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Error> {
            *self.0 = fields;
            Err(Error::custom("asked for its fields only"))
        }

        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
            option unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier
            ignored_any
        }
    }

    let mut fields: &'static [&'static str] = &[];
    let _ = T::deserialize(Ask(&mut fields));
    fields
}

impl<'de> Deserialize<'de> for TenantConfig {
    /// A `[[tenant]]` table: the file's own keys taken here, every other key handed to
    /// [`TenantSettings`]' own deserializer as the table's next key. (`serde(flatten)` would
    /// buffer the table: `deny_unknown_fields` and the spans of `Spanned` values, which name the
    /// line of a bad value, would be lost.)
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(FileTenant)
    }
}

/// Reads a `[[tenant]]` table.
struct FileTenant;

/// The file's own keys of a `[[tenant]]` table, as they are read.
#[derive(Default)]
struct FileOnly {
    name: Option<Spanned<String>>,
    module: Option<Spanned<String>>,
    kind: Option<GuestKind>,
    assets: Option<Spanned<String>>,
    variables: Option<std::collections::BTreeMap<String, crate::variables::Declared>>,
}

impl<'de> serde::de::Visitor<'de> for FileTenant {
    type Value = TenantConfig;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a [[tenant]] table")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<TenantConfig, A::Error> {
        use serde::de::Error;
        let mut own = FileOnly::default();
        let settings =
            TenantSettings::deserialize(serde::de::value::MapAccessDeserializer::new(Settings {
                map,
                own: &mut own,
            }))?;
        Ok(TenantConfig {
            name: own.name.ok_or_else(|| A::Error::missing_field("name"))?,
            module: own
                .module
                .ok_or_else(|| A::Error::missing_field("module"))?,
            kind: own.kind,
            assets: own.assets,
            variables: own.variables.unwrap_or_default(),
            data: None,
            settings,
        })
    }
}

/// A `[[tenant]]` table as [`TenantSettings`] sees it: the file's own keys are taken into `own`
/// on the way.
struct Settings<'a, A> {
    map: A,
    own: &'a mut FileOnly,
}

/// A key of a `[[tenant]]` table: the file's own (with the unused seed `K` handed back), or
/// one for [`TenantSettings`].
enum Key<K, V> {
    Own(&'static str, K),
    Setting(V),
}

/// Reads a key of a `[[tenant]]` table; a settings key goes to `K`, inside the file's own key
/// deserializer (so an unknown key's error names its line).
struct KeySeed<K>(K);

impl<'de, K: serde::de::DeserializeSeed<'de>> serde::de::DeserializeSeed<'de> for KeySeed<K> {
    type Value = Key<K, K::Value>;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de, K: serde::de::DeserializeSeed<'de>> serde::de::Visitor<'de> for KeySeed<K> {
    type Value = Key<K, K::Value>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a key")
    }

    fn visit_str<E: serde::de::Error>(self, key: &str) -> Result<Self::Value, E> {
        use serde::de::IntoDeserializer;
        match FILE_ONLY.iter().find(|k| **k == key) {
            Some(own) => Ok(Key::Own(own, self.0)),
            None if settings_keys().contains(&key) => self
                .0
                .deserialize(key.into_deserializer())
                .map(Key::Setting),
            None => Err(E::unknown_field(key, tenant_keys())),
        }
    }
}

impl<'de, A: serde::de::MapAccess<'de>> serde::de::MapAccess<'de> for Settings<'_, A> {
    type Error = A::Error;

    fn next_key_seed<K: serde::de::DeserializeSeed<'de>>(
        &mut self,
        mut seed: K,
    ) -> Result<Option<K::Value>, A::Error> {
        loop {
            let own = match self.map.next_key_seed(KeySeed(seed))? {
                None => return Ok(None),
                Some(Key::Setting(key)) => return Ok(Some(key)),
                Some(Key::Own(own, unused)) => {
                    seed = unused;
                    own
                }
            };
            match own {
                "name" => self.own.name = Some(self.map.next_value()?),
                "module" => self.own.module = Some(self.map.next_value()?),
                "kind" => self.own.kind = Some(self.map.next_value()?),
                "variables" => self.own.variables = Some(self.map.next_value()?),
                _ => self.own.assets = Some(self.map.next_value()?),
            }
        }
    }

    fn next_value_seed<V: serde::de::DeserializeSeed<'de>>(
        &mut self,
        seed: V,
    ) -> Result<V::Value, A::Error> {
        self.map.next_value_seed(seed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tenant_keys_are_the_file_keys_and_the_settings_fields() {
        // serde names a struct's fields when it refuses an unknown one.
        let e = serde_json::from_str::<TenantSettings<String>>(r#"{"zz": 1}"#)
            .unwrap_err()
            .to_string();
        let listed: Vec<&str> = e.split('`').skip(3).step_by(2).collect();
        assert_eq!(listed, settings_keys(), "{e}");
        assert!(settings_keys().contains(&"hsts"));
        assert_eq!(tenant_keys()[..FILE_ONLY.len()], FILE_ONLY);
        assert_eq!(tenant_keys()[FILE_ONLY.len()..], *settings_keys());
    }
}
