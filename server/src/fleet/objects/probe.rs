//! The probe: does a store keep the promises a fleet's registry rests on (conditional
//! creates and updates, refused when their precondition fails, under racing writers)?

use std::sync::Arc;

use object_store::path::Path;
use object_store::{
    GetOptions, ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload, UpdateVersion,
};

/// One check of [`probe`].
#[derive(Debug, Clone)]
pub struct Check {
    /// Its name.
    pub name: &'static str,
    /// Whether the store passed it.
    pub passed: bool,
    /// What was seen.
    pub detail: String,
}

/// How many writers race in the concurrency checks.
const RACERS: usize = 8;

/// Checks that `store` honours conditional writes under `prefix` (in a scratch directory it
/// removes): a second create of a name is refused, an update with a stale version is refused,
/// a conditional read of an unchanged object answers "not modified", and of writers racing to
/// create one name, or to update one version, exactly one wins. Returns every check; the store
/// is fit for a registry only if all passed.
///
/// # Errors
/// If the store cannot be reached or refuses ordinary reads and writes (credentials, a missing
/// bucket): nothing could be checked.
pub async fn probe(store: &Arc<dyn ObjectStore>, prefix: &Path) -> Result<Vec<Check>, String> {
    let scratch = prefix
        .clone()
        .join(format!(".tern-probe-{}", crate::hex::random_id::<8>()));
    let result = checks(store, &scratch).await;
    // The scratch objects go, whatever happened.
    for name in ["created", "updated", "read", "create-race", "update-race"] {
        let _ = store.delete(&scratch.clone().join(name)).await;
    }
    result
}

async fn checks(store: &Arc<dyn ObjectStore>, scratch: &Path) -> Result<Vec<Check>, String> {
    let put = |path: Path, bytes: &'static str, mode: PutMode| {
        let store = store.clone();
        async move {
            let opts = PutOptions {
                mode,
                ..PutOptions::default()
            };
            store
                .put_opts(&path, PutPayload::from_static(bytes.as_bytes()), opts)
                .await
        }
    };
    let reach = |e: object_store::Error| format!("cannot write to the store: {e}");
    let mut out = Vec::new();

    // 1. Create if absent.
    let path = scratch.clone().join("created");
    put(path.clone(), "first", PutMode::Create)
        .await
        .map_err(reach)?;
    let second = put(path.clone(), "second", PutMode::Create).await;
    out.push(Check {
        name: "create-if-absent",
        passed: matches!(second, Err(object_store::Error::AlreadyExists { .. })),
        detail: match second {
            Err(object_store::Error::AlreadyExists { .. }) => {
                "a second create of the same name is refused (If-None-Match: *)".into()
            }
            Ok(_) => "a second create of the same name SUCCEEDED: the store ignores \
                      If-None-Match: *, so two writers could both think they created it"
                .into(),
            Err(e) => format!("a second create failed with an unexpected error: {e}"),
        },
    });

    // 2. Update if unchanged.
    let path = scratch.clone().join("updated");
    let v1 = put(path.clone(), "v1", PutMode::Overwrite)
        .await
        .map_err(reach)?;
    let v1 = UpdateVersion::from(v1);
    let v2 = put(path.clone(), "v2", PutMode::Update(v1.clone())).await;
    let stale = put(path.clone(), "v3", PutMode::Update(v1)).await;
    out.push(Check {
        name: "update-if-match",
        passed: v2.is_ok() && matches!(stale, Err(object_store::Error::Precondition { .. })),
        detail: match (&v2, &stale) {
            (Ok(_), Err(object_store::Error::Precondition { .. })) => {
                "an update with the current version succeeds, with a stale one is refused \
                 (If-Match)"
                    .into()
            }
            (Err(e), _) => format!("an update with the current version failed: {e}"),
            (Ok(_), Ok(_)) => "an update with a stale version SUCCEEDED: the store ignores \
                               If-Match, so a concurrent change could be lost"
                .into(),
            (Ok(_), Err(e)) => format!("a stale update failed with an unexpected error: {e}"),
        },
    });

    // 3. Conditional read.
    let path = scratch.clone().join("read");
    let written = put(path.clone(), "same", PutMode::Overwrite)
        .await
        .map_err(reach)?;
    let read = store
        .get_opts(
            &path,
            GetOptions {
                if_none_match: written.e_tag.clone(),
                ..GetOptions::default()
            },
        )
        .await;
    out.push(Check {
        name: "conditional-read",
        passed: matches!(read, Err(object_store::Error::NotModified { .. })),
        detail: match read {
            Err(object_store::Error::NotModified { .. }) => {
                "reading an unchanged object with its ETag answers 304 Not Modified".into()
            }
            Ok(_) => "reading an unchanged object with If-None-Match returned it again: \
                      watching costs a full read each time"
                .into(),
            Err(e) => format!("a conditional read failed: {e}"),
        },
    });

    // 4. Writers racing to create one name: one wins.
    let path = scratch.clone().join("create-race");
    let races =
        futures_join((0..RACERS).map(|_| put(path.clone(), "racer", PutMode::Create))).await;
    let won = races.iter().filter(|r| r.is_ok()).count();
    out.push(Check {
        name: "create-race",
        passed: won == 1,
        detail: format!("{RACERS} writers created one name at once: {won} succeeded (1 must)"),
    });

    // 5. Writers racing to update one version: one wins.
    let path = scratch.clone().join("update-race");
    let base = UpdateVersion::from(
        put(path.clone(), "base", PutMode::Overwrite)
            .await
            .map_err(reach)?,
    );
    let races = futures_join(
        (0..RACERS).map(|_| put(path.clone(), "racer", PutMode::Update(base.clone()))),
    )
    .await;
    let won = races.iter().filter(|r| r.is_ok()).count();
    out.push(Check {
        name: "update-race",
        passed: won == 1,
        detail: format!("{RACERS} writers updated one version at once: {won} succeeded (1 must)"),
    });
    Ok(out)
}

/// Runs `futures` at once, each on its own task, and returns their results.
async fn futures_join<F>(futures: impl Iterator<Item = F>) -> Vec<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send,
{
    let mut set = tokio::task::JoinSet::new();
    for f in futures {
        set.spawn(f);
    }
    set.join_all().await
}
