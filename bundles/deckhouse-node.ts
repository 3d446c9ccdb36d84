// What Deckhouse's own bashible (v1.66) leaves on a node it set up: read by `bashible adopt` to
// recognise such a node and take it over, and by the renderer for what cleanup_static_node.sh
// removes besides this agent's own files. Facts from Deckhouse's templates (repository
// deckhouse/deckhouse, `cb/` = candi/bashible/): the timer and service from the bashible
// service step (`cb/common-steps/all/…setup_bashible…`), the kubelet drop-in from
// `cb/common-steps/node-group/068_configure_kubelet_systemd_unit.sh.tpl`, containerd's base
// configuration from `032_configure_containerd.sh.tpl`, the `deckhouse` user from
// `cb/common-steps/all/003_create_deckhouse_user.sh.tpl`, the rest from Deckhouse's
// `002_create_static_node_cleanup_script.sh.tpl`.
import { STATE_DIR } from "./paths.ts";

export const DECKHOUSE = {
  /** Deckhouse's entry point; its timer runs it every minute. */
  entry: `${STATE_DIR}/bashible.sh`,
  /** The step scripts of the bundle Deckhouse last ran. */
  bundleSteps: `${STATE_DIR}/bundle_steps`,
  /** The checksum Deckhouse's bashible last applied (this agent's state file of the same name). */
  checksum: `${STATE_DIR}/configuration_checksum`,
  timer: "bashible.timer",
  timerFile: "/etc/systemd/system/bashible.timer",
  /** Deckhouse's oneshot bashible.service: the same unit name as this agent's daemon. */
  service: "bashible.service",
  serviceFile: "/etc/systemd/system/bashible.service",
  kubeletDropIn: "/etc/systemd/system/kubelet.service.d/10-deckhouse.conf",
  /** The kubelet package's unit, which the drop-in's ExecStart overrides. */
  kubeletPackageUnit: "/lib/systemd/system/kubelet.service",
  /** Deckhouse's base containerd configuration, merged with conf.d into config.toml. */
  containerdBase: "/etc/containerd/deckhouse.toml",
  /** The local API proxy as a static pod the kubelet runs (this agent runs it as a unit). */
  apiProxyManifest: "/etc/kubernetes/manifests/kubernetes-api-proxy.yaml",
  /** The `deckhouse` user and group 003_create_deckhouse_user creates, with this uid and gid. */
  user: { name: "deckhouse", id: 64535 },
} as const;

/**
 * Units Deckhouse's steps run that no step of this agent writes (sysctl-tuner.* and bashible.timer
 * are this agent's too, and already in its cleanup list): cleanup stops, disables and removes them.
 */
export const DECKHOUSE_ONLY_UNITS = [
  "d8-shutdown-inhibitor.service",
  "old-csi-mount-cleaner.service",
  "old-csi-mount-cleaner.timer",
  "d8-containerd-cgroup-migration.service",
  "containerd-deckhouse-logger.service",
  "containerd-deckhouse-logger-logrotate.service",
  "containerd-deckhouse-logger-logrotate.timer",
] as const;

/** Files and directories Deckhouse leaves that no step of this agent writes: cleanup removes them. */
export const DECKHOUSE_ONLY_PATHS = [
  "/etc/systemd/logind.conf.d/99-node-d8-shutdown-inhibitor.conf",
  "/etc/logrotate.d/containerd-integrity.conf",
  "/etc/sudoers.d/sudoers_flant_kubectl",
  "/var/lib/upmeter",
] as const;

/** The record `bashible adopt` keeps of what it did and how to go back. */
export const ADOPTION = {
  record: `${STATE_DIR}/adopted-from-deckhouse.json`,
  /** Deckhouse's files as they were before adoption changed them, at their node path below this. */
  saved: `${STATE_DIR}/adopted-from-deckhouse`,
  /** The bundle the adoption planned and converges to (0600: it carries tokens). */
  bundle: `${STATE_DIR}/adopted-from-deckhouse/bundle.json`,
} as const;
