//! The model check run to completion: the worlds hold (with the state counts measured when this
//! was written: a change of the engine's decisions or of the model shows here first), and a
//! store broken on purpose is caught with a counterexample.

use mcp_idempotency::AfterCrash;

use super::properties::names;
use super::{check, Config, ConfigError, Expectation, Report, StoreFlaw};

fn run(config: Config) -> Report {
    let report = check(config).expect("a valid config");
    println!("{report}");
    report
}

fn reexecute() -> Config {
    Config {
        after_crash: AfterCrash::Reexecute,
        ..Config::default()
    }
}

/// A world without crashes or lost answers, where the counterexamples of a broken store are
/// short.
fn small(flaw: StoreFlaw) -> Config {
    Config {
        after_crash: AfterCrash::Reexecute,
        sends_per_key: 2,
        crashes: 0,
        lost_answers: 0,
        store_flaw: Some(flaw),
        ..Config::default()
    }
}

fn assert_fails_with_a_counterexample(report: &Report, name: &str) {
    let property = report.property(name).expect("the model declares it");
    assert_eq!(property.expectation, Expectation::Always);
    assert!(!property.holds, "{name} should fail: {report}");
    assert!(
        property.path.len() > 2,
        "a counterexample of several steps: {:?}",
        property.path
    );
}

#[test]
fn under_reject_a_key_runs_at_most_once() {
    let report = run(Config::default());
    assert!(report.holds(), "{report}");
    assert_eq!(report.unique_states, 16_394);
    assert_eq!(report.max_depth, 11);
    assert_eq!(report.max_runs_per_key, 1);
    assert_eq!(report.rerun_states, 0);
}

#[test]
fn under_reexecute_a_key_runs_again_only_after_a_take_over() {
    let report = run(reexecute());
    assert!(report.holds(), "{report}");
    assert_eq!(report.unique_states, 92_832);
    assert_eq!(report.max_runs_per_key, 2);
    // Re-executions are reached, and counted.
    assert_eq!(report.rerun_states, 34_518);
}

#[test]
fn two_take_overs_in_a_row_run_a_key_three_times() {
    // One tick more: a second lease can run out after the first take-over. (No lost answers,
    // to keep the run short.)
    let report = run(Config {
        ticks: 4,
        lost_answers: 0,
        ..reexecute()
    });
    assert!(report.holds(), "{report}");
    assert_eq!(report.unique_states, 63_175);
    assert_eq!(report.max_runs_per_key, 3);
}

#[test]
fn two_keys_are_decided_apart() {
    let report = run(Config {
        keys: 2,
        sends_per_key: 2,
        ticks: 2,
        lost_answers: 0,
        ..Config::default()
    });
    assert!(report.holds(), "{report}");
    assert_eq!(report.unique_states, 118_475);
}

#[test]
fn an_unfenced_completion_is_caught() {
    let report = run(small(StoreFlaw::UnfencedCompletion));
    assert_fails_with_a_counterexample(&report, names::WRITE_ONCE);
    assert_fails_with_a_counterexample(&report, names::ANSWERS);
    assert!(report.property(names::RUN_AGAIN_AFTER_LAPSE).unwrap().holds);
}

#[test]
fn an_unfenced_completion_needs_two_owners_to_show() {
    // Under `Reject` no second owner ever holds the key, so the fence is never tested.
    let report = run(Config {
        store_flaw: Some(StoreFlaw::UnfencedCompletion),
        ..Config::default()
    });
    assert!(report.holds(), "{report}");
}

#[test]
fn a_take_over_of_a_live_lease_is_caught() {
    let report = run(small(StoreFlaw::TakeOverLiveLease));
    assert_fails_with_a_counterexample(&report, names::RUN_AGAIN_AFTER_LAPSE);
}

#[test]
fn configs_outside_the_bounds_are_refused() {
    let error = check(Config {
        keys: 3,
        ..Config::default()
    })
    .unwrap_err();
    assert_eq!(
        error,
        ConfigError {
            field: "keys",
            value: 3,
            min: 1,
            max: 2
        }
    );
    assert_eq!(
        error.to_string(),
        "model check: `keys` must be within 1..=2, not 3"
    );
}
