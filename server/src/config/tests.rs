//! The configuration's unit tests.

use super::*;

#[test]
fn hsts_is_checked_and_rendered_as_browsers_read_it() {
    let h = |max_age_seconds, include_subdomains, preload| HstsConfig {
        max_age_seconds,
        include_subdomains,
        preload,
    };
    assert_eq!(h(300, false, false).value(), "max-age=300");
    assert_eq!(
        h(31_536_000, true, true).value(),
        "max-age=31536000; includeSubDomains; preload"
    );
    assert!(h(0, false, false).check().is_ok(), "0 clears it");
    assert!(h(MAX_HSTS_SECONDS, false, false).check().is_ok());
    assert!(h(MAX_HSTS_SECONDS + 1, false, false).check().is_err());
    assert!(h(31_536_000, true, true).check().is_ok());
    assert!(
        h(31_535_999, true, true).check().is_err(),
        "a year at least"
    );
    assert!(
        h(31_536_000, false, true).check().is_err(),
        "subdomains needed"
    );
    let e = err(
        "[[tenant]]\nname = \"t\"\nmodule = \"builtin:hello\"\n[tenant.hsts]\n\
         max_age_seconds = 10\npreload = true\n",
    );
    assert!(e.contains("hsts.preload"), "{e}");
}

#[test]
fn acme_names_are_dns_names_without_wildcards_addresses_or_ports() {
    assert!(acme_name("a.example.com").is_ok());
    assert!(acme_name("xn--bcher-kva.example").is_ok());
    for bad in [
        "*.example.com",
        "127.0.0.1",
        "::1",
        "a.test:443",
        "localhost",
        "-a.test",
        "a..test",
        "a_b.test",
    ] {
        assert!(acme_name(bad).is_err(), "{bad}");
    }
}

fn err(text: &str) -> String {
    Config::parse(text, "t.toml", PathBuf::new())
        .unwrap_err()
        .to_string()
}

#[test]
fn memory_slots_are_as_many_as_instances_or_more() {
    let slots = |text: &str| {
        Config::parse(text, "t.toml", PathBuf::new())
            .unwrap()
            .pool
            .memory_slots()
    };
    assert_eq!(slots(""), 256);
    assert_eq!(slots("[pool]\ninstances = 8\n"), 8);
    assert_eq!(slots("[pool]\ninstances = 8\nmemory_slots = 8\n"), 8);
    assert_eq!(slots("[pool]\ninstances = 8\nmemory_slots = 9\n"), 9);
    let max = format!("[pool]\nmemory_slots = {MAX_MEMORY_SLOTS}\n");
    assert_eq!(slots(&max), MAX_MEMORY_SLOTS);
    for bad in [
        "[pool]\ninstances = 8\nmemory_slots = 7\n".to_string(),
        format!("[pool]\nmemory_slots = {}\n", MAX_MEMORY_SLOTS + 1),
    ] {
        assert!(
            err(&bad).contains("pool.memory_slots must be 0 (as many as pool.instances) or"),
            "{bad}"
        );
    }
}

#[test]
fn a_shared_registry_is_an_s3_url_polled_at_a_positive_interval() {
    let ok = Config::parse(
        "[registry]\nurl = \"s3://bucket/prefix\"\npoll_interval_ms = 250\n",
        "t.toml",
        PathBuf::new(),
    )
    .unwrap();
    assert_eq!(ok.registry.shared_url(), Some("s3://bucket/prefix"));
    assert_eq!(ok.registry.poll_interval_ms, 250);
    assert_eq!(Config::demo().registry.shared_url(), None);
    assert!(err("[registry]\nurl = \"ftp://x/y\"\n").contains("not an s3://bucket/prefix URL"));
    assert!(err("[registry]\npoll_interval_ms = 0\n").contains("must be > 0"));
    assert!(err("[registry]\nurls = \"s3://b\"\n").contains("unknown field"));
    assert!(err("[registry]\nadvertise = \"10.0.0.5:9090\"\n").contains("not an http:// URL"));
    let wildcard: std::net::SocketAddr = "0.0.0.0:9090".parse().unwrap();
    let bound: std::net::SocketAddr = "10.0.0.5:9090".parse().unwrap();
    if std::env::var_os("TERN_ADVERTISE_URL").is_none() {
        assert_eq!(ok.registry.advertise_url(wildcard), None);
        assert_eq!(
            ok.registry.advertise_url(bound).as_deref(),
            Some("http://10.0.0.5:9090")
        );
    }
    let mut set = ok.registry.clone();
    set.advertise = "http://tern-0.tern:9090/".into();
    assert_eq!(
        set.advertise_url(wildcard).as_deref(),
        Some("http://tern-0.tern:9090")
    );
    let mut c = Config::demo();
    assert!(
        c.set_registry("http://x".into())
            .unwrap_err()
            .to_string()
            .starts_with("--registry:")
    );
    c.set_registry("s3://b/p".into()).unwrap();
    assert_eq!(c.registry.shared_url(), Some("s3://b/p"));
}

/// The `tern.toml` of a Kubernetes manifest's ConfigMap: the block under `tern.toml: |`.
fn configmap_toml(manifest: &str) -> String {
    let mut lines = manifest
        .lines()
        .skip_while(|l| l.trim() != "tern.toml: |")
        .skip(1);
    let first = lines.next().expect("a tern.toml block");
    let indent = first.len() - first.trim_start().len();
    std::iter::once(first)
        .chain(lines.take_while(|l| l.trim().is_empty() || l.starts_with(&" ".repeat(indent))))
        .map(|l| l.get(indent..).unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn the_kubernetes_manifests_carry_a_valid_config() {
    let single = configmap_toml(include_str!("../../../deploy/kubernetes/tern.yaml"));
    let c = Config::parse(&single, "tern.yaml", PathBuf::new()).unwrap();
    assert_eq!(c.registry.shared_url(), None);
    assert_eq!(c.tenants.len(), 1);
    let fleet = configmap_toml(include_str!(
        "../../../deploy/kubernetes/fleet/tern-fleet.yaml"
    ));
    let c = Config::parse(&fleet, "tern-fleet.yaml", PathBuf::new()).unwrap();
    assert_eq!(
        c.registry.shared_url(),
        Some("s3://tern-registry/production")
    );
    assert!(
        c.tenants.is_empty(),
        "a fleet's tenants live in the registry"
    );
    assert_eq!(c.server.admin_listen, "0.0.0.0:9090".parse().unwrap());
}

#[test]
fn demo_config_is_valid_and_routes_the_demo_tenants() {
    let c = Config::demo();
    let names: Vec<&str> = c
        .tenants
        .iter()
        .map(|t| t.name.get_ref().as_str())
        .collect();
    assert_eq!(
        names,
        [
            "hello",
            "echo",
            "json",
            "component",
            "cgi",
            "visits",
            "chat",
            "counter"
        ]
    );
    let chat = c
        .tenants
        .iter()
        .find(|t| t.name.get_ref() == "chat")
        .unwrap();
    assert_eq!(chat.settings.websocket.mode, crate::websocket::Mode::Events);
    assert_eq!(c.server.listen, Some("127.0.0.1:8080".parse().unwrap()));
}

#[test]
fn syntax_errors_name_file_and_line() {
    assert!(
        err("[server]\nlisten = \n").starts_with("t.toml:2:"),
        "{}",
        err("[server]\nlisten = \n")
    );
}

#[test]
fn unknown_fields_are_refused_with_their_line() {
    let e = err("[pool]\ninstances = 4\nbogus = 1\n");
    assert!(e.starts_with("t.toml:3:") && e.contains("bogus"), "{e}");
}

#[test]
fn route_clash_names_both_tenants_and_the_line() {
    let e = err(
        "[[tenant]]\nname = \"a\"\nmodule = \"a.wasm\"\npaths = [\"/x\"]\n\
         [[tenant]]\nname = \"b\"\nmodule = \"b.wasm\"\npaths = [\"/x/\"]\n",
    );
    assert!(
        e.starts_with("t.toml:8:") && e.contains("\"a\"") && e.contains("\"b\""),
        "{e}"
    );
}

#[test]
fn bad_prefix_and_host_are_refused() {
    let e = err("[[tenant]]\nname = \"a\"\nmodule = \"a.wasm\"\npaths = [\"x\"]\n");
    assert!(e.starts_with("t.toml:4:") && e.contains("paths"), "{e}");
    let e = err("[[tenant]]\nname = \"a\"\nmodule = \"a.wasm\"\nhosts = [\"a.*.com\"]\n");
    assert!(e.starts_with("t.toml:4:") && e.contains("hosts"), "{e}");
}

#[test]
fn a_tenant_table_reads_its_own_keys_and_the_shared_settings_with_their_lines() {
    let c = Config::parse(
        "[[tenant]]\nhosts = [\"a.example\"]\nname = \"a\"\nenv = { K = \"v\" }\n\
         module = \"a.wasm\"\nkind = \"cgi\"\nassets = \"www\"\n\
         [tenant.limits]\ntimeout_ms = 7\n",
        "t.toml",
        PathBuf::new(),
    )
    .unwrap();
    let t = &c.tenants[0];
    assert_eq!(
        (t.name.get_ref().as_str(), t.module.get_ref().as_str()),
        ("a", "a.wasm")
    );
    assert_eq!(
        (t.kind, t.assets.as_ref().map(|a| a.get_ref().as_str())),
        (Some(GuestKind::Cgi), Some("www"))
    );
    assert_eq!(t.settings.hosts[0].get_ref(), "a.example");
    assert_eq!(t.settings.env["K"], "v".into());
    assert_eq!(t.settings.limits.timeout_ms, 7);
    // Spans reach through to the shared settings: a route names its line.
    assert_eq!(
        t.settings.hosts[0].span().start,
        "[[tenant]]\nhosts = [".len()
    );
    let unknown = err("[[tenant]]\nname = \"a\"\nmodule = \"a.wasm\"\nmodul = 1\n");
    assert!(
        unknown.starts_with("t.toml:4:")
            && unknown.contains("`modul`, expected one of `name`, `module`"),
        "{unknown}"
    );
    let bad =
        err("[[tenant]]\nname = \"a\"\nmodule = \"a.wasm\"\nlimits = { timeout_ms = \"x\" }\n");
    assert!(
        bad.starts_with("t.toml:4:") && bad.contains("expected u64"),
        "{bad}"
    );
    let missing = err("[[tenant]]\nmodule = \"a.wasm\"\n");
    assert!(missing.contains("missing field `name`"), "{missing}");
}

#[test]
fn tenant_memory_limit_must_fit_the_pool() {
    let e = err(
        "[pool]\nmax_memory_mib = 64\n[[tenant]]\nname = \"a\"\nmodule = \"a.wasm\"\n\
         [tenant.limits]\nmax_memory_mib = 128\n",
    );
    assert!(e.contains("max_memory_mib"), "{e}");
}

#[test]
fn http3_needs_the_tls_listener_and_its_settings_in_range() {
    let tls = "[server]\ntls_listen = \"127.0.0.1:0\"\nhttp3 = true\n";
    let ok = |extra: &str| Config::parse(&format!("{tls}{extra}"), "t.toml", PathBuf::new());
    let config = ok("").unwrap();
    assert_eq!(
        (
            config.server.http3_max_streams,
            config.server.http3_alt_svc_max_age_secs
        ),
        (200, 86_400)
    );
    assert!(
        !Config::parse("", "t.toml", PathBuf::new())
            .unwrap()
            .server
            .http3
    );
    assert!(
        err("[server]\nhttp3 = true\n").contains("server.http3 serves QUIC on the TLS listener"),
        "{}",
        err("[server]\nhttp3 = true\n")
    );
    for (setting, at_edges, past) in [
        ("http3_max_streams", ["1", "10000"], ["0", "10001"]),
        (
            "http3_socket_buffer_kib",
            ["64", "1048576"],
            ["63", "1048577"],
        ),
        (
            "http3_alt_svc_max_age_secs",
            ["0", "31536000"],
            ["31536001", "31536001"],
        ),
    ] {
        for value in at_edges {
            assert!(
                ok(&format!("{setting} = {value}\n")).is_ok(),
                "{setting} = {value}"
            );
        }
        for value in past {
            let message = err(&format!("{tls}{setting} = {value}\n"));
            assert!(
                message.contains(&format!("server.{setting} must be between")),
                "{setting} = {value}: {message}"
            );
        }
    }
}
