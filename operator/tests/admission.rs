//! The CRDs' schemas and CEL rules reject bad input at admission, on the real API server.

use kube::api::{Api, DynamicObject, PostParams};
use kube::core::GroupVersionKind;
use kube::discovery::ApiResource;
use serde_json::{Value, json};

use idem_operator::resources;
use idem_tests::{shared, unique_name};

async fn install(client: &kube::Client) {
    for crd in resources::crds() {
        idem_tests::install_crd(client, &crd).await.unwrap();
    }
}

fn api(client: &kube::Client, kind: &str, namespace: Option<&str>) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk(resources::GROUP, "v1alpha1", kind);
    let plural = format!("{}s", kind.to_lowercase());
    let ar = ApiResource::from_gvk_with_plural(&gvk, &plural);
    match namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
        None => Api::all_with(client.clone(), &ar),
    }
}

/// Creates the object and returns the API server's rejection message, or `None` if accepted.
async fn try_create(api: &Api<DynamicObject>, obj: Value) -> Option<String> {
    let obj: DynamicObject = serde_json::from_value(obj).unwrap();
    match api.create(&PostParams::default(), &obj).await {
        Ok(_) => None,
        Err(kube::Error::Api(s)) => {
            assert_eq!(s.code, 422, "rejections are 422 Invalid: {s:?}");
            Some(s.message)
        }
        Err(e) => panic!("unexpected error {e}"),
    }
}

/// `n` entries `{<prefix><i>: "1"}`.
fn many(n: usize, prefix: &str) -> Value {
    many_of(n, prefix, "1")
}

/// `n` entries `{<prefix><i>: value}`.
fn many_of(n: usize, prefix: &str, value: &str) -> Value {
    Value::Object(
        (0..n)
            .map(|i| (format!("{prefix}{i}"), json!(value)))
            .collect(),
    )
}

fn tenant(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "tenancy.idem.dev/v1alpha1", "kind": "Tenant", "metadata": {"name": name}, "spec": spec})
}

#[tokio::test]
async fn tenant_admission_accepts_good_input_and_rejects_bad_input_with_a_reason() {
    let client = shared().client();
    install(&client).await;
    let tenants = api(&client, "Tenant", None);

    let good = tenant(
        &unique_name("good"),
        json!({"owners": [{"kind": "User", "name": "alice"}, {"kind": "ServiceAccount", "name": "ci", "namespace": "tools"}],
               "namespaces": ["dev", "prod"], "quota": {"hard": {"cpu": "4", "memory": "8Gi"}}, "weight": 5}),
    );
    assert_eq!(try_create(&tenants, good).await, None);
    let extras = tenant(
        &unique_name("extras"),
        json!({"namespaces": ["dev"],
               "roleBindings": [{"name": "ops", "clusterRole": "system:aggregate-to-view",
                                 "subjects": [{"kind": "Group", "name": "ops"}]}],
               "namespaceMetadata": {"labels": {"team": "payments", "example.com/tier": "gold",
                                                "kubernetes.io.example.com/x": "y"},
                                     "annotations": {"example.com/note": "any text at all"}}}),
    );
    assert_eq!(try_create(&tenants, extras).await, None);

    let cases = [
        (
            "bad-short-name",
            json!({"namespaces": ["Dev_1"]}),
            "namespaces",
        ),
        (
            "dup-namespace",
            json!({"namespaces": ["dev", "dev"]}),
            "Duplicate value",
        ),
        ("weight-zero", json!({"weight": 0}), "weight"),
        ("weight-too-big", json!({"weight": 101}), "weight"),
        (
            "sa-without-ns",
            json!({"owners": [{"kind": "ServiceAccount", "name": "ci"}]}),
            "needs a namespace",
        ),
        (
            "bad-owner-kind",
            json!({"owners": [{"kind": "Robot", "name": "r2"}]}),
            "kind",
        ),
        // Kubernetes' own subjects: an admin binding to them makes everyone (or its own
        // components, exempt from the tenant policies) an owner (found in a trial).
        (
            "owner-everyone",
            json!({"owners": [{"kind": "Group", "name": "system:authenticated"}]}),
            "system groups",
        ),
        (
            "owner-anonymous",
            json!({"owners": [{"kind": "User", "name": "system:anonymous"}]}),
            "system users",
        ),
        (
            "owner-kube-system-group",
            json!({"owners": [{"kind": "Group", "name": "system:serviceaccounts:kube-system"}]}),
            "system groups",
        ),
        (
            "owner-operator-account",
            json!({"owners": [{"kind": "ServiceAccount", "name": "idem-operator", "namespace": "idem-system"}]}),
            "idem-system",
        ),
        (
            "owner-operator-user",
            json!({"owners": [{"kind": "User", "name": "system:serviceaccount:idem-system:idem-operator"}]}),
            "system users",
        ),
        (
            "owner-no-namespace-group",
            json!({"owners": [{"kind": "Group", "name": "system:serviceaccounts:"}]}),
            "system groups",
        ),
        (
            "owner-kube-system-account",
            json!({"owners": [{"kind": "ServiceAccount", "name": "x", "namespace": "kube-system"}]}),
            "kube-* namespace",
        ),
        (
            "long-short-name",
            json!({"namespaces": ["a".repeat(33)]}),
            "namespaces",
        ),
        (
            "bad-quota",
            json!({"quota": {"hard": {"cpu": "lots"}}}),
            "must be a quantity",
        ),
        // Quota keys: standard ResourceQuota names or containing a '/'; values ≥ 0, counts whole.
        (
            "quota-foo",
            json!({"quota": {"hard": {"foo": "1"}}}),
            "standard ResourceQuota name",
        ),
        (
            "quota-neg",
            json!({"quota": {"hard": {"pods": "-5"}}}),
            "must not be negative",
        ),
        (
            "quota-frac",
            json!({"quota": {"hard": {"pods": "1500m"}}}),
            "whole numbers",
        ),
        // Too large for the split's exact arithmetic (a Tenant so written stalled every repair).
        (
            "quota-huge",
            json!({"quota": {"tenantHard": {"requests.memory": "1e40"}}}),
            "must be less than 1e24",
        ),
        (
            "quota-ext-frac",
            json!({"quota": {"hard": {"count/pods": "0.5"}}}),
            "whole numbers",
        ),
        (
            "quota-key",
            json!({"quota": {"hard": {"Bad Key/x": "1"}}}),
            "resource names",
        ),
        (
            "quota-long-value",
            json!({"quota": {"hard": {"cpu": "1".repeat(65)}}}),
            "Too long",
        ),
        (
            "quota-many",
            json!({"quota": {"hard": many(33, "a.com/r")}}),
            "must have at most 32",
        ),
        // Limits: container resources only, valid quantities ≥ 0, bounded.
        (
            "limits-lots",
            json!({"limits": {"default": {"cpu": "lots"}}}),
            "must be a quantity",
        ),
        (
            "limits-pods",
            json!({"limits": {"defaultRequest": {"pods": "1"}}}),
            "container resource",
        ),
        (
            "limits-neg",
            json!({"limits": {"default": {"memory": "-1Gi"}}}),
            "must not be negative",
        ),
        (
            "limits-requests-prefix",
            json!({"limits": {"default": {"requests.cpu": "1"}}}),
            "container resource",
        ),
        (
            "lim-req-gt-def",
            json!({"limits": {"default": {"cpu": "1"}, "defaultRequest": {"cpu": "1500m"}}}),
            "at most the default",
        ),
        (
            "lim-ext-over",
            json!({"limits": {"default": {"example.com/dongle": "2"}, "defaultRequest": {"example.com/dongle": "1"}}}),
            "cannot be overcommitted",
        ),
        (
            "lim-huge-over",
            json!({"limits": {"default": {"hugepages-2Mi": "1Gi"}, "defaultRequest": {"hugepages-2Mi": "512Mi"}}}),
            "cannot be overcommitted",
        ),
        (
            "limits-huge",
            json!({"limits": {"default": many(24_000, "k")}}),
            "must have at most 16",
        ),
        (
            "limits-many",
            json!({"limits": {"defaultRequest": many(17, "a.com/r")}}),
            "must have at most 16",
        ),
        // Owners: a ServiceAccount's namespace is a DNS label and its name a DNS subdomain.
        (
            "sa-bad-ns",
            json!({"owners": [{"kind": "ServiceAccount", "name": "ci", "namespace": "NOT_A_NS"}]}),
            "owners[0].namespace",
        ),
        (
            "sa-bad-name",
            json!({"owners": [{"kind": "ServiceAccount", "name": "CI Bot", "namespace": "tools"}]}),
            "DNS subdomain",
        ),
        (
            "owner-control-char",
            json!({"owners": [{"kind": "User", "name": "al\nice"}]}),
            "owners[0].name",
        ),
        (
            "owners-many",
            json!({"owners": (0..65).map(|i| json!({"kind": "User", "name": format!("u{i}")})).collect::<Vec<_>>()}),
            "must have at most 64",
        ),
        (
            "namespaces-many",
            json!({"namespaces": (0..65).map(|i| format!("n{i}")).collect::<Vec<_>>()}),
            "must have at most 64",
        ),
        (
            "bad-policy",
            json!({"deletionPolicy": "Cascade"}),
            "deletionPolicy",
        ),
        // Namespace metadata: no key in a domain Kubernetes or idem reserves, valid labels.
        (
            "ns-pod-security",
            json!({"namespaceMetadata": {"labels": {"pod-security.kubernetes.io/enforce": "privileged"}}}),
            "reserved for Kubernetes and idem",
        ),
        (
            "ns-metadata-name",
            json!({"namespaceMetadata": {"labels": {"kubernetes.io/metadata.name": "kube-system"}}}),
            "reserved for Kubernetes and idem",
        ),
        (
            "ns-idem-label",
            json!({"namespaceMetadata": {"labels": {"tenancy.idem.dev/owner-uid": "x"}}}),
            "reserved for Kubernetes and idem",
        ),
        (
            "ns-k8s-annotation",
            json!({"namespaceMetadata": {"annotations": {"scheduler.alpha.kubernetes.io/node-selector": "x=y"}}}),
            "reserved for Kubernetes and idem",
        ),
        (
            "ns-bad-value",
            json!({"namespaceMetadata": {"labels": {"team": "not a value"}}}),
            "label values",
        ),
        (
            "ns-bad-key",
            json!({"namespaceMetadata": {"annotations": {"a b": "x"}}}),
            "qualified names",
        ),
        (
            // A prefix of 255 characters: the whole key is short enough, but a Namespace
            // refuses it (`prefix part must be no more than 253 bytes`).
            "ns-long-prefix",
            json!({"namespaceMetadata": {"labels": {
                format!("{}.example.com/team", vec!["a".repeat(60); 4].join(".")): "x"}}}),
            "qualified names",
        ),
        (
            "ns-many-labels",
            json!({"namespaceMetadata": {"labels": many_of(33, "k", "v")}}),
            "must have at most 32",
        ),
        // Role bindings: unique names, a ClusterRole name, at least one subject.
        (
            "rb-dup",
            json!({"roleBindings": [
                {"name": "r", "clusterRole": "view", "subjects": [{"kind": "User", "name": "a"}]},
                {"name": "r", "clusterRole": "edit", "subjects": [{"kind": "User", "name": "b"}]}]}),
            "Duplicate value",
        ),
        (
            "rb-no-subjects",
            json!({"roleBindings": [{"name": "r", "clusterRole": "view", "subjects": []}]}),
            "subjects",
        ),
        (
            "rb-dotdot",
            json!({"roleBindings": [{"name": "r", "clusterRole": "..", "subjects": [{"kind": "User", "name": "a"}]}]}),
            "never named",
        ),
        (
            "rb-slash",
            json!({"roleBindings": [{"name": "r", "clusterRole": "a/b", "subjects": [{"kind": "User", "name": "a"}]}]}),
            "clusterRole",
        ),
        (
            "rb-bad-name",
            json!({"roleBindings": [{"name": "Readers", "clusterRole": "view", "subjects": [{"kind": "User", "name": "a"}]}]}),
            "roleBindings[0].name",
        ),
    ];
    for (prefix, mut spec, expect) in cases {
        // Each case wrong in one way only (`namespaces` is required).
        if spec.get("namespaces").is_none() {
            spec["namespaces"] = json!([]);
        }
        let message = try_create(&tenants, tenant(&unique_name(prefix), spec))
            .await
            .unwrap_or_else(|| panic!("{prefix}: accepted"));
        assert!(message.contains(expect), "{prefix}: {message}");
    }
    // A manifest that leaves out `namespaces` (an admin re-applying a Tenant from an old file)
    // is refused, not read as "no namespaces", which would delete the Tenant's namespaces.
    let message = try_create(
        &tenants,
        tenant(
            &unique_name("no-ns"),
            json!({"owners": [{"kind": "User", "name": "alice"}]}),
        ),
    )
    .await
    .expect("a Tenant without namespaces accepted");
    assert!(
        message.contains("spec.namespaces: Required value"),
        "{message}"
    );
    assert_eq!(
        try_create(
            &tenants,
            tenant(&unique_name("empty-ns"), json!({"namespaces": []}))
        )
        .await,
        None,
        "an explicit empty list"
    );
    // The accounts of a namespace of one's own may own a tenant, by group, user name or kind.
    let accounts = json!({"namespaces": [], "owners": [
        {"kind": "Group", "name": "system:serviceaccounts:team-a"},
        {"kind": "User", "name": "system:serviceaccount:team-a:deployer"},
        {"kind": "ServiceAccount", "name": "deployer", "namespace": "team-a"}]});
    assert_eq!(
        try_create(&tenants, tenant(&unique_name("accounts"), accounts)).await,
        None,
        "a namespace's service accounts as owners"
    );
    let dotted = format!("{}.x", unique_name("dot"));
    let message = try_create(&tenants, tenant(&dotted, json!({"namespaces": []})))
        .await
        .expect("dotted name accepted");
    assert!(message.contains("must be a DNS label"), "{message}");
    // Names whose namespaces Kubernetes or the operator keep for themselves.
    for (name, spec, expect) in [
        ("kube", json!({"namespaces": ["system"]}), "never 'kube'"),
        ("kube-x", json!({"namespaces": ["a"]}), "never 'kube'"),
        (
            "idem",
            json!({"namespaces": ["a", "system"]}),
            "idem-system is the operator's",
        ),
    ] {
        let message = try_create(&tenants, tenant(name, spec))
            .await
            .unwrap_or_else(|| panic!("tenant {name} accepted"));
        assert!(message.contains(expect), "{name}: {message}");
    }
    let long = "t".repeat(31);
    let message = try_create(&tenants, tenant(&long, json!({"namespaces": []})))
        .await
        .expect("long name accepted");
    assert!(message.contains("at most 30 characters"), "{message}");
}

#[tokio::test]
async fn tenant_app_admission_rejects_negative_replicas_and_bad_ports() {
    let client = shared().client();
    install(&client).await;
    let ns = unique_name("apps");
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap(),
        )
        .await
        .unwrap();
    let apps = api(&client, "TenantApp", Some(&ns));
    let app = |name: &str, spec: Value| json!({"apiVersion": "tenancy.idem.dev/v1alpha1", "kind": "TenantApp", "metadata": {"name": name}, "spec": spec});
    for (name, image) in [
        ("ok", "nginx:1.27"),
        ("registry", "registry.example.com:5000/team/app_x:v1.2-rc.3"),
        (
            "digest",
            "ghcr.io/a/b@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
        ),
    ] {
        let spec = json!({"image": image, "env": {"LOG_LEVEL": "info", "my.var-1": "x"},
                          "config": {"app.toml": "x"}});
        assert_eq!(try_create(&apps, app(name, spec)).await, None, "{image}");
    }
    // The most the schema allows in ASCII (64 × 16000 bytes plus keys) fits a ConfigMap: the
    // byte rule only rejects what the ConfigMap could not hold.
    let spec = json!({"image": "x", "config": many_of(64, "f", &"v".repeat(16000))});
    assert_eq!(try_create(&apps, app("config-max", spec)).await, None);
    for (name, spec, expect) in [
        ("neg", json!({"image": "x", "replicas": -1}), "replicas"),
        ("port", json!({"image": "x", "port": 70000}), "port"),
        ("noimage", json!({"replicas": 1}), "image"),
        (
            "badkey",
            json!({"image": "x", "config": {"bad/key": "v"}}),
            "config keys",
        ),
        ("space", json!({"image": "nginx:1.27 "}), "spec.image"),
        (
            "junk",
            json!({"image": "NOT A VALID IMAGE::@@"}),
            "spec.image",
        ),
        ("upper", json!({"image": "Nginx:1.27"}), "spec.image"),
        (
            "short-digest",
            json!({"image": "nginx@sha256:abc"}),
            "spec.image",
        ),
        (
            "env-name",
            json!({"image": "x", "env": {"1BAD": "v"}}),
            "environment variable names",
        ),
        (
            "env-many",
            json!({"image": "x", "env": many(65, "E")}),
            "must have at most 64",
        ),
        (
            "env-long",
            json!({"image": "x", "env": {"E": "v".repeat(4097)}}),
            "Too long",
        ),
        (
            "config-dotdot",
            json!({"image": "x", "config": {"..": "v"}}),
            "config keys",
        ),
        (
            "config-dot",
            json!({"image": "x", "config": {".": "v"}}),
            "config keys",
        ),
        (
            "config-dotdot-prefix",
            json!({"image": "x", "config": {"..data": "v"}}),
            "config keys",
        ),
        (
            "config-key-long",
            json!({"image": "x", "config": many_of(1, &"k".repeat(253), "v")}),
            "config keys",
        ),
        (
            "env-dotdot",
            json!({"image": "x", "env": {"..": "v"}}),
            "environment variable names",
        ),
        (
            "env-dot",
            json!({"image": "x", "env": {".": "v"}}),
            "environment variable names",
        ),
        (
            "env-dotdot-prefix",
            json!({"image": "x", "env": {"..E": "v"}}),
            "environment variable names",
        ),
        (
            "config-many",
            json!({"image": "x", "config": many(65, "f")}),
            "must have at most 64",
        ),
        (
            "config-long",
            json!({"image": "x", "config": {"f": "v".repeat(16001)}}),
            "Too long",
        ),
        (
            // 22 × 16000 three-byte characters: every value within maxLength, 1,056,000
            // bytes in all — more than a ConfigMap may hold.
            "config-bytes",
            json!({"image": "x", "config": many_of(22, "f", &"€".repeat(16000))}),
            "at most 1048576 bytes",
        ),
    ] {
        let message = try_create(&apps, app(name, spec))
            .await
            .unwrap_or_else(|| panic!("{name}: accepted"));
        assert!(message.contains(expect), "{name}: {message}");
    }
    // The name names the Service, a DNS-1035 label: at most 63 characters, no dots, starting
    // with a letter.
    for name in ["my.app".to_string(), "1app".to_string(), "a".repeat(64)] {
        let message = try_create(&apps, app(&name, json!({"image": "x"})))
            .await
            .unwrap_or_else(|| panic!("{name}: accepted"));
        assert!(message.contains("DNS-1035 label"), "{name}: {message}");
    }
}

/// What the TenantApp CRD admits, the children made from it pass too: each accepted app's
/// ConfigMap, Deployment and Service are created with `dryRun=All` (the API server's own
/// validation as the oracle), so an app can never be admitted and then loop on 422s.
#[tokio::test]
async fn every_tenant_app_the_crd_admits_makes_children_the_api_server_accepts() {
    use idem_operator::resources::TenantApp;
    use idem_operator::tenant_app::desired;
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Service};

    let client = shared().client();
    install(&client).await;
    let ns = unique_name("dry-apps");
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap(),
        )
        .await
        .unwrap();
    let apps = api(&client, "TenantApp", Some(&ns));
    let mut config = many_of(58, "f", "x");
    for key in ["a.b", ".hidden", "x..y", "-", "_", "k".repeat(253).as_str()] {
        config[key] = json!("v");
    }
    let mut env = many(50, "E");
    for key in [
        "my.var-1",
        "_X",
        "-",
        ".x",
        "a..b",
        "E".repeat(256).as_str(),
    ] {
        env[key] = json!("v");
    }
    let cases = [
        (
            "a".repeat(63),
            json!({"image": "nginx:1.27", "port": 65535, "replicas": 1000}),
        ),
        (
            "x".into(),
            json!({"image": "x", "port": 1, "replicas": 0, "config": config, "env": env}),
        ),
        (
            "web-1".into(),
            json!({"image": "[::1]:5000/app@sha256:0123456789abcdef0123456789abcdef"}),
        ),
    ];
    let pp = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    for (name, spec) in cases {
        let obj: DynamicObject =
            serde_json::from_value(json!({"apiVersion": "tenancy.idem.dev/v1alpha1",
            "kind": "TenantApp", "metadata": {"name": name}, "spec": spec}))
            .unwrap();
        let created = apps
            .create(&PostParams::default(), &obj)
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let typed: TenantApp =
            serde_json::from_value(serde_json::to_value(&created).unwrap()).unwrap();
        let (config_map, deployment, service) = desired::objects(&typed);
        Api::<ConfigMap>::namespaced(client.clone(), &ns)
            .create(&pp, &config_map)
            .await
            .unwrap_or_else(|e| panic!("admitted {name} but its ConfigMap is not: {e}"));
        Api::<Deployment>::namespaced(client.clone(), &ns)
            .create(&pp, &deployment)
            .await
            .unwrap_or_else(|e| panic!("admitted {name} but its Deployment is not: {e}"));
        Api::<Service>::namespaced(client.clone(), &ns)
            .create(&pp, &service)
            .await
            .unwrap_or_else(|e| panic!("admitted {name} but its Service is not: {e}"));
    }
}

/// What the Tenant CRD admits, the children made from it pass too: each accepted spec's
/// ResourceQuota and LimitRange are created with `dryRun=All` (the API server's own
/// validation as the oracle), so a tenant can never be admitted and then loop on 422s.
#[tokio::test]
async fn every_quota_and_limits_the_crd_admits_makes_children_the_api_server_accepts() {
    use idem_operator::resources::Tenant;
    use k8s_openapi::api::core::v1::{LimitRange, Namespace, ResourceQuota};

    let client = shared().client();
    install(&client).await;
    let tenants = api(&client, "Tenant", None);
    let ns = unique_name("dry");
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap(),
        )
        .await
        .unwrap();
    let mut full_quota = many(20, "example.com/r");
    for (k, v) in [
        ("pods", json!(20)),
        ("cpu", json!("500m")),
        ("requests.memory", json!("8Gi")),
        ("limits.ephemeral-storage", json!("0")),
        ("count/deployments.apps", json!("5")),
        ("requests.nvidia.com/gpu", json!("2")),
        (
            "gold.storageclass.storage.k8s.io/requests.storage",
            json!("10Gi"),
        ),
        ("hugepages-2Mi", json!("1Gi")),
        ("requests.hugepages-1Gi", json!("2Gi")),
        ("services.loadbalancers", json!("0")),
        ("configmaps", json!("1e3")),
        ("resourcequotas", json!("1")),
    ] {
        full_quota[k] = v;
    }
    let specs = [
        json!({"quota": {"hard": full_quota}}),
        json!({"limits": {"default": {"cpu": "1", "memory": "1Gi", "ephemeral-storage": "1Gi",
                                       "hugepages-2Mi": "0", "example.com/dongle": "1"},
                          "defaultRequest": {"cpu": "0", "memory": "128Mi"}}}),
        json!({"limits": {"default": {"cpu": "1", "memory": "1Gi", "hugepages-2Mi": "2Mi",
                                       "example.com/dongle": "1"},
                          "defaultRequest": {"cpu": "1000m", "memory": "1Gi", "hugepages-2Mi": "2Mi",
                                             "example.com/dongle": "1", "ephemeral-storage": "1Gi"}}}),
    ];
    let pp = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    for mut spec in specs {
        spec["namespaces"] = json!([]);
        let name = unique_name("acc");
        let created = tenants
            .create(
                &PostParams::default(),
                &serde_json::from_value(tenant(&name, spec.clone())).unwrap(),
            )
            .await
            .unwrap_or_else(|e| panic!("{spec}: {e}"));
        let typed: Tenant =
            serde_json::from_value(serde_json::to_value(&created).unwrap()).unwrap();
        use idem_operator::tenant::desired;
        let mut checked = 0;
        if let Some(q) = desired::quota(&typed, Some(&ns)) {
            Api::<ResourceQuota>::namespaced(client.clone(), &ns)
                .create(&pp, &q)
                .await
                .unwrap_or_else(|e| panic!("admitted {spec} but its quota is not: {e}"));
            checked += 1;
        }
        if let Some(l) = desired::limit_range(&typed, Some(&ns)) {
            Api::<LimitRange>::namespaced(client.clone(), &ns)
                .create(&pp, &l)
                .await
                .unwrap_or_else(|e| panic!("admitted {spec} but its limits are not: {e}"));
            checked += 1;
        }
        assert_eq!(checked, 1, "{spec}");
    }
    // The other way round for the rules between limits: the LimitRange of each spec those
    // rules refuse is refused by the API server too.
    for (default, request) in [
        (json!({"cpu": "1"}), json!({"cpu": "1500m"})),
        (
            json!({"example.com/dongle": "2"}),
            json!({"example.com/dongle": "1"}),
        ),
        (
            json!({"hugepages-2Mi": "1Gi"}),
            json!({"hugepages-2Mi": "512Mi"}),
        ),
    ] {
        let limits: LimitRange = serde_json::from_value(json!({
            "metadata": {"name": "idem-limits"},
            "spec": {"limits": [{"type": "Container", "default": default, "defaultRequest": request}]},
        }))
        .unwrap();
        match Api::<LimitRange>::namespaced(client.clone(), &ns)
            .create(&pp, &limits)
            .await
        {
            Err(kube::Error::Api(s)) if s.code == 422 => {}
            other => panic!("{default} / {request}: the API server says {other:?}"),
        }
    }
}
