// After the node joined: what only bootstrap needed is removed, and file permissions are
// tightened as Deckhouse's CIS step sets them.
import { obj } from "../schema.ts";
import { PATHS } from "../paths.ts";
import { builtinStep } from "./descriptor.ts";

// 098_cleanup: the bootstrap token and what carries it, once the kubelet has credentials of its own.
export const bootstrapCleanup = builtinStep({
  name: "098_cleanup",
  kind: "BootstrapCleanup",
  spec: obj({}),
  units: {},
  /** What bootstrap.sh left that holds the bootstrap token (or only served it). */
  files: [PATHS.bootstrapToken, PATHS.bootstrapCA, PATHS.bootstrapAuthHeader, PATHS.bootstrapScript],
});

// 098_set_permissions: CIS modes on the Kubernetes files (Deckhouse's 098_set_permissions).
export const filePermissions = builtinStep({
  name: "098_set_permissions",
  kind: "FilePermissions",
  spec: obj({}),
  units: {},
  /**
   * The CIS Kubernetes Benchmark's modes (section 4.1, worker node configuration files) for
   * what the kubelet and containerd keep, at most this permissive; `owner` names the built-in
   * step that writes the path (its mode is that step's to set: this one only reports it).
   */
  modes: [
    { path: PATHS.kubeletKubeconfig, mode: 0o600, cis: "4.1.5" },
    { path: PATHS.kubeletConfig, mode: 0o600, cis: "4.1.9", owner: "064_configure_kubelet" },
    { path: "/etc/systemd/system/kubelet.service", mode: 0o600, cis: "4.1.1", owner: "064_configure_kubelet" },
    { path: PATHS.clusterCA, mode: 0o600, cis: "4.1.7", owner: "064_configure_kubelet" },
    { path: PATHS.kubeletBootstrapKubeconfig, mode: 0o600, cis: "4.1.5" },
    { path: "/var/lib/kubelet/pki", mode: 0o700, cis: "4.1 (Deckhouse: /var/lib/kubelet 0700)" },
    {
      path: PATHS.containerdConfig,
      mode: 0o600,
      cis: "Deckhouse: /etc/containerd 0700",
      owner: "032_configure_containerd",
    },
  ],
});
