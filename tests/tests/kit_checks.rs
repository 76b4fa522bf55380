//! The idempotence test kit on the real control plane: a correct reconcile passes every
//! check, and each check catches a reconcile broken the way it is meant to catch.

mod kit_support;

use std::time::Duration;

use idem_tests::kit::{Check, Kit, Options, Report};
use kit_support::{Flaw, setup};

async fn run(flaw: Flaw, checks: &[Check]) -> Report {
    run_with(flaw, 2, checks).await
}

async fn run_with(flaw: Flaw, items: usize, checks: &[Check]) -> Report {
    let subject = setup(flaw, items).await;
    // A broken reconcile fails fast: fewer and shorter waits for repairs that never come.
    let options = Options {
        repair_timeout: Duration::from_secs(4),
        max_failures: 2,
        ..Options::default()
    };
    let report = Kit::new(idem_tests::shared(), subject)
        .options(options)
        .checks(checks)
        .run_all()
        .await
        .expect("the kit runs");
    eprintln!("{flaw:?}:\n{report}");
    report
}

#[tokio::test(flavor = "multi_thread")]
async fn a_correct_reconcile_passes_every_check() {
    let report = run_with(Flaw::None, 8, &Check::ALL).await;
    report.assert_idempotent();
    assert_eq!(report.checks.len(), Check::ALL.len());
    let repeat = report.get(Check::Repeat).unwrap();
    assert_eq!(repeat.figure_value("requests"), Some("0"));
    let crash = report.get(Check::Crash).unwrap();
    assert!(
        crash
            .figure_value("crash points")
            .unwrap()
            .parse::<u32>()
            .unwrap()
            >= 9,
        "eight children and a status: nine requests to crash after\n{report}"
    );
    let stale = report.get(Check::Stale).unwrap();
    assert_eq!(
        stale.figure_value("flips"),
        None,
        "the stale check ran\n{report}"
    );
    let tamper = report.get(Check::Tamper).unwrap();
    assert!(
        tamper
            .figure_value("fields tampered")
            .unwrap()
            .parse::<u32>()
            .unwrap()
            >= 24,
        "eight children with two labels and one data key each\n{report}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn stale_catches_a_record_written_from_a_stale_copy() {
    let report = run(Flaw::StaleRecord, &[Check::Repeat, Check::Stale]).await;
    assert!(report.caught(Check::Stale), "{report}");
    let evidence = report.get(Check::Stale).unwrap().evidence.join("\n");
    assert!(
        evidence.contains("extra child") && evidence.contains("-i2"),
        "the child of the flipped spec leaked: {evidence}"
    );
    assert!(
        !report.caught(Check::Repeat),
        "only stale reads are broken\n{report}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn repeat_catches_status_written_on_every_pass() {
    let report = run(Flaw::StatusEveryPass, &[Check::Repeat, Check::Race]).await;
    assert!(report.caught(Check::Repeat), "{report}");
    let evidence = report.get(Check::Repeat).unwrap().evidence.join("\n");
    assert!(
        evidence.contains("PATCH") && evidence.contains("/status"),
        "{evidence}"
    );
    assert!(evidence.contains("lastTransitionTime"), "{evidence}");
    assert!(
        !report.caught(Check::Race),
        "only repeat is broken\n{report}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_list_appended_to_on_every_pass_never_converges() {
    let report = run(Flaw::AppendsToList, &[Check::Repeat, Check::Tamper]).await;
    // It never converges: the cause of the report, and no check runs.
    let cause = report.cause.clone().unwrap_or_default();
    assert!(cause.contains("not converged"), "{report}");
    assert!(cause.contains("/data/log"), "{cause}");
    assert!(report.checks.iter().all(|c| !c.ran), "{report}");
    assert!(
        std::panic::catch_unwind(|| report.assert_idempotent()).is_err(),
        "{report}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn crash_catches_a_post_that_does_not_handle_already_exists() {
    let report = run(Flaw::PostOnce, &[Check::Repeat, Check::Crash]).await;
    assert!(
        !report.caught(Check::Repeat),
        "serially it converges\n{report}"
    );
    assert!(report.caught(Check::Crash), "{report}");
    let evidence = report.get(Check::Crash).unwrap().evidence.join("\n");
    assert!(evidence.contains("after request 1 (POST"), "{evidence}");
    assert!(
        evidence.to_lowercase().contains("alreadyexists") || evidence.contains("already exists"),
        "{evidence}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn race_catches_children_created_under_random_names() {
    let report = run(Flaw::RandomName, &[Check::Repeat, Check::Race]).await;
    assert!(
        !report.caught(Check::Repeat),
        "serially it converges\n{report}"
    );
    assert!(report.caught(Check::Race), "{report}");
    let evidence = report.get(Check::Race).unwrap().evidence.join("\n");
    assert!(evidence.contains("extra child"), "{evidence}");
}

#[tokio::test(flavor = "multi_thread")]
async fn tamper_catches_a_reconcile_that_never_repairs() {
    let report = run(Flaw::NoRepair, &[Check::Repeat, Check::Tamper]).await;
    assert!(!report.caught(Check::Repeat), "{report}");
    assert!(report.caught(Check::Tamper), "{report}");
}

#[tokio::test(flavor = "multi_thread")]
async fn tamper_catches_a_repair_that_drops_another_managers_fields() {
    let report = run(Flaw::ReplacesWhole, &[Check::Tamper]).await;
    assert!(report.caught(Check::Tamper), "{report}");
    let evidence = report.get(Check::Tamper).unwrap().evidence.join("\n");
    assert!(evidence.contains("tamperer's own annotation"), "{evidence}");
}

#[tokio::test(flavor = "multi_thread")]
async fn faults_pass_a_correct_reconcile_of_twenty_children() {
    let report = run_with(Flaw::None, 20, &[Check::Faults]).await;
    report.assert_idempotent();
    let faults = report.get(Check::Faults).unwrap();
    let ratio: f64 = faults.figure_value("ratio").unwrap().parse().unwrap();
    assert!(ratio <= 1.2, "{report}");
}

#[tokio::test(flavor = "multi_thread")]
async fn faults_catch_a_conflict_taken_for_a_permanent_failure() {
    let report = run_with(Flaw::ConflictIsFatal, 20, &[Check::Repeat, Check::Faults]).await;
    assert!(
        !report.caught(Check::Repeat),
        "without faults it converges\n{report}"
    );
    assert!(report.caught(Check::Faults), "{report}");
    let evidence = report.get(Check::Faults).unwrap().evidence.join("\n");
    assert!(evidence.contains("permanent failure"), "{evidence}");
}

#[tokio::test(flavor = "multi_thread")]
async fn faults_catch_a_reconcile_that_redoes_everything_after_an_error() {
    let report = run_with(Flaw::RedoAllAfterError, 20, &[Check::Repeat, Check::Faults]).await;
    assert!(
        !report.caught(Check::Repeat),
        "without faults it converges\n{report}"
    );
    assert!(report.caught(Check::Faults), "{report}");
    let evidence = report.get(Check::Faults).unwrap().evidence.join("\n");
    assert!(evidence.contains("exceeds the budget"), "{evidence}");
}

#[tokio::test(flavor = "multi_thread")]
async fn options_change_what_the_checks_do() {
    let options = Options {
        racers: 2,
        crash_points: Some(2),
        ..Options::default()
    };
    let report = Kit::new(idem_tests::shared(), setup(Flaw::None, 4).await)
        .options(options)
        .checks(&[Check::Race, Check::Crash])
        .run_all()
        .await
        .expect("the kit runs");
    eprintln!("{report}");
    let figure = |c: Check, name: &str| report.get(c).unwrap().figure_value(name).unwrap();
    assert_eq!(figure(Check::Race, "racers"), "2");
    assert_eq!(figure(Check::Crash, "crash points"), "2");

    // Caught at 1.2× (`faults_catch_a_reconcile_that_redoes_everything_after_an_error`),
    // passed at 2×.
    let options = Options {
        fault_budget: 2.0,
        ..Options::default()
    };
    let report = Kit::new(
        idem_tests::shared(),
        setup(Flaw::RedoAllAfterError, 20).await,
    )
    .options(options)
    .checks(&[Check::Faults])
    .run_all()
    .await
    .expect("the kit runs");
    eprintln!("{report}");
    assert!(!report.caught(Check::Faults), "{report}");
    let faults = report.get(Check::Faults).unwrap();
    assert_eq!(faults.figure_value("budget"), Some("42.0"), "{report}");

    let options = Options {
        max_failures: 1,
        repair_timeout: Duration::from_secs(1),
        ..Options::default()
    };
    let report = Kit::new(idem_tests::shared(), setup(Flaw::NoRepair, 2).await)
        .options(options)
        .checks(&[Check::Tamper])
        .run_all()
        .await
        .expect("the kit runs");
    let tamper = report.get(Check::Tamper).unwrap();
    assert_eq!(
        tamper.figure_value("fields tampered"),
        Some("1"),
        "{report}"
    );
    assert!(
        tamper.evidence.last().unwrap().contains("stopped after 1"),
        "{report}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn convergence_limits_are_the_options() {
    let reference = |report: &Report| report.cause.clone().unwrap_or_default();
    let limits = Options {
        max_passes: 3,
        settle_timeout: Duration::from_secs(1),
        pass_timeout: Duration::from_secs(1),
        ..Options::default()
    };
    for (flaw, expected) in [
        (Flaw::AppendsToList, "not converged after 3 passes"),
        (
            Flaw::NeverSettles,
            "not settled (the subject's `settled`) within 1 s",
        ),
        (Flaw::Hangs, "the pass took longer than 1 s"),
    ] {
        let report = Kit::new(idem_tests::shared(), setup(flaw, 2).await)
            .options(limits.clone())
            .checks(&[Check::Repeat])
            .run_all()
            .await
            .expect("the kit runs");
        assert!(reference(&report).contains(expected), "{flaw:?}: {report}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_subject_left_stalled_by_a_quiet_pass_fails_without_waiting_out_the_settle_timeout() {
    let options = Options {
        settle_timeout: Duration::from_secs(600),
        ..Options::default()
    };
    let started = std::time::Instant::now();
    let report = Kit::new(idem_tests::shared(), setup(Flaw::StallsQuietly, 2).await)
        .options(options)
        .checks(&[Check::Repeat])
        .run_all()
        .await
        .expect("the kit runs");
    let cause = report.cause.clone().unwrap_or_default();
    assert!(cause.contains("Stalled=True (CannotBeDone)"), "{report}");
    assert!(cause.contains("left it Stalled"), "{report}");
    // Well within the 600 s it would otherwise wait (the run is seconds).
    assert!(started.elapsed() < Duration::from_secs(300), "{report}");
}

#[tokio::test(flavor = "multi_thread")]
async fn faults_allow_one_retry_per_fault_to_a_three_request_reconcile() {
    // Two children and a status: 3 requests clean. Under faults a write may be made again from
    // a cache that had not yet seen it after the expired watch, and a pass failed by a fault
    // records its error in status: 4 or 5 requests, over 1.2 × 3 = 3.6, which the budget of
    // one request per fault admits. (The 429 itself is retried by kube's client, as a user's
    // client retries it: it reaches the server once, so whether the run actually pays these
    // costs depends on timing; the budget must admit them either way.)
    let report = run_with(Flaw::ErrorInStatus, 2, &[Check::Faults]).await;
    report.assert_idempotent();
    let faults = report.get(Check::Faults).unwrap();
    assert_eq!(
        faults.figure_value("fault-free requests"),
        Some("3"),
        "{report}"
    );
    // 3 + one each for the 429, the cut watch and the expired one (over 1.2 × 3 = 3.6).
    assert_eq!(faults.figure_value("budget"), Some("6.0"), "{report}");
    let ratio: f64 = faults.figure_value("ratio").unwrap().parse().unwrap();
    assert!(ratio <= 2.0, "within the budget of 6 requests\n{report}");
}

#[tokio::test(flavor = "multi_thread")]
async fn repeat_names_the_cache_rule_for_a_correct_but_uncached_reconcile() {
    let report = run(Flaw::BlindApply, &[Check::Repeat]).await;
    assert!(report.caught(Check::Repeat), "{report}");
    let evidence = report.get(Check::Repeat).unwrap().evidence.join("\n");
    assert!(evidence.contains("PATCH"), "{evidence}");
    assert!(
        evidence.contains("makes no request of any verb")
            && evidence.contains("watch caches")
            && evidence.contains("only when the cache shows drift"),
        "{evidence}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failing_clean_convergence_is_one_cause_and_no_check_runs() {
    let report = run(Flaw::PostAlways, &Check::ALL).await;
    let cause = report.cause.clone().expect("no clean convergence");
    assert!(cause.contains("409 AlreadyExists: "), "{cause}");
    assert!(
        !cause.contains("ErrorResponse"),
        "the status, not its Debug dump: {cause}"
    );
    assert_eq!(report.checks.len(), Check::ALL.len());
    assert!(
        report.checks.iter().all(|c| !c.ran && !c.passed),
        "{report}"
    );
    assert!(Check::ALL.iter().all(|&c| !report.caught(c)), "{report}");
    let text = report.to_string();
    assert_eq!(text.matches("no clean convergence").count(), 1, "{text}");
    assert!(std::panic::catch_unwind(|| report.assert_idempotent()).is_err());
}

#[tokio::test(flavor = "multi_thread")]
async fn race_catches_a_generated_value_a_racing_reconcile_wrote_over() {
    // Read from the cache first, generated when absent: serially it converges, and once the
    // value is normalised away (or compared by presence only) every end state looks alike.
    let report = run(Flaw::GeneratedRacy, &[Check::Repeat, Check::Race]).await;
    assert!(
        !report.caught(Check::Repeat),
        "serially it converges\n{report}"
    );
    assert!(report.caught(Check::Race), "{report}");
    let evidence = report.get(Check::Race).unwrap().evidence.join("\n");
    assert!(
        evidence.contains("/data is created once, yet changed after its creation"),
        "{evidence}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_value_created_once_passes_every_check() {
    // Its value differs in every instance: compared by presence across instances, followed
    // within each.
    let report = run(Flaw::GeneratedOnce, &Check::ALL).await;
    report.assert_idempotent();
    let tamper = report.get(Check::Tamper).unwrap();
    assert_eq!(
        tamper.figure_value("created-once values left alone"),
        Some("1"),
        "{report}"
    );
}
