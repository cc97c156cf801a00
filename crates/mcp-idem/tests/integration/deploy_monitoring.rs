//! `deploy/prometheus/` and `deploy/grafana/`: the alert rules pass `promtool check rules` and
//! their unit tests (`promtool test rules`), which cover every alert, before and after its `for:`;
//! the committed dashboard is what `deploy/grafana/dashboard.py` (grafana-foundation-sdk) writes.
//! The tools come from `deploy/tools.sh`.

use std::collections::BTreeSet;

use serde_json::Value;

use crate::support::deploy::{
    deploy_path, describe, run, run_ok, system_tool, venv_tool, yaml_document,
};

#[test]
fn alert_rules_pass_promtool_check_and_their_unit_tests() {
    let test = "alert_rules_pass_promtool_check_and_their_unit_tests";
    let Some(promtool) = system_tool(test, "promtool") else {
        return;
    };
    let rules = deploy_path("prometheus/alerts.yml");
    let tests = deploy_path("prometheus/alerts.test.yml");
    let output = run_ok(
        &promtool,
        ["check".as_ref(), "rules".as_ref(), rules.as_os_str()],
    );
    assert!(
        describe(&output).contains("SUCCESS"),
        "{}",
        describe(&output)
    );
    let output = run_ok(
        &promtool,
        ["test".as_ref(), "rules".as_ref(), tests.as_os_str()],
    );
    assert!(
        describe(&output).contains("SUCCESS"),
        "{}",
        describe(&output)
    );

    // A rule that cannot parse is refused: promtool really checks.
    let dir = tempfile::tempdir().unwrap();
    let broken = dir.path().join("alerts.yml");
    let text = std::fs::read_to_string(&rules).unwrap();
    std::fs::write(&broken, text.replacen("rate(", "rate((", 1)).unwrap();
    let output = run(
        &promtool,
        ["check".as_ref(), "rules".as_ref(), broken.as_os_str()],
    );
    assert!(!output.status.success(), "{}", describe(&output));
}

/// `alerts.yml` without the `for:` of alert `name`.
fn without_for(rules: &str, name: &str) -> String {
    let start = rules
        .find(&format!("- alert: {name}\n"))
        .unwrap_or_else(|| panic!("no alert {name}"));
    let end = rules[start + 1..]
        .find("- alert: ")
        .map_or(rules.len(), |next| start + 1 + next);
    let block = &rules[start..end];
    let line = block
        .lines()
        .find(|line| line.trim_start().starts_with("for: "))
        .unwrap_or_else(|| panic!("{name} has no for:"));
    format!(
        "{}{}{}",
        &rules[..start],
        block.replacen(&format!("{line}\n"), "", 1),
        &rules[end..]
    )
}

#[test]
fn every_alert_has_a_unit_test_and_every_for_is_tested() {
    let test = "every_alert_has_a_unit_test_and_every_for_is_tested";
    let Some(python) = venv_tool(test, "python") else {
        return;
    };
    let Some(promtool) = system_tool(test, "promtool") else {
        return;
    };
    let rules_path = deploy_path("prometheus/alerts.yml");
    let tests_path = deploy_path("prometheus/alerts.test.yml");
    let rules = yaml_document(&python, &rules_path);
    let tests = yaml_document(&python, &tests_path);
    let alerts: Vec<&Value> = rules["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|group| group["rules"].as_array().unwrap())
        .filter(|rule| rule.get("alert").is_some())
        .collect();
    // The brief's five, at least.
    let required: BTreeSet<&str> = [
        "McpIdemStoreUnavailable",
        "McpIdemClaimsLeftAmbiguous",
        "McpIdemBypassesStoreDown",
        "McpIdemConflictSurge",
        "McpIdemQuotaNearFull",
    ]
    .into();
    let names: BTreeSet<&str> = alerts
        .iter()
        .map(|alert| alert["alert"].as_str().unwrap())
        .collect();
    assert!(
        names.is_superset(&required),
        "missing: {:?}",
        required.difference(&names)
    );
    let evaluations: Vec<&Value> = tests["tests"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|case| case["alert_rule_test"].as_array().unwrap())
        .collect();
    for name in &names {
        let of_alert: Vec<&&Value> = evaluations
            .iter()
            .filter(|evaluation| evaluation["alertname"] == *name)
            .collect();
        let quiet = of_alert
            .iter()
            .filter(|evaluation| evaluation["exp_alerts"].as_array().unwrap().is_empty())
            .count();
        assert!(
            of_alert.len() > quiet,
            "{name}: no unit test where it fires"
        );
        assert!(quiet > 0, "{name}: no unit test where it stays quiet");
    }

    // Each `for:` matters to the tests: without it, an alert fires where a test expects it to
    // be still pending, and `promtool test rules` fails on that alert.
    let text = std::fs::read_to_string(&rules_path).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let tests_copy = dir.path().join("alerts.test.yml");
    std::fs::copy(&tests_path, &tests_copy).unwrap();
    for alert in alerts.iter().filter(|alert| alert.get("for").is_some()) {
        let name = alert["alert"].as_str().unwrap();
        std::fs::write(dir.path().join("alerts.yml"), without_for(&text, name)).unwrap();
        let output = run(
            &promtool,
            ["test".as_ref(), "rules".as_ref(), tests_copy.as_os_str()],
        );
        let said = describe(&output);
        assert!(
            !output.status.success() && said.contains(&format!("alertname: {name}")),
            "{name}: the unit tests pass without its `for:`, so they do not test it:\n{said}"
        );
    }
}

#[test]
fn committed_dashboard_is_what_the_script_generates() {
    let test = "committed_dashboard_is_what_the_script_generates";
    let Some(python) = venv_tool(test, "python") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let generated = dir.path().join("mcp-idem.json");
    let script = deploy_path("grafana/dashboard.py");
    run_ok(&python, [script.as_os_str(), generated.as_os_str()]);
    let generated = std::fs::read_to_string(&generated).unwrap();
    let committed = std::fs::read_to_string(deploy_path("grafana/mcp-idem.json")).unwrap();
    assert!(
        generated == committed,
        "deploy/grafana/mcp-idem.json is not what deploy/grafana/dashboard.py writes: run \
         `deploy/.tools/venv/bin/python deploy/grafana/dashboard.py` and commit the result"
    );

    // The panels the dashboard promises (the list), each with a query.
    let dashboard: Value = serde_json::from_str(&committed).unwrap();
    let titles: BTreeSet<&str> = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|panel| panel["type"] != "row")
        .inspect(|panel| {
            assert!(
                !panel["targets"].as_array().unwrap().is_empty(),
                "{}: no query",
                panel["title"]
            );
        })
        .map(|panel| panel["title"].as_str().unwrap())
        .collect();
    for title in [
        "Decisions by key source",
        "Replays",
        "Conflicts",
        "Waits and duplicates in progress",
        "Store latency",
        "Store errors",
        "Bypasses",
        "Call duration by tool",
    ] {
        assert!(titles.contains(title), "no panel {title:?}: {titles:?}");
    }
}
