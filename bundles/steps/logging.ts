// Logging: the kubelet's messages kept out of syslog files (journald has them), journald's
// retention, and rotation of the agent's own logs.
import { int, obj } from "../schema.ts";
import { builtinStep } from "./descriptor.ts";

// 083_disable_rsyslog_for_kubelet: where rsyslog runs, it drops the kubelet's messages.
export const rsyslogKubelet = builtinStep({
  name: "083_disable_rsyslog_for_kubelet",
  kind: "RsyslogKubeletFilter",
  spec: obj({}),
  units: {},
});

// 084_configure_journald: journal files rotated daily and kept 14 days (Deckhouse's values).
export const journald = builtinStep({
  name: "084_configure_journald",
  kind: "Journald",
  spec: obj({
    maxFileSec: int({ min: 3600, max: 366 * 86400 }),
    maxRetentionSec: int({ min: 3600, max: 3660 * 86400 }),
  }),
  units: {},
  defaults: { maxFileSec: 86400, maxRetentionSec: 14 * 86400 },
});

// 085_rotate_bashible_logs: logrotate for /var/log/d8/bashible/*.log (no Deckhouse counterpart).
export const logRotation = builtinStep({
  name: "085_rotate_bashible_logs",
  kind: "LogRotation",
  spec: obj({
    /** Rotate a log once it is bigger than this (MiB). */
    maxSizeMiB: int({ min: 1, max: 1024 }),
    /** Rotated copies kept (compressed). */
    keep: int({ min: 1, max: 100 }),
  }),
  units: {},
  defaults: { maxSizeMiB: 10, keep: 5 },
});
