//! Against the real control plane: each object's Event budget (`DriverConfig::events_burst`,
//! `events_every`). An owner who edits a child again and again gets a `DriftRepaired` Event per
//! edit under the default budget, but no more Events than the burst under a small one; the
//! next Event published once the budget refills says how many were held back, and those plus
//! the ones published are every Event the passes had to tell; an Event published "always"
//! (what only an administrator's action causes, once) goes out whatever the budget. A
//! controller's driver that tells the same Event again counts up that Event's series (one
//! object), and tells it anew once that object is gone. A tenant's budget
//! (`DriverConfig::tenant_events_burst`, `tenant_events_every`) bounds the Events about all its
//! objects together.

#[allow(dead_code)]
#[path = "../examples/base_tenant.rs"]
mod base_tenant;

use std::sync::Arc;
use std::time::Duration;

use base_tenant::{BaseTenant, BaseTenantSpec, BaseTenants};
use idem_runtime::controller::{Action, Attempt, Reason};
use idem_runtime::queue::Priority;
use idem_runtime::reconciler::{
    ChildKinds, Driver, DriverConfig, Outcome, Pass, ReconcileError, Reconciler,
};
use idem_runtime::status::Readiness;
use idem_runtime::{ObjectKey, TenantKey};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event as Publish, EventType};
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use tokio::sync::Mutex;

const WAIT: Duration = Duration::from_secs(60);

/// The Events one pass that creates a BaseTenant tells: 4 `Created` and the `Ready` change.
const CREATION_EVENTS: usize = 5;

/// Tests share one CRD install.
static SETUP: Mutex<bool> = Mutex::const_new(false);

async fn client() -> Client {
    let client = idem_tests::shared().client();
    let mut done = SETUP.lock().await;
    if !*done {
        base_tenant::install_crd(&client)
            .await
            .expect("install the CRD");
        *done = true;
    }
    client
}

async fn create(client: &Client, prefix: &str) -> BaseTenant {
    let tenant = BaseTenant::new(
        &idem_tests::unique_name(prefix),
        BaseTenantSpec {
            owners: vec!["erin".into()],
            cpu: "1".into(),
            memory: "1Gi".into(),
        },
    );
    Api::<BaseTenant>::all(client.clone())
        .create(&PostParams::default(), &tenant)
        .await
        .expect("create")
}

/// One pass of `driver` over the stored `name`.
async fn pass(client: &Client, driver: &Driver<BaseTenants>, name: &str) {
    let stored = Api::<BaseTenant>::all(client.clone())
        .get(name)
        .await
        .expect("get");
    driver
        .reconcile_once(client.clone(), Arc::new(stored))
        .await
        .expect("reconcile");
}

/// The tenant owner's edit `i` of the RoleBinding's subjects (drift for the next pass).
async fn edit(client: &Client, name: &str, i: usize) {
    let patch = json!({"subjects": [{
        "kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": format!("mallory-{i}")
    }]});
    Api::<RoleBinding>::namespaced(client.clone(), name)
        .patch(
            "owners",
            &PatchParams {
                field_manager: Some("owner-edit".into()),
                ..PatchParams::default()
            },
            &Patch::Merge(patch),
        )
        .await
        .expect("edit the RoleBinding");
}

/// The notes of the Events about the object of `uid`.
async fn notes(client: &Client, uid: &str) -> Vec<String> {
    let events = Api::<Event>::all(client.clone())
        .list(&ListParams::default())
        .await
        .expect("events");
    events
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.uid.as_deref()) == Some(uid))
        .map(|e| {
            let count = e.series.as_ref().map_or(1, |s| s.count);
            assert_eq!(count, 1, "each Event told once: {e:?}");
            e.note.unwrap_or_default()
        })
        .collect()
}

/// Creates a tenant, makes it converge, then edits its RoleBinding `edits` times with a pass
/// after each; the notes of the Events about it.
async fn creation_and_edits(
    client: &Client,
    driver: &Driver<BaseTenants>,
    edits: usize,
) -> Vec<String> {
    let tenant = create(client, "bt-budget").await;
    let name = tenant.name_any();
    pass(client, driver, &name).await;
    for i in 0..edits {
        edit(client, &name, i).await;
        pass(client, driver, &name).await;
    }
    notes(client, &tenant.uid().unwrap()).await
}

#[tokio::test]
async fn the_burst_bounds_the_events_an_owners_edits_cause() {
    let client = client().await;
    const EDITS: usize = 6;
    // The default budget tells every edit.
    let told = creation_and_edits(&client, &Driver::new(client.clone(), BaseTenants), EDITS).await;
    let repaired = told.iter().filter(|n| n.contains("restored")).count();
    assert_eq!(told.len(), CREATION_EVENTS + EDITS, "{told:#?}");
    assert_eq!(repaired, EDITS, "{told:#?}");

    // A burst of 3 and no refill within the test: 3 Events, whatever the edits.
    let small = Driver::new(client.clone(), BaseTenants).with_config(DriverConfig {
        events_burst: 3,
        events_every: Duration::from_secs(3600),
        ..DriverConfig::default()
    });
    let told = creation_and_edits(&client, &small, EDITS).await;
    assert_eq!(told.len(), 3, "{told:#?}");
    assert!(told.iter().all(|n| n.starts_with("created ")), "{told:#?}");
}

/// Creates two tenants' BaseTenants and makes each converge with one pass of `driver`, both
/// passes as reconciles of one tenant `tenant`; the notes of the Events about both.
async fn two_objects_of_one_tenant(
    client: &Client,
    driver: &Driver<BaseTenants>,
    tenant: &str,
) -> Vec<String> {
    let mut told = Vec::new();
    for _ in 0..2 {
        let created = create(client, "bt-tenant-budget").await;
        let name = created.name_any();
        idem_runtime::inflight::scoped(TenantKey::new(tenant), pass(client, driver, &name)).await;
        told.extend(notes(client, &created.uid().unwrap()).await);
    }
    told
}

#[tokio::test]
async fn a_tenants_budget_bounds_the_events_of_all_its_objects() {
    let client = client().await;
    // The default budget tells each object's creation whole.
    let default = Driver::new(client.clone(), BaseTenants);
    let told = two_objects_of_one_tenant(&client, &default, &idem_tests::unique_name("t")).await;
    assert_eq!(told.len(), 2 * CREATION_EVENTS, "{told:#?}");
    // A tenant budget of 6, no refill within the test: the second object, whose own budget is
    // untouched, gets only what its tenant has left.
    let small = Driver::new(client.clone(), BaseTenants).with_config(DriverConfig {
        tenant_events_burst: 6,
        tenant_events_every: Duration::from_secs(3600),
        ..DriverConfig::default()
    });
    let told = two_objects_of_one_tenant(&client, &small, &idem_tests::unique_name("t")).await;
    assert_eq!(told.len(), 6, "{told:#?}");
}

#[tokio::test]
async fn the_next_event_says_how_many_were_held_back() {
    let client = client().await;
    // One Event at once, then one per second.
    let driver = Driver::new(client.clone(), BaseTenants).with_config(DriverConfig {
        events_burst: 1,
        events_every: Duration::from_secs(1),
        ..DriverConfig::default()
    });
    let tenant = create(&client, "bt-held").await;
    let (name, uid) = (tenant.name_any(), tenant.uid().unwrap());
    pass(&client, &driver, &name).await;
    let mut told = CREATION_EVENTS;
    assert_eq!(notes(&client, &uid).await.len(), 1);
    // Edit and repair until an Event says how many were held back (the budget refills).
    let deadline = tokio::time::Instant::now() + WAIT;
    let (published, held) = loop {
        edit(&client, &name, told).await;
        pass(&client, &driver, &name).await;
        told += 1;
        let notes = notes(&client, &uid).await;
        let held = notes.iter().find_map(|n| {
            let (_, after) = n.rsplit_once(" (")?;
            let (count, rest) = after.split_once(' ')?;
            rest.starts_with(
                "earlier Events about this object held back: at most 1 at once, then one every 1s)",
            )
            .then(|| count.parse::<usize>().expect("a count"))
        });
        if let Some(held) = held {
            break (notes.len(), held);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no Event said what was held back: {notes:#?}"
        );
    };
    assert_eq!(published, 2, "the first and the one after the refill");
    assert!(held >= CREATION_EVENTS - 1, "{held}");
    assert_eq!(published + held, told, "every Event told or counted");
}

/// Each pass publishes one Event within the budget and one always (each with a note of its
/// own), or with `repeat` the same Event always; it makes no child.
struct Telling {
    repeat: bool,
}

impl Reconciler for Telling {
    type Resource = BaseTenant;
    fn children() -> ChildKinds<BaseTenant> {
        ChildKinds::new()
    }
    async fn reconcile(
        &self,
        _: &BaseTenant,
        pass: &mut Pass<BaseTenant>,
    ) -> Result<Outcome<BaseTenant>, ReconcileError> {
        let event = |type_, reason: &str, note: String| Publish {
            type_,
            reason: reason.into(),
            note: Some(note),
            action: "Test".into(),
            secondary: None,
        };
        if self.repeat {
            let again = "the same thing again".to_owned();
            pass.publish_always(event(EventType::Warning, "Again", again))
                .await;
        } else {
            let numbered = |reason: &str| format!("{reason} {}", next_number());
            pass.publish(event(EventType::Normal, "Budgeted", numbered("Budgeted")))
                .await;
            pass.publish_always(event(EventType::Normal, "Always", numbered("Always")))
                .await;
        }
        Ok(Outcome::new(Readiness::Ready {
            reason: "Told".into(),
            message: "told".into(),
        }))
    }
}

/// A number per call, so that no two Events of a reason fold into one series.
fn next_number() -> usize {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

#[tokio::test]
async fn an_event_published_always_goes_out_whatever_the_budget() {
    let client = client().await;
    let driver = Driver::new(client.clone(), Telling { repeat: false }).with_config(DriverConfig {
        events_burst: 1,
        events_every: Duration::from_secs(3600),
        ..DriverConfig::default()
    });
    let tenant = create(&client, "bt-always").await;
    let (name, uid) = (tenant.name_any(), tenant.uid().unwrap());
    for _ in 0..3 {
        let stored = Api::<BaseTenant>::all(client.clone())
            .get(&name)
            .await
            .expect("get");
        let action = driver
            .reconcile_once(client.clone(), Arc::new(stored))
            .await
            .expect("reconcile");
        assert_eq!(action, Action::await_change());
    }
    let told = notes(&client, &uid).await;
    let budgeted = told.iter().filter(|n| n.starts_with("Budgeted")).count();
    let always = told.iter().filter(|n| n.starts_with("Always")).count();
    assert_eq!((budgeted, always), (1, 3), "{told:#?}");
}

/// The `Again` Events about the object of `uid`: each one's name and series count (1 without
/// a series).
async fn agains(client: &Client, uid: &str) -> Vec<(String, i32)> {
    let mut out: Vec<(String, i32)> = Api::<Event>::all(client.clone())
        .list(&ListParams::default())
        .await
        .expect("events")
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.uid.as_deref()) == Some(uid))
        .filter(|e| e.reason.as_deref() == Some("Again"))
        .map(|e| (e.name_any(), e.series.as_ref().map_or(1, |s| s.count)))
        .collect();
    out.sort();
    out
}

#[tokio::test]
async fn a_controllers_repeated_event_counts_up_one_series_until_it_is_gone() {
    let client = client().await;
    // As a controller runs it: one driver, its passes through `Driver::reconcile`.
    let driver = Arc::new(Driver::new(client.clone(), Telling { repeat: true }));
    let tenant = create(&client, "bt-again").await;
    let (name, uid) = (tenant.name_any(), tenant.uid().unwrap());
    let run = || async {
        let stored = Api::<BaseTenant>::all(client.clone())
            .get(&name)
            .await
            .expect("get");
        let attempt = Attempt {
            key: ObjectKey::cluster("BaseTenant", &name),
            tenant: TenantKey::new(&name),
            failures: 0,
            priority: Priority::Event,
            reason: Reason::ObjectChanged,
        };
        Driver::reconcile(Arc::new(stored), Arc::clone(&driver), attempt)
            .await
            .expect("reconcile");
    };
    for _ in 0..3 {
        run().await;
    }
    let told = agains(&client, &uid).await;
    assert_eq!(told.len(), 1, "one Event object: {told:?}");
    assert_eq!(told[0].1, 3, "its series counts the three: {told:?}");
    // Gone (as the API server's Event TTL removes it): the next one is a new Event.
    Api::<Event>::namespaced(client.clone(), "default")
        .delete(&told[0].0, &DeleteParams::default())
        .await
        .expect("delete the Event");
    run().await;
    let again = agains(&client, &uid).await;
    assert_eq!(again.len(), 1, "{again:?}");
    assert_ne!(again[0].0, told[0].0, "a new Event: {again:?}");
    assert_eq!(again[0].1, 1, "{again:?}");
}
