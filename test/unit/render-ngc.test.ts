// NodeGroupConfigurations in the renderer: Deckhouse's documentation examples render as
// Deckhouse renders them, with the context Deckhouse gives; bundle names, weights and the
// deprecated NodeUser key as Deckhouse takes them; all errors of a group reported at once; and
// the render loop reports a broken NGC once, and its recovery once.
import t from "tap";
import { execFile } from "node:child_process";
import { promisify } from "node:util";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { pino } from "pino";
import { loadConfigDir } from "../../cluster/sources/directory.ts";
import { renderAll, renderGroup } from "../../cluster/render/render.ts";
import { RenderError } from "../../cluster/render/errors.ts";
import type { NodeGroupConfigurationObject, NodeGroupObject, RenderInputs } from "../../cluster/render/inputs.ts";
import type { ScriptSpec } from "../../bundles/types.ts";
import { RenderLoop } from "../../cluster/server/render-loop.ts";
import { BundleStore } from "../../cluster/server/store.ts";
import { Metrics } from "../../cluster/server/metrics.ts";
import type { SourceSnapshot } from "../../cluster/sources/types.ts";

const run = promisify(execFile);
const EXAMPLE = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../../examples/cluster");
const base = (await loadConfigDir(EXAMPLE)).snapshot.inputs as RenderInputs;
const NOW = Date.parse("2026-01-01T00:00:00Z");

function inputs(configurations: NodeGroupConfigurationObject[], patch: Partial<RenderInputs> = {}): RenderInputs {
  return { ...structuredClone(base), configurations, ...patch };
}
const ngc = (name: string, spec: Partial<NodeGroupConfigurationObject["spec"]>): NodeGroupConfigurationObject => ({
  metadata: { name },
  spec: { content: "true\n", nodeGroups: ["*"], bundles: ["*"], ...spec },
});
const scripts = (i: RenderInputs, ng = i.nodeGroups[0]!) =>
  Object.fromEntries(
    renderGroup(ng, i, NOW)
      .bundle.steps.filter((s) => s.kind === "Script")
      .map((s) => [s.name, s.spec as ScriptSpec]),
  );

// Deckhouse's documentation examples (node-manager EXAMPLES and FAQ), as users paste them.
const docs = {
  "sysctl-tune.sh": "sysctl -w vm.max_map_count=262144\n",
  "add-cert-manager-plugin.sh": `if [ -x /usr/local/bin/kubectl-cert_manager ]; then
  exit 0
fi
curl -L https://example.com/kubectl-cert_manager-linux-amd64.tar.gz -o - | tar -zxvf - kubectl-cert_manager
mv kubectl-cert_manager /usr/local/bin
`,
  "profile-proxy.sh": `{{- if .proxy }}
  {{- if .proxy.httpProxy }}
export HTTP_PROXY={{ .proxy.httpProxy | quote }}
export http_proxy=\${HTTP_PROXY}
  {{- end }}
  {{- if .proxy.noProxy }}
export NO_PROXY={{ .proxy.noProxy | join "," | quote }}
export no_proxy=\${NO_PROXY}
  {{- end }}
bb-sync-file /etc/profile.d/profile-proxy.sh - << EOF
export HTTP_PROXY=\${HTTP_PROXY}
export NO_PROXY=\${NO_PROXY}
EOF
{{- else }}
rm -rf /etc/profile.d/profile-proxy.sh
{{- end }}
`,
  "users.sh": `{{- range .nodeUsers }}
echo 'Tuning environment for user {{ .name }}'
{{- end }}
`,
  "master-only.sh": `{{- if eq .nodeGroup.name "master" }}
echo master
{{- else if eq .runType "Normal" }}
echo "{{ .nodeGroup.name }} is a {{ .nodeGroup.nodeType }} group"
{{- end }}
`,
};

t.test("Deckhouse's documentation examples render as Deckhouse renders them, into valid bash", async (t) => {
  const i = inputs(Object.entries(docs).map(([name, content]) => ngc(name, { content })));
  i.users.push({ metadata: { name: "bob" }, spec: { uid: 1200, sshPublicKeys: ["ssh-ed25519 AAAA bob"] } });
  i.context.proxy = { httpProxy: "http://proxy:3128", noProxy: ["127.0.0.1", ".svc"] };
  const s = scripts(i);
  t.equal(s["100_sysctl-tune.sh"]?.script, docs["sysctl-tune.sh"]);
  t.equal(s["100_add-cert-manager-plugin.sh"]?.script, docs["add-cert-manager-plugin.sh"]);
  t.equal(
    s["100_profile-proxy.sh"]?.script,
    `
export HTTP_PROXY="http://proxy:3128"
export http_proxy=\${HTTP_PROXY}
export NO_PROXY="127.0.0.1,.svc"
export no_proxy=\${NO_PROXY}
bb-sync-file /etc/profile.d/profile-proxy.sh - << EOF
export HTTP_PROXY=\${HTTP_PROXY}
export NO_PROXY=\${NO_PROXY}
EOF
`,
  );
  t.equal(
    s["100_users.sh"]?.script,
    "\necho 'Tuning environment for user alice'\necho 'Tuning environment for user bob'\n",
  );
  t.equal(s["100_master-only.sh"]?.script, '\necho "worker is a Static group"\n');
  for (const [name, spec] of Object.entries(s))
    await run("bash", ["-n", "-c", spec.script]).then(() => t.pass(`${name} parses`));

  delete i.context.proxy;
  t.equal(
    scripts(i)["100_profile-proxy.sh"]?.script,
    "\nrm -rf /etc/profile.d/profile-proxy.sh\n",
    "no proxy: the else branch",
  );
});

t.test("templates see Deckhouse's context; secrets and what the server cannot know are kept out", async (t) => {
  const worker = structuredClone(base.nodeGroups[0]!) as NodeGroupObject;
  worker.spec.kubelet = { maxPods: 150 };
  worker.spec.chaos = { mode: "Disabled" };
  // Everything but the kept-out values, as JSON.
  const content = `{{- $v := omit . "bundle" "k8s" "bashible" "images" "Files" -}}
{{- $_ := set $v "normal" (omit .normal "bootstrapTokens") -}}
{{- $_ := set $v "packagesProxy" (omit .packagesProxy "token") -}}
{{- $_ := set $v "registry" (omit .registry "auth" "dockerCfg") -}}
{{- $users := list -}}
{{- range .nodeUsers }}{{ $users = append $users (dict "name" .name "spec" (omit .spec "passwordHash")) }}{{ end -}}
{{- $_ := set $v "nodeUsers" $users -}}
{{ toJson $v }}`;
  const i = inputs([ngc("view.sh", { content })], { nodeGroups: [worker] });
  i.users[0]!.spec.passwordHash = "$6$secret$hash";
  i.context.registry!.auth = Buffer.from("user:registry-password").toString("base64");
  i.context.cloudProvider = { type: "openstack" };
  i.context.nodeStatusUpdateFrequency = 4;
  const view = JSON.parse(scripts(i)["100_view.sh"]!.script);
  t.equal(view.runType, "Normal");
  t.equal(view.kubernetesVersion, "1.34");
  t.equal(view.cri, "Containerd");
  t.match(view.nodeGroup, {
    name: "worker",
    nodeType: "Static",
    kubelet: { maxPods: 150 },
    chaos: { mode: "Disabled" },
    disruptions: { approvalMode: "Automatic" },
    cri: { type: "Containerd" },
  });
  t.match(view.nodeGroup.updateEpoch, /^\d+$/);
  t.same(view.normal, {
    apiserverEndpoints: ["127.0.0.1:6443"],
    kubernetesCA: i.context.clusterCA,
    clusterDomain: "cluster.local",
    clusterDNSAddress: "10.222.0.10",
    moduleSourcesCA: {},
  });
  t.same(view.registry, { address: "registry.example.com", path: "/deckhouse/ce", scheme: "https" });
  t.same(view.packagesProxy, { addresses: ["127.0.0.1:4219"] });
  t.same(view.cloudProvider, { type: "openstack" });
  t.equal(view.nodeStatusUpdateFrequency, 4);
  t.same(view.nodeUsers, [
    {
      name: "alice",
      spec: {
        uid: 1100,
        sshPublicKeys: base.users[0]!.spec.sshPublicKeys,
        isSudoer: true,
        nodeGroups: ["*"],
        extraGroups: ["adm"],
      },
    },
  ]);

  // Kept out: true as a condition, refused with the reason everywhere else; never the value.
  const keptOut: Record<string, RegExp> = {
    ".bundle": /\$BUNDLE/,
    ".k8s": /version map/,
    ".bashible": /version map/,
    ".images": /module images/,
    ".normal.bootstrapTokens": /secret/,
    ".packagesProxy.token": /\$PACKAGES_PROXY_TOKEN/,
    ".registry.auth": /\$REGISTRY_AUTH/,
    ".registry.dockerCfg": /secret/,
    "(index .nodeUsers 0).spec.passwordHash": /secret/,
  };
  for (const [path, why] of Object.entries(keptOut)) {
    t.equal(
      scripts(
        inputs([ngc("if.sh", { content: `{{ if ${path} }}set{{ end }}` })], {
          nodeGroups: [worker],
          context: i.context,
          users: i.users,
        }),
      )["100_if.sh"]!.script,
      "set",
      `${path} is there`,
    );
    const err = renderAll(
      inputs([ngc("print.sh", { content: `echo {{ ${path} }}` })], {
        nodeGroups: [worker],
        context: i.context,
        users: i.users,
      }),
      NOW,
    ).errors.get("worker");
    t.match(err?.message, why, `${path}: printing it is refused with the reason`);
    t.notMatch(
      err?.message,
      /registry-password|\$6\$secret|example-packages-proxy-token/,
      `${path}: no secret in the error`,
    );
  }
  const whole = renderAll(
    inputs([ngc("all.sh", { content: "{{ toJson . }}" })], {
      nodeGroups: [worker],
      context: i.context,
      users: i.users,
    }),
    NOW,
  ).errors.get("worker");
  t.match(whole?.message, /kept out/, "the whole context cannot be dumped");
});

t.test("spec.bundles takes Deckhouse's names and the step carries them", async (t) => {
  const i = inputs([
    ngc("ubuntu.sh", { bundles: ["ubuntu-lts"] }),
    ngc("rhel-like.sh", { bundles: ["rosa", "centos", "redos", "centos"] }),
    ngc("all.sh", { bundles: ["*"] }),
    ngc("every-name.sh", {
      bundles: ["ubuntu-lts", "debian", "astra", "centos", "redos", "rosa", "opensuse", "altlinux"],
    }),
  ]);
  const s = scripts(i);
  t.same(s["100_ubuntu.sh"]?.bundles, ["ubuntu-lts"]);
  t.same(s["100_rhel-like.sh"]?.bundles, ["centos", "redos", "rosa"], "sorted, each once");
  t.same(s["100_all.sh"]?.bundles, [], "* = every OS");
  t.equal(s["100_every-name.sh"]?.bundles.length, 8);

  for (const [bad, hint] of [
    ["rhel", /'rhel' is a family; its bundles are centos, redos and rosa/],
    ["ubuntu", /its bundles are ubuntu-lts/],
    ["centos-7", /Deckhouse's bundle names are \*, ubuntu-lts, debian, astra, centos, redos, rosa, opensuse, altlinux/],
  ] as const) {
    const err = (() => {
      try {
        scripts(inputs([ngc("x.sh", { bundles: [bad] })]));
      } catch (e) {
        return e as RenderError;
      }
    })();
    t.type(err, RenderError);
    t.match(err?.message, new RegExp(`NodeGroupConfiguration/x\\.sh: unknown bundle '${bad}'`));
    t.match(err?.message, hint);
  }
});

t.test("any weight orders the step as Deckhouse names it (%03d_<name>)", async (t) => {
  const i = inputs([
    ngc("late.sh", { weight: 1000 }),
    ngc("early.sh", { weight: -5 }),
    ngc("five.sh", { weight: 5 }),
    ngc("default.sh", {}),
  ]);
  const steps = renderGroup(i.nodeGroups[0]!, i, NOW).bundle.steps.map((s) => s.name);
  t.same(steps, [
    "-05_early.sh",
    "000_add_mandatory_packages",
    "000_add_node_users",
    "000_configure_kubernetes_api_proxy",
    "000_discover_node_ip",
    "003_disable_rp_filter",
    "003_disable_swap",
    "003_install_ca_certificates",
    "004_add_deckhouse_paths",
    "004_check_hostname",
    "004_load_mandatory_modules",
    "005_disable_manage_iprules",
    "005_five.sh",
    "007_fetch_registry_packages",
    "032_configure_containerd",
    "041_configure_sysctl_tuner",
    "064_check_hostname_uniqueness",
    "064_configure_kubelet",
    "069_start_kubelet",
    "080_setup_bashible_service",
    "083_disable_rsyslog_for_kubelet",
    "084_configure_journald",
    "085_rotate_bashible_logs",
    "098_cleanup",
    "098_set_permissions",
    "1000_late.sh",
    "100_default.sh",
  ]);
  const frac = (() => {
    try {
      scripts(inputs([ngc("frac.sh", { weight: 1.5 })]));
    } catch (e) {
      return e as Error;
    }
  })();
  t.match(frac?.message, /weight 1.5 is not an integer/);
});

t.test("the deprecated sshPublicKey is installed first, each key once", async (t) => {
  const i = inputs([]);
  i.users = [
    {
      metadata: { name: "carol" },
      spec: {
        uid: 1300,
        sshPublicKey: "ssh-rsa AAAA old",
        sshPublicKeys: ['cert-authority,principals="ops" ssh-rsa BBBB ca', "ssh-rsa AAAA old"],
      },
    },
  ];
  const step = renderGroup(i.nodeGroups[0]!, i, NOW).bundle.steps.find((s) => s.kind === "NodeUsers")!;
  t.same(step.kind === "NodeUsers" && step.spec.users[0]!.sshPublicKeys, [
    "ssh-rsa AAAA old",
    'cert-authority,principals="ops" ssh-rsa BBBB ca',
  ]);
});

t.test("every broken object of a group is reported at once", async (t) => {
  const i = inputs([
    ngc("good.sh", {}),
    ngc("bad-template.sh", { content: "{{ .nodeGroup.name 1 }}" }),
    ngc("bad-bundle.sh", { bundles: ["windows"] }),
  ]);
  i.users.push({ metadata: { name: "root" }, spec: { uid: 1500, sshPublicKeys: ["ssh-ed25519 AAAA r"] } });
  const err = renderAll(i, NOW).errors.get("worker")!;
  t.same(err.causes.map((c) => c.object).sort(), [
    "NodeGroupConfiguration/bad-bundle.sh",
    "NodeGroupConfiguration/bad-template.sh",
    "NodeUser/root",
  ]);
  t.match(
    err.message,
    /NodeUser\/root: .*; NodeGroupConfiguration\/bad-bundle\.sh: .*; NodeGroupConfiguration\/bad-template\.sh: spec\.content line 1/,
  );
});

t.test("the render loop reports a broken NGC once per change, and once when it recovers", async (t) => {
  const frontend: NodeGroupObject = { metadata: { name: "frontend" }, spec: { nodeType: "CloudPermanent" } };
  const snap: SourceSnapshot = {
    inputs: inputs([ngc("shared.sh", {})], { nodeGroups: [structuredClone(base.nodeGroups[0]!), frontend] }),
  };
  const calls: string[] = [];
  const store = new BundleStore();
  const loop = new RenderLoop(
    {
      source: { start: async () => {}, snapshot: () => snap, nodeGroupOf: async () => undefined, stop: () => {} },
      store,
      metrics: new Metrics(),
      log: pino({ level: "silent" }),
      now: () => NOW,
    },
    {
      onConfigurationError: async (name, error, groups) =>
        void calls.push(`${name}|${error ?? "ok"}|${groups.join(",")}`),
    },
  );
  t.teardown(() => loop.stop());
  await loop.runOnce();
  const before = store.get("nodegroupbundles", "worker")!.object.checksum;

  snap.inputs.configurations.push(ngc("broken.sh", { nodeGroups: ["worker"], content: '{{ include "x" . }}' }));
  snap.inputs.configurations[0]!.spec.content = "echo v2\n";
  await loop.runOnce();
  await loop.runOnce();
  t.equal(calls.length, 1, "reported once");
  t.match(
    calls[0],
    /^broken\.sh\|NodeGroupConfiguration\/broken\.sh: spec\.content line 1: .*include is a stub in Deckhouse.*\|worker$/,
  );
  t.equal(store.get("nodegroupbundles", "worker")!.object.checksum, before, "worker held back");
  const front = store.get("nodegroupbundles", "frontend")!.object as unknown as {
    steps: { spec: { script?: string } }[];
  };
  t.ok(
    front.steps.some((s) => s.spec.script === "echo v2\n"),
    "frontend moved on",
  );

  // While the group fails for another reason too, the NGC's state is not known: nothing reported.
  snap.inputs.users.push({ metadata: { name: "root" }, spec: { uid: 1500, sshPublicKeys: ["ssh-ed25519 AAAA r"] } });
  snap.inputs.configurations[1]!.spec.content = "echo fixed\n";
  await loop.runOnce();
  t.equal(calls.length, 1, "not cleared while worker still fails");
  snap.inputs.users.pop();
  await loop.runOnce();
  t.same(calls.slice(1), ["broken.sh|ok|"], "cleared once worker renders it");
});
