// Validates ServiceMonitor objects against the Prometheus Operator's JSON schema, as shipped by
// npm's @kubernetes-models/prometheus-operator (installed by `npm ci` in deploy/).
// Usage: node deploy/validate-servicemonitor.mjs FILE.json, where FILE.json holds a JSON array of
// the objects (the test converts the YAML documents). Exits 1 with the schema's errors.
import { readFileSync } from "node:fs";
import { ServiceMonitor } from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/ServiceMonitor";

const objects = JSON.parse(readFileSync(process.argv[2], "utf8"));
let failed = false;
for (const object of objects) {
  const name = `${object.kind}/${object.metadata?.name}`;
  try {
    if (object.kind !== "ServiceMonitor") throw new Error(`not a ServiceMonitor: ${object.kind}`);
    new ServiceMonitor(object).validate();
    console.log(`${name}: valid`);
  } catch (err) {
    failed = true;
    console.error(`${name}: ${err.message}`);
  }
}
process.exit(failed ? 1 : 0);
