//! A tenant's environment (`env`): what its guests' WASI environment holds. A value is plain
//! text (shown by the admin API, kept as it is) or taken from one of the tenant's variables
//! (`API_KEY = { variable = "api_key" }`), so a guest that reads its secrets from its
//! environment (most Go, Python and JavaScript code does) gets one without the secret ever
//! being in the tenant's spec: the spec, the API and the manifest hold only the variable's
//! name, and the value is read from the variables when the guest starts.

use std::borrow::Cow;
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::table::Grant;
use super::value::{Found, Values, check_name};

/// One `env` entry as the config file and the admin API write it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(
    untagged,
    expecting = "a string, or { variable = \"name\" } to take the value from one of the tenant's variables"
)]
pub enum EnvValue {
    /// `KEY = "value"`: plain text.
    Text(String),
    /// `KEY = { variable = "name" }`: the value of the tenant's variable `name` (plain or secret).
    Variable(FromVariable),
}

/// `{ variable = "name" }`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FromVariable {
    /// The variable's name.
    pub variable: String,
}

impl From<&str> for EnvValue {
    fn from(s: &str) -> Self {
        Self::Text(s.to_string())
    }
}

/// Checks a tenant's `env`: names (not empty, no `=` or NUL), text values (no NUL), and the
/// variable names referenced (Spin's rule). A referenced variable need not exist: until it
/// does, its entry is left out of the environment.
///
/// # Errors
/// The first problem, in words for the operator.
pub fn check_env(env: &BTreeMap<String, EnvValue>) -> Result<(), String> {
    for (k, v) in env {
        if k.is_empty() || k.contains('=') || k.contains('\0') {
            return Err(format!("env name {k:?} is invalid"));
        }
        match v {
            EnvValue::Text(t) if t.contains('\0') => {
                return Err(format!("env {k:?}: a value may not contain NUL"));
            }
            EnvValue::Text(_) => {}
            EnvValue::Variable(FromVariable { variable }) => {
                check_name(variable).map_err(|e| format!("env {k:?}: {e}"))?;
            }
        }
    }
    Ok(())
}

/// A tenant's environment prepared when it loads: the plain entries as guests get them, and
/// the entries read from variables at each guest's start.
#[derive(Debug, Default)]
pub struct Env {
    text: Vec<(String, String)>,
    /// (environment name, variable name).
    from_variables: Vec<(String, String)>,
}

impl Env {
    /// From a tenant's `env` setting.
    pub fn new(env: &BTreeMap<String, EnvValue>) -> Self {
        let mut prepared = Self::default();
        for (k, v) in env {
            match v {
                EnvValue::Text(t) => prepared.text.push((k.clone(), t.clone())),
                EnvValue::Variable(FromVariable { variable }) => {
                    prepared.from_variables.push((k.clone(), variable.clone()));
                }
            }
        }
        prepared
    }

    /// Plain entries only (tests, and tenants with no variables in their environment).
    pub fn text(text: Vec<(String, String)>) -> Self {
        Self {
            text,
            from_variables: Vec::new(),
        }
    }

    /// The environment now, reading `variables` only if an entry comes from one (most tenants
    /// pay nothing for this).
    pub fn resolve(&self, variables: &Grant) -> Cow<'_, [(String, String)]> {
        if self.from_variables.is_empty() {
            return Cow::Borrowed(&self.text);
        }
        Cow::Owned(self.with(&variables.values()).into_owned())
    }

    /// The environment with `values` as the tenant's variables: an entry whose variable is
    /// undefined (or a secret this server cannot open) is left out, never empty or wrong.
    /// Borrowed (no copy) when no entry comes from a variable.
    pub fn with(&self, values: &Values) -> Cow<'_, [(String, String)]> {
        if self.from_variables.is_empty() {
            return Cow::Borrowed(&self.text);
        }
        let mut env = self.text.clone();
        for (k, variable) in &self.from_variables {
            if let Found::Value(v) = values.get(variable) {
                env.push((k.clone(), v.to_string()));
            }
        }
        Cow::Owned(env)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_is_text_or_a_variable_and_nothing_else() {
        let env: BTreeMap<String, EnvValue> =
            toml::from_str("A = \"1\"\nB = { variable = \"api_key\" }\n").unwrap();
        assert_eq!(env["A"], EnvValue::Text("1".into()));
        assert_eq!(
            env["B"],
            EnvValue::Variable(FromVariable {
                variable: "api_key".into()
            })
        );
        check_env(&env).unwrap();
        let json = serde_json::to_value(&env).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"A": "1", "B": {"variable": "api_key"}})
        );
        for bad in [
            "A = { value = \"x\" }",
            "A = { variable = \"x\", y = 1 }",
            "A = 3",
        ] {
            let e = toml::from_str::<BTreeMap<String, EnvValue>>(bad).unwrap_err();
            assert!(
                e.to_string().contains("{ variable = \"name\" }"),
                "{bad}: {e}"
            );
        }
        let bad: BTreeMap<String, EnvValue> = toml::from_str("A = { variable = \"Api\" }").unwrap();
        assert!(check_env(&bad).unwrap_err().contains("not a variable name"));
    }

    #[test]
    fn an_entry_from_a_missing_variable_is_left_out() {
        let env: BTreeMap<String, EnvValue> = toml::from_str(
            "A = \"1\"\nKEY = { variable = \"api_key\" }\nGONE = { variable = \"gone\" }\n",
        )
        .unwrap();
        let env = Env::new(&env);
        let values = Values {
            values: [(
                "api_key".to_string(),
                super::super::Value::Secret(super::super::Secret::new("s3cret".into())),
            )]
            .into(),
            unreadable: None,
        };
        assert_eq!(
            *env.with(&values),
            [
                ("A".to_string(), "1".to_string()),
                ("KEY".to_string(), "s3cret".to_string())
            ]
        );
        let unreadable = Values {
            values: BTreeMap::new(),
            unreadable: Some("another key".into()),
        };
        assert_eq!(*env.with(&unreadable), [("A".into(), "1".into())]);
    }
}
