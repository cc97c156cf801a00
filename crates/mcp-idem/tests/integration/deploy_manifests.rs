//! `deploy/kubernetes/` and `deploy/compose/`: the manifests validate against the Kubernetes
//! schemas (`kubernetes-validate`, which bundles them), the ServiceMonitor against the Prometheus
//! Operator's (npm `@kubernetes-models/prometheus-operator`), the Compose file against the Compose
//! specification (`check-jsonschema --builtin-schema vendor.compose-spec`), and what they hand
//! `mcp-idem` is accepted by `mcp-idem config-check proxy`. Each validator is also shown a broken
//! copy, which it must refuse. The tools come from `deploy/tools.sh`.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{json, Value};

use crate::support::deploy::{
    deploy_path, describe, node_package, run, run_ok, venv_tool, yaml_document, yaml_documents,
};

/// The oldest Kubernetes the manifests are for: `lifecycle.preStop.sleep` is on by default from
/// 1.30.
const OLDEST_KUBERNETES: &str = "1.30";

/// The manifests under `deploy/kubernetes/`, by file, as JSON.
fn manifests(python: &Path) -> Vec<(PathBuf, Value)> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(deploy_path("kubernetes"))
        .expect("read deploy/kubernetes")
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "yaml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no manifests in deploy/kubernetes");
    files
        .into_iter()
        .flat_map(|file| {
            yaml_documents(python, &file)
                .into_iter()
                .map(move |document| (file.clone(), document))
        })
        .collect()
}

/// The one manifest of `kind`.
fn of_kind<'a>(manifests: &'a [(PathBuf, Value)], kind: &str) -> &'a Value {
    let found: Vec<&Value> = manifests
        .iter()
        .map(|(_, manifest)| manifest)
        .filter(|manifest| manifest["kind"] == kind)
        .collect();
    assert_eq!(found.len(), 1, "one {kind} in deploy/kubernetes");
    found[0]
}

#[test]
fn kubernetes_manifests_validate_against_the_schemas() {
    let test = "kubernetes_manifests_validate_against_the_schemas";
    let Some(validate) = venv_tool(test, "kubernetes-validate") else {
        return;
    };
    let Some(python) = venv_tool(test, "python") else {
        return;
    };
    let Some((node, _)) = node_package(test, "@kubernetes-models/prometheus-operator") else {
        return;
    };
    let manifests = manifests(&python);
    let dir = tempfile::tempdir().unwrap();

    // Every core resource, strictly (an unknown field is an error), against the newest
    // Kubernetes kubernetes-validate knows and the oldest the manifests are for.
    let core: Vec<&PathBuf> = manifests
        .iter()
        .filter(|(_, manifest)| manifest["kind"] != "ServiceMonitor")
        .map(|(file, _)| file)
        .collect();
    for version in [None, Some(OLDEST_KUBERNETES)] {
        let mut args = vec!["--strict".to_owned()];
        if let Some(version) = version {
            args.extend(["-k".to_owned(), version.to_owned()]);
        }
        args.extend(core.iter().map(|file| file.display().to_string()));
        let output = run_ok(&validate, &args);
        let text = describe(&output);
        assert!(
            !text.contains("WARN") && text.matches(" passed for resource ").count() == core.len(),
            "kubernetes-validate {args:?}:\n{text}"
        );
    }
    // A misspelt field is refused: the validation really looks.
    let deployment = deploy_path("kubernetes/deployment.yaml");
    let broken = dir.path().join("deployment.yaml");
    let text = std::fs::read_to_string(&deployment).unwrap();
    std::fs::write(&broken, text.replace("readinessProbe:", "readinesProbe:")).unwrap();
    let output = run(&validate, ["--strict".as_ref(), broken.as_os_str()]);
    assert!(
        !output.status.success() && describe(&output).contains("readinesProbe"),
        "kubernetes-validate accepted a misspelt field:\n{}",
        describe(&output)
    );

    // The ServiceMonitor, against the Prometheus Operator's schema.
    let monitors: Vec<&Value> = manifests
        .iter()
        .map(|(_, manifest)| manifest)
        .filter(|manifest| manifest["kind"] == "ServiceMonitor")
        .collect();
    assert_eq!(monitors.len(), 1, "one ServiceMonitor");
    let script = deploy_path("validate-servicemonitor.mjs");
    let good = dir.path().join("servicemonitor.json");
    std::fs::write(&good, serde_json::to_vec(&monitors).unwrap()).unwrap();
    let output = run_ok(&node, [script.as_os_str(), good.as_os_str()]);
    assert!(
        String::from_utf8_lossy(&output.stdout).contains("ServiceMonitor/mcp-idem: valid"),
        "{}",
        describe(&output)
    );
    let mut wrong = monitors[0].clone();
    wrong["spec"]["endpoints"][0]["interval"] = json!("15 seconds");
    let bad = dir.path().join("broken-servicemonitor.json");
    std::fs::write(&bad, serde_json::to_vec(&[wrong]).unwrap()).unwrap();
    let output = run(&node, [script.as_os_str(), bad.as_os_str()]);
    assert!(
        !output.status.success() && describe(&output).contains("interval"),
        "the ServiceMonitor schema accepted a malformed interval:\n{}",
        describe(&output)
    );
}

/// `20s` as seconds.
fn seconds(duration: &str) -> u64 {
    duration
        .strip_suffix('s')
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{duration:?}: expected whole seconds, e.g. 20s"))
}

/// The value of `--NAME=VALUE` in `args`.
fn flag<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    let prefix = format!("--{name}=");
    args.iter().find_map(|arg| arg.strip_prefix(&prefix))
}

fn strings(value: &Value) -> Vec<String> {
    value
        .as_array()
        .unwrap_or_else(|| panic!("{value}: not an array"))
        .iter()
        .map(|item| item.as_str().expect("a string").to_owned())
        .collect()
}

/// Whether every label `selector` asks for is in `labels`.
fn selects(selector: &Value, labels: &Value) -> bool {
    let selector = selector.as_object().expect("matchLabels");
    !selector.is_empty() && selector.iter().all(|(key, value)| labels[key] == *value)
}

/// `mcp-idem config-check proxy ARGS` with `envs`: exits 0, so that `proxy` would start with them.
fn config_check(what: &str, args: &[String], envs: &[(String, String)]) {
    assert_eq!(args.first().map(String::as_str), Some("proxy"), "{what}");
    let output = Command::new(env!("CARGO_BIN_EXE_mcp-idem"))
        .arg("config-check")
        .args(args)
        .envs(envs.iter().map(|(k, v)| (k, v)))
        .env_remove("MCP_IDEM_CONFIG")
        .output()
        .expect("run mcp-idem config-check");
    assert!(
        output.status.success(),
        "{what}: `mcp-idem config-check {}` refused it:\n{}",
        args.join(" "),
        describe(&output)
    );
}

#[test]
fn kubernetes_manifests_fit_together() {
    let test = "kubernetes_manifests_fit_together";
    let Some(python) = venv_tool(test, "python") else {
        return;
    };
    let manifests = manifests(&python);
    let deployment = of_kind(&manifests, "Deployment");
    let service = of_kind(&manifests, "Service");
    let budget = of_kind(&manifests, "PodDisruptionBudget");
    let monitor = of_kind(&manifests, "ServiceMonitor");
    let secret = of_kind(&manifests, "Secret");

    let pod = &deployment["spec"]["template"];
    let pod_labels = &pod["metadata"]["labels"];
    assert!(selects(
        &deployment["spec"]["selector"]["matchLabels"],
        pod_labels
    ));
    let containers = pod["spec"]["containers"].as_array().unwrap();
    assert_eq!(containers.len(), 1, "one container");
    let proxy = &containers[0];
    assert_eq!(pod["spec"]["securityContext"]["runAsUser"], 65532);
    let args = strings(&proxy["args"]);
    assert_eq!(args[0], "proxy");

    // Listening on all addresses, the Service's name allowed as Host.
    let listen = flag(&args, "listen").expect("--listen");
    assert!(listen.starts_with("0.0.0.0:"), "{listen}");
    let service_name = service["metadata"]["name"].as_str().unwrap();
    let allowed: Vec<&str> = args
        .iter()
        .filter_map(|arg| arg.strip_prefix("--allowed-host="))
        .collect();
    assert!(allowed.contains(&service_name), "{allowed:?}");

    // Ports, probes and the Service's targets agree.
    let port_of = |name: &str| {
        proxy["ports"]
            .as_array()
            .unwrap()
            .iter()
            .find(|port| port["name"] == name)
            .unwrap_or_else(|| panic!("no container port {name}"))["containerPort"]
            .as_u64()
            .unwrap()
    };
    assert_eq!(
        listen.rsplit(':').next().unwrap(),
        port_of("http").to_string()
    );
    let metrics_listen = flag(&args, "metrics-listen").expect("--metrics-listen");
    assert_eq!(metrics_listen, format!("0.0.0.0:{}", port_of("metrics")));
    for (probe, path) in [
        ("startupProbe", "/healthz"),
        ("livenessProbe", "/healthz"),
        ("readinessProbe", "/readyz"),
    ] {
        assert_eq!(proxy[probe]["httpGet"]["path"], path, "{probe}");
        assert_eq!(proxy[probe]["httpGet"]["port"], "metrics", "{probe}");
    }
    assert!(selects(&service["spec"]["selector"], pod_labels));
    for port in service["spec"]["ports"].as_array().unwrap() {
        port_of(port["targetPort"].as_str().expect("a named targetPort"));
    }

    // The kubelet waits for the preStop pause and the whole shutdown grace, and more.
    let grace = seconds(flag(&args, "shutdown-grace").expect("--shutdown-grace"));
    let pause = proxy["lifecycle"]["preStop"]["sleep"]["seconds"]
        .as_u64()
        .unwrap_or(0);
    let termination = pod["spec"]["terminationGracePeriodSeconds"]
        .as_u64()
        .expect("terminationGracePeriodSeconds");
    assert!(
        termination > pause + grace,
        "terminationGracePeriodSeconds {termination} <= preStop {pause} + --shutdown-grace {grace}"
    );

    // The store's URL from the Secret.
    let store = proxy["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|env| env["name"] == "MCP_IDEM_STORE")
        .expect("MCP_IDEM_STORE in env");
    let reference = &store["valueFrom"]["secretKeyRef"];
    assert_eq!(reference["name"], secret["metadata"]["name"]);
    let key = reference["key"].as_str().unwrap();
    let url = secret["stringData"][key]
        .as_str()
        .expect("the Secret's url");

    // The budget covers the Deployment's pods; the ServiceMonitor scrapes the Service's port.
    assert!(selects(
        &budget["spec"]["selector"]["matchLabels"],
        pod_labels
    ));
    assert!(selects(
        &monitor["spec"]["selector"]["matchLabels"],
        &service["metadata"]["labels"]
    ));
    let scraped = monitor["spec"]["endpoints"][0]["port"].as_str().unwrap();
    assert!(service["spec"]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .any(|port| port["name"] == scraped && port["targetPort"] == "metrics"));

    // And `proxy` takes these arguments (Kubernetes expands $(POD_NAMESPACE)).
    let args: Vec<String> = args
        .iter()
        .map(|arg| arg.replace("$(POD_NAMESPACE)", "default"))
        .collect();
    config_check(
        "deploy/kubernetes/deployment.yaml",
        &args,
        &[("MCP_IDEM_STORE".to_owned(), url.to_owned())],
    );
}

#[test]
fn compose_file_validates_against_the_compose_spec() {
    let test = "compose_file_validates_against_the_compose_spec";
    let Some(check) = venv_tool(test, "check-jsonschema") else {
        return;
    };
    let Some(python) = venv_tool(test, "python") else {
        return;
    };
    let file = deploy_path("compose/compose.yaml");
    let args = |path: &Path| {
        vec![
            "--builtin-schema".into(),
            "vendor.compose-spec".into(),
            path.as_os_str().to_owned(),
        ]
    };
    let output = run_ok(&check, args(&file));
    assert!(
        String::from_utf8_lossy(&output.stdout).contains("ok -- validation done"),
        "{}",
        describe(&output)
    );
    let dir = tempfile::tempdir().unwrap();
    let broken = dir.path().join("compose.yaml");
    let text = std::fs::read_to_string(&file).unwrap();
    std::fs::write(&broken, text.replacen("    command:", "    comand:", 1)).unwrap();
    let output = run(&check, args(&broken));
    assert!(
        !output.status.success(),
        "check-jsonschema accepted a misspelt key:\n{}",
        describe(&output)
    );

    // Two proxies, a Redis and an upstream; `proxy` takes each proxy's command and environment.
    let compose = yaml_document(&python, &file);
    let services = compose["services"].as_object().expect("services");
    let proxies: Vec<&String> = services
        .iter()
        .filter(|(_, service)| service["command"][0] == "proxy")
        .map(|(name, _)| name)
        .collect();
    assert_eq!(proxies.len(), 2, "two proxies: {proxies:?}");
    assert!(services
        .values()
        .any(|service| service["command"][0] == "redis-server"));
    assert!(services
        .values()
        .any(|service| service["command"][0] == "demo-server"));
    for name in proxies {
        let service = &services[name];
        let envs: Vec<(String, String)> = service["environment"]
            .as_object()
            .map(|env| {
                env.iter()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned()))
                    .collect()
            })
            .unwrap_or_default();
        config_check(
            &format!("deploy/compose/compose.yaml: {name}"),
            &strings(&service["command"]),
            &envs,
        );
    }
}
