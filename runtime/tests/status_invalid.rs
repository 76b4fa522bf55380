//! Against the real control plane: a status the reconcile cannot write is terminal.
//!
//! A `Note` copies its `spec.text` into `status.echo`, which its CRD allows 8 characters, and
//! its Ready reason from `spec.reason`. A text too long for the status schema is refused by the
//! API server (422 Invalid on the status write); a reason that is no condition reason is
//! refused before any write. Either way the same spec meets the same refusal on every retry,
//! so the Note is `Stalled` at once with reason `StatusInvalid` and the refusal in its message
//! (its stored status otherwise kept), the pass is handled (no retry), and a second pass on the
//! unchanged Note writes nothing. Fixing the spec makes it Ready.

use std::sync::Arc;

use idem_runtime::IdempotentResource;
use idem_runtime::apply::DesiredChildren;
use idem_runtime::controller::Action;
use idem_runtime::reconciler::{ChildKinds, Children, Driver, Outcome, ReconcileError, Reconciler};
use idem_runtime::status::Readiness;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client, CustomResource, CustomResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::sync::Mutex;

/// The tests count status writes at the API server: one at a time.
static COUNTING: Mutex<()> = Mutex::const_new(());

/// A note: its text is echoed into its status.
#[derive(CustomResource, IdempotentResource, Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "status.test.idem.dev",
    version = "v1",
    kind = "Note",
    namespaced,
    status = "NoteStatus"
)]
#[idempotent(tenant = namespace, prune = owner_references)]
pub struct NoteSpec {
    /// Copied into `status.echo`.
    pub text: String,
    /// The Ready condition's reason.
    pub reason: String,
}

/// Status of a [`Note`].
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NoteStatus {
    /// The generation the conditions describe.
    pub observed_generation: Option<i64>,
    /// Ready, Reconciling, Stalled.
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// `spec.text`, at most 8 characters.
    #[schemars(length(max = 8))]
    pub echo: Option<String>,
}

struct Notes;
impl Reconciler for Notes {
    type Resource = Note;
    fn children() -> ChildKinds<Note> {
        ChildKinds::new()
    }
    fn desired(&self, _: &Note) -> Result<DesiredChildren, ReconcileError> {
        Ok(DesiredChildren::new())
    }
    fn ready(&self, note: &Note, _: &Children<'_>) -> Result<Outcome<Note>, ReconcileError> {
        let text = note.spec.text.clone();
        Ok(Outcome::new(Readiness::Ready {
            reason: note.spec.reason.clone(),
            message: "echoed".into(),
        })
        .status(move |s: &mut NoteStatus| s.echo = Some(text.clone())))
    }
}

async fn setup() -> (Client, Api<Note>) {
    let client = idem_tests::shared().client();
    idem_tests::install_crd(&client, &Note::crd())
        .await
        .expect("install the Note CRD");
    let ns = idem_tests::create_namespace(&client, "note")
        .await
        .expect("namespace");
    (client.clone(), Api::namespaced(client, &ns))
}

async fn create(api: &Api<Note>, text: &str, reason: &str) -> Note {
    let note = Note::new(
        "n",
        NoteSpec {
            text: text.into(),
            reason: reason.into(),
        },
    );
    api.create(&PostParams::default(), &note)
        .await
        .expect("create the Note")
}

fn condition(note: &Note, type_: &str) -> Condition {
    note.status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == type_))
        .cloned()
        .unwrap_or_else(|| panic!("no {type_} condition: {:?}", note.status))
}

/// Status writes on notes the API server counted.
async fn status_writes() -> u64 {
    let text = idem_tests::shared().metrics().await.expect("metrics");
    idem_tests::metrics::all_requests(&text)
        .iter()
        .filter(|c| c.resource == "notes" && c.subresource == "status" && c.verb != "GET")
        .map(|c| c.count)
        .sum()
}

/// Reconciles `note` once, expects it Stalled with `StatusInvalid` and a message holding
/// `says`, then once more on the stored Note: handled again, with `refused` status writes
/// (the server's refusal of the same status again) and no other.
async fn stalls_without_retry(
    client: &Client,
    api: &Api<Note>,
    note: Note,
    says: &str,
    refused: u64,
) {
    let driver = Driver::new(client.clone(), Notes);
    let action = driver.reconcile_once(client.clone(), Arc::new(note)).await;
    assert_eq!(
        action.expect("a refused status is handled: Stalled, no retry"),
        Action::terminal()
    );
    let stored = api.get("n").await.expect("get");
    let stalled = condition(&stored, "Stalled");
    assert_eq!(
        (stalled.status.as_str(), stalled.reason.as_str()),
        ("True", "StatusInvalid"),
        "{stalled:?}"
    );
    assert!(
        stalled.message.contains(says),
        "the refusal is in the message: {stalled:?}"
    );
    assert_eq!(condition(&stored, "Ready").status, "False");
    assert_eq!(stored.status.as_ref().and_then(|s| s.echo.clone()), None);
    let before = status_writes().await;
    let again = driver
        .reconcile_once(client.clone(), Arc::new(stored.clone()))
        .await;
    assert_eq!(again.expect("handled again"), Action::terminal());
    assert_eq!(
        status_writes().await - before,
        refused,
        "the unchanged Note: the refused write, then nothing (the Stalled status is already there)"
    );
}

/// Fixes `field` of the Note and expects one pass to make it Ready with `echo`.
async fn fixed(client: &Client, api: &Api<Note>, field: &str, value: &str, echo: &str) {
    let note = api
        .patch(
            "n",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {field: value}})),
        )
        .await
        .expect("fix the spec");
    let driver = Driver::new(client.clone(), Notes);
    driver
        .reconcile_once(client.clone(), Arc::new(note))
        .await
        .expect("the fixed Note converges");
    let stored = api.get("n").await.expect("get");
    assert_eq!(condition(&stored, "Ready").status, "True", "{stored:?}");
    assert_eq!(condition(&stored, "Stalled").status, "False");
    assert_eq!(stored.status.and_then(|s| s.echo).as_deref(), Some(echo));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_status_the_schema_refuses_stalls_at_once_and_is_not_retried() {
    let _guard = COUNTING.lock().await;
    let (client, api) = setup().await;
    let note = create(&api, "far too long for eight", "Echoed").await;
    // The server's own words: the field and the limit it broke.
    stalls_without_retry(&client, &api, note, "status.echo", 1).await;
    fixed(&client, &api, "text", "short", "short").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_condition_reason_that_is_no_reason_stalls_at_once_and_is_not_retried() {
    let _guard = COUNTING.lock().await;
    let (client, api) = setup().await;
    let note = create(&api, "fine", "not a reason").await;
    stalls_without_retry(&client, &api, note, "\"not a reason\"", 0).await;
    fixed(&client, &api, "reason", "Echoed", "fine").await;
}
