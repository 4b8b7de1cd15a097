//! Tenants' variables: configuration and secrets their guests read through the APIs they
//! already use (Spin's variables, `wasi:config/store`, a CGI program's environment).
//!
//! A variable is plain or secret. Plain ones are shown by the admin API; a secret never is:
//! the API lists its name, a digest and when it was set. Secrets are sealed at rest (in the
//! data directory's manifest and a fleet's registry) under the secrets key ([`seal`]), held
//! in memory as [`Secret`] (whose `Debug` and `Display` show no value), and opened only for
//! the guest that asks. A config-file tenant's secrets come from the server's environment or
//! files (`{ secret_env = "NAME" }`, `{ secret_file = "path" }`), never from the file itself.
//!
//! Setting a variable changes no version: the [`Table`] every tenant's guests read follows
//! the registry, so the next request sees it (on every replica of a fleet once it has read
//! the registry). A tenant whose secrets this server cannot open (another key) still serves,
//! and its guests' reads fail with a provider error that says so (never a wrong value).

pub mod env;
pub mod seal;
mod table;
mod value;

pub use env::{Env, EnvValue};
pub use seal::SecretsKey;
pub use table::{Declared, Grant, SecretFrom, Sources, Stored, Table, check_declared};
pub use value::{
    Found, MAX_NAME_BYTES, MAX_VALUE_BYTES, MAX_VARIABLES, Secret, Value, Values, check_name,
    check_value,
};

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use super::table::resolve_declared;
    use super::*;

    #[test]
    fn names_follow_spins_rule() {
        for ok in ["a", "api_key", "region2", "a_b_c"] {
            assert!(check_name(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "A",
            "1a",
            "_a",
            "a_",
            "a__b",
            "a-b",
            "é",
            &"a".repeat(65),
        ] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
        assert!(check_value("a", &"x".repeat(MAX_VALUE_BYTES)).is_ok());
        assert!(check_value("a", &"x".repeat(MAX_VALUE_BYTES + 1)).is_err());
    }

    #[test]
    fn secrets_show_no_value() {
        let s = Secret::new("sk-live-1".into());
        assert!(!format!("{s:?} {s} {:?}", Value::Secret(s.clone())).contains("sk-live"));
        assert_eq!(s.expose(), "sk-live-1");
    }

    #[test]
    fn the_table_follows_its_sources_and_says_what_it_cannot_open() {
        let key = SecretsKey::new(&[7; 32], None, "test".into());
        let table = Arc::new(Table::default());
        let granted = Grant::new("t", table.clone());
        assert_eq!(granted.values().get("a"), Found::Undefined);
        let mut stored = BTreeMap::new();
        stored.insert(
            "a".to_string(),
            Stored::Plain {
                value: "1".into(),
                updated_at: 0,
            },
        );
        stored.insert(
            "s".to_string(),
            Stored::Secret {
                sealed: key.seal("t", "s", "hush"),
                digest: key.digest("t", "s", "hush"),
                updated_at: 0,
            },
        );
        let dir = std::path::Path::new("/");
        let sources = |api| Sources {
            file: vec![],
            base_dir: dir,
            api,
            reread_file: false,
        };
        assert!(
            table
                .follow(&sources(vec![("t".into(), "t", &stored)]), Some(&key))
                .is_empty()
        );
        let values = granted.values();
        assert_eq!(values.get("a"), Found::Value("1"));
        assert_eq!(values.get("s"), Found::Value("hush"));
        assert_eq!(values.get("b"), Found::Undefined);
        // Unchanged sources keep their values (nothing is opened again).
        table.follow(&sources(vec![("t".into(), "t", &stored)]), Some(&key));
        assert!(Arc::ptr_eq(&values, &granted.values()));
        // Another key opens nothing and says so.
        let other = SecretsKey::new(&[8; 32], None, "test".into());
        let fresh = Table::default();
        let why = fresh.follow(&sources(vec![("t".into(), "t", &stored)]), Some(&other));
        assert_eq!(why.len(), 1);
        assert!(matches!(
            fresh.of("t").unwrap().get("a"),
            Found::Unavailable(_)
        ));
        // A tenant gone is dropped.
        table.follow(&sources(vec![]), Some(&key));
        // Without a key (a fleet's replica not given one) secrets say why they cannot be read.
        let keyless = Table::default();
        let why = keyless.follow(&sources(vec![("t".into(), "t", &stored)]), None);
        assert!(why[0].1.contains("TERN_SECRETS_KEY"), "{why:?}");
        assert_eq!(granted.values().get("a"), Found::Undefined);
    }

    #[test]
    fn declared_secrets_come_from_the_environment_or_files() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("pw"), "from-file\n").unwrap();
        let mut declared = BTreeMap::new();
        declared.insert("plain".to_string(), Declared::Plain("p".into()));
        declared.insert(
            "pw".to_string(),
            Declared::Secret(SecretFrom {
                secret_env: None,
                secret_file: Some("pw".into()),
            }),
        );
        assert!(check_declared(&declared).is_ok());
        let v = resolve_declared(&declared, dir.path());
        assert_eq!(v.get("pw"), Found::Value("from-file"));
        assert_eq!(v.get("plain"), Found::Value("p"));
        declared.insert(
            "gone".to_string(),
            Declared::Secret(SecretFrom {
                secret_env: Some("TERN_TEST_NO_SUCH_VARIABLE".into()),
                secret_file: None,
            }),
        );
        let v = resolve_declared(&declared, dir.path());
        assert!(
            matches!(v.get("plain"), Found::Unavailable(w) if w.contains("TERN_TEST_NO_SUCH_VARIABLE"))
        );
        declared.insert(
            "both".to_string(),
            Declared::Secret(SecretFrom {
                secret_env: Some("A".into()),
                secret_file: Some("b".into()),
            }),
        );
        assert!(check_declared(&declared).is_err());
    }
}
