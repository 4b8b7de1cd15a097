//! What every backend must do alike, run against each by its own tests (a real SQLite file, a
//! real Redis server): tenants apart, limits, atomic increments and compare-and-swap, listing.

use std::sync::Arc;

use super::op::{KvError, Op, Reply};
use super::store::Store;

/// Operations of tenants `a` and `b` on `s`, a store configured with `max_keys_per_tenant = 2`,
/// `max_bytes_per_tenant = 20`, `max_key_bytes = 4`, `max_value_bytes = 8`, holding nothing of
/// theirs. Leaves `a` with `n` and `x` = `1`.
pub async fn operations(s: &Arc<Store>) {
    let (a, b): (Arc<str>, Arc<str>) = ("a".into(), "b".into());
    let run = |t: &Arc<str>, op| {
        let (s, t) = (s.clone(), t.clone());
        async move { s.run(&t, op).await }
    };
    assert_eq!(
        run(&a, Op::Get(b"k".to_vec())).await.unwrap(),
        Reply::Value(None)
    );
    run(&a, Op::Set(b"k".to_vec(), b"v1".to_vec()))
        .await
        .unwrap();
    // Tenant b does not see a's key, even in the same store.
    assert_eq!(
        run(&b, Op::Get(b"k".to_vec())).await.unwrap(),
        Reply::Value(None)
    );
    assert_eq!(
        run(&a, Op::Get(b"k".to_vec())).await.unwrap(),
        Reply::Value(Some(b"v1".to_vec()))
    );
    assert_eq!(
        run(&a, Op::Increment(b"n".to_vec(), 5)).await.unwrap(),
        Reply::Integer(5)
    );
    assert_eq!(
        run(&a, Op::Increment(b"n".to_vec(), -7)).await.unwrap(),
        Reply::Integer(-2)
    );
    assert!(matches!(
        run(&a, Op::Increment(b"k".to_vec(), 1)).await,
        Err(KvError::Invalid(_))
    ));
    // Two keys held: a third is over max_keys_per_tenant, nothing written.
    assert!(matches!(
        run(&a, Op::Set(b"x".to_vec(), b"1".to_vec())).await,
        Err(KvError::Limit(_))
    ));
    assert_eq!(
        run(&a, Op::Exists(b"x".to_vec())).await.unwrap(),
        Reply::Bool(false)
    );
    // Replacing a value within the byte limit works; past it, refused.
    run(&a, Op::Set(b"k".to_vec(), b"12345678".to_vec()))
        .await
        .unwrap();
    assert!(matches!(
        run(&a, Op::Set(b"k".to_vec(), b"123456789".to_vec())).await,
        Err(KvError::Limit(_))
    ));
    assert!(matches!(
        run(&a, Op::Set(b"12345".to_vec(), b"1".to_vec())).await,
        Err(KvError::Limit(_))
    ));
    assert!(matches!(
        run(&a, Op::Set(Vec::new(), b"1".to_vec())).await,
        Err(KvError::Invalid(_))
    ));
    // Compare-and-swap: expected value, expected absence.
    let cas = |key: &[u8], expected: Option<&[u8]>, new: &[u8]| Op::CompareAndSwap {
        key: key.to_vec(),
        expected: expected.map(<[u8]>::to_vec),
        new: new.to_vec(),
    };
    assert_eq!(
        run(&a, cas(b"n", Some(b"-1"), b"0")).await.unwrap(),
        Reply::Bool(false)
    );
    assert_eq!(
        run(&a, cas(b"n", Some(b"-2"), b"0")).await.unwrap(),
        Reply::Bool(true)
    );
    assert_eq!(
        run(&b, cas(b"n", None, b"b")).await.unwrap(),
        Reply::Bool(true)
    );
    assert_eq!(
        run(&b, cas(b"n", None, b"c")).await.unwrap(),
        Reply::Bool(false)
    );
    // Deleting frees the key for another.
    run(&a, Op::Delete(b"k".to_vec())).await.unwrap();
    run(&a, Op::Set(b"x".to_vec(), b"1".to_vec()))
        .await
        .unwrap();
    assert_eq!(
        run(
            &a,
            Op::List {
                after: None,
                limit: 10
            }
        )
        .await
        .unwrap(),
        Reply::Keys(vec![b"n".to_vec(), b"x".to_vec()])
    );
    assert_eq!(
        run(
            &a,
            Op::List {
                after: Some(b"n".to_vec()),
                limit: 10
            }
        )
        .await
        .unwrap(),
        Reply::Keys(vec![b"x".to_vec()])
    );
}

/// 500 increments at once from two worker threads: each sees its own value, none is lost.
pub async fn parallel_increments(s: Arc<Store>) {
    let tenant: Arc<str> = "t".into();
    let tasks: Vec<_> = (0..500)
        .map(|_| {
            let (s, t) = (s.clone(), tenant.clone());
            tokio::spawn(async move { s.run(&t, Op::Increment(b"c".to_vec(), 1)).await })
        })
        .collect();
    let mut seen = Vec::new();
    for t in tasks {
        match t.await.expect("task").expect("increment") {
            Reply::Integer(n) => seen.push(n),
            other => panic!("{other:?}"),
        }
    }
    seen.sort_unstable();
    assert_eq!(seen, (1..=500).collect::<Vec<i64>>());
    assert_eq!(
        s.run(&tenant, Op::Get(b"c".to_vec())).await.expect("get"),
        Reply::Value(Some(b"500".to_vec()))
    );
}
