// cluster/deploy/monitoring/ with the real tools: promtool checks the alert rules and runs their
// unit tests (every alert fires on its series after its `for` and not before, and stays quiet
// on the series that must not fire it), checks the plain Prometheus configuration, kubectl
// builds the kustomization, and every metric the rules and the dashboard read is one the
// controllers, the agent or kube-state-metrics exports.
import t from "tap";
import { execFile } from "node:child_process";
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { parse, stringify } from "yaml";
import { FAMILIES, ControllerMetrics } from "../../cluster/controllers/metrics.ts";
import { binaries } from "../../scripts/lib/control-plane.ts";

const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
const MON = path.join(REPO, "cluster/deploy/monitoring");
const RULES = path.join(MON, "rules/node-manager.rules.yaml");
const TESTS = path.join(REPO, "test/fixtures/monitoring/node-manager.rules.test.yaml");

function run(cmd: string, args: string[]): Promise<{ code: number; out: string }> {
  return new Promise((resolve) =>
    execFile(cmd, args, { maxBuffer: 16 << 20 }, (err, stdout, stderr) =>
      resolve({ code: err ? ((err as { code?: number }).code ?? 1) : 0, out: `${stdout}${stderr}` }),
    ),
  );
}

const promtool = (await run("promtool", ["--version"])).code === 0;
if (!promtool) t.comment("promtool not found: install Debian's prometheus package (.ci/run does)");
const tmp = await mkdtemp(path.join(os.tmpdir(), "bashible-monitoring-"));
t.teardown(() => rm(tmp, { recursive: true, force: true }));

interface Rule {
  alert?: string;
  record?: string;
  expr: string;
  labels?: Record<string, string>;
  annotations?: Record<string, string>;
}
const rules = parse(await readFile(RULES, "utf8")) as { groups: { name: string; rules: Rule[] }[] };

/** An alert's annotation as Prometheus renders it, for the label-only templates the rules use. */
function render(template: string, labels: Record<string, string>, value: string): string {
  const out = template
    .replaceAll("{{ $value | humanize }}", value)
    .replace(/\{\{ \$labels\.(\w+) \}\}/g, (_, k: string) => labels[k] ?? "");
  if (out.includes("{{")) throw new Error(`a template this test cannot render: ${template}`);
  return out;
}

t.test("promtool check rules", { skip: !promtool }, async (t) => {
  const r = await run("promtool", ["check", "rules", RULES]);
  t.equal(r.code, 0, r.out);
  t.match(r.out, /SUCCESS: 18 rules found/);
});

t.test("promtool test rules: every alert, firing and not firing", { skip: !promtool }, async (t) => {
  const suite = parse(await readFile(TESTS, "utf8")) as {
    rule_files: string[];
    tests: {
      name: string;
      alert_rule_test: {
        alertname: string;
        exp_alerts: { exp_labels: Record<string, string>; exp_annotations?: Record<string, string> }[];
      }[];
    }[];
  };
  const byName = new Map<string, Rule[]>();
  for (const g of rules.groups)
    for (const r of g.rules) if (r.alert) byName.set(r.alert, [...(byName.get(r.alert) ?? []), r]);
  const tested = new Set<string>();
  const firing = new Set<string>();
  for (const c of suite.tests) {
    for (const a of c.alert_rule_test) {
      tested.add(a.alertname);
      for (const e of a.exp_alerts) {
        firing.add(a.alertname);
        if (e.exp_annotations) continue;
        const rule = byName.get(a.alertname)?.find((r) => r.labels?.severity_level === e.exp_labels.severity_level);
        if (!rule)
          throw new Error(`${c.name}: no rule ${a.alertname} with severity_level ${e.exp_labels.severity_level}`);
        e.exp_annotations = Object.fromEntries(
          Object.entries(rule.annotations ?? {}).map(([k, v]) => [k, render(v, e.exp_labels, "1")]),
        );
      }
    }
  }
  t.same(
    [...byName.keys()].filter((a) => !firing.has(a)),
    [],
    "every alert has a case where it fires",
  );
  t.same(
    [...byName.keys()].filter((a) => !tested.has(a)),
    [],
    "and is checked where it must not",
  );
  suite.rule_files = [RULES];
  const file = path.join(tmp, "rules.test.yaml");
  await writeFile(file, stringify(suite));
  const r = await run("promtool", ["test", "rules", file]);
  t.equal(r.code, 0, r.out);
  t.match(r.out, /SUCCESS/);
});

t.test("the PrometheusRule carries the same groups as the rule file", async (t) => {
  const manifestFile = path.join(MON, "prometheus-rule.yaml");
  const text = await readFile(manifestFile, "utf8");
  const manifest = parse(text) as { kind: string; spec: { groups: unknown } };
  if (process.env.BASHIBLE_UPDATE_MONITORING) {
    const src = await readFile(RULES, "utf8");
    const body = src.slice(src.indexOf("groups:"));
    const head = text.slice(0, text.indexOf("spec:\n") + "spec:\n".length);
    await writeFile(manifestFile, head + body.replace(/^(?=.)/gm, "  "));
    t.pass("regenerated");
    return;
  }
  t.equal(manifest.kind, "PrometheusRule");
  t.same(
    manifest.spec.groups,
    rules.groups,
    "regenerate: BASHIBLE_UPDATE_MONITORING=1 npx tap test/integration/monitoring.test.ts",
  );
});

t.test("the plain Prometheus configuration checks (kubernetes_sd_configs aside)", { skip: !promtool }, async (t) => {
  const config = parse(await readFile(path.join(MON, "prometheus.yml"), "utf8")) as {
    rule_files: string[];
    scrape_configs: Record<string, unknown>[];
  };
  t.same(config.rule_files, ["rules/node-manager.rules.yaml"]);
  t.same(
    config.scrape_configs.map((j) => j.job_name),
    ["bashible-server", "bashible-agent"],
  );
  // Debian's promtool is built without Kubernetes discovery, and the in-cluster files do not
  // exist here: static targets and local files stand in; the rest is checked as written.
  const token = path.join(tmp, "token");
  const ca = path.join(tmp, "ca.crt");
  await writeFile(token, "x");
  await writeFile(ca, "");
  const local = {
    rule_files: [RULES],
    scrape_configs: config.scrape_configs.map((j) => {
      const { kubernetes_sd_configs: _, ...rest } = j;
      return JSON.parse(
        JSON.stringify({ ...rest, static_configs: [{ targets: ["127.0.0.1:9"] }] })
          .replaceAll("/var/run/secrets/kubernetes.io/serviceaccount/token", token)
          .replaceAll("/var/run/secrets/kubernetes.io/serviceaccount/ca.crt", ca),
      );
    }),
  };
  const file = path.join(tmp, "prometheus.yml");
  await writeFile(file, stringify(local));
  const r = await run("promtool", ["check", "config", file]);
  t.equal(r.code, 0, r.out);
});

t.test("kubectl builds the kustomization: rules, monitors, RBAC and the dashboard", async (t) => {
  const kubectl = path.join(await binaries(), "kubectl");
  const r = await run(kubectl, ["kustomize", MON]);
  t.equal(r.code, 0, r.out);
  const docs = r.out.split(/^---$/m).map(
    (d) =>
      parse(d) as {
        kind: string;
        metadata: { name: string; labels?: Record<string, string> };
        data?: Record<string, string>;
      },
  );
  t.same(docs.map((d) => `${d.kind}/${d.metadata.name}`).sort(), [
    "ClusterRole/bashible:metrics-reader",
    "ClusterRoleBinding/bashible:metrics-reader",
    "ConfigMap/bashible-node-groups-dashboard",
    "PodMonitor/bashible-server",
    "PrometheusRule/bashible-node-manager",
    "ScrapeConfig/bashible-agent",
    "Secret/bashible-metrics-scraper-token",
    "ServiceAccount/bashible-metrics-scraper",
  ]);
  const cm = docs.find((d) => d.kind === "ConfigMap");
  t.equal(cm?.metadata.labels?.grafana_dashboard, "1", "Grafana's sidecar picks it up");
  t.ok(JSON.parse(cm?.data?.["node-groups.json"] ?? "null")?.panels?.length, "the dashboard JSON inside");
});

t.test("every metric the rules and the dashboard read is exported by someone", async (t) => {
  const known = new Set([
    ...Object.keys(FAMILIES),
    ...[...new ControllerMetrics().registry.text().matchAll(/^# TYPE (\S+)/gm)].map((m) => m[1]!),
    "bashible_fencing_controller_actions_total",
    // kube-state-metrics, as Deckhouse's own rules use it.
    "kube_node_status_condition",
  ]);
  const fencing = await readFile(path.join(REPO, "agent/fencing/metrics.ts"), "utf8");
  for (const m of fencing.matchAll(/"(bashible_fencing_[a-z_]+)"/g)) known.add(m[1]!);
  const oom = await readFile(path.join(REPO, "agent/early-oom/early-oom.ts"), "utf8");
  const prefix = /const p = "([a-z_]+)"/.exec(oom)?.[1] ?? "";
  for (const m of oom.matchAll(/`\$\{p\}([a-z_]+)`/g)) known.add(`${prefix}${m[1]}`);
  t.ok(
    known.has("bashible_early_oom_kills_total") && known.has("bashible_fencing_armed"),
    "the agent's names were found",
  );
  const dashboard = JSON.parse(await readFile(path.join(MON, "dashboards/node-groups.json"), "utf8")) as {
    panels: { targets?: { expr: string }[] }[];
  };
  const exprs = [
    ...rules.groups.flatMap((g) => g.rules.map((r) => r.expr)),
    ...dashboard.panels.flatMap((p) => (p.targets ?? []).map((x) => x.expr)),
  ];
  const used = new Set(
    exprs.flatMap((e) =>
      [...e.matchAll(/\b((?:node_group_|d8_|bashible_|kube_|early_oom_)[a-z0-9_]+)\b/g)].map((m) => m[1]!),
    ),
  );
  t.same(
    [...used].filter((m) => !known.has(m)),
    [],
    "no metric nobody exports",
  );
  t.ok(used.has("node_group_node_status") && used.has("bashible_node_drains_total"));
});
