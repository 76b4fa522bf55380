//! Unit tests of condition bookkeeping.

use super::*;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct S {
    conditions: Vec<Condition>,
}

fn conds(s: &mut S) -> &mut Vec<Condition> {
    &mut s.conditions
}

const KSTATUS: &[&str] = &["Ready", "Reconciling", "Stalled"];

fn at(secs: i64) -> Time {
    Time(Timestamp::from_second(secs).expect("valid"))
}

fn ready(s: &S) -> &Condition {
    s.conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .expect("Ready set")
}

#[test]
fn transition_time_moves_only_on_flip() {
    let mut s = S::default();
    let r = |reason: &str| Readiness::Reconciling {
        reason: reason.into(),
        message: "m".into(),
    };
    StatusDraft::new(&mut s, conds, 1, at(100), KSTATUS).set_readiness(&r("Progressing"));
    assert_eq!(ready(&s).last_transition_time, at(100));
    assert_eq!(ready(&s).status, "False");
    // Same status, new reason: time kept.
    StatusDraft::new(&mut s, conds, 2, at(200), KSTATUS).set_readiness(&r("StillProgressing"));
    assert_eq!(ready(&s).last_transition_time, at(100));
    assert_eq!(ready(&s).reason, "StillProgressing");
    assert_eq!(ready(&s).observed_generation, Some(2));
    // Flip: time moves.
    StatusDraft::new(&mut s, conds, 2, at(300), KSTATUS).set_readiness(&Readiness::Ready {
        reason: "Reconciled".into(),
        message: String::new(),
    });
    assert_eq!(ready(&s).last_transition_time, at(300));
    assert_eq!(ready(&s).status, "True");
    let stalled = s
        .conditions
        .iter()
        .find(|c| c.type_ == "Stalled")
        .expect("set");
    assert_eq!(stalled.status, "False");
}

#[test]
fn kstatus_table() {
    let mut s = S::default();
    StatusDraft::new(&mut s, conds, 1, at(1), KSTATUS).set_readiness(&Readiness::Stalled {
        reason: "ChildNotOwned".into(),
        message: "x".into(),
    });
    let st: Vec<_> = s
        .conditions
        .iter()
        .map(|c| (c.type_.as_str(), c.status.as_str()))
        .collect();
    assert_eq!(
        st,
        vec![
            ("Ready", "False"),
            ("Reconciling", "False"),
            ("Stalled", "True")
        ]
    );
}

#[test]
fn the_three_kstatus_conditions_never_repeat_one_reason_and_message() {
    for readiness in [
        Readiness::Ready {
            reason: "Reconciled".into(),
            message: "all up to date".into(),
        },
        Readiness::Reconciling {
            reason: "Rollout".into(),
            message: "1 of 2 replicas".into(),
        },
        Readiness::Stalled {
            reason: "ChildNotOwned".into(),
            message: "taken".into(),
        },
    ] {
        let mut s = S::default();
        StatusDraft::new(&mut s, conds, 1, at(1), KSTATUS).set_readiness(&readiness);
        let (Readiness::Ready { reason, message }
        | Readiness::Reconciling { reason, message }
        | Readiness::Stalled { reason, message }) = &readiness;
        let true_one = s.conditions.iter().find(|c| c.status == "True").unwrap();
        assert_eq!((&true_one.reason, &true_one.message), (reason, message));
        let ready = s.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
        assert_eq!(&ready.reason, reason, "Ready says why (not) ready");
        let others: Vec<_> = s
            .conditions
            .iter()
            .filter(|c| c.type_ != "Ready" && c.status == "False")
            .collect();
        for c in &others {
            assert_ne!(&c.reason, reason, "{readiness:?}: {c:?}");
            assert_ne!(&c.message, message, "{readiness:?}: {c:?}");
        }
    }
}

#[test]
fn only_declared_kstatus_conditions_are_set() {
    let mut s = S::default();
    StatusDraft::new(&mut s, conds, 1, at(1), &["Ready"]).set_readiness(&Readiness::Ready {
        reason: "Ok".into(),
        message: String::new(),
    });
    assert_eq!(s.conditions.len(), 1);
}

#[test]
fn invalid_reason_type_message_and_undeclared_are_errors() {
    let mut s = S::default();
    let mut d = StatusDraft::new(&mut s, conds, 1, at(1), KSTATUS);
    d.set_condition("Ready", ConditionStatus::True, "not ok!", "");
    assert!(matches!(
        d.into_error(),
        Some(StatusError::InvalidReason(_))
    ));
    let mut d = StatusDraft::new(&mut s, conds, 1, at(1), KSTATUS);
    d.set_condition("Degraded", ConditionStatus::True, "Ok", "");
    assert!(matches!(
        d.into_error(),
        Some(StatusError::UndeclaredType(_))
    ));
    assert!(s.conditions.is_empty(), "nothing set after errors");
    assert!(matches!(
        validate_condition("Ready", "Ok", &"x".repeat(32769)),
        Err(StatusError::MessageTooLong(32769))
    ));
}

#[test]
fn a_long_message_is_cut_to_1024_bytes_at_a_character_boundary() {
    let mut s = S::default();
    // 48,000 bytes of four-byte characters after an odd ASCII prefix: over the API server's
    // 32 KiB limit, and the 1024-byte cut falls inside a character.
    let big = format!("ab{}", "😀".repeat(12000));
    let mut d = StatusDraft::new(&mut s, conds, 1, at(1), KSTATUS);
    d.set_condition("Ready", ConditionStatus::False, "ChildNotOwned", &big);
    assert!(d.into_error().is_none());
    let message = &s.conditions[0].message;
    assert!(
        message.len() <= MAX_MESSAGE_BYTES,
        "{} bytes",
        message.len()
    );
    assert!(
        message.len() > MAX_MESSAGE_BYTES - 8,
        "{} bytes",
        message.len()
    );
    assert!(message.ends_with('…'));
    assert!(big.starts_with(message.trim_end_matches('…')));
}

#[test]
fn validation_rules() {
    for ok in ["Ready", "tenancy.idem.dev/QuotaApplied", "a", "A-b_c.d"] {
        assert!(valid_type(ok), "{ok}");
    }
    for bad in [
        "",
        "-Ready",
        "Ready-",
        "Bad/Ready",
        "has space",
        &"x".repeat(64),
    ] {
        assert!(!valid_type(bad), "{bad}");
    }
    for ok in ["Reconciled", "A", "Child_Not:Owned,2"] {
        assert!(valid_reason(ok), "{ok}");
    }
    for bad in [
        "",
        "1Reason",
        "Reason:",
        "Has Space",
        "dash-ed",
        &"x".repeat(1025),
    ] {
        assert!(!valid_reason(bad), "{bad}");
    }
}
